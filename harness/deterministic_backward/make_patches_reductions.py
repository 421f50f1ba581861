#!/usr/bin/env python3
"""Make patches/1.13.1/0217-*.patch .. 0221-*.patch (issue 18: histc, bincount, kthvalue,
median with indices, cumsum) from det_accumulate.cuh and det_kernels_reductions.cuh.

The marked sections (the code the H200 harness proved, see run_harness_reductions.py) are copied
verbatim into the torch 1.13.1 .cu files; each op takes the deterministic path when
at::globalContext().deterministicAlgorithms() is set and keeps its kernel otherwise. Two files
carry two ops each (SummaryOps.cu: histc, bincount; Sorting.cpp/.cu: kthvalue, median), so the
patches build on each other in series order: each is committed in one scratch git repository of
the pristine tree, after the series' patches that precede these five, and exported with
git format-patch; every patch is then checked with git apply --check in order.

    python3 harness/deterministic_backward/make_patches_reductions.py \
        --tree /tmp/det18b/pytorch-1.13.1 --out patches/1.13.1

--tree is the extracted pytorch_1.13.1+dfsg.orig.tar.xz (left untouched; it is copied).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_patches_common as common  # noqa: E402
from make_patches17 import defer_alert  # noqa: E402
from make_patches_common import CUDA, ISSUES, replace_once  # noqa: E402

TEST = "test/test_torch.py"
EVIDENCE = ("evidence/gpu/deterministic-issue18-reductions-ops.json and "
            "deterministic-issue18-reductions-workload.json in the patcher repository")
HEADERS = ("det_accumulate.cuh", "det_kernels_reductions.cuh")


def block(names):
    return ("// Deterministic kernels (patcher, issue 18): integer counts and sums, an exact\n"
            "// order-statistic rule, scans of fixed association; see the comments in each section.\n"
            "namespace {\n\n" + common.kernel_sections(HEADERS, *names) + "\n} // namespace\n\n")


INCLUDES = ["#include <ATen/OpMathType.h>", "#include <c10/cuda/CUDACachingAllocator.h>",
            "#include <c10/cuda/CUDAException.h>", "#include <c10/macros/Macros.h>"]
STD = ["#include <algorithm>", "#include <cstdint>", "#include <limits>", "#include <type_traits>"]


def add_includes(src, anchor, extra=()):
    return common.insert_missing_includes(src, anchor, list(extra) + INCLUDES + STD)


NOTE = ("// See Note [Writing Nondeterministic Operations]. Under\n"
        "{i}// torch.use_deterministic_algorithms(True) the deterministic kernel ({what})\n"
        "{i}// is used; otherwise the kernel below, which alerts.\n")


def note(indent, what):
    return indent + NOTE.format(i=indent, what=what)


def test_expectation(old, new):
    """upstream's test_nondeterministic_alert_* expects the alert on CUDA: now it must not come
    (one line for one line, so later patches' line numbers stay)"""
    def t(src):
        return replace_once(src, old, new)
    return t


# --- SummaryOps.cu: histc (PT-0217), bincount (PT-0218) -----------------------------------------
def t_histc(src):
    src = add_includes(src, "#include <ATen/cuda/CUDAApplyUtils.cuh>\n")
    src = replace_once(src, "} // namespace cuda\n\nnamespace {\n///////////////// bincount",
                       "} // namespace cuda\n\n" + block(["det_common", "det_fixed_point", "det_histogram"]) +
                       "namespace {\n///////////////// bincount")
    src = defer_alert(src, "_histc_cuda", "_histc_cuda_template")
    src = replace_once(
        src,
        "  TORCH_CHECK(minvalue < maxvalue, \"max must be larger than min\");\n\n"
        "  cuda::CUDA_tensor_histogram<input_t, input_t, false>(\n",
        "  TORCH_CHECK(minvalue < maxvalue, \"max must be larger than min\");\n\n" +
        note("  ", "integer counts, converted once") +
        "  if (globalContext().deterministicAlgorithms()) {\n"
        "    histogram_deterministic<input_t, at::acc_type<input_t, /*is_cuda=*/true>>(\n"
        "        output, self.contiguous(), Tensor(), nbins, minvalue, maxvalue, /*by_value=*/false);\n"
        "    return output;\n"
        "  }\n"
        "  globalContext().alertNotDeterministic(\"_histc_cuda\");\n"
        "  cuda::CUDA_tensor_histogram<input_t, input_t, false>(\n")
    return src


def t_bincount(src):
    src = defer_alert(src, "_bincount_cuda", "_bincount_cuda_template")
    src = replace_once(
        src,
        "  const bounds_t maxvalue = nbins;\n",
        "  const bounds_t maxvalue = nbins;\n" +
        note("  ", "integer counts; weights as 64-bit fixed point") +
        "  if (globalContext().deterministicAlgorithms()) {\n"
        "    Tensor det_output = has_weights ? at::empty({nbins}, weights.options())\n"
        "                                    : at::empty({nbins}, self.options().dtype(kLong));\n"
        "    histogram_deterministic<input_t, bounds_t>(\n"
        "        det_output, self.contiguous(), has_weights ? weights.contiguous() : Tensor(), nbins,\n"
        "        minvalue, maxvalue, /*by_value=*/true);\n"
        "    return det_output;\n"
        "  }\n"
        "  globalContext().alertNotDeterministic(\"_bincount_cuda\");\n")
    return src


# --- Sorting.h / Sorting.cu / Sorting.cpp: kthvalue (PT-0219), median (PT-0220) -------------------
def t_sorting_h(src):
    return replace_once(
        src,
        "    const TensorBase &in, int64_t dim, bool ignore_nan);\n",
        "    const TensorBase &in, int64_t dim, bool ignore_nan);\n"
        "// Deterministic kthvalue (mode 0, k 1-based), median (1) and nanmedian (2): values and\n"
        "// indices contiguous, self contiguous. False (nothing launched) when the sizes exceed\n"
        "// the kernel's 32-bit counters.\n"
        "bool launch_select_deterministic(\n"
        "    const TensorBase &values, const TensorBase &indices,\n"
        "    const TensorBase &self, int64_t dim, int64_t k, int mode);\n")


def t_sorting_cu(src):
    src = add_includes(src, "#include <ATen/cuda/CUDAContext.h>\n")
    src = replace_once(src, "namespace at {\nnamespace native {\n\nnamespace {\n",
                       "namespace at {\nnamespace native {\n\n" + block(["det_common", "det_order_select"]) +
                       "namespace {\n")
    src = replace_once(
        src, "} // namespace native\n} // namespace at\n",
        "bool launch_select_deterministic(\n"
        "    const TensorBase &values, const TensorBase &indices,\n"
        "    const TensorBase &self, int64_t dim, int64_t k, int mode) {\n"
        "  return select_deterministic(values, indices, self, dim, k, mode);\n"
        "}\n\n"
        "} // namespace native\n} // namespace at\n")
    return src


SELECT_HELPER = """\
// The deterministic kthvalue/median kernel writes one element per slice, in slice
// order; outputs that are not contiguous go through contiguous scratch.
bool select_deterministic_cuda(
    const Tensor& values,
    const Tensor& indices,
    const Tensor& self,
    int64_t dim,
    int64_t k,
    int mode) {
  const bool direct = values.is_contiguous() && indices.is_contiguous();
  Tensor v = direct ? values : at::empty(values.sizes(), values.options());
  Tensor ix = direct ? indices : at::empty(indices.sizes(), indices.options());
  if (!launch_select_deterministic(v, ix, self, dim, k, mode)) {
    return false;
  }
  if (!direct) {
    values.copy_(v);
    indices.copy_(ix);
  }
  return true;
}

"""


def t_sorting_cpp_kth(src):
    src = replace_once(src, "#include <ATen/ops/full.h>\n", "#include <ATen/ops/empty.h>\n#include <ATen/ops/full.h>\n")
    src = replace_once(src, "namespace at {\nnamespace native {\nnamespace {\n\n",
                       "namespace at {\nnamespace native {\nnamespace {\n\n" + SELECT_HELPER)
    src = replace_once(
        src,
        "  // If there are duplicate elements of the kth value, the procedure for choosing which\n"
        "  // of the duplicates to use for the indices output is nondeterministic.\n"
        "  at::globalContext().alertNotDeterministic(\"kthvalue CUDA\");\n",
        "  // If there are duplicate elements of the kth value, the procedure for choosing which\n"
        "  // of the duplicates to use for the indices output is nondeterministic: see\n"
        "  // kthvalue_out_impl_cuda.\n")
    src = replace_once(
        src,
        "  if (self.numel() != 0) {\n    launch_kthvalue_kernel(values, indices, self, dim, k);\n  }\n",
        "  if (self.numel() != 0) {\n" +
        note("    ", "the rank-k element of the order of (value, index)") +
        "    if (!(globalContext().deterministicAlgorithms() &&\n"
        "          select_deterministic_cuda(values, indices, self, dim, k, /*mode=*/0))) {\n"
        "      at::globalContext().alertNotDeterministic(\"kthvalue CUDA\");\n"
        "      launch_kthvalue_kernel(values, indices, self, dim, k);\n"
        "    }\n"
        "  }\n")
    return src


def t_sorting_cpp_median(src):
    src = replace_once(
        src,
        "  // of the duplicates to use for the indices output is nondeterministic.\n"
        "  at::globalContext().alertNotDeterministic(\"median CUDA with indices output\");\n",
        "  // of the duplicates to use for the indices output is nondeterministic: see below.\n")
    src = replace_once(
        src,
        "    launch_median_kernel(vals, inds, in, dim, ignore_nan);\n",
        note("    ", "the CPU's rule: the first NaN, else the middle of (value, index)") +
        "    if (!(globalContext().deterministicAlgorithms() &&\n"
        "          select_deterministic_cuda(vals, inds, in, dim, 0, ignore_nan ? /*nanmedian*/ 2 : /*median*/ 1))) {\n"
        "      at::globalContext().alertNotDeterministic(\"median CUDA with indices output\");\n"
        "      launch_median_kernel(vals, inds, in, dim, ignore_nan);\n"
        "    }\n")
    return src


# --- ScanKernels.h / CumsumKernel.cu / ScanKernels.cpp: cumsum (PT-0221) ----------------------------
def t_scan_h(src):
    return replace_once(
        src,
        "void launch_cumsum_cuda_kernel(const TensorBase& result, const TensorBase& self, int64_t dim);\n",
        "void launch_cumsum_cuda_kernel(const TensorBase& result, const TensorBase& self, int64_t dim);\n"
        "// Deterministic cumsum (fixed association): result and self contiguous, real floating (or\n"
        "// integer) types; pairs: complex viewed as real, the last dim holding the two parts.\n"
        "void launch_cumsum_deterministic_cuda_kernel(const TensorBase& result, const TensorBase& self,\n"
        "                                             int64_t dim, bool pairs);\n")


def t_cumsum_cu(src):
    src = add_includes(src, "#include <ATen/Dispatch.h>\n", extra=["#include <ATen/cuda/CUDAContext.h>"])
    src = replace_once(src, "namespace at { namespace native {\n\n",
                       "namespace at { namespace native {\n\n" + block(["det_common", "det_scan"]))
    src = replace_once(
        src, "}} // namespace at::native\n",
        "void launch_cumsum_deterministic_cuda_kernel(const TensorBase& result, const TensorBase& self,\n"
        "                                             int64_t dim, bool pairs) {\n"
        "  cumsum_deterministic(result, self, dim, pairs);\n"
        "}\n\n"
        "}} // namespace at::native\n")
    return src


def t_scan_cpp(src):
    src = replace_once(src, "#include <ATen/ops/empty_like.h>\n",
                       "#include <ATen/ops/empty_like.h>\n#include <ATen/ops/view_as_real.h>\n")
    src = replace_once(
        src,
        "    // See Note [Writing Nondeterministic Operations]\n"
        "    // Issue reporting nondeterministic behavior: https://github.com/pytorch/pytorch/issues/75240\n"
        "    globalContext().alertNotDeterministic(\"cumsum_cuda_kernel\");\n"
        "  }\n",
        "    // See Note [Writing Nondeterministic Operations]\n"
        "    // Issue reporting nondeterministic behavior: https://github.com/pytorch/pytorch/issues/75240\n"
        "    // Under torch.use_deterministic_algorithms(True) a scan of fixed association is used.\n"
        "    if (globalContext().deterministicAlgorithms()) {\n"
        "      auto result_ = contiguous_out_arg(result);\n"
        "      const Tensor self_ = self.contiguous();\n"
        "      if (self_.is_complex()) {\n"
        "        launch_cumsum_deterministic_cuda_kernel(at::view_as_real(*result_), at::view_as_real(self_), dim,\n"
        "                                                /*pairs=*/true);\n"
        "      } else {\n"
        "        launch_cumsum_deterministic_cuda_kernel(*result_, self_, dim, /*pairs=*/false);\n"
        "      }\n"
        "      if (!result.is_same(*result_)) {\n"
        "        result.copy_(*result_);\n"
        "      }\n"
        "      return;\n"
        "    }\n"
        "    globalContext().alertNotDeterministic(\"cumsum_cuda_kernel\");\n"
        "  }\n")
    return src


# --- the patches ------------------------------------------------------------------------------------
COMMON_TAIL = """\
The kernel text comes unchanged from harness/deterministic_backward
(det_accumulate.cuh, det_kernels_reductions.cuh) in the patcher
repository, where it was built as a torch 2.11 extension and proved on an
NVIDIA H200: bitwise identical over 25 repeats in every case, error
against an fp64 reference, time against torch's kernel, and a metric
pipeline run twice through the dispatcher with the flag on ({ev}).
test_nondeterministic_alert_{alert_test} (test/test_torch.py) expected
the alert on CUDA; it now expects none.
"""

PATCHES = [
    dict(
        file="0217-deterministic-histc.patch", pid="PT-0217",
        subject="Deterministic CUDA histc",
        files={CUDA + "SummaryOps.cu": t_histc,
               TEST: test_expectation(
                   "                lambda: op_call(a, min=0, max=3),\n"
                   "                '_histc_cuda',\n"
                   "                torch.device(device).type == 'cuda')\n",
                   "                lambda: op_call(a, min=0, max=3),\n"
                   "                '_histc_cuda',\n"
                   "                False)  # deterministic kernel under the flag (patcher PT-0217)\n")},
        bug=ISSUES + "75240", probe="determinism.histc", alert_test="histc",
        tests='test_reductions.py -k "histc", test_torch.py -k "nondeterministic_alert_histc"',
        body="""\
histc on CUDA adds into its bins with float atomics (block-private
shared-memory bins, then atomics into the output), and under
torch.use_deterministic_algorithms(True) it raises "_histc_cuda does not
have a deterministic implementation". The counts are integers, so only
bins above 2^24 (float) can round differently with the order.

Under the flag, count in integers: each value's bin is computed with the
same arithmetic as the atomic kernel (values outside [min, max] and NaN
are skipped, the last bin is closed), counts are kept per block in
shared uint64 bins (a warp whose 32 values share a bin adds once),
added into a global uint64 buffer and converted to the output dtype
once. Integer sums do not depend on order, so the result is bitwise the
same on every run and GPU, and exact (a float bin above 2^24 is the
correctly rounded count). Without the flag the atomic kernel stays.
"""),
    dict(
        file="0218-deterministic-bincount.patch", pid="PT-0218",
        subject="Deterministic CUDA bincount, with and without weights",
        files={CUDA + "SummaryOps.cu": t_bincount,
               TEST: test_expectation(
                   "                lambda: op_call(a),\n"
                   "                '_bincount_cuda',\n"
                   "                torch.device(device).type == 'cuda')\n",
                   "                lambda: op_call(a),\n"
                   "                '_bincount_cuda',\n"
                   "                False)  # deterministic kernel under the flag (patcher PT-0218)\n")},
        bug="none", probe="determinism.bincount, determinism.bincount_unweighted", alert_test="bincount",
        tests='test_reductions.py -k "bincount", test_torch.py -k "nondeterministic_alert_bincount"',
        body="""\
bincount on CUDA adds weights into their bins with float atomics, so the
weighted result changes between runs, and under
torch.use_deterministic_algorithms(True) the op raises "_bincount_cuda
does not have a deterministic implementation" (1.13.1 raises for the
unweighted count too).

Under the flag, use PT-0217's histogram kernel with the value as bin:
unweighted, integer counts; weighted, each weight becomes a 64-bit
fixed-point integer (the deterministic accumulation primitive of
PT-0210: scale 2^(62 - e - L) from the largest finite |weight| < 2^e,
found on the device, L = ceil(log2 n) since at most n weights reach one
bin, so no sum can overflow) added with integer atomics, associative,
then converted once; inf/NaN weights are added separately, which is
order-independent too. Requires PT-0217 (the kernels it adds to
SummaryOps.cu). Without the flag the atomic kernel stays.
"""),
    dict(
        file="0219-deterministic-kthvalue.patch", pid="PT-0219",
        subject="Deterministic CUDA kthvalue",
        files={CUDA + "Sorting.h": t_sorting_h, CUDA + "Sorting.cu": t_sorting_cu,
               CUDA + "Sorting.cpp": t_sorting_cpp_kth,
               TEST: test_expectation(
                   "                lambda: test_func('function'),\n"
                   "                'kthvalue CUDA',\n"
                   "                torch.device(device).type == 'cuda')\n",
                   "                lambda: test_func('function'),\n"
                   "                'kthvalue CUDA',\n"
                   "                False)  # deterministic kernel under the flag (patcher PT-0219)\n")},
        bug="none", probe="determinism.kthvalue", alert_test="kthvalue",
        tests='test_sort_and_select.py -k "kthvalue", test_torch.py -k "nondeterministic_alert_kthvalue"',
        body="""\
kthvalue on CUDA finds the k-th value by radix selection and then lets
whichever thread sees an equal element write its index: with repeated
values the index changes between runs, and under
torch.use_deterministic_algorithms(True) the op raises "kthvalue CUDA
does not have a deterministic implementation".

Under the flag, return the element of rank k in the order of (value,
index): values ascending, NaN above every number, -0.0 equal to +0.0,
equal values by position. One block per slice runs an 8-bit MSB-first
radix select on an order-preserving unsigned key (exact integer counts
in shared memory), then counts the matching elements in index order
with warp ballots and takes the k'-th; the value returned is the input
element at that index. Slices or counts beyond 32 bits keep the alert.
Without the flag the racing kernel stays.
"""),
    dict(
        file="0220-deterministic-median-indices.patch", pid="PT-0220",
        subject="Deterministic CUDA median/nanmedian with indices, ties as on the CPU",
        files={CUDA + "Sorting.cpp": t_sorting_cpp_median,
               TEST: test_expectation(
                   "        is_cuda = torch.device(device).type == 'cuda'\n\n"
                   "        test_func_expect_error('function', False)\n",
                   "        is_cuda = False  # deterministic kernel under the flag (patcher PT-0220)\n\n"
                   "        test_func_expect_error('function', False)\n")},
        bug="none", probe="determinism.median_indices", alert_test="median",
        tests='test_reductions.py -k "median", test_torch.py -k "nondeterministic_alert_median"',
        body="""\
median and nanmedian with a dim on CUDA select the middle value and then
let a racing thread pick which of the equal elements supplies the index,
and under torch.use_deterministic_algorithms(True) they raise "median
CUDA with indices output does not have a deterministic implementation".

Under the flag, use PT-0219's selection kernel with the CPU's rule: the
CPU kernel partitions with the comparator (value, then index), so among
equal values the index is the one a stable sort puts in the middle;
median returns the first NaN when the slice holds one; nanmedian takes
the middle of the non-NaN values. The CUDA result is then bitwise the
CPU's, values and indices. Requires PT-0219. Without the flag the racing
kernel stays.
"""),
    dict(
        file="0221-deterministic-cumsum.patch", pid="PT-0221",
        subject="Deterministic CUDA cumsum on floating and complex types",
        files={CUDA + "ScanKernels.h": t_scan_h, CUDA + "CumsumKernel.cu": t_cumsum_cu,
               CUDA + "ScanKernels.cpp": t_scan_cpp,
               TEST: test_expectation(
                   "        should_alert = torch.device(device).type == 'cuda' and (dtype.is_floating_point or dtype.is_complex)\n",
                   "        should_alert = False  # deterministic kernel under the flag (patcher PT-0221)\n")},
        bug=ISSUES + "75240", probe="determinism.cumsum, determinism.cumsum_complex", alert_test="cumsum",
        tests='test_reductions.py -k "cumsum", test_torch.py -k "test_cumsum or nondeterministic_alert_cumsum"',
        body="""\
cumsum of a 1-D floating or complex CUDA tensor goes through a
decoupled look-back scan whose association depends on which tiles have
published their sums when a tile looks back, so the float result changes
between runs, and under torch.use_deterministic_algorithms(True) cumsum
raises "cumsum_cuda_kernel does not have a deterministic implementation"
for floating and complex types.

Under the flag, scan with a fixed association: rows (and complex rows,
real and imaginary parts together) are cut into tiles of 256 threads x 8
elements; each thread adds its elements in order, a block scan with fixed
trees gives each thread its offset, and rows of several tiles first scan
their tile sums (one block per row, chunk by chunk). A dim other than the
last is scanned by one thread per column in order. Sums are kept in
double for float and double, in float for half and bfloat16, and rounded
once per element. The association depends only on the position and two
constants, never on the grid or the GPU. Without the flag the look-back
scan stays.
"""),
]


def message(spec):
    return common.commit_message(spec["subject"], spec["body"],
                                 COMMON_TAIL.format(ev=EVIDENCE, alert_test=spec["alert_test"]),
                                 common.trailers(spec["pid"], spec["bug"], spec["probe"], spec["tests"]))


def main():
    args = common.parse_args()
    common.make_after_series(args.tree, args.out,
                             [(spec["file"], spec["files"], message(spec)) for spec in PATCHES])
    return 0


if __name__ == "__main__":
    sys.exit(main())
