// Deterministic CUDA kernels of issue 18, first half: the weighted NLLLoss
// forward reduction (1-D nll_loss and 2-D nll_loss2d), the CTCLoss backward's
// non-blank collection, EmbeddingBag(mode='max') backward, and put_ with and
// without accumulate.
//
// One source for two consumers: det_ext_losses.cu compiles this file against
// torch 2.11 for the H200 harness, and make_patches_losses.py copies each
// marked section verbatim into the torch 1.13.1 .cu file that needs it (after
// det_accumulate.cuh's det_common and, where used, det_fixed_point). Only names
// present in both torches are used; C++14, CUDA 11.2.

// BEGIN nll_reduce
// ---------------------------------------------------------------------------
// NLLLoss forward, reduction 'sum' or 'mean' (weighted): the sums
//   S = sum_i -w[t_i] * input[n_i, t_i, k_i],  W = sum_i w[t_i]
// over the targets i that are not ignore_index. torch's nll_loss2d adds one
// partial per block into the scalar output with atomicAdd (order varies);
// here element i always goes to partial i / kNllChunk, each block reduces its
// chunk in a fixed tree, and one block adds the partials in index order. The
// order of every addition depends on the sizes only. Accumulation is in
// double (more accurate than torch's float accumulator for fp32/fp16/bf16).
// input is contiguous (N, C, inner): inner = 1 for nll_loss, H*W for
// nll_loss2d; target is contiguous (N, inner).
constexpr int kNllThreads = 256;
constexpr int64_t kNllChunk = 4096;

template <typename scalar_t, typename target_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void nll_loss_deterministic_partial_kernel(
    const scalar_t* __restrict__ input, const target_t* __restrict__ target,
    const scalar_t* __restrict__ weight, const int64_t n_elems, const int64_t n_classes,
    const det_divmod_u32 inner_div, const int64_t inner, const bool small,
    const int64_t ignore_index, double* __restrict__ partial) {
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kNllChunk;
  const int64_t end = begin + kNllChunk < n_elems ? begin + kNllChunk : n_elems;
  double sum = 0.0, wsum = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kNllThreads) {
    const int64_t t = static_cast<int64_t>(target[i]);
    if (t == ignore_index) {
      continue;
    }
    CUDA_KERNEL_ASSERT(t >= 0 && t < n_classes);
    int64_t n, k;
    if (small) {
      const uint32_t q = inner_div.div(static_cast<uint32_t>(i));
      n = q;
      k = i - static_cast<int64_t>(q) * inner;
    } else {
      n = i / inner;
      k = i - n * inner;
    }
    const double w = weight != nullptr ? static_cast<double>(weight[t]) : 1.0;
    sum -= static_cast<double>(input[(n * n_classes + t) * inner + k]) * w;
    wsum += w;
  }
  __shared__ double s_sum[kNllThreads];
  __shared__ double s_w[kNllThreads];
  s_sum[threadIdx.x] = sum;
  s_w[threadIdx.x] = wsum;
  __syncthreads();
  for (int offset = kNllThreads / 2; offset > 0; offset /= 2) {  // fixed tree
    if (threadIdx.x < offset) {
      s_sum[threadIdx.x] += s_sum[threadIdx.x + offset];
      s_w[threadIdx.x] += s_w[threadIdx.x + offset];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = s_sum[0];
    partial[2 * blockIdx.x + 1] = s_w[0];
  }
}

template <typename scalar_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void nll_loss_deterministic_final_kernel(
    const double* __restrict__ partial, const int64_t n_partial, const bool mean,
    scalar_t* __restrict__ output, scalar_t* __restrict__ total_weight) {
  double sum = 0.0, wsum = 0.0;
  for (int64_t p = threadIdx.x; p < n_partial; p += kNllThreads) {  // ascending per thread
    sum += partial[2 * p];
    wsum += partial[2 * p + 1];
  }
  __shared__ double s_sum[kNllThreads];
  __shared__ double s_w[kNllThreads];
  s_sum[threadIdx.x] = sum;
  s_w[threadIdx.x] = wsum;
  __syncthreads();
  for (int offset = kNllThreads / 2; offset > 0; offset /= 2) {
    if (threadIdx.x < offset) {
      s_sum[threadIdx.x] += s_sum[threadIdx.x + offset];
      s_w[threadIdx.x] += s_w[threadIdx.x + offset];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *total_weight = static_cast<scalar_t>(s_w[0]);
    *output = static_cast<scalar_t>(mean ? s_sum[0] / s_w[0] : s_sum[0]);  // 0/0: NaN, as torch
  }
}

// output and total_weight: 0-dim tensors of input's dtype. input_c, target_c
// (int64 or uint8) and weight_c (or undefined) contiguous; target_c.numel() > 0.
static void nll_loss_forward_reduce_deterministic(
    const at::TensorBase& output, const at::TensorBase& total_weight,
    const at::TensorBase& input_c, const at::TensorBase& target_c, const at::TensorBase& weight_c,
    int64_t n_classes, int64_t inner, bool mean, int64_t ignore_index) {
  const int64_t n_elems = target_c.numel();
  const int64_t n_partial = (n_elems + kNllChunk - 1) / kNllChunk;
  TORCH_CHECK(n_partial <= std::numeric_limits<int>::max(), "nll_loss (deterministic): too many targets");
  auto stream = at::cuda::getCurrentCUDAStream();
  c10::DataPtr partial =
      c10::cuda::CUDACachingAllocator::get()->allocate(2 * n_partial * sizeof(double));
  const bool small = n_elems <= static_cast<int64_t>(std::numeric_limits<uint32_t>::max()) &&
                     inner <= static_cast<int64_t>(std::numeric_limits<uint32_t>::max());
  const det_divmod_u32 inner_div(static_cast<uint32_t>(small ? inner : 1));
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16, input_c.scalar_type(),
      "nll_loss_forward_reduce_cuda_deterministic", [&] {
        const scalar_t* weight = weight_c.defined() ? weight_c.data_ptr<scalar_t>() : nullptr;
        if (target_c.scalar_type() == at::ScalarType::Byte) {
          nll_loss_deterministic_partial_kernel<scalar_t, uint8_t>
              <<<static_cast<int>(n_partial), kNllThreads, 0, stream>>>(
                  input_c.data_ptr<scalar_t>(), target_c.data_ptr<uint8_t>(), weight, n_elems,
                  n_classes, inner_div, inner, small, ignore_index,
                  static_cast<double*>(partial.get()));
        } else {
          nll_loss_deterministic_partial_kernel<scalar_t, int64_t>
              <<<static_cast<int>(n_partial), kNllThreads, 0, stream>>>(
                  input_c.data_ptr<scalar_t>(), target_c.data_ptr<int64_t>(), weight, n_elems,
                  n_classes, inner_div, inner, small, ignore_index,
                  static_cast<double*>(partial.get()));
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        nll_loss_deterministic_final_kernel<scalar_t><<<1, kNllThreads, 0, stream>>>(
            static_cast<const double*>(partial.get()), n_partial, mean,
            output.data_ptr<scalar_t>(), total_weight.data_ptr<scalar_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}
// END nll_reduce

// BEGIN ctc_nonblank
// ---------------------------------------------------------------------------
// CTCLoss backward, the subtrahend of eq. (16) for the non-blank labels:
//   grad[t, b, c] -= sum over target positions s with targets[b, s] == c of
//                    exp(log_alpha[b, t, 2s+1] + log_beta[b, t, 2s+1] + nll[b] - lp[t, b, c]) * gr[b]
// torch runs one thread per (b, s) and adds with atomicAdd, so a label that
// occurs several times in one target races on grad[t, b, c]. Here a first
// kernel links each target position to the next position of the same label
// (and marks the first one); in the second, only the first position of each
// label works: for every t it walks its chain in ascending s, adds the terms
// to grad[t, b, c] in that order and stores once. One writer per element,
// a fixed order; the same terms, computed with the same arithmetic.
// chain[b * max_target_length + s] = 2 * (next + 1) + (first ? 1 : 0), next = -1 at the end.
template <typename target_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void ctc_loss_deterministic_chain_kernel(
    const target_t* __restrict__ targets, const int64_t* __restrict__ tg_batch_offsets,
    const int64_t tg_target_stride, const int64_t* __restrict__ target_lengths,
    const int64_t batch_size, const int64_t max_target_length, int* __restrict__ chain) {
  const int64_t total = batch_size * max_target_length;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t b = i / max_target_length;
    const int64_t s = i - b * max_target_length;
    const int64_t length = target_lengths[b];
    if (s >= length) {
      chain[i] = 0;
      continue;
    }
    const target_t* tg = targets + tg_batch_offsets[b];
    const target_t label = tg[s * tg_target_stride];
    bool first = true;
    for (int64_t p = 0; p < s; ++p) {
      if (tg[p * tg_target_stride] == label) {
        first = false;
        break;
      }
    }
    int64_t next = -1;
    for (int64_t p = s + 1; p < length; ++p) {
      if (tg[p * tg_target_stride] == label) {
        next = p;
        break;
      }
    }
    chain[i] = static_cast<int>(2 * (next + 1) + (first ? 1 : 0));
  }
}

template <typename scalar_t, typename target_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void ctc_loss_deterministic_nonblank_kernel(
    scalar_t* __restrict__ gradient_data, const scalar_t* __restrict__ grad_out_data,
    const int64_t grad_out_batch_stride, const scalar_t* __restrict__ log_alpha_data,
    const scalar_t* __restrict__ log_beta_data, const scalar_t* __restrict__ log_probs_data,
    const int64_t* __restrict__ input_lengths, const target_t* __restrict__ targets_data,
    const int64_t* __restrict__ target_lengths, const scalar_t* __restrict__ neg_log_likelihood_data,
    const int64_t gr_input_stride, const int64_t gr_batch_stride, const int64_t gr_char_stride,
    const int64_t lp_input_stride, const int64_t lp_batch_stride, const int64_t lp_char_stride,
    const int64_t la_batch_stride, const int64_t la_input_stride, const int64_t la_target_stride,
    const int64_t lb_batch_stride, const int64_t lb_input_stride, const int64_t lb_target_stride,
    const int64_t* __restrict__ tg_batch_offsets, const int64_t tg_target_stride,
    const int64_t batch_size, const int64_t max_target_length, const int* __restrict__ chain,
    const bool zero_infinity) {
  const int64_t total = batch_size * max_target_length;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t b = i / max_target_length;
    const int64_t s = i - b * max_target_length;
    if (s >= target_lengths[b] || (chain[i] & 1) == 0) {
      continue;  // beyond the target, or not the first position of its label
    }
    const scalar_t nll = neg_log_likelihood_data[b];
    if (zero_infinity && nll == INFINITY) {
      continue;
    }
    const scalar_t gr = grad_out_data[b * grad_out_batch_stride];
    const int64_t input_length = input_lengths[b];
    const int64_t target = targets_data[tg_batch_offsets[b] + s * tg_target_stride];
    const int* chain_b = chain + b * max_target_length;
    for (int64_t t = 0; t < input_length; ++t) {
      const scalar_t lp = log_probs_data[b * lp_batch_stride + t * lp_input_stride + lp_char_stride * target];
      scalar_t& g = gradient_data[b * gr_batch_stride + t * gr_input_stride + gr_char_stride * target];
      scalar_t acc = g;
      for (int64_t p = s; p >= 0; p = (chain_b[p] >> 1) - 1) {
        acc += -std::exp(log_alpha_data[b * la_batch_stride + la_input_stride * t + la_target_stride * (p * 2 + 1)] +
                         log_beta_data[b * lb_batch_stride + lb_input_stride * t + lb_target_stride * (p * 2 + 1)] +
                         nll - lp) * gr;
      }
      g = acc;
    }
  }
}

// Launches both kernels on the current stream. The pointers and strides are
// those torch's collect_nonblank kernel receives; tg_batch_offsets,
// input_lengths and target_lengths are device arrays.
template <typename scalar_t, typename target_t>
static void ctc_loss_backward_nonblank_deterministic(
    scalar_t* gradient_data, const scalar_t* grad_out_data, int64_t grad_out_batch_stride,
    const scalar_t* log_alpha_data, const scalar_t* log_beta_data, const scalar_t* log_probs_data,
    const int64_t* input_lengths, const target_t* targets_data, const int64_t* target_lengths,
    const scalar_t* neg_log_likelihood_data, int64_t gr_input_stride, int64_t gr_batch_stride,
    int64_t gr_char_stride, int64_t lp_input_stride, int64_t lp_batch_stride, int64_t lp_char_stride,
    int64_t la_batch_stride, int64_t la_input_stride, int64_t la_target_stride,
    int64_t lb_batch_stride, int64_t lb_input_stride, int64_t lb_target_stride,
    const int64_t* tg_batch_offsets, int64_t tg_target_stride, int64_t batch_size,
    int64_t max_target_length, bool zero_infinity) {
  const int64_t total = batch_size * max_target_length;
  if (total == 0) {
    return;
  }
  TORCH_CHECK(max_target_length < (int64_t(1) << 29), "ctc_loss (deterministic): targets too long");
  auto stream = at::cuda::getCurrentCUDAStream();
  c10::DataPtr chain = c10::cuda::CUDACachingAllocator::get()->allocate(total * sizeof(int));
  ctc_loss_deterministic_chain_kernel<target_t><<<det_blocks(total), 256, 0, stream>>>(
      targets_data, tg_batch_offsets, tg_target_stride, target_lengths, batch_size,
      max_target_length, static_cast<int*>(chain.get()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  ctc_loss_deterministic_nonblank_kernel<scalar_t, target_t><<<det_blocks(total), 256, 0, stream>>>(
      gradient_data, grad_out_data, grad_out_batch_stride, log_alpha_data, log_beta_data,
      log_probs_data, input_lengths, targets_data, target_lengths, neg_log_likelihood_data,
      gr_input_stride, gr_batch_stride, gr_char_stride, lp_input_stride, lp_batch_stride,
      lp_char_stride, la_batch_stride, la_input_stride, la_target_stride, lb_batch_stride,
      lb_input_stride, lb_target_stride, tg_batch_offsets, tg_target_stride, batch_size,
      max_target_length, static_cast<const int*>(chain.get()), zero_infinity);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
// END ctc_nonblank

// BEGIN touched_fixed_point
// ---------------------------------------------------------------------------
// det_fixed_point (det_accumulate.cuh) applied to a scatter whose targets are
// data: contribution i (of n) adds value(i) to out[slot(i)], slot(i) < 0
// meaning none. Only the slots that receive something are touched, so the
// cost follows n, not the size of out (torch's own kernels zero-fill out and
// scatter; so do the callers here):
//   A. acc[slot] = 0 for every slot hit; M = max |value| over finite values
//   B. (when asked) acc[slot] += 1: the largest count H over the slots
//   C. acc[slot] += round(value * 2^S) (- 1 when B ran), S = 62 - e - L,
//      2^e > M, L = ceil(log2 H): no slot's sum can overflow (det_common)
//   D. the one thread whose atomicExch takes a non-zero acc[slot] (leaving 0)
//      adds acc / 2^S to out[slot]: a single writer per slot.
// Integer sums are order-independent, the maximum and the count too, so the
// result is bitwise the same in any schedule. When the caller's bound on H is
// loose (fp64, where the bound costs bits: det_common), B measures H exactly.
// Non-finite values go into out[slot] with a float atomic before D
// (order-independent, see det_common).
// acc: one unsigned long long per element of out (not zeroed by the caller).
// state[0]: bits of M, state[1]: H when B runs; zeroed by the caller.
__device__ __forceinline__ int det_touched_log2(unsigned long long h) {
  int l = 0;
  while (l < 62 && (1ull << l) < h) {
    ++l;
  }
  return l;
}

__device__ __forceinline__ unsigned long long det_warp_max(unsigned long long v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const unsigned long long other = __shfl_down_sync(0xffffffffu, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

template <typename source_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void det_touched_zero_kernel(const source_t src, const int64_t n,
                                        unsigned long long* __restrict__ acc,
                                        unsigned long long* __restrict__ state) {
  unsigned long long local = 0;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t rounds = (n + stride - 1) / stride;  // every lane takes part in the shuffles
  for (int64_t r = 0; r < rounds; ++r) {
    const int64_t i = first + r * stride;
    if (i < n) {
      const int64_t slot = src.slot(i);
      if (slot >= 0) {
        acc[slot] = 0ull;
        const double v = static_cast<double>(src.value(i));
        if (::isfinite(v)) {
          const unsigned long long bits = det_abs_bits(v);
          local = bits > local ? bits : local;
        }
      }
    }
  }
  local = det_warp_max(local);
  if ((threadIdx.x & 31) == 0 && local != 0ull) {
    atomicMax(state, local);
  }
}

template <typename source_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void det_touched_count_kernel(const source_t src, const int64_t n,
                                         unsigned long long* __restrict__ acc,
                                         unsigned long long* __restrict__ state) {
  unsigned long long local = 0;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t rounds = (n + stride - 1) / stride;
  for (int64_t r = 0; r < rounds; ++r) {
    const int64_t i = first + r * stride;
    if (i < n) {
      const int64_t slot = src.slot(i);
      if (slot >= 0) {
        const unsigned long long before = atomicAdd(acc + slot, 1ull);
        local = before + 1 > local ? before + 1 : local;
      }
    }
  }
  local = det_warp_max(local);
  if ((threadIdx.x & 31) == 0 && local != 0ull) {
    atomicMax(state + 1, local);
  }
}

template <typename source_t, typename scalar_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void det_touched_scatter_kernel(const source_t src, const int64_t n,
                                           unsigned long long* __restrict__ acc,
                                           scalar_t* __restrict__ out,
                                           const unsigned long long* __restrict__ state,
                                           const int log2_hits, const bool counted) {
  const int shift = det_fixed_point_shift(state[0], counted ? det_touched_log2(state[1]) : log2_hits);
  const unsigned long long uncount = counted ? 1ull : 0ull;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t slot = src.slot(i);
    if (slot < 0) {
      continue;
    }
    const auto v = src.value(i);
    if (::isfinite(static_cast<double>(v))) {
      const long long q = det_fixed_point_from(static_cast<double>(v), shift);
      const unsigned long long add = static_cast<unsigned long long>(q) - uncount;  // wraps exactly
      if (add != 0ull) {
        atomicAdd(acc + slot, add);
      }
    } else {
      if (uncount != 0ull) {
        atomicAdd(acc + slot, ~0ull);  // -1
      }
      gpuAtomicAdd(out + slot, static_cast<scalar_t>(v));
    }
  }
}

template <typename source_t, typename scalar_t, typename opmath_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void det_touched_finish_kernel(const source_t src, const int64_t n,
                                          unsigned long long* __restrict__ acc,
                                          scalar_t* __restrict__ out,
                                          const unsigned long long* __restrict__ state,
                                          const int log2_hits, const bool counted) {
  const int shift = det_fixed_point_shift(state[0], counted ? det_touched_log2(state[1]) : log2_hits);
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t slot = src.slot(i);
    if (slot < 0) {
      continue;
    }
    const unsigned long long q = atomicExch(acc + slot, 0ull);
    if (q != 0ull) {  // the one thread that took the slot's sum
      const double v = det_fixed_point_to(static_cast<long long>(q), shift);
      out[slot] = static_cast<scalar_t>(static_cast<opmath_t>(out[slot]) + static_cast<opmath_t>(v));
    }
  }
}

// out: n_out elements of scalar_t (already holding what the sums add to);
// max_hits: a bound on the contributions one slot can receive.
template <typename source_t, typename scalar_t>
static void det_touched_scatter_add(const source_t& src, int64_t n, scalar_t* out, int64_t n_out,
                                    int64_t max_hits) {
  using opmath_t = at::opmath_type<scalar_t>;
  if (n == 0 || n_out == 0) {
    return;
  }
  auto stream = at::cuda::getCurrentCUDAStream();
  auto* allocator = c10::cuda::CUDACachingAllocator::get();
  c10::DataPtr acc = allocator->allocate(n_out * sizeof(unsigned long long));
  c10::DataPtr state = allocator->allocate(2 * sizeof(unsigned long long));
  auto* acc_p = static_cast<unsigned long long*>(acc.get());
  auto* state_p = static_cast<unsigned long long*>(state.get());
  C10_CUDA_CHECK(cudaMemsetAsync(state_p, 0, 2 * sizeof(unsigned long long), stream));
  const int log2_hits = det_ceil_log2(max_hits < 1 ? 1 : max_hits);
  // the bound costs 2 * log2_hits bits (det_common): measure H for fp64, or when the bound is loose
  const bool counted = std::is_same<scalar_t, double>::value ? log2_hits > 0 : log2_hits > 16;
  const int blocks = det_blocks(n);
  det_touched_zero_kernel<source_t><<<blocks, 256, 0, stream>>>(src, n, acc_p, state_p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (counted) {
    det_touched_count_kernel<source_t><<<blocks, 256, 0, stream>>>(src, n, acc_p, state_p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  det_touched_scatter_kernel<source_t, scalar_t><<<blocks, 256, 0, stream>>>(
      src, n, acc_p, out, state_p, log2_hits, counted);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  det_touched_finish_kernel<source_t, scalar_t, opmath_t><<<blocks, 256, 0, stream>>>(
      src, n, acc_p, out, state_p, log2_hits, counted);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
// END touched_fixed_point

// BEGIN embedding_bag_max
// ---------------------------------------------------------------------------
// EmbeddingBag(mode='max') backward: grad_weight[w, d] = sum of grad[b, d]
// over the bags b whose max in feature d came from row w
// (max_indices[b, d] == w; -1 for an empty bag, padding_idx skipped).
// torch adds these with atomicAdd; when one row is the max of many bags the
// order varies. Here: touched_fixed_point over the numBags * D
// contributions; at most numBags reach one element.
template <typename scalar_t, typename index_t>
struct det_embedding_bag_max_source {
  const index_t* max_indices;
  const scalar_t* grad;
  int64_t stride;  // D
  int64_t padding_idx;
  __device__ __forceinline__ int64_t slot(int64_t i) const {
    const int64_t w = static_cast<int64_t>(max_indices[i]);
    if (w < 0 || w == padding_idx) {
      return -1;
    }
    const int64_t d = i % stride;
    return w * stride + d;
  }
  __device__ __forceinline__ at::opmath_type<scalar_t> value(int64_t i) const {
    return static_cast<at::opmath_type<scalar_t>>(grad[i]);
  }
};

// grad_weight: zeroed (num_weights, D) contiguous; grad_c, max_indices_c:
// contiguous (numBags, D).
static void embedding_bag_backward_max_deterministic(
    const at::TensorBase& grad_weight, const at::TensorBase& grad_c,
    const at::TensorBase& max_indices_c, int64_t padding_idx) {
  const int64_t n = grad_c.numel();
  const int64_t num_bags = grad_c.dim() > 0 ? grad_c.size(0) : 0;
  const int64_t stride = grad_weight.dim() > 1 ? grad_weight.size(1) : 1;
  if (n == 0 || grad_weight.numel() == 0) {
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16, grad_c.scalar_type(),
      "embedding_bag_backward_cuda_max_deterministic", [&] {
        AT_DISPATCH_INDEX_TYPES(max_indices_c.scalar_type(), "embedding_bag_backward_cuda_max_deterministic", [&] {
          det_embedding_bag_max_source<scalar_t, index_t> src;
          src.max_indices = max_indices_c.data_ptr<index_t>();
          src.grad = grad_c.data_ptr<scalar_t>();
          src.stride = stride;
          src.padding_idx = padding_idx;
          det_touched_scatter_add(src, n, grad_weight.data_ptr<scalar_t>(), grad_weight.numel(), num_bags);
        });
      });
}
// END embedding_bag_max

// BEGIN put
// ---------------------------------------------------------------------------
// put_(index, source, accumulate) on a contiguous self: self.view(-1)[index[i]]
// (negative indices wrap) gets source[i], i in source's element order.
// * accumulate=True, floating types: touched_fixed_point (at most
//   index.numel() contributions reach one element); the sum is then added to
//   the element once. Integer types need nothing: integer atomics are exact.
// * accumulate=False: a write conflict when indices repeat. The CPU kernel with
//   one thread visits i in ascending order, so the largest i wins; here one
//   integer atomicMax per i records the winner of each touched element (a
//   maximum does not depend on order), and only the winner writes.
struct det_put_index {
  const int64_t* index;
  int64_t numel;
  __device__ __forceinline__ int64_t wrap(int64_t i) const {
    int64_t t = index[i];
    CUDA_KERNEL_ASSERT(t < numel && t >= -numel && "put_(): index out of bounds");
    return t < 0 ? t + numel : t;
  }
};

template <typename scalar_t>
struct det_put_source {
  det_put_index index;
  const scalar_t* source;
  __device__ __forceinline__ int64_t slot(int64_t i) const { return index.wrap(i); }
  __device__ __forceinline__ at::opmath_type<scalar_t> value(int64_t i) const {
    return static_cast<at::opmath_type<scalar_t>>(source[i]);
  }
};

C10_LAUNCH_BOUNDS_1(256)
__global__ void put_deterministic_claim_kernel(const det_put_index index, const int64_t n,
                                               int* __restrict__ winner, const bool reset) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (reset) {
      winner[index.wrap(i)] = -1;
    } else {
      atomicMax(winner + index.wrap(i), static_cast<int>(i));
    }
  }
}

template <typename scalar_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void put_deterministic_write_kernel(const det_put_index index, const int64_t n,
                                               const int* __restrict__ winner,
                                               const scalar_t* __restrict__ source,
                                               scalar_t* __restrict__ self) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t t = index.wrap(i);
    if (winner[t] == static_cast<int>(i)) {
      self[t] = source[i];
    }
  }
}

// self_c contiguous, index_c (int64) and source_c contiguous with the same
// number of elements. Returns false where no deterministic kernel applies
// (complex accumulation): the caller keeps torch's kernel and its alert.
static bool put_deterministic(const at::TensorBase& self_c, const at::TensorBase& index_c,
                              const at::TensorBase& source_c, bool accumulate) {
  const int64_t n = index_c.numel();
  const int64_t numel = self_c.numel();
  if (n == 0) {
    return true;
  }
  det_put_index index;
  index.index = index_c.data_ptr<int64_t>();
  index.numel = numel;
  auto stream = at::cuda::getCurrentCUDAStream();
  if (accumulate) {
    if (!at::isFloatingType(self_c.scalar_type())) {
      return false;
    }
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::ScalarType::Half, at::ScalarType::BFloat16, self_c.scalar_type(),
        "put_cuda_deterministic", [&] {
          det_put_source<scalar_t> src;
          src.index = index;
          src.source = source_c.data_ptr<scalar_t>();
          det_touched_scatter_add(src, n, self_c.data_ptr<scalar_t>(), numel, n);
        });
    return true;
  }
  TORCH_CHECK(n <= std::numeric_limits<int>::max(), "put_ (deterministic): too many indices");
  c10::DataPtr winner = c10::cuda::CUDACachingAllocator::get()->allocate(numel * sizeof(int));
  int* winner_p = static_cast<int*>(winner.get());
  put_deterministic_claim_kernel<<<det_blocks(n), 256, 0, stream>>>(index, n, winner_p, true);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  put_deterministic_claim_kernel<<<det_blocks(n), 256, 0, stream>>>(index, n, winner_p, false);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  AT_DISPATCH_ALL_TYPES_AND_COMPLEX_AND3(
      at::ScalarType::Half, at::ScalarType::Bool, at::ScalarType::BFloat16, self_c.scalar_type(),
      "put_cuda_deterministic", [&] {
        put_deterministic_write_kernel<scalar_t><<<det_blocks(n), 256, 0, stream>>>(
            index, n, winner_p, source_c.data_ptr<scalar_t>(), self_c.data_ptr<scalar_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return true;
}
// END put
