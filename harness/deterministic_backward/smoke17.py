"""Quick correctness smoke test of the issue-17 kernels against torch's own (small sizes)."""
import sys
import traceback

import torch
import torch.nn.functional as F

from build17 import build

ext, secs = build()
print("built in %.1f s" % secs)
torch.manual_seed(0)
dev = "cuda"
fails = 0


def grad_of(fn, x, seed=1):
    x = x.detach().requires_grad_(True)
    y = fn(x)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(dev, y.dtype)
    (gi,) = torch.autograd.grad(y, x, g)
    return y, g, gi


def check(name, ours, ref, tol=1e-5):
    global fails
    err = (ours.double() - ref.double()).abs().max().item() if ours.numel() else 0.0
    scale = ref.double().abs().max().item() if ref.numel() else 0.0
    ok = err <= tol * max(scale, 1.0) and ours.shape == ref.shape
    fails += 0 if ok else 1
    print("%-44s %s err=%.3g scale=%.3g" % (name, "ok  " if ok else "FAIL", err, scale))


def run(name, f):
    global fails
    try:
        f()
    except Exception:
        fails += 1
        print(name, "EXCEPTION")
        traceback.print_exc()


def t_adaptive():
    for shape, out in [((2, 3, 33, 17), (7, 5)), ((3, 10, 9), (4, 4)), ((2, 3, 8, 8), (3, 3))]:
        x = torch.randn(shape, device=dev)
        y, g, gi = grad_of(lambda t: F.adaptive_avg_pool2d(t, out), x)
        check("adaptive_avg_pool2d %s->%s" % (shape, out), ext.adaptive_avg_pool2d_backward(g, x), gi)
    x = torch.randn(2, 16, 13, 11, device=dev).contiguous(memory_format=torch.channels_last)
    y, g, gi = grad_of(lambda t: F.adaptive_avg_pool2d(t, 5), x)
    check("adaptive_avg_pool2d channels_last", ext.adaptive_avg_pool2d_backward(g, x), gi)
    x = torch.randn(2, 3, 9, 10, 11, device=dev)
    y, g, gi = grad_of(lambda t: F.adaptive_avg_pool3d(t, (4, 3, 5)), x)
    check("adaptive_avg_pool3d", ext.adaptive_avg_pool3d_backward(g, x), gi)


def t_avg3d():
    for k, s, p, cm, cip, dv in [(3, 2, 1, False, True, None), (3, 2, 1, True, False, None),
                                 (2, 2, 0, False, True, None), ((3, 2, 3), (1, 2, 2), (1, 0, 1), True, True, 5)]:
        x = torch.randn(2, 3, 9, 10, 11, device=dev)
        fn = lambda t: F.avg_pool3d(t, k, s, p, ceil_mode=cm, count_include_pad=cip, divisor_override=dv)
        y, g, gi = grad_of(fn, x)
        kk = list(k) if isinstance(k, tuple) else [k]
        ss = list(s) if isinstance(s, tuple) else [s]
        pp = list(p) if isinstance(p, tuple) else [p]
        check("avg_pool3d k%s s%s p%s cm%d cip%d dv%s" % (k, s, p, cm, cip, dv),
              ext.avg_pool3d_backward(g, x, kk, ss, pp, cm, cip, dv), gi)


def t_pad():
    for mode, fnname in [("reflect", "reflection"), ("replicate", "replication")]:
        for nd, shape, pad in [(1, (2, 3, 10), (3, 4)), (2, (2, 3, 9, 10), (2, 3, 4, 1)),
                               (3, (2, 2, 5, 6, 7), (1, 2, 3, 1, 2, 4)), (2, (2, 3, 3, 3), (2, 2, 2, 2))]:
            x = torch.randn(shape, device=dev)
            y, g, gi = grad_of(lambda t: F.pad(t, pad, mode=mode), x)
            ours = getattr(ext, "%s_pad%dd_backward" % (fnname, nd))(g, x, list(pad))
            check("%s_pad%dd %s %s" % (fnname, nd, shape, pad), ours, gi)
    x = torch.randn(2, 3, 9, 10, device=dev)
    y, g, gi = grad_of(lambda t: F.pad(t, (8, 8, 8, 8), mode="replicate"), x)
    check("replication_pad2d large pad", ext.replication_pad2d_backward(g, x, [8, 8, 8, 8]), gi)


def t_interp():
    cases = [("linear", (2, 3, 10), dict(scale_factor=2.5)), ("linear", (2, 3, 10), dict(size=4, align_corners=True)),
             ("bilinear", (2, 3, 9, 10), dict(scale_factor=2)), ("bilinear", (2, 3, 9, 10), dict(size=(4, 7), align_corners=True)),
             ("bilinear", (2, 3, 9, 10), dict(scale_factor=1.7)),
             ("bicubic", (2, 3, 9, 10), dict(scale_factor=2)), ("bicubic", (2, 3, 9, 10), dict(size=(5, 17), align_corners=True)),
             ("bicubic", (2, 3, 12, 12), dict(size=(5, 5))),
             ("trilinear", (2, 3, 5, 6, 7), dict(scale_factor=2)), ("trilinear", (2, 3, 5, 6, 7), dict(size=(3, 9, 4), align_corners=True))]
    for mode, shape, kw in cases:
        kw = dict(kw)
        kw.setdefault("align_corners", False)
        x = torch.randn(shape, device=dev)
        y, g, gi = grad_of(lambda t: F.interpolate(t, mode=mode, **kw), x)
        osz = list(y.shape[2:])
        sf = kw.get("scale_factor")
        nsp = len(shape) - 2
        scales = [float(sf)] * nsp if sf is not None else [None] * nsp
        ac = kw["align_corners"]
        if mode == "linear":
            ours = ext.upsample_linear1d_backward(g, osz, list(shape), ac, scales[0])
        elif mode == "bilinear":
            ours = ext.upsample_bilinear2d_backward(g, osz, list(shape), ac, scales[0], scales[1])
        elif mode == "bicubic":
            ours = ext.upsample_bicubic2d_backward(g, osz, list(shape), ac, scales[0], scales[1])
        else:
            ours = ext.upsample_trilinear3d_backward(g, osz, list(shape), ac, *scales)
        check("%s %s %s" % (mode, shape, kw), ours, gi)
    x = torch.randn(2, 8, 9, 10, device=dev).contiguous(memory_format=torch.channels_last)
    y, g, gi = grad_of(lambda t: F.interpolate(t, scale_factor=2, mode="bilinear", align_corners=False), x)
    check("bilinear channels_last", ext.upsample_bilinear2d_backward(g, list(y.shape[2:]), list(x.shape), False, 2.0, 2.0), gi)


def t_maxpool():
    x = torch.randn(2, 3, 9, 10, 11, device=dev)
    for k, s, p, d in [(3, 2, 1, 1), (2, 2, 0, 1), (3, 1, 1, 2)]:
        y, idx = F.max_pool3d(x, k, s, p, d, return_indices=True)
        _, g, gi = grad_of(lambda t: F.max_pool3d(t, k, s, p, d), x)
        check("max_pool3d k%d s%d p%d d%d" % (k, s, p, d),
              ext.max_pool3d_with_indices_backward(g, x, [k], [s], [p], [d], False, idx), gi)
        check("max_pool3d k%d s%d p%d d%d fixed" % (k, s, p, d),
              ext.max_pool3d_with_indices_backward_fixed(g, x, [k], [s], [p], [d], False, idx), gi)
    x = torch.randn(2, 3, 17, 19, device=dev)
    samples = torch.rand(2, 3, 2, device=dev)
    y, idx = F.fractional_max_pool2d(x, 3, output_size=(9, 11), return_indices=True, _random_samples=samples)
    _, g, gi = grad_of(lambda t: F.fractional_max_pool2d(t, 3, output_size=(9, 11), _random_samples=samples), x)
    check("fractional_max_pool2d", ext.fractional_max_pool2d_backward(g, x, [3, 3], [9, 11], idx), gi)
    check("fractional_max_pool2d fixed", ext.fractional_max_pool2d_backward_fixed(g, x, [3, 3], [9, 11], idx), gi)
    x = torch.randn(2, 3, 9, 10, 11, device=dev)
    samples = torch.rand(2, 3, 3, device=dev)
    y, idx = F.fractional_max_pool3d(x, 2, output_size=(5, 6, 7), return_indices=True, _random_samples=samples)
    _, g, gi = grad_of(lambda t: F.fractional_max_pool3d(t, 2, output_size=(5, 6, 7), _random_samples=samples), x)
    check("fractional_max_pool3d", ext.fractional_max_pool3d_backward(g, x, [2, 2, 2], [5, 6, 7], idx), gi)
    check("fractional_max_pool3d fixed", ext.fractional_max_pool3d_backward_fixed(g, x, [2, 2, 2], [5, 6, 7], idx), gi)
    # peaks: many windows share one argmax
    x = torch.randn(2, 3, 17, 19, device=dev)
    x.view(-1)[::37] += 100
    samples = torch.rand(2, 3, 2, device=dev)
    y, idx = F.fractional_max_pool2d(x, 3, output_size=(15, 17), return_indices=True, _random_samples=samples)
    _, g, gi = grad_of(lambda t: F.fractional_max_pool2d(t, 3, output_size=(15, 17), _random_samples=samples), x)
    check("fractional_max_pool2d peaks", ext.fractional_max_pool2d_backward(g, x, [3, 3], [15, 17], idx), gi)
    x = torch.randn(2, 3, 9, 10, 11, device=dev)
    x.view(-1)[::53] += 100
    y, idx = F.max_pool3d(x, 5, 1, 2, return_indices=True)
    _, g, gi = grad_of(lambda t: F.max_pool3d(t, 5, 1, 2), x)
    check("max_pool3d k5 s1 peaks", ext.max_pool3d_with_indices_backward(g, x, [5], [1], [2], [1], False, idx), gi)


def t_unpool():
    torch.set_num_threads(1)  # the CPU rule: one thread, last writer wins
    x = torch.randn(2, 3, 8, 10, device=dev)
    y, idx = F.max_pool2d(x, 3, 2, 1, return_indices=True)  # overlapping: duplicate indices
    out = ext.max_unpool2d(y, idx, [8, 10])
    ref = F.max_unpool2d(y.cpu(), idx.cpu(), 3, 2, 1, output_size=(8, 10))
    check("max_unpool2d vs CPU", out.cpu(), ref)
    dup = torch.zeros_like(idx)  # every element onto index 0: the CPU's last writer wins
    out = ext.max_unpool2d(y, dup, [8, 10])
    ref = F.max_unpool2d(y.cpu(), dup.cpu(), 3, 2, 1, output_size=(8, 10))
    check("max_unpool2d all-duplicates vs CPU", out.cpu(), ref)
    x = torch.randn(2, 3, 6, 8, 10, device=dev)
    y, idx = F.max_pool3d(x, 3, 2, 1, return_indices=True)
    out = ext.max_unpool3d(y, idx, [6, 8, 10], [2, 2, 2], [1, 1, 1])
    ref = F.max_unpool3d(y.cpu(), idx.cpu(), 3, 2, 1, output_size=(6, 8, 10))
    check("max_unpool3d vs CPU", out.cpu(), ref)


def t_grid3d():
    # every mode, padding and align_corners; grids reaching outside [-1, 1]
    x = torch.randn(2, 3, 5, 6, 7, device=dev)
    g = (torch.rand(2, 4, 5, 3, 3, device=dev) * 3 - 1.5)
    for mode, mi in [("bilinear", 0), ("nearest", 1)]:
        for pad, pi in [("zeros", 0), ("border", 1), ("reflection", 2)]:
            for ac in (False, True):
                xx = x.detach().requires_grad_(True)
                gg = g.detach().requires_grad_(True)
                y = F.grid_sample(xx, gg, mode=mode, padding_mode=pad, align_corners=ac)
                go = torch.randn(y.shape, generator=torch.Generator().manual_seed(3)).to(dev)
                gi, ggr = torch.autograd.grad(y, (xx, gg), go)
                ours_gi, ours_gg = ext.grid_sampler_3d_backward(go, x, g, mi, pi, ac, [True, True])
                check("grid_sampler_3d %s %s ac%d grad_input" % (mode, pad, ac), ours_gi, gi)
                check("grid_sampler_3d %s %s ac%d grad_grid" % (mode, pad, ac), ours_gg, ggr)
    # a grid inside one voxel's neighbourhood: runs of thousands of terms (the warp-per-voxel path)
    x = torch.randn(1, 3, 4, 4, 4, device=dev)
    gc = (torch.rand(1, 16, 16, 16, 3, device=dev) * 0.1 - 0.05)
    for mode, mi in [("bilinear", 0), ("nearest", 1)]:
        xx = x.detach().requires_grad_(True)
        gg = gc.detach().requires_grad_(True)
        y = F.grid_sample(xx, gg, mode=mode, padding_mode="zeros", align_corners=False)
        go = torch.randn(y.shape, generator=torch.Generator().manual_seed(4)).to(dev)
        gi, ggr = torch.autograd.grad(y, (xx, gg), go)
        ours_gi, ours_gg = ext.grid_sampler_3d_backward(go, x, gc, mi, 0, False, [True, True])
        check("grid_sampler_3d %s concentrated grad_input (long runs)" % mode, ours_gi, gi, tol=1e-4)
        check("grid_sampler_3d %s concentrated grad_grid" % mode, ours_gg, ggr)
    _, only_grid = ext.grid_sampler_3d_backward(go, x, gc, 1, 0, False, [False, True])
    check("grid_sampler_3d no input grad", only_grid, torch.zeros_like(only_grid))


def t_paths():
    # expanded grad_output (stride 0, as from .sum()): the gathers without the prescale pass
    x = torch.randn(2, 3, 9, 10, 11, device=dev)
    y = F.avg_pool3d(x, 3, 2, 1)
    go = torch.ones(1, device=dev).expand(y.shape)
    xx = x.detach().requires_grad_(True)
    (gi,) = torch.autograd.grad(F.avg_pool3d(xx, 3, 2, 1), xx, go)
    check("avg_pool3d expanded grad_output", ext.avg_pool3d_backward(go, x, [3], [2], [1], False, True, None), gi)
    y = F.adaptive_avg_pool2d(x[:, :, 0], 4)
    go = torch.ones(1, device=dev).expand(y.shape)
    xx = x[:, :, 0].detach().contiguous().requires_grad_(True)
    (gi,) = torch.autograd.grad(F.adaptive_avg_pool2d(xx, 4), xx, go)
    check("adaptive_avg_pool2d expanded grad_output", ext.adaptive_avg_pool2d_backward(go, xx.detach()), gi)
    # upsampling from tiny inputs: the warp-per-element path
    for mode, shape, size in [("bilinear", (1, 4, 4, 4), (128, 128)), ("trilinear", (1, 2, 2, 2, 2), (24, 24, 24)),
                              ("bicubic", (1, 2, 4, 4), (96, 96))]:
        x = torch.randn(shape, device=dev)
        y, g, gi = grad_of(lambda t: F.interpolate(t, size=size, mode=mode, align_corners=False), x)
        if mode == "bilinear":
            ours = ext.upsample_bilinear2d_backward(g, list(size), list(shape), False, None, None)
        elif mode == "bicubic":
            ours = ext.upsample_bicubic2d_backward(g, list(size), list(shape), False, None, None)
        else:
            ours = ext.upsample_trilinear3d_backward(g, list(size), list(shape), False, None, None, None)
        check("%s %s -> %s (warp per element)" % (mode, shape, size), ours, gi, tol=1e-4)


def t_float_accumulation():
    # the float-accumulation copies (build17.py) agree with the double-accumulating kernels to float rounding
    x = torch.randn(2, 8, 33, 33, device=dev)
    y, g, gi = grad_of(lambda t: F.adaptive_avg_pool2d(t, 7), x)
    ours = ext.adaptive_avg_pool2d_backward(g, x)
    ext.set_float_accumulation(True)
    try:
        check("adaptive_avg_pool2d float accumulation", ext.adaptive_avg_pool2d_backward(g, x), ours)
    finally:
        ext.set_float_accumulation(False)


for n, f in [("grid3d", t_grid3d), ("paths", t_paths), ("float_accumulation", t_float_accumulation), ("adaptive", t_adaptive), ("avg3d", t_avg3d), ("pad", t_pad), ("interp", t_interp),
             ("maxpool", t_maxpool), ("unpool", t_unpool)]:
    run(n, f)
print("register errors:", ext.register_aten_cuda())
print("FAILS", fails)
sys.exit(1 if fails else 0)
