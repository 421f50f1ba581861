"""Quick correctness smoke test of issue 18's scatter_reduce / scatter(reduce=) / index_reduce
kernels (det_kernels_scatter.cuh) against the CPU of the running torch, bitwise: every mode, every
dtype torch's CUDA kernels take, include_self both ways, non-contiguous self/src/index, an index
smaller than src, int32 indices, empty and 0-d inputs; and the per-step rounding the 1.13.1 patches
use (opmath=False) against the CPU's per-step kernel (index_reduce on 1-D inputs, the same
contributions in the same order). Exit 1 on any failure."""
import sys
import traceback

import torch

from build_scatter import build

ext, secs = build()
print("built in %.1f s" % secs, flush=True)
dev = "cuda"
fails = 0
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def bits(t):
    t = t.contiguous()
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same(a, b):
    """bitwise equal, NaN equal to NaN (payloads may differ between CPU and GPU kernels)"""
    a, b = a.cpu(), b.cpu()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        na, nb = torch.isnan(a), torch.isnan(b)
        if not torch.equal(na, nb):
            return False
        return bool(torch.equal(bits(a)[~na], bits(b)[~nb]))
    return bool(torch.equal(a, b))


def check(name, ok, detail=""):
    global fails
    fails += 0 if ok else 1
    print("%-72s %s %s" % (name, "ok  " if ok else "FAIL", detail), flush=True)


def guard(name, fn):
    """one check whose reference the CPU may refuse (0-d, empty): reported, the group goes on"""
    try:
        ours, ref = fn()
    except Exception as exc:
        check(name, False, "raised: %s" % str(exc).splitlines()[0][:120])
        return
    check(name, same(ours, ref))


def values(shape, dt, seed, op):
    if dt.is_floating_point:
        x = torch.randn(shape, generator=gen(seed))
        if op == "prod":
            x = 1 + 0.05 * x
        return x.to(dt)
    lo, hi = ((1, 3) if op == "prod" else (0, 100)) if dt == torch.uint8 else ((-3, 4) if op == "prod" else (-100, 100))
    return torch.randint(lo, hi, shape, generator=gen(seed)).to(dt)


def t_scatter_reduce():
    for dt in FLOATS + INTS:
        for op in ("sum", "prod", "mean", "amax", "amin"):
            for include_self in (True, False):
                self_ = values((40, 6), dt, 1, op)
                src = values((300, 7), dt, 2, op)
                index = torch.randint(0, 40, (290, 6), generator=gen(3))  # smaller than src in both dims
                ref = self_.scatter_reduce(0, index, src, op, include_self=include_self)
                ours = ext.scatter_reduce(self_.to(dev), 0, index.to(dev), src.to(dev), op, include_self, True)
                check("scatter_reduce %s %s include_self=%s" % (dt, op, include_self), same(ours, ref))
    # dim 1, non-contiguous self (in place), src and index
    for dt in (torch.float32, torch.float16):
        for op in ("prod", "mean", "amax"):
            base = values((7, 50), dt, 4, op)
            self_ = base.t()  # (50, 7) non-contiguous
            src = values((90, 50), dt, 5, op).t()[:, ::2]  # (50, 45), strided
            index = torch.randint(0, 7, (45, 50), generator=gen(6)).t()  # (50, 45), transposed
            ref = self_.clone().scatter_reduce_(1, index, src, op)
            s = base.to(dev).t()
            ext.scatter_reduce_inplace(s, 1, index.to(dev), src.to(dev), op, True)
            check("scatter_reduce non-contiguous self/src/index %s %s" % (dt, op), same(s, ref) and
                  not s.is_contiguous())
    # 3-D, dim 1, NaN in src
    x = torch.randn(5, 9, 4, generator=gen(7))
    src = torch.randn(5, 30, 4, generator=gen(8))
    src[0, ::4, 0] = float("nan")
    index = torch.randint(0, 9, (5, 30, 4), generator=gen(9))
    for op in ("amax", "amin", "prod", "sum"):
        ref = x.scatter_reduce(1, index, src, op)
        ours = ext.scatter_reduce(x.to(dev), 1, index.to(dev), src.to(dev), op, True, True)
        check("scatter_reduce 3-D dim 1 with NaN %s" % op, same(ours, ref))
    # all into one target; empty index; 0-d
    x = torch.ones(3)
    src = 1 + 0.01 * torch.randn(100000, generator=gen(10))
    index = torch.zeros(100000, dtype=torch.long)
    check("scatter_reduce 1e5 into one target prod", same(
        ext.scatter_reduce(x.to(dev), 0, index.to(dev), src.to(dev), "prod", True, True),
        x.scatter_reduce(0, index, src, "prod")))
    e = torch.empty(0, 3, dtype=torch.long)
    guard("scatter_reduce empty index", lambda: (
        ext.scatter_reduce(torch.ones(4, 3, device=dev), 0, e.to(dev), torch.ones(0, 3, device=dev), "prod", True, True),
        torch.ones(4, 3)))
    z = torch.tensor(2.0)
    guard("scatter_reduce 0-d", lambda: (
        ext.scatter_reduce(z.to(dev), 0, torch.tensor(0, device=dev), torch.tensor(3.0, device=dev), "prod", True, True),
        z.scatter_reduce(0, torch.tensor(0), torch.tensor(3.0), "prod")))


def t_scatter_old():
    for dt in FLOATS + (torch.int32, torch.int64):
        for reduce in ("add", "multiply"):
            op = "prod" if reduce == "multiply" else "sum"
            self_ = values((30, 5), dt, 11, op)
            src = values((200, 5), dt, 12, op)
            index = torch.randint(0, 30, (200, 5), generator=gen(13))
            ref = self_.clone().scatter_(0, index, src, reduce=reduce)
            ours = ext.scatter(self_.to(dev), 0, index.to(dev), src.to(dev), reduce, True)
            check("scatter_ reduce=%s %s" % (reduce, dt), same(ours, ref))


def t_index_reduce():
    for dt in FLOATS + INTS:
        for op in ("prod", "mean", "amax", "amin"):
            for include_self in (True, False):
                for idt in (torch.int64, torch.int32):
                    self_ = values((30, 6), dt, 21, op)
                    src = values((250, 6), dt, 22, op)
                    index = torch.randint(0, 30, (250,), generator=gen(23)).to(idt)
                    ref = self_.index_reduce(0, index, src, op, include_self=include_self)
                    ours = ext.index_reduce(self_.to(dev), 0, index.to(dev), src.to(dev), op, include_self)
                    check("index_reduce %s %s include_self=%s index %s" % (dt, op, include_self, idt), same(ours, ref))
    # dim 1 of 3-D, non-contiguous self (in place) and source, 1-D, 0-d, empty
    for op in ("prod", "mean", "amax", "amin"):
        base = values((6, 20, 4), torch.float32, 24, op)
        self_ = base.transpose(0, 2)  # (4, 20, 6)
        src = values((6, 70, 4), torch.float32, 25, op).transpose(0, 2)
        index = torch.randint(0, 20, (70,), generator=gen(26))
        ref = self_.clone().index_reduce_(1, index, src, op)
        s = base.to(dev).transpose(0, 2)
        ext.index_reduce_inplace(s, 1, index.to(dev), src.to(dev), op, True)
        check("index_reduce 3-D dim 1 non-contiguous %s" % op, same(s, ref))
        x1 = values((10,), torch.float16, 27, op)
        s1 = values((3000,), torch.float16, 28, op)
        i1 = torch.randint(0, 10, (3000,), generator=gen(29))
        check("index_reduce 1-D half %s (3000 into 10)" % op, same(
            ext.index_reduce(x1.to(dev), 0, i1.to(dev), s1.to(dev), op, False),
            x1.index_reduce(0, i1, s1, op, include_self=False)))
    z = torch.tensor(2.0)
    guard("index_reduce 0-d", lambda: (
        ext.index_reduce(z.to(dev), 0, torch.tensor([0], device=dev), torch.tensor(3.0, device=dev), "prod", True),
        z.index_reduce(0, torch.tensor([0]), torch.tensor(3.0), "prod")))
    guard("index_reduce empty index", lambda: (
        ext.index_reduce(torch.ones(4, 3, device=dev), 0, torch.empty(0, dtype=torch.long, device=dev),
                         torch.ones(0, 3, device=dev), "prod", True), torch.ones(4, 3)))


def t_per_step():
    """scatter with opmath=False (the 1.13.1 patches: per-step rounding, 1.13.1's CPU) on 1-D
    inputs against the CPU's index_reduce (per step, the same contributions in the same order)"""
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        for op in ("prod", "mean", "amax", "amin"):
            for include_self in (True, False):
                x = values((50,), dt, 31, op)
                src = values((5000,), dt, 32, op)
                index = torch.randint(0, 50, (5000,), generator=gen(33))
                ref = x.index_reduce(0, index, src, op, include_self=include_self)
                ours = ext.scatter_reduce(x.to(dev), 0, index.to(dev), src.to(dev), op, include_self, False)
                check("scatter per-step %s %s include_self=%s vs CPU index_reduce" % (dt, op, include_self),
                      same(ours, ref))


def t_repeat():
    src = 1 + 0.01 * torch.randn(1 << 16, 8, generator=gen(41)).to(dev)
    index = torch.randint(0, 64, (1 << 16, 8), generator=gen(42)).to(dev)
    first = ext.scatter_reduce(torch.ones(64, 8, device=dev), 0, index, src, "prod", True, True)
    check("scatter_reduce prod 10 repeats bitwise", all(
        torch.equal(bits(first), bits(ext.scatter_reduce(torch.ones(64, 8, device=dev), 0, index, src, "prod", True, True)))
        for _ in range(10)))
    i1 = index[:, 0].contiguous()
    first = ext.index_reduce(torch.ones(64, 8, device=dev), 0, i1, src, "prod", True)
    check("index_reduce prod 10 repeats bitwise", all(
        torch.equal(bits(first), bits(ext.index_reduce(torch.ones(64, 8, device=dev), 0, i1, src, "prod", True)))
        for _ in range(10)))


for t in (t_scatter_reduce, t_scatter_old, t_index_reduce, t_per_step, t_repeat):
    try:
        t()
    except Exception:
        fails += 1
        print("%s raised:\n%s" % (t.__name__, traceback.format_exc()[-2500:]), flush=True)
print("FAILS", fails, flush=True)
sys.exit(1 if fails else 0)
