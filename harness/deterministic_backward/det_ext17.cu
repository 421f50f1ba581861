// Harness-side CUDA translation unit for issue 17's kernels: the includes the
// torch 1.13.1 target files already have, then det_accumulate.cuh and
// det_kernels17.cuh unchanged (the same text the patches carry).
#include <ATen/core/TensorBase.h>
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

namespace detbw17 {
#include "det_accumulate.cuh"
#include "det_kernels17.cuh"
}  // namespace detbw17

// Entry points for det_ops17.cpp (tensors are allocated there).
void detbw17_adaptive_avg_pool_backward(const at::TensorBase& gi, const at::TensorBase& go,
                                        int64_t spatial) {
  detbw17::adaptive_avg_pool_backward_deterministic(gi, go, static_cast<int>(spatial));
}

void detbw17_avg_pool3d_backward(const at::TensorBase& gi, const at::TensorBase& go,
                                 int64_t kT, int64_t kH, int64_t kW, int64_t dT, int64_t dH,
                                 int64_t dW, int64_t pT, int64_t pH, int64_t pW,
                                 bool count_include_pad, int64_t divisor_override) {
  detbw17::avg_pool3d_backward_deterministic(gi, go, kT, kH, kW, dT, dH, dW, pT, pH, pW,
                                             count_include_pad, divisor_override);
}

void detbw17_pad_backward(const at::TensorBase& gi, const at::TensorBase& go, int64_t spatial,
                          bool reflection, int64_t pad_front, int64_t pad_top, int64_t pad_left) {
  detbw17::pad_backward_deterministic(gi, go, static_cast<int>(spatial), reflection, pad_front,
                                      pad_top, pad_left);
}

void detbw17_upsample_backward(const at::TensorBase& gi, const at::TensorBase& go, int64_t spatial,
                               bool cubic, bool align_corners, double sd, double sh, double sw) {
  detbw17::upsample_backward_deterministic(gi, go, static_cast<int>(spatial), cubic,
                                           align_corners, sd, sh, sw);
}

void detbw17_index_scatter_backward(const at::TensorBase& gi, const at::TensorBase& go,
                                    const at::TensorBase& ind, int64_t planes, int64_t in_plane,
                                    int64_t out_plane, int64_t max_hits) {
  detbw17::index_scatter_backward_deterministic(gi, go, ind, planes, in_plane, out_plane,
                                                max_hits);
}

bool detbw17_argmax_gather_backward(const at::TensorBase& gi, const at::TensorBase& go,
                                    const at::TensorBase& ind, int64_t spatial,
                                    const int64_t* in_size, const int64_t* out_size, bool from_target,
                                    const int64_t* kernel, const int64_t* stride,
                                    const int64_t* padding, const int64_t* dilation) {
  return detbw17::argmax_gather_backward_deterministic(gi, go, ind, static_cast<int>(spatial), in_size,
                                                       out_size, from_target, kernel, stride, padding,
                                                       dilation);
}

int64_t detbw17_windows_covering(int64_t k, int64_t s, int64_t d) {
  return detbw17::det_windows_covering(k, s, d);
}

void detbw17_max_unpool(const at::TensorBase& out, const at::TensorBase& in,
                        const at::TensorBase& ind, int64_t planes, int64_t in_plane,
                        int64_t out_plane) {
  detbw17::max_unpool_deterministic(out, in, ind, planes, in_plane, out_plane);
}
