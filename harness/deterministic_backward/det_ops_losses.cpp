// Harness bindings for issue 18's first half (det_kernels_losses.cuh): aten-schema
// wrappers for torch 2.11, callable from Python and registered into the dispatcher
// for the CUDA key on request (register_aten_cuda()), as det_ops17.cpp does.
// Where the patched 1.13.1 file keeps torch's own code around our kernel (the CTC
// backward's log_beta and blank terms, nll_loss's 'none' reduction, the sum/mean
// modes of embedding_bag), the wrapper computes that part with deterministic ATen
// ops, since a registered CUDA kernel replaces torch's whole kernel.
#include <torch/extension.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>
#include "det_register.h"

void detbw18_nll_loss_reduce(const at::TensorBase& output, const at::TensorBase& total_weight,
                             const at::TensorBase& input_c, const at::TensorBase& target_c,
                             const at::TensorBase& weight_c, int64_t n_classes, int64_t inner, bool mean,
                             int64_t ignore_index);
void detbw18_ctc_nonblank(const at::TensorBase& grad, const at::TensorBase& grad_out,
                          const at::TensorBase& log_alpha, const at::TensorBase& log_beta,
                          const at::TensorBase& log_probs, const at::TensorBase& input_lengths_t,
                          const at::TensorBase& targets, const at::TensorBase& target_lengths_t,
                          const at::TensorBase& nll, const at::TensorBase& tg_batch_offsets,
                          int64_t tg_target_stride, int64_t max_target_length, bool zero_infinity,
                          bool atomic);
void detbw18_embedding_bag_max_backward(const at::TensorBase& grad_weight, const at::TensorBase& grad_c,
                                        const at::TensorBase& max_indices_c, int64_t padding_idx);
bool detbw18_put(const at::TensorBase& self_c, const at::TensorBase& index_c, const at::TensorBase& source_c,
                 bool accumulate);

using at::IntArrayRef;
using at::Tensor;

// --- NLLLoss forward -------------------------------------------------------------------
// input viewed as (N, C, inner), target as (N, inner)
static std::tuple<Tensor, Tensor> nll_forward(const Tensor& self, const Tensor& target,
                                              const std::optional<Tensor>& weight_opt, int64_t reduction,
                                              int64_t ignore_index, int64_t n, int64_t inner) {
  const int64_t n_classes = self.dim() == 1 ? self.size(0) : self.size(1);
  const Tensor weight = weight_opt.has_value() && weight_opt->defined() ? weight_opt->contiguous() : Tensor();
  TORCH_CHECK(!weight.defined() || weight.numel() == n_classes,
              "weight tensor should be defined either for all ", n_classes, " classes or no classes");
  TORCH_CHECK(target.numel() == n * inner, "nll_loss: input and target sizes do not match");
  Tensor total_weight = at::empty({}, self.options());
  const bool none = reduction == at::Reduction::None && self.dim() != 1;
  if (none) {  // no reduction: one output per target, no race (ATen ops)
    const Tensor t = target.to(at::kLong).reshape({n, 1, inner});
    const Tensor valid = t.ne(ignore_index);
    const Tensor tc = t.masked_fill(valid.logical_not(), 0);
    Tensor picked = self.reshape({n, n_classes, inner}).gather(1, tc).neg();
    if (weight.defined()) {
      picked = picked * weight.index_select(0, tc.reshape({-1})).reshape({n, 1, inner});
    }
    total_weight.zero_();
    return std::make_tuple(picked.masked_fill(valid.logical_not(), 0).reshape(target.sizes()), total_weight);
  }
  Tensor output = at::empty({}, self.options());
  if (target.numel() == 0) {
    if (reduction == at::Reduction::Mean) {
      output.fill_(std::numeric_limits<double>::quiet_NaN());
    } else {
      output.zero_();
    }
    total_weight.zero_();
    return std::make_tuple(output, total_weight);
  }
  const Tensor input_c = self.contiguous();
  const Tensor target_c = target.contiguous();
  detbw18_nll_loss_reduce(output, total_weight, input_c, target_c, weight, n_classes, inner,
                          reduction == at::Reduction::Mean, ignore_index);
  return std::make_tuple(output, total_weight);
}

std::tuple<Tensor, Tensor> nll_loss_forward(const Tensor& self, const Tensor& target,
                                            const std::optional<Tensor>& weight, int64_t reduction,
                                            int64_t ignore_index) {
  TORCH_CHECK(self.dim() >= 1 && self.dim() <= 2, "nll_loss: input tensor should be 1D or 2D");
  const int64_t n = self.dim() == 1 ? 1 : self.size(0);
  return nll_forward(self, target, weight, reduction, ignore_index, n, 1);
}

std::tuple<Tensor, Tensor> nll_loss2d_forward(const Tensor& self, const Tensor& target,
                                              const std::optional<Tensor>& weight, int64_t reduction,
                                              int64_t ignore_index) {
  TORCH_CHECK(self.dim() == 4 && target.dim() == 3, "nll_loss2d: 4-D input and 3-D target expected");
  return nll_forward(self, target, weight, reduction, ignore_index, self.size(0), self.size(2) * self.size(3));
}

// --- CTCLoss backward ------------------------------------------------------------------
struct CtcTargets {
  Tensor targets_c;              // contiguous
  std::vector<int64_t> offsets;  // where each target starts in targets_c
  Tensor offsets_dev;            // the same, on the device
  int64_t stride;
  int64_t max_length;
};

static CtcTargets ctc_targets(const Tensor& targets, IntArrayRef target_lengths, const Tensor& log_alpha) {
  CtcTargets r;
  r.targets_c = targets.contiguous();
  const int64_t batch = static_cast<int64_t>(target_lengths.size());
  r.offsets.resize(batch);
  if (targets.dim() == 1) {
    int64_t pos = 0;
    r.max_length = 0;
    for (int64_t i = 0; i < batch; ++i) {
      r.offsets[i] = pos;
      pos += target_lengths[i];
      r.max_length = std::max(r.max_length, target_lengths[i]);
    }
    r.stride = 1;
  } else {
    for (int64_t i = 0; i < batch; ++i) r.offsets[i] = i * r.targets_c.stride(0);
    r.stride = r.targets_c.stride(1);
    r.max_length = log_alpha.size(2) / 2;
  }
  r.offsets_dev = at::tensor(r.offsets, at::TensorOptions().dtype(at::kLong)).to(targets.device());
  return r;
}

// log_beta as the log_alpha of the problem reversed in time and target (torch's
// own CUDA forward on the reversed inputs): beta_t(s) = alpha^rev_{T_b-1-t}(2 L_b - s).
Tensor ctc_log_beta(const Tensor& log_probs, const Tensor& targets, IntArrayRef input_lengths,
                    IntArrayRef target_lengths, const Tensor& log_alpha, int64_t blank) {
  const int64_t T = log_probs.size(0), B = log_probs.size(1), C = log_probs.size(2);
  const int64_t S = log_alpha.size(2);
  const CtcTargets tg = ctc_targets(targets, target_lengths, log_alpha);
  const int64_t width = std::max<int64_t>(tg.max_length, 1);
  std::vector<int64_t> t_rev(T * B), t_back(B * T), s_back(B * S), rev(B * width, blank == 1 ? 2 : 1);
  std::vector<uint8_t> valid(B * T * S);
  const Tensor tcpu = tg.targets_c.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* tdata = tcpu.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t Tb = input_lengths[b], Lb = target_lengths[b];
    for (int64_t t = 0; t < T; ++t) {
      t_rev[t * B + b] = t < Tb ? Tb - 1 - t : t;
      t_back[b * T + t] = t < Tb ? Tb - 1 - t : 0;
      for (int64_t s = 0; s < S; ++s) valid[(b * T + t) * S + s] = t < Tb && s <= 2 * Lb;
    }
    for (int64_t s = 0; s < S; ++s) s_back[b * S + s] = s <= 2 * Lb ? 2 * Lb - s : 0;
    for (int64_t j = 0; j < Lb; ++j) rev[b * width + j] = tdata[tg.offsets[b] + (Lb - 1 - j) * tg.stride];
  }
  const auto dev = log_probs.device();
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  const Tensor lp_rev = log_probs.gather(0, at::tensor(t_rev, lopt).to(dev).reshape({T, B, 1}).expand({T, B, C}));
  const Tensor tg_rev = at::tensor(rev, lopt).to(dev).reshape({B, width});
  const Tensor la_rev = std::get<1>(at::_ctc_loss(lp_rev, tg_rev, input_lengths, target_lengths, blank, false));
  const int64_t S_rev = la_rev.size(2);
  const Tensor lb_t = la_rev.gather(1, at::tensor(t_back, lopt).to(dev).reshape({B, T, 1}).expand({B, T, S_rev}));
  const Tensor lb = lb_t.gather(2, at::tensor(s_back, lopt).to(dev).reshape({B, 1, S}).expand({B, T, S}));
  const Tensor ok = at::from_blob(valid.data(), {B, T, S}, at::TensorOptions().dtype(at::kBool)).to(dev);
  return lb.masked_fill(ok.logical_not(), -std::numeric_limits<double>::infinity()).contiguous();
}

// The blank terms and scaling as torch computes them with ATen ops; then ours (or, for
// timing, the atomic baseline) for the non-blank terms; then the padded steps zeroed.
static Tensor ctc_backward_impl(const Tensor& grad_out, const Tensor& log_probs, const Tensor& targets,
                                IntArrayRef input_lengths, IntArrayRef target_lengths,
                                const Tensor& neg_log_likelihood, const Tensor& log_alpha, int64_t blank,
                                bool zero_infinity, bool atomic, const Tensor& given_log_beta) {
  const int64_t B = log_probs.size(1);
  const CtcTargets tg = ctc_targets(targets, target_lengths, log_alpha);
  const Tensor log_beta = given_log_beta.defined() ? given_log_beta
      : ctc_log_beta(log_probs, targets, input_lengths, target_lengths, log_alpha, blank);
  Tensor grad = at::empty_like(log_probs, at::MemoryFormat::Contiguous);
  at::exp_out(grad, log_probs);
  Tensor grad_blank = grad.narrow(2, blank, 1);
  const int64_t m = tg.max_length;
  grad_blank -= (at::logsumexp(log_alpha.as_strided({B, log_alpha.size(1), m + 1},
                                                    {log_alpha.stride(0), log_alpha.stride(1), log_alpha.stride(2) * 2}) +
                                   log_beta.as_strided({B, log_beta.size(1), m + 1},
                                                       {log_beta.stride(0), log_beta.stride(1), log_beta.stride(2) * 2}),
                               2, true)
                     .permute({1, 0, 2})
                     .add_(neg_log_likelihood.view({1, B, 1}))
                     .sub_(log_probs.narrow(2, blank, 1))
                     .exp_());
  grad *= grad_out.view({1, B, 1});
  if (zero_infinity) {
    grad = at::where(neg_log_likelihood.view({1, B, 1}) == INFINITY, at::zeros({}, grad.options()), grad);
  }
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  const Tensor il = at::tensor(std::vector<int64_t>(input_lengths.begin(), input_lengths.end()), lopt).to(log_probs.device());
  const Tensor tl = at::tensor(std::vector<int64_t>(target_lengths.begin(), target_lengths.end()), lopt).to(log_probs.device());
  detbw18_ctc_nonblank(grad, grad_out, log_alpha, log_beta, log_probs, il, tg.targets_c, tl, neg_log_likelihood,
                       tg.offsets_dev, tg.stride, m, zero_infinity, atomic);
  const Tensor steps = at::arange(log_probs.size(0), lopt.device(log_probs.device())).reshape({-1, 1, 1});
  grad.masked_fill_(steps >= il.reshape({1, B, 1}), 0);
  return grad;
}

Tensor ctc_loss_backward(const Tensor& grad, const Tensor& log_probs, const Tensor& targets,
                         IntArrayRef input_lengths, IntArrayRef target_lengths, const Tensor& neg_log_likelihood,
                         const Tensor& log_alpha, int64_t blank, bool zero_infinity) {
  return ctc_backward_impl(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                           blank, zero_infinity, false, Tensor());
}

Tensor ctc_loss_backward_tensor(const Tensor& grad, const Tensor& log_probs, const Tensor& targets,
                                const Tensor& input_lengths, const Tensor& target_lengths,
                                const Tensor& neg_log_likelihood, const Tensor& log_alpha, int64_t blank,
                                bool zero_infinity) {
  const Tensor il = input_lengths.to(at::kCPU).to(at::kLong).contiguous();
  const Tensor tl = target_lengths.to(at::kCPU).to(at::kLong).contiguous();
  return ctc_loss_backward(grad, log_probs, targets, IntArrayRef(il.data_ptr<int64_t>(), il.numel()),
                           IntArrayRef(tl.data_ptr<int64_t>(), tl.numel()), neg_log_likelihood, log_alpha, blank,
                           zero_infinity);
}

// For the kernel-level timing: the backward with a precomputed log_beta, ours or atomic.
Tensor ctc_loss_backward_given_beta(const Tensor& grad, const Tensor& log_probs, const Tensor& targets,
                                    std::vector<int64_t> input_lengths, std::vector<int64_t> target_lengths,
                                    const Tensor& neg_log_likelihood, const Tensor& log_alpha, int64_t blank,
                                    bool zero_infinity, const Tensor& log_beta, bool atomic) {
  return ctc_backward_impl(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                           blank, zero_infinity, atomic, log_beta);
}

Tensor ctc_log_beta_py(const Tensor& log_probs, const Tensor& targets, std::vector<int64_t> input_lengths,
                       std::vector<int64_t> target_lengths, const Tensor& log_alpha, int64_t blank) {
  return ctc_log_beta(log_probs, targets, input_lengths, target_lengths, log_alpha, blank);
}

// --- EmbeddingBag backward -------------------------------------------------------------
Tensor embedding_bag_dense_backward(const Tensor& grad_, const Tensor& indices, const Tensor& offset2bag,
                                    const Tensor& bag_size, const Tensor& maximum_indices, int64_t num_weights,
                                    bool scale_grad_by_freq, int64_t mode,
                                    const std::optional<Tensor>& per_sample_weights, int64_t padding_idx) {
  const Tensor grad = grad_.contiguous();
  if (mode == 2) {  // max: ours
    Tensor grad_weight = at::zeros({num_weights, grad.size(1)}, grad.options());
    detbw18_embedding_bag_max_backward(grad_weight, grad, maximum_indices.contiguous(), padding_idx);
    return grad_weight;
  }
  // sum / mean: per-index rows, then embedding's deterministic (sorted) backward
  Tensor rows = grad.index_select(0, offset2bag);
  if (mode == 1) {
    rows = rows / bag_size.index_select(0, offset2bag).clamp_min(1).to(rows.scalar_type()).unsqueeze(1);
  }
  if (per_sample_weights.has_value() && per_sample_weights->defined()) {
    rows = rows * per_sample_weights->unsqueeze(1);
  }
  return at::embedding_dense_backward(rows, indices, num_weights, padding_idx, scale_grad_by_freq);
}

// --- put_ --------------------------------------------------------------------------------
Tensor& put_(Tensor& self, const Tensor& index, const Tensor& source, bool accumulate) {
  TORCH_CHECK(index.scalar_type() == at::kLong, "put_(): Expected a long tensor for index");
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "put_(): self and source expected to have the same dtype");
  TORCH_CHECK_INDEX(source.numel() == index.numel(), "put_(): Expected source and index to have the same number of elements");
  TORCH_CHECK_INDEX(!(self.numel() == 0 && index.numel() != 0), "put_(): Tried to put elements into an empty tensor");
  if (index.numel() == 0) return self;
  const Tensor self_c = self.is_contiguous() ? self : self.contiguous();
  const Tensor index_c = index.contiguous();
  const Tensor source_c = source.contiguous();
  if (!detbw18_put(self_c, index_c, source_c, accumulate)) {
    // integer (exact) or complex accumulation: torch's deterministic sorted index_put_
    Tensor flat = self_c.view({-1});
    const Tensor wrapped = at::where(index_c < 0, index_c + self_c.numel(), index_c).reshape({-1});
    flat.index_put_({wrapped}, source_c.reshape({-1}), true);
  }
  if (!self_c.is_same(self)) self.copy_(self_c);
  return self;
}

// --- dispatcher registration ---------------------------------------------------------------
// (det_register.h: on request, every refusal reported)
static std::unique_ptr<torch::Library> g_lib;  // this extension's registration

std::vector<std::string> register_aten_cuda() {
  return detbw_register_aten_cuda(g_lib, __FILE__, __LINE__, [](DetbwRegistrar& r) {
    r.impl("nll_loss_forward", TORCH_FN(nll_loss_forward));
    r.impl("nll_loss2d_forward", TORCH_FN(nll_loss2d_forward));
    r.impl("_ctc_loss_backward", TORCH_FN(ctc_loss_backward));
    r.impl("_ctc_loss_backward.Tensor", TORCH_FN(ctc_loss_backward_tensor));
    r.impl("_embedding_bag_dense_backward", TORCH_FN(embedding_bag_dense_backward));
    r.impl("put_", TORCH_FN(put_));
  });
}

Tensor put_py(Tensor self, const Tensor& index, const Tensor& source, bool accumulate) {
  put_(self, index, source, accumulate);
  return self;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("nll_loss_forward", &nll_loss_forward);
  m.def("nll_loss2d_forward", &nll_loss2d_forward);
  m.def("ctc_loss_backward", [](const Tensor& grad, const Tensor& log_probs, const Tensor& targets,
                                std::vector<int64_t> il, std::vector<int64_t> tl, const Tensor& nll,
                                const Tensor& la, int64_t blank, bool zi) {
    return ctc_loss_backward(grad, log_probs, targets, il, tl, nll, la, blank, zi);
  });
  m.def("ctc_loss_backward_given_beta", &ctc_loss_backward_given_beta);
  m.def("ctc_log_beta", &ctc_log_beta_py);
  m.def("embedding_bag_dense_backward", &embedding_bag_dense_backward);
  m.def("put_", &put_py);
  m.def("register_aten_cuda", &register_aten_cuda);
}
