#!/usr/bin/env python3
"""Make patches/1.13.1/0232-*.patch (the antialiased bilinear/bicubic interpolation backward) from
det_kernels_aa.cuh.

The marked section upsample_aa (the code the H200 harness proved, see run_harness_aa.py) is copied
verbatim into torch 1.13.1's UpSampleBilinear2d.cu, which already carries det_common through
PT-0208 (so the patch applies only on the series before it); both antialiased backward entry points
take the deterministic path when at::globalContext().deterministicAlgorithms() is set and keep their
atomic kernel (and alert) otherwise. The patch is committed in a scratch git repository of the
pristine tree after the series' patches that precede it, exported with git format-patch, and checked
with git apply in order.

    python3 harness/deterministic_backward/make_patches_aa.py \
        --tree /tmp/detbw-aa/pytorch-1.13.1 --out patches/1.13.1

--tree is the extracted pytorch_1.13.1+dfsg.orig.tar.xz (left untouched; it is copied).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_patches_common as common  # noqa: E402
from make_patches17 import FORWARD_SCALE_LAMBDA, det_branch, upstream_alert  # noqa: E402
from make_patches_common import CUDA, replace_after, replace_once  # noqa: E402

TARGET = CUDA + "UpSampleBilinear2d.cu"
PATCH_FILE = "0232-deterministic-upsample-aa-backward.patch"
PATCH_ID = "PT-0232"
EVIDENCE = ("evidence/gpu/deterministic-issue18-upsample-aa-ops.json, -training.json, -smoke.log and "
            "determinism-all-kernels-h200.json in the patcher repository")
PROBES = "determinism.interpolate_bilinear_aa, determinism.interpolate_bicubic_aa"
UPSTREAM_TESTS = 'test_nn.py -k "upsamplingBilinear2d or upsamplingBicubic2d"'
# the first lines of the forward's kernel: the section goes right before it, inside the file's
# anonymous namespace, after PT-0208's det_common
FORWARD_KERNEL = ("// Code for upsampling with antialias\n"
                  "template <typename scalar_t, typename accscalar_t, typename InterpFilter>\n"
                  "C10_LAUNCH_BOUNDS_1(256) // 256 performs better then 1024\n"
                  "__global__ void upsample_gen2d_aa_out_frame(\n")


def branch(bicubic):
    """The deterministic path of one entry point, with the forward's scales."""
    name = "bicubic" if bicubic else "bilinear"
    body = FORWARD_SCALE_LAMBDA + [
        f"upsample_aa_backward_deterministic(grad_input, grad_output, /*bicubic=*/{'true' if bicubic else 'false'},",
        "                                   det_scale(input_size[2], output_size[0], scales_h),",
        "                                   det_scale(input_size[3], output_size[1], scales_w));",
        "return;"]
    alert = f"upsample_{name}2d_aa_backward_out_cuda"
    return alert, det_branch("  ", "globalContext().deterministicAlgorithms()", body, alert)


def transform(src):
    src = replace_once(src, "#include <cstdint>\n#include <limits>\n", "#include <cmath>\n#include <cstdint>\n#include <limits>\n")
    src = replace_once(src, FORWARD_KERNEL,
                       "// Deterministic antialiased interpolation backward (patcher, PT-0232): one\n"
                       "// writer per grad_input element, a fixed order of additions.\n" +
                       common.kernel_sections(("det_kernels_aa.cuh",), "upsample_aa") + "\n" + FORWARD_KERNEL)
    for bicubic in (False, True):
        alert, new = branch(bicubic)
        entry = f"TORCH_IMPL_FUNC(_upsample_{'bicubic' if bicubic else 'bilinear'}2d_aa_backward_out_cuda) ("
        src = replace_after(src, entry, upstream_alert(alert), new)
    return src


SUBJECT = "Deterministic CUDA backward for antialiased bilinear/bicubic interpolation"
BODY = """\
The backward of interpolate(..., antialias=True) in bilinear and bicubic
mode (upsample_gen2d_aa_backward_out_frame) adds w_x * w_y * grad_output
into every input tap of each output with atomicAdd; neighbouring outputs
share taps (a 2x downsampling spans 5x5 inputs per output), so the sums
round in a racing order and differ between runs, and under
torch.use_deterministic_algorithms(True) both raise
("upsample_bilinear2d_aa_backward_out_cuda does not have a deterministic
implementation", bicubic alike). PT-0208 left them alerting; this closes
that gap.

Under the flag, use a gather path. A small kernel (one block per axis)
evaluates every output's span and weights with the forward's arithmetic
(support = filter size / 2 * max(scale, 1), center = scale * (o + 0.5),
the triangle or a = -0.5 cubic filter, weights stored in the tensor's
dtype and normalised by their sum as the forward keeps them), and, for
every input position, the range of outputs whose span holds it: both
ends of the span are non-decreasing in o, so the range is contiguous and
found by binary search. One thread per grad_input element (walked in
memory order: contiguous and channels-last are both coalesced, no copy)
sums (w_x * w_y) * grad_output over that range, rows then columns in
ascending order, in the accumulate type (double for float), and stores
once: no atomics, no zero fill. Where each element receives hundreds of
outputs and there are few elements (antialiased upsampling from a small
input), one warp sums an element with a fixed lane assignment and
shuffle tree. As in the forward, equal input and output sizes copy. The
kernel has no shared-memory bound on the support, so downsampling
factors that torch's kernel refuses ("Too much shared memory required")
work under the flag. Without the flag the atomic kernels stay.
"""
TAIL = """\
The kernel text comes unchanged from harness/deterministic_backward
(det_kernels_aa.cuh, section upsample_aa; det_common from
det_accumulate.cuh arrives with PT-0208) in the patcher repository,
where it was built as a torch 2.11 extension and proved on an NVIDIA
H200: bitwise identical over 25 repeats in every case, error against an
fp64 reference, fp64 gradcheck, one-term cases bitwise equal to torch's
kernel (the forward's weights), time against torch's atomic kernel, and
an image classifier with antialiased resizes trained twice through the
dispatcher with the flag on, every parameter bitwise equal ({ev}).
Upstream has no alert test for these ops.
"""


def main():
    args = common.parse_args()
    message = common.commit_message(SUBJECT, BODY, TAIL.format(ev=EVIDENCE),
                                    common.trailers(PATCH_ID, "none", PROBES, UPSTREAM_TESTS))
    common.make_after_series(args.tree, args.out, [(PATCH_FILE, {TARGET: transform}, message)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
