// Deterministic CUDA kernels for issue 17: adaptive/average pooling backward,
// reflection/replication padding backward, linear/bilinear/bicubic/trilinear
// interpolation backward, max_pool3d / fractional_max_pool2d/3d backward and
// max_unpool2d/3d forward.
//
// Single source, like det_kernels.cuh: the H200 harness (det_ext.cu) compiles
// it against torch 2.11 after det_accumulate.cuh; make_patches.py copies the
// marked sections (after det_accumulate.cuh's det_common section) verbatim
// into the torch 1.13.1 .cu files. The sections use only det_common, names
// that exist in both torches (see det_accumulate.cuh) and gpuAtomicAdd
// (ATen/cuda/Atomic.cuh, which every target file includes).
//
// Every gather kernel below runs one thread per grad_input element (walked in
// grad_input's memory order), enumerates the outputs that feed it in
// ascending order, sums in the accumulate type and stores once: bitwise
// reproducible, no atomics, no scratch (interpolation keeps small per-axis
// tables). grad_input is written in full (no zero fill needed).

// BEGIN adaptive_avg_pool
// Output cell o of an adaptive pooling axis (in -> out) covers input
// [floor(o*in/out), ceil((o+1)*in/out)); input i is covered by output cells
// [floor(i*out/in), ceil((i+1)*out/in)). Divisions by the axis sizes go
// through det_divmod_u32 (multiply-high) on the 32-bit path.
struct det_adaptive_axes {
  det_divmod_u32 by_in[3];   // D, H, W input sizes
  det_divmod_u32 by_out[3];  // D, H, W output sizes
};

template <typename idx_t>
__device__ __forceinline__ idx_t det_adaptive_begin(idx_t a, idx_t to, const det_divmod_u32& from) {
  return det_divq(static_cast<idx_t>(a * to), from);
}
template <typename idx_t>
__device__ __forceinline__ idx_t det_adaptive_end(idx_t a, idx_t to, const det_divmod_u32& from) {
  return det_divq(static_cast<idx_t>((a + 1) * to + static_cast<idx_t>(from.d) - 1), from);
}

// grad_output / window size, once per output cell (the atomic kernel's
// division), into scaled at the same offsets: the gather then only adds.
template <typename scalar_t, typename opmath_t, typename idx_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void adaptive_avg_pool_backward_deterministic_scale_kernel(
    const idx_t total, const det_walk5 walk, const det_view5 gi, const det_view5 go,
    const det_adaptive_axes ax, const scalar_t* __restrict__ grad_output, opmath_t* __restrict__ scaled) {
  const idx_t stride = static_cast<idx_t>(blockDim.x) * gridDim.x;
  const idx_t ID = static_cast<idx_t>(gi.size[2]), IH = static_cast<idx_t>(gi.size[3]),
              IW = static_cast<idx_t>(gi.size[4]);
  for (idx_t linear = static_cast<idx_t>(blockIdx.x) * blockDim.x + threadIdx.x; linear < total;
       linear += stride) {
    int64_t idx[5];
    det_unravel5(walk, linear, idx);
    const idx_t od = static_cast<idx_t>(idx[2]), oh = static_cast<idx_t>(idx[3]), ow = static_cast<idx_t>(idx[4]);
    const idx_t kd = det_adaptive_end(od, ID, ax.by_out[0]) - det_adaptive_begin(od, ID, ax.by_out[0]);
    const idx_t kdh = kd * (det_adaptive_end(oh, IH, ax.by_out[1]) - det_adaptive_begin(oh, IH, ax.by_out[1]));
    const idx_t k = kdh * (det_adaptive_end(ow, IW, ax.by_out[2]) - det_adaptive_begin(ow, IW, ax.by_out[2]));
    idx_t off = 0;
    for (int a = 0; a < 5; ++a) {
      off += static_cast<idx_t>(idx[a]) * static_cast<idx_t>(go.stride[a]);
    }
    scaled[off] = static_cast<opmath_t>(grad_output[off]) / static_cast<opmath_t>(k);
  }
}

// scaled: null, or grad_output already divided (the scale kernel above).
template <typename scalar_t, typename opmath_t, typename idx_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void adaptive_avg_pool_backward_deterministic_kernel(
    const idx_t total, const det_walk5 walk, const det_view5 gi, const det_view5 go,
    const det_adaptive_axes ax,
    scalar_t* __restrict__ grad_input, const scalar_t* __restrict__ grad_output,
    const opmath_t* __restrict__ scaled) {
  const idx_t stride = static_cast<idx_t>(blockDim.x) * gridDim.x;
  const idx_t ID = static_cast<idx_t>(gi.size[2]), IH = static_cast<idx_t>(gi.size[3]),
              IW = static_cast<idx_t>(gi.size[4]);
  const idx_t OD = static_cast<idx_t>(go.size[2]), OH = static_cast<idx_t>(go.size[3]),
              OW = static_cast<idx_t>(go.size[4]);
  const idx_t gs2 = static_cast<idx_t>(go.stride[2]), gs3 = static_cast<idx_t>(go.stride[3]),
              gs4 = static_cast<idx_t>(go.stride[4]);
  for (idx_t linear = static_cast<idx_t>(blockIdx.x) * blockDim.x + threadIdx.x; linear < total;
       linear += stride) {
    int64_t idx[5];
    det_unravel5(walk, linear, idx);
    const idx_t d = static_cast<idx_t>(idx[2]), h = static_cast<idx_t>(idx[3]),
                w = static_cast<idx_t>(idx[4]);
    const idx_t plane = static_cast<idx_t>(idx[0]) * static_cast<idx_t>(go.stride[0]) +
        static_cast<idx_t>(idx[1]) * static_cast<idx_t>(go.stride[1]);
    const scalar_t* gout = grad_output + plane;
    const idx_t od0 = det_adaptive_begin(d, OD, ax.by_in[0]), od1 = det_adaptive_end(d, OD, ax.by_in[0]);
    const idx_t oh0 = det_adaptive_begin(h, OH, ax.by_in[1]), oh1 = det_adaptive_end(h, OH, ax.by_in[1]);
    const idx_t ow0 = det_adaptive_begin(w, OW, ax.by_in[2]), ow1 = det_adaptive_end(w, OW, ax.by_in[2]);
    using acc_t = det_gather_acc_t<scalar_t>;
    acc_t acc = static_cast<acc_t>(0);
    if (scaled != nullptr) {
      const opmath_t* sp = scaled + plane;
      for (idx_t od = od0; od < od1; ++od) {
        for (idx_t oh = oh0; oh < oh1; ++oh) {
          const opmath_t* row = sp + od * gs2 + oh * gs3;
          for (idx_t ow = ow0; ow < ow1; ++ow) {
            acc += static_cast<acc_t>(row[ow * gs4]);
          }
        }
      }
    }
    for (idx_t od = od0; scaled == nullptr && od < od1; ++od) {
      const idx_t kd = det_adaptive_end(od, ID, ax.by_out[0]) - det_adaptive_begin(od, ID, ax.by_out[0]);
      for (idx_t oh = oh0; oh < oh1; ++oh) {
        const idx_t kdh = kd * (det_adaptive_end(oh, IH, ax.by_out[1]) - det_adaptive_begin(oh, IH, ax.by_out[1]));
        const scalar_t* row = gout + od * gs2 + oh * gs3;
        for (idx_t ow = ow0; ow < ow1; ++ow) {
          const idx_t k = kdh * (det_adaptive_end(ow, IW, ax.by_out[2]) - det_adaptive_begin(ow, IW, ax.by_out[2]));
          acc += static_cast<acc_t>(static_cast<opmath_t>(row[ow * gs4]) / static_cast<opmath_t>(k));
        }
      }
    }
    grad_input[static_cast<idx_t>(idx[0]) * static_cast<idx_t>(gi.stride[0]) +
               static_cast<idx_t>(idx[1]) * static_cast<idx_t>(gi.stride[1]) +
               d * static_cast<idx_t>(gi.stride[2]) + h * static_cast<idx_t>(gi.stride[3]) +
               w * static_cast<idx_t>(gi.stride[4])] = static_cast<scalar_t>(acc);
  }
}

// grad_input: same shape as the pooling input (spatial = 2: [N,]C,H,W;
// spatial = 3: [N,]C,D,H,W), any strides; written in full.
static void adaptive_avg_pool_backward_deterministic(
    const at::TensorBase& grad_input, const at::TensorBase& grad_output, int spatial) {
  const int64_t total = grad_input.numel();
  if (total == 0) {
    return;
  }
  const det_view5 gi = det_make_view5(grad_input, spatial);
  const det_view5 go = det_make_view5(grad_output, spatial);
  const det_walk5 walk = det_make_walk5(gi);
  det_adaptive_axes ax;
  bool small = det_fits_int32(gi) && det_fits_int32(go);
  for (int a = 0; a < 3; ++a) {
    ax.by_in[a] = det_divmod_u32(static_cast<uint32_t>(gi.size[2 + a]));
    ax.by_out[a] = det_divmod_u32(static_cast<uint32_t>(go.size[2 + a]));
    // numerators reach (size_in + 1) * (size_out + 1)
    small = small && (gi.size[2 + a] + 1) * (go.size[2 + a] + 1) <= std::numeric_limits<int32_t>::max();
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16, grad_input.scalar_type(),
      "adaptive_avg_pool_backward_cuda_deterministic", [&] {
        using opmath_t = at::opmath_type<scalar_t>;
        auto stream = at::cuda::getCurrentCUDAStream();
        // divide once per output cell when grad_output is dense (its offsets
        // then index a scratch buffer of the same size)
        const int64_t total_out = grad_output.numel();
        const bool prescale = total_out > 0 && det_span(go) == total_out;
        c10::DataPtr scaled;
        if (prescale) {
          scaled = c10::cuda::CUDACachingAllocator::get()->allocate(total_out * sizeof(opmath_t));
        }
        opmath_t* scaled_ptr = static_cast<opmath_t*>(scaled.get());
        if (small) {
          if (prescale) {
            adaptive_avg_pool_backward_deterministic_scale_kernel<scalar_t, opmath_t, int>
                <<<det_blocks(total_out), 256, 0, stream>>>(
                    static_cast<int>(total_out), det_make_walk5(go), gi, go, ax,
                    grad_output.data_ptr<scalar_t>(), scaled_ptr);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
          }
          adaptive_avg_pool_backward_deterministic_kernel<scalar_t, opmath_t, int>
              <<<det_blocks(total), 256, 0, stream>>>(
                  static_cast<int>(total), walk, gi, go, ax, grad_input.data_ptr<scalar_t>(),
                  grad_output.data_ptr<scalar_t>(), scaled_ptr);
        } else {
          if (prescale) {
            adaptive_avg_pool_backward_deterministic_scale_kernel<scalar_t, opmath_t, int64_t>
                <<<det_blocks(total_out), 256, 0, stream>>>(
                    total_out, det_make_walk5(go), gi, go, ax, grad_output.data_ptr<scalar_t>(), scaled_ptr);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
          }
          adaptive_avg_pool_backward_deterministic_kernel<scalar_t, opmath_t, int64_t>
              <<<det_blocks(total), 256, 0, stream>>>(
                  total, walk, gi, go, ax, grad_input.data_ptr<scalar_t>(),
                  grad_output.data_ptr<scalar_t>(), scaled_ptr);
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}
// END adaptive_avg_pool

// BEGIN avg_pool3d
// Output cell o of an axis covers input [o*stride - pad, o*stride - pad + k)
// clipped to the input; input i is covered by cells
// ceil((i + pad - k + 1) / stride) .. floor((i + pad) / stride).
struct det_avg_pool3d_params {
  int64_t k[3], s[3], p[3];
  det_divmod_u32 by_s[3];
  bool count_include_pad;
  int64_t divisor_override;  // 0: none
};

// The divisor of output cell (ot, oh, ow), as the forward and the atomic kernel compute it.
template <typename idx_t>
__device__ __forceinline__ idx_t det_avg_pool3d_divisor(
    const det_avg_pool3d_params& prm, const idx_t* o, const idx_t* K, const idx_t* S, const idx_t* P,
    const idx_t* I) {
  if (prm.divisor_override) {
    return static_cast<idx_t>(prm.divisor_override);
  }
  idx_t n_pad = 1, n = 1;
  for (int a = 0; a < 3; ++a) {
    const idx_t t0 = o[a] * S[a] - P[a];
    const idx_t t1 = ::min(t0 + K[a], I[a] + P[a]);
    n_pad *= t1 - t0;
    n *= ::min(t1, I[a]) - ::max(t0, idx_t(0));
  }
  return prm.count_include_pad ? n_pad : n;
}

// grad_output / divisor once per output cell (the atomic kernel's division),
// into scaled at grad_output's offsets: the gather then only adds.
template <typename scalar_t, typename opmath_t, typename idx_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void avg_pool3d_backward_deterministic_scale_kernel(
    const idx_t total, const det_walk5 walk, const det_view5 gi, const det_view5 go,
    const det_avg_pool3d_params prm, const scalar_t* __restrict__ grad_output,
    opmath_t* __restrict__ scaled) {
  const idx_t stride = static_cast<idx_t>(blockDim.x) * gridDim.x;
  idx_t K[3], S[3], P[3], I[3];
  for (int a = 0; a < 3; ++a) {
    K[a] = static_cast<idx_t>(prm.k[a]);
    S[a] = static_cast<idx_t>(prm.s[a]);
    P[a] = static_cast<idx_t>(prm.p[a]);
    I[a] = static_cast<idx_t>(gi.size[2 + a]);
  }
  for (idx_t linear = static_cast<idx_t>(blockIdx.x) * blockDim.x + threadIdx.x; linear < total;
       linear += stride) {
    int64_t idx[5];
    det_unravel5(walk, linear, idx);
    const idx_t o[3] = {static_cast<idx_t>(idx[2]), static_cast<idx_t>(idx[3]), static_cast<idx_t>(idx[4])};
    idx_t off = 0;
    for (int a = 0; a < 5; ++a) {
      off += static_cast<idx_t>(idx[a]) * static_cast<idx_t>(go.stride[a]);
    }
    scaled[off] = static_cast<opmath_t>(grad_output[off]) /
        static_cast<opmath_t>(det_avg_pool3d_divisor(prm, o, K, S, P, I));
  }
}

// scaled: null, or grad_output already divided (the scale kernel above).
template <typename scalar_t, typename opmath_t, typename idx_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void avg_pool3d_backward_deterministic_kernel(
    const idx_t total, const det_walk5 walk, const det_view5 gi, const det_view5 go,
    const det_avg_pool3d_params prm,
    scalar_t* __restrict__ grad_input, const scalar_t* __restrict__ grad_output,
    const opmath_t* __restrict__ scaled) {
  const idx_t stride = static_cast<idx_t>(blockDim.x) * gridDim.x;
  idx_t K[3], S[3], P[3], I[3], O[3];
  for (int a = 0; a < 3; ++a) {
    K[a] = static_cast<idx_t>(prm.k[a]);
    S[a] = static_cast<idx_t>(prm.s[a]);
    P[a] = static_cast<idx_t>(prm.p[a]);
    I[a] = static_cast<idx_t>(gi.size[2 + a]);
    O[a] = static_cast<idx_t>(go.size[2 + a]);
  }
  const idx_t gs2 = static_cast<idx_t>(go.stride[2]), gs3 = static_cast<idx_t>(go.stride[3]),
              gs4 = static_cast<idx_t>(go.stride[4]);
  const idx_t dov = static_cast<idx_t>(prm.divisor_override);
  for (idx_t linear = static_cast<idx_t>(blockIdx.x) * blockDim.x + threadIdx.x; linear < total;
       linear += stride) {
    int64_t idx[5];
    det_unravel5(walk, linear, idx);
    idx_t lo[3], hi[3];
    for (int a = 0; a < 3; ++a) {
      det_pool_cover(static_cast<idx_t>(idx[2 + a]), K[a], prm.by_s[a], P[a], O[a], &lo[a], &hi[a]);
    }
    const idx_t plane = static_cast<idx_t>(idx[0]) * static_cast<idx_t>(go.stride[0]) +
        static_cast<idx_t>(idx[1]) * static_cast<idx_t>(go.stride[1]);
    const scalar_t* gout = grad_output + plane;
    using acc_t = det_gather_acc_t<scalar_t>;
    acc_t acc = static_cast<acc_t>(0);
    if (scaled != nullptr) {
      const opmath_t* sp = scaled + plane;
      for (idx_t ot = lo[0]; ot <= hi[0]; ++ot) {
        for (idx_t oh = lo[1]; oh <= hi[1]; ++oh) {
          const opmath_t* row = sp + ot * gs2 + oh * gs3;
          for (idx_t ow = lo[2]; ow <= hi[2]; ++ow) {
            acc += static_cast<acc_t>(row[ow * gs4]);
          }
        }
      }
    }
    for (idx_t ot = lo[0]; scaled == nullptr && ot <= hi[0]; ++ot) {
      const idx_t t0 = ot * S[0] - P[0];
      const idx_t t1 = ::min(t0 + K[0], I[0] + P[0]);
      const idx_t nt_pad = t1 - t0;
      const idx_t nt = ::min(t1, I[0]) - ::max(t0, idx_t(0));
      for (idx_t oh = lo[1]; oh <= hi[1]; ++oh) {
        const idx_t h0 = oh * S[1] - P[1];
        const idx_t h1 = ::min(h0 + K[1], I[1] + P[1]);
        const idx_t nth_pad = nt_pad * (h1 - h0);
        const idx_t nth = nt * (::min(h1, I[1]) - ::max(h0, idx_t(0)));
        const scalar_t* row = gout + ot * gs2 + oh * gs3;
        for (idx_t ow = lo[2]; ow <= hi[2]; ++ow) {
          const idx_t w0 = ow * S[2] - P[2];
          const idx_t w1 = ::min(w0 + K[2], I[2] + P[2]);
          idx_t divisor;
          if (dov) {
            divisor = dov;
          } else if (prm.count_include_pad) {
            divisor = nth_pad * (w1 - w0);
          } else {
            divisor = nth * (::min(w1, I[2]) - ::max(w0, idx_t(0)));
          }
          acc += static_cast<acc_t>(static_cast<opmath_t>(row[ow * gs4]) / static_cast<opmath_t>(divisor));
        }
      }
    }
    grad_input[static_cast<idx_t>(idx[0]) * static_cast<idx_t>(gi.stride[0]) +
               static_cast<idx_t>(idx[1]) * static_cast<idx_t>(gi.stride[1]) +
               static_cast<idx_t>(idx[2]) * static_cast<idx_t>(gi.stride[2]) +
               static_cast<idx_t>(idx[3]) * static_cast<idx_t>(gi.stride[3]) +
               static_cast<idx_t>(idx[4]) * static_cast<idx_t>(gi.stride[4])] = static_cast<scalar_t>(acc);
  }
}

// grad_input: [N,]C,T,H,W like the input, any strides; written in full.
static void avg_pool3d_backward_deterministic(
    const at::TensorBase& grad_input, const at::TensorBase& grad_output,
    int64_t kT, int64_t kH, int64_t kW, int64_t dT, int64_t dH, int64_t dW,
    int64_t padT, int64_t padH, int64_t padW, bool count_include_pad,
    int64_t divisor_override) {
  const int64_t total = grad_input.numel();
  if (total == 0) {
    return;
  }
  det_avg_pool3d_params prm;
  prm.k[0] = kT; prm.k[1] = kH; prm.k[2] = kW;
  prm.s[0] = dT; prm.s[1] = dH; prm.s[2] = dW;
  prm.p[0] = padT; prm.p[1] = padH; prm.p[2] = padW;
  for (int a = 0; a < 3; ++a) {
    prm.by_s[a] = det_divmod_u32(static_cast<uint32_t>(prm.s[a]));
  }
  prm.count_include_pad = count_include_pad;
  prm.divisor_override = divisor_override;
  const det_view5 gi = det_make_view5(grad_input, 3);
  const det_view5 go = det_make_view5(grad_output, 3);
  const det_walk5 walk = det_make_walk5(gi);
  const bool small = det_fits_int32(gi) && det_fits_int32(go) &&
      kT * kH * kW <= std::numeric_limits<int32_t>::max() / 8;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16, grad_input.scalar_type(),
      "avg_pool3d_backward_cuda_deterministic", [&] {
        using opmath_t = at::opmath_type<scalar_t>;
        auto stream = at::cuda::getCurrentCUDAStream();
        // divide once per output cell when grad_output is dense (its offsets
        // then index a scratch buffer of the same size)
        // (not when windows do not overlap, kernel <= stride: then each
        // input element divides its one output cell itself)
        const int64_t total_out = grad_output.numel();
        const bool overlap = kT > dT || kH > dH || kW > dW;
        const bool prescale = overlap && total_out > 0 && det_span(go) == total_out;
        c10::DataPtr scaled;
        if (prescale) {
          scaled = c10::cuda::CUDACachingAllocator::get()->allocate(total_out * sizeof(opmath_t));
        }
        opmath_t* scaled_ptr = static_cast<opmath_t*>(scaled.get());
        if (small) {
          if (prescale) {
            avg_pool3d_backward_deterministic_scale_kernel<scalar_t, opmath_t, int>
                <<<det_blocks(total_out), 256, 0, stream>>>(
                    static_cast<int>(total_out), det_make_walk5(go), gi, go, prm,
                    grad_output.data_ptr<scalar_t>(), scaled_ptr);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
          }
          avg_pool3d_backward_deterministic_kernel<scalar_t, opmath_t, int>
              <<<det_blocks(total), 256, 0, stream>>>(
                  static_cast<int>(total), walk, gi, go, prm, grad_input.data_ptr<scalar_t>(),
                  grad_output.data_ptr<scalar_t>(), scaled_ptr);
        } else {
          if (prescale) {
            avg_pool3d_backward_deterministic_scale_kernel<scalar_t, opmath_t, int64_t>
                <<<det_blocks(total_out), 256, 0, stream>>>(
                    total_out, det_make_walk5(go), gi, go, prm, grad_output.data_ptr<scalar_t>(), scaled_ptr);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
          }
          avg_pool3d_backward_deterministic_kernel<scalar_t, opmath_t, int64_t>
              <<<det_blocks(total), 256, 0, stream>>>(
                  total, walk, gi, go, prm, grad_input.data_ptr<scalar_t>(),
                  grad_output.data_ptr<scalar_t>(), scaled_ptr);
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}
// END avg_pool3d

// BEGIN pad
// Padding backward: grad_input[x] is the sum of grad_output over the output
// positions whose source is x. Per axis those form at most three ranges:
//   replication: source(o) = clamp(o - pad_l, 0, I - 1), so x receives
//     [x + pad_l] inside, and everything left of / right of the input at the
//     two edges;
//   reflection (pad < I, one fold, the forward's closed form below): the
//     direct position x + pad_l and its mirror images 2*pad_l - (x + pad_l)
//     and 2*(I + pad_l - 1) - (x + pad_l), each kept if it maps back to x.
// The ranges are disjoint and visited in ascending order.
struct det_pad_params {
  int64_t pad_l[3];  // D, H, W (0 for axes the op does not pad)
  bool reflection;   // else replication
};

template <typename idx_t>
__device__ __forceinline__ idx_t det_reflect_source(idx_t o, idx_t in, idx_t pad_l) {
  const idx_t i_start = pad_l < 0 ? -pad_l : 0;
  const idx_t o_start = pad_l > 0 ? pad_l : 0;
  const idx_t a = o - pad_l;
  const idx_t b = o - (in + pad_l - 1);
  return (a < 0 ? -a : a) - (b < 0 ? -b : b) - o + 2 * pad_l + in - 1 - o_start + i_start;
}

// Ranges [lo[k], hi[k]] of outputs (of size out) that feed input x (of size in).
template <typename idx_t>
__device__ __forceinline__ int det_pad_sources(
    bool reflection, idx_t x, idx_t in, idx_t out, idx_t pad_l, idx_t* lo, idx_t* hi) {
  const idx_t u = x + pad_l;
  if (in == out && pad_l == 0) {  // an axis the op does not pad
    lo[0] = x;
    hi[0] = x;
    return 1;
  }
  // away from the borders an element has one source, the direct position
  // (the general path below finds the same, slower)
  const idx_t pad_r = out - in - pad_l;
  const idx_t edge_l = reflection ? pad_l : idx_t(0), edge_r = reflection ? pad_r : idx_t(0);
  if (pad_l >= 0 && pad_r >= 0 && x > edge_l && x < in - 1 - edge_r) {
    lo[0] = u;
    hi[0] = u;
    return 1;
  }
  if (!reflection) {
    idx_t a = x == 0 ? idx_t(0) : u;
    idx_t b = x == in - 1 ? out - 1 : u;
    a = a < 0 ? idx_t(0) : a;
    b = b > out - 1 ? out - 1 : b;
    if (a > b) {
      return 0;
    }
    lo[0] = a;
    hi[0] = b;
    return 1;
  }
  // candidates in ascending order when pad < in: left mirror, direct, right mirror
  const idx_t cand[3] = {2 * pad_l - u, u, 2 * (in + pad_l - 1) - u};
  int n = 0;
  for (int k = 0; k < 3; ++k) {
    const idx_t o = cand[k];
    if (o < 0 || o >= out || det_reflect_source(o, in, pad_l) != x) {
      continue;
    }
    bool seen = false;
    for (int j = 0; j < n; ++j) {
      seen = seen || lo[j] == o;
    }
    if (!seen) {
      lo[n] = o;
      hi[n] = o;
      ++n;
    }
  }
  return n;  // the order is fixed by the candidate order: all determinism needs
}

// det_pad_sources in three fixed slots: slot k holds [lo[k], hi[k]] (empty:
// lo > hi), in the same order, so the kernel indexes them only with
// constants (a slot index known only at run time puts the arrays in local
// memory).
template <typename idx_t>
__device__ __forceinline__ void det_pad_slots(
    bool reflection, idx_t x, idx_t in, idx_t out, idx_t pad_l, idx_t* lo, idx_t* hi) {
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    lo[k] = 1;
    hi[k] = 0;
  }
  const idx_t u = x + pad_l;
  const idx_t pad_r = out - in - pad_l;
  const idx_t edge_l = reflection ? pad_l : idx_t(0), edge_r = reflection ? pad_r : idx_t(0);
  if ((in == out && pad_l == 0) ||  // an axis the op does not pad
      (pad_l >= 0 && pad_r >= 0 && x > edge_l && x < in - 1 - edge_r)) {  // one source: direct
    lo[0] = u;
    hi[0] = u;
    return;
  }
  if (!reflection) {
    idx_t a = x == 0 ? idx_t(0) : u;
    idx_t b = x == in - 1 ? out - 1 : u;
    lo[0] = a < 0 ? idx_t(0) : a;
    hi[0] = b > out - 1 ? out - 1 : b;
    return;
  }
  // left mirror, direct, right mirror; a candidate equal to an earlier one is dropped
  const idx_t cand[3] = {2 * pad_l - u, u, 2 * (in + pad_l - 1) - u};
  bool valid[3];
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const idx_t o = cand[k];
    valid[k] = o >= 0 && o < out && det_reflect_source(o, in, pad_l) == x;
#pragma unroll
    for (int j = 0; j < k; ++j) {
      valid[k] = valid[k] && !(valid[j] && cand[j] == o);
    }
    if (valid[k]) {
      lo[k] = o;
      hi[k] = o;
    }
  }
}

template <typename scalar_t, typename opmath_t, typename idx_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void pad_backward_deterministic_kernel(
    const idx_t total, const det_walk5 walk, const det_view5 gi, const det_view5 go,
    const det_pad_params prm,
    scalar_t* __restrict__ grad_input, const scalar_t* __restrict__ grad_output) {
  const idx_t stride = static_cast<idx_t>(blockDim.x) * gridDim.x;
  idx_t I[3], O[3], PL[3];
  for (int a = 0; a < 3; ++a) {
    I[a] = static_cast<idx_t>(gi.size[2 + a]);
    O[a] = static_cast<idx_t>(go.size[2 + a]);
    PL[a] = static_cast<idx_t>(prm.pad_l[a]);
  }
  const idx_t gs2 = static_cast<idx_t>(go.stride[2]), gs3 = static_cast<idx_t>(go.stride[3]),
              gs4 = static_cast<idx_t>(go.stride[4]);
  for (idx_t linear = static_cast<idx_t>(blockIdx.x) * blockDim.x + threadIdx.x; linear < total;
       linear += stride) {
    int64_t idx[5];
    det_unravel5(walk, linear, idx);
    idx_t lo[3][3], hi[3][3];
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      det_pad_slots(prm.reflection, static_cast<idx_t>(idx[2 + a]), I[a], O[a], PL[a], lo[a], hi[a]);
    }
    const scalar_t* gout = grad_output + static_cast<idx_t>(idx[0]) * static_cast<idx_t>(go.stride[0]) +
        static_cast<idx_t>(idx[1]) * static_cast<idx_t>(go.stride[1]);
    using acc_t = det_gather_acc_t<scalar_t>;
    acc_t acc = static_cast<acc_t>(0);
#pragma unroll
    for (int rd = 0; rd < 3; ++rd) {
      for (idx_t od = lo[0][rd]; od <= hi[0][rd]; ++od) {
#pragma unroll
        for (int rh = 0; rh < 3; ++rh) {
          for (idx_t oh = lo[1][rh]; oh <= hi[1][rh]; ++oh) {
            const scalar_t* row = gout + od * gs2 + oh * gs3;
#pragma unroll
            for (int rw = 0; rw < 3; ++rw) {
              for (idx_t ow = lo[2][rw]; ow <= hi[2][rw]; ++ow) {
                acc += static_cast<acc_t>(row[ow * gs4]);
              }
            }
          }
        }
      }
    }
    grad_input[static_cast<idx_t>(idx[0]) * static_cast<idx_t>(gi.stride[0]) +
               static_cast<idx_t>(idx[1]) * static_cast<idx_t>(gi.stride[1]) +
               static_cast<idx_t>(idx[2]) * static_cast<idx_t>(gi.stride[2]) +
               static_cast<idx_t>(idx[3]) * static_cast<idx_t>(gi.stride[3]) +
               static_cast<idx_t>(idx[4]) * static_cast<idx_t>(gi.stride[4])] = static_cast<scalar_t>(acc);
  }
}

// spatial = 1, 2, 3; pad_front/top/left are the leading pads of the padded
// axes (D, H, W; the trailing pads follow from the sizes). grad_input is
// written in full.
static void pad_backward_deterministic(
    const at::TensorBase& grad_input, const at::TensorBase& grad_output, int spatial,
    bool reflection, int64_t pad_front, int64_t pad_top, int64_t pad_left) {
  const int64_t total = grad_input.numel();
  if (total == 0) {
    return;
  }
  det_pad_params prm;
  prm.pad_l[0] = spatial >= 3 ? pad_front : 0;
  prm.pad_l[1] = spatial >= 2 ? pad_top : 0;
  prm.pad_l[2] = pad_left;
  prm.reflection = reflection;
  const det_view5 gi = det_make_view5(grad_input, spatial);
  const det_view5 go = det_make_view5(grad_output, spatial);
  const det_walk5 walk = det_make_walk5(gi);
  // 2 * (in + pad) must fit too (the mirror candidates)
  const bool small = det_fits_int32(gi) && det_fits_int32(go);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16, grad_input.scalar_type(),
      "pad_backward_cuda_deterministic", [&] {
        using opmath_t = at::opmath_type<scalar_t>;
        auto stream = at::cuda::getCurrentCUDAStream();
        if (small) {
          pad_backward_deterministic_kernel<scalar_t, opmath_t, int>
              <<<det_blocks(total), 256, 0, stream>>>(
                  static_cast<int>(total), walk, gi, go, prm, grad_input.data_ptr<scalar_t>(),
                  grad_output.data_ptr<scalar_t>());
        } else {
          pad_backward_deterministic_kernel<scalar_t, opmath_t, int64_t>
              <<<det_blocks(total), 256, 0, stream>>>(
                  total, walk, gi, go, prm, grad_input.data_ptr<scalar_t>(),
                  grad_output.data_ptr<scalar_t>());
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}
// END pad

// BEGIN upsample
// Linear/bilinear/trilinear and bicubic interpolation backward.
//
// The forward reads, for output position o of an axis, K input taps
// (linear: i0 and i0 + (i0 < I-1), K = 2; cubic: clamp(floor(src) - 1 + k),
// K = 4) with weights that depend on o only. A first small kernel (one block
// per axis) evaluates the taps and weights of every output position with the
// forward's arithmetic, and for every input position i the range of outputs
// whose taps include it: the lowest and highest taps are non-decreasing in o,
// so that range is contiguous and found by binary search; it also stores, per
// input position, the weight of each output of its range (the sum of that
// output's taps on it), up to a bound maxlen per axis (beyond it the gather
// recomputes the same value from the taps). The gather kernel then sums, per
// grad_input element, grad_output * weight_d * weight_h * weight_w over that
// range, axis by axis, in ascending order. Where an element receives hundreds
// of outputs and there are few elements (upsampling from a tiny input), one
// warp per element: lane l sums terms l, l + 32, ... of the same order, then
// a fixed shuffle tree adds the 32 partial sums; the assignment of terms to
// lanes depends on the shapes only, so the result is bitwise reproducible.
#define DET_INTERP_MAX_TAPS 4

struct det_interp_axis {
  int64_t in, out;     // sizes
  int kind;            // 0: identity (in == out copy), 1: linear, 2: cubic
  int taps;            // K
  int64_t tap_offset;  // into the tap tables: out * DET_INTERP_MAX_TAPS entries
  int64_t range_offset;  // into the range table: 2 * in entries
  int64_t maxlen;        // range weights kept per input position
  int64_t weight_offset;  // into the range-weight table: in * maxlen entries
};

template <typename opmath_t>
struct det_interp_params {
  det_interp_axis axis[3];  // D, H, W
  opmath_t scale[3];        // as the forward computes it (area_pixel_compute_scale)
  bool align_corners;
};

template <typename opmath_t>
__device__ __forceinline__ opmath_t det_interp_source(
    opmath_t scale, int64_t o, bool align_corners, bool cubic) {
  if (align_corners) {
    return scale * static_cast<opmath_t>(o);
  }
  const opmath_t src = scale * (static_cast<opmath_t>(o) + static_cast<opmath_t>(0.5)) -
      static_cast<opmath_t>(0.5);
  return (!cubic && src < static_cast<opmath_t>(0)) ? static_cast<opmath_t>(0) : src;
}

// Keys' cubic convolution kernel with A = -0.75 (the forward's coefficients).
template <typename opmath_t>
__device__ __forceinline__ void det_cubic_weights(opmath_t t, opmath_t* c) {
  const opmath_t A = static_cast<opmath_t>(-0.75);
  const opmath_t one = static_cast<opmath_t>(1);
  const opmath_t x0 = t + one;          // |x| in [1, 2)
  const opmath_t x1 = t;                // [0, 1)
  const opmath_t x2 = one - t;          // [0, 1)
  const opmath_t x3 = (one - t) + one;  // [1, 2)
  c[0] = ((A * x0 - 5 * A) * x0 + 8 * A) * x0 - 4 * A;
  c[1] = ((A + 2) * x1 - (A + 3)) * x1 * x1 + 1;
  c[2] = ((A + 2) * x2 - (A + 3)) * x2 * x2 + 1;
  c[3] = ((A * x3 - 5 * A) * x3 + 8 * A) * x3 - 4 * A;
}

template <typename opmath_t>
__device__ __forceinline__ opmath_t det_interp_weight(
    const int* ti, const opmath_t* wt, int taps, int64_t i) {
  opmath_t w = static_cast<opmath_t>(0);
  for (int k = 0; k < taps; ++k) {
    if (ti[k] == i) {
      w += wt[k];
    }
  }
  return w;
}

// Weight of output o (j-th of input i's range) on i: from the range-weight
// table when j < maxlen, else from the taps (the same value).
template <typename opmath_t>
__device__ __forceinline__ opmath_t det_interp_range_weight(
    const opmath_t* table, int j, int maxlen, const int* ti, const opmath_t* wt, int taps, int64_t i) {
  return j < maxlen ? table[j] : det_interp_weight(ti, wt, taps, i);
}

template <typename opmath_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void upsample_backward_deterministic_tables_kernel(
    const det_interp_params<opmath_t> prm,
    int* __restrict__ tap_index, opmath_t* __restrict__ tap_weight, int* __restrict__ ranges,
    opmath_t* __restrict__ range_weight) {
  const det_interp_axis ax = prm.axis[blockIdx.x];
  const opmath_t scale = prm.scale[blockIdx.x];
  int* tidx = tap_index + ax.tap_offset;
  opmath_t* tw = tap_weight + ax.tap_offset;
  for (int64_t o = threadIdx.x; o < ax.out; o += blockDim.x) {
    int* ti = tidx + o * DET_INTERP_MAX_TAPS;
    opmath_t* wt = tw + o * DET_INTERP_MAX_TAPS;
    if (ax.kind == 0) {
      ti[0] = static_cast<int>(o);
      wt[0] = static_cast<opmath_t>(1);
    } else if (ax.kind == 1) {
      const opmath_t src = det_interp_source(scale, o, prm.align_corners, false);
      const int64_t i0 = static_cast<int64_t>(src);  // src >= 0: truncation is floor
      const int64_t step = i0 < ax.in - 1 ? 1 : 0;
      const opmath_t l1 = src - static_cast<opmath_t>(i0);
      ti[0] = static_cast<int>(i0);
      ti[1] = static_cast<int>(i0 + step);
      wt[0] = static_cast<opmath_t>(1) - l1;
      wt[1] = l1;
    } else {
      const opmath_t src = det_interp_source(scale, o, prm.align_corners, true);
      const opmath_t fl = ::floor(src);
      const int64_t i0 = static_cast<int64_t>(fl);
      opmath_t c[4];
      det_cubic_weights(src - fl, c);
      for (int k = 0; k < 4; ++k) {
        int64_t t = i0 - 1 + k;
        t = t < 0 ? 0 : (t > ax.in - 1 ? ax.in - 1 : t);
        ti[k] = static_cast<int>(t);
        wt[k] = c[k];
      }
    }
  }
  __syncthreads();  // the taps above are read back by other threads of this block
  int* rg = ranges + ax.range_offset;
  for (int64_t i = threadIdx.x; i < ax.in; i += blockDim.x) {
    // first o with highest tap >= i
    int64_t a = 0, b = ax.out;
    while (a < b) {
      const int64_t m = (a + b) / 2;
      if (tidx[m * DET_INTERP_MAX_TAPS + ax.taps - 1] >= i) {
        b = m;
      } else {
        a = m + 1;
      }
    }
    const int64_t begin = a;
    // first o with lowest tap > i
    b = ax.out;
    while (a < b) {
      const int64_t m = (a + b) / 2;
      if (tidx[m * DET_INTERP_MAX_TAPS] > i) {
        b = m;
      } else {
        a = m + 1;
      }
    }
    rg[2 * i] = static_cast<int>(begin);
    rg[2 * i + 1] = static_cast<int>(a);
    opmath_t* rw = range_weight + ax.weight_offset + i * ax.maxlen;
    for (int64_t o = begin; o < a && o - begin < ax.maxlen; ++o) {
      rw[o - begin] = det_interp_weight(tidx + o * DET_INTERP_MAX_TAPS, tw + o * DET_INTERP_MAX_TAPS, ax.taps, i);
    }
  }
}

template <typename scalar_t, typename opmath_t, typename idx_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void upsample_backward_deterministic_gather_kernel(
    const idx_t total, const det_walk5 walk, const det_view5 gi, const det_view5 go,
    const det_interp_params<opmath_t> prm,
    const int* __restrict__ tap_index, const opmath_t* __restrict__ tap_weight,
    const int* __restrict__ ranges, const opmath_t* __restrict__ range_weight,
    scalar_t* __restrict__ grad_input, const scalar_t* __restrict__ grad_output) {
  const idx_t stride = static_cast<idx_t>(blockDim.x) * gridDim.x;
  const int ml_d = static_cast<int>(prm.axis[0].maxlen), ml_h = static_cast<int>(prm.axis[1].maxlen),
            ml_w = static_cast<int>(prm.axis[2].maxlen);
  const int* ti_d = tap_index + prm.axis[0].tap_offset;
  const int* ti_h = tap_index + prm.axis[1].tap_offset;
  const int* ti_w = tap_index + prm.axis[2].tap_offset;
  const opmath_t* tw_d = tap_weight + prm.axis[0].tap_offset;
  const opmath_t* tw_h = tap_weight + prm.axis[1].tap_offset;
  const opmath_t* tw_w = tap_weight + prm.axis[2].tap_offset;
  const int kd = prm.axis[0].taps, kh = prm.axis[1].taps, kw = prm.axis[2].taps;
  const idx_t gs2 = static_cast<idx_t>(go.stride[2]), gs3 = static_cast<idx_t>(go.stride[3]),
              gs4 = static_cast<idx_t>(go.stride[4]);
  for (idx_t linear = static_cast<idx_t>(blockIdx.x) * blockDim.x + threadIdx.x; linear < total;
       linear += stride) {
    int64_t idx[5];
    det_unravel5(walk, linear, idx);
    const int d = static_cast<int>(idx[2]), h = static_cast<int>(idx[3]), w = static_cast<int>(idx[4]);
    const int* rd = ranges + prm.axis[0].range_offset + 2 * d;
    const int* rh = ranges + prm.axis[1].range_offset + 2 * h;
    const int* rw = ranges + prm.axis[2].range_offset + 2 * w;
    const int rd0 = rd[0], rh0 = rh[0], rw0 = rw[0], rw1 = rw[1];
    const opmath_t* rwt_d = range_weight + prm.axis[0].weight_offset + static_cast<int64_t>(d) * ml_d;
    const opmath_t* rwt_h = range_weight + prm.axis[1].weight_offset + static_cast<int64_t>(h) * ml_h;
    const opmath_t* rwt_w = range_weight + prm.axis[2].weight_offset + static_cast<int64_t>(w) * ml_w;
    const scalar_t* gout = grad_output + static_cast<idx_t>(idx[0]) * static_cast<idx_t>(go.stride[0]) +
        static_cast<idx_t>(idx[1]) * static_cast<idx_t>(go.stride[1]);
    using acc_t = det_gather_acc_t<scalar_t>;
    acc_t acc = static_cast<acc_t>(0);
    for (int od = rd0; od < rd[1]; ++od) {
      const opmath_t wd = det_interp_range_weight(rwt_d, od - rd0, ml_d, ti_d + od * DET_INTERP_MAX_TAPS,
                                                  tw_d + od * DET_INTERP_MAX_TAPS, kd, d);
      for (int oh = rh0; oh < rh[1]; ++oh) {
        const opmath_t wdh = wd * det_interp_range_weight(rwt_h, oh - rh0, ml_h, ti_h + oh * DET_INTERP_MAX_TAPS,
                                                          tw_h + oh * DET_INTERP_MAX_TAPS, kh, h);
        const scalar_t* row = gout + static_cast<idx_t>(od) * gs2 + static_cast<idx_t>(oh) * gs3;
        for (int ow = rw0; ow < rw1; ++ow) {
          const opmath_t ww = det_interp_range_weight(rwt_w, ow - rw0, ml_w, ti_w + ow * DET_INTERP_MAX_TAPS,
                                                      tw_w + ow * DET_INTERP_MAX_TAPS, kw, w);
          acc += static_cast<acc_t>(static_cast<opmath_t>(row[static_cast<idx_t>(ow) * gs4]) * (wdh * ww));
        }
      }
    }
    grad_input[static_cast<idx_t>(idx[0]) * static_cast<idx_t>(gi.stride[0]) +
               static_cast<idx_t>(idx[1]) * static_cast<idx_t>(gi.stride[1]) +
               static_cast<idx_t>(d) * static_cast<idx_t>(gi.stride[2]) +
               static_cast<idx_t>(h) * static_cast<idx_t>(gi.stride[3]) +
               static_cast<idx_t>(w) * static_cast<idx_t>(gi.stride[4])] = static_cast<scalar_t>(acc);
  }
}

// One warp per grad_input element (few elements, long ranges): lane l takes
// terms l, l + 32, ... of the element's (od, oh, ow) order, then a fixed
// shuffle tree adds the lanes' sums. The term of each lane and the tree depend
// on the shapes only: bitwise reproducible.
template <typename scalar_t, typename opmath_t, typename idx_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void upsample_backward_deterministic_warp_kernel(
    const idx_t total, const det_walk5 walk, const det_view5 gi, const det_view5 go,
    const det_interp_params<opmath_t> prm,
    const int* __restrict__ tap_index, const opmath_t* __restrict__ tap_weight,
    const int* __restrict__ ranges, const opmath_t* __restrict__ range_weight,
    scalar_t* __restrict__ grad_input, const scalar_t* __restrict__ grad_output) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const idx_t warps = (static_cast<idx_t>(blockDim.x) * gridDim.x) >> 5;
  const int* ti_d = tap_index + prm.axis[0].tap_offset;
  const int* ti_h = tap_index + prm.axis[1].tap_offset;
  const int* ti_w = tap_index + prm.axis[2].tap_offset;
  const opmath_t* tw_d = tap_weight + prm.axis[0].tap_offset;
  const opmath_t* tw_h = tap_weight + prm.axis[1].tap_offset;
  const opmath_t* tw_w = tap_weight + prm.axis[2].tap_offset;
  const int kd = prm.axis[0].taps, kh = prm.axis[1].taps, kw = prm.axis[2].taps;
  const int ml_d = static_cast<int>(prm.axis[0].maxlen), ml_h = static_cast<int>(prm.axis[1].maxlen),
            ml_w = static_cast<int>(prm.axis[2].maxlen);
  const idx_t gs2 = static_cast<idx_t>(go.stride[2]), gs3 = static_cast<idx_t>(go.stride[3]),
              gs4 = static_cast<idx_t>(go.stride[4]);
  // the loop bound is the same for all lanes of a warp, so the shuffles below see full warps
  for (idx_t linear = (static_cast<idx_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; linear < total;
       linear += warps) {
    int64_t idx[5];
    det_unravel5(walk, linear, idx);
    const int d = static_cast<int>(idx[2]), h = static_cast<int>(idx[3]), w = static_cast<int>(idx[4]);
    const int* rd = ranges + prm.axis[0].range_offset + 2 * d;
    const int* rh = ranges + prm.axis[1].range_offset + 2 * h;
    const int* rw = ranges + prm.axis[2].range_offset + 2 * w;
    const int rd0 = rd[0], rh0 = rh[0], rw0 = rw[0];
    const int nh = rh[1] - rh0, nw = rw[1] - rw0;
    const int nhw = nh * nw;
    const int terms = (rd[1] - rd0) * nhw;
    const opmath_t* rwt_d = range_weight + prm.axis[0].weight_offset + static_cast<int64_t>(d) * ml_d;
    const opmath_t* rwt_h = range_weight + prm.axis[1].weight_offset + static_cast<int64_t>(h) * ml_h;
    const opmath_t* rwt_w = range_weight + prm.axis[2].weight_offset + static_cast<int64_t>(w) * ml_w;
    const scalar_t* gout = grad_output + static_cast<idx_t>(idx[0]) * static_cast<idx_t>(go.stride[0]) +
        static_cast<idx_t>(idx[1]) * static_cast<idx_t>(go.stride[1]);
    using acc_t = det_gather_acc_t<scalar_t>;
    acc_t acc = static_cast<acc_t>(0);
    for (int t = lane; t < terms; t += 32) {
      const int jd = t / nhw;
      const int r = t - jd * nhw;
      const int jh = r / nw;
      const int jw = r - jh * nw;
      const int od = rd0 + jd, oh = rh0 + jh, ow = rw0 + jw;
      const opmath_t wd = det_interp_range_weight(rwt_d, jd, ml_d, ti_d + od * DET_INTERP_MAX_TAPS,
                                                  tw_d + od * DET_INTERP_MAX_TAPS, kd, d);
      const opmath_t wdh = wd * det_interp_range_weight(rwt_h, jh, ml_h, ti_h + oh * DET_INTERP_MAX_TAPS,
                                                        tw_h + oh * DET_INTERP_MAX_TAPS, kh, h);
      const opmath_t ww = det_interp_range_weight(rwt_w, jw, ml_w, ti_w + ow * DET_INTERP_MAX_TAPS,
                                                  tw_w + ow * DET_INTERP_MAX_TAPS, kw, w);
      acc += static_cast<acc_t>(static_cast<opmath_t>(
          gout[static_cast<idx_t>(od) * gs2 + static_cast<idx_t>(oh) * gs3 + static_cast<idx_t>(ow) * gs4]) *
          (wdh * ww));
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      acc += __shfl_down_sync(0xffffffffu, acc, offset);
    }
    if (lane == 0) {
      grad_input[static_cast<idx_t>(idx[0]) * static_cast<idx_t>(gi.stride[0]) +
                 static_cast<idx_t>(idx[1]) * static_cast<idx_t>(gi.stride[1]) +
                 static_cast<idx_t>(d) * static_cast<idx_t>(gi.stride[2]) +
                 static_cast<idx_t>(h) * static_cast<idx_t>(gi.stride[3]) +
                 static_cast<idx_t>(w) * static_cast<idx_t>(gi.stride[4])] = static_cast<scalar_t>(acc);
    }
  }
}

// Blocks of 256 threads (8 warps) for one warp per element.
static inline int det_warp_blocks(int64_t n) {
  const int64_t blocks = (n + 7) / 8;
  return static_cast<int>(blocks < 1 ? 1 : (blocks < (int64_t(1) << 20) ? blocks : (int64_t(1) << 20)));
}

template <typename scalar_t, typename opmath_t>
static void upsample_backward_deterministic_run(
    const at::TensorBase& grad_input, const at::TensorBase& grad_output, int spatial,
    bool cubic, bool align_corners, const double* scales) {
  const int64_t total = grad_input.numel();
  const det_view5 gi = det_make_view5(grad_input, spatial);
  const det_view5 go = det_make_view5(grad_output, spatial);
  bool same = true;
  for (int a = 0; a < 3; ++a) {
    same = same && gi.size[2 + a] == go.size[2 + a];
  }
  det_interp_params<opmath_t> prm;
  prm.align_corners = align_corners;
  int64_t taps_total = 0, ranges_total = 0, weights_total = 0;
  double terms = 1.0;  // about how many outputs feed one input element
  for (int a = 0; a < 3; ++a) {
    det_interp_axis& ax = prm.axis[a];
    ax.in = gi.size[2 + a];
    ax.out = go.size[2 + a];
    const bool used = a >= 3 - spatial;
    ax.kind = (!used || same) ? 0 : (cubic ? 2 : 1);
    ax.taps = ax.kind == 0 ? 1 : (ax.kind == 1 ? 2 : 4);
    ax.tap_offset = taps_total;
    ax.range_offset = ranges_total;
    // outputs whose taps reach one input: about (taps + 1) / scale, plus the
    // clamped ones at the edges; a longer range reads its tail from the taps
    int64_t maxlen = 1;
    if (ax.kind != 0) {
      maxlen = scales[a] > 0.0 ? static_cast<int64_t>(std::ceil((ax.taps + 1) / scales[a])) + 3 : ax.out;
      maxlen = std::min<int64_t>(std::max<int64_t>(maxlen, 1), std::max<int64_t>(ax.out, 1));
      if (ax.in * maxlen > (int64_t(1) << 24)) {
        maxlen = 0;  // table too large for its worth: all weights from the taps
      }
      terms *= scales[a] > 0.0 ? std::min<double>(static_cast<double>(ax.out), ax.taps / scales[a])
                               : static_cast<double>(ax.out);
    }
    ax.maxlen = maxlen;
    ax.weight_offset = weights_total;
    taps_total += ax.out * DET_INTERP_MAX_TAPS;
    ranges_total += 2 * ax.in;
    weights_total += ax.in * maxlen;
    prm.scale[a] = static_cast<opmath_t>(scales[a]);  // exact: scales[a] came from opmath_t
  }
  TORCH_CHECK(taps_total < std::numeric_limits<int>::max() &&
              ranges_total < std::numeric_limits<int>::max(),
              "upsample backward (deterministic): sizes too large");
  auto stream = at::cuda::getCurrentCUDAStream();
  auto* allocator = c10::cuda::CUDACachingAllocator::get();
  c10::DataPtr tap_index = allocator->allocate(taps_total * sizeof(int));
  c10::DataPtr tap_weight = allocator->allocate(taps_total * sizeof(opmath_t));
  c10::DataPtr ranges = allocator->allocate(ranges_total * sizeof(int));
  c10::DataPtr range_weight = allocator->allocate(std::max<int64_t>(weights_total, 1) * sizeof(opmath_t));
  upsample_backward_deterministic_tables_kernel<opmath_t><<<3, 256, 0, stream>>>(
      prm, static_cast<int*>(tap_index.get()), static_cast<opmath_t*>(tap_weight.get()),
      static_cast<int*>(ranges.get()), static_cast<opmath_t*>(range_weight.get()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const det_walk5 walk = det_make_walk5(gi);
  const int* ti = static_cast<const int*>(tap_index.get());
  const opmath_t* tw = static_cast<const opmath_t*>(tap_weight.get());
  const int* rg = static_cast<const int*>(ranges.get());
  const opmath_t* rwt = static_cast<const opmath_t*>(range_weight.get());
  // a warp per element when each element sums hundreds of terms and the
  // elements alone would not fill the GPU (a choice by the shapes only)
  const bool per_warp = terms >= 256.0 && total <= (int64_t(1) << 20);
  if (det_fits_int32(gi) && det_fits_int32(go)) {
    if (per_warp) {
      upsample_backward_deterministic_warp_kernel<scalar_t, opmath_t, int>
          <<<det_warp_blocks(total), 256, 0, stream>>>(
              static_cast<int>(total), walk, gi, go, prm, ti, tw, rg, rwt, grad_input.data_ptr<scalar_t>(),
              grad_output.data_ptr<scalar_t>());
    } else {
      upsample_backward_deterministic_gather_kernel<scalar_t, opmath_t, int>
          <<<det_blocks(total), 256, 0, stream>>>(
              static_cast<int>(total), walk, gi, go, prm, ti, tw, rg, rwt, grad_input.data_ptr<scalar_t>(),
              grad_output.data_ptr<scalar_t>());
    }
  } else {
    upsample_backward_deterministic_gather_kernel<scalar_t, opmath_t, int64_t>
        <<<det_blocks(total), 256, 0, stream>>>(
            total, walk, gi, go, prm, ti, tw, rg, rwt, grad_input.data_ptr<scalar_t>(),
            grad_output.data_ptr<scalar_t>());
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // scratch returns to the stream-ordered caching allocator when the DataPtrs go
}

// spatial = 1 (linear), 2 (bilinear / bicubic), 3 (trilinear); cubic only
// with spatial = 2. scale_d/h/w: the forward's per-axis scales (unused axes
// ignored) as area_pixel_compute_scale<accumulate type> returns them, widened
// to double (narrowed back exactly). When every axis has the same size in and
// out the forward copies; so does this. grad_input is written in full.
static void upsample_backward_deterministic(
    const at::TensorBase& grad_input, const at::TensorBase& grad_output, int spatial,
    bool cubic, bool align_corners, double scale_d, double scale_h, double scale_w) {
  if (grad_input.numel() == 0) {
    return;
  }
  const double scales[3] = {scale_d, scale_h, scale_w};
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16, grad_input.scalar_type(),
      "upsample_backward_cuda_deterministic", [&] {
        upsample_backward_deterministic_run<scalar_t, at::opmath_type<scalar_t>>(
            grad_input, grad_output, spatial, cubic, align_corners, scales);
      });
}
// END upsample

// BEGIN index_scatter
// Backward of a pooling whose forward recorded an argmax per output cell
// (max_pool3d, fractional_max_pool2d/3d): grad_input[plane, indices[o]] +=
// grad_output[o]. Contributions are routed by data, so this uses the
// fixed-point primitive of det_common: any order of the integer atomics gives
// the same bits. max_hits bounds how many output cells can share one argmax
// (windows covering one input element).
template <typename scalar_t, typename opmath_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void index_scatter_backward_deterministic_kernel(
    const int64_t total_out, const int64_t out_plane, const int64_t in_plane,
    const scalar_t* __restrict__ grad_output, const int64_t* __restrict__ indices,
    unsigned long long* __restrict__ acc, scalar_t* __restrict__ grad_input,
    const unsigned long long* __restrict__ state, const int log2_hits,
    const det_divmod_u32 div_out_plane, const bool small) {
  const int shift = det_fixed_point_shift(*state, log2_hits);
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total_out;
       o += stride) {
    const int64_t target = indices[o];
    if (target < 0 || target >= in_plane) {
      continue;  // not a valid argmax; the atomic kernel would fault
    }
    const int64_t plane = small ? static_cast<int64_t>(div_out_plane.div(static_cast<uint32_t>(o)))
                                : o / out_plane;
    const int64_t e = plane * in_plane + target;
    det_fixed_point_add(acc + e, grad_input + e, static_cast<opmath_t>(grad_output[o]), shift);
  }
}

// grad_input_c, grad_output_c, indices_c contiguous (planes x in_plane,
// planes x out_plane); grad_input_c is written in full.
static void index_scatter_backward_deterministic(
    const at::TensorBase& grad_input_c, const at::TensorBase& grad_output_c,
    const at::TensorBase& indices_c, int64_t planes, int64_t in_plane, int64_t out_plane,
    int64_t max_hits) {
  const int64_t total_in = planes * in_plane;
  const int64_t total_out = planes * out_plane;
  if (total_in == 0) {
    return;
  }
  auto stream = at::cuda::getCurrentCUDAStream();
  auto* allocator = c10::cuda::CUDACachingAllocator::get();
  if (max_hits > out_plane) {
    max_hits = out_plane;
  }
  const int log2_hits = det_ceil_log2(max_hits < 1 ? 1 : max_hits);
  c10::DataPtr state = allocator->allocate(sizeof(unsigned long long));
  c10::DataPtr acc = allocator->allocate(total_in * sizeof(unsigned long long));
  C10_CUDA_CHECK(cudaMemsetAsync(state.get(), 0, sizeof(unsigned long long), stream));
  const bool small = total_out <= static_cast<int64_t>(std::numeric_limits<uint32_t>::max());
  const det_divmod_u32 div_out_plane(
      static_cast<uint32_t>(small && out_plane > 0 ? out_plane : 1));
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16, grad_input_c.scalar_type(),
      "index_scatter_backward_cuda_deterministic", [&] {
        using opmath_t = at::opmath_type<scalar_t>;
        det_fixed_point_prepare_kernel<scalar_t, opmath_t>
            <<<det_blocks(std::max(total_in, total_out)), 256, 0, stream>>>(
                grad_output_c.data_ptr<scalar_t>(), total_out,
                static_cast<unsigned long long*>(acc.get()), total_in,
                grad_input_c.data_ptr<scalar_t>(), total_in,
                static_cast<unsigned long long*>(state.get()));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        if (total_out > 0) {
          index_scatter_backward_deterministic_kernel<scalar_t, opmath_t>
              <<<det_blocks(total_out), 256, 0, stream>>>(
                  total_out, out_plane, in_plane, grad_output_c.data_ptr<scalar_t>(),
                  indices_c.data_ptr<int64_t>(), static_cast<unsigned long long*>(acc.get()),
                  grad_input_c.data_ptr<scalar_t>(),
                  static_cast<const unsigned long long*>(state.get()), log2_hits, div_out_plane,
                  small);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
        det_fixed_point_finish_kernel<scalar_t, opmath_t>
            <<<det_blocks(total_in), 256, 0, stream>>>(
                static_cast<const unsigned long long*>(acc.get()),
                grad_input_c.data_ptr<scalar_t>(), total_in,
                static_cast<const unsigned long long*>(state.get()), log2_hits);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

// How many windows of one pooling axis can cover one input element.
static inline int64_t det_windows_covering(int64_t kernel, int64_t stride, int64_t dilation) {
  const int64_t span = (kernel - 1) * dilation + 1;
  const int64_t by_span = (span + stride - 1) / stride;
  return by_span < kernel ? by_span : kernel;
}
// END index_scatter

// BEGIN argmax_gather
// Atomic-free alternative to index_scatter for the same ops (the form of
// PT-0201): grad_input is zeroed; each output cell o with argmax t looks at
// the output cells that can share t (a box per axis, below), in ascending
// linear order. If one of them before o has argmax t, o does nothing;
// otherwise o is the first ("leader"): it sums grad_output over all cells of
// the box with argmax t, in that order, and stores once. One writer per
// element, fixed order: bitwise reproducible.
//   max_pool3d: the cells whose window covers t, from t (det_pool_cover with
//     the dilated window extent (k - 1) * dilation + 1);
//   fractional_max_pool2d/3d: window starts are non-decreasing and rise by at
//     least 1 at every step except possibly the last, so cells covering the
//     same t lie within k of each other: the box is o +- k.
struct det_argmax_params {
  int64_t in[3], out[3];   // D, H, W (1 for absent axes)
  int64_t k[3], s[3], p[3];  // max_pool3d: extent, stride, padding
  det_divmod_u32 by_s[3];
  int64_t radius[3];       // fractional: box half-width
  bool from_target;        // true: max_pool3d box; false: fractional box
  det_divmod_u32 by_out_plane, by_out_w, by_out_hw, by_in_w, by_in_hw;
};

template <typename scalar_t, typename opmath_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void argmax_gather_backward_deterministic_kernel(
    const int total_out, const det_argmax_params prm,
    const scalar_t* __restrict__ grad_output, const int64_t* __restrict__ indices,
    scalar_t* __restrict__ grad_input) {
  const int OD = static_cast<int>(prm.out[0]), OH = static_cast<int>(prm.out[1]),
            OW = static_cast<int>(prm.out[2]);
  const int out_plane = OD * OH * OW;
  const int in_plane = static_cast<int>(prm.in[0] * prm.in[1] * prm.in[2]);
  const int stride = static_cast<int>(blockDim.x) * gridDim.x;
  for (int o = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x; o < total_out; o += stride) {
    const int64_t target64 = indices[o];
    if (target64 < 0 || target64 >= in_plane) {
      continue;  // not a valid argmax; the atomic kernel would fault
    }
    const int t = static_cast<int>(target64);
    const int plane = det_divq(o, prm.by_out_plane);
    const int base = plane * out_plane;
    int lo[3], hi[3];
    if (prm.from_target) {
      const int td = det_divq(t, prm.by_in_hw);
      const int thw = t - td * static_cast<int>(prm.in[1] * prm.in[2]);
      const int th = det_divq(thw, prm.by_in_w);
      const int tw = thw - th * static_cast<int>(prm.in[2]);
      const int tt[3] = {td, th, tw};
      for (int a = 0; a < 3; ++a) {
        det_pool_cover(tt[a], static_cast<int>(prm.k[a]), prm.by_s[a], static_cast<int>(prm.p[a]),
                       static_cast<int>(prm.out[a]), &lo[a], &hi[a]);
      }
    } else {
      const int r = o - base;
      const int od = det_divq(r, prm.by_out_hw);
      const int rhw = r - od * OH * OW;
      const int oh = det_divq(rhw, prm.by_out_w);
      const int ow = rhw - oh * OW;
      const int oo[3] = {od, oh, ow};
      for (int a = 0; a < 3; ++a) {
        const int rad = static_cast<int>(prm.radius[a]);
        lo[a] = oo[a] - rad < 0 ? 0 : oo[a] - rad;
        hi[a] = oo[a] + rad > static_cast<int>(prm.out[a]) - 1 ? static_cast<int>(prm.out[a]) - 1 : oo[a] + rad;
      }
    }
    using acc_t = det_gather_acc_t<scalar_t>;
    acc_t acc = static_cast<acc_t>(0);
    bool leader = true;
    for (int d = lo[0]; leader && d <= hi[0]; ++d) {
      for (int h = lo[1]; leader && h <= hi[1]; ++h) {
        const int row = base + (d * OH + h) * OW;
        for (int w = lo[2]; w <= hi[2]; ++w) {
          const int o2 = row + w;
          if (indices[o2] == target64) {
            if (o2 < o) {
              leader = false;
              break;
            }
            acc += static_cast<acc_t>(grad_output[o2]);
          }
        }
      }
    }
    if (leader) {
      grad_input[plane * in_plane + t] = static_cast<scalar_t>(acc);
    }
  }
}

// grad_input_c, grad_output_c, indices_c contiguous; spatial 2 or 3; in/out
// sizes of the pooled axes; for max_pool3d (from_target) kernel, stride,
// padding, dilation per axis; for fractional the pool size per axis. Returns
// false (and does nothing) when the 32-bit index path does not fit; the
// caller then uses index_scatter_backward_deterministic.
static bool argmax_gather_backward_deterministic(
    const at::TensorBase& grad_input_c, const at::TensorBase& grad_output_c,
    const at::TensorBase& indices_c, int spatial, const int64_t* in_size, const int64_t* out_size,
    bool from_target, const int64_t* kernel, const int64_t* stride, const int64_t* padding,
    const int64_t* dilation) {
  const int64_t total_in = grad_input_c.numel();
  const int64_t total_out = grad_output_c.numel();
  const int64_t lim = std::numeric_limits<int32_t>::max();
  if (total_in > lim || total_out > lim) {
    return false;
  }
  if (total_in == 0) {
    return true;
  }
  auto stream = at::cuda::getCurrentCUDAStream();
  C10_CUDA_CHECK(cudaMemsetAsync(grad_input_c.data_ptr(), 0, total_in * grad_input_c.element_size(), stream));
  if (total_out == 0) {
    return true;
  }
  det_argmax_params prm;
  const int off = 3 - spatial;
  for (int a = 0; a < 3; ++a) {
    const bool used = a >= off;
    prm.in[a] = used ? in_size[a - off] : 1;
    prm.out[a] = used ? out_size[a - off] : 1;
    const int64_t k = used ? kernel[a - off] : 1;
    const int64_t dil = used && dilation ? dilation[a - off] : 1;
    prm.k[a] = from_target ? (k - 1) * dil + 1 : k;
    prm.s[a] = used && from_target ? stride[a - off] : 1;
    prm.p[a] = used && from_target ? padding[a - off] : 0;
    prm.by_s[a] = det_divmod_u32(static_cast<uint32_t>(prm.s[a]));
    prm.radius[a] = used ? k : 0;
  }
  prm.from_target = from_target;
  prm.by_out_plane = det_divmod_u32(static_cast<uint32_t>(prm.out[0] * prm.out[1] * prm.out[2]));
  prm.by_out_w = det_divmod_u32(static_cast<uint32_t>(prm.out[2]));
  prm.by_out_hw = det_divmod_u32(static_cast<uint32_t>(prm.out[1] * prm.out[2]));
  prm.by_in_w = det_divmod_u32(static_cast<uint32_t>(prm.in[2]));
  prm.by_in_hw = det_divmod_u32(static_cast<uint32_t>(prm.in[1] * prm.in[2]));
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16, grad_input_c.scalar_type(),
      "argmax_gather_backward_cuda_deterministic", [&] {
        argmax_gather_backward_deterministic_kernel<scalar_t, at::opmath_type<scalar_t>>
            <<<det_blocks(total_out), 256, 0, stream>>>(
                static_cast<int>(total_out), prm, grad_output_c.data_ptr<scalar_t>(),
                indices_c.data_ptr<int64_t>(), grad_input_c.data_ptr<scalar_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return true;
}
// END argmax_gather

// BEGIN max_unpool
// max_unpool2d/3d forward writes output[plane, indices[i]] = input[plane, i].
// Duplicate indices are a write conflict; the CPU kernel visits i in
// ascending order, so the largest i wins there. Here: one integer atomicMax
// per input element records the winning i for each output cell (max is
// order-independent), then every output cell is written once from its winner
// (or 0).
C10_LAUNCH_BOUNDS_1(256)
__global__ void max_unpool_deterministic_winner_kernel(
    const int64_t total_in, const int64_t in_plane, const int64_t out_plane,
    const int64_t* __restrict__ indices, int* __restrict__ winner) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total_in;
       i += stride) {
    const int64_t target = indices[i];
    CUDA_KERNEL_ASSERT(target >= 0 && target < out_plane);
    const int64_t plane = i / in_plane;
    atomicMax(winner + plane * out_plane + target, static_cast<int>(i - plane * in_plane));
  }
}

template <typename scalar_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void max_unpool_deterministic_write_kernel(
    const int64_t total_out, const int64_t in_plane, const int64_t out_plane,
    const int* __restrict__ winner, const scalar_t* __restrict__ input,
    scalar_t* __restrict__ output) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total_out;
       o += stride) {
    const int w = winner[o];
    output[o] = w >= 0 ? input[(o / out_plane) * in_plane + w] : static_cast<scalar_t>(0);
  }
}

// input_c, indices_c, output_c contiguous (planes x in_plane, planes x
// out_plane); output_c is written in full.
static void max_unpool_deterministic(
    const at::TensorBase& output_c, const at::TensorBase& input_c,
    const at::TensorBase& indices_c, int64_t planes, int64_t in_plane, int64_t out_plane) {
  const int64_t total_in = planes * in_plane;
  const int64_t total_out = planes * out_plane;
  if (total_out == 0) {
    return;
  }
  TORCH_CHECK(in_plane <= std::numeric_limits<int>::max(),
              "max_unpool (deterministic): input planes too large");
  auto stream = at::cuda::getCurrentCUDAStream();
  c10::DataPtr winner = c10::cuda::CUDACachingAllocator::get()->allocate(total_out * sizeof(int));
  C10_CUDA_CHECK(cudaMemsetAsync(winner.get(), 0xff, total_out * sizeof(int), stream));  // -1
  if (total_in > 0) {
    max_unpool_deterministic_winner_kernel<<<det_blocks(total_in), 256, 0, stream>>>(
        total_in, in_plane, out_plane, indices_c.data_ptr<int64_t>(),
        static_cast<int*>(winner.get()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16, output_c.scalar_type(),
      "max_unpool_cuda_deterministic", [&] {
        max_unpool_deterministic_write_kernel<scalar_t>
            <<<det_blocks(total_out), 256, 0, stream>>>(
                total_out, in_plane, out_plane, static_cast<const int*>(winner.get()),
                input_c.data_ptr<scalar_t>(), output_c.data_ptr<scalar_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}
// END max_unpool
