// Harness bindings for issue 18's scatter_reduce / scatter(reduce=) / index_reduce kernels:
// Tensor-level wrappers with the aten schemas of torch 2.11 (callable from Python directly, to
// compare with torch's own kernels in one process) and registered into the dispatcher for the
// CUDA key on request (register_aten_cuda()). The argument checks mirror torch's meta functions
// (scatter_meta_impl, index_func_meta_impl). Scatter accumulates half/bfloat16 in float and
// rounds once (torch 2.11's CPU scatter kernels); index_reduce rounds per step (its CPU kernel);
// the 1.13.1 patches round per step for both (1.13.1's CPU kernels).
#include <torch/extension.h>
#include <torch/library.h>

#include <ATen/WrapDimUtils.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>
#include "det_register.h"

void detbw18c_scatter_reduce(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                             int64_t op, bool include_self, bool opmath);
void detbw18c_index_reduce(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                           int64_t op, bool include_self);

using at::Tensor;

constexpr int64_t kSum = 0, kProd = 1, kMean = 2, kMax = 3, kMin = 4;  // det_gather_reduce's kDetGr*

static void check_dtype(const Tensor& t, const char* op) {
  const auto st = t.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16 ||
                  at::isIntegralType(st, /*includeBool=*/false),
              op, ": the deterministic CUDA kernel does not support dtype ", st);
}

static int64_t scatter_two_op(std::string_view reduce) {
  if (reduce == "sum") return kSum;
  if (reduce == "prod") return kProd;
  if (reduce == "mean") return kMean;
  if (reduce == "amax") return kMax;
  if (reduce == "amin") return kMin;
  TORCH_CHECK(false, "reduce argument must be either sum, prod, mean, amax or amin, got ", reduce);
}

static int64_t scatter_old_op(std::string_view reduce) {
  if (reduce == "add") return kSum;
  if (reduce == "multiply") return kProd;
  TORCH_CHECK(false, "reduce argument must be either add or multiply, got ", reduce);
}

static int64_t index_reduce_op(std::string_view reduce) {
  if (reduce == "prod") return kProd;
  if (reduce == "mean") return kMean;
  if (reduce == "amax") return kMax;
  if (reduce == "amin") return kMin;
  TORCH_CHECK(false, "index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got ", reduce, ".");
}

// scatter_gather_dtype_check + scatter_shape_check (ScatterGatherChecks.h)
static int64_t scatter_checks(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  const int64_t wrapped = at::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK(index.scalar_type() == at::kLong, "scatter(): Expected dtype int64 for index");
  TORCH_CHECK(self.scalar_type() == src.scalar_type(), "scatter(): Expected self.dtype to be equal to src.dtype");
  check_dtype(self, "scatter");
  if (index.numel() == 0) return wrapped;
  const int64_t nd = std::max<int64_t>(self.dim(), 1);
  TORCH_CHECK(std::max<int64_t>(index.dim(), 1) == nd && std::max<int64_t>(src.dim(), 1) == nd,
              "Index tensor must have the same number of dimensions as self tensor");
  for (int64_t d = 0; d < index.dim(); ++d) {
    TORCH_CHECK(index.size(d) <= src.size(d), "Expected index ", index.sizes(), " to be smaller than self ",
                self.sizes(), " apart from dimension ", wrapped, " and to be smaller size than src ", src.sizes());
    if (d != wrapped) {
      TORCH_CHECK(index.size(d) <= self.size(d), "Expected index ", index.sizes(), " to be smaller than self ",
                  self.sizes(), " apart from dimension ", wrapped, " and to be smaller size than src ", src.sizes());
    }
  }
  return wrapped;
}

// --- scatter_reduce.two ------------------------------------------------------------------------
Tensor& det_scatter_reduce_two_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                                std::string_view reduce, bool include_self) {
  const int64_t d = scatter_checks(self, dim, index, src);
  detbw18c_scatter_reduce(self, d, index, src, scatter_two_op(reduce), include_self, /*opmath=*/true);
  return self;
}

Tensor& det_scatter_reduce_two_out(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                                   std::string_view reduce, bool include_self, Tensor& out) {
  const int64_t d = scatter_checks(self, dim, index, src);
  const int64_t op = scatter_two_op(reduce);
  if (!out.is_same(self)) {
    out.resize_(self.sizes());
    out.copy_(self);
  }
  detbw18c_scatter_reduce(out, d, index, src, op, include_self, /*opmath=*/true);
  return out;
}

Tensor det_scatter_reduce_two(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                              std::string_view reduce, bool include_self) {
  Tensor out = self.clone(at::MemoryFormat::Contiguous);
  return det_scatter_reduce_two_(out, dim, index, src, reduce, include_self);
}

// --- scatter.reduce (reduce="add" / "multiply") ---------------------------------------------------
Tensor& det_scatter_reduce_old_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                                std::string_view reduce) {
  const int64_t d = scatter_checks(self, dim, index, src);
  detbw18c_scatter_reduce(self, d, index, src, scatter_old_op(reduce), /*include_self=*/true, /*opmath=*/true);
  return self;
}

Tensor& det_scatter_reduce_old_out(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                                   std::string_view reduce, Tensor& out) {
  const int64_t d = scatter_checks(self, dim, index, src);
  const int64_t op = scatter_old_op(reduce);
  if (!out.is_same(self)) {
    out.resize_(self.sizes());
    out.copy_(self);
  }
  detbw18c_scatter_reduce(out, d, index, src, op, /*include_self=*/true, /*opmath=*/true);
  return out;
}

Tensor det_scatter_reduce_old(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                              std::string_view reduce) {
  Tensor out = self.clone(at::MemoryFormat::Contiguous);
  return det_scatter_reduce_old_(out, dim, index, src, reduce);
}

// --- index_reduce ------------------------------------------------------------------------------------
static int64_t index_reduce_checks(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source) {
  const int64_t wrapped = at::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK_INDEX(index.dim() <= 1, "index_reduce_(): Index is supposed to be a vector");
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "index_reduce_(): Expected dtype int32/int64 for index but got: ", index.scalar_type());
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "index_reduce_(): self (", self.scalar_type(),
              ") and source (", source.scalar_type(), ") must have the same scalar type");
  check_dtype(self, "index_reduce");
  TORCH_CHECK(wrapped == 0 || wrapped < source.dim(), "index_reduce_(): Indexing dim ", wrapped,
              " is out of bounds of the source tensor with dim ", source.dim());
  TORCH_CHECK(index.numel() == (source.dim() == 0 ? 1 : source.size(wrapped)),
              "index_reduce_(): Number of indices (", index.numel(), ") should be equal to source.size(dim)");
  if (self.dim() > 0 && source.dim() > 0) {
    TORCH_CHECK(self.dim() == source.dim(), "index_reduce_(): self and source must have the same number of dims");
    for (int64_t d = 0; d < self.dim(); ++d) {
      TORCH_CHECK(d == wrapped || self.size(d) == source.size(d),
                  "index_reduce_(): source slice shape must match self's");
    }
  }
  return wrapped;
}

Tensor& det_index_reduce_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                          std::string_view reduce, bool include_self) {
  const int64_t d = index_reduce_checks(self, dim, index, source);
  detbw18c_index_reduce(self, d, index, source, index_reduce_op(reduce), include_self);
  return self;
}

Tensor& det_index_reduce_out(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                             std::string_view reduce, bool include_self, Tensor& out) {
  const int64_t d = index_reduce_checks(self, dim, index, source);
  const int64_t op = index_reduce_op(reduce);
  if (!out.is_same(self)) {
    out.resize_(self.sizes());
    out.copy_(self);
  }
  detbw18c_index_reduce(out, d, index, source, op, include_self);
  return out;
}

Tensor det_index_reduce(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                        std::string_view reduce, bool include_self) {
  Tensor out = self.clone(at::MemoryFormat::Contiguous);
  return det_index_reduce_(out, dim, index, source, reduce, include_self);
}

// --- pybind: out-of-place calls; opmath=false gives torch 1.13.1's per-step rounding for scatter ----
Tensor py_scatter_reduce(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                         const std::string& reduce, bool include_self, bool opmath) {
  Tensor out = self.clone(at::MemoryFormat::Contiguous);
  const int64_t d = scatter_checks(out, dim, index, src);
  detbw18c_scatter_reduce(out, d, index, src, scatter_two_op(reduce), include_self, opmath);
  return out;
}

Tensor py_scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, const std::string& reduce,
                  bool opmath) {
  Tensor out = self.clone(at::MemoryFormat::Contiguous);
  const int64_t d = scatter_checks(out, dim, index, src);
  detbw18c_scatter_reduce(out, d, index, src, scatter_old_op(reduce), true, opmath);
  return out;
}

Tensor py_index_reduce(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source,
                       const std::string& reduce, bool include_self) {
  return det_index_reduce(self, dim, index, source, reduce, include_self);
}

// in place on a tensor of any strides (the harness's non-contiguous cases)
void py_scatter_reduce_inplace(Tensor self, int64_t dim, const Tensor& index, const Tensor& src,
                               const std::string& reduce, bool include_self) {
  det_scatter_reduce_two_(self, dim, index, src, reduce, include_self);
}

void py_index_reduce_inplace(Tensor self, int64_t dim, const Tensor& index, const Tensor& source,
                             const std::string& reduce, bool include_self) {
  det_index_reduce_(self, dim, index, source, reduce, include_self);
}

// --- dispatcher registration ---------------------------------------------------------------------
// (det_register.h: on request, every refusal reported)
static std::unique_ptr<torch::Library> g_lib;  // this extension's registration

std::vector<std::string> register_aten_cuda() {
  return detbw_register_aten_cuda(g_lib, __FILE__, __LINE__, [](DetbwRegistrar& r) {
    r.impl("scatter_reduce.two", TORCH_FN(det_scatter_reduce_two));
    r.impl("scatter_reduce_.two", TORCH_FN(det_scatter_reduce_two_));
    r.impl("scatter_reduce.two_out", TORCH_FN(det_scatter_reduce_two_out));
    r.impl("scatter.reduce", TORCH_FN(det_scatter_reduce_old));
    r.impl("scatter_.reduce", TORCH_FN(det_scatter_reduce_old_));
    r.impl("scatter.reduce_out", TORCH_FN(det_scatter_reduce_old_out));
    r.impl("index_reduce", TORCH_FN(det_index_reduce));
    r.impl("index_reduce_", TORCH_FN(det_index_reduce_));
    r.impl("index_reduce.out", TORCH_FN(det_index_reduce_out));
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scatter_reduce", &py_scatter_reduce);
  m.def("scatter", &py_scatter);
  m.def("index_reduce", &py_index_reduce);
  m.def("scatter_reduce_inplace", &py_scatter_reduce_inplace);
  m.def("index_reduce_inplace", &py_index_reduce_inplace);
  m.def("register_aten_cuda", &register_aten_cuda);
}
