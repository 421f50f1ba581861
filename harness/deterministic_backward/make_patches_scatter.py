#!/usr/bin/env python3
"""Make patches/1.13.1/0230-*.patch and 0231-*.patch (issue 18: scatter_reduce in every mode and
scatter with reduce="add"/"multiply"; index_reduce in every mode) from det_kernels_scatter.cuh.

The marked section det_gather_reduce (the code the H200 harness proved, see run_harness_scatter.py)
is copied verbatim into torch 1.13.1's ScatterGatherKernel.cu and Indexing.cu, after a stable
radix sort on at::cuda::cub::radix_sort_pairs; each op takes the deterministic path when
at::globalContext().deterministicAlgorithms() is set and keeps its atomic kernel otherwise. Each
patch is committed in a scratch git repository of the pristine tree after the series' patches that
precede these two, exported with git format-patch, and checked with git apply --check in order.

    python3 harness/deterministic_backward/make_patches_scatter.py \
        --tree /tmp/detbw-18/pytorch-1.13.1 --out patches/1.13.1

--tree is the extracted pytorch_1.13.1+dfsg.orig.tar.xz (left untouched; it is copied).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_patches_common as common  # noqa: E402
import make_patches_reductions as mpr  # noqa: E402  (add_includes: its include lists)
from make_patches_common import CUDA, replace_once  # noqa: E402

EVIDENCE = ("evidence/gpu/deterministic-issue18-scatter-index-reduce-ops.json and "
            "determinism-all-kernels-h200.json in the patcher repository")
SORT = common.radix_sort_pairs_wrapper("det_gr_sort_pairs", "scatter/index reductions")


def block():
    return ("// Deterministic scatter/index reductions (patcher, issue 18): contributions gathered by\n"
            "// target with a stable sort, each target reduced by one thread in the CPU's order.\n"
            "namespace {\n\n" + SORT +
            common.kernel_sections(("det_kernels_scatter.cuh",), "det_gather_reduce") + "\n} // namespace\n\n")


NOTE = ("  // See Note [Writing Nondeterministic Operations]. Under\n"
        "  // torch.use_deterministic_algorithms(True) the contributions are gathered\n"
        "  // by target (stable sort) and each target is reduced by one thread in the\n"
        "  // CPU kernel's order, rounding per step as it does: bitwise the CPU's result.\n")


# --- ScatterGatherKernel.cu: scatter_reduce (all modes) and scatter(reduce=) (PT-0230) ----------------
def t_scatter(src):
    src = mpr.add_includes(src, "#include <ATen/cuda/CUDAContext.h>\n", extra=["#include <ATen/cuda/cub.h>"])
    src = replace_once(src, "namespace at { namespace native {\n\n", "namespace at { namespace native {\n\n" + block())
    src = replace_once(
        src,
        "void scatter_reduce_cuda_kernel(const Tensor& self, const int64_t dim, const Tensor& index,\n"
        "                               const Tensor& src, const SCATTER_GATHER_OP& reduce) {\n",
        "void scatter_reduce_cuda_kernel(const Tensor& self, const int64_t dim, const Tensor& index,\n"
        "                               const Tensor& src, const SCATTER_GATHER_OP& reduce) {\n" + NOTE +
        "  // (The atomic multiply below rounds in whatever order the threads arrive.)\n"
        "  if (globalContext().deterministicAlgorithms()) {\n"
        "    scatter_reduce_deterministic(self, dim, index, src,\n"
        "                                 reduce == SCATTER_GATHER_OP::REDUCE_MULTIPLY ? kDetGrProd : kDetGrSum,\n"
        "                                 /*include_self=*/true, /*opmath=*/false, /*divide=*/false);\n"
        "    return;\n"
        "  }\n")
    src = replace_once(
        src,
        "                                    const Tensor& src, const SCATTER_GATHER_OP& reduce) {\n"
        "  globalContext().alertNotDeterministic(\"scatter_reduce_cuda\");\n",
        "                                    const Tensor& src, const SCATTER_GATHER_OP& reduce) {\n" + NOTE +
        "  // self already holds the identity where include_self=False (scatter_impl), and\n"
        "  // scatter_reduce_two divides the mean's sum afterwards.\n"
        "  if (globalContext().deterministicAlgorithms()) {\n"
        "    int op = kDetGrSum;  // REDUCE_ADD, and the sum of REDUCE_MEAN\n"
        "    if (reduce == SCATTER_GATHER_OP::REDUCE_MULTIPLY) {\n"
        "      op = kDetGrProd;\n"
        "    } else if (reduce == SCATTER_GATHER_OP::REDUCE_MAXIMUM) {\n"
        "      op = kDetGrMax;\n"
        "    } else if (reduce == SCATTER_GATHER_OP::REDUCE_MINIMUM) {\n"
        "      op = kDetGrMin;\n"
        "    }\n"
        "    scatter_reduce_deterministic(self, dim, index, src, op, /*include_self=*/true,\n"
        "                                 /*opmath=*/false, /*divide=*/false);\n"
        "    return;\n"
        "  }\n"
        "  globalContext().alertNotDeterministic(\"scatter_reduce_cuda\");\n")
    return src


# --- Indexing.cu: index_reduce (PT-0231) ---------------------------------------------------------------
def t_index(src):
    src = mpr.add_includes(src, "#include <ATen/cuda/cub.h>\n")
    src = replace_once(src, "namespace at { namespace native {\n\n", "namespace at { namespace native {\n\n" + block())
    src = replace_once(
        src,
        "  TORCH_WARN_ONCE(\"index_reduce() is in beta and the API may change at any time.\");\n\n"
        "  if (reduce == \"prod\") {\n",
        "  TORCH_WARN_ONCE(\"index_reduce() is in beta and the API may change at any time.\");\n\n" + NOTE +
        "  // The mean's count and division happen in the same pass, as the CPU defines them.\n"
        "  if (globalContext().deterministicAlgorithms()) {\n"
        "    const int op = reduce == \"prod\" ? kDetGrProd : reduce == \"mean\" ? kDetGrMean\n"
        "                 : reduce == \"amax\" ? kDetGrMax : reduce == \"amin\" ? kDetGrMin : -1;\n"
        "    TORCH_CHECK(op >= 0, \"reduce argument must be either prod, mean, amax or amin, got \", reduce, \".\");\n"
        "    if (!result.is_same(self)) {\n"
        "      result.copy_(self);\n"
        "    }\n"
        "    index_reduce_deterministic(result, dim, index, source, op, include_self);\n"
        "    return;\n"
        "  }\n\n"
        "  if (reduce == \"prod\") {\n")
    return src


COMMON_TAIL = """\
The kernel text comes unchanged from harness/deterministic_backward
(det_kernels_scatter.cuh) in the patcher repository, where it was built
as a torch 2.11 extension and proved on an NVIDIA H200: bitwise
identical over 25 repeats in every case, equal to the CPU kernel's
result, error against an fp64 reference, time against torch's atomic
kernel, and registered through the dispatcher for the probe's
determinism checks ({ev}). Upstream has no alert test for {what}.
"""

PATCHES = [
    dict(
        file="0230-deterministic-scatter-reduce.patch", pid="PT-0230",
        subject="Deterministic CUDA scatter_reduce and scatter with reduce=",
        files={CUDA + "ScatterGatherKernel.cu": t_scatter},
        bug="none", probe="determinism.scatter_reduce_prod, determinism.scatter_multiply",
        what="these ops",
        tests='test_scatter_gather_ops.py -k "scatter_reduce or scatter_multiply or scatter_add", '
              'test_torch.py -k "scatter"',
        body="""\
scatter_reduce on CUDA combines every contribution into its target with
an atomic operation (atomicAdd, a compare-and-swap loop for multiply,
max and min), so sums, means and products round in the order the
threads arrive and change between runs, and under
torch.use_deterministic_algorithms(True) scatter_reduce raises
"scatter_reduce_cuda does not have a deterministic implementation" in
every mode. scatter_ with reduce="multiply" or "add" uses the same
atomics and does not even alert.

Under the flag, gather by target instead: each contribution's target is
computed as a linear offset in self, a stable radix sort of (target,
source position) puts the contributors of one target together in
ascending source position, which is the order the CPU kernel applies
them (they share every coordinate but dim, and the CPU loops dim
upwards), and one thread per target reduces its run sequentially from
self, rounding to the dtype after every step as the CPU kernel does.
The result is bitwise the same on every run and equal to the CPU's for
sum, prod, amax, amin and the mean's sum (scatter_reduce_two divides it
afterwards with its deterministic scatter_add count). Non-contiguous
self goes through a contiguous copy; src is read at the index positions.
Without the flag the atomic kernels stay.
"""),
    dict(
        file="0231-deterministic-index-reduce.patch", pid="PT-0231",
        subject="Deterministic CUDA index_reduce (prod, mean, amax, amin)",
        files={CUDA + "Indexing.cu": t_index},
        bug="none", probe="determinism.index_reduce_prod", what="index_reduce",
        tests='test_torch.py -k "index_reduce"',
        body="""\
index_reduce on CUDA combines each source slice into the slice of self
its index names with atomic multiply, add, max or min, so products and
means round in the order the threads arrive, and under
torch.use_deterministic_algorithms(True) index_reduce raises
"index_reduce_cuda does not have a deterministic implementation" in
every mode.

Under the flag, a stable radix sort of (index[i], i) groups the source
rows of one target row in ascending i, the CPU kernel's order, and one
thread per (target row, slice element) reduces them sequentially from
self (or from the identity when include_self=False), rounding to the
dtype after every step as the CPU does. For mean the count (including
self when include_self) is kept in the dtype like the CPU's counts
tensor, a zero count becomes one, and integer types divide with floor
rounding: the result is bitwise the CPU's. int32 and int64 indices,
non-contiguous self and source (through contiguous copies). Uses the
gather kernel of PT-0230 (a copy of the same text in this file). Without
the flag the atomic kernels stay.
"""),
]


def message(spec):
    return common.commit_message(spec["subject"], spec["body"],
                                 COMMON_TAIL.format(ev=EVIDENCE, what=spec["what"]),
                                 common.trailers(spec["pid"], spec["bug"], spec["probe"], spec["tests"]))


def main():
    args = common.parse_args()
    common.make_after_series(args.tree, args.out,
                             [(spec["file"], spec["files"], message(spec)) for spec in PATCHES])
    return 0


if __name__ == "__main__":
    sys.exit(main())
