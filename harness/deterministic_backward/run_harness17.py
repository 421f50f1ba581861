#!/usr/bin/env python3
"""GPU proof for issue 17's deterministic kernels (det_accumulate.cuh, det_kernels17.cuh).

Builds build17.py's extension (the same kernel text the 1.13.1 patches carry) and, in one
process, in this order:

 1. per op and case (realistic, small/latency-bound, worst-contention, non-divisible,
    up/downsampling, channels-last, fp16/bf16/fp32/fp64): our kernel re-run REPEATS times
    (bitwise equal to the first?), torch's own kernel re-run REPEATS times (how many differ),
    max |error| of ours and of torch's against an fp64 CPU reference, and time ours / torch's
    kernel (CUDA events, median, batches of back-to-back calls);
 2. torch.autograd.gradcheck in fp64 of autograd.Functions whose backward is ours;
 3. that torch's kernels raise under torch.use_deterministic_algorithms(True);
 4. training of four small real networks twice with torch's kernels (flag off), then
    registration of our kernels into the dispatcher for the CUDA key (det_ops17.cpp), and
    the same training twice with the flag on: parameters compared bitwise, steps/s.

Writes $OUT/deterministic-issue17.json (or ./deterministic-issue17.json).
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

from build17 import build  # noqa: E402

REPEATS = 25
WARMUP = 10
BATCH = 20
SAMPLES = 30
TRAIN_STEPS = 200
DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}
A = torch.ops.aten
ext = None


def bits(t):
    t = t.contiguous()
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def beq(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def median_ms(fn):
    """Median ms per call: CUDA events around batches of back-to-back calls. The batch and
    sample counts shrink for slow calls (contended atomics can take many ms) so that each
    side costs about 0.2 s."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t, 1e-6)
    batch = int(min(BATCH, max(1, 0.002 / one)))
    samples = int(min(SAMPLES, max(5, 0.2 / (batch * one))))
    for _ in range(min(WARMUP, max(2, int(0.05 / one)))):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(samples):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(batch):
            fn()
        e.record()
        pairs.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) / batch for s, e in pairs)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(shape, dt, seed, cl=False):
    x = torch.randn(shape, generator=gen(seed)).to("cuda", DT[dt])
    if cl:
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    return x


def peaks(shape, dt, seed, every):
    """randn with a large value every `every` elements: many windows pick the same argmax."""
    x = torch.randn(shape, generator=gen(seed))
    flat = x.view(-1)
    flat[::every] += 100.0
    return x.to("cuda", DT[dt])


# --------------------------------------------------------------------------------------
# cases: each builds (torch_fn, ours_fn, ref_fn) with inputs captured
# --------------------------------------------------------------------------------------
def to64cpu(args):
    return [a.detach().double().cpu() if torch.is_tensor(a) and a.is_floating_point()
            else (a.cpu() if torch.is_tensor(a) else a) for a in args]


def mk(aten_op, ours_op, args):
    return (lambda: aten_op(*args)), (lambda: ours_op(*args)), (lambda: aten_op(*to64cpu(args)))


def c_adaptive_avg(shape, out, dt, cl=False, seed=1):
    x = randn(shape, dt, seed, cl)
    y = F.adaptive_avg_pool2d(x, out) if len(shape) == 4 else F.adaptive_avg_pool3d(x, out)
    go = randn(tuple(y.shape), dt, seed + 1, cl)
    if len(shape) == 4:
        return mk(A._adaptive_avg_pool2d_backward, ext.adaptive_avg_pool2d_backward, [go, x])
    return mk(A._adaptive_avg_pool3d_backward, ext.adaptive_avg_pool3d_backward, [go, x])


def c_avg3d(shape, k, s, p, dt, ceil=False, cip=True, dv=None, cl=False, seed=3):
    x = randn(shape, dt, seed, cl)
    y = F.avg_pool3d(x, k, s, p, ceil_mode=ceil, count_include_pad=cip, divisor_override=dv)
    go = randn(tuple(y.shape), dt, seed + 1, cl)
    args = [go, x, [k] * 3, [s] * 3, [p] * 3, ceil, cip, dv]
    return mk(A.avg_pool3d_backward, ext.avg_pool3d_backward, args)


def c_pad(kind, shape, pad, dt, cl=False, seed=5):
    x = randn(shape, dt, seed, cl)
    y = F.pad(x, pad, mode="reflect" if kind == "reflection" else "replicate")
    go = randn(tuple(y.shape), dt, seed + 1, cl)
    nd = len(pad) // 2
    name = "%s_pad%dd_backward" % (kind, nd)
    return mk(getattr(A, name), getattr(ext, name), [go, x, list(pad)])


def c_interp(mode, shape, dt, size=None, sf=None, ac=False, cl=False, seed=7):
    x = randn(shape, dt, seed, cl)
    y = F.interpolate(x, size=size, scale_factor=sf, mode=mode, align_corners=ac)
    go = randn(tuple(y.shape), dt, seed + 1, cl)
    nsp = len(shape) - 2
    scales = [float(sf)] * nsp if sf is not None else [None] * nsp
    name = {"linear": "upsample_linear1d_backward", "bilinear": "upsample_bilinear2d_backward",
            "bicubic": "upsample_bicubic2d_backward", "trilinear": "upsample_trilinear3d_backward"}[mode]
    args = [go, list(y.shape[2:]), list(shape), ac] + scales
    return mk(getattr(A, name), getattr(ext, name), args)


def c_maxpool3d(shape, k, s, p, dt, contention=0, cl=False, seed=9):
    x = peaks(shape, dt, seed, contention) if contention else randn(shape, dt, seed, cl)
    if cl:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    y, idx = F.max_pool3d(x, k, s, p, return_indices=True)
    go = randn(tuple(y.shape), dt, seed + 1, cl)
    args = [go, x, [k] * 3, [s] * 3, [p] * 3, [1] * 3, False, idx]
    return mk(A.max_pool3d_with_indices_backward, ext.max_pool3d_with_indices_backward, args) + (
        lambda: ext.max_pool3d_with_indices_backward_fixed(*args),)


def c_frac(shape, k, out, dt, contention=0, seed=11):
    x = peaks(shape, dt, seed, contention) if contention else randn(shape, dt, seed)
    nsp = len(shape) - 2
    samples = torch.rand(shape[0], shape[1], nsp, generator=gen(seed + 2)).to("cuda", DT[dt])
    fn = F.fractional_max_pool2d if nsp == 2 else F.fractional_max_pool3d
    y, idx = fn(x, k, output_size=out, return_indices=True, _random_samples=samples)
    go = randn(tuple(y.shape), dt, seed + 1)
    name = "fractional_max_pool%dd_backward" % nsp
    args = [go, x, [k] * nsp, list(out), idx]
    return mk(getattr(A, name), getattr(ext, name), args) + (lambda: getattr(ext, name + "_fixed")(*args),)


CASES = [
    # (op, case name, kind, builder)
    ("adaptive_avg_pool2d", "32x256x33x33->7x7", "realistic", lambda dt: c_adaptive_avg((32, 256, 33, 33), 7, dt)),
    ("adaptive_avg_pool2d", "32x256x33x33->7x7 channels_last", "realistic", lambda dt: c_adaptive_avg((32, 256, 33, 33), 7, dt, cl=True)),
    ("adaptive_avg_pool2d", "4x64x14x14->5x5", "small", lambda dt: c_adaptive_avg((4, 64, 14, 14), 5, dt)),
    ("adaptive_avg_pool2d", "4x32x4x4->64x64 (upsampling)", "contention", lambda dt: c_adaptive_avg((4, 32, 4, 4), 64, dt)),
    ("adaptive_avg_pool3d", "8x64x17x17x17->5x5x5", "realistic", lambda dt: c_adaptive_avg((8, 64, 17, 17, 17), 5, dt)),
    ("adaptive_avg_pool3d", "2x16x9x9x9->4x4x4", "small", lambda dt: c_adaptive_avg((2, 16, 9, 9, 9), 4, dt)),
    ("adaptive_avg_pool3d", "2x16x2x2x2->16x16x16 (upsampling)", "contention", lambda dt: c_adaptive_avg((2, 16, 2, 2, 2), 16, dt)),
    ("avg_pool3d", "8x32x32^3 k3 s2 p1", "realistic", lambda dt: c_avg3d((8, 32, 32, 32, 32), 3, 2, 1, dt)),
    ("avg_pool3d", "8x32x32^3 k3 s2 p1 channels_last ceil no-pad-count", "realistic", lambda dt: c_avg3d((8, 32, 32, 32, 32), 3, 2, 1, dt, ceil=True, cip=False, cl=True)),
    ("avg_pool3d", "8x32x32^3 k2 s2", "realistic", lambda dt: c_avg3d((8, 32, 32, 32, 32), 2, 2, 0, dt)),
    ("avg_pool3d", "2x16x8^3 k3 s2 p1", "small", lambda dt: c_avg3d((2, 16, 8, 8, 8), 3, 2, 1, dt)),
    ("avg_pool3d", "2x8x12^3 k7 s1 p3 (343 windows per element)", "contention", lambda dt: c_avg3d((2, 8, 12, 12, 12), 7, 1, 3, dt, dv=7)),
    ("reflection_pad2d", "16x64x128x128 pad 3", "realistic", lambda dt: c_pad("reflection", (16, 64, 128, 128), (3, 3, 3, 3), dt)),
    ("reflection_pad2d", "16x64x128x128 pad 3 channels_last", "realistic", lambda dt: c_pad("reflection", (16, 64, 128, 128), (3, 3, 3, 3), dt, cl=True)),
    ("reflection_pad2d", "4x32x32x32 pad (1,2,3,4)", "small", lambda dt: c_pad("reflection", (4, 32, 32, 32), (1, 2, 3, 4), dt)),
    ("reflection_pad2d", "64x64x9x9 pad 8 (each element up to 9 outputs)", "contention", lambda dt: c_pad("reflection", (64, 64, 9, 9), (8, 8, 8, 8), dt)),
    ("reflection_pad1d", "64x64x1024 pad 100", "realistic", lambda dt: c_pad("reflection", (64, 64, 1024), (100, 100), dt)),
    ("reflection_pad3d", "4x32x32^3 pad 2", "realistic", lambda dt: c_pad("reflection", (4, 32, 32, 32, 32), (2,) * 6, dt)),
    ("replication_pad2d", "16x64x128x128 pad 3", "realistic", lambda dt: c_pad("replication", (16, 64, 128, 128), (3, 3, 3, 3), dt)),
    ("replication_pad2d", "4x32x32x32 pad 2", "small", lambda dt: c_pad("replication", (4, 32, 32, 32), (2, 2, 2, 2), dt)),
    ("replication_pad2d", "16x16x8x8 pad 64 (corner gets 65^2)", "contention", lambda dt: c_pad("replication", (16, 16, 8, 8), (64,) * 4, dt)),
    ("replication_pad1d", "64x64x1024 pad 100", "realistic", lambda dt: c_pad("replication", (64, 64, 1024), (100, 100), dt)),
    ("replication_pad3d", "4x32x32^3 pad 2", "realistic", lambda dt: c_pad("replication", (4, 32, 32, 32, 32), (2,) * 6, dt)),
    ("upsample_bilinear2d", "8x64x64x64 x2", "realistic", lambda dt: c_interp("bilinear", (8, 64, 64, 64), dt, sf=2)),
    ("upsample_bilinear2d", "8x64x64x64 x2 align_corners channels_last", "realistic", lambda dt: c_interp("bilinear", (8, 64, 64, 64), dt, sf=2, ac=True, cl=True)),
    ("upsample_bilinear2d", "8x64x128x128 -> 50x50", "realistic", lambda dt: c_interp("bilinear", (8, 64, 128, 128), dt, size=(50, 50))),
    ("upsample_bilinear2d", "2x32x16x16 x2", "small", lambda dt: c_interp("bilinear", (2, 32, 16, 16), dt, sf=2)),
    ("upsample_bilinear2d", "1x16x4x4 -> 256x256", "contention", lambda dt: c_interp("bilinear", (1, 16, 4, 4), dt, size=(256, 256))),
    ("upsample_bicubic2d", "8x32x64x64 x2", "realistic", lambda dt: c_interp("bicubic", (8, 32, 64, 64), dt, sf=2)),
    ("upsample_bicubic2d", "2x16x16x16 -> 37x41 align_corners", "small", lambda dt: c_interp("bicubic", (2, 16, 16, 16), dt, size=(37, 41), ac=True)),
    ("upsample_bicubic2d", "2x8x4x4 -> 128x128", "contention", lambda dt: c_interp("bicubic", (2, 8, 4, 4), dt, size=(128, 128))),
    ("upsample_linear1d", "32x64x512 -> 1024", "realistic", lambda dt: c_interp("linear", (32, 64, 512), dt, sf=2)),
    ("upsample_linear1d", "4x16x64 x2.5", "small", lambda dt: c_interp("linear", (4, 16, 64), dt, sf=2.5)),
    ("upsample_trilinear3d", "4x32x16^3 x2", "realistic", lambda dt: c_interp("trilinear", (4, 32, 16, 16, 16), dt, sf=2)),
    ("upsample_trilinear3d", "1x8x2^3 -> 32^3", "contention", lambda dt: c_interp("trilinear", (1, 8, 2, 2, 2), dt, size=(32, 32, 32))),
    ("max_pool3d", "8x32x32^3 k3 s2 p1", "realistic", lambda dt: c_maxpool3d((8, 32, 32, 32, 32), 3, 2, 1, dt)),
    ("max_pool3d", "8x32x32^3 k2 s2", "realistic", lambda dt: c_maxpool3d((8, 32, 32, 32, 32), 2, 2, 0, dt)),
    ("max_pool3d", "2x16x8^3 k3 s2 p1", "small", lambda dt: c_maxpool3d((2, 16, 8, 8, 8), 3, 2, 1, dt)),
    ("max_pool3d", "2x16x16^3 k5 s1 p2, peaks (up to 125 outputs share one argmax)", "contention", lambda dt: c_maxpool3d((2, 16, 16, 16, 16), 5, 1, 2, dt, contention=997)),
    ("fractional_max_pool2d", "16x64x64x64 k3 -> 40x40", "realistic", lambda dt: c_frac((16, 64, 64, 64), 3, (40, 40), dt)),
    ("fractional_max_pool2d", "2x16x16x16 k2 -> 10x10", "small", lambda dt: c_frac((2, 16, 16, 16), 2, (10, 10), dt)),
    ("fractional_max_pool2d", "16x64x32x32 k3 -> 30x30, peaks (up to 16 outputs share one argmax)", "contention", lambda dt: c_frac((16, 64, 32, 32), 3, (30, 30), dt, contention=211)),
    ("fractional_max_pool3d", "4x32x24^3 k2 -> 16^3", "realistic", lambda dt: c_frac((4, 32, 24, 24, 24), 2, (16, 16, 16), dt)),
]
# ops whose gather kernels take det_gather_acc (double running sum for fp32)
FLOAT_ACCUMULATION_OPS = ("adaptive_avg_pool2d", "adaptive_avg_pool3d", "avg_pool3d", "reflection_pad1d",
                          "reflection_pad2d", "reflection_pad3d", "replication_pad1d", "replication_pad2d",
                          "replication_pad3d", "upsample_linear1d", "upsample_bilinear2d", "upsample_bicubic2d",
                          "upsample_trilinear3d", "max_pool3d", "fractional_max_pool2d")
DTYPES_BY_KIND = {"realistic": ("fp32", "fp16", "bf16"), "small": ("fp32", "fp64"), "contention": ("fp32", "fp16")}


def max_err(a, ref):
    return float((a.detach().double().cpu() - ref).abs().max().item()) if ref.numel() else 0.0


def run_case(op, name, kind, builder, dt):
    fns = builder(dt)
    torch_fn, ours_fn, ref_fn = fns[:3]
    rec = {"op": op, "name": name, "kind": kind, "dtype": dt, "repeats": REPEATS}
    first = ours_fn().clone()
    rec["bitwise_equal_repeats"] = sum(1 for _ in range(REPEATS) if beq(ours_fn(), first))
    torch.cuda.synchronize()
    t = time.perf_counter()
    tfirst = torch_fn().clone()
    torch.cuda.synchronize()
    rec["torch_repeats"] = REPEATS if time.perf_counter() - t < 0.002 else 5
    rec["torch_differing_repeats"] = sum(1 for _ in range(rec["torch_repeats"]) if not beq(torch_fn(), tfirst))
    ref = ref_fn()
    rec["max_abs_err_vs_fp64_ours"] = max_err(first, ref)
    rec["max_abs_err_vs_fp64_torch"] = max_err(tfirst, ref)
    rec["max_abs_ref"] = float(ref.abs().max().item())
    t, o = rec["max_abs_err_vs_fp64_torch"], rec["max_abs_err_vs_fp64_ours"]
    rec["error_ratio"] = (o / t) if t > 0 else (1.0 if o == 0 else float("inf"))
    t_torch = median_ms(torch_fn)
    t_ours = median_ms(ours_fn)
    rec["timing"] = {"torch_atomic_ms": t_torch, "ours_ms": t_ours, "ratio": t_ours / t_torch}
    if dt == "fp32" and op in FLOAT_ACCUMULATION_OPS and not os.environ.get("DETBW17_NO_FLOAT_ACC"):
        # the same kernels with the running sum in float (the earlier version), for the double's cost and gain
        ext.set_float_accumulation(True)
        try:
            ffirst = ours_fn().clone()
            rec["float_accumulation_variant"] = {
                "bitwise_equal_repeats": sum(1 for _ in range(REPEATS) if beq(ours_fn(), ffirst)),
                "max_abs_err_vs_fp64": max_err(ffirst, ref), "ours_ms": median_ms(ours_fn)}
        finally:
            ext.set_float_accumulation(False)
        fv = rec["float_accumulation_variant"]
        fv["ratio"] = fv["ours_ms"] / t_torch
        fv["error_ratio"] = (fv["max_abs_err_vs_fp64"] / t) if t > 0 else (1.0 if fv["max_abs_err_vs_fp64"] == 0 else float("inf"))
    if len(fns) == 4:  # the fixed-point (integer atomic) variant of the same op
        alt = fns[3]
        afirst = alt().clone()
        t_alt = median_ms(alt)
        rec["fixed_point_variant"] = {
            "bitwise_equal_repeats": sum(1 for _ in range(REPEATS) if beq(alt(), afirst)),
            "max_abs_err_vs_fp64": max_err(afirst, ref), "ours_ms": t_alt, "ratio": t_alt / t_torch}
    return rec


# --------------------------------------------------------------------------------------
# grid_sampler_3d (PT-0222): two outputs, grad_input (gathered) and grad_grid (torch's arithmetic)
# --------------------------------------------------------------------------------------
GRID3D_MODES = {"bilinear": 0, "nearest": 1}
GRID3D_PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
GRID3D_CASES = [
    # (name, kind, input shape, grid (N, D, H, W), mode, padding, align_corners, grid range, dtypes)
    ("4x32x32^3, grid 32^3 trilinear zeros", "realistic", (4, 32, 32, 32, 32), (4, 32, 32, 32), "bilinear",
     "zeros", False, 1.0, ("fp32", "fp16", "bf16")),
    ("4x32x32^3, grid 32^3 nearest border", "realistic", (4, 32, 32, 32, 32), (4, 32, 32, 32), "nearest",
     "border", False, 1.0, ("fp32", "fp16")),
    ("2x16x16^3 -> grid 48^3 trilinear (upsampling) reflection align_corners", "realistic", (2, 16, 16, 16, 16),
     (2, 48, 48, 48), "bilinear", "reflection", True, 1.0, ("fp32",)),
    ("1x8x8^3, grid 8^3 trilinear zeros", "small", (1, 8, 8, 8, 8), (1, 8, 8, 8), "bilinear", "zeros", False, 1.0,
     ("fp32", "fp64")),
    ("1x8x8^3, grid 8^3 nearest reflection", "small", (1, 8, 8, 8, 8), (1, 8, 8, 8), "nearest", "reflection", True,
     1.0, ("fp32", "fp64")),
    ("2x16x16^3, grid 32^3 in a 2-voxel box (contention)", "contention", (2, 16, 16, 16, 16), (2, 32, 32, 32),
     "bilinear", "zeros", False, 0.05, ("fp32", "fp16")),
    ("2x16x16^3, grid 32^3 nearest in a 2-voxel box (contention)", "contention", (2, 16, 16, 16, 16),
     (2, 32, 32, 32), "nearest", "zeros", False, 0.05, ("fp32",)),
] + [
    ("2x8x12^3, grid 16^3 in [-1.6, 1.6] %s %s ac%d (out of range)" % (mode, pad, ac), "out_of_range",
     (2, 8, 12, 12, 12), (2, 16, 16, 16), mode, pad, ac, 1.6, ("fp32",) if (mode, ac) != ("bilinear", False) else ("fp32", "fp64"))
    for mode in ("bilinear", "nearest") for pad in ("zeros", "border", "reflection") for ac in (False, True)
]


def grid3d_case(name, kind, shape, gshape, mode, pad, ac, extent, dt, seed=31):
    x = randn(shape, dt, seed)
    grid = ((torch.rand(gshape + (3,), generator=gen(seed + 1)) * 2 - 1) * extent).to("cuda", DT[dt])
    y = F.grid_sample(x, grid, mode=mode, padding_mode=pad, align_corners=ac)
    go = randn(tuple(y.shape), dt, seed + 2)
    args = [go, x, grid, GRID3D_MODES[mode], GRID3D_PADDINGS[pad], ac, [True, True]]
    torch_fn = lambda: A.grid_sampler_3d_backward(*args)  # noqa: E731
    ours_fn = lambda: ext.grid_sampler_3d_backward(*args)  # noqa: E731
    rec = {"op": "grid_sampler_3d", "name": name, "kind": kind, "dtype": dt, "mode": mode, "padding": pad,
           "align_corners": ac, "repeats": REPEATS}
    first = [t.clone() for t in ours_fn()]
    rec["bitwise_equal_repeats"] = sum(1 for _ in range(REPEATS) if all(beq(a, b) for a, b in zip(ours_fn(), first)))
    tfirst = [t.clone() for t in torch_fn()]
    rec["torch_repeats"] = REPEATS
    rec["torch_differing_repeats"] = sum(1 for _ in range(REPEATS)
                                         if not all(beq(a, b) for a, b in zip(torch_fn(), tfirst)))
    ref = A.grid_sampler_3d_backward(*to64cpu(args))
    for k, label in enumerate(("grad_input", "grad_grid")):
        o, t = max_err(first[k], ref[k]), max_err(tfirst[k], ref[k])
        rec[label] = {"max_abs_err_vs_fp64_ours": o, "max_abs_err_vs_fp64_torch": t,
                      "max_abs_ref": float(ref[k].abs().max().item()),
                      "max_abs_diff_vs_torch": float((first[k].double() - tfirst[k].double()).abs().max().item()),
                      "error_ratio": (o / t) if t > 0 else (1.0 if o == 0 else float("inf"))}
    t_torch, t_ours = median_ms(torch_fn), median_ms(ours_fn)
    rec["timing"] = {"torch_atomic_ms": t_torch, "ours_ms": t_ours, "ratio": t_ours / t_torch}
    return rec


def grid3d_part(result, dump):
    result["grid_sampler_3d"] = {}
    checks = []
    result["grid_sampler_3d"]["gradcheck"] = checks
    for mode in ("bilinear", "nearest"):
        for pad in ("zeros", "border", "reflection"):
            for ac in (False, True):
                x = torch.randn(1, 2, 3, 4, 5, device="cuda", dtype=torch.float64)
                grid = (torch.rand(1, 2, 3, 2, 3, device="cuda", dtype=torch.float64) * 2.4 - 1.2)
                mi, pi = GRID3D_MODES[mode], GRID3D_PADDINGS[pad]

                class Fn(torch.autograd.Function):
                    @staticmethod
                    def forward(ctx, inp, g, mi=mi, pi=pi, ac=ac):
                        ctx.save_for_backward(inp, g)
                        return A.grid_sampler_3d(inp, g, mi, pi, ac)

                    @staticmethod
                    def backward(ctx, go, mi=mi, pi=pi, ac=ac):
                        inp, g = ctx.saved_tensors
                        gi, gg = ext.grid_sampler_3d_backward(go.contiguous(), inp, g, mi, pi, ac, [True, True])
                        return gi, gg

                entry = {"name": "grid_sampler_3d %s %s ac%d" % (mode, pad, ac), "interpolation": mode,
                         "padding": pad, "align_corners": ac}
                try:
                    # nearest: grad_grid is zero by definition (the forward is piecewise constant), so only the input
                    inputs = (x.requires_grad_(True), grid.requires_grad_(mode == "bilinear"))
                    entry["passed"] = bool(torch.autograd.gradcheck(Fn.apply, inputs, eps=1e-6, atol=1e-5))
                except Exception as exc:
                    entry["passed"] = False
                    entry["error"] = str(exc).splitlines()[0][:300]
                checks.append(entry)
    print("grid_sampler_3d gradcheck:", [(c["name"], c["passed"]) for c in checks if not c["passed"]] or "all passed",
          flush=True)
    dump()
    cases = []
    result["grid_sampler_3d"]["cases"] = cases
    for name, kind, shape, gshape, mode, pad, ac, extent, dtypes in GRID3D_CASES:
        for dt in dtypes:
            try:
                rec = grid3d_case(name, kind, shape, gshape, mode, pad, ac, extent, dt)
            except Exception as exc:
                rec = {"op": "grid_sampler_3d", "name": name, "kind": kind, "dtype": dt, "error": repr(exc)[:400]}
            cases.append(rec)
            dump()
            if "error" in rec:
                print("grid_sampler_3d", name, dt, "ERROR", rec["error"], flush=True)
                continue
            print("grid_sampler_3d %-62s %-4s bw %d/%d torch_diff %d gi err %.3g/%.3g gg err %.3g/%.3g gg diff %.3g "
                  "t %.4f/%.4f r %.2f" % (
                      name[:62], dt, rec["bitwise_equal_repeats"], REPEATS, rec["torch_differing_repeats"],
                      rec["grad_input"]["max_abs_err_vs_fp64_ours"], rec["grad_input"]["max_abs_err_vs_fp64_torch"],
                      rec["grad_grid"]["max_abs_err_vs_fp64_ours"], rec["grad_grid"]["max_abs_err_vs_fp64_torch"],
                      rec["grad_grid"]["max_abs_diff_vs_torch"], rec["timing"]["ours_ms"],
                      rec["timing"]["torch_atomic_ms"], rec["timing"]["ratio"]), flush=True)


# --------------------------------------------------------------------------------------
# gradcheck (fp64): forward torch's, backward ours
# --------------------------------------------------------------------------------------
def gradchecks():
    out = []

    def gc(name, fwd, bwd, x):
        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, inp):
                ctx.save_for_backward(inp)
                return fwd(inp)

            @staticmethod
            def backward(ctx, go):
                (inp,) = ctx.saved_tensors
                return bwd(go.contiguous(), inp)

        entry = {"name": name}
        try:
            entry["passed"] = bool(torch.autograd.gradcheck(Fn.apply, (x.requires_grad_(True),), eps=1e-6, atol=1e-5))
        except Exception as exc:
            entry["passed"] = False
            entry["error"] = str(exc).splitlines()[0][:300]
        out.append(entry)

    d = dict(device="cuda", dtype=torch.float64)
    x = torch.randn(2, 3, 9, 7, **d)
    gc("adaptive_avg_pool2d 9x7->4x3", lambda t: F.adaptive_avg_pool2d(t, (4, 3)), ext.adaptive_avg_pool2d_backward, x)
    x = torch.randn(1, 2, 5, 6, 7, **d)
    gc("adaptive_avg_pool3d ->3x4x2", lambda t: F.adaptive_avg_pool3d(t, (3, 4, 2)), ext.adaptive_avg_pool3d_backward, x)
    for k, s, p, ceil, cip in [(3, 2, 1, False, True), (3, 2, 1, True, False), (2, 1, 0, False, True)]:
        x = torch.randn(1, 2, 5, 6, 7, **d)
        gc("avg_pool3d k%d s%d p%d ceil%d cip%d" % (k, s, p, ceil, cip),
           lambda t, k=k, s=s, p=p, ceil=ceil, cip=cip: F.avg_pool3d(t, k, s, p, ceil_mode=ceil, count_include_pad=cip),
           lambda go, t, k=k, s=s, p=p, ceil=ceil, cip=cip: ext.avg_pool3d_backward(go, t, [k] * 3, [s] * 3, [p] * 3, ceil, cip, None), x)
    for kind, mode in [("reflection", "reflect"), ("replication", "replicate")]:
        for pad, shape in [((2, 3), (2, 3, 6)), ((1, 2, 3, 1), (2, 2, 5, 6)), ((1, 2, 1, 2, 2, 1), (1, 2, 4, 5, 4))]:
            nd = len(pad) // 2
            x = torch.randn(*shape, **d)
            gc("%s_pad%dd %s" % (kind, nd, pad), lambda t, pad=pad, mode=mode: F.pad(t, pad, mode=mode),
               lambda go, t, pad=pad, nd=nd, kind=kind: getattr(ext, "%s_pad%dd_backward" % (kind, nd))(go, t, list(pad)), x)
    for mode, shape, size, ac in [("linear", (2, 2, 7), (11,), False), ("bilinear", (1, 2, 5, 6), (9, 4), False),
                                  ("bilinear", (1, 2, 5, 6), (9, 4), True), ("bicubic", (1, 2, 5, 6), (8, 9), False),
                                  ("bicubic", (1, 2, 5, 6), (3, 11), True), ("trilinear", (1, 1, 3, 4, 5), (5, 3, 7), False)]:
        x = torch.randn(*shape, **d)
        name = {"linear": "upsample_linear1d_backward", "bilinear": "upsample_bilinear2d_backward",
                "bicubic": "upsample_bicubic2d_backward", "trilinear": "upsample_trilinear3d_backward"}[mode]
        nsp = len(shape) - 2
        gc("%s %s->%s ac%d" % (mode, shape, size, ac),
           lambda t, mode=mode, size=size, ac=ac: F.interpolate(t, size=size, mode=mode, align_corners=ac),
           lambda go, t, name=name, size=size, ac=ac, nsp=nsp: getattr(ext, name)(go, list(size), list(t.shape), ac, *([None] * nsp)), x)
    # max-type pools: indices from the forward on the fixed input
    x = torch.randn(1, 2, 6, 7, 5, **d)
    gc("max_pool3d k3 s2 p1", lambda t: F.max_pool3d(t, 3, 2, 1),
       lambda go, t: ext.max_pool3d_with_indices_backward(go, t, [3] * 3, [2] * 3, [1] * 3, [1] * 3, False,
                                                          F.max_pool3d(t, 3, 2, 1, return_indices=True)[1]), x)
    x = torch.randn(1, 2, 6, 7, 5, **d)
    gc("max_pool3d k3 s2 p1 (fixed-point variant)", lambda t: F.max_pool3d(t, 3, 2, 1),
       lambda go, t: ext.max_pool3d_with_indices_backward_fixed(go, t, [3] * 3, [2] * 3, [1] * 3, [1] * 3, False,
                                                                F.max_pool3d(t, 3, 2, 1, return_indices=True)[1]), x)
    samples2 = torch.rand(1, 2, 2, **d)
    x = torch.randn(1, 2, 9, 8, **d)
    gc("fractional_max_pool2d k2 ->5x4", lambda t: F.fractional_max_pool2d(t, 2, output_size=(5, 4), _random_samples=samples2),
       lambda go, t: ext.fractional_max_pool2d_backward(go, t, [2, 2], [5, 4], F.fractional_max_pool2d(
           t, 2, output_size=(5, 4), return_indices=True, _random_samples=samples2)[1]), x)
    samples3 = torch.rand(1, 2, 3, **d)
    x = torch.randn(1, 2, 7, 6, 8, **d)
    gc("fractional_max_pool3d k2 ->4x3x5", lambda t: F.fractional_max_pool3d(t, 2, output_size=(4, 3, 5), _random_samples=samples3),
       lambda go, t: ext.fractional_max_pool3d_backward(go, t, [2, 2, 2], [4, 3, 5], F.fractional_max_pool3d(
           t, 2, output_size=(4, 3, 5), return_indices=True, _random_samples=samples3)[1]), x)
    return out


# --------------------------------------------------------------------------------------
# max_unpool: a write conflict; ours must equal the single-threaded CPU bitwise
# --------------------------------------------------------------------------------------
def unpool_checks():
    out = []
    nthreads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CPU kernel splits planes over threads: with duplicates it races
    try:
        for name, nsp, shape, k, s, p, dup in [
                ("max_unpool2d 16x64x64x64 pool2", 2, (16, 64, 64, 64), 2, 2, 0, False),
                ("max_unpool2d 8x32x33x33 pool3 s2 (overlapping: duplicate indices)", 2, (8, 32, 33, 33), 3, 2, 1, False),
                ("max_unpool2d 4x8x16x16 all indices 0", 2, (4, 8, 16, 16), 2, 2, 0, True),
                ("max_unpool3d 4x16x16^3 pool3 s2 (duplicates)", 3, (4, 16, 16, 16, 16), 3, 2, 1, False)]:
            for dt in ("fp32", "fp16"):
              try:
                x = randn(shape, dt, 21)
                pool = F.max_pool2d if nsp == 2 else F.max_pool3d
                y, idx = pool(x, k, s, p, return_indices=True)
                if dup:
                    idx = torch.zeros_like(idx)
                osz = list(shape[2:])
                if nsp == 2:
                    torch_fn = lambda: F.max_unpool2d(y, idx, k, s, p, output_size=osz)
                    ours_fn = lambda: ext.max_unpool2d(y, idx, osz)
                    cpu = F.max_unpool2d(y.cpu(), idx.cpu(), k, s, p, output_size=osz)
                else:
                    torch_fn = lambda: F.max_unpool3d(y, idx, k, s, p, output_size=osz)
                    ours_fn = lambda: ext.max_unpool3d(y, idx, osz, [s] * 3, [p] * 3)
                    cpu = F.max_unpool3d(y.cpu(), idx.cpu(), k, s, p, output_size=osz)
                first = ours_fn().clone()
                tfirst = torch_fn().clone()
                rec = {"name": name, "dtype": dt, "repeats": REPEATS,
                       "bitwise_equal_repeats": sum(1 for _ in range(REPEATS) if beq(ours_fn(), first)),
                       "torch_differing_repeats": sum(1 for _ in range(REPEATS) if not beq(torch_fn(), tfirst)),
                       "equals_single_thread_cpu": beq(first.cpu(), cpu),
                       "torch_cuda_equals_single_thread_cpu": beq(tfirst.cpu(), cpu)}
                t_torch, t_ours = median_ms(torch_fn), median_ms(ours_fn)
                rec["timing"] = {"torch_atomic_ms": t_torch, "ours_ms": t_ours, "ratio": t_ours / t_torch}
                out.append(rec)
              except Exception as exc:
                out.append({"name": name, "dtype": dt, "error": repr(exc)[:400]})
    finally:
        torch.set_num_threads(nthreads)
    return out


# --------------------------------------------------------------------------------------
# torch's kernels under the flag
# --------------------------------------------------------------------------------------
def flag_probes():
    x2 = torch.randn(2, 4, 9, 9, device="cuda", requires_grad=True)
    x3 = torch.randn(2, 4, 6, 6, 6, device="cuda", requires_grad=True)
    x1 = torch.randn(2, 4, 9, device="cuda", requires_grad=True)
    s2 = torch.rand(2, 4, 2, device="cuda")
    s3 = torch.rand(2, 4, 3, device="cuda")
    probes = {
        "adaptive_avg_pool2d": lambda: F.adaptive_avg_pool2d(x2, 4).sum().backward(),
        "adaptive_avg_pool3d": lambda: F.adaptive_avg_pool3d(x3, 4).sum().backward(),
        "avg_pool3d": lambda: F.avg_pool3d(x3, 3, 2, 1).sum().backward(),
        "max_pool3d": lambda: F.max_pool3d(x3, 3, 2, 1).sum().backward(),
        "fractional_max_pool2d": lambda: F.fractional_max_pool2d(x2, 2, output_size=(5, 5), _random_samples=s2).sum().backward(),
        "fractional_max_pool3d": lambda: F.fractional_max_pool3d(x3, 2, output_size=(3, 3, 3), _random_samples=s3).sum().backward(),
        "reflection_pad1d": lambda: F.pad(x1, (2, 2), mode="reflect").sum().backward(),
        "reflection_pad2d": lambda: F.pad(x2, (2, 2, 2, 2), mode="reflect").sum().backward(),
        "reflection_pad3d": lambda: F.pad(x3, (2,) * 6, mode="reflect").sum().backward(),
        "replication_pad1d": lambda: F.pad(x1, (2, 2), mode="replicate").sum().backward(),
        "replication_pad2d": lambda: F.pad(x2, (2, 2, 2, 2), mode="replicate").sum().backward(),
        "replication_pad3d": lambda: F.pad(x3, (2,) * 6, mode="replicate").sum().backward(),
        "upsample_linear1d": lambda: F.interpolate(x1, scale_factor=2, mode="linear").sum().backward(),
        "upsample_bilinear2d": lambda: F.interpolate(x2, scale_factor=2, mode="bilinear").sum().backward(),
        "upsample_bicubic2d": lambda: F.interpolate(x2, scale_factor=2, mode="bicubic").sum().backward(),
        "upsample_trilinear3d": lambda: F.interpolate(x3, scale_factor=2, mode="trilinear").sum().backward(),
        "max_unpool2d": lambda: F.max_unpool2d(*F.max_pool2d(x2.detach(), 3, 2, 1, return_indices=True), 3, 2, 1),
        "max_unpool3d": lambda: F.max_unpool3d(*F.max_pool3d(x3.detach(), 3, 2, 1, return_indices=True), 3, 2, 1,
                                               output_size=(6, 6, 6)),
        "adaptive_max_pool2d": lambda: F.adaptive_max_pool2d(x2, 4).sum().backward(),
        "grid_sampler_2d": lambda: F.grid_sample(x2, torch.rand(2, 5, 5, 2, device="cuda") * 2 - 1, align_corners=False).sum().backward(),
        "grid_sampler_3d": lambda: F.grid_sample(x3, torch.rand(2, 3, 3, 3, 3, device="cuda") * 2 - 1, align_corners=False).sum().backward(),
    }
    res = {}
    for name, fn in probes.items():
        torch.use_deterministic_algorithms(True)
        try:
            fn()
            torch.cuda.synchronize()
            res[name] = {"raised": False}
        except RuntimeError as exc:
            res[name] = {"raised": True, "message": str(exc).splitlines()[0][:200]}
        finally:
            torch.use_deterministic_algorithms(False)
    return res


# --------------------------------------------------------------------------------------
# training: four small real networks
# --------------------------------------------------------------------------------------
class CBAM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.mlp = nn.Sequential(nn.Conv2d(c, c // 4, 1), nn.ReLU(), nn.Conv2d(c // 4, c, 1))
        self.spatial = nn.Conv2d(2, 1, 7, padding=3)

    def forward(self, x):
        a = self.mlp(F.adaptive_avg_pool2d(x, 1)) + self.mlp(F.adaptive_max_pool2d(x, 1))
        x = x * torch.sigmoid(a)
        s = torch.cat([x.mean(1, keepdim=True), x.amax(1, keepdim=True)], 1)
        return x * torch.sigmoid(self.spatial(s))


class YoloCBAM(nn.Module):
    """Conv-BN-SiLU stages with CBAM; a pooled head over an adaptive 5x5 grid (avg and max)."""

    def __init__(self):
        super().__init__()
        layers, c = [], 3
        for co in (32, 64, 128):
            layers += [nn.Conv2d(c, co, 3, 2, 1), nn.BatchNorm2d(co), nn.SiLU(), CBAM(co)]
            c = co
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(128 * 25 * 2, 10)

    def forward(self, x):
        f = self.body(x)
        p = torch.cat([F.adaptive_avg_pool2d(f, 5), F.adaptive_max_pool2d(f, 5)], 1)
        return self.head(p.flatten(1))


class STN(nn.Module):
    def __init__(self):
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(1, 8, 7), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(8, 10, 5),
                                 nn.MaxPool2d(2), nn.ReLU())
        self.fc_loc = nn.Sequential(nn.Linear(10 * 3 * 3, 32), nn.ReLU(), nn.Linear(32, 6))
        nn.init.zeros_(self.fc_loc[2].weight)
        self.fc_loc[2].bias.data.copy_(torch.tensor([1, 0, 0, 0, 1, 0], dtype=torch.float))
        self.cls = nn.Sequential(nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 5), nn.ReLU(),
                                 nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 4 * 4, 10))

    def forward(self, x):
        theta = self.fc_loc(self.loc(x).flatten(1)).view(-1, 2, 3)
        grid = F.affine_grid(theta, x.size(), align_corners=False)
        return self.cls(F.grid_sample(x, grid, align_corners=False))


def rconv(ci, co):
    return nn.Sequential(nn.Conv2d(ci, co, 3, padding=1, padding_mode="reflect"), nn.BatchNorm2d(co), nn.ReLU(),
                         nn.Conv2d(co, co, 3, padding=1, padding_mode="reflect"), nn.BatchNorm2d(co), nn.ReLU())


class UNet(nn.Module):
    """Reflection-padded convs, bilinear upsampling, a replication-padded output conv."""

    def __init__(self):
        super().__init__()
        self.d1, self.d2, self.d3 = rconv(3, 16), rconv(16, 32), rconv(32, 64)
        self.u2, self.u1 = rconv(64 + 32, 32), rconv(32 + 16, 16)
        self.out = nn.Conv2d(16, 3, 3, padding=1, padding_mode="replicate")

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(F.max_pool2d(a, 2))
        c = self.d3(F.max_pool2d(b, 2))
        u = self.u2(torch.cat([F.interpolate(c, scale_factor=2, mode="bilinear", align_corners=False), b], 1))
        u = self.u1(torch.cat([F.interpolate(u, scale_factor=2, mode="bilinear", align_corners=False), a], 1))
        return self.out(u)


class Net3D(nn.Module):
    """3-D convs with AvgPool3d (overlapping), MaxPool3d and trilinear upsampling (segmentation-style)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Sequential(nn.Conv3d(1, 16, 3, padding=1), nn.BatchNorm3d(16), nn.ReLU())
        self.c2 = nn.Sequential(nn.Conv3d(16, 32, 3, padding=1), nn.BatchNorm3d(32), nn.ReLU())
        self.c3 = nn.Conv3d(32 + 16, 4, 3, padding=1)

    def forward(self, x):
        a = self.c1(x)
        b = self.c2(F.avg_pool3d(a, 3, 2, 1))
        b = F.max_pool3d(b, 3, 1, 1)
        u = F.interpolate(b, scale_factor=2, mode="trilinear", align_corners=False)
        return self.c3(torch.cat([u, a], 1))


def batches(kind, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        if kind == "yolo_cbam":
            yield torch.randn(32, 3, 64, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
        elif kind == "stn":
            yield torch.randn(64, 1, 28, 28, generator=g), torch.randint(0, 10, (64,), generator=g)
        elif kind == "unet":
            x = torch.randn(8, 3, 64, 64, generator=g)
            yield x, x.flip(-1)
        else:
            x = torch.randn(4, 1, 32, 32, 32, generator=g)
            yield x, torch.randint(0, 4, (4, 32, 32, 32), generator=g)


NETS = {"yolo_cbam": YoloCBAM, "stn": STN, "unet": UNet, "net3d": Net3D}


def train(kind, steps, deterministic, fill_uninitialized=True):
    """fill_uninitialized=False: torch 2.x's flag also fills every new tensor with NaN
    (torch.utils.deterministic.fill_uninitialized_memory); 1.13.1 has no such fill, so the
    steps/s that a 1.13.1 user sees are the ones without it."""
    torch.manual_seed(1234)
    model = NETS[kind]().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = [(x.cuda(), y.cuda()) for x, y in batches(kind, steps, 99)]
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
            out = model(x)
            if kind == "unet":
                loss = F.mse_loss(out, y)
            elif kind == "net3d":  # per-voxel classes as rows: nll_loss, not nll_loss2d (which raises)
                loss = F.cross_entropy(out.permute(0, 2, 3, 4, 1).reshape(-1, out.shape[1]), y.reshape(-1))
            else:
                loss = F.cross_entropy(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        sps = (steps - 10) / (time.perf_counter() - t0)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = fill_was
    params = [p.detach().clone() for p in model.parameters()]
    return params, sps, float(loss.item())


def same_params(a, b):
    return all(beq(x, y) for x, y in zip(a, b))


def main():
    global ext
    part = sys.argv[1] if len(sys.argv) > 1 else "all"
    out_dir = os.environ.get("OUT", ".")
    fname = {"all": "deterministic-issue17.json", "ops": "deterministic-issue17-ops.json",
             "train": "deterministic-issue17-training.json",
             "gridsample3d": "deterministic-issue17-gridsample3d.json"}[part]
    fname = os.environ.get("DETBW17_OUT_NAME", fname)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
              "python": platform.python_version(), "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
              "repeats": REPEATS, "timing_method": "median over up to %d samples of CUDA-event time / up to %d back-to-back "
              "calls (fewer for slow calls, about 0.2 s a side); each side calls its aten-level op (torch's via "
              "torch.ops.aten with the flag off, ours via the extension), allocation included" % (SAMPLES, BATCH),
              "reference": "fp64 on the CPU: torch's own CPU kernel on the inputs cast to float64"}
    t0 = time.time()
    try:
        ext, secs = build()
        result["build_seconds"] = secs
    except Exception:
        result["build_error"] = traceback.format_exc()[-3000:]
        json.dump(result, open(os.path.join(out_dir, fname), "w"), indent=1)
        raise
    result["part"] = part
    result["torch_under_deterministic_flag"] = flag_probes()
    if part in ("all", "gridsample3d"):
        grid3d_part(result, lambda: json.dump(result, open(os.path.join(out_dir, fname), "w"), indent=1))
    if part in ("all", "ops"):
        ops_part(result, out_dir, fname, t0)
    if part in ("all", "train"):
        train_part(result, lambda: json.dump(result, open(os.path.join(out_dir, fname), "w"), indent=1))
    result["total_seconds"] = time.time() - t0
    json.dump(result, open(os.path.join(out_dir, fname), "w"), indent=1)
    print("wrote", os.path.join(out_dir, fname), "in %.0f s" % result["total_seconds"])


def ops_part(result, out_dir, fname, t0):
    cases = []
    result["cases"] = cases
    budget = float(os.environ.get("DETBW17_OPS_BUDGET", "1e9"))
    # DETBW17_DTYPES=fp32 (say): only those dtypes of each case, for a run split over two device calls
    only = [d for d in os.environ.get("DETBW17_DTYPES", "").split(",") if d]
    result["dtypes_run"] = only or "all"
    for op, name, kind, builder in CASES:
        for dt in DTYPES_BY_KIND[kind]:
            if only and dt not in only:
                continue
            if time.time() - t0 > budget:
                cases.append({"op": op, "name": name, "kind": kind, "dtype": dt, "skipped": "time budget of the run"})
                continue
            try:
                rec = run_case(op, name, kind, builder, dt)
            except Exception as exc:
                rec = {"op": op, "name": name, "kind": kind, "dtype": dt, "error": repr(exc)[:400]}
            cases.append(rec)
            json.dump(result, open(os.path.join(out_dir, fname), "w"), indent=1)
            tm = rec.get("timing", {})
            if "fixed_point_variant" in rec:
                fp = rec["fixed_point_variant"]
                print("   fixed-point variant: bw %s/%s err %.3g t %.4f ms r %.2f" % (
                    fp["bitwise_equal_repeats"], REPEATS, fp["max_abs_err_vs_fp64"], fp["ours_ms"], fp["ratio"]))
            print("%-22s %-52s %-4s bw %s/%s torch_diff %s err %.3g/%.3g t %.4f/%.4f ms r %.2f" % (
                op, name[:52], dt, rec.get("bitwise_equal_repeats"), REPEATS, rec.get("torch_differing_repeats"),
                rec.get("max_abs_err_vs_fp64_ours", -1), rec.get("max_abs_err_vs_fp64_torch", -1),
                tm.get("ours_ms", -1), tm.get("torch_atomic_ms", -1), tm.get("ratio", -1)) if "error" not in rec
                else "%s %s %s ERROR %s" % (op, name, dt, rec["error"]), flush=True)
            if "error" in rec:
                torch.cuda.synchronize()
    print("cases done %.0f s" % (time.time() - t0), flush=True)
    try:
        result["max_unpool"] = unpool_checks()
    except Exception:
        result["max_unpool_error"] = traceback.format_exc()[-2000:]
    for r in result.get("max_unpool", []):
        if "error" in r:
            print("unpool", r)
            continue
        print("unpool", r["name"][:50], r["dtype"], r["bitwise_equal_repeats"], r["torch_differing_repeats"],
              r["equals_single_thread_cpu"], "%.2f" % r["timing"]["ratio"], flush=True)
    try:
        result["gradcheck"] = gradchecks()
    except Exception:
        result["gradcheck_error"] = traceback.format_exc()[-2000:]
    print("gradcheck:", [(g["name"], g["passed"]) for g in result.get("gradcheck", []) if not g["passed"]] or "all passed",
          flush=True)
    json.dump(result, open(os.path.join(out_dir, fname), "w"), indent=1)


def train_part(result, dump):
    # training: torch's atomic kernels first (flag off), then ours through the dispatcher (flag on)
    training = {"steps": TRAIN_STEPS, "optimizer": "SGD lr 0.01 momentum 0.9", "seed": 1234,
                "steps_per_s_method": "steps 11..%d over wall time, synchronised" % TRAIN_STEPS}
    result["training"] = training
    try:
        atomic = {}
        for kind in NETS:
            pa, sa, la = train(kind, TRAIN_STEPS, False)
            if int(os.environ.get("DETBW17_ATOMIC_RUNS", "2")) >= 2:
                pb, sb, lb = train(kind, TRAIN_STEPS, False)
                atomic[kind] = {"bitwise_equal": same_params(pa, pb), "steps_per_s": [sa, sb], "final_loss": [la, lb]}
            else:  # one run: steps/s only (bitwise comparison recorded by an earlier run)
                atomic[kind] = {"steps_per_s": [sa], "final_loss": [la]}
            print("atomic", kind, atomic[kind], flush=True)
            training["torch_atomic_flag_off"] = atomic
            dump()
        training["register_errors"] = ext.register_aten_cuda()
        # the flag no longer raises, and the dispatcher reaches our kernels
        training["after_registration_under_flag"] = flag_probes()
        ours = {}
        ours_params = {}
        for kind in NETS:
            pa, sa, la = train(kind, TRAIN_STEPS, True)
            pb, sb, lb = train(kind, TRAIN_STEPS, True)
            ours_params[kind] = pa
            ours[kind] = {"bitwise_equal": same_params(pa, pb), "steps_per_s": [sa, sb], "final_loss": [la, lb],
                          "steps_per_s_ratio_vs_atomic": statistics.mean([sa, sb]) / statistics.mean(atomic[kind]["steps_per_s"])}
            print("ours", kind, ours[kind], flush=True)
            training["ours_flag_on"] = ours
            dump()
        # where the flag-on time goes: (a) the same flag-on run without torch 2.x's NaN fill of new
        # tensors (which 1.13.1 does not do), (b) our kernels registered but the flag off (cuDNN
        # free to pick nondeterministic convolutions, no fill): ours against torch's kernels alone
        split = {}
        for kind in NETS:
            pn, sn, _ = train(kind, TRAIN_STEPS, True, fill_uninitialized=False)
            _, so, _ = train(kind, TRAIN_STEPS, False)
            base = statistics.mean(atomic[kind]["steps_per_s"])
            split[kind] = {"flag_on_no_fill_steps_per_s": sn, "flag_on_no_fill_ratio_vs_atomic": sn / base,
                           "flag_on_no_fill_bitwise_equal_to_flag_on": same_params(pn, ours_params[kind]),
                           "ours_flag_off_steps_per_s": so, "ours_flag_off_ratio_vs_atomic": so / base}
            print("split", kind, split[kind], flush=True)
            training["split"] = split
            dump()
        training["torch_atomic_flag_off"] = atomic
        training["ours_flag_on"] = ours
    except Exception:
        training["error"] = traceback.format_exc()[-3000:]
        print(training["error"])
    result["training"] = training


if __name__ == "__main__":
    sys.exit(main())
