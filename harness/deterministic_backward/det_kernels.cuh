// Deterministic CUDA backward kernels for adaptive_max_pool2d and grid_sampler_2d.
//
// This file is the single source of the kernels. The GPU harness (det_ext.cu)
// compiles it against a current torch; make_patches.py copies the two marked
// sections verbatim into torch 1.13.1's AdaptiveMaxPooling2d.cu and
// GridSampler.cu. The code between the markers therefore only uses names that
// exist in both contexts:
//   - at::TensorBase, at::opmath_type, AT_DISPATCH_*, TORCH_CHECK,
//     C10_LAUNCH_BOUNDS_1, C10_CUDA_CHECK, C10_CUDA_KERNEL_LAUNCH_CHECK,
//     at::cuda::getCurrentCUDAStream, c10::cuda::CUDACachingAllocator
//   - GridSamplerInterpolation, GridSamplerPadding, within_bounds_2d and
//     grid_sampler_compute_source_index_set_grad (torch's GridSampler.cuh in
//     the patch; own equivalents in det_ext.cu for the harness)
//   - deterministic_radix_sort_pairs (a stable key/value radix sort: cub in
//     the harness, at::cuda::cub::radix_sort_pairs in the patch).
//
// Both reductions add the contributions to one output element in a fixed
// order, inside one thread, so results are bitwise reproducible.

// BEGIN adaptive_max_pool2d
// Deterministic adaptive max pooling backward, without atomics.
//
// grad_input[h, w] is the sum of grad_output over the output cells whose
// recorded argmax (indices) is h * W + w. Output cell oh pools rows
// [floor(oh*H/OH), ceil((oh+1)*H/OH)), so row h can only be the argmax of cells
// oh in [floor(h*OH/H), ceil((h+1)*OH/H)); likewise for columns. We sum those
// candidate cells in (oh, ow) order, in the accumulate type, and store once.
//
// Most input elements are the argmax of no cell, so the work is organised per
// output cell: grad_input is zero-filled, then each output cell looks at the
// candidate cells of its own argmax. The first matching cell in (oh, ow) order
// (the "leader") adds up all matching cells in that order and stores the sum;
// the others store nothing. Each element has at most one writer and a fixed
// summation order, so the result is bitwise reproducible.

// n / d. The generic version divides; the uint32_t one (used whenever all
// numerators fit in 32 bits) multiplies by a precomputed reciprocal, because
// hardware integer division would dominate the kernel's cost.
template <typename index_t>
struct adaptive_max_pool2d_deterministic_divider {
  index_t divisor;
  explicit adaptive_max_pool2d_deterministic_divider(index_t d) : divisor(d) {}
  __device__ __forceinline__ index_t div(index_t n) const { return n / divisor; }
};

template <>
struct adaptive_max_pool2d_deterministic_divider<uint32_t> {
  // q = (n + umulhi(n, magic)) >> shift with shift = ceil(log2(d)) and
  // magic = floor(2^32 * (2^shift - d) / d) + 1; exact for every 32-bit n.
  uint32_t magic;
  uint32_t shift;
  explicit adaptive_max_pool2d_deterministic_divider(uint32_t d) {
    shift = 0;
    while ((uint64_t(1) << shift) < d) {
      ++shift;
    }
    magic = static_cast<uint32_t>(
        ((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return static_cast<uint32_t>((static_cast<uint64_t>(__umulhi(n, magic)) + n) >> shift);
  }
};

template <typename scalar_t, typename opmath_t, typename index_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void adaptive_max_pool2d_backward_deterministic_kernel(
    const index_t total_out,  // planes * osizeH * osizeW
    const scalar_t* __restrict__ grad_output,  // planes x osizeH x osizeW, contiguous
    const int64_t* __restrict__ indices,       // planes x osizeH x osizeW, contiguous
    scalar_t* __restrict__ grad_input,         // planes x isizeH x isizeW, contiguous, zeroed
    const index_t isizeH, const index_t isizeW,
    const index_t osizeH, const index_t osizeW,
    const adaptive_max_pool2d_deterministic_divider<index_t> div_plane_out,  // by osizeH * osizeW
    const adaptive_max_pool2d_deterministic_divider<index_t> div_H,          // by isizeH
    const adaptive_max_pool2d_deterministic_divider<index_t> div_W) {        // by isizeW
  const index_t plane_in = isizeH * isizeW;
  const index_t plane_out = osizeH * osizeW;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t linear = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       linear < static_cast<int64_t>(total_out); linear += stride) {
    const index_t o = static_cast<index_t>(linear);
    const int64_t target = indices[o];
    if (target < 0 || target >= static_cast<int64_t>(plane_in)) {
      continue;  // not a valid argmax; nothing to route
    }
    const index_t plane = div_plane_out.div(o);
    const index_t out_base = plane * plane_out;
    const index_t hw = static_cast<index_t>(target);
    const index_t h = div_W.div(hw);
    const index_t w = hw - h * isizeW;
    const index_t oh_begin = div_H.div(h * osizeH);
    const index_t oh_end = div_H.div(h * osizeH + osizeH + isizeH - 1);
    const index_t ow_begin = div_W.div(w * osizeW);
    const index_t ow_end = div_W.div(w * osizeW + osizeW + isizeW - 1);
    opmath_t acc = static_cast<opmath_t>(0);
    bool leader = true;
    for (index_t oh = oh_begin; leader && oh < oh_end; ++oh) {
      const index_t row = out_base + oh * osizeW;
      for (index_t ow = ow_begin; ow < ow_end; ++ow) {
        const index_t o2 = row + ow;
        if (indices[o2] == target) {
          if (o2 < o) {  // an earlier cell routes to the same element: it writes
            leader = false;
            break;
          }
          acc += static_cast<opmath_t>(grad_output[o2]);
        }
      }
    }
    if (leader) {
      grad_input[plane * plane_in + hw] = static_cast<scalar_t>(acc);
    }
  }
}

template <typename scalar_t, typename index_t>
static void adaptive_max_pool2d_backward_deterministic_launch(
    const at::TensorBase& grad_input_c,
    const at::TensorBase& grad_output_c,
    const at::TensorBase& indices_c,
    int64_t total_out, int64_t isizeH, int64_t isizeW, int64_t osizeH, int64_t osizeW) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t blocks64 = (total_out + 255) / 256;
  const int blocks = static_cast<int>(blocks64 < (int64_t(1) << 20) ? blocks64 : (int64_t(1) << 20));
  adaptive_max_pool2d_backward_deterministic_kernel<scalar_t, opmath_t, index_t>
      <<<blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
          static_cast<index_t>(total_out),
          grad_output_c.data_ptr<scalar_t>(),
          indices_c.data_ptr<int64_t>(),
          grad_input_c.data_ptr<scalar_t>(),
          static_cast<index_t>(isizeH), static_cast<index_t>(isizeW),
          static_cast<index_t>(osizeH), static_cast<index_t>(osizeW),
          adaptive_max_pool2d_deterministic_divider<index_t>(static_cast<index_t>(osizeH * osizeW)),
          adaptive_max_pool2d_deterministic_divider<index_t>(static_cast<index_t>(isizeH)),
          adaptive_max_pool2d_deterministic_divider<index_t>(static_cast<index_t>(isizeW)));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// grad_input_c, grad_output_c and indices_c must be contiguous; grad_input_c
// is zero-filled here and then written.
static void adaptive_max_pool2d_backward_deterministic(
    const at::TensorBase& grad_input_c,
    const at::TensorBase& grad_output_c,
    const at::TensorBase& indices_c,
    int64_t planes, int64_t isizeH, int64_t isizeW,
    int64_t osizeH, int64_t osizeW) {
  const int64_t total_in = planes * isizeH * isizeW;
  const int64_t total_out = planes * osizeH * osizeW;
  if (total_in == 0) {
    return;
  }
  C10_CUDA_CHECK(cudaMemsetAsync(grad_input_c.data_ptr(), 0,
                                 total_in * grad_input_c.element_size(),
                                 at::cuda::getCurrentCUDAStream()));
  if (total_out == 0) {
    return;
  }
  // 32-bit path: element offsets and the range numerators h*OH + OH + H - 1
  // (and the same for w) must fit in 32 bits.
  const int64_t u32_max = std::numeric_limits<uint32_t>::max();
  const bool use_u32 =
      total_in <= std::numeric_limits<int32_t>::max() &&
      total_out <= std::numeric_limits<int32_t>::max() &&
      isizeH * (osizeH + 1) <= u32_max && isizeW * (osizeW + 1) <= u32_max;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16,
      grad_input_c.scalar_type(),
      "adaptive_max_pool2d_backward_cuda_deterministic", [&] {
        if (use_u32) {
          adaptive_max_pool2d_backward_deterministic_launch<scalar_t, uint32_t>(
              grad_input_c, grad_output_c, indices_c, total_out, isizeH, isizeW, osizeH, osizeW);
        } else {
          adaptive_max_pool2d_backward_deterministic_launch<scalar_t, int64_t>(
              grad_input_c, grad_output_c, indices_c, total_out, isizeH, isizeW, osizeH, osizeW);
        }
      });
}
// END adaptive_max_pool2d

// BEGIN grid_sampler_2d
// Deterministic grid_sampler_2d backward (bilinear and nearest).
//
// grad_grid: each grid point is owned by one thread, which loops over the
// channels exactly as the atomic kernel does; there is no race.
//
// grad_input: every grid point (n, h, w) emits 4 contribution slots
// (bilinear: the 4 corners; nearest: 1 slot, the rest empty). Slot k of grid
// point p has ordinal 4*p + k, a key naming the input pixel it lands on,
// key = (n * inp_H + y) * inp_W + x (or the sentinel N * inp_H * inp_W when the
// corner is outside the input), and a weight that does not depend on the
// channel. The (key, ordinal) pairs are radix sorted by key; the sort is
// stable and the ordinals go in ascending, so each pixel's run lists its
// contributions in ordinal order. One thread per grad_input element (n, c, y, x)
// then sums weight * grad_output[n, c, h, w] over its run, front to back, in
// the accumulate type. The sort is channel-independent, so it is done once for
// all C channels.
template <typename scalar_t, typename opmath_t, typename index_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void grid_sampler_2d_backward_deterministic_points_kernel(
    const index_t count,  // N * out_H * out_W grid points
    const scalar_t* __restrict__ grad_output,
    const scalar_t* __restrict__ input,
    const scalar_t* __restrict__ grid,
    scalar_t* __restrict__ grad_grid,
    const index_t C, const index_t inp_H, const index_t inp_W,
    const index_t out_H, const index_t out_W,
    const index_t inp_sN, const index_t inp_sC, const index_t inp_sH, const index_t inp_sW,
    const index_t grid_sN, const index_t grid_sH, const index_t grid_sW, const index_t grid_sCoor,
    const index_t gOut_sN, const index_t gOut_sC, const index_t gOut_sH, const index_t gOut_sW,
    const index_t gGrid_sN, const index_t gGrid_sH, const index_t gGrid_sW, const index_t gGrid_sCoor,
    const GridSamplerInterpolation interpolation_mode,
    const GridSamplerPadding padding_mode,
    const bool align_corners,
    const bool input_requires_grad,
    const int64_t sentinel,           // N * inp_H * inp_W: key of "no pixel"
    int64_t* __restrict__ keys,       // [4 * count]
    int64_t* __restrict__ ordinals,   // [4 * count]
    opmath_t* __restrict__ weights,   // [4 * count]
    index_t* __restrict__ gout_offsets) {  // [count]: offset of grad_output[n, 0, h, w]
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t linear = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       linear < count; linear += stride) {
    const index_t index = static_cast<index_t>(linear);
    const index_t w = index % out_W;
    const index_t h = (index / out_W) % out_H;
    const index_t n = index / (out_H * out_W);
    const index_t grid_offset = n * grid_sN + h * grid_sH + w * grid_sW;

    const opmath_t x = static_cast<opmath_t>(grid[grid_offset]);
    const opmath_t y = static_cast<opmath_t>(grid[grid_offset + grid_sCoor]);

    opmath_t gix_mult, giy_mult;
    const opmath_t ix = grid_sampler_compute_source_index_set_grad(
        x, static_cast<int>(inp_W), padding_mode, align_corners, &gix_mult);
    const opmath_t iy = grid_sampler_compute_source_index_set_grad(
        y, static_cast<int>(inp_H), padding_mode, align_corners, &giy_mult);

    const index_t gOut_offset = n * gOut_sN + h * gOut_sH + w * gOut_sW;
    const int64_t pixel_base = static_cast<int64_t>(n) * inp_H;
    scalar_t* gGrid_ptr = grad_grid + n * gGrid_sN + h * gGrid_sH + w * gGrid_sW;

    if (interpolation_mode == GridSamplerInterpolation::Bilinear) {
      const index_t ix_nw = static_cast<index_t>(::floor(ix));
      const index_t iy_nw = static_cast<index_t>(::floor(iy));
      const index_t ix_ne = ix_nw + 1;
      const index_t iy_ne = iy_nw;
      const index_t ix_sw = ix_nw;
      const index_t iy_sw = iy_nw + 1;
      const index_t ix_se = ix_nw + 1;
      const index_t iy_se = iy_nw + 1;

      const opmath_t nw = (ix_se - ix) * (iy_se - iy);
      const opmath_t ne = (ix - ix_sw) * (iy_sw - iy);
      const opmath_t sw = (ix_ne - ix) * (iy - iy_ne);
      const opmath_t se = (ix - ix_nw) * (iy - iy_nw);

      const bool in_nw = within_bounds_2d(iy_nw, ix_nw, inp_H, inp_W);
      const bool in_ne = within_bounds_2d(iy_ne, ix_ne, inp_H, inp_W);
      const bool in_sw = within_bounds_2d(iy_sw, ix_sw, inp_H, inp_W);
      const bool in_se = within_bounds_2d(iy_se, ix_se, inp_H, inp_W);

      if (input_requires_grad) {
        const int64_t slot = 4 * static_cast<int64_t>(index);
        keys[slot + 0] = in_nw ? (pixel_base + iy_nw) * inp_W + ix_nw : sentinel;
        keys[slot + 1] = in_ne ? (pixel_base + iy_ne) * inp_W + ix_ne : sentinel;
        keys[slot + 2] = in_sw ? (pixel_base + iy_sw) * inp_W + ix_sw : sentinel;
        keys[slot + 3] = in_se ? (pixel_base + iy_se) * inp_W + ix_se : sentinel;
        weights[slot + 0] = nw;
        weights[slot + 1] = ne;
        weights[slot + 2] = sw;
        weights[slot + 3] = se;
        ordinals[slot + 0] = slot + 0;
        ordinals[slot + 1] = slot + 1;
        ordinals[slot + 2] = slot + 2;
        ordinals[slot + 3] = slot + 3;
        gout_offsets[index] = gOut_offset;
      }

      // grad_grid: same arithmetic as the atomic kernel, owned by this thread.
      opmath_t gix = static_cast<opmath_t>(0), giy = static_cast<opmath_t>(0);
      const scalar_t* gOut_ptr_NCHW = grad_output + gOut_offset;
      const scalar_t* inp_ptr_NC = input + n * inp_sN;
      for (index_t c = 0; c < C; ++c, inp_ptr_NC += inp_sC, gOut_ptr_NCHW += gOut_sC) {
        const opmath_t gOut = static_cast<opmath_t>(*gOut_ptr_NCHW);
        if (in_nw) {
          const opmath_t nw_val = static_cast<opmath_t>(inp_ptr_NC[iy_nw * inp_sH + ix_nw * inp_sW]);
          gix -= nw_val * (iy_se - iy) * gOut;
          giy -= nw_val * (ix_se - ix) * gOut;
        }
        if (in_ne) {
          const opmath_t ne_val = static_cast<opmath_t>(inp_ptr_NC[iy_ne * inp_sH + ix_ne * inp_sW]);
          gix += ne_val * (iy_sw - iy) * gOut;
          giy -= ne_val * (ix - ix_sw) * gOut;
        }
        if (in_sw) {
          const opmath_t sw_val = static_cast<opmath_t>(inp_ptr_NC[iy_sw * inp_sH + ix_sw * inp_sW]);
          gix -= sw_val * (iy - iy_ne) * gOut;
          giy += sw_val * (ix_ne - ix) * gOut;
        }
        if (in_se) {
          const opmath_t se_val = static_cast<opmath_t>(inp_ptr_NC[iy_se * inp_sH + ix_se * inp_sW]);
          gix += se_val * (iy - iy_nw) * gOut;
          giy += se_val * (ix - ix_nw) * gOut;
        }
      }
      gGrid_ptr[0] = static_cast<scalar_t>(gix_mult * gix);
      gGrid_ptr[gGrid_sCoor] = static_cast<scalar_t>(giy_mult * giy);
    } else {  // Nearest (the caller never passes Bicubic)
      if (input_requires_grad) {
        // nearbyint, the rounding the forward kernel uses
        const index_t ix_nearest = static_cast<index_t>(::nearbyint(ix));
        const index_t iy_nearest = static_cast<index_t>(::nearbyint(iy));
        const int64_t slot = 4 * static_cast<int64_t>(index);
        keys[slot + 0] = within_bounds_2d(iy_nearest, ix_nearest, inp_H, inp_W)
            ? (pixel_base + iy_nearest) * inp_W + ix_nearest : sentinel;
        keys[slot + 1] = sentinel;
        keys[slot + 2] = sentinel;
        keys[slot + 3] = sentinel;
        weights[slot + 0] = static_cast<opmath_t>(1);
        weights[slot + 1] = static_cast<opmath_t>(0);
        weights[slot + 2] = static_cast<opmath_t>(0);
        weights[slot + 3] = static_cast<opmath_t>(0);
        ordinals[slot + 0] = slot + 0;
        ordinals[slot + 1] = slot + 1;
        ordinals[slot + 2] = slot + 2;
        ordinals[slot + 3] = slot + 3;
        gout_offsets[index] = gOut_offset;
      }
      gGrid_ptr[0] = static_cast<scalar_t>(0);
      gGrid_ptr[gGrid_sCoor] = static_cast<scalar_t>(0);
    }
  }
}

// Over the sorted pairs: record where each pixel's run begins and ends, and
// pack (weight, grad_output offset) in sorted order for the gather.
template <typename opmath_t, typename index_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void grid_sampler_2d_backward_deterministic_runs_kernel(
    const int64_t ncontrib,
    const int64_t sentinel,
    const int64_t* __restrict__ sorted_keys,
    const int64_t* __restrict__ sorted_ordinals,
    const opmath_t* __restrict__ weights,
    const index_t* __restrict__ gout_offsets,
    int64_t* __restrict__ run_begin,   // [sentinel], zero-initialized
    int64_t* __restrict__ run_end,     // [sentinel], zero-initialized
    opmath_t* __restrict__ packed_weights,
    index_t* __restrict__ packed_offsets) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < ncontrib; i += stride) {
    const int64_t key = sorted_keys[i];
    if (key >= sentinel) {
      continue;  // sentinels sort last; nothing to add
    }
    if (i == 0 || sorted_keys[i - 1] != key) {
      run_begin[key] = i;
    }
    if (i == ncontrib - 1 || sorted_keys[i + 1] != key) {
      run_end[key] = i + 1;
    }
    const int64_t ord = sorted_ordinals[i];
    packed_weights[i] = weights[ord];
    packed_offsets[i] = gout_offsets[ord >> 2];
  }
}

// One thread per grad_input element; sums its pixel's run front to back.
template <typename scalar_t, typename opmath_t, typename index_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void grid_sampler_2d_backward_deterministic_gather_kernel(
    const index_t total,  // N * C * inp_H * inp_W
    const index_t C, const index_t inp_H, const index_t inp_W,
    const index_t gInp_sN, const index_t gInp_sC, const index_t gInp_sH, const index_t gInp_sW,
    const index_t gOut_sC,
    const scalar_t* __restrict__ grad_output,
    const int64_t* __restrict__ run_begin,
    const int64_t* __restrict__ run_end,
    const opmath_t* __restrict__ packed_weights,
    const index_t* __restrict__ packed_offsets,
    scalar_t* __restrict__ grad_input) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t linear = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       linear < total; linear += stride) {
    const index_t idx = static_cast<index_t>(linear);
    const index_t x = idx % inp_W;
    const index_t y = (idx / inp_W) % inp_H;
    const index_t c = (idx / (inp_W * inp_H)) % C;
    const index_t n = idx / (inp_W * inp_H * C);
    const int64_t key = (static_cast<int64_t>(n) * inp_H + y) * inp_W + x;
    const int64_t begin = run_begin[key];
    const int64_t end = run_end[key];
    const index_t c_offset = c * gOut_sC;
    opmath_t acc = static_cast<opmath_t>(0);
    for (int64_t i = begin; i < end; ++i) {
      acc += packed_weights[i] *
          static_cast<opmath_t>(grad_output[packed_offsets[i] + c_offset]);
    }
    grad_input[n * gInp_sN + c * gInp_sC + y * gInp_sH + x * gInp_sW] =
        static_cast<scalar_t>(acc);
  }
}

static inline int grid_sampler_2d_deterministic_blocks(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<int>(blocks < (int64_t(1) << 20) ? blocks : (int64_t(1) << 20));
}

// Largest element offset reachable in t, plus one: the index range it needs.
static inline int64_t grid_sampler_2d_deterministic_span(const at::TensorBase& t) {
  int64_t span = 1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) {
      return 0;
    }
    span += (t.size(d) - 1) * t.stride(d);
  }
  return span;
}

template <typename scalar_t, typename index_t>
static void grid_sampler_2d_backward_deterministic_impl(
    const at::TensorBase& grad_input, const at::TensorBase& grad_grid,
    const at::TensorBase& grad_output, const at::TensorBase& input,
    const at::TensorBase& grid, GridSamplerInterpolation interpolation_mode,
    GridSamplerPadding padding_mode, bool align_corners, bool input_requires_grad) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t N = input.size(0);
  const int64_t C = input.size(1);
  const int64_t inp_H = input.size(2);
  const int64_t inp_W = input.size(3);
  const int64_t out_H = grid.size(1);
  const int64_t out_W = grid.size(2);
  const int64_t count = N * out_H * out_W;
  const int64_t ncontrib = 4 * count;
  const int64_t sentinel = N * inp_H * inp_W;
  auto stream = at::cuda::getCurrentCUDAStream();
  auto* allocator = c10::cuda::CUDACachingAllocator::get();

  c10::DataPtr keys, ordinals, sorted_keys, sorted_ordinals, weights, gout_offsets;
  if (input_requires_grad) {
    keys = allocator->allocate(ncontrib * sizeof(int64_t));
    ordinals = allocator->allocate(ncontrib * sizeof(int64_t));
    weights = allocator->allocate(ncontrib * sizeof(opmath_t));
    gout_offsets = allocator->allocate(count * sizeof(index_t));
  }

  grid_sampler_2d_backward_deterministic_points_kernel<scalar_t, opmath_t, index_t>
      <<<grid_sampler_2d_deterministic_blocks(count), 256, 0, stream>>>(
          static_cast<index_t>(count),
          grad_output.data_ptr<scalar_t>(), input.data_ptr<scalar_t>(),
          grid.data_ptr<scalar_t>(), grad_grid.data_ptr<scalar_t>(),
          C, inp_H, inp_W, out_H, out_W,
          input.stride(0), input.stride(1), input.stride(2), input.stride(3),
          grid.stride(0), grid.stride(1), grid.stride(2), grid.stride(3),
          grad_output.stride(0), grad_output.stride(1), grad_output.stride(2), grad_output.stride(3),
          grad_grid.stride(0), grad_grid.stride(1), grad_grid.stride(2), grad_grid.stride(3),
          interpolation_mode, padding_mode, align_corners, input_requires_grad, sentinel,
          static_cast<int64_t*>(keys.get()), static_cast<int64_t*>(ordinals.get()),
          static_cast<opmath_t*>(weights.get()), static_cast<index_t*>(gout_offsets.get()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  if (!input_requires_grad) {
    return;
  }

  sorted_keys = allocator->allocate(ncontrib * sizeof(int64_t));
  sorted_ordinals = allocator->allocate(ncontrib * sizeof(int64_t));
  int end_bit = 1;  // bits needed to hold the sentinel
  while (end_bit < 63 && (int64_t(1) << end_bit) <= sentinel) {
    ++end_bit;
  }
  deterministic_radix_sort_pairs(
      static_cast<const int64_t*>(keys.get()), static_cast<int64_t*>(sorted_keys.get()),
      static_cast<const int64_t*>(ordinals.get()), static_cast<int64_t*>(sorted_ordinals.get()),
      ncontrib, end_bit);

  c10::DataPtr run_begin = allocator->allocate(sentinel * sizeof(int64_t));
  c10::DataPtr run_end = allocator->allocate(sentinel * sizeof(int64_t));
  c10::DataPtr packed_weights = allocator->allocate(ncontrib * sizeof(opmath_t));
  c10::DataPtr packed_offsets = allocator->allocate(ncontrib * sizeof(index_t));
  C10_CUDA_CHECK(cudaMemsetAsync(run_begin.get(), 0, sentinel * sizeof(int64_t), stream));
  C10_CUDA_CHECK(cudaMemsetAsync(run_end.get(), 0, sentinel * sizeof(int64_t), stream));

  grid_sampler_2d_backward_deterministic_runs_kernel<opmath_t, index_t>
      <<<grid_sampler_2d_deterministic_blocks(ncontrib), 256, 0, stream>>>(
          ncontrib, sentinel,
          static_cast<const int64_t*>(sorted_keys.get()),
          static_cast<const int64_t*>(sorted_ordinals.get()),
          static_cast<const opmath_t*>(weights.get()),
          static_cast<const index_t*>(gout_offsets.get()),
          static_cast<int64_t*>(run_begin.get()), static_cast<int64_t*>(run_end.get()),
          static_cast<opmath_t*>(packed_weights.get()),
          static_cast<index_t*>(packed_offsets.get()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const int64_t total = N * C * inp_H * inp_W;
  grid_sampler_2d_backward_deterministic_gather_kernel<scalar_t, opmath_t, index_t>
      <<<grid_sampler_2d_deterministic_blocks(total), 256, 0, stream>>>(
          static_cast<index_t>(total), C, inp_H, inp_W,
          grad_input.stride(0), grad_input.stride(1), grad_input.stride(2), grad_input.stride(3),
          grad_output.stride(1),
          grad_output.data_ptr<scalar_t>(),
          static_cast<const int64_t*>(run_begin.get()),
          static_cast<const int64_t*>(run_end.get()),
          static_cast<const opmath_t*>(packed_weights.get()),
          static_cast<const index_t*>(packed_offsets.get()),
          grad_input.data_ptr<scalar_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // The scratch buffers go back to the caching allocator when the DataPtrs
  // are destroyed; the allocator is stream-ordered, so the kernels queued
  // above finish before the memory is handed out on this stream again.
}

// grad_input (if input_requires_grad) and grad_grid are written in full.
// interpolation_mode must be Bilinear or Nearest.
static void grid_sampler_2d_backward_deterministic(
    const at::TensorBase& grad_input, const at::TensorBase& grad_grid,
    const at::TensorBase& grad_output, const at::TensorBase& input,
    const at::TensorBase& grid, int64_t interpolation_mode, int64_t padding_mode,
    bool align_corners, bool input_requires_grad) {
  const auto interp = static_cast<GridSamplerInterpolation>(interpolation_mode);
  TORCH_CHECK(interp == GridSamplerInterpolation::Bilinear ||
              interp == GridSamplerInterpolation::Nearest,
              "grid_sampler_2d_backward_cuda: no deterministic implementation for bicubic");
  const int64_t count = input.size(0) * grid.size(1) * grid.size(2);
  if (count == 0) {
    return;
  }
  TORCH_CHECK(4 * count <= std::numeric_limits<int32_t>::max(),
              "grid_sampler_2d_backward_cuda (deterministic): too many grid points (",
              count, ")");
  int64_t need = std::max<int64_t>(
      std::max<int64_t>(grid_sampler_2d_deterministic_span(input),
                        grid_sampler_2d_deterministic_span(grid)),
      std::max<int64_t>(grid_sampler_2d_deterministic_span(grad_output),
                        grid_sampler_2d_deterministic_span(grad_grid)));
  need = std::max<int64_t>(need, 4 * count);
  if (input_requires_grad) {
    need = std::max<int64_t>(need, grid_sampler_2d_deterministic_span(grad_input));
    need = std::max<int64_t>(need, grad_input.numel());
  }
  const bool use_int32 = need <= std::numeric_limits<int32_t>::max();
  const auto padding = static_cast<GridSamplerPadding>(padding_mode);
  AT_DISPATCH_FLOATING_TYPES_AND_HALF(
      input.scalar_type(), "grid_sampler_2d_backward_cuda_deterministic", [&] {
        if (use_int32) {
          grid_sampler_2d_backward_deterministic_impl<scalar_t, int32_t>(
              grad_input, grad_grid, grad_output, input, grid, interp, padding,
              align_corners, input_requires_grad);
        } else {
          grid_sampler_2d_backward_deterministic_impl<scalar_t, int64_t>(
              grad_input, grad_grid, grad_output, input, grid, interp, padding,
              align_corners, input_requires_grad);
        }
      });
}
// END grid_sampler_2d

// BEGIN grid_sampler_3d
// Deterministic grid_sampler_3d backward (trilinear, called bilinear, and
// nearest), the 3-D form of the grid_sampler_2d section above (whose helpers
// grid_sampler_2d_deterministic_blocks/_span it uses).
//
// grad_grid: one thread per grid point, the atomic kernel's arithmetic, no
// race. grad_input: every grid point (n, d, h, w) emits S slots (trilinear:
// its 8 corners in the atomic kernel's order tnw, tne, tsw, tse, bnw, bne,
// bsw, bse; nearest: 1), slot k of point p with ordinal S*p + k, a key
// ((n * inp_D + z) * inp_H + y) * inp_W + x (or the sentinel N*D*H*W outside
// the input) and a channel-independent weight. A stable radix sort by key
// groups each voxel's contributions in ordinal order; one thread per
// grad_input element sums weight * grad_output over its voxel's run, front to
// back, in the accumulate type, and stores once (a run longer than 256
// terms, from grids concentrated on a few voxels, is summed by a warp in a
// fixed lane order and shuffle tree instead). Nearest rounds with
// grid_sampler_3d_round_nearest, the rounding of the forward kernel of the
// torch this is compiled into.
template <typename index_t>
struct grid_sampler_3d_deterministic_strides {
  index_t inp[5], grid[5], gout[5], ggrid[5];  // N, C (grid: D), D, H, W (grid: coordinate)
};

template <typename scalar_t, typename opmath_t, typename index_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void grid_sampler_3d_backward_deterministic_points_kernel(
    const index_t count,  // N * out_D * out_H * out_W grid points
    const scalar_t* __restrict__ grad_output,
    const scalar_t* __restrict__ input,
    const scalar_t* __restrict__ grid,
    scalar_t* __restrict__ grad_grid,
    const index_t C, const index_t inp_D, const index_t inp_H, const index_t inp_W,
    const index_t out_D, const index_t out_H, const index_t out_W,
    const grid_sampler_3d_deterministic_strides<index_t> st,
    const GridSamplerInterpolation interpolation_mode,
    const GridSamplerPadding padding_mode,
    const bool align_corners,
    const bool input_requires_grad,
    const int64_t sentinel,           // N * inp_D * inp_H * inp_W: key of "no voxel"
    const int slots,                  // 8 (trilinear) or 1 (nearest)
    int64_t* __restrict__ keys,       // [slots * count]
    int64_t* __restrict__ ordinals,   // [slots * count]
    opmath_t* __restrict__ weights,   // [slots * count]
    index_t* __restrict__ gout_offsets) {  // [count]: offset of grad_output[n, 0, d, h, w]
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t linear = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       linear < count; linear += stride) {
    const index_t index = static_cast<index_t>(linear);
    const index_t w = index % out_W;
    const index_t h = (index / out_W) % out_H;
    const index_t d = (index / (out_H * out_W)) % out_D;
    const index_t n = index / (out_D * out_H * out_W);
    const index_t grid_offset = n * st.grid[0] + d * st.grid[1] + h * st.grid[2] + w * st.grid[3];

    const opmath_t x = static_cast<opmath_t>(grid[grid_offset]);
    const opmath_t y = static_cast<opmath_t>(grid[grid_offset + st.grid[4]]);
    const opmath_t z = static_cast<opmath_t>(grid[grid_offset + 2 * st.grid[4]]);

    opmath_t gix_mult, giy_mult, giz_mult;
    const opmath_t ix = grid_sampler_compute_source_index_set_grad(
        x, static_cast<int>(inp_W), padding_mode, align_corners, &gix_mult);
    const opmath_t iy = grid_sampler_compute_source_index_set_grad(
        y, static_cast<int>(inp_H), padding_mode, align_corners, &giy_mult);
    const opmath_t iz = grid_sampler_compute_source_index_set_grad(
        z, static_cast<int>(inp_D), padding_mode, align_corners, &giz_mult);

    const index_t gOut_offset = n * st.gout[0] + d * st.gout[2] + h * st.gout[3] + w * st.gout[4];
    const int64_t voxel_base = static_cast<int64_t>(n) * inp_D;
    scalar_t* gGrid_ptr = grad_grid + n * st.ggrid[0] + d * st.ggrid[1] + h * st.ggrid[2] + w * st.ggrid[3];
    const int64_t slot = static_cast<int64_t>(slots) * static_cast<int64_t>(index);

    if (interpolation_mode == GridSamplerInterpolation::Bilinear) {
      const index_t ix_tnw = static_cast<index_t>(::floor(ix));
      const index_t iy_tnw = static_cast<index_t>(::floor(iy));
      const index_t iz_tnw = static_cast<index_t>(::floor(iz));
      const index_t ix_bse = ix_tnw + 1;
      const index_t iy_bse = iy_tnw + 1;
      const index_t iz_bse = iz_tnw + 1;
      // the 8 corners as (dz, dy, dx) offsets from tnw, in the atomic kernel's order
      // tnw tne tsw tse bnw bne bsw bse; their weights with its arithmetic
      const opmath_t wx0 = ix_bse - ix, wx1 = ix - ix_tnw;
      const opmath_t wy0 = iy_bse - iy, wy1 = iy - iy_tnw;
      const opmath_t wz0 = iz_bse - iz, wz1 = iz - iz_tnw;
      const opmath_t tnw = wx0 * wy0 * wz0;
      const opmath_t tne = wx1 * wy0 * wz0;
      const opmath_t tsw = wx0 * wy1 * wz0;
      const opmath_t tse = wx1 * wy1 * wz0;
      const opmath_t bnw = wx0 * wy0 * wz1;
      const opmath_t bne = wx1 * wy0 * wz1;
      const opmath_t bsw = wx0 * wy1 * wz1;
      const opmath_t bse = wx1 * wy1 * wz1;
      const opmath_t corner_weight[8] = {tnw, tne, tsw, tse, bnw, bne, bsw, bse};

      if (input_requires_grad) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const index_t cx = ix_tnw + (k & 1), cy = iy_tnw + ((k >> 1) & 1), cz = iz_tnw + (k >> 2);
          keys[slot + k] = within_bounds_3d(cz, cy, cx, inp_D, inp_H, inp_W)
              ? ((voxel_base + cz) * inp_H + cy) * inp_W + cx : sentinel;
          weights[slot + k] = corner_weight[k];
          ordinals[slot + k] = slot + k;
        }
        gout_offsets[index] = gOut_offset;
      }

      // grad_grid: the atomic kernel's loop over channels, owned by this thread
      opmath_t gix = static_cast<opmath_t>(0), giy = static_cast<opmath_t>(0),
               giz = static_cast<opmath_t>(0);
      const scalar_t* gOut_ptr = grad_output + gOut_offset;
      const scalar_t* inp_ptr_NC = input + n * st.inp[0];
      const bool in_tnw = within_bounds_3d(iz_tnw, iy_tnw, ix_tnw, inp_D, inp_H, inp_W);
      const bool in_tne = within_bounds_3d(iz_tnw, iy_tnw, ix_bse, inp_D, inp_H, inp_W);
      const bool in_tsw = within_bounds_3d(iz_tnw, iy_bse, ix_tnw, inp_D, inp_H, inp_W);
      const bool in_tse = within_bounds_3d(iz_tnw, iy_bse, ix_bse, inp_D, inp_H, inp_W);
      const bool in_bnw = within_bounds_3d(iz_bse, iy_tnw, ix_tnw, inp_D, inp_H, inp_W);
      const bool in_bne = within_bounds_3d(iz_bse, iy_tnw, ix_bse, inp_D, inp_H, inp_W);
      const bool in_bsw = within_bounds_3d(iz_bse, iy_bse, ix_tnw, inp_D, inp_H, inp_W);
      const bool in_bse = within_bounds_3d(iz_bse, iy_bse, ix_bse, inp_D, inp_H, inp_W);
      const index_t sD = st.inp[2], sH = st.inp[3], sW = st.inp[4];
      for (index_t c = 0; c < C; ++c, gOut_ptr += st.gout[1], inp_ptr_NC += st.inp[1]) {
        const opmath_t gOut = static_cast<opmath_t>(*gOut_ptr);
        if (in_tnw) {
          const opmath_t v = static_cast<opmath_t>(inp_ptr_NC[iz_tnw * sD + iy_tnw * sH + ix_tnw * sW]);
          gix -= v * (iy_bse - iy) * (iz_bse - iz) * gOut;
          giy -= v * (ix_bse - ix) * (iz_bse - iz) * gOut;
          giz -= v * (ix_bse - ix) * (iy_bse - iy) * gOut;
        }
        if (in_tne) {
          const opmath_t v = static_cast<opmath_t>(inp_ptr_NC[iz_tnw * sD + iy_tnw * sH + ix_bse * sW]);
          gix += v * (iy_bse - iy) * (iz_bse - iz) * gOut;
          giy -= v * (ix - ix_tnw) * (iz_bse - iz) * gOut;
          giz -= v * (ix - ix_tnw) * (iy_bse - iy) * gOut;
        }
        if (in_tsw) {
          const opmath_t v = static_cast<opmath_t>(inp_ptr_NC[iz_tnw * sD + iy_bse * sH + ix_tnw * sW]);
          gix -= v * (iy - iy_tnw) * (iz_bse - iz) * gOut;
          giy += v * (ix_bse - ix) * (iz_bse - iz) * gOut;
          giz -= v * (ix_bse - ix) * (iy - iy_tnw) * gOut;
        }
        if (in_tse) {
          const opmath_t v = static_cast<opmath_t>(inp_ptr_NC[iz_tnw * sD + iy_bse * sH + ix_bse * sW]);
          gix += v * (iy - iy_tnw) * (iz_bse - iz) * gOut;
          giy += v * (ix - ix_tnw) * (iz_bse - iz) * gOut;
          giz -= v * (ix - ix_tnw) * (iy - iy_tnw) * gOut;
        }
        if (in_bnw) {
          const opmath_t v = static_cast<opmath_t>(inp_ptr_NC[iz_bse * sD + iy_tnw * sH + ix_tnw * sW]);
          gix -= v * (iy_bse - iy) * (iz - iz_tnw) * gOut;
          giy -= v * (ix_bse - ix) * (iz - iz_tnw) * gOut;
          giz += v * (ix_bse - ix) * (iy_bse - iy) * gOut;
        }
        if (in_bne) {
          const opmath_t v = static_cast<opmath_t>(inp_ptr_NC[iz_bse * sD + iy_tnw * sH + ix_bse * sW]);
          gix += v * (iy_bse - iy) * (iz - iz_tnw) * gOut;
          giy -= v * (ix - ix_tnw) * (iz - iz_tnw) * gOut;
          giz += v * (ix - ix_tnw) * (iy_bse - iy) * gOut;
        }
        if (in_bsw) {
          const opmath_t v = static_cast<opmath_t>(inp_ptr_NC[iz_bse * sD + iy_bse * sH + ix_tnw * sW]);
          gix -= v * (iy - iy_tnw) * (iz - iz_tnw) * gOut;
          giy += v * (ix_bse - ix) * (iz - iz_tnw) * gOut;
          giz += v * (ix_bse - ix) * (iy - iy_tnw) * gOut;
        }
        if (in_bse) {
          const opmath_t v = static_cast<opmath_t>(inp_ptr_NC[iz_bse * sD + iy_bse * sH + ix_bse * sW]);
          gix += v * (iy - iy_tnw) * (iz - iz_tnw) * gOut;
          giy += v * (ix - ix_tnw) * (iz - iz_tnw) * gOut;
          giz += v * (ix - ix_tnw) * (iy - iy_tnw) * gOut;
        }
      }
      gGrid_ptr[0] = static_cast<scalar_t>(gix_mult * gix);
      gGrid_ptr[st.ggrid[4]] = static_cast<scalar_t>(giy_mult * giy);
      gGrid_ptr[2 * st.ggrid[4]] = static_cast<scalar_t>(giz_mult * giz);
    } else {  // Nearest
      if (input_requires_grad) {
        const index_t ix_nearest = static_cast<index_t>(grid_sampler_3d_round_nearest(ix));
        const index_t iy_nearest = static_cast<index_t>(grid_sampler_3d_round_nearest(iy));
        const index_t iz_nearest = static_cast<index_t>(grid_sampler_3d_round_nearest(iz));
        keys[slot] = within_bounds_3d(iz_nearest, iy_nearest, ix_nearest, inp_D, inp_H, inp_W)
            ? ((voxel_base + iz_nearest) * inp_H + iy_nearest) * inp_W + ix_nearest : sentinel;
        weights[slot] = static_cast<opmath_t>(1);
        ordinals[slot] = slot;
        gout_offsets[index] = gOut_offset;
      }
      gGrid_ptr[0] = static_cast<scalar_t>(0);
      gGrid_ptr[st.ggrid[4]] = static_cast<scalar_t>(0);
      gGrid_ptr[2 * st.ggrid[4]] = static_cast<scalar_t>(0);
    }
  }
}

// Over the sorted pairs: where each voxel's run begins and ends, and
// (weight, grad_output offset) packed in sorted order. slot_shift = log2(slots).
template <typename opmath_t, typename index_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void grid_sampler_3d_backward_deterministic_runs_kernel(
    const int64_t ncontrib, const int64_t sentinel, const int slot_shift,
    const int64_t* __restrict__ sorted_keys,
    const int64_t* __restrict__ sorted_ordinals,
    const opmath_t* __restrict__ weights,
    const index_t* __restrict__ gout_offsets,
    int64_t* __restrict__ run_begin,   // [sentinel], zero-initialized
    int64_t* __restrict__ run_end,     // [sentinel], zero-initialized
    opmath_t* __restrict__ packed_weights,
    index_t* __restrict__ packed_offsets) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < ncontrib; i += stride) {
    const int64_t key = sorted_keys[i];
    if (key >= sentinel) {
      continue;  // sentinels sort last
    }
    if (i == 0 || sorted_keys[i - 1] != key) {
      run_begin[key] = i;
    }
    if (i == ncontrib - 1 || sorted_keys[i + 1] != key) {
      run_end[key] = i + 1;
    }
    const int64_t ord = sorted_ordinals[i];
    packed_weights[i] = weights[ord];
    packed_offsets[i] = gout_offsets[ord >> slot_shift];
  }
}

// Runs longer than this are summed by a warp (the long-runs kernel below):
// grids concentrated on a few voxels give runs of thousands of terms.
#define GRID_SAMPLER_3D_DETERMINISTIC_LONG_RUN 256

// One warp per voxel whose run is long: for each channel, lane l sums terms
// l, l + 32, ... of the run in order, a fixed shuffle tree adds the 32
// partial sums, lane 0 stores. Which voxels take this path depends on the
// sorted keys only; the lanes' terms and the tree on the run length only:
// bitwise reproducible.
template <typename scalar_t, typename opmath_t, typename index_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void grid_sampler_3d_backward_deterministic_long_runs_kernel(
    const int64_t voxels,  // N * inp_D * inp_H * inp_W
    const index_t C, const index_t inp_D, const index_t inp_H, const index_t inp_W,
    const index_t gInp_sN, const index_t gInp_sC, const index_t gInp_sD,
    const index_t gInp_sH, const index_t gInp_sW, const index_t gOut_sC,
    const scalar_t* __restrict__ grad_output,
    const int64_t* __restrict__ run_begin,
    const int64_t* __restrict__ run_end,
    const opmath_t* __restrict__ packed_weights,
    const index_t* __restrict__ packed_offsets,
    scalar_t* __restrict__ grad_input) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t warps = (static_cast<int64_t>(blockDim.x) * gridDim.x) >> 5;
  for (int64_t key = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; key < voxels;
       key += warps) {
    const int64_t begin = run_begin[key];
    const int64_t end = run_end[key];
    if (end - begin <= GRID_SAMPLER_3D_DETERMINISTIC_LONG_RUN) {
      continue;  // the same for the whole warp: the gather kernel has this voxel
    }
    const index_t x = static_cast<index_t>(key % inp_W);
    const index_t y = static_cast<index_t>((key / inp_W) % inp_H);
    const index_t z = static_cast<index_t>((key / (static_cast<int64_t>(inp_W) * inp_H)) % inp_D);
    const index_t n = static_cast<index_t>(key / (static_cast<int64_t>(inp_W) * inp_H * inp_D));
    for (index_t c = 0; c < C; ++c) {
      const index_t c_offset = c * gOut_sC;
      opmath_t acc = static_cast<opmath_t>(0);
      for (int64_t i = begin + lane; i < end; i += 32) {
        acc += packed_weights[i] *
            static_cast<opmath_t>(grad_output[packed_offsets[i] + c_offset]);
      }
      for (int offset = 16; offset > 0; offset /= 2) {
        acc += __shfl_down_sync(0xffffffffu, acc, offset);
      }
      if (lane == 0) {
        grad_input[n * gInp_sN + c * gInp_sC + z * gInp_sD + y * gInp_sH + x * gInp_sW] =
            static_cast<scalar_t>(acc);
      }
    }
  }
}

// One thread per grad_input element (n, c, z, y, x); sums its voxel's run
// (long runs: the kernel above).
template <typename scalar_t, typename opmath_t, typename index_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void grid_sampler_3d_backward_deterministic_gather_kernel(
    const index_t total,  // N * C * inp_D * inp_H * inp_W
    const index_t C, const index_t inp_D, const index_t inp_H, const index_t inp_W,
    const index_t gInp_sN, const index_t gInp_sC, const index_t gInp_sD,
    const index_t gInp_sH, const index_t gInp_sW, const index_t gOut_sC,
    const scalar_t* __restrict__ grad_output,
    const int64_t* __restrict__ run_begin,
    const int64_t* __restrict__ run_end,
    const opmath_t* __restrict__ packed_weights,
    const index_t* __restrict__ packed_offsets,
    scalar_t* __restrict__ grad_input) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t linear = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       linear < total; linear += stride) {
    const index_t idx = static_cast<index_t>(linear);
    const index_t x = idx % inp_W;
    const index_t y = (idx / inp_W) % inp_H;
    const index_t z = (idx / (inp_W * inp_H)) % inp_D;
    const index_t c = (idx / (inp_W * inp_H * inp_D)) % C;
    const index_t n = idx / (inp_W * inp_H * inp_D * C);
    const int64_t key = ((static_cast<int64_t>(n) * inp_D + z) * inp_H + y) * inp_W + x;
    const int64_t begin = run_begin[key];
    const int64_t end = run_end[key];
    if (end - begin > GRID_SAMPLER_3D_DETERMINISTIC_LONG_RUN) {
      continue;  // a warp sums it
    }
    const index_t c_offset = c * gOut_sC;
    opmath_t acc = static_cast<opmath_t>(0);
    for (int64_t i = begin; i < end; ++i) {
      acc += packed_weights[i] *
          static_cast<opmath_t>(grad_output[packed_offsets[i] + c_offset]);
    }
    grad_input[n * gInp_sN + c * gInp_sC + z * gInp_sD + y * gInp_sH + x * gInp_sW] =
        static_cast<scalar_t>(acc);
  }
}

template <typename scalar_t, typename index_t>
static void grid_sampler_3d_backward_deterministic_impl(
    const at::TensorBase& grad_input, const at::TensorBase& grad_grid,
    const at::TensorBase& grad_output, const at::TensorBase& input,
    const at::TensorBase& grid, GridSamplerInterpolation interpolation_mode,
    GridSamplerPadding padding_mode, bool align_corners, bool input_requires_grad) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t N = input.size(0);
  const int64_t C = input.size(1);
  const int64_t inp_D = input.size(2);
  const int64_t inp_H = input.size(3);
  const int64_t inp_W = input.size(4);
  const int64_t out_D = grid.size(1);
  const int64_t out_H = grid.size(2);
  const int64_t out_W = grid.size(3);
  const int64_t count = N * out_D * out_H * out_W;
  const bool nearest = interpolation_mode == GridSamplerInterpolation::Nearest;
  const int slots = nearest ? 1 : 8;
  const int slot_shift = nearest ? 0 : 3;
  const int64_t ncontrib = slots * count;
  const int64_t sentinel = N * inp_D * inp_H * inp_W;
  auto stream = at::cuda::getCurrentCUDAStream();
  auto* allocator = c10::cuda::CUDACachingAllocator::get();

  grid_sampler_3d_deterministic_strides<index_t> st;
  for (int k = 0; k < 5; ++k) {
    st.inp[k] = static_cast<index_t>(input.stride(k));
    st.grid[k] = static_cast<index_t>(grid.stride(k));
    st.gout[k] = static_cast<index_t>(grad_output.stride(k));
    st.ggrid[k] = static_cast<index_t>(grad_grid.stride(k));
  }

  c10::DataPtr keys, ordinals, weights, gout_offsets;
  if (input_requires_grad) {
    keys = allocator->allocate(ncontrib * sizeof(int64_t));
    ordinals = allocator->allocate(ncontrib * sizeof(int64_t));
    weights = allocator->allocate(ncontrib * sizeof(opmath_t));
    gout_offsets = allocator->allocate(count * sizeof(index_t));
  }

  grid_sampler_3d_backward_deterministic_points_kernel<scalar_t, opmath_t, index_t>
      <<<grid_sampler_2d_deterministic_blocks(count), 256, 0, stream>>>(
          static_cast<index_t>(count),
          grad_output.data_ptr<scalar_t>(), input.data_ptr<scalar_t>(),
          grid.data_ptr<scalar_t>(), grad_grid.data_ptr<scalar_t>(),
          C, inp_D, inp_H, inp_W, out_D, out_H, out_W, st,
          interpolation_mode, padding_mode, align_corners, input_requires_grad, sentinel, slots,
          static_cast<int64_t*>(keys.get()), static_cast<int64_t*>(ordinals.get()),
          static_cast<opmath_t*>(weights.get()), static_cast<index_t*>(gout_offsets.get()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  if (!input_requires_grad) {
    return;
  }

  c10::DataPtr sorted_keys = allocator->allocate(ncontrib * sizeof(int64_t));
  c10::DataPtr sorted_ordinals = allocator->allocate(ncontrib * sizeof(int64_t));
  int end_bit = 1;  // bits needed to hold the sentinel
  while (end_bit < 63 && (int64_t(1) << end_bit) <= sentinel) {
    ++end_bit;
  }
  deterministic_radix_sort_pairs(
      static_cast<const int64_t*>(keys.get()), static_cast<int64_t*>(sorted_keys.get()),
      static_cast<const int64_t*>(ordinals.get()), static_cast<int64_t*>(sorted_ordinals.get()),
      ncontrib, end_bit);

  c10::DataPtr run_begin = allocator->allocate(sentinel * sizeof(int64_t));
  c10::DataPtr run_end = allocator->allocate(sentinel * sizeof(int64_t));
  c10::DataPtr packed_weights = allocator->allocate(ncontrib * sizeof(opmath_t));
  c10::DataPtr packed_offsets = allocator->allocate(ncontrib * sizeof(index_t));
  C10_CUDA_CHECK(cudaMemsetAsync(run_begin.get(), 0, sentinel * sizeof(int64_t), stream));
  C10_CUDA_CHECK(cudaMemsetAsync(run_end.get(), 0, sentinel * sizeof(int64_t), stream));

  grid_sampler_3d_backward_deterministic_runs_kernel<opmath_t, index_t>
      <<<grid_sampler_2d_deterministic_blocks(ncontrib), 256, 0, stream>>>(
          ncontrib, sentinel, slot_shift,
          static_cast<const int64_t*>(sorted_keys.get()),
          static_cast<const int64_t*>(sorted_ordinals.get()),
          static_cast<const opmath_t*>(weights.get()),
          static_cast<const index_t*>(gout_offsets.get()),
          static_cast<int64_t*>(run_begin.get()), static_cast<int64_t*>(run_end.get()),
          static_cast<opmath_t*>(packed_weights.get()),
          static_cast<index_t*>(packed_offsets.get()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const int64_t total = N * C * inp_D * inp_H * inp_W;
  grid_sampler_3d_backward_deterministic_gather_kernel<scalar_t, opmath_t, index_t>
      <<<grid_sampler_2d_deterministic_blocks(total), 256, 0, stream>>>(
          static_cast<index_t>(total), C, inp_D, inp_H, inp_W,
          grad_input.stride(0), grad_input.stride(1), grad_input.stride(2),
          grad_input.stride(3), grad_input.stride(4), grad_output.stride(1),
          grad_output.data_ptr<scalar_t>(),
          static_cast<const int64_t*>(run_begin.get()),
          static_cast<const int64_t*>(run_end.get()),
          static_cast<const opmath_t*>(packed_weights.get()),
          static_cast<const index_t*>(packed_offsets.get()),
          grad_input.data_ptr<scalar_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // one warp per voxel, 8 a block; most return at once (short runs)
  const int long_run_blocks = static_cast<int>(std::min<int64_t>((sentinel + 7) / 8, int64_t(1) << 16));
  grid_sampler_3d_backward_deterministic_long_runs_kernel<scalar_t, opmath_t, index_t>
      <<<long_run_blocks, 256, 0, stream>>>(
          sentinel, C, inp_D, inp_H, inp_W,
          grad_input.stride(0), grad_input.stride(1), grad_input.stride(2),
          grad_input.stride(3), grad_input.stride(4), grad_output.stride(1),
          grad_output.data_ptr<scalar_t>(),
          static_cast<const int64_t*>(run_begin.get()),
          static_cast<const int64_t*>(run_end.get()),
          static_cast<const opmath_t*>(packed_weights.get()),
          static_cast<const index_t*>(packed_offsets.get()),
          grad_input.data_ptr<scalar_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // scratch goes back to the stream-ordered caching allocator with the DataPtrs
}

// grad_input (if input_requires_grad) and grad_grid are written in full.
// interpolation_mode: Bilinear (trilinear) or Nearest.
static void grid_sampler_3d_backward_deterministic(
    const at::TensorBase& grad_input, const at::TensorBase& grad_grid,
    const at::TensorBase& grad_output, const at::TensorBase& input,
    const at::TensorBase& grid, int64_t interpolation_mode, int64_t padding_mode,
    bool align_corners, bool input_requires_grad) {
  const auto interp = static_cast<GridSamplerInterpolation>(interpolation_mode);
  TORCH_CHECK(interp == GridSamplerInterpolation::Bilinear ||
              interp == GridSamplerInterpolation::Nearest,
              "grid_sampler_3d_backward_cuda: no deterministic implementation for this mode");
  const int64_t count = input.size(0) * grid.size(1) * grid.size(2) * grid.size(3);
  if (count == 0) {
    return;
  }
  const int64_t slots = interp == GridSamplerInterpolation::Nearest ? 1 : 8;
  TORCH_CHECK(slots * count <= std::numeric_limits<int32_t>::max(),
              "grid_sampler_3d_backward_cuda (deterministic): too many grid points (",
              count, ")");
  int64_t need = std::max<int64_t>(
      std::max<int64_t>(grid_sampler_2d_deterministic_span(input),
                        grid_sampler_2d_deterministic_span(grid)),
      std::max<int64_t>(grid_sampler_2d_deterministic_span(grad_output),
                        grid_sampler_2d_deterministic_span(grad_grid)));
  need = std::max<int64_t>(need, slots * count);
  if (input_requires_grad) {
    need = std::max<int64_t>(need, grid_sampler_2d_deterministic_span(grad_input));
    need = std::max<int64_t>(need, grad_input.numel());
  }
  const bool use_int32 = need <= std::numeric_limits<int32_t>::max();
  const auto padding = static_cast<GridSamplerPadding>(padding_mode);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16,
      input.scalar_type(), "grid_sampler_3d_backward_cuda_deterministic", [&] {
        if (use_int32) {
          grid_sampler_3d_backward_deterministic_impl<scalar_t, int32_t>(
              grad_input, grad_grid, grad_output, input, grid, interp, padding,
              align_corners, input_requires_grad);
        } else {
          grid_sampler_3d_backward_deterministic_impl<scalar_t, int64_t>(
              grad_input, grad_grid, grad_output, input, grid, interp, padding,
              align_corners, input_requires_grad);
        }
      });
}
// END grid_sampler_3d
