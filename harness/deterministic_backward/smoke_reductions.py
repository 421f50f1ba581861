"""Quick correctness smoke test of issue 18's histogram, order-statistic and scan kernels
against torch's own CUDA kernels and the CPU (small sizes). Exits 1 on the first wrong result
group, so a longer run after it is not wasted."""
import sys
import traceback

import torch

from build_reductions import build

ext, secs = build()
print("built in %.1f s" % secs, flush=True)
dev = "cuda"
fails = 0


def gen(seed):
    return torch.Generator().manual_seed(seed)


def check(name, ok, detail=""):
    global fails
    fails += 0 if ok else 1
    print("%-58s %s %s" % (name, "ok  " if ok else "FAIL", detail), flush=True)


def stable_rank_index(x, k, dim):
    """The (value, index) rule on the CPU: stable ascending sort, NaN last, -0 == +0."""
    xc = x.detach().cpu().double()
    xc = torch.where(xc == 0, torch.zeros_like(xc), xc)
    _, order = torch.sort(xc, dim=dim, stable=True)
    return order.narrow(dim, k - 1, 1).squeeze(dim)


def hist_close(a, b):
    """same dtype and total, at most a few values in a neighbouring bin (torch's build may round
    the bin arithmetic differently at a bin edge)"""
    return a.dtype == b.dtype and a.sum().item() == b.sum().item() and (a.double() - b.double()).abs().sum().item() <= 4


def t_histc():
    for dt in (torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8):
        if dt.is_floating_point:
            x = torch.randn(100003, generator=gen(1)).to(dev, dt)
            args = (37, -2.5, 2.5)
        else:
            x = torch.randint(0, 200, (100003,), generator=gen(1)).to(dev, dt)
            args = (50, 10, 150)
        ours = ext.histc(x, *args)
        try:
            ref = torch.histc(x, *args)
        except RuntimeError as exc:  # torch 2.11 may refuse a dtype 1.13.1 takes: compare with the CPU then
            print("  torch's CUDA histc refuses %s (%s); against the CPU" % (dt, str(exc).splitlines()[0][:80]))
            ref = torch.histc(x.cpu().double(), *args).to(dev, dt)
        moved = (ours.double() - ref.double()).abs().sum().item()  # values torch's build puts in a neighbour bin
        check("histc %s" % dt, ours.dtype == ref.dtype and ours.sum().item() == ref.sum().item() and moved <= 4,
              "sum %s, differing counts %s" % (ours.sum().item(), moved))
    x = torch.randn(5000, generator=gen(2)).to(dev)
    check("histc min==max (data range)", hist_close(ext.histc(x, 10, 0.0, 0.0), torch.histc(x, 10, 0, 0)))
    z = torch.zeros(70000, device=dev)
    check("histc all in one bin", torch.equal(ext.histc(z, 100, -1.0, 1.0), torch.histc(z, 100, -1, 1)))
    x = torch.randn(200000, generator=gen(3)).to(dev)
    check("histc 5000 bins (global path)", hist_close(ext.histc(x, 5000, -3.0, 3.0), torch.histc(x, 5000, -3, 3)))


def t_bincount():
    for dt in (torch.int64, torch.int32, torch.uint8):
        v = torch.randint(0, 100, (123457,), generator=gen(4)).to(dev, dt)
        check("bincount unweighted %s" % dt, torch.equal(ext.bincount(v, None, 0), torch.bincount(v)))
    v = torch.randint(0, 100, (123457,), generator=gen(5)).to(dev)
    for wdt in (torch.float32, torch.float64):
        w = torch.rand(123457, generator=gen(6)).to(dev, wdt)
        ours = ext.bincount(v, w, 120)
        ref = torch.bincount(v.cpu(), w.double().cpu(), 120)
        err = (ours.double().cpu() - ref).abs().max().item()
        same_dtype = ours.dtype == torch.bincount(v, w, 120).dtype
        check("bincount weighted %s" % wdt, (same_dtype or wdt == torch.float16) and err < 1e-2 and ours.shape == ref.shape,
              "err %.3g dtype %s (torch's %s)" % (err, ours.dtype, torch.bincount(v, w, 120).dtype))
    w = torch.rand(123457, generator=gen(7)).to(dev)
    w[5] = float("inf")
    ours = ext.bincount(v, w, 0)
    ref = torch.bincount(v, w)
    check("bincount weighted with inf", bool(torch.isinf(ours[v[5].item()])) and
          torch.allclose(ours[torch.isfinite(ours)], ref[torch.isfinite(ref)]))
    z = torch.zeros(100000, dtype=torch.long, device=dev)
    w = torch.rand(100000, generator=gen(8)).to(dev)
    ours = ext.bincount(z, w, 3)
    check("bincount weighted all in one bin", abs(ours[0].item() - w.double().sum().item()) <= 1e-6 * w.double().sum().item()
          and ours[1:].abs().sum() == 0)
    check("bincount empty", torch.equal(ext.bincount(torch.zeros(0, dtype=torch.long, device=dev), None, 5),
                                        torch.zeros(5, dtype=torch.long, device=dev)))


def t_select():
    cases = [((64, 1000), -1), ((300, 77), 0), ((5, 6, 7), 1), ((33,), 0), ((4, 1), 1), ((2, 3000), 1)]
    for shape, dim in cases:
        for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int8, torch.uint8):
            if dt.is_floating_point:
                x = torch.randint(-3, 4, shape, generator=gen(9)).to(dt) * 0.5  # many ties, +-0
                x = torch.where(torch.rand(shape, generator=gen(10)) < 0.5, x, -x)
            else:
                x = torch.randint(0 if dt == torch.uint8 else -5, 6, shape, generator=gen(9)).to(dt)
            xd = x.to(dev)
            n = shape[dim]
            k = max(1, n // 3)
            v, i = ext.kthvalue(xd, k, dim, False)
            tv, _ = torch.kthvalue(xd, k, dim)
            want = stable_rank_index(x.double(), k, dim)
            ok = torch.equal(v.cpu(), tv.cpu()) and torch.equal(i.cpu(), want)
            ok = ok and torch.equal(torch.gather(xd, dim, i.unsqueeze(dim)).squeeze(dim), v)
            mv, mi = ext.median(xd, dim, True)
            cv, ci = torch.median(x.float() if dt in (torch.float16, torch.bfloat16) else x, dim, True)
            cv = cv.to(dt)
            ok2 = torch.equal(mv.cpu(), cv) and torch.equal(mi.cpu(), ci)
            if not (ok and ok2):
                check("kthvalue/median %s dim %d %s" % (shape, dim, dt), False,
                      "kth %s median %s" % (ok, ok2))
                return
        check("kthvalue/median ties %s dim %d (8 dtypes)" % (shape, dim), True)
    # NaNs: median returns the first NaN; nanmedian ignores them
    x = torch.randn(50, 101, generator=gen(11))
    x[3, 7] = float("nan")
    x[3, 50] = float("nan")
    x[9, :] = float("nan")
    x[10, ::2] = float("nan")
    mv, mi = ext.median(x.to(dev), 1, False)
    cv, ci = torch.median(x, 1)
    check("median with NaN = CPU (first NaN)", torch.equal(mi.cpu(), ci) and torch.equal(mv.cpu().isnan(), cv.isnan()))
    nv, ni = ext.nanmedian(x.to(dev), 1, False)
    cnv, cni = torch.nanmedian(x, 1)
    rows = [r for r in range(50) if r != 9]  # an all-NaN row: the CPU's nth_element decides
    check("nanmedian = CPU", torch.equal(ni.cpu()[rows], cni[rows]) and torch.equal(nv.cpu()[rows], cnv[rows]),
          "all-NaN row: ours %d cpu %d" % (ni[9].item(), cni[9].item()))
    x = torch.randn(2 ** 20 + 3, generator=gen(12))
    mv, mi = ext.median(x.to(dev), 0, False)
    cv, ci = torch.median(x, 0)
    check("median one long slice", mi.item() == ci.item() and mv.item() == cv.item())
    s = torch.tensor(2.5, device=dev)
    check("median 0-dim", ext.median(s, 0, False)[1].item() == 0)


def t_cumsum():
    for shape, dim, dt in [((100003,), 0, torch.float32), ((5000,), 0, torch.float64), ((64, 9000), 1, torch.float32),
                           ((37, 51), 0, torch.float32), ((7, 300, 5), 1, torch.float64), ((1000, 333), 1, torch.float16),
                           ((1000, 333), 1, torch.bfloat16), ((50001,), 0, torch.complex64), ((30, 4097), 1, torch.complex128),
                           ((30, 41, 3), 1, torch.complex64), ((1000,), 0, torch.int32)]:
        x = (torch.randn(shape, generator=gen(13)) if not dt.is_complex else
             torch.randn(shape, dtype=torch.complex128, generator=gen(13)))
        if not dt.is_floating_point and not dt.is_complex:
            x = torch.randint(-100, 100, shape, generator=gen(13))
        x = x.to(dt)
        ours = ext.cumsum(x.to(dev), dim)
        ref = torch.cumsum(x.to(torch.complex128 if dt.is_complex else (torch.float64 if dt.is_floating_point else torch.int64)), dim)
        err = (ours.cpu().to(ref.dtype) - ref).abs().max().item()
        tol = {torch.float16: 2.0, torch.bfloat16: 16.0}.get(dt, 1e-3)
        want_dtype = torch.cumsum(x.to(dev), dim).dtype
        check("cumsum %s dim %d %s" % (shape, dim, dt), err <= tol and ours.dtype == want_dtype, "err %.3g" % err)


for name, fn in [("histc", t_histc), ("bincount", t_bincount), ("select", t_select), ("cumsum", t_cumsum)]:
    try:
        fn()
    except Exception:
        fails += 1
        print(name, "EXCEPTION")
        traceback.print_exc()
    torch.cuda.synchronize()

print("FAILS", fails, flush=True)
sys.exit(1 if fails else 0)
