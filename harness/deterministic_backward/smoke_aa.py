"""Quick correctness smoke test of the antialiased bilinear/bicubic interpolation backward
(det_kernels_aa.cuh, PT-0232) on the GPU.

Per filter, dtype (fp32, fp64, fp16, bf16) and shape (down- and upsampling, non-divisible, one axis
down and one up, equal sizes (torch copies), align_corners=True, explicit scales, a downsampling
factor of 256 that torch's kernel refuses for want of shared memory): ours against torch's CPU
kernel on the fp64 values (tolerance by dtype), against torch's CUDA kernel, three
repeats bitwise, and channels-last grad_output bitwise equal to the contiguous one. The weights:
with one non-zero grad_output element per plane every grad_input element receives one non-zero
term, so ours and torch's CUDA kernel differ only by their weights (within 8 ulp of the plane's
largest value: nvcc contracts multiply-adds differently in each compilation). Then, registered for the CUDA key: fp64 gradcheck
of F.interpolate(antialias=True) (down, up, channels-last), the out= variant, and the flagged call
that raised before. Exit 1 on any failure."""
import sys

import torch
import torch.nn.functional as F
from build_aa import build

ext, secs = build()
print("built in %.1f s" % secs, flush=True)
DEV = "cuda"
A = torch.ops.aten
fails = 0
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 4e-2}
TORCH_OPS = {"bilinear": A._upsample_bilinear2d_aa_backward, "bicubic": A._upsample_bicubic2d_aa_backward}
OURS = {"bilinear": ext.bilinear2d_aa_backward, "bicubic": ext.bicubic2d_aa_backward}
# (name, input size, output size, align_corners, scales)
SHAPES = [
    ("down 32x32->15x15", (2, 3, 32, 32), (15, 15), False, (None, None)),
    ("up 16x16->40x24", (2, 3, 16, 16), (40, 24), False, (None, None)),
    ("mixed 37x29->12x50", (2, 3, 37, 29), (12, 50), False, (None, None)),
    ("same size 20x20 (copy)", (1, 2, 20, 20), (20, 20), False, (None, None)),
    ("align_corners 24x24->8x8", (1, 2, 24, 24), (8, 8), True, (None, None)),
    ("scales 0.4 30x30->12x12", (2, 3, 30, 30), (12, 12), False, (0.4, 0.4)),
    ("factor 256 1024x1024->4x4", (1, 1, 1024, 1024), (4, 4), False, (None, None)),
]


def gen(seed):
    return torch.Generator().manual_seed(seed)


def bits(t):
    t = t.contiguous()
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def beq(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(bits(a), bits(b)))


def check(name, ok, detail=""):
    global fails
    fails += 0 if ok else 1
    print("%-86s %s %s" % (name, "ok  " if ok else "FAIL", detail), flush=True)


def rel_err(x, ref):
    return float((x.double().cpu() - ref).abs().max() / max(1.0, float(ref.abs().max())))


for mode in ("bilinear", "bicubic"):
    for name, in_size, out_size, ac, (sh, sw) in SHAPES:
        g64 = torch.randn(in_size[:2] + out_size, generator=gen(7), dtype=torch.float64)
        args = (list(out_size), list(in_size), ac, sh, sw)
        ref = TORCH_OPS[mode](g64, *args)  # torch's CPU kernel, fp64
        for dt in DTYPES:
            tag = "%s %s %s" % (mode, name, str(dt).replace("torch.", ""))
            g = g64.to(dt).to(DEV)
            try:
                ours = OURS[mode](g, *args)
                err = rel_err(ours, ref)
                check(tag + " vs CPU fp64", err <= TOL[dt], "rel err %.3g" % err)
                if dt == torch.float64:  # shown, not checked: the CPU kernel rounds the center apart
                    print("  fp64 bitwise equal to torch's CPU kernel: %s" % beq(ours.cpu(), ref), flush=True)
                again = [OURS[mode](g, *args) for _ in range(3)]
                check(tag + " 3 repeats bitwise", all(beq(a, ours) for a in again))
                cl = OURS[mode](g.contiguous(memory_format=torch.channels_last), *args)
                check(tag + " channels-last bitwise = contiguous",
                      cl.is_contiguous(memory_format=torch.channels_last) and beq(cl.contiguous(), ours))
            except Exception as exc:
                check(tag, False, "raised: %s" % str(exc).splitlines()[0][:150])
                continue
            try:
                theirs = TORCH_OPS[mode](g, *args)
            except RuntimeError as exc:  # the shared-memory bound of torch's kernel
                print("  torch's CUDA kernel raised: %s" % str(exc).splitlines()[0][:150], flush=True)
                continue
            err = rel_err(ours, theirs.double().cpu())
            check(tag + " vs torch CUDA", err <= 2 * TOL[dt], "rel err %.3g" % err)
        # the weights: with one non-zero output per plane each grad_input element receives one
        # non-zero term, (w_x * w_y) * g, so ours and torch's CUDA kernel differ only by their
        # weights; nvcc contracts multiply-adds differently in each compilation (the forward's own
        # kernel is a third), which near the filters' zero crossings changes small weights by many
        # of their own ulp: allowed are 8 ulp of the plane's largest value, the bitwise share is shown
        for dt in (torch.float32, torch.float64):
            sparse = torch.zeros(in_size[:2] + out_size, dtype=dt)
            flat = sparse.view(in_size[0] * in_size[1], -1)
            pick = torch.randint(0, flat.shape[1], (flat.shape[0],), generator=gen(3))
            flat[torch.arange(flat.shape[0]), pick] = torch.randn(flat.shape[0], generator=gen(4), dtype=dt)
            sparse = sparse.to(DEV)
            try:
                theirs = TORCH_OPS[mode](sparse, *args)
            except RuntimeError:
                continue
            ours = OURS[mode](sparse, *args)
            scale = torch.finfo(dt).eps * theirs.abs().amax(dim=(2, 3), keepdim=True).clamp_min(torch.finfo(dt).tiny)
            worst = float(((ours - theirs).abs() / scale).max())
            nonzero = theirs != 0
            check("%s %s %s one term per element: torch's CUDA within 8 ulp of the plane's max" % (
                      mode, name, str(dt)[6:]),
                  worst <= 8, "max %.2f, %d of %d non-zero elements bitwise equal" % (
                      worst, int((ours[nonzero] == theirs[nonzero]).sum()), int(nonzero.sum())))

errors = ext.register_aten_cuda()
check("register_aten_cuda", errors == [], str(errors))
for mode in ("bilinear", "bicubic"):
    for in_hw, out_hw, fmt in (((12, 9), (5, 7), torch.contiguous_format), ((4, 5), (9, 11), torch.contiguous_format),
                               ((12, 9), (5, 7), torch.channels_last)):
        x = torch.randn((1, 2) + in_hw, generator=gen(5), dtype=torch.float64).to(DEV)
        x = x.contiguous(memory_format=fmt).requires_grad_()
        torch.use_deterministic_algorithms(True)
        try:
            ok = torch.autograd.gradcheck(
                lambda t, size=out_hw, mode=mode: F.interpolate(t, size=size, mode=mode, align_corners=False,
                                                             antialias=True), (x,))
        except Exception as exc:
            ok = False
            print("  gradcheck raised: %s" % str(exc).splitlines()[0][:200], flush=True)
        finally:
            torch.use_deterministic_algorithms(False)
        check("%s gradcheck fp64 %s -> %s %s (registered, flag on)" % (mode, in_hw, out_hw, str(fmt)[6:]), ok)
    # the flagged autograd call: channels-last input keeps its format, equals the direct call
    x = torch.randn(4, 8, 64, 64, generator=gen(6)).to(DEV).contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    g = torch.randn(4, 8, 24, 24, generator=gen(8)).to(DEV).contiguous(memory_format=torch.channels_last)
    torch.use_deterministic_algorithms(True)
    try:
        F.interpolate(x, size=(24, 24), mode=mode, antialias=True).backward(g)
        direct = OURS[mode](g, [24, 24], [4, 8, 64, 64], False, None, None)
        check("%s flagged autograd call, channels-last: runs, keeps the format, = direct call" % mode,
              x.grad.is_contiguous(memory_format=torch.channels_last) and beq(x.grad, direct))
        out = torch.empty(4, 8, 64, 64, device=DEV)
        TORCH_OPS[mode].grad_input(g, [24, 24], [4, 8, 64, 64], False, None, None, grad_input=out)
        check("%s out= variant (registered) = direct call" % mode, beq(out.contiguous(), direct.contiguous()))
    except Exception as exc:
        check("%s flagged autograd call" % mode, False, "raised: %s" % str(exc).splitlines()[0][:150])
    finally:
        torch.use_deterministic_algorithms(False)

print("FAILS", fails, flush=True)
sys.exit(1 if fails else 0)
