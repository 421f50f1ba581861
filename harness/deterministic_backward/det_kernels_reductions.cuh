// Deterministic CUDA kernels for issue 18 (second half): histc and bincount
// (with and without weights), kthvalue and median/nanmedian with indices, and
// cumsum on floating and complex types.
//
// Single source, like det_kernels17.cuh: the H200 harness (det_ext_reductions.cu)
// compiles it against torch 2.11 after det_accumulate.cuh; make_patches_reductions.py
// copies the marked sections (after det_accumulate.cuh's det_common, and
// det_fixed_point where named) verbatim into the torch 1.13.1 .cu files. Only names
// that exist in both torches are used (see det_accumulate.cuh), plus gpuAtomicAdd
// (ATen/cuda/Atomic.cuh) in the histogram section. C++14, CUDA 11.2.
//
// Why each result is bitwise the same on every run, stream and GPU:
// * histogram: counts are integer sums; weights go through the fixed-point
//   primitive (integer sums again). Integer addition does not depend on order.
// * order statistics: the selected element is defined by a total order on
//   (value, index), found by exact integer counting; no race picks among ties.
// * scan: the association of every prefix sum is a function of the position and
//   of two compile-time constants (threads per block, items per thread), never of
//   the grid size, the SM count or the timing of other blocks.

// BEGIN det_histogram
// histc / bincount. Each value falls into one bin (histc: 1.13.1's getBin
// arithmetic in SummaryOps.cu, values outside [lo, hi] and NaN are skipped;
// bincount: the value itself). Unweighted, a bin is an integer count; weighted,
// each weight becomes a 64-bit fixed-point integer (det_fixed_point: scale from
// max |w| found on the device; at most n weights reach one bin, so L = ceil(log2 n)
// and no sum can overflow). Counts are kept per block in shared memory when the
// bins fit, then added into a global uint64 buffer, then converted once. A warp
// whose 32 values fall into one bin adds once (the warp's integer sum): the
// all-in-one-bin case costs one atomic per warp instead of 32.
constexpr int kDetHistThreads = 256;
constexpr int64_t kDetHistSharedBins = 4096;  // 32 KiB of uint64 per block

template <typename input_t, typename bound_t>
__device__ __forceinline__ int det_hist_bin(input_t v, bound_t lo, bound_t hi, int64_t nbins) {
  if (!(v >= lo && v <= hi)) {
    return -1;
  }
  int bin = (int)(((v - lo)) * nbins / (hi - lo));
  if (bin == nbins) {
    bin -= 1;  // the last bin is closed at both ends
  }
  return bin;
}

template <typename input_t, typename bound_t, typename weight_t, bool kWeighted>
C10_LAUNCH_BOUNDS_1(256)
__global__ void det_histogram_kernel(
    const input_t* __restrict__ in, const int64_t n, const weight_t* __restrict__ weights,
    const int64_t nbins, const bound_t lo, const bound_t hi, const bool by_value,
    unsigned long long* __restrict__ acc, weight_t* __restrict__ special,
    const unsigned long long* __restrict__ state, const int log2_hits, const bool use_shared) {
  extern __shared__ unsigned long long det_hist_smem[];
  const int shift = kWeighted ? det_fixed_point_shift(*state, log2_hits) : 0;
  unsigned long long* bins = use_shared ? det_hist_smem : acc;
  if (use_shared) {
    for (int64_t b = threadIdx.x; b < nbins; b += blockDim.x) {
      det_hist_smem[b] = 0ull;
    }
    __syncthreads();
  }
  const int lane = threadIdx.x & 31;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  // the loop bound is the same for all lanes of a warp (the shuffles below need them all)
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + (threadIdx.x - lane); base < n;
       base += stride) {
    const int64_t i = base + lane;
    int bin = -1;
    unsigned long long q = 1ull;
    bool finite = true;
    if (i < n) {
      const input_t v = in[i];
      bin = by_value ? static_cast<int>(v) : det_hist_bin<input_t, bound_t>(v, lo, hi, nbins);
      if (kWeighted && bin >= 0) {
        const double w = static_cast<double>(weights[i]);
        if (::isfinite(w)) {
          q = static_cast<unsigned long long>(det_fixed_point_from(w, shift));
        } else {
          finite = false;
        }
      }
    }
    const int first = __shfl_sync(0xffffffffu, bin, 0);
    if (__all_sync(0xffffffffu, bin == first && finite)) {
      if (first >= 0) {
        unsigned long long sum = q;  // integer (wrapping) sum: exact in any order
        for (int offset = 16; offset > 0; offset /= 2) {
          sum += __shfl_down_sync(0xffffffffu, sum, offset);
        }
        if (lane == 0 && sum != 0ull) {
          atomicAdd(bins + first, sum);
        }
      }
    } else if (bin >= 0) {
      if (!finite) {
        gpuAtomicAdd(special + bin, weights[i]);  // inf/NaN: order-independent (det_fixed_point)
      } else if (q != 0ull) {
        atomicAdd(bins + bin, q);
      }
    }
  }
  if (use_shared) {
    __syncthreads();
    for (int64_t b = threadIdx.x; b < nbins; b += blockDim.x) {
      const unsigned long long c = det_hist_smem[b];
      if (c != 0ull) {
        atomicAdd(acc + b, c);
      }
    }
  }
}

template <typename out_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void det_histogram_counts_kernel(const unsigned long long* __restrict__ acc,
                                            out_t* __restrict__ out, const int64_t nbins) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < nbins; b += stride) {
    out[b] = static_cast<out_t>(acc[b]);
  }
}

static inline int det_histogram_grid(int64_t n, int64_t nbins) {
  // enough blocks to fill any current GPU; more only multiply the per-block flushes
  // of the shared bins (fewer blocks when there are many bins)
  const int64_t blocks = (n + kDetHistThreads * 16 - 1) / (kDetHistThreads * 16);
  const int64_t cap = nbins <= 256 ? 1024 : std::max<int64_t>(264, 262144 / nbins);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, cap)));
}

// out: contiguous, nbins elements (histc: the input's dtype; bincount: int64, or the
// weights' dtype when weighted). in: contiguous 1-D. weights: undefined, or contiguous
// 1-D float/double of in's length. by_value: bincount (bin = value, all in range).
template <typename input_t, typename bound_t>
static void histogram_deterministic(const at::TensorBase& out, const at::TensorBase& in,
                                    const at::TensorBase& weights, int64_t nbins, bound_t lo,
                                    bound_t hi, bool by_value) {
  if (nbins <= 0) {
    return;
  }
  const int64_t n = in.numel();
  auto stream = at::cuda::getCurrentCUDAStream();
  auto* allocator = c10::cuda::CUDACachingAllocator::get();
  c10::DataPtr acc = allocator->allocate(nbins * sizeof(unsigned long long));
  const bool use_shared = nbins <= kDetHistSharedBins;
  const size_t smem = use_shared ? static_cast<size_t>(nbins) * sizeof(unsigned long long) : 0;
  const int grid = det_histogram_grid(n, nbins);
  unsigned long long* acc_p = static_cast<unsigned long long*>(acc.get());
  if (!weights.defined()) {
    C10_CUDA_CHECK(cudaMemsetAsync(acc_p, 0, nbins * sizeof(unsigned long long), stream));
    if (n > 0) {
      det_histogram_kernel<input_t, bound_t, float, false><<<grid, kDetHistThreads, smem, stream>>>(
          in.data_ptr<input_t>(), n, nullptr, nbins, lo, hi, by_value, acc_p, nullptr, nullptr, 0,
          use_shared);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    AT_DISPATCH_ALL_TYPES(out.scalar_type(), "histogram_cuda_deterministic_counts", [&] {
      det_histogram_counts_kernel<scalar_t><<<det_blocks(nbins), 256, 0, stream>>>(
          acc_p, out.data_ptr<scalar_t>(), nbins);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return;
  }
  c10::DataPtr state = allocator->allocate(sizeof(unsigned long long));
  unsigned long long* state_p = static_cast<unsigned long long*>(state.get());
  C10_CUDA_CHECK(cudaMemsetAsync(state_p, 0, sizeof(unsigned long long), stream));
  // at most n weights reach one bin
  const int log2_hits = det_ceil_log2(n < 1 ? 1 : n);
  AT_DISPATCH_FLOATING_TYPES(weights.scalar_type(), "histogram_cuda_deterministic_weighted", [&] {
    det_fixed_point_prepare_kernel<scalar_t, scalar_t><<<det_blocks(std::max(n, nbins)), 256, 0, stream>>>(
        weights.data_ptr<scalar_t>(), n, acc_p, nbins, out.data_ptr<scalar_t>(), nbins, state_p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (n > 0) {
      det_histogram_kernel<input_t, bound_t, scalar_t, true><<<grid, kDetHistThreads, smem, stream>>>(
          in.data_ptr<input_t>(), n, weights.data_ptr<scalar_t>(), nbins, lo, hi, by_value, acc_p,
          out.data_ptr<scalar_t>(), state_p, log2_hits, use_shared);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    det_fixed_point_finish_kernel<scalar_t, scalar_t><<<det_blocks(nbins), 256, 0, stream>>>(
        acc_p, out.data_ptr<scalar_t>(), nbins, state_p, log2_hits);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}
// END det_histogram

// BEGIN det_order_select
// kthvalue and median/nanmedian with indices. The element chosen is the one of
// rank k in the order of (value, index): ascending values, NaN above every
// number (all NaNs equal), -0.0 equal to +0.0, equal values ordered by their
// position. This is the CPU's median rule exactly (std::nth_element with the
// comparator ip[i] < ip[j] || (ip[i] == ip[j] && i < j), and the first NaN when
// the slice holds one); for kthvalue it fixes the index among equal values
// (the CPU's quickselect leaves it to its swap order). One block per slice:
// an MSB-first radix select on an order-preserving unsigned key (8 bits a pass,
// counts in shared memory, exact integers), then the k'-th element whose key
// matches, found by counting matches in index order with warp ballots. The
// value written is the input element at that index (bitwise the CPU's).
template <typename T>
struct det_radix;

template <>
struct det_radix<float> {
  using key_t = uint32_t;
  static __device__ __forceinline__ key_t key(float v) {
    if (v != v) {
      return 0xffffffffu;
    }
    const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  }
  static __device__ __forceinline__ bool nan(float v) { return v != v; }
};

template <>
struct det_radix<double> {
  using key_t = unsigned long long;
  static __device__ __forceinline__ key_t key(double v) {
    if (v != v) {
      return ~0ull;
    }
    const unsigned long long u =
        static_cast<unsigned long long>(__double_as_longlong(v == 0.0 ? 0.0 : v));
    return (u & 0x8000000000000000ull) ? ~u : (u | 0x8000000000000000ull);
  }
  static __device__ __forceinline__ bool nan(double v) { return v != v; }
};

template <>
struct det_radix<c10::Half> {
  using key_t = uint32_t;
  static __device__ __forceinline__ key_t key(c10::Half v) {
    return det_radix<float>::key(static_cast<float>(v));
  }
  static __device__ __forceinline__ bool nan(c10::Half v) {
    return det_radix<float>::nan(static_cast<float>(v));
  }
};

template <>
struct det_radix<c10::BFloat16> {
  using key_t = uint32_t;
  static __device__ __forceinline__ key_t key(c10::BFloat16 v) {
    return det_radix<float>::key(static_cast<float>(v));
  }
  static __device__ __forceinline__ bool nan(c10::BFloat16 v) {
    return det_radix<float>::nan(static_cast<float>(v));
  }
};

template <typename T, typename K>
struct det_radix_int {
  using key_t = K;
  static __device__ __forceinline__ key_t key(T v) {
    return static_cast<K>(v) ^ (std::is_signed<T>::value ? (K(1) << (sizeof(K) * 8 - 1)) : K(0));
  }
  static __device__ __forceinline__ bool nan(T) { return false; }
};
template <> struct det_radix<uint8_t> : det_radix_int<uint8_t, uint32_t> {};
template <> struct det_radix<int8_t> : det_radix_int<int8_t, uint32_t> {};
template <> struct det_radix<int16_t> : det_radix_int<int16_t, uint32_t> {};
template <> struct det_radix<int32_t> : det_radix_int<int32_t, uint32_t> {};
template <> struct det_radix<int64_t> : det_radix_int<int64_t, unsigned long long> {};

constexpr int kDetSelectKth = 0;        // rank k (1-based) given
constexpr int kDetSelectMedian = 1;     // torch.median: the first NaN, else rank (n - 1) / 2 + 1
constexpr int kDetSelectNanMedian = 2;  // torch.nanmedian: rank (m - 1) / 2 + 1 of the m non-NaN

template <typename scalar_t>
C10_LAUNCH_BOUNDS_1(512)
__global__ void det_select_kernel(const scalar_t* __restrict__ in, const int64_t n, const int64_t inner,
                                  const int64_t k_given, const int mode, scalar_t* __restrict__ values,
                                  int64_t* __restrict__ indices) {
  using R = det_radix<scalar_t>;
  using key_t = typename R::key_t;
  constexpr int kBits = static_cast<int>(sizeof(key_t) * 8);
  __shared__ unsigned int hist[256];
  __shared__ unsigned int warp_counts[32];
  __shared__ unsigned long long nan_count;
  __shared__ key_t sh_prefix;
  __shared__ long long sh_k;
  __shared__ unsigned int sh_bucket;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const int64_t slice = blockIdx.x;
  const scalar_t* base = in + (slice / inner) * n * inner + (slice % inner);

  key_t prefix = 0;
  key_t mask = 0;
  long long k = k_given;
  for (int shift = kBits - 8; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      hist[b] = 0u;
    }
    if (threadIdx.x == 0) {
      nan_count = 0ull;
    }
    __syncthreads();
    unsigned long long nans = 0;
    for (int64_t j0 = 0; j0 < n; j0 += blockDim.x) {  // same trip count for every lane
      const int64_t j = j0 + threadIdx.x;
      int digit = -1;
      if (j < n) {
        const scalar_t v = base[j * inner];
        const key_t key = R::key(v);
        if ((key & mask) == prefix) {
          digit = static_cast<int>((key >> shift) & key_t(255));
        }
        if (shift == kBits - 8 && mode != kDetSelectKth && R::nan(v)) {
          ++nans;
        }
      }
      const int first = __shfl_sync(0xffffffffu, digit, 0);
      if (__all_sync(0xffffffffu, digit == first)) {
        if (lane == 0 && first >= 0) {
          atomicAdd(hist + first, 32u);  // many ties: one add per warp
        }
      } else if (digit >= 0) {
        atomicAdd(hist + digit, 1u);
      }
    }
    if (nans != 0ull) {
      atomicAdd(&nan_count, nans);
    }
    __syncthreads();
    if (warp == 0) {
      if (shift == kBits - 8 && mode != kDetSelectKth) {
        const long long nn = static_cast<long long>(nan_count);
        if (mode == kDetSelectMedian) {
          k = nn > 0 ? n - nn + 1 : (n - 1) / 2 + 1;
        } else {
          const long long m = n - nn;
          k = m > 0 ? (m - 1) / 2 + 1 : 1;
        }
      }
      // lane l owns bins [8l, 8l + 8); an inclusive warp scan of their sums finds the bucket
      unsigned int own = 0;
      for (int b = 0; b < 8; ++b) {
        own += hist[lane * 8 + b];
      }
      unsigned int incl = own;
      for (int offset = 1; offset < 32; offset *= 2) {
        const unsigned int t = __shfl_up_sync(0xffffffffu, incl, offset);
        if (lane >= offset) {
          incl += t;
        }
      }
      const unsigned int excl = incl - own;
      if (static_cast<long long>(excl) < k && k <= static_cast<long long>(incl)) {
        long long left = k - excl;
        for (int b = 0; b < 8; ++b) {
          const unsigned int c = hist[lane * 8 + b];
          if (left <= static_cast<long long>(c)) {
            sh_prefix = prefix | (static_cast<key_t>(lane * 8 + b) << shift);
            sh_k = left;
            sh_bucket = c;
            break;
          }
          left -= c;
        }
      }
    }
    __syncthreads();
    prefix = sh_prefix;
    k = sh_k;
    mask |= key_t(255) << shift;
    const unsigned int bucket = sh_bucket;
    __syncthreads();  // the shared words are rewritten by the next pass
    if (bucket == 1u) {
      break;  // one element left: it is the k-th (k == 1)
    }
  }
  // the k-th element, in index order, among those whose key matches the prefix
  for (int64_t j0 = 0; j0 < n; j0 += blockDim.x) {
    const int64_t j = j0 + threadIdx.x;
    const bool match = j < n && (R::key(base[j * inner]) & mask) == prefix;
    const unsigned int ballot = __ballot_sync(0xffffffffu, match);
    if (lane == 0) {
      warp_counts[warp] = __popc(ballot);
    }
    __syncthreads();
    unsigned int before = 0, total = 0;
    for (int w = 0; w < nwarps; ++w) {
      const unsigned int c = warp_counts[w];
      before += w < warp ? c : 0u;
      total += c;
    }
    if (k <= static_cast<long long>(total)) {  // the same decision in every thread
      const unsigned int rank = before + __popc(ballot & ((1u << lane) - 1u)) + 1u;
      if (match && static_cast<long long>(rank) == k) {
        values[slice] = base[j * inner];
        indices[slice] = j;
      }
      break;
    }
    k -= total;
    __syncthreads();
  }
}

// values_c, indices_c: contiguous, one element per slice (the input's shape with
// size 1 at dim); in_c: contiguous. k: 1-based rank (kDetSelectKth). Returns false
// (nothing launched) when a slice or the slice count does not fit the kernel's
// 32-bit counters.
static bool select_deterministic(const at::TensorBase& values_c, const at::TensorBase& indices_c,
                                 const at::TensorBase& in_c, int64_t dim, int64_t k, int mode) {
  const int64_t n = in_c.dim() == 0 ? 1 : in_c.size(dim);
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < in_c.dim(); ++d) {
    inner *= in_c.size(d);
  }
  const int64_t slices = n == 0 ? 0 : in_c.numel() / n;
  if (n >= std::numeric_limits<int32_t>::max() || slices >= std::numeric_limits<int32_t>::max()) {
    return false;
  }
  if (slices == 0) {
    return true;
  }
  const int64_t warps = std::min<int64_t>(16, std::max<int64_t>(2, (n + 31) / 32));
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_ALL_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, in_c.scalar_type(),
                             "select_cuda_deterministic", [&] {
    det_select_kernel<scalar_t><<<static_cast<unsigned int>(slices), static_cast<unsigned int>(warps * 32), 0,
                                  stream>>>(in_c.data_ptr<scalar_t>(), n, inner, k, mode,
                                            values_c.data_ptr<scalar_t>(), indices_c.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return true;
}
// END det_order_select

// BEGIN det_scan
// cumsum along one dim of a contiguous tensor seen as (outer, n, inner), real
// types (the caller views complex as real: a trailing pair dim). Accumulation in
// double for float and double, in float for half and bfloat16 (int64 for integer
// types, exact); one rounding per output element.
// * inner == 1 (rows; or a complex row, W = 2 interleaved components): tiles of
//   kDetScanThreads x kDetScanItems elements. Each thread sums its items in
//   order, a block scan of the thread sums (fixed Kogge-Stone trees in each warp,
//   then over the warps) gives each thread its offset within the tile. Rows of
//   more than one tile first store the tile sums, scan them (one block per row,
//   the same block scan, chunk by chunk) and add each tile's prefix.
// * inner > 1: one thread per (outer, inner) column adds along n in order.
// The association of every output is fixed by its position and the two constants.
constexpr int kDetScanThreads = 256;
constexpr int kDetScanItems = 8;
constexpr int64_t kDetScanTile = kDetScanThreads * kDetScanItems;

template <typename T>
struct det_scan_acc {
  using type = typename std::conditional<std::is_integral<T>::value, int64_t, double>::type;
};
template <>
struct det_scan_acc<c10::Half> {
  using type = float;
};
template <>
struct det_scan_acc<c10::BFloat16> {
  using type = float;
};

// x: this thread's value(s); on return the exclusive prefix over the block's threads;
// total: the block's sum. smem: 32 * W accumulators.
template <typename acc_t, int W>
__device__ __forceinline__ void det_block_exclusive_scan(acc_t (&x)[W], acc_t (&total)[W], acc_t* smem) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  acc_t inc[W];
#pragma unroll
  for (int c = 0; c < W; ++c) {
    inc[c] = x[c];
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const acc_t t = __shfl_up_sync(0xffffffffu, inc[c], offset);
      if (lane >= offset) {
        inc[c] += t;
      }
    }
  }
  if (lane == 31) {
#pragma unroll
    for (int c = 0; c < W; ++c) {
      smem[warp * W + c] = inc[c];
    }
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int c = 0; c < W; ++c) {
      acc_t s = lane < nwarps ? smem[lane * W + c] : acc_t(0);
#pragma unroll
      for (int offset = 1; offset < 32; offset *= 2) {
        const acc_t t = __shfl_up_sync(0xffffffffu, s, offset);
        if (lane >= offset) {
          s += t;
        }
      }
      if (lane < nwarps) {
        smem[lane * W + c] = s;  // inclusive over warps
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int c = 0; c < W; ++c) {
    const acc_t up = __shfl_up_sync(0xffffffffu, inc[c], 1);
    const acc_t within = lane > 0 ? up : acc_t(0);
    const acc_t warp_offset = warp > 0 ? smem[(warp - 1) * W + c] : acc_t(0);
    x[c] = warp_offset + within;
    total[c] = smem[(nwarps - 1) * W + c];
  }
  __syncthreads();  // smem is reused by the caller's next scan
}

// tile sums of every (row, tile); sums[(row * tiles + t) * W + c]
template <typename scalar_t, typename acc_t, int W>
C10_LAUNCH_BOUNDS_1(256)
__global__ void det_scan_tile_sums_kernel(const scalar_t* __restrict__ in, const int64_t n,
                                          const int64_t tiles, acc_t* __restrict__ sums) {
  __shared__ acc_t smem[32 * W];
  const int64_t row = blockIdx.x / tiles;
  const int64_t t = blockIdx.x % tiles;
  const int64_t first = t * kDetScanTile + static_cast<int64_t>(threadIdx.x) * kDetScanItems;
  const scalar_t* src = in + row * n * W;
  acc_t s[W], total[W];
#pragma unroll
  for (int c = 0; c < W; ++c) {
    s[c] = acc_t(0);
  }
#pragma unroll
  for (int it = 0; it < kDetScanItems; ++it) {
    const int64_t j = first + it;
    if (j < n) {
#pragma unroll
      for (int c = 0; c < W; ++c) {
        s[c] += static_cast<acc_t>(src[j * W + c]);
      }
    }
  }
  det_block_exclusive_scan<acc_t, W>(s, total, smem);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int c = 0; c < W; ++c) {
      sums[blockIdx.x * W + c] = total[c];
    }
  }
}

// in place: tile sums -> exclusive tile prefixes, one block per row
template <typename acc_t, int W>
C10_LAUNCH_BOUNDS_1(256)
__global__ void det_scan_tile_prefix_kernel(acc_t* __restrict__ sums, const int64_t tiles) {
  __shared__ acc_t smem[32 * W];
  acc_t* row_sums = sums + static_cast<int64_t>(blockIdx.x) * tiles * W;
  acc_t carry[W];
#pragma unroll
  for (int c = 0; c < W; ++c) {
    carry[c] = acc_t(0);
  }
  for (int64_t t0 = 0; t0 < tiles; t0 += blockDim.x) {
    const int64_t t = t0 + threadIdx.x;
    acc_t x[W], total[W];
#pragma unroll
    for (int c = 0; c < W; ++c) {
      x[c] = t < tiles ? row_sums[t * W + c] : acc_t(0);
    }
    det_block_exclusive_scan<acc_t, W>(x, total, smem);
    if (t < tiles) {
#pragma unroll
      for (int c = 0; c < W; ++c) {
        row_sums[t * W + c] = carry[c] + x[c];
      }
    }
#pragma unroll
    for (int c = 0; c < W; ++c) {
      carry[c] = carry[c] + total[c];
    }
  }
}

template <typename scalar_t, typename acc_t, int W>
C10_LAUNCH_BOUNDS_1(256)
__global__ void det_scan_rows_kernel(const scalar_t* __restrict__ in, scalar_t* __restrict__ out,
                                     const int64_t n, const int64_t tiles,
                                     const acc_t* __restrict__ tile_prefix) {
  __shared__ acc_t smem[32 * W];
  const int64_t row = blockIdx.x / tiles;
  const int64_t t = blockIdx.x % tiles;
  const int64_t first = t * kDetScanTile + static_cast<int64_t>(threadIdx.x) * kDetScanItems;
  const scalar_t* src = in + row * n * W;
  scalar_t* dst = out + row * n * W;
  acc_t local[kDetScanItems][W];
  acc_t s[W], total[W];
#pragma unroll
  for (int c = 0; c < W; ++c) {
    s[c] = acc_t(0);
  }
#pragma unroll
  for (int it = 0; it < kDetScanItems; ++it) {
    const int64_t j = first + it;
#pragma unroll
    for (int c = 0; c < W; ++c) {
      if (j < n) {
        s[c] += static_cast<acc_t>(src[j * W + c]);
      }
      local[it][c] = s[c];
    }
  }
  det_block_exclusive_scan<acc_t, W>(s, total, smem);
#pragma unroll
  for (int c = 0; c < W; ++c) {
    const acc_t tile_base = tile_prefix != nullptr ? tile_prefix[blockIdx.x * W + c] : acc_t(0);
    s[c] = tile_base + s[c];
  }
#pragma unroll
  for (int it = 0; it < kDetScanItems; ++it) {
    const int64_t j = first + it;
    if (j < n) {
#pragma unroll
      for (int c = 0; c < W; ++c) {
        dst[j * W + c] = static_cast<scalar_t>(s[c] + local[it][c]);
      }
    }
  }
}

template <typename scalar_t, typename acc_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void det_scan_columns_kernel(const scalar_t* __restrict__ in, scalar_t* __restrict__ out,
                                        const int64_t columns, const int64_t n, const int64_t inner) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < columns;
       col += stride) {
    const int64_t offset = (col / inner) * n * inner + (col % inner);
    acc_t s = acc_t(0);
    for (int64_t j = 0; j < n; ++j) {
      s += static_cast<acc_t>(in[offset + j * inner]);
      out[offset + j * inner] = static_cast<scalar_t>(s);
    }
  }
}

template <typename scalar_t, typename acc_t, int W>
static void det_scan_rows(const scalar_t* in, scalar_t* out, int64_t rows, int64_t n, cudaStream_t stream) {
  const int64_t tiles = (n + kDetScanTile - 1) / kDetScanTile;
  const int64_t blocks = rows * tiles;
  TORCH_CHECK(blocks < std::numeric_limits<int32_t>::max(), "cumsum: too many tiles for the deterministic kernel");
  if (tiles == 1) {
    det_scan_rows_kernel<scalar_t, acc_t, W><<<static_cast<unsigned int>(blocks), kDetScanThreads, 0, stream>>>(
        in, out, n, tiles, nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  auto* allocator = c10::cuda::CUDACachingAllocator::get();
  c10::DataPtr sums = allocator->allocate(blocks * W * sizeof(acc_t));
  acc_t* sums_p = static_cast<acc_t*>(sums.get());
  det_scan_tile_sums_kernel<scalar_t, acc_t, W><<<static_cast<unsigned int>(blocks), kDetScanThreads, 0, stream>>>(
      in, n, tiles, sums_p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  det_scan_tile_prefix_kernel<acc_t, W><<<static_cast<unsigned int>(rows), kDetScanThreads, 0, stream>>>(
      sums_p, tiles);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  det_scan_rows_kernel<scalar_t, acc_t, W><<<static_cast<unsigned int>(blocks), kDetScanThreads, 0, stream>>>(
      in, out, n, tiles, sums_p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// result_c, self_c: contiguous, the same real floating dtype and shape. pairs: the
// last dim (of size 2) holds the real and imaginary parts of a complex tensor
// (view_as_real), dim being a dim of the complex tensor.
static void cumsum_deterministic(const at::TensorBase& result_c, const at::TensorBase& self_c, int64_t dim,
                                 bool pairs) {
  const int64_t n = self_c.size(dim);
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < self_c.dim(); ++d) {
    inner *= self_c.size(d);
  }
  if (self_c.numel() == 0 || n == 0) {
    return;
  }
  const int64_t rows = self_c.numel() / (n * inner);
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_ALL_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, self_c.scalar_type(),
                             "cumsum_cuda_deterministic", [&] {
    using acc_t = typename det_scan_acc<scalar_t>::type;
    const scalar_t* in = self_c.data_ptr<scalar_t>();
    scalar_t* out = result_c.data_ptr<scalar_t>();
    if (inner == 1) {
      det_scan_rows<scalar_t, acc_t, 1>(in, out, rows, n, stream);
    } else if (pairs && inner == 2) {
      det_scan_rows<scalar_t, acc_t, 2>(in, out, rows, n, stream);
    } else {
      const int64_t columns = rows * inner;
      det_scan_columns_kernel<scalar_t, acc_t><<<det_blocks(columns), 256, 0, stream>>>(in, out, columns, n, inner);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}
// END det_scan
