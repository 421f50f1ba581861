#!/usr/bin/env python3
"""GPU proof for the antialiased bilinear/bicubic interpolation backward (det_kernels_aa.cuh, PT-0232).

Builds build_aa.py's extension and, in one process:

* ``ops``: per case (realistic, small/latency-bound, contention: a large downsampling factor, where
  torch's one-thread-per-output kernel loops over hundreds of taps, and antialiased upsampling, where
  each input element of ours receives thousands of outputs; channels-last; fp32, fp16, bf16, fp64):
  ours re-run REPEATS times (bitwise equal to the first?), torch's kernel re-run (flag off; how many
  differ), max |error| of both against torch's CPU kernel on the fp64 values, time ours / torch's (the
  aten-level out-of-place call of each, flag off for torch's, allocation included);
* which of the two ops raise under the flag before and after registering ours for the CUDA key, and
  whether the registered ones repeat bitwise under it;
* ``train``: an image classifier whose feature path resizes with antialiasing (bilinear, then
  bicubic), TRAIN_STEPS steps from one seed, twice with torch's kernels and the flag off, then twice
  with ours registered and the flag on: every parameter compared bitwise, steps/s.

Writes $OUT/deterministic-issue18-upsample-aa-ops.json and -training.json.
"""
import json
import os
import platform
import statistics
import sys
import time
import traceback

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from build_aa import build  # noqa: E402
from run_harness17 import beq, median_ms  # noqa: E402  (bitwise equality, CUDA-event timing)

REPEATS = 25
TRAIN_STEPS = 200
DEV = "cuda"
A = torch.ops.aten
F32, F64, F16, BF16 = torch.float32, torch.float64, torch.float16, torch.bfloat16
CL = torch.channels_last
TORCH_OPS = {"bilinear": A._upsample_bilinear2d_aa_backward, "bicubic": A._upsample_bicubic2d_aa_backward}
ext = None

# (mode, name, kind, dtype, input size, output size, memory format of grad_output)
CASES = [
    ("bilinear", "8x64x224x224 -> 112x112", "realistic", F32, (8, 64, 224, 224), (112, 112), None),
    ("bilinear", "8x64x224x224 -> 112x112", "realistic", F16, (8, 64, 224, 224), (112, 112), None),
    ("bilinear", "8x64x224x224 -> 112x112", "realistic", BF16, (8, 64, 224, 224), (112, 112), None),
    ("bilinear", "8x64x224x224 -> 112x112 channels-last", "realistic", F32, (8, 64, 224, 224), (112, 112), CL),
    ("bicubic", "8x64x224x224 -> 112x112", "realistic", F32, (8, 64, 224, 224), (112, 112), None),
    ("bicubic", "8x64x224x224 -> 112x112", "realistic", F16, (8, 64, 224, 224), (112, 112), None),
    ("bilinear", "8x3x512x512 -> 224x224", "realistic", F32, (8, 3, 512, 512), (224, 224), None),
    ("bilinear", "8x3x512x512 -> 224x224 channels-last", "realistic", F32, (8, 3, 512, 512), (224, 224), CL),
    ("bicubic", "8x3x512x512 -> 224x224", "realistic", F32, (8, 3, 512, 512), (224, 224), None),
    ("bicubic", "8x3x512x512 -> 224x224", "realistic", BF16, (8, 3, 512, 512), (224, 224), None),
    ("bicubic", "8x3x512x512 -> 224x224 channels-last", "realistic", F16, (8, 3, 512, 512), (224, 224), CL),
    ("bilinear", "16x64x56x56 -> 112x112 (upsampling x2)", "realistic", F32, (16, 64, 56, 56), (112, 112), None),
    ("bicubic", "8x32x300x200 -> 128x96 (non-divisible)", "realistic", F32, (8, 32, 300, 200), (128, 96), None),
    ("bilinear", "4x16x128x128 -> 48x48", "realistic", F64, (4, 16, 128, 128), (48, 48), None),
    ("bicubic", "4x16x128x128 -> 48x48", "realistic", F64, (4, 16, 128, 128), (48, 48), None),
    ("bilinear", "1x3x32x32 -> 16x16", "small", F32, (1, 3, 32, 32), (16, 16), None),
    ("bicubic", "1x3x32x32 -> 16x16", "small", F32, (1, 3, 32, 32), (16, 16), None),
    ("bilinear", "1x3x64x64 -> 24x24", "small", F16, (1, 3, 64, 64), (24, 24), None),
    ("bilinear", "1x1x1024x1024 -> 8x8 (factor 128)", "contention", F32, (1, 1, 1024, 1024), (8, 8), None),
    ("bilinear", "1x1x1024x1024 -> 8x8 (factor 128)", "contention", F16, (1, 1, 1024, 1024), (8, 8), None),
    ("bicubic", "1x1x1024x1024 -> 16x16 (factor 64)", "contention", F32, (1, 1, 1024, 1024), (16, 16), None),
    ("bilinear", "8x3x1024x1024 -> 32x32 (factor 32)", "contention", F32, (8, 3, 1024, 1024), (32, 32), None),
    ("bilinear", "1x1x1024x1024 -> 4x4 (factor 256)", "contention", F32, (1, 1, 1024, 1024), (4, 4), None),
    ("bilinear", "1x1x8x8 -> 1024x1024 (upsampling x128)", "contention", F32, (1, 1, 8, 8), (1024, 1024), None),
    ("bicubic", "1x4x16x16 -> 512x512 (upsampling x32)", "contention", F32, (1, 4, 16, 16), (512, 512), None),
]


def gen(seed):
    return torch.Generator().manual_seed(seed)


def run_case(mode, name, kind, dt, in_size, out_size, fmt):
    g = torch.randn(in_size[:2] + out_size, generator=gen(11)).to(dt)
    ref = TORCH_OPS[mode](g.double(), list(out_size), list(in_size), False, None, None)  # CPU, fp64
    # the same op in fp64 with the kernel's own (float-rounded) scale: what the low-precision
    # kernels compute exactly, free of the scale's rounding that both sides share
    same_scale = None
    if dt != F64:
        scales = [1.0 / (torch.tensor(i, dtype=F32) / o).item() for i, o in zip(in_size[2:], out_size)]
        same_scale = TORCH_OPS[mode](g.double(), list(out_size), list(in_size), False, *scales)
    g = g.to(DEV)
    if fmt is not None:
        g = g.contiguous(memory_format=fmt)
    args = (list(out_size), list(in_size), False, None, None)
    ours_fn = (lambda: ext.bilinear2d_aa_backward(g, *args)) if mode == "bilinear" else (
        lambda: ext.bicubic2d_aa_backward(g, *args))
    torch_fn = lambda: TORCH_OPS[mode](g, *args)  # noqa: E731
    rec = {"op": mode, "name": name, "kind": kind, "dtype": str(dt).replace("torch.", ""), "repeats": REPEATS,
           "channels_last": fmt is not None}
    first = ours_fn().clone()
    rec["bitwise_equal_repeats"] = sum(1 for _ in range(REPEATS) if beq(ours_fn(), first))
    rec["ours_channels_last"] = first.is_contiguous(memory_format=CL) and fmt is not None
    rec["max_abs_err_vs_fp64_ours"] = float((first.cpu().double() - ref).abs().max())
    rec["ref_max_abs"] = float(ref.abs().max())
    try:
        torch.cuda.synchronize()
        t = time.perf_counter()
        tfirst = torch_fn().clone()
        torch.cuda.synchronize()
        rec["torch_repeats"] = REPEATS if time.perf_counter() - t < 0.004 else 5
        rec["torch_differing_repeats"] = sum(1 for _ in range(rec["torch_repeats"]) if not beq(torch_fn(), tfirst))
        et = float((tfirst.cpu().double() - ref).abs().max())
        rec["max_abs_err_vs_fp64_torch"] = et
        eo = rec["max_abs_err_vs_fp64_ours"]
        rec["error_ratio"] = (eo / et) if et > 0 else (1.0 if eo == 0 else float("inf"))
        if same_scale is not None:
            eo = float((first.cpu().double() - same_scale).abs().max())
            et = float((tfirst.cpu().double() - same_scale).abs().max())
            rec["max_abs_err_vs_fp64_same_scale_ours"], rec["max_abs_err_vs_fp64_same_scale_torch"] = eo, et
            rec["error_ratio_same_scale"] = (eo / et) if et > 0 else (1.0 if eo == 0 else float("inf"))
    except RuntimeError as exc:  # torch's kernel refuses large supports (shared memory)
        rec["torch_error"] = str(exc).splitlines()[0][:300]
        rec["timing"] = {"ours_ms": median_ms(ours_fn)}
        return rec
    t_torch = median_ms(torch_fn)
    t_ours = median_ms(ours_fn)
    rec["timing"] = {"torch_ms": t_torch, "ours_ms": t_ours, "ratio": t_ours / t_torch}
    return rec


def flag_probes():
    res = {}
    for mode in ("bilinear", "bicubic"):
        for fmt_name, fmt in (("", torch.contiguous_format), ("_channels_last", CL)):
            x = torch.randn(4, 16, 96, 96, generator=gen(21)).to(DEV).contiguous(memory_format=fmt)
            g = torch.randn(4, 16, 40, 40, generator=gen(22)).to(DEV)

            def grad(x=x, g=g, mode=mode):
                t = x.detach().requires_grad_()
                F.interpolate(t, size=(40, 40), mode=mode, align_corners=False, antialias=True).backward(g)
                return t.grad
            name = "interpolate_%s_aa%s" % (mode, fmt_name)
            torch.use_deterministic_algorithms(True)
            try:
                first = grad().clone()
                again = [grad() for _ in range(5)]
                torch.cuda.synchronize()
                res[name] = {"raised": False, "bitwise_repeats": sum(1 for a in again if beq(a, first)), "of": 5}
            except RuntimeError as exc:
                msg = str(exc).splitlines()[0][:200]
                res[name] = {"raised": "deterministic" in msg, "message": msg}
            except Exception as exc:
                res[name] = {"raised": False, "probe_error": repr(exc)[:200]}
            finally:
                torch.use_deterministic_algorithms(False)
    return res


# --- training ------------------------------------------------------------------------------------
class AAResizeNet(nn.Module):
    """An image classifier whose input pipeline and feature path resize with antialiasing: the raw
    160x160 batch is resized to 128x128 (no gradient), the stem's features are resized to 56x56
    (bilinear) and the next stage's to 24x24 (bicubic), both backpropagated through."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.c3 = nn.Conv2d(64, 128, 3, padding=1)
        self.fc = nn.Linear(128, 10)

    def forward(self, raw):
        x = F.interpolate(raw, size=(128, 128), mode="bilinear", align_corners=False, antialias=True)
        a = F.relu(self.c1(x))
        b = F.interpolate(a, size=(56, 56), mode="bilinear", align_corners=False, antialias=True)
        b = F.relu(self.c2(b))
        c = F.interpolate(b, size=(24, 24), mode="bicubic", align_corners=False, antialias=True)
        c = F.relu(self.c3(c))
        return self.fc(c.mean((2, 3)))


def training_data(steps):
    g = torch.Generator(device=DEV).manual_seed(99)  # on the GPU: fast, and the same numbers every run
    return [(torch.randn(32, 3, 160, 160, generator=g, device=DEV),
             torch.randint(0, 10, (32,), generator=g, device=DEV)) for _ in range(steps)]


def train(data, deterministic, fill_uninitialized=True):
    """fill_uninitialized=False: torch 2.x's flag also fills new tensors with NaN; 1.13.1 has no such
    fill, so that run's steps/s are the ones a 1.13.1 user would see."""
    torch.manual_seed(1234)
    model = AAResizeNet().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    fill_was = torch.utils.deterministic.fill_uninitialized_memory
    torch.utils.deterministic.fill_uninitialized_memory = fill_uninitialized
    torch.use_deterministic_algorithms(deterministic)
    try:
        torch.cuda.synchronize()
        t0 = None
        for i, (x, y) in enumerate(data):
            if i == 10:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        sps = (len(data) - 10) / (time.perf_counter() - t0)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = fill_was
    return [p.detach().clone() for p in model.parameters()], sps, float(loss.item())


def same_params(a, b):
    return all(beq(x, y) for x, y in zip(a, b))


def main():
    global ext
    out_dir = os.environ.get("OUT", ".")
    ops_path = os.path.join(out_dir, "deterministic-issue18-upsample-aa-ops.json")
    train_path = os.path.join(out_dir, "deterministic-issue18-upsample-aa-training.json")
    env = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
           "python": platform.python_version(), "sm_count": torch.cuda.get_device_properties(0).multi_processor_count}
    result = dict(env, repeats=REPEATS,
                  timing_method="median over up to 30 samples of CUDA-event time / up to 20 back-to-back calls "
                                "(fewer for slow calls, about 0.2 s a side); each side its aten-level out-of-place "
                                "call (torch's via torch.ops.aten with the flag off, ours via the extension), "
                                "allocation included",
                  reference="torch's CPU kernel on the same grad_output values cast to float64; for the "
                            "fp32/fp16/bf16 cases also with the kernels' float-rounded scale passed as "
                            "scales_h/w (error_ratio_same_scale), which removes the error of the scale's "
                            "rounding that ours and torch's share")
    t0 = time.time()
    try:
        ext, secs = build()
        result["build_seconds"] = secs
    except Exception:
        result["build_error"] = traceback.format_exc()[-3000:]
        json.dump(result, open(ops_path, "w"), indent=1)
        raise
    result["torch_under_deterministic_flag"] = flag_probes()
    print("raise under the flag:", sorted(k for k, r in result["torch_under_deterministic_flag"].items()
                                          if r["raised"]), flush=True)
    cases = []
    result["cases"] = cases
    budget = float(os.environ.get("DETBWAA_OPS_BUDGET", "1e9"))
    for mode, name, kind, dt, in_size, out_size, fmt in CASES:
        if time.time() - t0 > budget:
            cases.append({"op": mode, "name": name, "kind": kind, "dtype": str(dt), "skipped": "time budget"})
            continue
        try:
            rec = run_case(mode, name, kind, dt, in_size, out_size, fmt)
        except Exception as exc:
            rec = {"op": mode, "name": name, "kind": kind, "dtype": str(dt), "error": repr(exc)[:400]}
            torch.cuda.synchronize()
        cases.append(rec)
        json.dump(result, open(ops_path, "w"), indent=1)
        if "error" in rec:
            print(mode, name, "ERROR", rec["error"], flush=True)
            continue
        tm = rec["timing"]
        print("%-8s %-44s %-8s %-10s bw %d/%d tdiff %s same-scale err ratio %s err %s t %s ms" % (
            mode, name[:44], rec["dtype"], kind, rec["bitwise_equal_repeats"], REPEATS,
            rec.get("torch_differing_repeats", "-"), "%.2f" % rec.get("error_ratio_same_scale", float("nan")),
            "%.3g/%.3g" % (rec["max_abs_err_vs_fp64_ours"], rec["max_abs_err_vs_fp64_torch"])
            if "max_abs_err_vs_fp64_torch" in rec else "%.3g/torch raised" % rec["max_abs_err_vs_fp64_ours"],
            "%.4f/%.4f r %.2f" % (tm["ours_ms"], tm["torch_ms"], tm["ratio"]) if "torch_ms" in tm
            else "%.4f/-" % tm["ours_ms"]), flush=True)
    json.dump(result, open(ops_path, "w"), indent=1)

    # training: torch's kernels (flag off) first, then ours registered with the flag on
    training = dict(env, steps=TRAIN_STEPS, batch=32, optimizer="SGD lr 0.01 momentum 0.9", seed=1234,
                    network=AAResizeNet.__doc__.split("\n")[0] + " (3 conv, 3 antialiased resizes, linear)",
                    steps_per_s_method="steps 11..%d over wall time, synchronised" % TRAIN_STEPS)
    data = training_data(TRAIN_STEPS)
    pa, sa, la = train(data, deterministic=False)
    pb, sb, lb = train(data, deterministic=False)
    training["torch_flag_off"] = {"bitwise_equal": same_params(pa, pb), "steps_per_s": [sa, sb],
                                  "final_loss": [la, lb],
                                  "parameters_differing": sum(1 for x, y in zip(pa, pb) if not beq(x, y)),
                                  "parameters": len(pa)}
    print("torch flag off:", training["torch_flag_off"], flush=True)
    result["register_errors"] = ext.register_aten_cuda()
    result["after_registration_under_flag"] = flag_probes()
    print("after registration:", result["after_registration_under_flag"], flush=True)
    json.dump(result, open(ops_path, "w"), indent=1)
    pc, sc, lc = train(data, deterministic=True)
    pd, sd, ld = train(data, deterministic=True)
    base = statistics.mean([sa, sb])
    training["ours_flag_on"] = {"bitwise_equal": same_params(pc, pd), "steps_per_s": [sc, sd],
                                "final_loss": [lc, ld], "steps_per_s_ratio_vs_torch_flag_off": statistics.mean([sc, sd]) / base}
    _, se, _ = train(data, deterministic=True, fill_uninitialized=False)
    training["ours_flag_on_no_fill"] = {"steps_per_s": se, "steps_per_s_ratio_vs_torch_flag_off": se / base}
    print("ours flag on:", training["ours_flag_on"], training["ours_flag_on_no_fill"], flush=True)
    json.dump(training, open(train_path, "w"), indent=1)
    result["total_seconds"] = time.time() - t0
    json.dump(result, open(ops_path, "w"), indent=1)
    print("wrote", ops_path, train_path, "in %.0f s" % result["total_seconds"], flush=True)


if __name__ == "__main__":
    sys.exit(main())
