// Harness-side CUDA translation unit for the antialiased interpolation backward (PT-0232):
// the includes torch 1.13.1's UpSampleBilinear2d.cu has (after PT-0208), then
// det_accumulate.cuh and det_kernels_aa.cuh unchanged (the text the patch carries).
#include <ATen/core/TensorBase.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace detbwaa {
#include "det_accumulate.cuh"
#include "det_kernels_aa.cuh"
}  // namespace detbwaa

// Entry point for det_ops_aa.cpp (grad_input is allocated there).
void detbwaa_upsample_aa_backward(const at::TensorBase& gi, const at::TensorBase& go, bool bicubic,
                                  double scale_h, double scale_w) {
  detbwaa::upsample_aa_backward_deterministic(gi, go, bicubic, scale_h, scale_w);
}
