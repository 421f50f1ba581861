// Harness bindings for the antialiased bilinear/bicubic interpolation backward (PT-0232):
// Tensor-level wrappers with the aten schemas of torch 2.11 (_upsample_bilinear2d_aa_backward,
// _upsample_bicubic2d_aa_backward and their .grad_input out variants), callable from Python
// directly (to compare with torch's own kernels in one process) and registered into the
// dispatcher for the CUDA key on request (register_aten_cuda()), so that F.interpolate(...,
// antialias=True) runs them through autograd. The checks and the grad_input layout mirror
// torch's meta function (upsample_2d_common_check; grad_output's suggested memory format).
#include <torch/extension.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "det_register.h"

void detbwaa_upsample_aa_backward(const at::TensorBase& gi, const at::TensorBase& go, bool bicubic,
                                  double scale_h, double scale_w);

using at::IntArrayRef;
using at::Tensor;

// area_pixel_compute_scale of the accumulate type (torch's host arithmetic), widened.
template <typename acc_t>
static double scale_as(int64_t in, int64_t out, bool align_corners, std::optional<double> s) {
  if (align_corners) {
    return out > 1 ? static_cast<double>(static_cast<acc_t>(in - 1) / static_cast<acc_t>(out - 1)) : 0.0;
  }
  if (s.has_value() && *s > 0.) {
    return static_cast<double>(static_cast<acc_t>(1.0 / *s));
  }
  return static_cast<double>(static_cast<acc_t>(in) / static_cast<acc_t>(out));
}

static double scale_of(const Tensor& g, int64_t in, int64_t out, bool ac, std::optional<double> s) {
  return g.scalar_type() == at::kDouble ? scale_as<double>(in, out, ac, s) : scale_as<float>(in, out, ac, s);
}

static void check_args(const Tensor& grad_output, IntArrayRef output_size, IntArrayRef input_size) {
  TORCH_CHECK(output_size.size() == 2, "It is expected output_size equals to 2, but got size ", output_size.size());
  TORCH_CHECK(input_size.size() == 4, "It is expected input_size equals to 4, but got size ", input_size.size());
  TORCH_CHECK(input_size[2] > 0 && input_size[3] > 0 && output_size[0] > 0 && output_size[1] > 0,
              "Input and output sizes should be greater than 0, but got input (H: ", input_size[2], ", W: ",
              input_size[3], ") output (H: ", output_size[0], ", W: ", output_size[1], ")");
  TORCH_CHECK(grad_output.dim() == 4, "Expected grad_output to be a tensor of dimension 4 but got: dimension ",
              grad_output.dim());
  const int64_t full[4] = {input_size[0], input_size[1], output_size[0], output_size[1]};
  for (int i = 0; i < 4; ++i) {
    TORCH_CHECK(grad_output.size(i) == full[i], "Expected grad_output to have the same shape as output;",
                " output.size(", i, ") = ", full[i], " but got grad_output.size(", i, ") = ", grad_output.size(i));
  }
  const auto st = grad_output.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16,
              "upsample antialias backward: the deterministic CUDA kernel does not support dtype ", st);
}

static void run(const Tensor& grad_input, const Tensor& grad_output, IntArrayRef output_size, IntArrayRef input_size,
                bool align_corners, std::optional<double> scales_h, std::optional<double> scales_w, bool bicubic) {
  const double sh = scale_of(grad_output, input_size[2], output_size[0], align_corners, scales_h);
  const double sw = scale_of(grad_output, input_size[3], output_size[1], align_corners, scales_w);
  detbwaa_upsample_aa_backward(grad_input, grad_output, bicubic, sh, sw);
}

static Tensor aa_backward(const Tensor& grad_output, IntArrayRef output_size, IntArrayRef input_size,
                          bool align_corners, std::optional<double> scales_h, std::optional<double> scales_w,
                          bool bicubic) {
  check_args(grad_output, output_size, input_size);
  Tensor gi = at::empty(input_size, grad_output.options().memory_format(grad_output.suggest_memory_format()));
  run(gi, grad_output, output_size, input_size, align_corners, scales_h, scales_w, bicubic);
  return gi;
}

static Tensor& aa_backward_out(const Tensor& grad_output, IntArrayRef output_size, IntArrayRef input_size,
                               bool align_corners, std::optional<double> scales_h, std::optional<double> scales_w,
                               Tensor& grad_input, bool bicubic) {
  check_args(grad_output, output_size, input_size);
  if (grad_input.sizes() != input_size) {
    grad_input.resize_(input_size);
  }
  run(grad_input, grad_output, output_size, input_size, align_corners, scales_h, scales_w, bicubic);
  return grad_input;
}

Tensor bilinear2d_aa_backward(const Tensor& g, IntArrayRef output_size, IntArrayRef input_size, bool ac,
                              std::optional<double> sh, std::optional<double> sw) {
  return aa_backward(g, output_size, input_size, ac, sh, sw, false);
}
Tensor bicubic2d_aa_backward(const Tensor& g, IntArrayRef output_size, IntArrayRef input_size, bool ac,
                             std::optional<double> sh, std::optional<double> sw) {
  return aa_backward(g, output_size, input_size, ac, sh, sw, true);
}
Tensor& bilinear2d_aa_backward_out(const Tensor& g, IntArrayRef output_size, IntArrayRef input_size, bool ac,
                                   std::optional<double> sh, std::optional<double> sw, Tensor& grad_input) {
  return aa_backward_out(g, output_size, input_size, ac, sh, sw, grad_input, false);
}
Tensor& bicubic2d_aa_backward_out(const Tensor& g, IntArrayRef output_size, IntArrayRef input_size, bool ac,
                                  std::optional<double> sh, std::optional<double> sw, Tensor& grad_input) {
  return aa_backward_out(g, output_size, input_size, ac, sh, sw, grad_input, true);
}

// --- dispatcher registration -----------------------------------------------------------------
// (det_register.h: on request, every refusal reported)
static std::unique_ptr<torch::Library> g_lib;  // this extension's registration

std::vector<std::string> register_aten_cuda() {
  return detbw_register_aten_cuda(g_lib, __FILE__, __LINE__, [](DetbwRegistrar& r) {
    r.impl("_upsample_bilinear2d_aa_backward", TORCH_FN(bilinear2d_aa_backward));
    r.impl("_upsample_bilinear2d_aa_backward.grad_input", TORCH_FN(bilinear2d_aa_backward_out));
    r.impl("_upsample_bicubic2d_aa_backward", TORCH_FN(bicubic2d_aa_backward));
    r.impl("_upsample_bicubic2d_aa_backward.grad_input", TORCH_FN(bicubic2d_aa_backward_out));
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bilinear2d_aa_backward", &bilinear2d_aa_backward);
  m.def("bicubic2d_aa_backward", &bicubic2d_aa_backward);
  m.def("register_aten_cuda", &register_aten_cuda);
}
