#!/usr/bin/env python3
"""GPU proof for issue 18's scatter_reduce / scatter(reduce=) / index_reduce kernels
(det_kernels_scatter.cuh, PT-0230 .. PT-0232).

Builds build_scatter.py's extension and, in one process, per case (realistic, small/latency-bound,
worst contention: every contribution into one target): ours re-run REPEATS times (bitwise equal to
the first?), torch's kernel re-run (flag off; how many differ), ours and torch's against the CPU
kernel of this torch (bitwise, NaN equal to NaN), max |error| of both against an fp64 CPU
reference, time ours / torch's (flag off, each side's out-of-place call). Then which of these CUDA
ops raise under the flag, before and after registering ours for the CUDA key, and whether each
registered op is bitwise repeatable under the flag.

Writes $OUT/deterministic-issue18-scatter-index-reduce-ops.json.
"""
import json
import os
import platform
import sys
import time
import traceback

import torch

from build_scatter import build
from run_harness17 import median_ms  # CUDA-event timing
from run_harness_reductions import beq

REPEATS = 25
DEV = "cuda"
ext = None
F32, F64, F16, BF16, I32, I64 = torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64


def gen(seed):
    return torch.Generator().manual_seed(seed)


def same_cpu(a, b):
    """bitwise equal with NaN equal to NaN (CPU and GPU may write different NaN payloads)"""
    a, b = a.cpu(), b.cpu()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        na, nb = torch.isnan(a), torch.isnan(b)
        return bool(torch.equal(na, nb)) and beq(a[~na], b[~nb])
    return bool(torch.equal(a, b))


def values(shape, dt, seed, op):
    if dt.is_floating_point:
        x = torch.randn(shape, generator=gen(seed))
        return (1 + 0.01 * x if op in ("prod", "multiply") else x).to(dt)
    return torch.randint(-3, 4, shape, generator=gen(seed)).to(dt)


def c_scatter(self_shape, src_shape, index_shape, dim, dt, op, targets=None, include_self=True, old=False, seed=1):
    """scatter_reduce (or scatter_ with reduce= when old) along dim; targets: index values drawn
    from [0, targets) (0 for all into one)"""
    hi = self_shape[dim] if targets is None else targets
    x = values(self_shape, dt, seed, op).to(DEV)
    src = values(src_shape, dt, seed + 1, op).to(DEV)
    index = (torch.zeros(index_shape, dtype=torch.long) if hi == 0 else
             torch.randint(0, hi, index_shape, generator=gen(seed + 2))).to(DEV)
    if old:
        torch_fn = lambda: x.scatter(dim, index, src, reduce=op)  # noqa: E731
        ours_fn = lambda: ext.scatter(x, dim, index, src, op, True)  # noqa: E731
        cpu_fn = lambda xx, ss: xx.scatter(dim, index.cpu(), ss, reduce=op)  # noqa: E731
    else:
        torch_fn = lambda: x.scatter_reduce(dim, index, src, op, include_self=include_self)  # noqa: E731
        ours_fn = lambda: ext.scatter_reduce(x, dim, index, src, op, include_self, True)  # noqa: E731
        cpu_fn = lambda xx, ss: xx.scatter_reduce(dim, index.cpu(), ss, op, include_self=include_self)  # noqa: E731
    return torch_fn, ours_fn, (lambda: cpu_fn(x.cpu(), src.cpu())), (lambda: cpu_fn(x.cpu().double(), src.cpu().double()))


def c_index(self_shape, n, dim, dt, op, targets=None, include_self=True, idt=I64, seed=11):
    hi = self_shape[dim] if targets is None else targets
    src_shape = list(self_shape)
    src_shape[dim] = n
    x = values(self_shape, dt, seed, op).to(DEV)
    src = values(tuple(src_shape), dt, seed + 1, op).to(DEV)
    index = (torch.zeros(n, dtype=torch.long) if hi == 0 else torch.randint(0, hi, (n,), generator=gen(seed + 2)))
    index = index.to(DEV, idt)
    return ((lambda: x.index_reduce(dim, index, src, op, include_self=include_self)),
            (lambda: ext.index_reduce(x, dim, index, src, op, include_self)),
            (lambda: x.cpu().index_reduce(dim, index.cpu(), src.cpu(), op, include_self=include_self)),
            (lambda: x.cpu().double().index_reduce(dim, index.cpu(), src.cpu().double(), op, include_self=include_self)))


S = "scatter_reduce"
O = "scatter_ reduce="
X = "index_reduce"
CASES = [
    # scatter_reduce prod: the op torch 2.11 refuses
    (S, "prod 16384x256 -> 1024x256 dim 0 (16 per target)", "realistic", F32, lambda: c_scatter((1024, 256), (16384, 256), (16384, 256), 0, F32, "prod")),
    (S, "prod 16384x256 -> 1024x256 dim 0", "realistic", F16, lambda: c_scatter((1024, 256), (16384, 256), (16384, 256), 0, F16, "prod")),
    (S, "prod 16384x256 -> 1024x256 dim 0", "realistic", BF16, lambda: c_scatter((1024, 256), (16384, 256), (16384, 256), 0, BF16, "prod")),
    (S, "prod 16384x256 -> 1024x256 dim 0", "realistic", F64, lambda: c_scatter((1024, 256), (16384, 256), (16384, 256), 0, F64, "prod")),
    (S, "prod 16384x256 -> 1024x256 dim 0", "realistic", I32, lambda: c_scatter((1024, 256), (16384, 256), (16384, 256), 0, I32, "prod")),
    (S, "prod 2^22 -> 2^16 1-D (segment ids)", "realistic", F32, lambda: c_scatter((1 << 16,), (1 << 22,), (1 << 22,), 0, F32, "prod")),
    (S, "prod 4096x1024 -> 4096x64 dim 1, index 4096x512 < src", "realistic", F32, lambda: c_scatter((4096, 64), (4096, 1024), (4096, 512), 1, F32, "prod")),
    (S, "prod 2^20 -> 2^24 1-D (sparse targets)", "realistic", F32, lambda: c_scatter((1 << 24,), (1 << 20,), (1 << 20,), 0, F32, "prod")),
    (S, "prod include_self=False 16384x256 -> 1024x256", "realistic", F32, lambda: c_scatter((1024, 256), (16384, 256), (16384, 256), 0, F32, "prod", include_self=False)),
    (S, "prod 256x8 -> 64x8", "small", F32, lambda: c_scatter((64, 8), (256, 8), (256, 8), 0, F32, "prod")),
    (S, "prod 2^18 all into one target", "contention", F32, lambda: c_scatter((16,), (1 << 18,), (1 << 18,), 0, F32, "prod", targets=0)),
    (S, "prod 4096x256 all into row 0", "contention", F32, lambda: c_scatter((64, 256), (4096, 256), (4096, 256), 0, F32, "prod", targets=0)),
    (S, "prod 4096x256 all into row 0", "contention", F16, lambda: c_scatter((64, 256), (4096, 256), (4096, 256), 0, F16, "prod", targets=0)),
    # the other modes through the same kernel (torch 2.11 does not refuse them; registered ours replaces them)
    (S, "sum 8192x256 -> 1024x256 dim 0", "realistic", F32, lambda: c_scatter((1024, 256), (8192, 256), (8192, 256), 0, F32, "sum")),
    (S, "mean 8192x256 -> 1024x256 dim 0", "realistic", F32, lambda: c_scatter((1024, 256), (8192, 256), (8192, 256), 0, F32, "mean")),
    (S, "mean 8192x256 -> 1024x256 dim 0", "realistic", BF16, lambda: c_scatter((1024, 256), (8192, 256), (8192, 256), 0, BF16, "mean")),
    (S, "mean include_self=False 8192x256 -> 1024x256", "realistic", I64, lambda: c_scatter((1024, 256), (8192, 256), (8192, 256), 0, I64, "mean", include_self=False)),
    (S, "amax 8192x256 -> 1024x256 dim 0", "realistic", F32, lambda: c_scatter((1024, 256), (8192, 256), (8192, 256), 0, F32, "amax")),
    (S, "amin 8192x256 -> 1024x256 dim 0", "realistic", F16, lambda: c_scatter((1024, 256), (8192, 256), (8192, 256), 0, F16, "amin")),
    (S, "sum 256x8 -> 64x8", "small", F32, lambda: c_scatter((64, 8), (256, 8), (256, 8), 0, F32, "sum")),
    (S, "sum 2^18 all into one target", "contention", F32, lambda: c_scatter((16,), (1 << 18,), (1 << 18,), 0, F32, "sum", targets=0)),
    # scatter_ with reduce="multiply" / "add"
    (O, "multiply 8192x256 -> 1024x256 dim 0", "realistic", F32, lambda: c_scatter((1024, 256), (8192, 256), (8192, 256), 0, F32, "multiply", old=True)),
    (O, "multiply 8192x256 -> 1024x256 dim 0", "realistic", F16, lambda: c_scatter((1024, 256), (8192, 256), (8192, 256), 0, F16, "multiply", old=True)),
    (O, "add 8192x256 -> 1024x256 dim 0", "realistic", F32, lambda: c_scatter((1024, 256), (8192, 256), (8192, 256), 0, F32, "add", old=True)),
    (O, "multiply 256x8 -> 64x8", "small", F32, lambda: c_scatter((64, 8), (256, 8), (256, 8), 0, F32, "multiply", old=True)),
    (O, "multiply 2^18 all into one target", "contention", F32, lambda: c_scatter((16,), (1 << 18,), (1 << 18,), 0, F32, "multiply", targets=0, old=True)),
    # index_reduce, every mode
    (X, "prod 32768 rows -> 4096x256 dim 0", "realistic", F32, lambda: c_index((4096, 256), 32768, 0, F32, "prod")),
    (X, "prod 32768 rows -> 4096x256 dim 0", "realistic", F64, lambda: c_index((4096, 256), 32768, 0, F64, "prod")),
    (X, "mean 32768 rows -> 4096x256 dim 0", "realistic", F32, lambda: c_index((4096, 256), 32768, 0, F32, "mean")),
    (X, "mean 32768 rows -> 4096x256 dim 0, int32 index", "realistic", F16, lambda: c_index((4096, 256), 32768, 0, F16, "mean", idt=I32)),
    (X, "mean include_self=False 32768 rows -> 4096x256", "realistic", I64, lambda: c_index((4096, 256), 32768, 0, I64, "mean", include_self=False)),
    (X, "amax 32768 rows -> 4096x256 dim 0", "realistic", BF16, lambda: c_index((4096, 256), 32768, 0, BF16, "amax")),
    (X, "amin 32768 rows -> 4096x256 dim 0", "realistic", F32, lambda: c_index((4096, 256), 32768, 0, F32, "amin")),
    (X, "prod 256x16384 -> 256x4096 dim 1", "realistic", F32, lambda: c_index((256, 4096), 16384, 1, F32, "prod")),
    (X, "prod 2^22 -> 2^16 1-D", "realistic", F32, lambda: c_index((1 << 16,), 1 << 22, 0, F32, "prod")),
    (X, "prod 256x8 -> 64x8", "small", F32, lambda: c_index((64, 8), 256, 0, F32, "prod")),
    (X, "mean 256x8 -> 64x8", "small", F32, lambda: c_index((64, 8), 256, 0, F32, "mean")),
    (X, "prod 16384x256 all into row 0", "contention", F32, lambda: c_index((64, 256), 16384, 0, F32, "prod", targets=0)),
    (X, "amax 16384x256 all into row 0", "contention", F32, lambda: c_index((64, 256), 16384, 0, F32, "amax", targets=0)),
    (X, "prod 2^18 1-D all into one target", "contention", F32, lambda: c_index((16,), 1 << 18, 0, F32, "prod", targets=0)),
]


def run_case(op, name, kind, dt, builder):
    torch_fn, ours_fn, cpu_fn, ref_fn = builder()
    rec = {"op": op, "name": name, "kind": kind, "dtype": str(dt).replace("torch.", ""), "repeats": REPEATS}
    first = ours_fn().clone()
    rec["bitwise_equal_repeats"] = sum(1 for _ in range(REPEATS) if beq(ours_fn(), first))
    torch.cuda.synchronize()
    t = time.perf_counter()
    tfirst = torch_fn().clone()
    torch.cuda.synchronize()
    rec["torch_repeats"] = REPEATS if time.perf_counter() - t < 0.004 else 5
    rec["torch_differing_repeats"] = sum(1 for _ in range(rec["torch_repeats"]) if not beq(torch_fn(), tfirst))
    cpu = cpu_fn()
    rec["equal_cpu_ours"] = same_cpu(first, cpu)
    rec["equal_cpu_torch"] = same_cpu(tfirst, cpu)
    if not rec["equal_cpu_ours"] and first.is_floating_point():
        rec["elements_differing_from_cpu_ours"] = int((first.cpu().double() != cpu.double()).sum().item())
    if dt.is_floating_point:
        ref = ref_fn()
        o, tt = first.cpu().double(), tfirst.cpu().double()
        eo = float((o - ref).abs().nan_to_num(0.0).max().item())
        et = float((tt - ref).abs().nan_to_num(0.0).max().item())
        rec["max_abs_err_vs_fp64_ours"], rec["max_abs_err_vs_fp64_torch"] = eo, et
        rec["error_ratio"] = (eo / et) if et > 0 else (1.0 if eo == 0 else float("inf"))
    t_torch = median_ms(torch_fn)
    t_ours = median_ms(ours_fn)
    rec["timing"] = {"torch_ms": t_torch, "ours_ms": t_ours, "ratio": t_ours / t_torch}
    return rec


def flag_probes():
    m = torch.randn(64, 32, device=DEV)
    idx2 = torch.randint(0, 64, (4096, 32), device=DEV)
    src2 = 1 + 0.01 * torch.randn(4096, 32, device=DEV)
    idx1 = torch.randint(0, 64, (4096,), device=DEV)
    probes = {}
    for mode in ("sum", "prod", "mean", "amax", "amin"):
        probes["scatter_reduce_" + mode] = (lambda mode=mode: m.clone().scatter_reduce_(0, idx2, src2, mode))
        probes["scatter_reduce_" + mode + "_exclude_self"] = (
            lambda mode=mode: m.clone().scatter_reduce_(0, idx2, src2, mode, include_self=False))
    probes["scatter_reduce_out_of_place_prod"] = lambda: m.scatter_reduce(0, idx2, src2, "prod")
    probes["scatter_reduce_out_prod"] = lambda: torch.scatter_reduce(m, 0, idx2, src2, "prod", out=torch.empty_like(m))
    for reduce in ("multiply", "add"):
        probes["scatter_reduce_" + reduce] = (lambda reduce=reduce: m.clone().scatter_(0, idx2, src2, reduce=reduce))
    probes["scatter_multiply_out_of_place"] = lambda: m.scatter(0, idx2, src2, reduce="multiply")
    for mode in ("prod", "mean", "amax", "amin"):
        probes["index_reduce_" + mode] = (lambda mode=mode: m.clone().index_reduce_(0, idx1, src2, mode))
        probes["index_reduce_" + mode + "_exclude_self"] = (
            lambda mode=mode: m.clone().index_reduce_(0, idx1, src2, mode, include_self=False))
    probes["index_reduce_out_of_place_prod"] = lambda: m.index_reduce(0, idx1, src2, "prod")
    res = {}
    for name, fn in probes.items():
        torch.use_deterministic_algorithms(True)
        try:
            first = fn().clone()
            again = [fn() for _ in range(5)]
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


def main():
    global ext
    out_dir = os.environ.get("OUT", ".")
    out_path = os.path.join(out_dir, "deterministic-issue18-scatter-index-reduce-ops.json")
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
              "python": platform.python_version(), "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
              "repeats": REPEATS,
              "timing_method": "median over up to 30 samples of CUDA-event time / up to 20 back-to-back calls (fewer "
                               "for slow calls); each side its out-of-place Python-level call (torch's with the flag "
                               "off, ours via the extension), clone, allocation and sort included",
              "reference": "equality: the CPU kernel of this torch on the same inputs (scatter: half/bfloat16 "
                           "accumulated in float, rounded once; index_reduce: rounded per step), bitwise, NaN equal "
                           "to NaN; error: the same op on the CPU in fp64"}
    t0 = time.time()
    try:
        ext, secs = build()
        result["build_seconds"] = secs
    except Exception:
        result["build_error"] = traceback.format_exc()[-3000:]
        json.dump(result, open(out_path, "w"), indent=1)
        raise
    result["torch_under_deterministic_flag"] = flag_probes()
    print("raise under the flag:", sorted(k for k, r in result["torch_under_deterministic_flag"].items() if r["raised"]),
          flush=True)
    cases = []
    result["cases"] = cases
    budget = float(os.environ.get("DETBW18C_OPS_BUDGET", "1e9"))
    # a later run completes an earlier one: DETBW18C_FIRST_CASE skips the cases that already ran, and
    # the cases after it run index_reduce first, then scatter_, then the rest of scatter_reduce
    first_case = int(os.environ.get("DETBW18C_FIRST_CASE", "0"))
    result["first_case"] = first_case
    todo = CASES[first_case:]
    if first_case:
        todo = sorted(todo, key=lambda c: {X: 0, O: 1}.get(c[0], 2))
    for op, name, kind, dt, builder in todo:
        if time.time() - t0 > budget:
            cases.append({"op": op, "name": name, "kind": kind, "dtype": str(dt), "skipped": "time budget of the run"})
            continue
        try:
            rec = run_case(op, name, kind, dt, builder)
        except Exception as exc:
            rec = {"op": op, "name": name, "kind": kind, "dtype": str(dt), "error": repr(exc)[:400]}
            torch.cuda.synchronize()
        cases.append(rec)
        json.dump(result, open(out_path, "w"), indent=1)
        if "error" in rec:
            print(op, name, "ERROR", rec["error"], flush=True)
            continue
        tm = rec["timing"]
        print("%-16s %-52s %-8s bw %d/%d tdiff %d cpu %s/%s err %s t %.4f/%.4f ms r %.2f" % (
            op, name[:52], rec["dtype"], rec["bitwise_equal_repeats"], REPEATS, rec["torch_differing_repeats"],
            rec["equal_cpu_ours"], rec["equal_cpu_torch"],
            "%.3g/%.3g" % (rec["max_abs_err_vs_fp64_ours"], rec["max_abs_err_vs_fp64_torch"])
            if "max_abs_err_vs_fp64_ours" in rec else "-", tm["ours_ms"], tm["torch_ms"], tm["ratio"]), flush=True)
    result["register_errors"] = ext.register_aten_cuda()
    result["after_registration_under_flag"] = flag_probes()
    print("after registration, raising:", sorted(k for k, r in result["after_registration_under_flag"].items()
                                                 if r["raised"] or r.get("probe_error")),
          "not repeatable:", sorted(k for k, r in result["after_registration_under_flag"].items()
                                    if not r["raised"] and r.get("bitwise_repeats", 0) != r.get("of")), flush=True)
    result["total_seconds"] = time.time() - t0
    json.dump(result, open(out_path, "w"), indent=1)
    print("wrote", out_path, "in %.0f s" % result["total_seconds"], flush=True)


if __name__ == "__main__":
    sys.exit(main())
