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
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
AUTHOR_NAME = "patcher maintainers"
AUTHOR_EMAIL = "maintainers@patcher.invalid"
DATE = "2026-11-30T00:00:00+00:00"

AMP_FILE = "aten/src/ATen/native/cuda/AdaptiveMaxPooling2d.cu"
GS_FILE = "aten/src/ATen/native/cuda/GridSampler.cu"

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

Patch-Id: PT-0201
Applies-To: ==1.13.1
Category: determinism
Upstream-Bug: https://github.com/pytorch/pytorch/issues/131972
Upstream-Fix: none
Probe: determinism.adaptive_max_pool2d
Upstream-Tests: test_nn.py -k "AdaptiveMaxPool2d or adaptive_max_pool2d or
 adaptive_pooling_max", test_torch.py -k "nondeterministic_alert_AdaptiveMaxPool2d"
"""

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

Patch-Id: PT-0202
Applies-To: ==1.13.1
Category: determinism
Upstream-Bug: https://github.com/pytorch/pytorch/issues/68959
Upstream-Fix: none
Probe: determinism.grid_sampler_2d
Upstream-Tests: test_nn.py -k "(grid_sample or GridSample or grid_sampler) and not large",
 test_torch.py -k "nondeterministic_alert_grid_sample_2d"
"""


def section(name):
    text = open(os.path.join(HERE, "det_kernels.cuh")).read()
    begin = f"// BEGIN {name}\n"
    end = f"// END {name}\n"
    a = text.index(begin) + len(begin)
    b = text.index(end)
    return text[a:b]


def replace_once(text, old, new):
    if text.count(old) != 1:
        raise SystemExit(f"expected exactly one occurrence of:\n{old}")
    return text.replace(old, new)


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


SORT_WRAPPER = """\
// Stable (key, value) radix sort over key bits [0, end_bit), on the current
// stream; used by the deterministic grid_sampler_2d backward below.
static void deterministic_radix_sort_pairs(
    const int64_t* keys_in, int64_t* keys_out,
    const int64_t* values_in, int64_t* values_out,
    int64_t n, int end_bit) {
  at::cuda::cub::radix_sort_pairs<int64_t, int64_t>(
      keys_in, keys_out, values_in, values_out, n,
      /*descending=*/false, /*begin_bit=*/0, /*end_bit=*/end_bit);
}

"""


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


def read_series(out_dir):
    with open(os.path.join(out_dir, "series")) as f:
        return [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]


def walk_series(tree, out_dir, specs):
    """Regenerate the patches of `specs` (file name -> (transforms by path, commit message))
    in series order on a scratch copy of `tree`: each one on top of every series patch before
    it; the others of the series are applied as they are, so a patch that no longer applies
    in order stops the run."""
    names = read_series(out_dir)
    missing = [n for n in specs if n not in names]
    if missing:
        raise SystemExit(f"not in {out_dir}/series: {', '.join(missing)} (append them first)")
    with tempfile.TemporaryDirectory(prefix="detbw-series-", dir="/tmp") as scratch:
        repo = os.path.join(scratch, "repo")
        shutil.copytree(tree, repo, symlinks=True)
        git(repo, "init", "-q")
        git(repo, "add", "--force", "-A")
        git(repo, "commit", "-q", "--no-verify", "-m", "pristine 1.13.1")
        for name in names:
            path = os.path.join(out_dir, name)
            if name in specs:
                transforms, message = specs[name]
                for rel, transform in transforms.items():
                    target = os.path.join(repo, rel)
                    with open(target) as f:
                        src = f.read()
                    with open(target, "w") as f:
                        f.write(transform(src))
                    git(repo, "add", "--force", rel)
                msg_file = os.path.join(scratch, "msg")
                with open(msg_file, "w") as f:
                    f.write(message)
                git(repo, "commit", "-q", "--no-verify", "--cleanup=verbatim", "-F", msg_file)
                patch = git(repo, "format-patch", "-1", "--stdout", "--zero-commit", "--no-signature",
                            "--full-index", "HEAD")
                with open(path, "wb") as f:
                    f.write(patch)
                print("wrote", path)
            else:
                if not os.path.exists(path):
                    # a patch appended to the series but not written yet (its generator runs next)
                    print(f"stopped before {name}: not written yet; the rest of the series is unchecked")
                    return

                subprocess.run(["git", "apply", "--index", os.path.abspath(path)], cwd=repo, check=True)
                git(repo, "commit", "-q", "--no-verify", "-m", name)
        print(f"all {len(names)} patches of the series apply in order")


def git(repo, *args, env=None):
    full_env = dict(os.environ)
    full_env.update({
        "GIT_AUTHOR_NAME": AUTHOR_NAME, "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
        "GIT_COMMITTER_NAME": AUTHOR_NAME, "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL,
        "GIT_AUTHOR_DATE": DATE, "GIT_COMMITTER_DATE": DATE,
        "GIT_CONFIG_NOSYSTEM": "1", "HOME": repo,
    })
    if env:
        full_env.update(env)
    return subprocess.run(["git", "-C", repo, *args], check=True, env=full_env,
                          stdout=subprocess.PIPE).stdout


def make_one(tree, scratch, relpath, transform, message, out_path):
    repo = os.path.join(scratch, "repo")
    if os.path.exists(repo):
        shutil.rmtree(repo)
    shutil.copytree(tree, repo, symlinks=True)
    git(repo, "init", "-q")
    git(repo, "add", "--force", "-A")
    git(repo, "commit", "-q", "--no-verify", "-m", "pristine 1.13.1")
    path = os.path.join(repo, relpath)
    with open(path) as f:
        src = f.read()
    with open(path, "w") as f:
        f.write(transform(src))
    git(repo, "add", "--force", relpath)
    msg_file = os.path.join(scratch, "msg")
    with open(msg_file, "w") as f:
        f.write(message)
    git(repo, "commit", "-q", "--no-verify", "--cleanup=verbatim", "-F", msg_file)
    patch = git(repo, "format-patch", "-1", "--stdout", "--zero-commit", "--no-signature",
                "--full-index", "HEAD")
    with open(out_path, "wb") as f:
        f.write(patch)
    # check: applies to the pristine tree
    subprocess.run(["git", "apply", "--check", os.path.abspath(out_path)], cwd=tree, check=True)
    print("wrote", out_path)


SPECS = {
    "0201-deterministic-adaptive-max-pool2d-backward.patch": (
        {AMP_FILE: patch_amp,
         TEST_TORCH: lambda src: expect_no_cuda_alert(src, "AdaptiveMaxPool2d", "PT-0201")}, AMP_MESSAGE),
    "0202-deterministic-grid-sampler-2d-backward.patch": (
        {GS_FILE: patch_gs,
         TEST_TORCH: lambda src: expect_no_cuda_alert(src, "grid_sample_2d", "PT-0202")}, GS_MESSAGE),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", required=True, help="extracted pristine pytorch 1.13.1 tree")
    ap.add_argument("--out", required=True, help="patches/1.13.1 directory")
    args = ap.parse_args()
    tree = os.path.abspath(args.tree)
    walk_series(tree, args.out, SPECS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
