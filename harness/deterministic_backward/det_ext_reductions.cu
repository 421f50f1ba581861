// Harness-side CUDA translation unit for issue 18's histogram, order-statistic
// and scan kernels: the includes the torch 1.13.1 target files have, then
// det_accumulate.cuh and det_kernels_reductions.cuh unchanged (the text the
// patches carry).
#include <ATen/core/TensorBase.h>
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/Atomic.cuh>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace detbw18b {
#include "det_accumulate.cuh"
#include "det_kernels_reductions.cuh"
}  // namespace detbw18b

// Entry points for det_ops_reductions.cpp (tensors are allocated there).

// histc: the bounds as 1.13.1's _histc_cuda_template holds them (input_t, then the
// accumulate type of the kernel's signature).
void detbw18b_histc(const at::TensorBase& out, const at::TensorBase& in, int64_t nbins, double lo,
                    double hi) {
  AT_DISPATCH_ALL_TYPES(in.scalar_type(), "histc_deterministic", [&] {
    using bounds_t = at::acc_type<scalar_t, /*is_cuda=*/true>;
    const scalar_t lo_in = static_cast<scalar_t>(lo);
    const scalar_t hi_in = static_cast<scalar_t>(hi);
    detbw18b::histogram_deterministic<scalar_t, bounds_t>(out, in, at::TensorBase(), nbins,
                                                          static_cast<bounds_t>(lo_in),
                                                          static_cast<bounds_t>(hi_in), false);
  });
}

void detbw18b_bincount(const at::TensorBase& out, const at::TensorBase& in, const at::TensorBase& weights,
                       int64_t nbins) {
  AT_DISPATCH_INTEGRAL_TYPES(in.scalar_type(), "bincount_deterministic", [&] {
    using bounds_t = at::acc_type<scalar_t, /*is_cuda=*/true>;
    detbw18b::histogram_deterministic<scalar_t, bounds_t>(out, in, weights, nbins, bounds_t(0),
                                                          static_cast<bounds_t>(nbins), true);
  });
}

bool detbw18b_select(const at::TensorBase& values, const at::TensorBase& indices, const at::TensorBase& in,
                     int64_t dim, int64_t k, int64_t mode) {
  return detbw18b::select_deterministic(values, indices, in, dim, k, static_cast<int>(mode));
}

void detbw18b_cumsum(const at::TensorBase& result, const at::TensorBase& self, int64_t dim, bool pairs) {
  detbw18b::cumsum_deterministic(result, self, dim, pairs);
}
