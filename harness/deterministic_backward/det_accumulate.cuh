// Shared pieces of the deterministic CUDA kernels of issue 17 (pooling,
// padding, interpolation, unpooling): index helpers, a 5-D view of a tensor,
// and the deterministic accumulation primitive.
//
// This file is a single source: the H200 harness (det_ext.cu) includes it
// against torch 2.11, and make_patches.py copies the marked section verbatim
// into each torch 1.13.1 .cu file that needs it. Only names that exist in both
// are used (at::TensorBase, at::opmath_type, C10_LAUNCH_BOUNDS_1,
// C10_CUDA_CHECK, C10_CUDA_KERNEL_LAUNCH_CHECK, at::cuda::getCurrentCUDAStream,
// c10::cuda::CUDACachingAllocator), C++14 and CUDA 11.2 device functions only.
//
// BEGIN det_common
// ---------------------------------------------------------------------------
// Two ways to add many contributions to one element deterministically
// ---------------------------------------------------------------------------
//
// 1. Gather ("one writer, fixed order"). Where the set of outputs that feed
//    an input element can be computed from its position (average and adaptive
//    average pooling, padding backward, interpolation backward), one thread
//    per grad_input element enumerates those outputs in a fixed (ascending)
//    order, sums in the accumulate type and stores once. No atomics and no
//    scratch memory; the order of additions is a function of the shapes only,
//    so the result is bitwise the same on every run, stream and GPU. Used by
//    every gather kernel of det_kernels17.cuh.
//
// 2. Fixed point ("any order, same sum"). Where contributions are routed by
//    data (an argmax index: max_pool3d, fractional_max_pool2d/3d), each is
//    converted to a 64-bit fixed-point integer and added with an integer
//    atomicAdd. Integer addition is associative and commutative, so the final
//    integer, and the value converted from it, do not depend on the order in
//    which threads, blocks, streams or SMs deliver the contributions.
//
//    Scale (chosen on the device, no host synchronisation): a first pass finds
//    M = max |v| over the finite contributions (a max is order-independent;
//    done with integer atomicMax on the bit pattern of |v|, which orders like
//    the value for non-negative IEEE numbers). Let 2^e be the smallest power of
//    two above M (frexp), and H >= 1 a bound on how many contributions one
//    element can receive (the caller knows it from the op: windows that cover
//    an element), L = ceil(log2 H). Contributions are scaled by 2^S with
//    S = 62 - e - L and rounded to the nearest integer: each is below 2^(62-L)
//    in magnitude, so any sum of at most H of them is below 2^62 < 2^63 and
//    cannot overflow. (Scaling by a power of two is exact; the rounding is the
//    only quantisation.)
//
//    Precision against an exact (fp64) sum, per element:
//      |error| <= H * 2^(e - 63 + L) <= 2^(e - 63 + 2L)   (quantisation)
//               + one rounding of the int64 to double (2^-53 relative)
//               + one rounding to the output dtype.
//    With M < 2^e this is about 2^(2L-62) * M absolute. For fp32, fp16 and
//    bf16 outputs the fixed-point error is far below one ulp of any element
//    larger than 2^(2L-38) M (fp32), and the only rounding that matters is the
//    final one: the result is the correctly rounded exact sum up to that
//    single rounding (float atomics round at every addition, half atomics in
//    half precision). For fp64 the absolute error bound 2^(2L-62) M is below
//    the 2^-53 relative rounding of float atomics for elements larger than
//    2^(2L-9) M; much smaller elements of the same tensor keep about
//    62 - 2L - log2(M/|x|) bits. With L <= 6 (H <= 64) that is >= 50 bits for
//    elements within 2^-1 of M, >= 24 bits for elements within 2^-26 of M.
//
//    Non-finite contributions (inf, NaN) cannot be represented; they are added
//    with a float atomicAdd straight into the (zeroed) output element. A sum
//    of non-finite values with anything is NaN if the set holds a NaN or both
//    infinities, else the one infinity, whatever the order: still
//    deterministic. The finite part is added to that at conversion.
//
//    Cost: one read of the contributions for M, an int64 buffer the size of
//    the output (zeroed in the same pass), the integer atomics, one conversion
//    pass. Four launches (a tiny memset, prepare, scatter, convert) against
//    torch's two (zero fill, scatter): small calls pay the fixed cost.
// ---------------------------------------------------------------------------

// Accumulate type of the gather kernels (det_kernels17.cuh): the op's
// accumulate type, except double for float. A float sum of thousands of terms
// in one thread lost up to 2x the error of torch's atomic kernel against an
// fp64 reference; each term is still formed in float as the forward and the
// atomic kernel do, only the running sum is wider, and it is rounded to float
// once at the store.
template <typename scalar_t>
struct det_gather_acc {
  using type = at::opmath_type<scalar_t>;
};
template <>
struct det_gather_acc<float> {
  using type = double;
};
template <typename scalar_t>
using det_gather_acc_t = typename det_gather_acc<scalar_t>::type;

// Blocks for a grid-stride loop over n elements, 256 threads a block.
static inline int det_blocks(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  if (blocks < 1) {
    return 1;
  }
  return static_cast<int>(blocks < (int64_t(1) << 20) ? blocks : (int64_t(1) << 20));
}

// n / d and n % d for 32-bit unsigned n by multiply-high (exact for every n):
// q = (umulhi(n, magic) + n) >> shift, shift = ceil(log2 d),
// magic = floor(2^32 (2^shift - d) / d) + 1.
struct det_divmod_u32 {
  uint32_t d;
  uint32_t magic;
  uint32_t shift;
  det_divmod_u32() : d(1), magic(1), shift(0) {}
  explicit det_divmod_u32(uint32_t divisor) : d(divisor) {
    shift = 0;
    while ((uint64_t(1) << shift) < divisor) {
      ++shift;
    }
    magic = static_cast<uint32_t>(
        ((uint64_t(1) << 32) * ((uint64_t(1) << shift) - divisor)) / divisor + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return static_cast<uint32_t>((static_cast<uint64_t>(__umulhi(n, magic)) + n) >> shift);
  }
};

// A tensor seen as (N, C, D, H, W); missing leading spatial dims have size 1.
// order[] lists the dims from the largest stride to the smallest (ties keep
// the logical order), so that walking a linear index through it visits memory
// in order: coalesced for contiguous and channels-last tensors alike.
struct det_view5 {
  int64_t size[5];
  int64_t stride[5];
  int order[5];
};

// spatial: number of spatial dims of the op (1, 2 or 3); t has spatial + 1
// (no batch) or spatial + 2 dims.
static inline det_view5 det_make_view5(const at::TensorBase& t, int spatial) {
  det_view5 v;
  for (int i = 0; i < 5; ++i) {
    v.size[i] = 1;
    v.stride[i] = 0;
  }
  const int64_t nd = t.dim();
  const int64_t has_batch = nd == spatial + 2 ? 1 : 0;
  // channel and spatial dims, from the back
  for (int64_t k = 0; k < spatial + 1; ++k) {
    const int64_t src = nd - 1 - k;
    const int dst = 4 - static_cast<int>(k < spatial ? k : 3);
    v.size[dst] = t.size(src);
    v.stride[dst] = t.stride(src);
  }
  if (has_batch) {
    v.size[0] = t.size(0);
    v.stride[0] = t.stride(0);
  }
  // dims of size 1 get the stride of a contiguous layout so they sort harmlessly
  for (int i = 0; i < 5; ++i) {
    v.order[i] = i;
  }
  for (int i = 1; i < 5; ++i) {  // insertion sort by stride, descending, stable
    const int cur = v.order[i];
    int j = i - 1;
    while (j >= 0 && (v.size[v.order[j]] == 1 ? 0 : v.stride[v.order[j]]) <
                         (v.size[cur] == 1 ? 0 : v.stride[cur])) {
      v.order[j + 1] = v.order[j];
      --j;
    }
    v.order[j + 1] = cur;
  }
  return v;
}

// Index arithmetic over a det_view5 in its memory order.
struct det_walk5 {
  det_divmod_u32 div[5];  // by the sizes, innermost first (used when small)
  int64_t size[5];        // sizes, innermost first
  int dim[5];             // logical dim of position k, innermost first
  bool small;             // total < 2^32: use the 32-bit dividers
};

static inline det_walk5 det_make_walk5(const det_view5& v) {
  det_walk5 w;
  int64_t total = 1;
  for (int k = 0; k < 5; ++k) {
    const int d = v.order[4 - k];
    w.dim[k] = d;
    w.size[k] = v.size[d];
    total *= v.size[d];
  }
  w.small = total <= static_cast<int64_t>(std::numeric_limits<uint32_t>::max());
  for (int k = 0; k < 5; ++k) {
    w.div[k] = det_divmod_u32(static_cast<uint32_t>(w.small ? (w.size[k] > 0 ? w.size[k] : 1) : 1));
  }
  return w;
}

// linear index (memory order) -> logical (n, c, d, h, w). The digits are
// routed to their dims by selects, not by idx[w.dim[k]] = ...: an index only
// known at run time would put idx in local memory, which cost the gather
// kernels more than all their arithmetic.
__device__ __forceinline__ void det_unravel5(const det_walk5& w, int64_t linear, int64_t* idx) {
  int64_t digit[5];
  if (w.small) {
    uint32_t rest = static_cast<uint32_t>(linear);
#pragma unroll
    for (int k = 0; k < 5; ++k) {
      const uint32_t q = w.div[k].div(rest);
      digit[k] = rest - q * w.div[k].d;
      rest = q;
    }
  } else {
    int64_t rest = linear;
#pragma unroll
    for (int k = 0; k < 5; ++k) {
      digit[k] = rest % w.size[k];
      rest = rest / w.size[k];
    }
  }
#pragma unroll
  for (int d = 0; d < 5; ++d) {
    int64_t v = 0;
#pragma unroll
    for (int k = 0; k < 5; ++k) {
      v = w.dim[k] == d ? digit[k] : v;
    }
    idx[d] = v;
  }
}

// Whether every element offset of a view (and its element count) fits in
// int32: the kernels then do their index arithmetic in 32 bits (int64
// multiplies and divides dominated their cost).
static inline bool det_fits_int32(const det_view5& v) {
  int64_t span = 1, numel = 1;
  for (int i = 0; i < 5; ++i) {
    if (v.size[i] == 0) {
      return true;
    }
    span += (v.size[i] - 1) * (v.stride[i] < 0 ? -v.stride[i] : v.stride[i]);
    numel *= v.size[i];
  }
  const int64_t lim = std::numeric_limits<int32_t>::max();
  return span <= lim && numel <= lim;
}

// One past the largest element offset of a view (0 when empty): equal to the
// element count when the view is dense and non-overlapping.
static inline int64_t det_span(const det_view5& v) {
  int64_t span = 1;
  for (int i = 0; i < 5; ++i) {
    if (v.size[i] == 0) {
      return 0;
    }
    span += (v.size[i] - 1) * (v.stride[i] < 0 ? -v.stride[i] : v.stride[i]);
  }
  return span;
}

// q = n / m.d for non-negative n: by multiply-high in 32 bits, by plain
// division in 64 bits.
__device__ __forceinline__ int det_divq(int n, const det_divmod_u32& m) {
  return static_cast<int>(m.div(static_cast<uint32_t>(n)));
}
__device__ __forceinline__ int64_t det_divq(int64_t n, const det_divmod_u32& m) {
  return n / static_cast<int64_t>(m.d);
}

// Pooling cells of one axis (window extent k, stride s, padding p, out
// cells) whose window covers input position i: [*lo, *hi].
template <typename idx_t>
__device__ __forceinline__ void det_pool_cover(
    idx_t i, idx_t k, const det_divmod_u32& s, idx_t p, idx_t out, idx_t* lo, idx_t* hi) {
  const idx_t a = i + p - k + 1;
  *lo = a <= 0 ? idx_t(0) : det_divq(static_cast<idx_t>(a + static_cast<idx_t>(s.d) - 1), s);
  const idx_t b = det_divq(static_cast<idx_t>(i + p), s);
  *hi = b < out - 1 ? b : out - 1;
}

// END det_common

// BEGIN det_fixed_point
// --- the fixed-point primitive (see the top of det_common) ------------------- ------------------------------------------------
// State: one unsigned long long holding the bit pattern of M (as a double).
// Zero it (det_fixed_point_begin), run det_fixed_point_prepare_kernel over the
// contributions, then det_fixed_point_add / det_fixed_point_finish.

__device__ __forceinline__ unsigned long long det_abs_bits(float v) {
  const double a = ::fabs(static_cast<double>(v));
  return static_cast<unsigned long long>(__double_as_longlong(a));
}
__device__ __forceinline__ unsigned long long det_abs_bits(double v) {
  return static_cast<unsigned long long>(__double_as_longlong(::fabs(v)));
}

// The shift S for a given state word and L = ceil(log2 H).
__device__ __forceinline__ int det_fixed_point_shift(unsigned long long max_bits, int log2_hits) {
  const double m = __longlong_as_double(static_cast<long long>(max_bits));
  if (!(m > 0.0)) {
    return 0;  // all contributions are zero
  }
  int e = 0;
  ::frexp(m, &e);  // m < 2^e
  return 62 - e - log2_hits;
}

// contribution -> fixed point (finite v only)
__device__ __forceinline__ long long det_fixed_point_from(double v, int shift) {
  return ::llrint(::ldexp(v, shift));
}

__device__ __forceinline__ double det_fixed_point_to(long long q, int shift) {
  return ::ldexp(static_cast<double>(q), -shift);
}

// Adds v to element *acc; a non-finite v goes into *special (an element of the
// zeroed output) with torch's gpuAtomicAdd (ATen/cuda/Atomic.cuh).
template <typename scalar_t, typename opmath_t>
__device__ __forceinline__ void det_fixed_point_add(
    unsigned long long* acc, scalar_t* special, opmath_t v, int shift) {
  if (::isfinite(static_cast<double>(v))) {
    const long long q = det_fixed_point_from(static_cast<double>(v), shift);
    if (q != 0) {
      atomicAdd(acc, static_cast<unsigned long long>(q));  // two's complement wraps exactly
    }
  } else {
    gpuAtomicAdd(special, static_cast<scalar_t>(v));  // inf/NaN: order-independent, see above
  }
}

// Zeroes acc[0, n_acc) and out[0, n_out) and raises *state to max |v| over
// the finite values v[0, n_values) (given as scalar_t, widened to opmath_t).
template <typename scalar_t, typename opmath_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void det_fixed_point_prepare_kernel(
    const scalar_t* __restrict__ values, const int64_t n_values,
    unsigned long long* __restrict__ acc, const int64_t n_acc,
    scalar_t* __restrict__ out, const int64_t n_out,
    unsigned long long* __restrict__ state) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long local = 0;
  for (int64_t i = first; i < n_values; i += stride) {
    const opmath_t v = static_cast<opmath_t>(values[i]);
    if (::isfinite(static_cast<double>(v))) {
      const unsigned long long b = det_abs_bits(v);
      local = b > local ? b : local;
    }
  }
  for (int64_t i = first; i < n_acc; i += stride) {
    acc[i] = 0ull;
  }
  for (int64_t i = first; i < n_out; i += stride) {
    out[i] = static_cast<scalar_t>(0);
  }
  // warp maximum, then one atomic per warp
  for (int offset = 16; offset > 0; offset /= 2) {
    const unsigned long long other = __shfl_down_sync(0xffffffffu, local, offset);
    local = other > local ? other : local;
  }
  if ((threadIdx.x & 31) == 0 && local != 0ull) {
    atomicMax(state, local);
  }
}

// out[i] += acc[i] / 2^S (out already holds 0 or the non-finite part)
template <typename scalar_t, typename opmath_t>
C10_LAUNCH_BOUNDS_1(256)
__global__ void det_fixed_point_finish_kernel(
    const unsigned long long* __restrict__ acc, scalar_t* __restrict__ out,
    const int64_t n, const unsigned long long* __restrict__ state, const int log2_hits) {
  const int shift = det_fixed_point_shift(*state, log2_hits);
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double v = det_fixed_point_to(static_cast<long long>(acc[i]), shift);
    out[i] = static_cast<scalar_t>(static_cast<opmath_t>(out[i]) + static_cast<opmath_t>(v));
  }
}

static inline int det_ceil_log2(int64_t h) {
  int l = 0;
  while (l < 62 && (int64_t(1) << l) < h) {
    ++l;
  }
  return l;
}
// END det_fixed_point
