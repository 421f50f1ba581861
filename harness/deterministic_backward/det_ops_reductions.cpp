// Harness bindings for issue 18's histogram, order-statistic and scan kernels:
// Tensor-level wrappers with the aten schemas of torch 2.11 (callable from Python
// directly, to compare with torch's own kernels in one process) and registered into
// the dispatcher for the CUDA key on request (register_aten_cuda()). The argument
// checks and allocation mirror what the patched torch 1.13.1 callers do.
#include <torch/extension.h>
#include <torch/library.h>

#include <ATen/WrapDimUtils.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>
#include "det_register.h"

void detbw18b_histc(const at::TensorBase& out, const at::TensorBase& in, int64_t nbins, double lo, double hi);
void detbw18b_bincount(const at::TensorBase& out, const at::TensorBase& in, const at::TensorBase& weights,
                       int64_t nbins);
bool detbw18b_select(const at::TensorBase& values, const at::TensorBase& indices, const at::TensorBase& in,
                     int64_t dim, int64_t k, int64_t mode);
void detbw18b_cumsum(const at::TensorBase& result, const at::TensorBase& self, int64_t dim, bool pairs);

using at::Tensor;

constexpr int64_t kKth = 0, kMedian = 1, kNanMedian = 2;  // det_order_select's modes

// --- histc (1.13.1's _histc_cuda / _histc_cuda_template) ----------------------------------
static Tensor det_histc_impl(const Tensor& self, int64_t nbins, double min, double max) {
  TORCH_CHECK(self.scalar_type() != at::kHalf, "HalfTensor is not supported");
  TORCH_CHECK(nbins > 0, "bins must be > 0");
  Tensor out = at::empty({nbins}, self.options().memory_format(at::MemoryFormat::Contiguous));
  double lo = min, hi = max;
  if (min == max && self.numel() > 0) {
    lo = self.min().item<double>();
    hi = self.max().item<double>();
  }
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  TORCH_CHECK(std::isfinite(lo) && std::isfinite(hi), "range of [", lo, ", ", hi, "] is not finite");
  TORCH_CHECK(lo < hi, "max must be larger than min");
  detbw18b_histc(out, self.contiguous(), nbins, lo, hi);
  return out;
}

Tensor det_histc(const Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  return det_histc_impl(self, bins, min.toDouble(), max.toDouble());
}

Tensor& det_histc_out(const Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max, Tensor& out) {
  Tensor r = det_histc(self, bins, min, max);
  out.resize_(r.sizes());
  out.copy_(r);
  return out;
}

Tensor det_histc_py(const Tensor& self, int64_t bins, double min, double max) { return det_histc_impl(self, bins, min, max); }

// --- bincount (1.13.1's _bincount_cuda / _bincount_cuda_template) ------------------------
Tensor det_bincount(const Tensor& self, const std::optional<Tensor>& weights_opt, int64_t minlength) {
  TORCH_CHECK(minlength >= 0, "minlength should be >= 0");
  TORCH_CHECK(at::isIntegralType(self.scalar_type(), /*includeBool=*/false),
              "bincount only supports 1-d non-negative integral inputs.");
  if (self.dim() == 1 && self.numel() == 0) {
    return at::zeros({minlength}, self.options().dtype(at::kLong));
  }
  TORCH_CHECK(self.dim() == 1 && (self.scalar_type() == at::kByte || self.min().item<int64_t>() >= 0),
              "bincount only supports 1-d non-negative integral inputs.");
  const bool has_weights = weights_opt.has_value() && weights_opt->defined();
  Tensor weights;
  if (has_weights) {
    weights = *weights_opt;
    TORCH_CHECK(weights.dim() == 1 && weights.size(0) == self.size(0),
                "weights should be 1-d and have the same length as input");
    weights = (weights.scalar_type() == at::kFloat ? weights : weights.to(at::kDouble)).contiguous();
  }
  const int64_t nbins = std::max(self.max().item<int64_t>() + 1, minlength);
  Tensor out = at::empty({nbins}, has_weights ? weights.options() : self.options().dtype(at::kLong));
  detbw18b_bincount(out, self.contiguous(), weights, nbins);
  return out;
}

// --- kthvalue / median / nanmedian with indices ---------------------------------------------
static std::tuple<Tensor&, Tensor&> det_select_out(const Tensor& self, int64_t k, int64_t dim_, bool keepdim,
                                               Tensor& values, Tensor& indices, int64_t mode) {
  const int64_t dim = at::maybe_wrap_dim(dim_, self.dim());
  const int64_t n = self.dim() == 0 ? 1 : self.size(dim);
  TORCH_CHECK(self.numel() > 0, "select: empty input");
  if (mode == kKth) {
    TORCH_CHECK(k >= 1 && k <= n, "kthvalue(): selected number k out of range for dimension ", dim);
  }
  const Tensor in = self.dim() == 0 ? self.reshape({1}).contiguous() : self.contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[self.dim() == 0 ? 0 : dim] = 1;
  std::vector<int64_t> final_shape = self.sizes().vec();
  if (self.dim() > 0) {
    if (keepdim) {
      final_shape[dim] = 1;
    } else {
      final_shape.erase(final_shape.begin() + dim);
    }
  }
  values.resize_(final_shape);
  indices.resize_(final_shape);
  // the kernel writes one element per slice in slice order: any contiguous layout of the
  // reduced shape is that order
  const bool direct = values.is_contiguous() && indices.is_contiguous();
  Tensor v = direct ? values : at::empty(final_shape, in.options());
  Tensor ix = direct ? indices : at::empty(final_shape, in.options().dtype(at::kLong));
  TORCH_CHECK(detbw18b_select(v, ix, in, self.dim() == 0 ? 0 : dim, k, mode),
              "select: sizes beyond the deterministic kernel's 32-bit counters");
  if (!direct) {
    values.copy_(v);
    indices.copy_(ix);
  }
  return std::forward_as_tuple(values, indices);
}

std::tuple<Tensor&, Tensor&> det_kthvalue_out(const Tensor& self, int64_t k, int64_t dim, bool keepdim, Tensor& values,
                                          Tensor& indices) {
  return det_select_out(self, k, dim, keepdim, values, indices, kKth);
}
std::tuple<Tensor&, Tensor&> det_median_out(const Tensor& self, int64_t dim, bool keepdim, Tensor& values,
                                        Tensor& indices) {
  return det_select_out(self, 0, dim, keepdim, values, indices, kMedian);
}
std::tuple<Tensor&, Tensor&> det_nanmedian_out(const Tensor& self, int64_t dim, bool keepdim, Tensor& values,
                                           Tensor& indices) {
  return det_select_out(self, 0, dim, keepdim, values, indices, kNanMedian);
}

static std::tuple<Tensor, Tensor> det_select_py(const Tensor& self, int64_t k, int64_t dim, bool keepdim, int64_t mode) {
  Tensor v = at::empty({0}, self.options());
  Tensor ix = at::empty({0}, self.options().dtype(at::kLong));
  det_select_out(self, k, dim, keepdim, v, ix, mode);
  return std::make_tuple(v, ix);
}
std::tuple<Tensor, Tensor> det_kthvalue_py(const Tensor& self, int64_t k, int64_t dim, bool keepdim) {
  return det_select_py(self, k, dim, keepdim, kKth);
}
std::tuple<Tensor, Tensor> det_median_py(const Tensor& self, int64_t dim, bool keepdim) {
  return det_select_py(self, 0, dim, keepdim, kMedian);
}
std::tuple<Tensor, Tensor> det_nanmedian_py(const Tensor& self, int64_t dim, bool keepdim) {
  return det_select_py(self, 0, dim, keepdim, kNanMedian);
}

// --- cumsum ------------------------------------------------------------------------------------
static void det_cumsum_into(const Tensor& self_, int64_t dim_, const Tensor& out) {
  const Tensor self = self_.to(out.scalar_type());
  if (self.dim() == 0) {
    out.fill_(self);
    return;
  }
  if (self.numel() == 0) {
    out.zero_();
    return;
  }
  const int64_t dim = at::maybe_wrap_dim(dim_, self.dim());
  const bool direct = out.is_contiguous();
  Tensor res = direct ? out : at::empty(out.sizes(), out.options());
  const Tensor x = self.contiguous();
  if (x.is_complex()) {
    detbw18b_cumsum(at::view_as_real(res), at::view_as_real(x), dim, /*pairs=*/true);
  } else {
    detbw18b_cumsum(res, x, dim, /*pairs=*/false);
  }
  if (!direct) {
    out.copy_(res);
  }
}

static at::ScalarType det_cumsum_dtype(const Tensor& self, std::optional<at::ScalarType> dtype) {
  if (dtype.has_value()) return *dtype;
  return at::isIntegralType(self.scalar_type(), /*includeBool=*/true) ? at::kLong : self.scalar_type();
}

Tensor det_cumsum(const Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  Tensor out = at::empty(self.sizes(), self.options().dtype(det_cumsum_dtype(self, dtype)));
  det_cumsum_into(self, dim, out);
  return out;
}

Tensor& det_cumsum_out(const Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype, Tensor& out) {
  out.resize_(self.sizes());
  det_cumsum_into(self, dim, out);
  return out;
}

Tensor det_cumsum_py(const Tensor& self, int64_t dim) { return det_cumsum(self, dim, std::nullopt); }

// --- dispatcher registration ---------------------------------------------------------------------
// (det_register.h: on request, every refusal reported)
static std::unique_ptr<torch::Library> g_lib;  // this extension's registration

std::vector<std::string> register_aten_cuda() {
  return detbw_register_aten_cuda(g_lib, __FILE__, __LINE__, [](DetbwRegistrar& r) {
    r.impl("histc", TORCH_FN(det_histc));
    r.impl("histc.out", TORCH_FN(det_histc_out));
    r.impl("bincount", TORCH_FN(det_bincount));
    r.impl("kthvalue.values", TORCH_FN(det_kthvalue_out));
    r.impl("median.dim_values", TORCH_FN(det_median_out));
    r.impl("nanmedian.dim_values", TORCH_FN(det_nanmedian_out));
    r.impl("cumsum", TORCH_FN(det_cumsum));
    r.impl("cumsum.out", TORCH_FN(det_cumsum_out));
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("histc", &det_histc_py);
  m.def("bincount", &det_bincount);
  m.def("kthvalue", &det_kthvalue_py);
  m.def("median", &det_median_py);
  m.def("nanmedian", &det_nanmedian_py);
  m.def("cumsum", &det_cumsum_py);
  m.def("register_aten_cuda", &register_aten_cuda);
}
