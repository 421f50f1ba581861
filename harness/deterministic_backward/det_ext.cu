// Harness-side CUDA translation unit: provides, for a current torch, the few
// names det_kernels.cuh expects from torch 1.13.1's GridSampler.cuh and cub
// wrapper (and the 3-D nearest rounding of this torch's forward), then
// compiles det_kernels.cuh unchanged.
#include <ATen/core/TensorBase.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <cub/cub.cuh>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>

namespace detbw {

// Same numbering as torch's GridSamplerInterpolation / GridSamplerPadding.
enum class GridSamplerInterpolation { Bilinear, Nearest, Bicubic };
enum class GridSamplerPadding { Zeros, Border, Reflection };

__device__ __forceinline__ bool within_bounds_2d(int h, int w, int H, int W) {
  return h >= 0 && h < H && w >= 0 && w < W;
}

__device__ __forceinline__ bool within_bounds_3d(int d, int h, int w, int D, int H, int W) {
  return d >= 0 && d < D && h >= 0 && h < H && w >= 0 && w < W;
}

// torch 2.11's grid_sampler_3d kernels round nearest with nearbyint (1.13.1's
// with ::round; the patch defines it so).
template <typename T>
__device__ __forceinline__ T grid_sampler_3d_round_nearest(T v) {
  return ::nearbyint(v);
}

// Clamp to [0, size - 1]; derivative 0 on and beyond the border.
template <typename T>
__device__ __forceinline__ T harness_clip_with_grad(T v, int size, T* d) {
  const T hi = static_cast<T>(size - 1);
  if (v <= static_cast<T>(0)) {
    *d = static_cast<T>(0);
    return static_cast<T>(0);
  }
  if (v >= hi) {
    *d = static_cast<T>(0);
    return hi;
  }
  *d = static_cast<T>(1);
  return v;
}

// Fold v into [twice_lo / 2, twice_hi / 2] by mirroring; d is +-1.
template <typename T>
__device__ __forceinline__ T harness_reflect_with_grad(T v, int twice_lo, int twice_hi, T* d) {
  if (twice_lo == twice_hi) {
    *d = static_cast<T>(0);
    return static_cast<T>(0);
  }
  const T lo = static_cast<T>(twice_lo) / 2;
  const T span = static_cast<T>(twice_hi - twice_lo) / 2;
  T sign = static_cast<T>(1);
  T t = v - lo;
  if (t < static_cast<T>(0)) {
    sign = static_cast<T>(-1);
    t = -t;
  }
  const T rem = ::fmod(t, span);
  const int folds = static_cast<int>(::floor(t / span));
  if ((folds & 1) == 0) {
    *d = sign;
    return rem + lo;
  }
  *d = -sign;
  return span - rem + lo;
}

// Grid coordinate in [-1, 1] -> source pixel coordinate, with d(out)/d(coord).
template <typename T>
__device__ __forceinline__ T grid_sampler_compute_source_index_set_grad(
    T coord, int size, GridSamplerPadding padding_mode, bool align_corners, T* grad) {
  T v;
  if (align_corners) {
    *grad = static_cast<T>(size - 1) / 2;
    v = ((coord + static_cast<T>(1)) / 2) * (size - 1);
  } else {
    *grad = static_cast<T>(size) / 2;
    v = ((coord + static_cast<T>(1)) * size - 1) / 2;
  }
  if (padding_mode == GridSamplerPadding::Border) {
    T d_clip;
    v = harness_clip_with_grad(v, size, &d_clip);
    *grad = (*grad) * d_clip;
  } else if (padding_mode == GridSamplerPadding::Reflection) {
    T d_refl, d_clip;
    if (align_corners) {
      v = harness_reflect_with_grad(v, 0, 2 * (size - 1), &d_refl);
    } else {
      v = harness_reflect_with_grad(v, -1, 2 * size - 1, &d_refl);
    }
    v = harness_clip_with_grad(v, size, &d_clip);
    *grad = (*grad) * d_refl * d_clip;
  }
  // keep huge or non-finite coordinates away from int conversion
  if (v > INT_MAX - 1 || v < INT_MIN || !::isfinite(static_cast<double>(v))) {
    v = static_cast<T>(-100);
  }
  return v;
}

// Stable (key, value) radix sort over bits [0, end_bit) on the current stream.
static void deterministic_radix_sort_pairs(
    const int64_t* keys_in, int64_t* keys_out,
    const int64_t* values_in, int64_t* values_out,
    int64_t n, int end_bit) {
  auto stream = at::cuda::getCurrentCUDAStream();
  size_t temp_bytes = 0;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, keys_in, keys_out, values_in, values_out,
      static_cast<int>(n), 0, end_bit, stream.stream()));
  c10::DataPtr temp = c10::cuda::CUDACachingAllocator::get()->allocate(temp_bytes);
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      temp.get(), temp_bytes, keys_in, keys_out, values_in, values_out,
      static_cast<int>(n), 0, end_bit, stream.stream()));
}

#include "det_kernels.cuh"

}  // namespace detbw

// Entry points for det_ext.cpp (tensors are allocated there).
void detbw_adaptive_max_pool2d_backward(
    const at::TensorBase& grad_input_c, const at::TensorBase& grad_output_c,
    const at::TensorBase& indices_c, int64_t planes, int64_t isizeH, int64_t isizeW,
    int64_t osizeH, int64_t osizeW) {
  detbw::adaptive_max_pool2d_backward_deterministic(
      grad_input_c, grad_output_c, indices_c, planes, isizeH, isizeW, osizeH, osizeW);
}

void detbw_grid_sampler_2d_backward(
    const at::TensorBase& grad_input, const at::TensorBase& grad_grid,
    const at::TensorBase& grad_output, const at::TensorBase& input,
    const at::TensorBase& grid, int64_t interpolation_mode, int64_t padding_mode,
    bool align_corners, bool input_requires_grad) {
  detbw::grid_sampler_2d_backward_deterministic(
      grad_input, grad_grid, grad_output, input, grid, interpolation_mode,
      padding_mode, align_corners, input_requires_grad);
}

void detbw_grid_sampler_3d_backward(
    const at::TensorBase& grad_input, const at::TensorBase& grad_grid,
    const at::TensorBase& grad_output, const at::TensorBase& input,
    const at::TensorBase& grid, int64_t interpolation_mode, int64_t padding_mode,
    bool align_corners, bool input_requires_grad) {
  detbw::grid_sampler_3d_backward_deterministic(
      grad_input, grad_grid, grad_output, input, grid, interpolation_mode,
      padding_mode, align_corners, input_requires_grad);
}
