"""Quick correctness smoke test of issue 18's first-half kernels against torch's own (small
sizes). Exits 1 at the end if any check failed, so a wrong result stops the device run early."""
import sys
import traceback

import torch

from build_losses import build

ext, secs = build()
print("built in %.1f s" % secs, flush=True)
torch.manual_seed(0)
dev = "cuda"
A = torch.ops.aten
fails = 0


def check(name, ours, ref, tol=1e-5, exact=False):
    global fails
    ours, ref = ours.detach(), ref.detach()
    if ours.is_floating_point():
        o, r = ours.double().cpu(), ref.double().cpu()
        diff = torch.where(o == r, torch.zeros_like(o), o - r) if o.shape == r.shape else o.new_full((1,), float("inf"))
        err = diff.abs().max().item() if ours.numel() else 0.0
        scale = r[torch.isfinite(r)].abs().max().item() if torch.isfinite(r).any() else 0.0
        ok = ours.shape == ref.shape and (err == 0.0 if exact else err <= tol * max(scale, 1.0))
        if torch.isnan(ref).any() or torch.isnan(ours).any():
            ok = ok or torch.equal(torch.isnan(ours.cpu()), torch.isnan(ref.cpu()))
    else:
        err, scale = float(not torch.equal(ours.cpu(), ref.cpu())), 0.0
        ok = err == 0.0
    fails += 0 if ok else 1
    print("%-60s %s err=%.3g scale=%.3g" % (name, "ok  " if ok else "FAIL", err, scale), flush=True)


def run(name, f):
    global fails
    try:
        f()
    except Exception:
        fails += 1
        print(name, "EXCEPTION", flush=True)
        traceback.print_exc()


def t_nll():
    for shape, red, w, ign in [((4, 5, 7, 9), 1, True, -100), ((4, 5, 7, 9), 2, True, 2), ((2, 3, 1, 1), 1, False, -100),
                               ((3, 21, 64, 65), 1, True, 0)]:
        x = torch.randn(shape, device=dev).log_softmax(1)
        t = torch.randint(0, shape[1], (shape[0],) + shape[2:], device=dev)
        wt = torch.rand(shape[1], device=dev) if w else None
        o, tw = ext.nll_loss2d_forward(x, t, wt, red, ign)
        ro, rtw = A.nll_loss2d_forward(x, t, wt, red, ign)
        check("nll_loss2d %s red%d w%d ign%d" % (shape, red, w, ign), o, ro)
        check("nll_loss2d total_weight", tw, rtw)
    for shape, red in [((64, 10), 1), ((64, 10), 2), ((10,), 1), ((5000, 33), 1), ((64, 10), 0)]:
        x = torch.randn(shape, device=dev).log_softmax(-1)
        t = torch.randint(0, shape[-1], shape[:-1], device=dev)
        wt = torch.rand(shape[-1], device=dev)
        o, tw = ext.nll_loss_forward(x, t, wt, red, 3)
        ro, rtw = A.nll_loss_forward(x, t, wt, red, 3)
        check("nll_loss %s red%d" % (shape, red), o, ro)
    x = torch.randn(16, 4, 5, 5, device=dev, dtype=torch.half).log_softmax(1)
    t = torch.full((16, 5, 5), 2, device=dev)
    check("nll_loss2d half one class", ext.nll_loss2d_forward(x, t, None, 1, -100)[0],
          A.nll_loss2d_forward(x.float(), t, None, 1, -100)[0], tol=2e-3)
    t = torch.full((16, 5, 5), -100, device=dev)
    check("nll_loss2d all ignored (NaN)", ext.nll_loss2d_forward(x.float(), t, None, 1, -100)[0],
          A.nll_loss2d_forward(x.float(), t, None, 1, -100)[0])


def ctc_inputs(T, B, C, L, same=False, zero_inf=False, flat=False, dtype=torch.float):
    lp = torch.randn(T, B, C, device=dev, dtype=dtype).log_softmax(2)
    tl = torch.randint(max(1, L // 2), L + 1, (B,)).tolist()
    il = torch.randint(max(1, T - 10), T + 1, (B,)).tolist()
    il[0] = T
    tg = torch.full((B, L), 3, device=dev) if same else torch.randint(1, C, (B, L), device=dev)
    if flat:
        tg = torch.cat([tg[b, :tl[b]] for b in range(B)])
    nll, la = A._ctc_loss(lp, tg, il, tl, 0, zero_inf)
    g = torch.rand(B, device=dev, dtype=dtype)
    return lp, tg, il, tl, nll, la, g


def t_ctc():
    for args, kw in [((50, 4, 20, 10), {}), ((200, 16, 30, 40), {}), ((100, 8, 10, 30), {"same": True}),
                     ((60, 4, 12, 20), {"flat": True}), ((40, 6, 8, 35), {"zero_inf": True}),
                     ((30, 3, 6, 8), {"dtype": torch.double})]:
        lp, tg, il, tl, nll, la, g = ctc_inputs(*args, **kw)
        zi = kw.get("zero_inf", False)
        ours = ext.ctc_loss_backward(g, lp, tg, il, tl, nll, la, 0, zi)
        ref = A._ctc_loss_backward(g, lp, tg, il, tl, nll, la, 0, zi)
        # fp32 over up to 200 steps: log_beta here comes from the reversed forward recursion, torch's
        # from its own beta kernel; both round in log space (the harness measures both against fp64)
        tol = 1e-3 if lp.dtype == torch.float else 1e-9
        check("ctc_loss backward %s %s" % (args, kw), ours, ref, tol=tol)
        beta = ext.ctc_log_beta(lp, tg, il, tl, la, 0)
        atom = ext.ctc_loss_backward_given_beta(g, lp, tg, il, tl, nll, la, 0, zi, beta, True)
        check("ctc_loss backward atomic baseline %s" % (args,), atom, ref, tol=tol)


def t_embedding_bag():
    for nw, D, bags, size, dt in [(50, 8, 16, 5, torch.float), (1000, 64, 256, 20, torch.float),
                                  (30, 16, 64, 4, torch.half), (20, 5, 10, 3, torch.double)]:
        w = torch.randn(nw, D, device=dev, dtype=dt)
        idx = torch.randint(0, nw, (bags * size,), device=dev)
        off = torch.arange(0, bags * size, size, device=dev)
        out, o2b, bsz, mx = A._embedding_bag(w, idx, off, False, 2, False, None, False, -1)
        g = torch.randn(out.shape, device=dev, dtype=dt)
        ours = ext.embedding_bag_dense_backward(g, idx, o2b, bsz, mx, nw, False, 2, None, -1)
        ref = A._embedding_bag_dense_backward(g, idx, o2b, bsz, mx, nw, False, 2, None, -1)
        check("embedding_bag max %dx%d bags %d %s" % (nw, D, bags, dt), ours, ref, tol=2e-3 if dt == torch.half else 1e-5)
    # one row is every bag's max; padding_idx skipped
    w = torch.randn(100, 32, device=dev)
    w[7] += 100
    idx = torch.randint(0, 100, (512, 6), device=dev)
    idx[:, 0] = 7
    idx = idx.reshape(-1)
    off = torch.arange(0, 512 * 6, 6, device=dev)
    for pad in (-1, 7):
        out, o2b, bsz, mx = A._embedding_bag(w, idx, off, False, 2, False, None, False, pad)
        g = torch.randn(out.shape, device=dev)
        check("embedding_bag max contention pad%d" % pad,
              ext.embedding_bag_dense_backward(g, idx, o2b, bsz, mx, 100, False, 2, None, pad),
              A._embedding_bag_dense_backward(g, idx, o2b, bsz, mx, 100, False, 2, None, pad), tol=1e-5)
    for mode in (0, 1):
        out, o2b, bsz, mx = A._embedding_bag(w, idx, off, False, mode, False, None, False, -1)
        g = torch.randn(out.shape, device=dev)
        check("embedding_bag mode %d (fallback)" % mode,
              ext.embedding_bag_dense_backward(g, idx, o2b, bsz, mx, 100, False, mode, None, -1),
              A._embedding_bag_dense_backward(g, idx, o2b, bsz, mx, 100, False, mode, None, -1), tol=1e-5)


def t_put():
    torch.set_num_threads(1)  # the CPU rule without accumulate: one thread, the last index wins
    for n_self, n_idx, dt in [(100, 40, torch.float), (1000, 5000, torch.float), (64, 1000, torch.half),
                              (50, 300, torch.double), (77, 200, torch.int64), (33, 90, torch.bool)]:
        base = (torch.randn(n_self) * 3).to(dt).to(dev)
        idx = torch.randint(-n_self, n_self, (n_idx,), device=dev)
        src = (torch.randn(n_idx) * 3).to(dt).to(dev)
        for acc in (False, True):
            if acc and dt == torch.bool:
                continue
            ours = ext.put_(base.clone(), idx, src, acc)
            cpu = base.cpu().put_(idx.cpu(), src.cpu(), acc)
            exact = not acc or not dt.is_floating_point
            tol = 2e-3 if dt == torch.half else 1e-5
            if acc and dt.is_floating_point:  # against the fp64 sum
                cpu = base.cpu().double().put_(idx.cpu(), src.cpu().double(), True)
                tol = 1e-2 if dt == torch.half else 1e-5
            check("put_ %d<-%d %s acc%d vs CPU" % (n_self, n_idx, dt, acc), ours, cpu, tol=tol, exact=exact)
    base = torch.randn(10, 20, device=dev).t()  # non-contiguous self
    idx = torch.randint(0, 200, (500,), device=dev)
    src = torch.randn(500, device=dev)
    check("put_ non-contiguous self", ext.put_(base.clone(), idx, src, False),
          base.cpu().put_(idx.cpu(), src.cpu(), False), exact=True)
    idx = torch.full((100000,), 3, device=dev)
    src = torch.randn(100000, device=dev)
    check("put_ all indices equal acc", ext.put_(torch.zeros(10, device=dev), idx, src, True),
          torch.zeros(10, dtype=torch.double).put_(idx.cpu(), src.cpu().double(), True), tol=1e-6)
    check("put_ all indices equal no-acc", ext.put_(torch.zeros(10, device=dev), idx, src, False),
          torch.zeros(10).put_(idx.cpu(), src.cpu(), False), exact=True)
    s = torch.randn(64, device=dev)
    s[3] = float("inf")
    idx = torch.randint(0, 8, (64,), device=dev)
    check("put_ acc with inf", ext.put_(torch.zeros(8, device=dev), idx, s, True),
          torch.zeros(8, dtype=torch.double).put_(idx.cpu(), s.cpu().double(), True), tol=1e-5)


for name, f in [("nll", t_nll), ("ctc", t_ctc), ("embedding_bag", t_embedding_bag), ("put", t_put)]:
    run(name, f)
torch.cuda.synchronize()
print("FAILS", fails, flush=True)
sys.exit(1 if fails else 0)
