// Deterministic CUDA backward of antialiased bilinear / bicubic interpolation
// (F.interpolate(..., antialias=True): _upsample_bilinear2d_aa_backward and
// _upsample_bicubic2d_aa_backward), the last gap of the determinism series (PT-0232).
//
// A header of its own rather than a section of det_kernels17.cuh: the sections of
// that header are carried verbatim by PT-0203 .. PT-0222, so adding here leaves
// them (and their proof) untouched. The section needs det_common
// (det_accumulate.cuh) before it, which torch 1.13.1's UpSampleBilinear2d.cu
// already carries through PT-0208; make_patches_aa.py copies the section into
// that file, det_ext_aa.cu includes this header against torch 2.11. Only names
// that exist in both are used (as in det_accumulate.cuh), C++14, CUDA 11.2.
//
// BEGIN upsample_aa
// Antialiased bilinear / bicubic interpolation backward, gather form.
//
// The forward gives output position o of an axis the input span
// [xmin(o), xmin(o) + xsize(o)) around center = scale * (o + 0.5), of
// half-width support = (filter size / 2) * max(scale, 1), and per tap j the
// weight filter((j + xmin - center + 0.5) / max(scale, 1)), stored in the
// tensor's dtype and divided by the sum of the unrounded weights (kept in the
// accumulate type). torch's backward adds w_x * w_y * grad_output into every
// tap with atomicAdd; outputs share taps, so the sums round in a racing order.
//
// Here a small kernel (one block per axis) evaluates every output's span and
// weights with that arithmetic and those types (the center fused into its
// differences, see below), so the weights are the forward's up to rounding. Both ends of the span are non-decreasing in o, so the outputs
// whose span holds input i form one contiguous range, found by binary search;
// the kernel also keeps, per input, the weight of each output of its range
// (up to maxlen; beyond, the gather reads the same value from the output's
// taps). One thread per grad_input element, walked in memory order (contiguous
// and channels-last alike), then sums (w_x * w_y) * grad_output over the rows
// and, within each row, the columns of its ranges, in ascending order, in the
// gather accumulate type (det_gather_acc_t), and stores once: no atomics, no
// zero fill, an order fixed by the shapes. Where each element receives hundreds
// of outputs and there are few elements (antialiased upsampling from a small
// input), one warp sums an element: lane l takes terms l, l + 32, ... of the
// same order and a fixed shuffle tree adds the lanes' sums. When both axes keep
// their size torch copies grad_output; the tables then hold one tap of weight 1.
// There is no shared-memory bound on the support (torch's kernel refuses large
// downsampling factors for want of shared memory; this one does not).

struct det_aa_axis {
  int in, out;            // sizes
  int taps;               // weights kept per output: >= every span (2 * ceil(support) + 2)
  int maxlen;             // range weights kept per input
  int64_t span_offset;    // into the span tables: out entries
  int64_t tap_offset;     // into the tap weights: out * taps entries
  int64_t range_offset;   // into the ranges: 2 * in entries
  int64_t weight_offset;  // into the range weights: in * maxlen entries
};

template <typename opmath_t>
struct det_aa_params {
  det_aa_axis axis[2];  // H, W
  opmath_t scale[2];    // as area_pixel_compute_scale<accumulate type> returns it
  bool bicubic;         // Keys' cubic with a = -0.5 (size 4), else the triangle (size 2)
  bool copy;            // both axes keep their size
};

// a * b + c with one rounding
__device__ __forceinline__ float det_aa_fma(float a, float b, float c) {
  return fmaf(a, b, c);
}
__device__ __forceinline__ double det_aa_fma(double a, double b, double c) {
  return fma(a, b, c);
}

// The forward's filters, in its accumulate type.
template <typename opmath_t>
__device__ __forceinline__ opmath_t det_aa_filter(opmath_t x, bool bicubic) {
  if (x < 0) {
    x = -x;
  }
  if (!bicubic) {
    if (x < 1) {
      return 1 - x;
    }
    return 0;
  }
  const opmath_t a = -0.5;
  if (x < 1) {
    return ((a + 2) * x - (a + 3)) * x * x + 1;
  }
  if (x < 2) {
    return (((x - 5) * x + 8) * x - 4) * a;
  }
  return 0;
}

template <typename scalar_t, typename opmath_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void upsample_aa_backward_deterministic_tables_kernel(
    const det_aa_params<opmath_t> prm, int* __restrict__ span_min, int* __restrict__ span_end,
    scalar_t* __restrict__ tap_weight, int* __restrict__ ranges, scalar_t* __restrict__ range_weight) {
  const det_aa_axis ax = prm.axis[blockIdx.x];
  const opmath_t scale = prm.scale[blockIdx.x];
  int* smin = span_min + ax.span_offset;
  int* send = span_end + ax.span_offset;
  scalar_t* tw = tap_weight + ax.tap_offset;
  const int size = prm.bicubic ? 4 : 2;
  // the forward's support and inverse scale, with its literal types (double, then narrowed)
  const opmath_t support = static_cast<opmath_t>(scale >= 1.0 ? (size * 0.5) * scale : size * 0.5);
  const opmath_t invscale = (scale >= 1.0) ? 1.0 / scale : 1.0;
  for (int o = threadIdx.x; o < ax.out; o += blockDim.x) {
    scalar_t* wt = tw + static_cast<int64_t>(o) * ax.taps;
    if (prm.copy) {
      smin[o] = o;
      send[o] = o + 1;
      wt[0] = static_cast<scalar_t>(1);
      continue;
    }
    // center = scale * (o + 0.5) reaches hundreds of pixels; rounded on its own it cost fp32
    // weights up to 1e-5 (measured on the H200: 40x torch's error), so it is formed inside one
    // fused multiply-add with what is subtracted from it, which loses only the final rounding
    // (torch's compiled kernel is that accurate: nvcc contracts the forward's expressions)
    const opmath_t pos = o + static_cast<opmath_t>(0.5);
    const int lo = static_cast<int>(det_aa_fma(scale, pos, -support) + static_cast<opmath_t>(0.5));
    const int xmin = lo > 0 ? lo : 0;
    const int hi = static_cast<int>(det_aa_fma(scale, pos, support) + static_cast<opmath_t>(0.5));
    const int xsize = (hi < ax.in ? hi : ax.in) - xmin;
    CUDA_KERNEL_ASSERT(xsize <= ax.taps);
    smin[o] = xmin;
    send[o] = xmin + xsize;
    const opmath_t xmin_m_center = det_aa_fma(-scale, pos, static_cast<opmath_t>(xmin));  // xmin - center
    opmath_t total_w = 0.0;
    for (int j = 0; j < xsize; ++j) {
      const opmath_t w = det_aa_filter<opmath_t>((j + xmin_m_center + static_cast<opmath_t>(0.5)) * invscale,
                                                 prm.bicubic);
      wt[j] = static_cast<scalar_t>(w);  // rounded to the dtype, as the forward keeps it
      total_w += w;
    }
    for (int j = 0; j < xsize; ++j) {
      if (total_w != 0.0) {
        wt[j] /= total_w;  // the dtype's own division, as in the forward
      }
    }
  }
  __syncthreads();  // the spans above are read back by other threads of this block
  int* rg = ranges + ax.range_offset;
  for (int i = threadIdx.x; i < ax.in; i += blockDim.x) {
    // first o whose span ends after i
    int a = 0, b = ax.out;
    while (a < b) {
      const int m = (a + b) / 2;
      if (send[m] > i) {
        b = m;
      } else {
        a = m + 1;
      }
    }
    const int begin = a;
    // first o whose span starts after i
    b = ax.out;
    while (a < b) {
      const int m = (a + b) / 2;
      if (smin[m] > i) {
        b = m;
      } else {
        a = m + 1;
      }
    }
    rg[2 * i] = begin;
    rg[2 * i + 1] = a;
    scalar_t* rw = range_weight + ax.weight_offset + static_cast<int64_t>(i) * ax.maxlen;
    for (int o = begin; o < a && o - begin < ax.maxlen; ++o) {
      rw[o - begin] = tw[static_cast<int64_t>(o) * ax.taps + (i - smin[o])];
    }
  }
}

// Weight of output o (the j-th of input i's range) on i.
template <typename scalar_t>
__device__ __forceinline__ scalar_t det_aa_weight(
    const scalar_t* range_w, int j, int maxlen, const scalar_t* tap_w, const int* span_min, int taps, int o, int i) {
  return j < maxlen ? range_w[j] : tap_w[static_cast<int64_t>(o) * taps + (i - span_min[o])];
}

template <typename scalar_t, typename opmath_t, typename idx_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void upsample_aa_backward_deterministic_gather_kernel(
    const idx_t total, const det_walk5 walk, const det_view5 gi, const det_view5 go,
    const det_aa_params<opmath_t> prm, const int* __restrict__ span_min, const scalar_t* __restrict__ tap_weight,
    const int* __restrict__ ranges, const scalar_t* __restrict__ range_weight,
    scalar_t* __restrict__ grad_input, const scalar_t* __restrict__ grad_output) {
  const idx_t stride = static_cast<idx_t>(blockDim.x) * gridDim.x;
  const det_aa_axis ah = prm.axis[0], aw = prm.axis[1];
  const int* smin_h = span_min + ah.span_offset;
  const int* smin_w = span_min + aw.span_offset;
  const scalar_t* tw_h = tap_weight + ah.tap_offset;
  const scalar_t* tw_w = tap_weight + aw.tap_offset;
  const idx_t gs3 = static_cast<idx_t>(go.stride[3]), gs4 = static_cast<idx_t>(go.stride[4]);
  using acc_t = det_gather_acc_t<scalar_t>;
  for (idx_t linear = static_cast<idx_t>(blockIdx.x) * blockDim.x + threadIdx.x; linear < total;
       linear += stride) {
    int64_t idx[5];
    det_unravel5(walk, linear, idx);
    const int h = static_cast<int>(idx[3]), w = static_cast<int>(idx[4]);
    const int* rh = ranges + ah.range_offset + 2 * h;
    const int* rw = ranges + aw.range_offset + 2 * w;
    const int rh0 = rh[0], rh1 = rh[1], rw0 = rw[0], rw1 = rw[1];
    const scalar_t* rwt_h = range_weight + ah.weight_offset + static_cast<int64_t>(h) * ah.maxlen;
    const scalar_t* rwt_w = range_weight + aw.weight_offset + static_cast<int64_t>(w) * aw.maxlen;
    const scalar_t* gout = grad_output + static_cast<idx_t>(idx[0]) * static_cast<idx_t>(go.stride[0]) +
        static_cast<idx_t>(idx[1]) * static_cast<idx_t>(go.stride[1]);
    acc_t acc = static_cast<acc_t>(0);
    for (int oh = rh0; oh < rh1; ++oh) {
      const opmath_t wy = static_cast<opmath_t>(
          det_aa_weight(rwt_h, oh - rh0, ah.maxlen, tw_h, smin_h, ah.taps, oh, h));
      const scalar_t* row = gout + static_cast<idx_t>(oh) * gs3;
      for (int ow = rw0; ow < rw1; ++ow) {
        const opmath_t wx = static_cast<opmath_t>(
            det_aa_weight(rwt_w, ow - rw0, aw.maxlen, tw_w, smin_w, aw.taps, ow, w));
        // the atomic kernel's term, w_x * w_y * grad_output (formed in the accumulate type)
        acc += static_cast<acc_t>((wx * wy) * static_cast<opmath_t>(row[static_cast<idx_t>(ow) * gs4]));
      }
    }
    grad_input[static_cast<idx_t>(idx[0]) * static_cast<idx_t>(gi.stride[0]) +
               static_cast<idx_t>(idx[1]) * static_cast<idx_t>(gi.stride[1]) +
               static_cast<idx_t>(h) * static_cast<idx_t>(gi.stride[3]) +
               static_cast<idx_t>(w) * static_cast<idx_t>(gi.stride[4])] = static_cast<scalar_t>(acc);
  }
}

// One warp per grad_input element: lane l takes terms l, l + 32, ... of the
// element's (oh, ow) order, then a fixed shuffle tree adds the lanes' sums. The
// terms of each lane and the tree depend on the shapes only: bitwise reproducible.
template <typename scalar_t, typename opmath_t, typename idx_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void upsample_aa_backward_deterministic_warp_kernel(
    const idx_t total, const det_walk5 walk, const det_view5 gi, const det_view5 go,
    const det_aa_params<opmath_t> prm, const int* __restrict__ span_min, const scalar_t* __restrict__ tap_weight,
    const int* __restrict__ ranges, const scalar_t* __restrict__ range_weight,
    scalar_t* __restrict__ grad_input, const scalar_t* __restrict__ grad_output) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const idx_t warps = (static_cast<idx_t>(blockDim.x) * gridDim.x) >> 5;
  const det_aa_axis ah = prm.axis[0], aw = prm.axis[1];
  const int* smin_h = span_min + ah.span_offset;
  const int* smin_w = span_min + aw.span_offset;
  const scalar_t* tw_h = tap_weight + ah.tap_offset;
  const scalar_t* tw_w = tap_weight + aw.tap_offset;
  const idx_t gs3 = static_cast<idx_t>(go.stride[3]), gs4 = static_cast<idx_t>(go.stride[4]);
  using acc_t = det_gather_acc_t<scalar_t>;
  // the loop bound is the same for all lanes of a warp, so the shuffles below see full warps
  for (idx_t linear = (static_cast<idx_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; linear < total;
       linear += warps) {
    int64_t idx[5];
    det_unravel5(walk, linear, idx);
    const int h = static_cast<int>(idx[3]), w = static_cast<int>(idx[4]);
    const int* rh = ranges + ah.range_offset + 2 * h;
    const int* rw = ranges + aw.range_offset + 2 * w;
    const int rh0 = rh[0], rw0 = rw[0];
    const int nw = rw[1] - rw0;
    const int terms = (rh[1] - rh0) * nw;
    const scalar_t* rwt_h = range_weight + ah.weight_offset + static_cast<int64_t>(h) * ah.maxlen;
    const scalar_t* rwt_w = range_weight + aw.weight_offset + static_cast<int64_t>(w) * aw.maxlen;
    const scalar_t* gout = grad_output + static_cast<idx_t>(idx[0]) * static_cast<idx_t>(go.stride[0]) +
        static_cast<idx_t>(idx[1]) * static_cast<idx_t>(go.stride[1]);
    acc_t acc = static_cast<acc_t>(0);
    for (int t = lane; t < terms; t += 32) {
      const int jh = t / nw;
      const int jw = t - jh * nw;
      const int oh = rh0 + jh, ow = rw0 + jw;
      const opmath_t wy = static_cast<opmath_t>(det_aa_weight(rwt_h, jh, ah.maxlen, tw_h, smin_h, ah.taps, oh, h));
      const opmath_t wx = static_cast<opmath_t>(det_aa_weight(rwt_w, jw, aw.maxlen, tw_w, smin_w, aw.taps, ow, w));
      acc += static_cast<acc_t>((wx * wy) *
                                static_cast<opmath_t>(gout[static_cast<idx_t>(oh) * gs3 + static_cast<idx_t>(ow) * gs4]));
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      acc += __shfl_down_sync(0xffffffffu, acc, offset);
    }
    if (lane == 0) {
      grad_input[static_cast<idx_t>(idx[0]) * static_cast<idx_t>(gi.stride[0]) +
                 static_cast<idx_t>(idx[1]) * static_cast<idx_t>(gi.stride[1]) +
                 static_cast<idx_t>(h) * static_cast<idx_t>(gi.stride[3]) +
                 static_cast<idx_t>(w) * static_cast<idx_t>(gi.stride[4])] = static_cast<scalar_t>(acc);
    }
  }
}

// Blocks of 256 threads (8 warps) for one warp per element.
static inline int det_aa_warp_blocks(int64_t n) {
  const int64_t blocks = (n + 7) / 8;
  return static_cast<int>(blocks < 1 ? 1 : (blocks < (int64_t(1) << 20) ? blocks : (int64_t(1) << 20)));
}

template <typename scalar_t, typename opmath_t, typename idx_t>
static void upsample_aa_backward_deterministic_launch(
    int64_t total, bool per_warp, const det_walk5& walk, const det_view5& gi, const det_view5& go,
    const det_aa_params<opmath_t>& prm, const int* smin, const scalar_t* tw, const int* rg, const scalar_t* rwt,
    scalar_t* grad_input, const scalar_t* grad_output) {
  auto stream = at::cuda::getCurrentCUDAStream();
  if (per_warp) {
    upsample_aa_backward_deterministic_warp_kernel<scalar_t, opmath_t, idx_t>
        <<<det_aa_warp_blocks(total), 256, 0, stream>>>(
            static_cast<idx_t>(total), walk, gi, go, prm, smin, tw, rg, rwt, grad_input, grad_output);
  } else {
    upsample_aa_backward_deterministic_gather_kernel<scalar_t, opmath_t, idx_t>
        <<<det_blocks(total), 256, 0, stream>>>(
            static_cast<idx_t>(total), walk, gi, go, prm, smin, tw, rg, rwt, grad_input, grad_output);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t, typename opmath_t>
static void upsample_aa_backward_deterministic_run(
    const at::TensorBase& grad_input, const at::TensorBase& grad_output, bool bicubic, const double* scales) {
  const int64_t total = grad_input.numel();
  const det_view5 gi = det_make_view5(grad_input, 2);
  const det_view5 go = det_make_view5(grad_output, 2);
  det_aa_params<opmath_t> prm;
  prm.bicubic = bicubic;
  prm.copy = gi.size[3] == go.size[3] && gi.size[4] == go.size[4];
  int64_t spans_total = 0, taps_total = 0, ranges_total = 0, weights_total = 0;
  double terms = 1.0;  // about how many outputs feed one input element
  for (int a = 0; a < 2; ++a) {
    det_aa_axis& ax = prm.axis[a];
    TORCH_CHECK(gi.size[3 + a] < std::numeric_limits<int>::max() / 2 &&
                go.size[3 + a] < std::numeric_limits<int>::max() / 2,
                "upsample antialias backward (deterministic): sizes too large");
    ax.in = static_cast<int>(gi.size[3 + a]);
    ax.out = static_cast<int>(go.size[3 + a]);
    const double scale = scales[a];
    const double support = (bicubic ? 2.0 : 1.0) * (scale >= 1.0 ? scale : 1.0);
    // a span holds at most 2 * support + 1 inputs (see the forward's span)
    ax.taps = prm.copy ? 1 : static_cast<int>(std::ceil(support)) * 2 + 2;
    // outputs whose span holds one input: their centers lie within support + 1
    // of it, spaced by scale; a longer range reads its tail from the taps
    const double bound = prm.copy ? 1.0 : (scale > 0.0 ? std::ceil((2.0 * support + 2.0) / scale) + 2.0 : ax.out);
    int64_t len = static_cast<int64_t>(std::min<double>(std::max<double>(bound, 1.0), std::max<int>(ax.out, 1)));
    terms *= prm.copy ? 1.0 : std::min<double>(ax.out, scale > 0.0 ? 2.0 * support / scale : ax.out);
    if (static_cast<int64_t>(ax.in) * len > (int64_t(1) << 24)) {
      len = 0;  // table too large for its worth: every weight from the taps
    }
    ax.maxlen = static_cast<int>(len);
    ax.span_offset = spans_total;
    ax.tap_offset = taps_total;
    ax.range_offset = ranges_total;
    ax.weight_offset = weights_total;
    spans_total += ax.out;
    taps_total += static_cast<int64_t>(ax.out) * ax.taps;
    ranges_total += 2 * static_cast<int64_t>(ax.in);
    weights_total += static_cast<int64_t>(ax.in) * ax.maxlen;
    prm.scale[a] = static_cast<opmath_t>(scale);  // exact: the scale came from opmath_t
  }
  auto stream = at::cuda::getCurrentCUDAStream();
  auto* allocator = c10::cuda::CUDACachingAllocator::get();
  c10::DataPtr span_min = allocator->allocate(std::max<int64_t>(spans_total, 1) * sizeof(int));
  c10::DataPtr span_end = allocator->allocate(std::max<int64_t>(spans_total, 1) * sizeof(int));
  c10::DataPtr tap_weight = allocator->allocate(std::max<int64_t>(taps_total, 1) * sizeof(scalar_t));
  c10::DataPtr ranges = allocator->allocate(std::max<int64_t>(ranges_total, 1) * sizeof(int));
  c10::DataPtr range_weight = allocator->allocate(std::max<int64_t>(weights_total, 1) * sizeof(scalar_t));
  upsample_aa_backward_deterministic_tables_kernel<scalar_t, opmath_t><<<2, 256, 0, stream>>>(
      prm, static_cast<int*>(span_min.get()), static_cast<int*>(span_end.get()),
      static_cast<scalar_t*>(tap_weight.get()), static_cast<int*>(ranges.get()),
      static_cast<scalar_t*>(range_weight.get()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const det_walk5 walk = det_make_walk5(gi);
  // a warp per element when each element sums hundreds of terms and the
  // elements alone would not fill the GPU (a choice by the shapes only)
  const bool per_warp = terms >= 256.0 && total <= (int64_t(1) << 20);
  const int* smin = static_cast<const int*>(span_min.get());
  const scalar_t* tw = static_cast<const scalar_t*>(tap_weight.get());
  const int* rg = static_cast<const int*>(ranges.get());
  const scalar_t* rwt = static_cast<const scalar_t*>(range_weight.get());
  if (det_fits_int32(gi) && det_fits_int32(go)) {
    upsample_aa_backward_deterministic_launch<scalar_t, opmath_t, int>(
        total, per_warp, walk, gi, go, prm, smin, tw, rg, rwt, grad_input.data_ptr<scalar_t>(),
        grad_output.data_ptr<scalar_t>());
  } else {
    upsample_aa_backward_deterministic_launch<scalar_t, opmath_t, int64_t>(
        total, per_warp, walk, gi, go, prm, smin, tw, rg, rwt, grad_input.data_ptr<scalar_t>(),
        grad_output.data_ptr<scalar_t>());
  }
  // scratch returns to the stream-ordered caching allocator when the DataPtrs go
}

// grad_input (N, C, H, W; any strides, written in full) from grad_output (N, C,
// OH, OW; any strides). scale_h, scale_w: the forward's scales as
// area_pixel_compute_scale<accumulate type> returns them, widened to double
// (narrowed back exactly). bicubic selects the filter.
static void upsample_aa_backward_deterministic(
    const at::TensorBase& grad_input, const at::TensorBase& grad_output, bool bicubic,
    double scale_h, double scale_w) {
  if (grad_input.numel() == 0) {
    return;
  }
  const double scales[2] = {scale_h, scale_w};
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16, grad_input.scalar_type(),
      "upsample_aa_backward_cuda_deterministic", [&] {
        upsample_aa_backward_deterministic_run<scalar_t, at::opmath_type<scalar_t>>(
            grad_input, grad_output, bicubic, scales);
      });
}
// END upsample_aa
