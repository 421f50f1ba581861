// Harness bindings for issue 17's kernels (and PT-0201/0202's): Tensor-level
// wrappers with the aten schemas of torch 2.11, callable from Python directly
// (to compare with torch's own kernels in one process) and registered into the
// dispatcher for the CUDA key on request (register_aten_cuda()), so that real
// networks run them through autograd. The allocation mirrors what the patched
// torch 1.13.1 callers do.
#include <torch/extension.h>
#include <torch/library.h>

#include <array>
#include <memory>
#include <string>
#include <vector>
#include "det_register.h"

void detbw_adaptive_max_pool2d_backward(
    const at::TensorBase& grad_input_c, const at::TensorBase& grad_output_c,
    const at::TensorBase& indices_c, int64_t planes, int64_t isizeH, int64_t isizeW,
    int64_t osizeH, int64_t osizeW);
void detbw_grid_sampler_2d_backward(
    const at::TensorBase& grad_input, const at::TensorBase& grad_grid,
    const at::TensorBase& grad_output, const at::TensorBase& input,
    const at::TensorBase& grid, int64_t interpolation_mode, int64_t padding_mode,
    bool align_corners, bool input_requires_grad);
void detbw_grid_sampler_3d_backward(
    const at::TensorBase& grad_input, const at::TensorBase& grad_grid,
    const at::TensorBase& grad_output, const at::TensorBase& input,
    const at::TensorBase& grid, int64_t interpolation_mode, int64_t padding_mode,
    bool align_corners, bool input_requires_grad);
void detbw17_adaptive_avg_pool_backward(const at::TensorBase& gi, const at::TensorBase& go,
                                        int64_t spatial);
void detbw17_avg_pool3d_backward(const at::TensorBase& gi, const at::TensorBase& go,
                                 int64_t kT, int64_t kH, int64_t kW, int64_t dT, int64_t dH,
                                 int64_t dW, int64_t pT, int64_t pH, int64_t pW,
                                 bool count_include_pad, int64_t divisor_override);
void detbw17_pad_backward(const at::TensorBase& gi, const at::TensorBase& go, int64_t spatial,
                          bool reflection, int64_t pad_front, int64_t pad_top, int64_t pad_left);
void detbw17_upsample_backward(const at::TensorBase& gi, const at::TensorBase& go, int64_t spatial,
                               bool cubic, bool align_corners, double sd, double sh, double sw);
void detbw17_index_scatter_backward(const at::TensorBase& gi, const at::TensorBase& go,
                                    const at::TensorBase& ind, int64_t planes, int64_t in_plane,
                                    int64_t out_plane, int64_t max_hits);
int64_t detbw17_windows_covering(int64_t k, int64_t s, int64_t d);
bool detbw17_argmax_gather_backward(const at::TensorBase& gi, const at::TensorBase& go,
                                    const at::TensorBase& ind, int64_t spatial,
                                    const int64_t* in_size, const int64_t* out_size, bool from_target,
                                    const int64_t* kernel, const int64_t* stride,
                                    const int64_t* padding, const int64_t* dilation);
void detbw17_max_unpool(const at::TensorBase& out, const at::TensorBase& in,
                        const at::TensorBase& ind, int64_t planes, int64_t in_plane,
                        int64_t out_plane);

// The same kernels with the fp32 gathers accumulating in float (build17.py generates that unit).
void detbw17f_adaptive_avg_pool_backward(const at::TensorBase& gi, const at::TensorBase& go,
                                        int64_t spatial);
void detbw17f_avg_pool3d_backward(const at::TensorBase& gi, const at::TensorBase& go,
                                 int64_t kT, int64_t kH, int64_t kW, int64_t dT, int64_t dH,
                                 int64_t dW, int64_t pT, int64_t pH, int64_t pW,
                                 bool count_include_pad, int64_t divisor_override);
void detbw17f_pad_backward(const at::TensorBase& gi, const at::TensorBase& go, int64_t spatial,
                          bool reflection, int64_t pad_front, int64_t pad_top, int64_t pad_left);
void detbw17f_upsample_backward(const at::TensorBase& gi, const at::TensorBase& go, int64_t spatial,
                               bool cubic, bool align_corners, double sd, double sh, double sw);
void detbw17f_index_scatter_backward(const at::TensorBase& gi, const at::TensorBase& go,
                                    const at::TensorBase& ind, int64_t planes, int64_t in_plane,
                                    int64_t out_plane, int64_t max_hits);
int64_t detbw17f_windows_covering(int64_t k, int64_t s, int64_t d);
bool detbw17f_argmax_gather_backward(const at::TensorBase& gi, const at::TensorBase& go,
                                    const at::TensorBase& ind, int64_t spatial,
                                    const int64_t* in_size, const int64_t* out_size, bool from_target,
                                    const int64_t* kernel, const int64_t* stride,
                                    const int64_t* padding, const int64_t* dilation);
void detbw17f_max_unpool(const at::TensorBase& out, const at::TensorBase& in,
                        const at::TensorBase& ind, int64_t planes, int64_t in_plane,
                        int64_t out_plane);

using at::IntArrayRef;
using at::Tensor;

// set_float_accumulation(True): the wrappers below call the float-accumulation copies (to measure
// what accumulating fp32 gathers in double costs and gains); the registered kernels are chosen at
// call time too, so keep it off while training.
static bool g_float_accumulation = false;
void set_float_accumulation(bool on) { g_float_accumulation = on; }
#define DETBW17_PICK(fn) (g_float_accumulation ? detbw17f_##fn : detbw17_##fn)

static int64_t pick(IntArrayRef v, size_t i, int64_t dflt) {
  if (v.empty()) return dflt;
  return v.size() == 1 ? v[0] : v[i];
}

static at::MemoryFormat fmt_of(const Tensor& t) { return t.suggest_memory_format(); }

// --- adaptive / average pooling ------------------------------------------------
Tensor adaptive_avg_pool2d_backward(const Tensor& grad_output, const Tensor& self) {
  Tensor gi = at::empty_like(self, fmt_of(self));
  DETBW17_PICK(adaptive_avg_pool_backward)(gi, grad_output, 2);
  return gi;
}

Tensor adaptive_avg_pool3d_backward(const Tensor& grad_output, const Tensor& self) {
  Tensor gi = at::empty_like(self, fmt_of(self));
  DETBW17_PICK(adaptive_avg_pool_backward)(gi, grad_output, 3);
  return gi;
}

Tensor avg_pool3d_backward(const Tensor& grad_output, const Tensor& self, IntArrayRef kernel_size,
                           IntArrayRef stride, IntArrayRef padding, bool ceil_mode,
                           bool count_include_pad, std::optional<int64_t> divisor_override) {
  Tensor gi = at::empty_like(self, fmt_of(self));
  const int64_t kT = pick(kernel_size, 0, 1), kH = pick(kernel_size, 1, 1), kW = pick(kernel_size, 2, 1);
  DETBW17_PICK(avg_pool3d_backward)(gi, grad_output, kT, kH, kW, pick(stride, 0, kT),
                              pick(stride, 1, kH), pick(stride, 2, kW), pick(padding, 0, 0),
                              pick(padding, 1, 0), pick(padding, 2, 0), count_include_pad,
                              divisor_override.has_value() ? *divisor_override : 0);
  return gi;
}

// --- padding ----------------------------------------------------------------------
static Tensor pad_bw(const Tensor& grad_output, const Tensor& self, IntArrayRef padding,
                     int64_t spatial, bool reflection) {
  Tensor gi = at::empty_like(self, fmt_of(self));
  const int64_t left = padding[0];
  const int64_t top = spatial >= 2 ? padding[2] : 0;
  const int64_t front = spatial >= 3 ? padding[4] : 0;
  DETBW17_PICK(pad_backward)(gi, grad_output, spatial, reflection, front, top, left);
  return gi;
}
Tensor reflection_pad1d_backward(const Tensor& g, const Tensor& s, IntArrayRef p) { return pad_bw(g, s, p, 1, true); }
Tensor reflection_pad2d_backward(const Tensor& g, const Tensor& s, IntArrayRef p) { return pad_bw(g, s, p, 2, true); }
Tensor reflection_pad3d_backward(const Tensor& g, const Tensor& s, IntArrayRef p) { return pad_bw(g, s, p, 3, true); }
Tensor replication_pad1d_backward(const Tensor& g, const Tensor& s, IntArrayRef p) { return pad_bw(g, s, p, 1, false); }
Tensor replication_pad2d_backward(const Tensor& g, const Tensor& s, IntArrayRef p) { return pad_bw(g, s, p, 2, false); }
Tensor replication_pad3d_backward(const Tensor& g, const Tensor& s, IntArrayRef p) { return pad_bw(g, s, p, 3, false); }

// --- interpolation ------------------------------------------------------------------
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

static Tensor upsample_bw(const Tensor& grad_output, IntArrayRef input_size, int64_t spatial,
                          bool cubic, bool align_corners, std::optional<double> sd,
                          std::optional<double> sh, std::optional<double> sw) {
  const auto fmt = grad_output.suggest_memory_format();
  Tensor gi = at::empty(input_size, grad_output.options().memory_format(fmt));
  const int64_t nd = grad_output.dim();
  double s[3] = {0.0, 0.0, 0.0};
  std::optional<double> given[3] = {sd, sh, sw};
  for (int64_t k = 0; k < spatial; ++k) {
    const int a = 3 - static_cast<int>(spatial) + static_cast<int>(k);
    const int64_t dim = nd - spatial + k;
    s[a] = scale_of(grad_output, input_size[dim], grad_output.size(dim), align_corners, given[a]);
  }
  DETBW17_PICK(upsample_backward)(gi, grad_output, spatial, cubic, align_corners, s[0], s[1], s[2]);
  return gi;
}
Tensor upsample_linear1d_backward(const Tensor& g, IntArrayRef output_size, IntArrayRef input_size,
                                  bool ac, std::optional<double> sw) {
  return upsample_bw(g, input_size, 1, false, ac, std::nullopt, std::nullopt, sw);
}
Tensor upsample_bilinear2d_backward(const Tensor& g, IntArrayRef output_size, IntArrayRef input_size,
                                    bool ac, std::optional<double> sh, std::optional<double> sw) {
  return upsample_bw(g, input_size, 2, false, ac, std::nullopt, sh, sw);
}
Tensor upsample_bicubic2d_backward(const Tensor& g, IntArrayRef output_size, IntArrayRef input_size,
                                   bool ac, std::optional<double> sh, std::optional<double> sw) {
  return upsample_bw(g, input_size, 2, true, ac, std::nullopt, sh, sw);
}
Tensor upsample_trilinear3d_backward(const Tensor& g, IntArrayRef output_size, IntArrayRef input_size,
                                     bool ac, std::optional<double> sd, std::optional<double> sh,
                                     std::optional<double> sw) {
  return upsample_bw(g, input_size, 3, false, ac, sd, sh, sw);
}

// --- argmax-routed pooling backward (fixed point) ------------------------------------
static Tensor index_scatter_bw(const Tensor& grad_output, const Tensor& self, const Tensor& indices,
                               int64_t spatial, int64_t max_hits) {
  int64_t in_plane = 1, out_plane = 1;
  for (int64_t k = 0; k < spatial; ++k) {
    in_plane *= self.size(self.dim() - 1 - k);
    out_plane *= grad_output.size(grad_output.dim() - 1 - k);
  }
  const int64_t planes = in_plane ? self.numel() / in_plane : 0;
  Tensor gi = at::empty(self.sizes(), self.options());  // contiguous
  const Tensor go = grad_output.contiguous();
  const Tensor ind = indices.contiguous();
  detbw17_index_scatter_backward(gi, go, ind, planes, in_plane, out_plane, max_hits);
  const auto fmt = fmt_of(self);
  return fmt == at::MemoryFormat::Contiguous ? gi : gi.contiguous(fmt);
}

// fixed-point variants (index_scatter section)
Tensor max_pool3d_with_indices_backward_fixed(const Tensor& grad_output, const Tensor& self,
                                              IntArrayRef kernel_size, IntArrayRef stride,
                                              IntArrayRef padding, IntArrayRef dilation, bool ceil_mode,
                                              const Tensor& indices) {
  int64_t hits = 1;
  for (size_t a = 0; a < 3; ++a) {
    const int64_t k = pick(kernel_size, a, 1);
    hits *= detbw17_windows_covering(k, pick(stride, a, k), pick(dilation, a, 1));
  }
  return index_scatter_bw(grad_output, self, indices, 3, hits);
}

Tensor fractional_max_pool2d_backward_fixed(const Tensor& grad_output, const Tensor& self,
                                            IntArrayRef kernel_size, IntArrayRef output_size,
                                            const Tensor& indices) {
  // at most k + 1 windows per axis cover one element (see argmax_gather)
  return index_scatter_bw(grad_output, self, indices, 2,
                          (pick(kernel_size, 0, 1) + 1) * (pick(kernel_size, 1, 1) + 1));
}

Tensor fractional_max_pool3d_backward_fixed(const Tensor& grad_output, const Tensor& self,
                                            IntArrayRef kernel_size, IntArrayRef output_size,
                                            const Tensor& indices) {
  return index_scatter_bw(grad_output, self, indices, 3,
                          (pick(kernel_size, 0, 1) + 1) * (pick(kernel_size, 1, 1) + 1) *
                              (pick(kernel_size, 2, 1) + 1));
}

// gather variants (argmax_gather section): the ones registered
static Tensor argmax_gather_bw(const Tensor& grad_output, const Tensor& self, const Tensor& indices,
                               int64_t spatial, bool from_target, const int64_t* k, const int64_t* s,
                               const int64_t* p, const int64_t* d) {
  int64_t in_size[3], out_size[3];
  for (int64_t a = 0; a < spatial; ++a) {
    in_size[a] = self.size(self.dim() - spatial + a);
    out_size[a] = grad_output.size(grad_output.dim() - spatial + a);
  }
  Tensor gi = at::empty(self.sizes(), self.options());
  const Tensor go = grad_output.contiguous();
  const Tensor ind = indices.contiguous();
  TORCH_CHECK(DETBW17_PICK(argmax_gather_backward)(gi, go, ind, spatial, in_size, out_size, from_target, k, s, p, d),
              "argmax gather: sizes beyond the 32-bit path");
  const auto fmt = fmt_of(self);
  return fmt == at::MemoryFormat::Contiguous ? gi : gi.contiguous(fmt);
}

Tensor max_pool3d_with_indices_backward(const Tensor& grad_output, const Tensor& self,
                                        IntArrayRef kernel_size, IntArrayRef stride,
                                        IntArrayRef padding, IntArrayRef dilation, bool ceil_mode,
                                        const Tensor& indices) {
  int64_t k[3], s[3], p[3], d[3];
  for (size_t a = 0; a < 3; ++a) {
    k[a] = pick(kernel_size, a, 1);
    s[a] = pick(stride, a, k[a]);
    p[a] = pick(padding, a, 0);
    d[a] = pick(dilation, a, 1);
  }
  return argmax_gather_bw(grad_output, self, indices, 3, true, k, s, p, d);
}

Tensor fractional_max_pool2d_backward(const Tensor& grad_output, const Tensor& self,
                                      IntArrayRef kernel_size, IntArrayRef output_size,
                                      const Tensor& indices) {
  const int64_t k[2] = {pick(kernel_size, 0, 1), pick(kernel_size, 1, 1)};
  return argmax_gather_bw(grad_output, self, indices, 2, false, k, nullptr, nullptr, nullptr);
}

Tensor fractional_max_pool3d_backward(const Tensor& grad_output, const Tensor& self,
                                      IntArrayRef kernel_size, IntArrayRef output_size,
                                      const Tensor& indices) {
  const int64_t k[3] = {pick(kernel_size, 0, 1), pick(kernel_size, 1, 1), pick(kernel_size, 2, 1)};
  return argmax_gather_bw(grad_output, self, indices, 3, false, k, nullptr, nullptr, nullptr);
}

// --- max_unpool ---------------------------------------------------------------------
static Tensor unpool(const Tensor& self, const Tensor& indices, IntArrayRef output_size, int64_t spatial) {
  std::vector<int64_t> shape(self.sizes().begin(), self.sizes().end() - spatial);
  int64_t in_plane = 1, out_plane = 1;
  for (int64_t k = 0; k < spatial; ++k) {
    shape.push_back(output_size[k]);
    in_plane *= self.size(self.dim() - spatial + k);
    out_plane *= output_size[k];
  }
  Tensor out = at::empty(shape, self.options());
  const Tensor in = self.contiguous();
  const Tensor ind = indices.contiguous();
  const int64_t planes = in_plane ? self.numel() / in_plane : 0;
  detbw17_max_unpool(out, in, ind, planes, in_plane, out_plane);
  return out;
}
Tensor max_unpool2d(const Tensor& self, const Tensor& indices, IntArrayRef output_size) {
  return unpool(self, indices, output_size, 2);
}
Tensor max_unpool3d(const Tensor& self, const Tensor& indices, IntArrayRef output_size,
                    IntArrayRef stride, IntArrayRef padding) {
  return unpool(self, indices, output_size, 3);
}

// --- PT-0201 / PT-0202 ----------------------------------------------------------------
Tensor adaptive_max_pool2d_backward(const Tensor& grad_output, const Tensor& self, const Tensor& indices) {
  const int64_t nd = self.dim();
  const Tensor go = grad_output.contiguous();
  const Tensor ind = indices.contiguous();
  Tensor gi = at::empty(self.sizes(), self.options());
  const int64_t planes = nd == 3 ? self.size(0) : self.size(0) * self.size(1);
  detbw_adaptive_max_pool2d_backward(gi, go, ind, planes, self.size(nd - 2), self.size(nd - 1),
                                     go.size(nd - 2), go.size(nd - 1));
  const auto fmt = fmt_of(self);
  return fmt == at::MemoryFormat::Contiguous ? gi : gi.contiguous(fmt);
}

std::tuple<Tensor, Tensor> grid_sampler_2d_backward(const Tensor& grad_output, const Tensor& input,
                                                    const Tensor& grid, int64_t interpolation_mode,
                                                    int64_t padding_mode, bool align_corners,
                                                    std::array<bool, 2> output_mask) {
  Tensor grad_input = output_mask[0] ? at::zeros_like(input, at::MemoryFormat::Contiguous) : Tensor();
  Tensor grad_grid = at::empty_like(grid, at::MemoryFormat::Contiguous);
  detbw_grid_sampler_2d_backward(grad_input, grad_grid, grad_output, input, grid, interpolation_mode,
                                 padding_mode, align_corners, output_mask[0]);
  return std::make_tuple(grad_input, grad_grid);
}

// PT-0222: the caller (grid_sampler_3d_backward_cuda) allocates as in 1.13.1
std::tuple<Tensor, Tensor> grid_sampler_3d_backward(const Tensor& grad_output, const Tensor& input,
                                                    const Tensor& grid, int64_t interpolation_mode,
                                                    int64_t padding_mode, bool align_corners,
                                                    std::array<bool, 2> output_mask) {
  Tensor grad_input = output_mask[0] ? at::zeros_like(input, at::MemoryFormat::Contiguous) : Tensor();
  Tensor grad_grid = at::empty_like(grid, at::MemoryFormat::Contiguous);
  detbw_grid_sampler_3d_backward(grad_input, grad_grid, grad_output, input, grid, interpolation_mode,
                                 padding_mode, align_corners, output_mask[0]);
  return std::make_tuple(grad_input, grad_grid);
}

// --- dispatcher registration ----------------------------------------------------------
// (det_register.h: on request, every refusal reported)
static std::unique_ptr<torch::Library> g_lib;  // this extension's registration

std::vector<std::string> register_aten_cuda() {
  return detbw_register_aten_cuda(g_lib, __FILE__, __LINE__, [](DetbwRegistrar& r) {
    r.impl("_adaptive_avg_pool2d_backward", TORCH_FN(adaptive_avg_pool2d_backward));
    r.impl("_adaptive_avg_pool3d_backward", TORCH_FN(adaptive_avg_pool3d_backward));
    r.impl("avg_pool3d_backward", TORCH_FN(avg_pool3d_backward));
    r.impl("reflection_pad1d_backward", TORCH_FN(reflection_pad1d_backward));
    r.impl("reflection_pad2d_backward", TORCH_FN(reflection_pad2d_backward));
    r.impl("reflection_pad3d_backward", TORCH_FN(reflection_pad3d_backward));
    r.impl("replication_pad1d_backward", TORCH_FN(replication_pad1d_backward));
    r.impl("replication_pad2d_backward", TORCH_FN(replication_pad2d_backward));
    r.impl("replication_pad3d_backward", TORCH_FN(replication_pad3d_backward));
    r.impl("upsample_linear1d_backward", TORCH_FN(upsample_linear1d_backward));
    r.impl("upsample_bilinear2d_backward", TORCH_FN(upsample_bilinear2d_backward));
    r.impl("upsample_bicubic2d_backward", TORCH_FN(upsample_bicubic2d_backward));
    r.impl("upsample_trilinear3d_backward", TORCH_FN(upsample_trilinear3d_backward));
    r.impl("max_pool3d_with_indices_backward", TORCH_FN(max_pool3d_with_indices_backward));
    r.impl("fractional_max_pool2d_backward", TORCH_FN(fractional_max_pool2d_backward));
    r.impl("fractional_max_pool3d_backward", TORCH_FN(fractional_max_pool3d_backward));
    r.impl("max_unpool2d", TORCH_FN(max_unpool2d));
    r.impl("max_unpool3d", TORCH_FN(max_unpool3d));
    r.impl("adaptive_max_pool2d_backward", TORCH_FN(adaptive_max_pool2d_backward));
    r.impl("grid_sampler_2d_backward", TORCH_FN(grid_sampler_2d_backward));
    r.impl("grid_sampler_3d_backward", TORCH_FN(grid_sampler_3d_backward));
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("adaptive_avg_pool2d_backward", &adaptive_avg_pool2d_backward);
  m.def("adaptive_avg_pool3d_backward", &adaptive_avg_pool3d_backward);
  m.def("avg_pool3d_backward", &avg_pool3d_backward);
  m.def("reflection_pad1d_backward", &reflection_pad1d_backward);
  m.def("reflection_pad2d_backward", &reflection_pad2d_backward);
  m.def("reflection_pad3d_backward", &reflection_pad3d_backward);
  m.def("replication_pad1d_backward", &replication_pad1d_backward);
  m.def("replication_pad2d_backward", &replication_pad2d_backward);
  m.def("replication_pad3d_backward", &replication_pad3d_backward);
  m.def("upsample_linear1d_backward", &upsample_linear1d_backward);
  m.def("upsample_bilinear2d_backward", &upsample_bilinear2d_backward);
  m.def("upsample_bicubic2d_backward", &upsample_bicubic2d_backward);
  m.def("upsample_trilinear3d_backward", &upsample_trilinear3d_backward);
  m.def("max_pool3d_with_indices_backward", &max_pool3d_with_indices_backward);
  m.def("fractional_max_pool2d_backward", &fractional_max_pool2d_backward);
  m.def("fractional_max_pool3d_backward", &fractional_max_pool3d_backward);
  m.def("max_pool3d_with_indices_backward_fixed", &max_pool3d_with_indices_backward_fixed);
  m.def("fractional_max_pool2d_backward_fixed", &fractional_max_pool2d_backward_fixed);
  m.def("fractional_max_pool3d_backward_fixed", &fractional_max_pool3d_backward_fixed);
  m.def("max_unpool2d", &max_unpool2d);
  m.def("max_unpool3d", &max_unpool3d);
  m.def("adaptive_max_pool2d_backward", &adaptive_max_pool2d_backward);
  m.def("grid_sampler_2d_backward", &grid_sampler_2d_backward);
  m.def("grid_sampler_3d_backward", &grid_sampler_3d_backward);
  m.def("register_aten_cuda", &register_aten_cuda);
  m.def("set_float_accumulation", &set_float_accumulation);
}
