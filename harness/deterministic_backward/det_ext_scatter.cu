// Harness-side CUDA translation unit for issue 18's scatter_reduce / scatter(reduce=) /
// index_reduce kernels: the includes the torch 1.13.1 target files have, a stable
// radix sort on cub (the patches define det_gr_sort_pairs on at::cuda::cub), then
// det_kernels_scatter.cuh unchanged (the text the patches carry).
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <cub/cub.cuh>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace detbw18c {

// Stable (key, value) radix sort over key bits [0, end_bit), on the current stream.
static void det_gr_sort_pairs(const int64_t* keys_in, int64_t* keys_out, const int64_t* values_in,
                              int64_t* values_out, int64_t n, int end_bit) {
  auto stream = at::cuda::getCurrentCUDAStream();
  size_t temp_bytes = 0;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, values_in, values_out,
                                                 static_cast<int>(n), 0, end_bit, stream.stream()));
  c10::DataPtr temp = c10::cuda::CUDACachingAllocator::get()->allocate(temp_bytes);
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, keys_in, keys_out, values_in, values_out,
                                                 static_cast<int>(n), 0, end_bit, stream.stream()));
}

#include "det_kernels_scatter.cuh"

}  // namespace detbw18c

// Entry points for det_ops_scatter.cpp.
void detbw18c_scatter_reduce(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                             int64_t op, bool include_self, bool opmath) {
  detbw18c::scatter_reduce_deterministic(self, dim, index, src, static_cast<int>(op), include_self, opmath,
                                         /*divide=*/true);
}

void detbw18c_index_reduce(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                           int64_t op, bool include_self) {
  detbw18c::index_reduce_deterministic(self, dim, index, source, static_cast<int>(op), include_self);
}
