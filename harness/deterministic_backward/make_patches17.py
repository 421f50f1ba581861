#!/usr/bin/env python3
"""Make patches/1.13.1/0203-*.patch .. 0211-*.patch and 0222-*.patch (issue 17) from
det_accumulate.cuh, det_kernels17.cuh and (PT-0222) det_kernels.cuh's grid_sampler_3d section.

The marked sections of the two headers (the code the H200 harness proved, see
run_harness17.py) are copied verbatim into each torch 1.13.1 .cu file that needs them, in an
anonymous namespace at the top of at::native; the file's backward (max_unpool: forward) takes
the deterministic path when at::globalContext().deterministicAlgorithms() is set, and keeps
its atomic kernel (and its alertNotDeterministic, which now fires only for the types the
deterministic kernel does not cover, e.g. complex) otherwise. Each patch is committed in a
scratch git repository and exported with git format-patch, on top of the series patches
before it (make_patches.walk_series): each patch also updates upstream's
test_nondeterministic_alert_* tests of its own ops in test/test_torch.py, so patches touch
that file one after another. Run make_patches.py (PT-0201/0202) first.

    python3 harness/deterministic_backward/make_patches17.py \
        --tree /tmp/detbw/pytorch-1.13.1 --out patches/1.13.1

--tree is the extracted pytorch_1.13.1+dfsg.orig.tar.xz (left untouched; it is copied).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_patches as mp  # noqa: E402  (test_torch.py expectations, det_kernels.cuh's sections)
import make_patches_common as common  # noqa: E402
from make_patches_common import CUDA, ISSUES, replace_after, replace_once  # noqa: E402

EVIDENCE = ("evidence/gpu/deterministic-issue17-ops.json, -ops-v2*.json and "
            "-training*.json in the patcher repository")
EVIDENCE_GS3D = "evidence/gpu/deterministic-issue17-gridsample3d.json in the patcher repository"


KERNEL_HEADERS = ("det_accumulate.cuh", "det_kernels17.cuh")
INCLUDES = ["#include <ATen/OpMathType.h>", "#include <c10/cuda/CUDAException.h>",
            "#include <c10/macros/Macros.h>"]
STD = ["#include <algorithm>", "#include <cstdint>", "#include <limits>"]


def add_includes(src, extra=()):
    return common.insert_missing_includes(src, "#include <ATen/cuda/CUDAContext.h>\n",
                                          list(INCLUDES) + list(extra) + STD)


def add_sections(src, names, headers=KERNEL_HEADERS, issue="17"):
    block = (f"\n// Deterministic kernels (patcher, issue {issue}): one writer per element or\n"
             "// order-independent integer sums; see the comments in each section.\n"
             "namespace {\n\n" + common.kernel_sections(headers, *names) + "\n} // namespace\n")
    return replace_once(src, "namespace native {\n", "namespace native {\n" + block)


def drop_alert(src, name, indent="  ", comment=True):
    """Remove an entry point's alert (the deterministic branch further in raises it when needed)."""
    old = f'{indent}globalContext().alertNotDeterministic("{name}");\n'
    new = (f"{indent}// (the alert moved to where the deterministic kernel is chosen)\n" if comment else "")
    return replace_once(src, old, new)


def upstream_alert(name, indent="  "):
    """torch 1.13.1's three lines at an entry point whose kernel uses atomicAdd."""
    return (f"{indent}// See Note [Writing Nondeterministic Operations]\n"
            f"{indent}// Nondeterministic because of atomicAdd usage\n"
            f"{indent}globalContext().alertNotDeterministic(\"{name}\");\n")


def defer_alert(src, name, where, indent="  "):
    """An entry point's upstream alert becomes a pointer to `where` the deterministic branch is
    chosen (it alerts there when the atomic kernel runs)."""
    return replace_once(src, upstream_alert(name, indent),
                        f"{indent}// See Note [Writing Nondeterministic Operations]: see {where}.\n")


ALERT_NOTE = ("// See Note [Writing Nondeterministic Operations]. Under\n"
              "{i}// torch.use_deterministic_algorithms(True) an atomic-free kernel with a\n"
              "{i}// fixed order of additions is used; otherwise the atomic kernel below.\n")


def det_branch(indent, cond, body, alert):
    i = indent
    return (f"{i}{ALERT_NOTE.format(i=i)}"
            f"{i}if ({cond}) {{\n" + "".join(f"{i}  {line}\n" if line else "\n" for line in body) +
            f"{i}}}\n{i}globalContext().alertNotDeterministic(\"{alert}\");\n")


# --- per-file transforms ---------------------------------------------------------------------
ALLOCATOR = ["#include <c10/cuda/CUDACachingAllocator.h>"]


def t_adaptive2d(src):
    src = add_includes(src, ALLOCATOR)
    src = add_sections(src, ["det_common", "adaptive_avg_pool"])
    src = defer_alert(src, "adaptive_avg_pool2d_backward_out_cuda", "the template", indent="    ")
    src = defer_alert(src, "adaptive_avg_pool2d_backward_cuda", "the template", indent="    ")
    src = replace_after(
        src, "  void adaptive_avg_pool2d_backward_out_cuda_template(",
        "    switch (input.suggest_memory_format()) {\n",
        det_branch("    ", "globalContext().deterministicAlgorithms()",
                   ["adaptive_avg_pool_backward_deterministic(gradInput, gradOutput_, /*spatial=*/2);",
                    "return;"], "adaptive_avg_pool2d_backward_cuda") +
        "\n    switch (input.suggest_memory_format()) {\n")
    return src


def t_adaptive3d(src):
    src = add_includes(src, ALLOCATOR)
    src = add_sections(src, ["det_common", "adaptive_avg_pool"])
    for name in ("adaptive_avg_pool3d_backward_out_cuda", "adaptive_avg_pool3d_backward_cuda"):
        src = defer_alert(src, name, "the template")
    src = replace_after(
        src, "void adaptive_avg_pool3d_backward_out_cuda_template(",
        "  gradInput.resize_as_(input);\n  if (gradInput.numel() == 0) {\n    return;\n  }\n\n  gradInput.zero_();\n",
        "  gradInput.resize_as_(input);\n  if (gradInput.numel() == 0) {\n    return;\n  }\n\n" +
        det_branch("  ", "globalContext().deterministicAlgorithms()",
                   ["adaptive_avg_pool_backward_deterministic(gradInput, gradOutput, /*spatial=*/3);",
                    "return;"], "adaptive_avg_pool3d_backward_cuda") +
        "  gradInput.zero_();\n")
    return src


def t_avgpool3d(src):
    src = add_includes(src, ALLOCATOR)
    src = add_sections(src, ["det_common", "avg_pool3d"])
    src = defer_alert(src, "avg_pool3d_backward_cuda", "below")
    src = replace_after(
        src, "TORCH_IMPL_FUNC(avg_pool3d_backward_out_cuda) (",
        "  gradInput.zero_();\n",
        det_branch("  ", "globalContext().deterministicAlgorithms()",
                   ["avg_pool3d_backward_deterministic(gradInput, gradOutput, kT, kH, kW, dT, dH, dW,",
                    "                                  padT, padH, padW, count_include_pad, divisor);",
                    "return;"], "avg_pool3d_backward_cuda") +
        "  gradInput.zero_();\n")
    return src


def t_reflection(src):
    src = add_includes(src)
    src = add_sections(src, ["det_common", "pad"])
    # 1d (structured: the meta function checked the shapes)
    src = replace_once(
        src,
        upstream_alert("reflection_pad1d_backward_out_cuda"),
        det_branch("  ", "globalContext().deterministicAlgorithms() && !grad_input.is_complex()",
                   ["pad_backward_deterministic(grad_input, grad_output_, /*spatial=*/1, /*reflection=*/true,",
                    "                           0, 0, padding[0]);",
                    "return;"], "reflection_pad1d_backward_out_cuda"))
    # 2d: entry points alert no more; the template decides after its shape checks
    for name in ("reflection_pad2d_backward_out_cuda", "reflection_pad2d_backward_cuda"):
        src = defer_alert(src, name, "the template")
    src = replace_after(
        src, "void reflection_pad2d_backward_out_template(",
        "  Tensor grad_output = grad_output_.contiguous();\n",
        det_branch("  ", "globalContext().deterministicAlgorithms() && !grad_input.is_complex()",
                   ["pad_backward_deterministic(grad_input, grad_output_, /*spatial=*/2, /*reflection=*/true,",
                    "                           0, pad_t, pad_l);",
                    "return;"], "reflection_pad2d_backward_cuda") +
        "\n  Tensor grad_output = grad_output_.contiguous();\n")
    # 3d (structured)
    src = replace_once(
        src,
        "  globalContext().alertNotDeterministic(\"reflection_pad3d_backward_out_cuda\");\n",
        det_branch("  ", "globalContext().deterministicAlgorithms() && !grad_input.is_complex()",
                   ["pad_backward_deterministic(grad_input, grad_output, /*spatial=*/3, /*reflection=*/true,",
                    "                           padding[4], padding[2], padding[0]);",
                    "return;"], "reflection_pad3d_backward_out_cuda"))
    return src


def t_replication(src):
    src = add_includes(src)
    src = add_sections(src, ["det_common", "pad"])
    # 1d (structured)
    src = replace_once(
        src,
        upstream_alert("replication_pad1d_backward_cuda"),
        det_branch("  ", "globalContext().deterministicAlgorithms() && !gradInput.is_complex()",
                   ["pad_backward_deterministic(gradInput, gradOutput, /*spatial=*/1, /*reflection=*/false,",
                    "                           0, 0, paddingSize[0]);",
                    "return;"], "replication_pad1d_backward_cuda"))
    for name in ("replication_pad2d_backward_out_cuda", "replication_pad2d_backward_cuda",
                 "replication_pad3d_backward_out_cuda", "replication_pad3d_backward_cuda"):
        src = defer_alert(src, name, "the template")
    resize = "  gradInput.resize_as_(input);\n  if (gradInput.numel() == 0) {\n    return;\n  }\n  gradInput.zero_();\n"
    src = replace_after(
        src, "void replication_pad2d_backward_out_cuda_template(", resize,
        "  gradInput.resize_as_(input);\n  if (gradInput.numel() == 0) {\n    return;\n  }\n" +
        det_branch("  ", "globalContext().deterministicAlgorithms() && !gradInput.is_complex()",
                   ["pad_backward_deterministic(gradInput, gradOutput, /*spatial=*/2, /*reflection=*/false,",
                    "                           0, padT, padL);",
                    "return;"], "replication_pad2d_backward_cuda") +
        "  gradInput.zero_();\n")
    src = replace_after(
        src, "void replication_pad3d_backward_out_cuda_template(", resize,
        "  gradInput.resize_as_(input);\n  if (gradInput.numel() == 0) {\n    return;\n  }\n" +
        det_branch("  ", "globalContext().deterministicAlgorithms() && !gradInput.is_complex()",
                   ["pad_backward_deterministic(gradInput, gradOutput, /*spatial=*/3, /*reflection=*/false,",
                    "                           pfront, ptop, pleft);",
                    "return;"], "replication_pad3d_backward_cuda") +
        "  gradInput.zero_();\n")
    return src


# C++ lines of a backward's deterministic branch: det_scale(in, out, scale) is the forward's scale
# of one axis, so that the gather kernels find the same taps (make_patches_aa.py uses it too).
FORWARD_SCALE_LAMBDA = [
    "// the forward's scales, as area_pixel_compute_scale computes them in the",
    "// accumulate type (double for double, float otherwise)",
    "const bool acc_double = grad_output.scalar_type() == at::ScalarType::Double;",
    "auto det_scale = [&](int64_t in, int64_t out, c10::optional<double> s) -> double {",
    "  return acc_double",
    "      ? static_cast<double>(area_pixel_compute_scale<double>(in, out, align_corners, s))",
    "      : static_cast<double>(area_pixel_compute_scale<float>(in, out, align_corners, s));",
    "};"]


def upsample_transform(entry, alert, spatial, cubic, scales):
    """scales: expressions for the (D, H, W) scales' (input size, output size, optional scale)."""
    def t(src):
        src = add_includes(src, ["#include <c10/cuda/CUDACachingAllocator.h>"])
        src = add_sections(src, ["det_common", "upsample"])
        body = list(FORWARD_SCALE_LAMBDA)
        args = []
        for expr in scales:
            args.append("0.0" if expr is None else f"det_scale({expr[0]}, {expr[1]}, {expr[2]})")
        body += [f"upsample_backward_deterministic(grad_input, grad_output, /*spatial=*/{spatial}, "
                 f"/*cubic=*/{'true' if cubic else 'false'},",
                 f"                                align_corners, {', '.join(args)});",
                 "return;"]
        src = replace_after(
            src, entry,
            upstream_alert(alert),
            det_branch("  ", "globalContext().deterministicAlgorithms()", body, alert))
        return src
    return t


t_linear1d = upsample_transform(
    "TORCH_IMPL_FUNC(upsample_linear1d_backward_out_cuda) (", "upsample_linear1d_backward_out_cuda", 1, False,
    [None, None, ("input_size[2]", "output_size[0]", "scales")])
t_bilinear2d = upsample_transform(
    "TORCH_IMPL_FUNC(upsample_bilinear2d_backward_out_cuda) (", "upsample_bilinear2d_backward_out_cuda", 2, False,
    [None, ("input_size[2]", "output_size[0]", "scales_h"), ("input_size[3]", "output_size[1]", "scales_w")])
t_bicubic2d = upsample_transform(
    "TORCH_IMPL_FUNC(upsample_bicubic2d_backward_out_cuda) (", "upsample_bicubic2d_backward_out_cuda", 2, True,
    [None, ("input_size[2]", "output_size[0]", "scales_h"), ("input_size[3]", "output_size[1]", "scales_w")])
t_trilinear3d = upsample_transform(
    "TORCH_IMPL_FUNC(upsample_trilinear3d_backward_out_cuda) (", "upsample_trilinear3d_backward_out_cuda", 3, False,
    [("input_size[2]", "output_size[0]", "scales_d"), ("input_size[3]", "output_size[1]", "scales_h"),
     ("input_size[4]", "output_size[2]", "scales_w")])

ARGMAX_CONTIG = [
    "const Tensor go_c = gradOutput.contiguous();",
    "const Tensor ind_c = indices.contiguous();",
    "Tensor gi_c = gradInput.is_contiguous() ? gradInput",
    "                                        : at::empty(gradInput.sizes(), gradInput.options());",
]


def t_maxpool3d(src):
    src = add_includes(src)
    src = add_sections(src, ["det_common", "argmax_gather"])
    for name in ("max_pool3d_with_indices_backward_out_cuda", "max_pool3d_with_indices_backward_cuda"):
        src = defer_alert(src, name, "the template")
    body = ARGMAX_CONTIG + [
        "const int64_t in_size[3] = {itime, iheight, iwidth};",
        "const int64_t out_size[3] = {otime, oheight, owidth};",
        "const int64_t k[3] = {kT, kH, kW}, s[3] = {dT, dH, dW}, p[3] = {pT, pH, pW};",
        "const int64_t dil[3] = {dilationT, dilationH, dilationW};",
        "if (argmax_gather_backward_deterministic(gi_c, go_c, ind_c, /*spatial=*/3, in_size, out_size,",
        "                                         /*from_target=*/true, k, s, p, dil)) {",
        "  if (!gi_c.is_same(gradInput)) {",
        "    gradInput.copy_(gi_c);",
        "  }",
        "  return;",
        "}",
        "// beyond the 32-bit path: no deterministic kernel, the alert below raises"]
    src = replace_once(
        src,
        "  Tensor work_grad_input = gradInput;\n  Tensor work_grad_output;\n  Tensor work_indices;\n",
        det_branch("  ", "globalContext().deterministicAlgorithms()", body,
                   "max_pool3d_with_indices_backward_cuda") +
        "\n  Tensor work_grad_input = gradInput;\n  Tensor work_grad_output;\n  Tensor work_indices;\n")
    return src


def t_frac2d(src):
    src = add_includes(src)
    # at::empty for the contiguous scratch (per-operator headers; the other branch has Functions.h)
    src = replace_once(
        src,
        "#ifndef AT_PER_OPERATOR_HEADERS\n#include <ATen/NativeFunctions.h>\n#else\n",
        "#ifndef AT_PER_OPERATOR_HEADERS\n#include <ATen/Functions.h>\n#include <ATen/NativeFunctions.h>\n#else\n"
        "#include <ATen/ops/empty.h>\n")
    src = add_sections(src, ["det_common", "argmax_gather"])
    src = defer_alert(src, "fractional_max_pool2d_backward_cuda", "below")
    body = ARGMAX_CONTIG + [
        "const int64_t in_size[2] = {inputH, inputW};",
        "const int64_t out_size[2] = {outputH, outputW};",
        "const int64_t k[2] = {pool_size[0], pool_size.size() == 1 ? pool_size[0] : pool_size[1]};",
        "if (argmax_gather_backward_deterministic(gi_c, go_c, ind_c, /*spatial=*/2, in_size, out_size,",
        "                                         /*from_target=*/false, k, nullptr, nullptr, nullptr)) {",
        "  if (!gi_c.is_same(gradInput)) {",
        "    gradInput.copy_(gi_c);",
        "  }",
        "  return;",
        "}",
        "// beyond the 32-bit path: no deterministic kernel, the alert below raises"]
    src = replace_after(
        src, "TORCH_IMPL_FUNC(fractional_max_pool2d_backward_cuda)(",
        "  gradInput.zero_();\n",
        det_branch("  ", "globalContext().deterministicAlgorithms()", body,
                   "fractional_max_pool2d_backward_cuda") + "  gradInput.zero_();\n")
    # pool_size is used now
    src = replace_once(src, "  IntArrayRef pool_size /* unused */,\n", "  IntArrayRef pool_size,\n")
    return src


def t_frac3d(src):
    src = add_includes(src, ["#include <c10/cuda/CUDACachingAllocator.h>"])
    src = add_sections(src, ["det_common", "det_fixed_point", "index_scatter"])
    for name in ("fractional_max_pool3d_backward_out_cuda", "fractional_max_pool3d_backward_cuda"):
        src = defer_alert(src, name, "the template", indent="    ")
    # the template learns the pool size (the bound on windows sharing one element)
    src = replace_once(
        src,
        "  IntArrayRef output_size,\n  const Tensor& indices) {\n    int64_t dimt = 1;\n",
        "  IntArrayRef output_size,\n  const Tensor& indices,\n  IntArrayRef pool_size) {\n    int64_t dimt = 1;\n")
    src = replace_once(src, "  IntArrayRef /*pool_size*/,\n  IntArrayRef output_size,\n",
                       "  IntArrayRef pool_size,\n  IntArrayRef output_size,\n")
    call_old = "      output_size,\n      indices\n    );\n"
    if src.count(call_old) != 2:
        raise SystemExit("expected the template's two call sites")
    src = src.replace(call_old, "      output_size,\n      indices,\n      pool_size\n    );\n")
    body = ARGMAX_CONTIG + [
        "const int64_t planes = inputT * inputH * inputW == 0 ? 0",
        "    : gradInput.numel() / (inputT * inputH * inputW);",
        "// windows covering one element: at most pool + 1 per axis (see argmax_gather)",
        "int64_t hits = 1;",
        "for (size_t a = 0; a < 3; ++a) {",
        "  hits *= (pool_size.size() == 1 ? pool_size[0] : pool_size[a]) + 1;",
        "}",
        "index_scatter_backward_deterministic(gi_c, go_c, ind_c, planes, inputT * inputH * inputW,",
        "                                     outputT * outputH * outputW, hits);",
        "if (!gi_c.is_same(gradInput)) {",
        "  gradInput.copy_(gi_c);",
        "}",
        "return;"]
    src = replace_once(
        src,
        "    /* resize */\n    gradInput.resize_as_(input);\n    gradInput.zero_();\n",
        "    /* resize */\n    gradInput.resize_as_(input);\n" +
        det_branch("    ", "globalContext().deterministicAlgorithms()", body,
                   "fractional_max_pool3d_backward_cuda") + "    gradInput.zero_();\n")
    return src


def t_unpool(src):
    src = add_includes(src, ["#include <c10/cuda/CUDACachingAllocator.h>"])
    src = add_sections(src, ["det_common", "max_unpool"])
    for name in ("max_unpooling2d_forward_out", "max_unpooling3d_forward_out"):
        src = replace_once(
            src,
            "  // See Note [Writing Nondeterministic Operations]\n"
            "  // Nondeterministic with duplicate indices\n"
            f"  at::globalContext().alertNotDeterministic(\"{name}\");\n",
            "  // See Note [Writing Nondeterministic Operations]: see below (duplicate\n"
            "  // indices are a write conflict).\n")
    note = ("  // See Note [Writing Nondeterministic Operations]. Under\n"
            "  // torch.use_deterministic_algorithms(True), floating types: duplicate indices\n"
            "  // resolve to the largest input position, as on the CPU with one thread.\n")
    src = replace_once(
        src,
        "  output.resize_({numBatch, numChannels, oheight, owidth});\n\n  output.zero_();\n",
        "  output.resize_({numBatch, numChannels, oheight, owidth});\n\n" + note +
        "  if (at::globalContext().deterministicAlgorithms() && at::isFloatingType(self.scalar_type())) {\n"
        "    max_unpool_deterministic(output, self, indices, numBatch * numChannels,\n"
        "                             inputHeight * inputWidth, oheight * owidth);\n"
        "    if (self.ndimension() == 3) {\n"
        "      output.resize_({numChannels, oheight, owidth});\n"
        "    }\n"
        "    return output;\n"
        "  }\n"
        "  at::globalContext().alertNotDeterministic(\"max_unpooling2d_forward_out\");\n\n"
        "  output.zero_();\n")
    src = replace_after(
        src, "    output.resize_({batchSize, inputSlices, oT, oH, oW});\n  }\n",
        "  output.zero_();\n",
        note +
        "  if (at::globalContext().deterministicAlgorithms() && at::isFloatingType(self.scalar_type())) {\n"
        "    max_unpool_deterministic(output, self, indices, batchSize * inputSlices,\n"
        "                             inputTime * inputHeight * inputWidth, oT * oH * oW);\n"
        "    return output;\n"
        "  }\n"
        "  at::globalContext().alertNotDeterministic(\"max_unpooling3d_forward_out\");\n"
        "  output.zero_();\n")
    return src


ROUND_NEAREST_3D = """\
// The rounding of this file's 3-D nearest kernels (::round, half away from
// zero), for the deterministic grid_sampler_3d backward below.
template <typename T>
__device__ __forceinline__ T grid_sampler_3d_round_nearest(T v) {
  return ::round(v);
}

"""


def t_grid_sampler_3d(src):
    """GridSampler.cu with PT-0202 applied: the 3-D section after the 2-D one, and the branch."""
    section2d = mp.section("grid_sampler_2d")
    src = replace_once(src, section2d, section2d + "\n" + ROUND_NEAREST_3D + mp.section("grid_sampler_3d"))
    src = replace_once(
        src,
        upstream_alert("grid_sampler_3d_backward_cuda"),
        "  // See Note [Writing Nondeterministic Operations]\n"
        "  // The default kernel accumulates grad_input with atomicAdd. Under\n"
        "  // torch.use_deterministic_algorithms(True) an atomic-free kernel with a\n"
        "  // fixed order of additions is used (trilinear and nearest: all 3-D modes).\n"
        "  if (globalContext().deterministicAlgorithms()) {\n"
        "    grid_sampler_3d_backward_deterministic(\n"
        "        grad_input, grad_grid, grad_output, input, grid, interpolation_mode,\n"
        "        padding_mode, align_corners, /*input_requires_grad=*/output_mask[0]);\n"
        "    return;\n"
        "  }\n"
        "  // Nondeterministic because of atomicAdd usage\n"
        "  globalContext().alertNotDeterministic(\"grid_sampler_3d_backward_cuda\");\n")
    return src


# --- the patches -----------------------------------------------------------------------------
COMMON_TAIL = """\
Gathers accumulate fp32 in double (each term formed in float as the
forward and the atomic kernel do; one rounding at the store).

The kernel text comes unchanged from harness/deterministic_backward
(det_accumulate.cuh, det_kernels17.cuh) in the patcher repository, where
it was built as a torch 2.11 extension and proved on an NVIDIA H200:
bitwise identical over 25 repeats in every case, error against an fp64
reference, fp64 gradcheck, time against torch's atomic kernel, and real
networks trained twice through the dispatcher with the flag on ({ev}).
Upstream's {alert_tests} (test/test_torch.py) expected the alert on
CUDA; this patch updates {them} to expect none there{cpu_note}.
"""

GS3D_BODY = """\
grid_sampler_3d_backward_cuda adds every grid point's trilinear (or
nearest) contributions into grad_input with atomicAdd. Grid points that
sample the same input voxel race, so the result differs bitwise between
runs, and under torch.use_deterministic_algorithms(True) the backward of
grid_sample on 5-D input raises.

Under the flag, use the atomic-free form of PT-0202 in three dimensions:
- grad_grid has no race (one thread per grid point) and keeps the
  atomic kernel's arithmetic;
- every grid point emits its 8 corners (nearest: 1) as (voxel key,
  ordinal, weight); a stable radix sort by key groups each voxel's
  contributions in ordinal order, and one thread per grad_input element
  sums weight * grad_output over its voxel's run, front to back, in the
  accumulate type, and stores once. The sort is done once for all
  channels. Nearest rounds as this file's 3-D forward does (::round).
Runs longer than 256 terms (grids concentrated on a few voxels) are
summed by a warp per voxel: lane l takes terms l, l + 32, ... and a
fixed shuffle tree adds the lanes' sums. Every padding mode and
align_corners setting. Without the flag the atomic kernel stays. This
patch builds on PT-0202 (its sort wrapper and helpers in the same file).

H200 (evidence gridsample3d): bitwise identical over 25 repeats in all
28 cases (torch's differed in all but one), grad_grid bitwise equal to
torch's in fp32/fp64, fp64 gradcheck for all 12 mode/padding/
align_corners combinations; time 1.03x torch's at 4x32x32^3 with a 32^3
trilinear grid (0.71x half), 0.92x upsampling to a 48^3 grid, nearest
2.1-2.7x, small calls 2.2-3.6x (the sort's fixed cost), a grid inside
a 2-voxel box 4.0-4.9x (misses).
"""

PATCHES = [
    dict(
        file="0203-deterministic-avg-pool3d-backward.patch", pid="PT-0203",
        subject="Deterministic CUDA backward for avg_pool3d",
        files={CUDA + "AveragePool3d.cu": t_avgpool3d},
        bug=ISSUES + "110698", probe="determinism.avg_pool3d", alerts=[("AvgPool3d", None)],
        tests='nn/test_pooling.py -k "avg_pool3d or AvgPool3d or pool3d"',
        body="""\
avg_pool3d_backward_cuda spreads each output gradient over its window
with atomicAdd; overlapping windows make the order of the additions, and
so the float result, change between runs, and under
torch.use_deterministic_algorithms(True) the op raises
"avg_pool3d_backward_cuda does not have a deterministic implementation".

Under the flag, use a gather kernel instead: one thread per grad_input
element enumerates the output cells whose window covers it
(ceil((i + pad - k + 1) / stride) .. floor((i + pad) / stride) per axis),
divides each by its window's divisor exactly as the forward does
(divisor_override, count_include_pad, the clipped window otherwise) and
sums them in ascending order in the accumulate type; it stores once, so
no zero fill and no atomics. Any memory format; 32-bit index arithmetic
where the sizes allow. The atomic kernel stays the default without the
flag (it is faster on large inputs: 1.3-2x at 8x32x32^3, k3 s2 p1).

Overlapping windows: grad_output / divisor is computed once per output
cell into a scratch buffer (the atomic kernel's division), so the gather
only adds.

H200 (evidence ops-v2): error vs fp64 0.00-1.00x torch's; time 0.73x
on a small call, 0.41x when 343 windows overlap each element, 1.68x
fp32 on 8x32x32^3 k3 s2 (1.42x half), 1.30x channels-last, 2.25x k2 s2
(misses of the 1.1x target).
"""),
    dict(
        file="0204-deterministic-adaptive-avg-pool2d-backward.patch", pid="PT-0204",
        subject="Deterministic CUDA backward for adaptive_avg_pool2d",
        files={CUDA + "AdaptiveAveragePooling.cu": t_adaptive2d},
        bug=ISSUES + "50198", probe="determinism.adaptive_avg_pool2d", alerts=[("AdaptiveAvgPool2d", None)],
        tests='nn/test_pooling.py -k "adaptive_pooling or adaptive_avg_pool2d or AdaptiveAvgPool2d"',
        body="""\
adaptive_avg_pool2d_backward_cuda adds each output gradient into its
window with atomicAdd (the contiguous path always takes the atomic
kernel). Adaptive windows overlap when the sizes do not divide, so the
result differs bitwise between runs, and under
torch.use_deterministic_algorithms(True) the op raises.

Under the flag, use a gather kernel: input row h is covered by output
rows floor(h*OH/H) .. ceil((h+1)*OH/H)-1 (likewise for columns); one
thread per grad_input element sums grad_output / window size over those
cells in ascending order, in the accumulate type, and stores once.
Contiguous and channels-last alike (strides are followed); divisions by
the sizes go through a multiply-high reciprocal. Without the flag the
atomic kernel stays.

grad_output / window size is computed once per output cell into a
scratch buffer (the atomic kernel's division); the gather only adds.

H200 (evidence ops-v2): 32x256x33x33 -> 7x7 fp32 1.06x torch's time
(fp16/bf16 0.58x), channels-last 2.0-2.2x (a miss), small calls
0.66-0.85x, 4x4 -> 64x64 1.08x; error 0.04-0.90x torch's.
"""),
    dict(
        file="0205-deterministic-adaptive-avg-pool3d-backward.patch", pid="PT-0205",
        subject="Deterministic CUDA backward for adaptive_avg_pool3d",
        files={CUDA + "AdaptiveAveragePooling3d.cu": t_adaptive3d},
        bug="none", probe="determinism.adaptive_avg_pool3d", alerts=[("AdaptiveAvgPool3d", None)],
        tests='nn/test_pooling.py -k "adaptive_pooling or adaptive_avg_pool3d"',
        body="""\
adaptive_avg_pool3d_backward_cuda uses atomicAdd whenever windows
overlap, so its result changes between runs and under
torch.use_deterministic_algorithms(True) it raises.

Under the flag, the same gather kernel as PT-0204 in three axes: one
thread per grad_input element sums grad_output / window volume over the
covering cells in ascending order and stores once. Without the flag the
atomic kernel stays.

H200 (evidence ops-v2): 8x64x17^3 -> 5^3 fp32 0.92x torch's time
(fp16/bf16 0.19x), small calls 0.78-0.81x, 2x2x2 -> 16^3 upsampling
1.33x fp32 (0.01x fp16, where torch's half atomics contend); error
0.08-1.00x torch's.
"""),
    dict(
        file="0206-deterministic-reflection-pad-backward.patch", pid="PT-0206",
        subject="Deterministic CUDA backward for reflection_pad1d/2d/3d",
        files={CUDA + "ReflectionPad.cu": t_reflection},
        bug="none", probe="determinism.reflection_pad1d, determinism.reflection_pad2d, determinism.reflection_pad3d",
        alerts=[("ReflectionPad1d", None), ("ReflectionPad2d", None), ("ReflectionPad3d", None)],
        tests='test_nn.py -k "ReflectionPad or reflection_pad"',
        body="""\
The reflection_pad backward kernels add every output gradient into its
source element with atomicAdd. Elements near the border receive from
their mirror images too, in a racing order, so the result differs
between runs, and under torch.use_deterministic_algorithms(True) the 1d,
2d and 3d backward raise.

Under the flag (real types; complex keeps the alert), use a gather
kernel: per axis an input position x receives from the direct position
x + pad_l and from its mirror images 2*pad_l - (x + pad_l) and
2*(I + pad_l - 1) - (x + pad_l), each kept only if the forward's own
index formula maps it back to x. One thread per grad_input element sums
those in a fixed order and stores once. Without the flag the atomic
kernel stays.

H200 (evidence ops-v2; torch 2.11 no longer raises for reflection_pad2d,
it still does for 1d and 3d): fp32 time 1.80x torch's at
16x64x128x128 pad 3 (0.79x channels-last, 1.08x half), 2.26x for 1d,
1.16x for 3d (misses); small calls 0.49x; error 0.21-1.00x torch's.
"""),
    dict(
        file="0207-deterministic-replication-pad-backward.patch", pid="PT-0207",
        subject="Deterministic CUDA backward for replication_pad1d/2d/3d",
        files={CUDA + "ReplicationPadding.cu": t_replication},
        bug=ISSUES + "95578", probe="determinism.replication_pad1d, determinism.replication_pad2d, determinism.replication_pad3d",
        alerts=[("ReplicationPad1d", None), ("ReplicationPad2d", None), ("ReplicationPad3d", None)],
        tests='test_nn.py -k "ReplicationPad or replication_pad"',
        body="""\
The replication_pad backward kernels add every output gradient into its
clamped source element with atomicAdd; all padding positions of a border
row race on one element, so results differ between runs, and under
torch.use_deterministic_algorithms(True) the 1d, 2d and 3d backward
raise.

Under the flag (real types; complex keeps the alert), use a gather
kernel: source(o) = clamp(o - pad_l, 0, I - 1), so input x receives
[x + pad_l] inside and the whole run of padding positions at the two
edges. One thread per grad_input element sums its range in ascending
order and stores once. Without the flag the atomic kernel stays.

H200 (evidence ops-v2): fp32 2.07x torch's time at 16x64x128x128 pad 3
(0.92x half), 2.53x for 1d, 1.28x for 3d (misses); 0.76x when a corner
receives 65^2 positions (fp16 there: 0.0005x, torch's half atomics
serialise); error 0.02-1.00x torch's.
"""),
    dict(
        file="0208-deterministic-upsample-linear-backward.patch", pid="PT-0208",
        subject="Deterministic CUDA backward for linear/bilinear/bicubic/trilinear interpolation",
        files={CUDA + "UpSampleLinear1d.cu": t_linear1d, CUDA + "UpSampleBilinear2d.cu": t_bilinear2d,
               CUDA + "UpSampleBicubic2d.cu": t_bicubic2d, CUDA + "UpSampleTrilinear3d.cu": t_trilinear3d},
        bug=ISSUES + "68961",
        probe=("determinism.interpolate_linear, determinism.interpolate_bilinear, "
               "determinism.interpolate_bicubic, determinism.interpolate_trilinear"),
        alerts=[("interpolate_linear", None), ("interpolate_bilinear", None), ("interpolate_bicubic", None), ("interpolate_trilinear", None)],
        tests=('test_nn.py -k "upsamplingLinear1d or upsamplingBilinear2d or upsamplingBicubic2d '
               'or upsamplingTrilinear3d or interpolate"'),
        body="""\
The backward of interpolate in linear, bilinear, bicubic and trilinear
mode scatters each output gradient onto its 2, 4, 16 or 8 input taps with
atomicAdd; neighbouring outputs share taps, so results differ between
runs, and under torch.use_deterministic_algorithms(True) all four raise.

Under the flag, use a gather path. A small kernel (one block per axis)
evaluates, with the forward's arithmetic (area_pixel_compute_source_index,
the A = -0.75 cubic coefficients, clamped taps), the taps and weights of
every output position, and for every input position the range of
outputs whose taps include it: the lowest and highest taps do not
decrease with the output position, so the range is contiguous and found
by binary search. One thread per grad_input element then sums
grad_output * the weights of its matching taps over that range, axis by
axis in ascending order, and stores once. As in the forward, equal input
and output sizes copy. The antialiased bilinear/bicubic backward keep
the alert. Without the flag the atomic kernels stay.

The tables kernel also keeps, per input position and axis, the weight of
each output of its range, so the gather reads one weight per output.
Where each element receives hundreds of outputs and there are few
elements (upsampling from a tiny input), one warp sums each element:
lane l takes terms l, l + 32, ... of the same order and a fixed shuffle
tree adds the lanes' sums (bitwise reproducible: the assignment depends
on the shapes only).

Linear, bicubic and trilinear were faster than torch's atomic kernel in
every measured case and dtype, but the atomic kernels stay the default
without the flag here too (using ours for everyone is a separate step).

H200 (evidence ops-v2; torch 2.11 still raises for linear and bicubic):
bicubic 0.00-0.24x torch's time, linear 0.01-0.86x, trilinear 16^3 x2
0.90x fp32 (0.45x half), bilinear x2 1.14x fp32 (0.52x half), bilinear
128^2 -> 50^2 3.2x fp32 (2.1x half: a miss), upsampling from 4x4 or 2^3
0.06-0.16x; error 0.01-1.00x torch's.
"""),
    dict(
        file="0209-deterministic-max-pool3d-backward.patch", pid="PT-0209",
        subject="Deterministic CUDA backward for max_pool3d",
        files={CUDA + "DilatedMaxPool3d.cu": t_maxpool3d},
        bug=ISSUES + "110698", probe="determinism.max_pool3d", alerts=[("MaxPool3d", None)],
        tests='nn/test_pooling.py -k "max_pool3d or MaxPool3d or maxpool3d"',
        body="""\
max_pool3d_with_indices_backward_cuda routes each output gradient to its
recorded argmax with atomicAdd; overlapping windows share argmaxes, so
the result differs between runs, and under
torch.use_deterministic_algorithms(True) the op raises.

Under the flag, use an atomic-free kernel in the form of PT-0201:
grad_input is zeroed; each output cell looks at the cells whose window
can cover its argmax t (computed from t, the stride, padding and the
dilated window extent), in ascending order. If an earlier one has the
same argmax it does nothing; otherwise it sums grad_output over all
cells with argmax t in that order and stores once. Contiguous and
channels-last 3d (through contiguous copies). Without the flag the
atomic kernel stays.

H200 (evidence ops-v2): 8x32x32^3 k3 s2 p1 1.15x torch's time fp32
(0.60x half), k2 s2 0.78x, small 0.67x, 125 outputs sharing an argmax
1.22x fp32 (0.34x half); error 0.09-1.00x torch's.
"""),
    dict(
        file="0210-deterministic-fractional-max-pool-backward.patch", pid="PT-0210",
        subject="Deterministic CUDA backward for fractional_max_pool2d/3d",
        files={CUDA + "FractionalMaxPool2d.cu": t_frac2d, CUDA + "FractionalMaxPool3d.cu": t_frac3d},
        bug="none", probe="determinism.fractional_max_pool2d, determinism.fractional_max_pool3d",
        alerts=[("FractionalMaxPool2d", None), ("FractionalMaxPool3d", None)],
        tests='nn/test_pooling.py -k "fractional_max_pool or FractionalMaxPool"',
        body="""\
The fractional_max_pool2d/3d backward kernels route each output gradient
to its argmax with atomicAdd. Pseudo-random windows overlap, so results
differ between runs, and under torch.use_deterministic_algorithms(True)
both raise.

Window starts do not decrease and rise by at least 1 at each step but
the last, so the cells that can share one argmax lie within pool size of
each other. Under the flag:
- 2d: the atomic-free form of PT-0209: each output cell scans that box
  in ascending order; the first with a given argmax sums all of them and
  stores once.
- 3d: the box grows as (2k+1)^3, so 3d uses the deterministic
  accumulation primitive instead: each contribution becomes a 64-bit
  fixed-point integer (scale 2^(62 - e - L) from the largest finite
  |gradient| < 2^e, found on the device, and L = ceil(log2 of the windows
  that can cover one element), so no sum can overflow) and is added with
  an integer atomicAdd, which is associative: the same bits in any
  order. A conversion pass writes the values; inf/NaN are added
  separately, which is order-independent too. Half and bfloat16 sums are
  exact up to one final rounding.
The pool size is now passed to the 3d template (it bounds L). Without
the flag the atomic kernels stay.

H200 (evidence ops-v2): 2d 16x64x64^2 k3 -> 40^2 3.0x torch's time fp32
(1.4x half), small 0.71x, peaks 1.9x; 3d 4x32x24^3 k2 -> 16^3
1.25-1.50x (misses); error 0.26-1.00x torch's.
"""),
    dict(
        file="0211-deterministic-max-unpool-forward.patch", pid="PT-0211",
        subject="Deterministic CUDA max_unpool2d/3d with duplicate indices",
        files={CUDA + "MaxUnpooling.cu": t_unpool},
        bug="none", probe="determinism.max_unpool2d, determinism.max_unpool3d", alerts=[("MaxUnpool1d", "max_unpooling2d_forward_out"), ("MaxUnpool2d", "max_unpooling2d_forward_out"), ("MaxUnpool3d", "max_unpooling3d_forward_out")],
        tests='nn/test_pooling.py -k "MaxUnpool or max_unpool"',
        body="""\
max_unpool2d/3d write output[indices[i]] = input[i] from many threads.
Indices that repeat (pooling with overlapping windows) are a write
conflict whose winner changes between runs, and under
torch.use_deterministic_algorithms(True) both forwards raise.

Under the flag (floating types), define the winner as the CPU kernel
does when one thread visits the inputs in order: the largest input
position. One integer atomicMax per input records the winning position
of each output cell (a maximum does not depend on order), then every
output cell is written once from its winner, or 0. max_unpool1d goes
through max_unpool2d. Without the flag the racing kernels stay.

H200 (evidence ops-v2): bitwise equal to the single-threaded CPU result
in every case (torch's CUDA kernel is not, with duplicates); time
0.82-0.88x torch's, 1.03-1.38x at 16x64x64x64 (no duplicates).
"""),
    dict(
        file="0222-deterministic-grid-sampler-3d-backward.patch", pid="PT-0222",
        subject="Deterministic CUDA backward for grid_sampler_3d",
        files={CUDA + "GridSampler.cu": t_grid_sampler_3d},
        bug="none", probe="determinism.grid_sampler_3d", alerts=[("grid_sample_3d", None)],
        tests='test_nn.py -k "(grid_sample or GridSample or grid_sampler) and not large"',
        evidence=EVIDENCE_GS3D,
        body=GS3D_BODY),
]


def alert_test_names(spec):
    return ["test_nondeterministic_alert_" + test for test, _ in spec["alerts"]]


def upstream_tests(spec):
    """The spec's own selection plus its ops' alert tests in test_torch.py."""
    keyword = " or ".join("nondeterministic_alert_" + test for test, _ in spec["alerts"])
    return f'{spec["tests"]}, test_torch.py -k "{keyword}"'


def alert_tail(spec, tail, evidence, cpu_note):
    """`tail` (a template with {ev}, {alert_tests}, {them}, {cpu_note}) filled in for the spec's
    alert tests; `cpu_note` is said where one of them still expects the CPU's alert."""
    names = alert_test_names(spec)
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    cpu_only = any(caller for _, caller in spec["alerts"])
    return tail.format(ev=evidence, alert_tests=listed, them="it" if len(names) == 1 else "them",
                       cpu_note=cpu_note if cpu_only else "")


def spec_message(spec):
    tail = alert_tail(spec, COMMON_TAIL, spec.get("evidence", EVIDENCE), " (the CPU kernel still alerts)")
    return common.commit_message(spec["subject"], spec["body"], tail,
                                 common.trailers(spec["pid"], spec["bug"], spec["probe"], upstream_tests(spec)))


def test_transform(spec):
    """test/test_torch.py: the spec's alert tests no longer expect the CUDA alert."""
    def transform(src):
        for test, caller in spec["alerts"]:
            if caller:
                src = mp.expect_cpu_alert_only(src, test, caller, spec["pid"])
            else:
                src = mp.expect_no_cuda_alert(src, test, spec["pid"])
        return src
    return transform


def series_specs(only=(), patches=PATCHES, message=spec_message):
    """walk_series' specs of `patches` (all, or those whose id is in `only`): file name ->
    (transforms by path, with the alert tests' update of test_torch.py; message)."""
    out = {}
    for spec in patches:
        if only and spec["pid"] not in only:
            continue
        transforms = dict(spec["files"])
        transforms[mp.TEST_TORCH] = test_transform(spec)
        out[spec["file"]] = (transforms, message(spec))
    return out


def main():
    args = common.parse_args(with_only=True)
    common.walk_series(args.tree, args.out, series_specs(args.only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
