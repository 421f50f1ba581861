#!/usr/bin/env python3
"""Make patches/1.13.1/0201-*.patch and 0202-*.patch from det_kernels.cuh.

The two marked sections of det_kernels.cuh (the code the GPU harness proved) are
copied verbatim into torch 1.13.1's AdaptiveMaxPooling2d.cu and GridSampler.cu,
the deterministic path is wired in under at::globalContext().deterministicAlgorithms(),
and each change is committed in a scratch git repository and exported with git
format-patch. The scratch repository walks the 1.13.1 series in order (walk_series):
every patch before the one being made is applied first, so patches that touch the same
file (upstream's test/test_torch.py, whose test_nondeterministic_alert_* expectations
each patch updates for its own ops) apply in series order, and the rest of the series
is applied after it to check that the whole series still applies.

    python3 harness/deterministic_backward/make_patches.py \
        --tree /tmp/detbw/pytorch-1.13.1 --out patches/1.13.1

--tree is the extracted pytorch_1.13.1+dfsg.orig.tar.xz (left untouched; it is copied).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_patches_common as common  # noqa: E402

# walk_series by name too: the README speaks of make_patches.walk_series
from make_patches_common import CUDA, ISSUES, replace_once, trailers, walk_series  # noqa: E402

AMP_FILE = CUDA + "AdaptiveMaxPooling2d.cu"
GS_FILE = CUDA + "GridSampler.cu"

AMP_MESSAGE = """\
Deterministic CUDA backward for adaptive_max_pool2d

adaptive_max_pool2d_backward_cuda routes each output gradient to its
recorded argmax with atomicAdd, one thread per output cell. Adaptive
windows overlap, so several output cells can share an argmax, and the
order in which their gradients are added to grad_input changes from run
to run: float results differ bitwise between identical runs. For that
reason the op calls alertNotDeterministic, and with
torch.use_deterministic_algorithms(True) every backward through
adaptive_max_pool2d on CUDA raises "adaptive_max_pool2d_backward_cuda does
not have a deterministic implementation".

When deterministic algorithms are requested, use an atomic-free kernel
instead. Row h of the input can only be the argmax of output rows
floor(h*OH/H) .. ceil((h+1)*OH/H)-1 (likewise for columns), so the
gradient of an input element is the sum of grad_output over the cells in
that small range whose index equals the element. grad_input is zeroed;
each output cell looks at the candidate cells of its own argmax, and the
first matching cell in (oh, ow) order sums all matching cells in that
order, in the accumulate type (float for half and bfloat16), and stores
the sum once. Every element has at most one writer and a fixed order of
additions, so the result is bitwise reproducible. The atomic kernel stays
the default when the flag is off.

The kernel was proved as a torch extension on an NVIDIA H200 (same code,
harness/deterministic_backward in the patcher repository): bitwise
identical over 25 repeats on 9 shape/dtype cases (fp16, bf16, fp32,
fp64, down- and upsampling, 3-D input), torch.autograd.gradcheck passes
in fp64, it agrees with the atomic kernel to rounding, and at
32x256x33x33 -> 7x7 it takes 0.87x the atomic kernel's time (fp32;
0.77x in fp16), the zero fill included.

Upstream's test_nondeterministic_alert_AdaptiveMaxPool2d (test/test_torch.py)
expected the alert on CUDA; it now expects none there (the CPU never
alerted).
""" + trailers("PT-0201", ISSUES + "131972", "determinism.adaptive_max_pool2d",
               'test_nn.py -k "AdaptiveMaxPool2d or adaptive_max_pool2d or\n'
               ' adaptive_pooling_max", test_torch.py -k "nondeterministic_alert_AdaptiveMaxPool2d"')

GS_MESSAGE = """\
Deterministic CUDA backward for grid_sampler_2d

grid_sampler_2d_backward_cuda computes grad_input by letting every grid
point add its bilinear (or nearest) contributions into grad_input with
atomicAdd. Grid points that sample the same input pixel race, the order of
the additions changes between runs, and float results differ bitwise. For
that reason the op calls alertNotDeterministic, and with
torch.use_deterministic_algorithms(True) the backward of grid_sample on
CUDA raises "grid_sampler_2d_backward_cuda does not have a deterministic
implementation".

When deterministic algorithms are requested and the interpolation is
bilinear or nearest, use an atomic-free path instead:

- grad_grid has no race (each grid point is owned by one thread); it is
  computed with the same arithmetic as the existing kernel.
- Every grid point emits four contribution slots (its bilinear corners;
  for nearest one slot), each a key naming the input pixel it lands on
  (or "none" when outside the input) and a channel-independent weight.
  The (key, ordinal) pairs are stable radix sorted by key, so each pixel's
  contributions form one run in ascending ordinal order. One thread per
  grad_input element then sums weight * grad_output over its pixel's run,
  front to back, in the accumulate type (float for half). The sort is done
  once for all channels.

Nearest uses nearbyint, the rounding of the forward kernel. Bicubic still
has no deterministic version and keeps raising under the flag. The atomic
kernel stays the default when the flag is off.

The kernels were proved as a torch extension on an NVIDIA H200 (same code,
harness/deterministic_backward in the patcher repository): bitwise
identical over 25 repeats on 18 cases (fp16, fp32, fp64; bilinear and
nearest; zeros, border and reflection padding; align_corners both ways;
channels-last input; grids concentrated on a few pixels),
torch.autograd.gradcheck passes in fp64 for all 12 mode combinations,
grad_grid equals the atomic kernel's bitwise in fp32/fp64, and at
8x64x128x128 with a 128x128 grid it takes 0.80x the atomic kernel's time
for bilinear fp32 (0.67x fp16, 1.67x nearest fp32).

Upstream's test_nondeterministic_alert_grid_sample_2d (test/test_torch.py,
bilinear) expected the alert on CUDA; it now expects none there.
""" + trailers("PT-0202", ISSUES + "68959", "determinism.grid_sampler_2d",
               'test_nn.py -k "(grid_sample or GridSample or grid_sampler) and not large",\n'
               ' test_torch.py -k "nondeterministic_alert_grid_sample_2d"')


def section(name):
    """A marked section of det_kernels.cuh (PT-0201, PT-0202 and, through make_patches17, PT-0222)."""
    return common.kernel_sections(("det_kernels.cuh",), name)


def patch_amp(src):
    src = replace_once(
        src,
        "#include <ATen/NumericUtils.h>\n",
        "#include <ATen/NumericUtils.h>\n#include <ATen/OpMathType.h>\n")
    src = replace_once(src, "#include <cmath>\n", "#include <cmath>\n#include <cstdint>\n#include <limits>\n")
    # kernels go at the end of the file's anonymous namespace
    src = replace_once(
        src,
        "      gpuAtomicAddNoReturn(&(gradInput[argmax]), z);\n    }\n  }\n}\n} // namespace\n",
        "      gpuAtomicAddNoReturn(&(gradInput[argmax]), z);\n    }\n  }\n}\n\n"
        + section("adaptive_max_pool2d") + "} // namespace\n")
    src = replace_once(
        src,
        "  globalContext().alertNotDeterministic(\n"
        "      \"adaptive_max_pool2d_backward_cuda\");\n",
        "  // See Note [Writing Nondeterministic Operations]\n"
        "  // The default kernel accumulates with atomicAdd. Under\n"
        "  // torch.use_deterministic_algorithms(True) an atomic-free kernel with a\n"
        "  // fixed order of additions is used instead.\n"
        "  const bool deterministic = globalContext().deterministicAlgorithms();\n")
    src = replace_once(
        src,
        "  const at::Tensor gradInput_c = gradInput.is_contiguous() ? gradInput : "
        "at::empty(gradInput.sizes(), gradInput.options());\n",
        "  const at::Tensor gradInput_c = gradInput.is_contiguous() ? gradInput : "
        "at::empty(gradInput.sizes(), gradInput.options());\n"
        "\n"
        "  if (deterministic) {\n"
        "    const int64_t ndim = input.ndimension();\n"
        "    const int64_t planes = ndim == 3 ? input.size(0) : input.size(0) * input.size(1);\n"
        "    adaptive_max_pool2d_backward_deterministic(\n"
        "        gradInput_c, gradOutput_, indices_, planes,\n"
        "        input.size(ndim - 2), input.size(ndim - 1),\n"
        "        gradOutput_.size(ndim - 2), gradOutput_.size(ndim - 1));\n"
        "    if (!gradInput.is_contiguous()) {\n"
        "      gradInput.copy_(gradInput_c);\n"
        "    }\n"
        "    return;\n"
        "  }\n")
    return src


SORT_WRAPPER = common.radix_sort_pairs_wrapper("deterministic_radix_sort_pairs", "grid_sampler_2d backward")


def patch_gs(src):
    src = replace_once(
        src,
        "#include <ATen/cuda/CUDAContext.h>\n",
        "#include <ATen/cuda/CUDAContext.h>\n#include <ATen/cuda/cub.h>\n#include <ATen/OpMathType.h>\n")
    src = replace_once(
        src,
        "#include <c10/macros/Macros.h>\n",
        "#include <c10/cuda/CUDACachingAllocator.h>\n#include <c10/macros/Macros.h>\n\n"
        "#include <algorithm>\n#include <cstdint>\n#include <limits>\n")
    src = replace_once(
        src,
        "        gGrid_ptr_NDHW[2] = static_cast<scalar_t>(0);\n      }\n    }\n  }\n}  // namespace\n",
        "        gGrid_ptr_NDHW[2] = static_cast<scalar_t>(0);\n      }\n    }\n  }\n\n"
        + SORT_WRAPPER + section("grid_sampler_2d") + "}  // namespace\n")
    src = replace_once(
        src,
        "  // See Note [Writing Nondeterministic Operations]\n"
        "  // Nondeterministic because of atomicAdd usage\n"
        "  globalContext().alertNotDeterministic(\"grid_sampler_2d_backward_cuda\");\n",
        "  // See Note [Writing Nondeterministic Operations]\n"
        "  // The default kernel accumulates grad_input with atomicAdd. Under\n"
        "  // torch.use_deterministic_algorithms(True), bilinear and nearest use an\n"
        "  // atomic-free kernel with a fixed order of additions; bicubic has none.\n"
        "  if (globalContext().deterministicAlgorithms() &&\n"
        "      static_cast<GridSamplerInterpolation>(interpolation_mode) !=\n"
        "          GridSamplerInterpolation::Bicubic) {\n"
        "    grid_sampler_2d_backward_deterministic(\n"
        "        grad_input, grad_grid, grad_output, input, grid, interpolation_mode,\n"
        "        padding_mode, align_corners, /*input_requires_grad=*/output_mask[0]);\n"
        "    return;\n"
        "  }\n"
        "  // Nondeterministic because of atomicAdd usage\n"
        "  globalContext().alertNotDeterministic(\"grid_sampler_2d_backward_cuda\");\n")
    return src


TEST_TORCH = "test/test_torch.py"


def _alert_test_span(src, test):
    """[start, end) of upstream's test_nondeterministic_alert_<test> method in test_torch.py."""
    head = f"    def test_nondeterministic_alert_{test}(self, device"
    if src.count(head) != 1:
        raise SystemExit(f"{TEST_TORCH}: expected one test_nondeterministic_alert_{test}")
    start = src.index(head)
    end = src.index("\n    def ", start + len(head))
    return start, end


def expect_no_cuda_alert(src, test, patch_id):
    """Upstream's alert test of an op that `patch_id` makes deterministic on CUDA: it expected
    the alert where the device is CUDA (and none on the CPU); now none anywhere."""
    start, end = _alert_test_span(src, test)
    body = src[start:end]
    old = "            torch.device(device).type == 'cuda')\n"
    if body.count(old) != 1:
        raise SystemExit(f"{TEST_TORCH}: test_nondeterministic_alert_{test} has no CUDA-only expectation")
    body = body.replace(old, f"            False)  # {patch_id}: deterministic on CUDA too\n")
    return src[:start] + body + src[end:]


def expect_cpu_alert_only(src, test, caller, patch_id):
    """An alert test that expected the alert on every device (max_unpool: the CPU kernel races
    too): with `patch_id` CUDA no longer alerts, the CPU still does."""
    start, end = _alert_test_span(src, test)
    body = src[start:end]
    old = f"            '{caller}')\n"
    if body.count(old) != 1:
        raise SystemExit(f"{TEST_TORCH}: test_nondeterministic_alert_{test} does not end with {caller!r}")
    body = body.replace(old, f"            '{caller}',\n"
                             f"            torch.device(device).type != 'cuda')  # {patch_id}: CUDA deterministic\n")
    return src[:start] + body + src[end:]


SPECS = {
    "0201-deterministic-adaptive-max-pool2d-backward.patch": (
        {AMP_FILE: patch_amp,
         TEST_TORCH: lambda src: expect_no_cuda_alert(src, "AdaptiveMaxPool2d", "PT-0201")}, AMP_MESSAGE),
    "0202-deterministic-grid-sampler-2d-backward.patch": (
        {GS_FILE: patch_gs,
         TEST_TORCH: lambda src: expect_no_cuda_alert(src, "grid_sample_2d", "PT-0202")}, GS_MESSAGE),
}


def main():
    args = common.parse_args()
    walk_series(args.tree, args.out, SPECS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
