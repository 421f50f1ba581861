// Python bindings for the deterministic backward kernels (harness only).
// Allocation mirrors what the patched torch 1.13.1 callers do.
#include <torch/extension.h>

#include <vector>

void detbw_adaptive_max_pool2d_backward(
    const at::TensorBase& grad_input_c, const at::TensorBase& grad_output_c,
    const at::TensorBase& indices_c, int64_t planes, int64_t isizeH, int64_t isizeW,
    int64_t osizeH, int64_t osizeW);

void detbw_grid_sampler_2d_backward(
    const at::TensorBase& grad_input, const at::TensorBase& grad_grid,
    const at::TensorBase& grad_output, const at::TensorBase& input,
    const at::TensorBase& grid, int64_t interpolation_mode, int64_t padding_mode,
    bool align_corners, bool input_requires_grad);

static at::Tensor adaptive_max_pool2d_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& indices) {
  TORCH_CHECK(input.is_cuda() && grad_output.is_cuda() && indices.is_cuda(), "CUDA tensors expected");
  TORCH_CHECK(input.dim() == 3 || input.dim() == 4, "3-D or 4-D input expected");
  TORCH_CHECK(indices.scalar_type() == at::kLong, "int64 indices expected");
  const int64_t nd = input.dim();
  const at::Tensor go = grad_output.contiguous();
  const at::Tensor ind = indices.contiguous();
  // like the 1.13.1 kernel: a contiguous buffer, fully overwritten (no zero fill)
  at::Tensor gi = at::empty(input.sizes(), input.options());
  const int64_t planes = nd == 3 ? input.size(0) : input.size(0) * input.size(1);
  detbw_adaptive_max_pool2d_backward(
      gi, go, ind, planes, input.size(nd - 2), input.size(nd - 1),
      go.size(nd - 2), go.size(nd - 1));
  return gi;
}

static std::vector<at::Tensor> grid_sampler_2d_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& grid,
    int64_t interpolation_mode, int64_t padding_mode, bool align_corners,
    bool input_requires_grad) {
  TORCH_CHECK(input.is_cuda() && grad_output.is_cuda() && grid.is_cuda(), "CUDA tensors expected");
  TORCH_CHECK(input.dim() == 4 && grid.dim() == 4 && grad_output.dim() == 4, "4-D tensors expected");
  TORCH_CHECK(input.scalar_type() == grid.scalar_type() &&
              input.scalar_type() == grad_output.scalar_type(), "dtypes must match");
  // like torch 1.13.1's grid_sampler_2d_backward_cuda
  at::Tensor grad_input = input_requires_grad
      ? at::zeros_like(input, at::MemoryFormat::Contiguous)
      : at::Tensor();
  at::Tensor grad_grid = at::empty_like(grid, at::MemoryFormat::Contiguous);
  detbw_grid_sampler_2d_backward(
      grad_input, grad_grid, grad_output, input, grid, interpolation_mode,
      padding_mode, align_corners, input_requires_grad);
  return {grad_input, grad_grid};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("adaptive_max_pool2d_backward", &adaptive_max_pool2d_backward,
        "deterministic adaptive_max_pool2d backward (CUDA)");
  m.def("grid_sampler_2d_backward", &grid_sampler_2d_backward,
        "deterministic grid_sampler_2d backward (CUDA)");
}
