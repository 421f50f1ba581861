// Deterministic CUDA kernels for issue 18 (third part): scatter_reduce (every
// mode, "prod" above all), scatter with reduce="add"/"multiply", and
// index_reduce (prod, mean, amax, amin).
//
// Single source, like det_kernels_reductions.cuh: the H200 harness
// (det_ext_scatter.cu) compiles it against torch 2.11; make_patches_scatter.py
// copies the marked section verbatim into torch 1.13.1's ScatterGatherKernel.cu
// and Indexing.cu. The includer provides, before this text, a stable radix sort
//   void det_gr_sort_pairs(const int64_t* keys_in, int64_t* keys_out,
//                          const int64_t* values_in, int64_t* values_out,
//                          int64_t n, int end_bit);
// (cub in the harness, at::cuda::cub::radix_sort_pairs in the patch) and
// at::Tensor (ATen/core/Tensor.h). Only Tensor methods are used on the host
// (contiguous, as_strided, copy_, reshape), no operator functions, so the text
// also compiles in files built with TORCH_ASSERT_ONLY_METHOD_OPERATORS.
// C++14, CUDA 11.2.
//
// Why the result is bitwise the same on every run, and equal to the CPU's:
// a product (or a float sum) has no order-independent integer form, so instead
// of atomics every target element is computed by one thread that applies its
// contributions in a fixed order: the order in which the CPU kernel applies
// them. Contributions are gathered by target with a stable sort of
// (target, source position) pairs, so the contributors of one target are
// contiguous and in ascending source position:
// * scatter along dim: the contributors of one target share every coordinate
//   but dim (the index position's other coordinates), and the CPU loops the dim
//   coordinate upwards; the row-major number of the index position is
//   ascending in it.
// * index_reduce: contributor i of row index[i], ascending i, as the CPU's loop.
// Each run is reduced sequentially from the start value (self when
// include_self, else the identity) and stored once. Rounding: per step in the
// tensor's dtype (torch 1.13.1's CPU kernels, and index_reduce in every torch),
// or, with `opmath`, in at::opmath_type (float for half/bfloat16), rounded once
// at the store (the CPU scatter kernels of torch >= 2.1 accumulate half and
// bfloat16 in a float buffer). mean divides by the count as the CPU does: the
// count includes self when include_self, is kept in the same type as the sum,
// a zero count becomes one, integer types divide with floor rounding.

// BEGIN det_gather_reduce
constexpr int kDetGrSum = 0, kDetGrProd = 1, kDetGrMean = 2, kDetGrMax = 3, kDetGrMin = 4;
constexpr int kDetGrThreads = 256;
constexpr int kDetGrMaxDims = 25;

struct DetGrShape {
  int64_t size[kDetGrMaxDims];         // the index tensor's sizes
  int64_t self_stride[kDetGrMaxDims];  // contiguous strides of self
  int ndim;
  int dim;
};

template <typename T>
__device__ __forceinline__ bool det_gr_isnan(T v) {
  return v != v;  // false for integers; half/bfloat16 compare as float
}

// floor division as at::div_floor_integer (the CPU's div_(count, "floor")), b != 0
template <typename T>
__device__ __forceinline__ T det_gr_div(T a, T b, std::true_type /*integral*/) {
  const T q = static_cast<T>(a / b);
  const T r = static_cast<T>(a % b);
  if (r != 0 && ((r < 0) != (b < 0))) {
    return static_cast<T>(q - 1);
  }
  return q;
}

template <typename T>
__device__ __forceinline__ T det_gr_div(T a, T b, std::false_type /*floating*/) {
  return static_cast<T>(a / b);
}

template <int kOp, typename acc_t>
__device__ __forceinline__ acc_t det_gr_apply(acc_t acc, acc_t v) {
  if (kOp == kDetGrProd) {
    return static_cast<acc_t>(acc * v);
  } else if (kOp == kDetGrMax) {
    // the CPU's rule: a NaN contribution wins, else std::max (NaN in acc stays)
    return det_gr_isnan(v) ? v : ((acc < v) ? v : acc);
  } else if (kOp == kDetGrMin) {
    return det_gr_isnan(v) ? v : ((v < acc) ? v : acc);
  } else {  // sum, mean
    return static_cast<acc_t>(acc + v);
  }
}

// keys: scatter: the row-major linear index, in self, of each index element's
// target; values: the element's row-major number (its source position).
__global__ void det_gr_scatter_keys_kernel(const int64_t* __restrict__ index, const int64_t n,
                                           const DetGrShape shape, const int64_t self_dim_size,
                                           int64_t* __restrict__ keys, int64_t* __restrict__ positions) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n; p += stride) {
    int64_t rem = p;
    int64_t key = 0;
    for (int k = shape.ndim - 1; k >= 0; --k) {
      int64_t c = rem % shape.size[k];
      rem /= shape.size[k];
      if (k == shape.dim) {
        c = index[p];
        CUDA_KERNEL_ASSERT(c >= 0 && c < self_dim_size && "scatter: index out of bounds");
      }
      key += c * shape.self_stride[k];
    }
    keys[p] = key;
    positions[p] = p;
  }
}

// keys: index_reduce: the row of self each source row i goes to.
template <typename index_t>
__global__ void det_gr_index_keys_kernel(const index_t* __restrict__ index, const int64_t n,
                                         const int64_t self_dim_size, int64_t* __restrict__ keys,
                                         int64_t* __restrict__ positions) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t j = static_cast<int64_t>(index[i]);
    CUDA_KERNEL_ASSERT(j >= 0 && j < self_dim_size && "index_reduce: index out of range in self");
    keys[i] = j;
    positions[i] = i;
  }
}

// run bounds per target, for the by-target launch: each run's first and last
// sorted position write them (one writer per element).
__global__ void det_gr_bounds_kernel(const int64_t* __restrict__ keys, const int64_t n,
                                     int* __restrict__ start, int* __restrict__ end) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < n; q += stride) {
    const int64_t key = keys[q];
    if (q == 0 || keys[q - 1] != key) {
      start[key] = static_cast<int>(q);
    }
    if (q == n - 1 || keys[q + 1] != key) {
      end[key] = static_cast<int>(q + 1);
    }
  }
}

// One thread per (run, slice element). Element e of a slice is (o, in) with
// o = e / inner; the target is self[(o * d_self + key) * inner + in], the
// contribution of source row p is src[(o * d_src + p) * inner + in]. scatter:
// one slice of one element, key and p the linear target and position.
// by_target: rows are the targets (start/end from det_gr_bounds_kernel, start
// -1 when untouched); else rows are the sorted positions and only each run's
// first position works (used when there are fewer contributions than targets).
template <typename scalar_t, typename acc_t, int kOp>
C10_LAUNCH_BOUNDS_1(kDetGrThreads)
__global__ void det_gr_reduce_kernel(
    scalar_t* __restrict__ self, const scalar_t* __restrict__ src, const int64_t* __restrict__ keys,
    const int64_t* __restrict__ perm, const int* __restrict__ start, const int* __restrict__ end,
    const int64_t n, const int64_t rows, const bool by_target, const int64_t slice, const int64_t inner,
    const int64_t d_self, const int64_t d_src, const bool include_self, const scalar_t identity,
    const bool divide) {
  const int64_t total = rows * slice;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += stride) {
    const int64_t r = t / slice;
    const int64_t e = t - r * slice;
    int64_t q0, q1, key;
    if (by_target) {
      q0 = start[r];
      if (q0 < 0) {
        continue;
      }
      q1 = end[r];
      key = r;
    } else {
      q0 = r;
      key = keys[q0];
      if (q0 > 0 && keys[q0 - 1] == key) {
        continue;
      }
      q1 = q0 + 1;
      while (q1 < n && keys[q1] == key) {
        ++q1;
      }
    }
    const int64_t o = e / inner;
    const int64_t in = e - o * inner;
    const int64_t self_off = (o * d_self + key) * inner + in;
    const scalar_t* src_base = src + o * d_src * inner + in;
    acc_t acc = static_cast<acc_t>(include_self ? self[self_off] : identity);
    acc_t count = static_cast<acc_t>(include_self ? 1 : 0);
#pragma unroll 4
    for (int64_t q = q0; q < q1; ++q) {
      const acc_t v = static_cast<acc_t>(src_base[perm[q] * inner]);
      acc = det_gr_apply<kOp, acc_t>(acc, v);
      if (kOp == kDetGrMean) {
        count = static_cast<acc_t>(count + static_cast<acc_t>(1));
      }
    }
    scalar_t out = static_cast<scalar_t>(acc);
    if (kOp == kDetGrMean && divide) {
      scalar_t c = static_cast<scalar_t>(count);
      if (c == static_cast<scalar_t>(0)) {
        c = static_cast<scalar_t>(1);
      }
      out = det_gr_div<scalar_t>(out, c, std::integral_constant<bool, std::is_integral<scalar_t>::value>());
    }
    self[self_off] = out;
  }
}

static inline int det_gr_grid(int64_t work) {
  const int64_t blocks = (work + kDetGrThreads - 1) / kDetGrThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535LL * 8)));
}

static inline int det_gr_bits(int64_t max_key) {
  int bits = 1;
  while (bits < 63 && (max_key >> bits) != 0) {
    ++bits;
  }
  return bits;
}

template <typename scalar_t>
static scalar_t det_gr_identity(int op) {
  if (op == kDetGrProd) {
    return static_cast<scalar_t>(1);
  }
  if (op == kDetGrMax) {
    return std::numeric_limits<scalar_t>::has_infinity ? -std::numeric_limits<scalar_t>::infinity()
                                                       : std::numeric_limits<scalar_t>::lowest();
  }
  if (op == kDetGrMin) {
    return std::numeric_limits<scalar_t>::has_infinity ? std::numeric_limits<scalar_t>::infinity()
                                                       : std::numeric_limits<scalar_t>::max();
  }
  return static_cast<scalar_t>(0);
}

template <typename scalar_t, typename acc_t>
static void det_gr_launch_reduce(int op, scalar_t* self, const scalar_t* src, const int64_t* keys,
                                 const int64_t* perm, const int* start, const int* end, int64_t n, int64_t rows,
                                 bool by_target, int64_t slice, int64_t inner, int64_t d_self, int64_t d_src,
                                 bool include_self, bool divide) {
  const scalar_t identity = det_gr_identity<scalar_t>(op);
  const int grid = det_gr_grid(rows * slice);
  auto stream = at::cuda::getCurrentCUDAStream();
#define DET_GR_LAUNCH(OP)                                                                             \
  det_gr_reduce_kernel<scalar_t, acc_t, OP><<<grid, kDetGrThreads, 0, stream>>>(                      \
      self, src, keys, perm, start, end, n, rows, by_target, slice, inner, d_self, d_src, include_self, \
      identity, divide)
  switch (op) {
    case kDetGrProd: DET_GR_LAUNCH(kDetGrProd); break;
    case kDetGrMean: DET_GR_LAUNCH(kDetGrMean); break;
    case kDetGrMax: DET_GR_LAUNCH(kDetGrMax); break;
    case kDetGrMin: DET_GR_LAUNCH(kDetGrMin); break;
    default: DET_GR_LAUNCH(kDetGrSum); break;
  }
#undef DET_GR_LAUNCH
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Sorts the n (key, position) pairs in scratch[0, 2n) into scratch[2n, 4n), and
// reduces each run into self_c (contiguous). num_targets: the number of possible
// keys. slice/inner/d_self/d_src as in det_gr_reduce_kernel.
static void det_gr_sort_and_reduce(const at::Tensor& self_c, const at::Tensor& src_c, int64_t* scratch,
                                   int64_t n, int64_t num_targets, int64_t slice, int64_t inner,
                                   int64_t d_self, int64_t d_src, int op, bool include_self, bool opmath,
                                   bool divide) {
  int64_t* keys_in = scratch;
  int64_t* pos_in = scratch + n;
  int64_t* keys = scratch + 2 * n;
  int64_t* perm = scratch + 3 * n;
  det_gr_sort_pairs(keys_in, keys, pos_in, perm, n, det_gr_bits(num_targets - 1));
  auto stream = at::cuda::getCurrentCUDAStream();
  // rows of work: the targets when there are at most as many as contributions
  // (each thread then has a run; no thread scans), else the sorted positions
  const bool by_target = num_targets <= n;
  c10::DataPtr bounds;
  int* start = nullptr;
  int* end = nullptr;
  if (by_target) {
    bounds = c10::cuda::CUDACachingAllocator::get()->allocate(2 * num_targets * sizeof(int));
    start = static_cast<int*>(bounds.get());
    end = start + num_targets;
    C10_CUDA_CHECK(cudaMemsetAsync(start, 0xff, num_targets * sizeof(int), stream));
    det_gr_bounds_kernel<<<det_gr_grid(n), kDetGrThreads, 0, stream>>>(keys, n, start, end);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const int64_t rows = by_target ? num_targets : n;
  AT_DISPATCH_ALL_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, self_c.scalar_type(),
                             "det_gather_reduce", [&] {
    scalar_t* self_p = self_c.data_ptr<scalar_t>();
    const scalar_t* src_p = src_c.data_ptr<scalar_t>();
    if (opmath) {
      det_gr_launch_reduce<scalar_t, at::opmath_type<scalar_t>>(
          op, self_p, src_p, keys, perm, start, end, n, rows, by_target, slice, inner, d_self, d_src,
          include_self, divide);
    } else {
      det_gr_launch_reduce<scalar_t, scalar_t>(
          op, self_p, src_p, keys, perm, start, end, n, rows, by_target, slice, inner, d_self, d_src,
          include_self, divide);
    }
  });
}

// self.scatter_reduce_(dim, index, src, op, include_self) in place, any strides.
// index: int64, index.size(d) <= src.size(d) for every d, <= self.size(d) for
// d != dim (the caller's shape checks). op: kDetGr*; divide: mean divides here
// (false: the caller divides, as torch 1.13.1's scatter_reduce_two does after
// its stub). opmath: see the header comment.
static void scatter_reduce_deterministic(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                                         const at::Tensor& src, int op, bool include_self, bool opmath,
                                         bool divide) {
  const int64_t n = index.numel();
  if (n == 0) {
    return;
  }
  TORCH_CHECK(n <= std::numeric_limits<int>::max(), "scatter_reduce (deterministic): more than INT_MAX indices");
  TORCH_CHECK(index.dim() <= kDetGrMaxDims, "scatter_reduce (deterministic): too many dims");
  const bool zero_dim = self.dim() == 0;
  const at::Tensor self_v = zero_dim ? self.reshape({1}) : self;
  const at::Tensor index_v = index.dim() == 0 ? index.reshape({1}) : index;
  const at::Tensor src_v = src.dim() == 0 ? src.reshape({1}) : src;
  const at::Tensor self_c = self_v.is_contiguous() ? self_v : self_v.contiguous();
  const at::Tensor index_c = index_v.contiguous();
  // the src elements the index positions read, in index order
  const at::Tensor src_c = src_v.as_strided(index_v.sizes(), src_v.strides(), src_v.storage_offset()).contiguous();
  DetGrShape shape;
  shape.ndim = static_cast<int>(index_v.dim());
  shape.dim = static_cast<int>(zero_dim ? 0 : dim);
  int64_t st = 1;
  for (int k = shape.ndim - 1; k >= 0; --k) {
    shape.size[k] = index_v.size(k);
    shape.self_stride[k] = st;
    st *= self_v.size(k);
  }
  c10::DataPtr scratch_owner = c10::cuda::CUDACachingAllocator::get()->allocate(4 * n * sizeof(int64_t));
  int64_t* scratch = static_cast<int64_t*>(scratch_owner.get());
  auto stream = at::cuda::getCurrentCUDAStream();
  det_gr_scatter_keys_kernel<<<det_gr_grid(n), kDetGrThreads, 0, stream>>>(
      index_c.data_ptr<int64_t>(), n, shape, self_v.size(shape.dim), scratch, scratch + n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  det_gr_sort_and_reduce(self_c, src_c, scratch, n, self_c.numel(), /*slice=*/1, /*inner=*/1,
                         /*d_self=*/self_c.numel(), /*d_src=*/n, op, include_self, opmath, divide);
  if (!self_c.is_same(self_v)) {
    self_v.copy_(self_c);
  }
}

// self.index_reduce_(dim, index, source, op, include_self) in place, any strides.
// index: 1-D (or 0-d) int32/int64; source: self's shape with index.numel() at dim.
// Per-step rounding in the dtype (the CPU's index_reduce); mean divides here.
static void index_reduce_deterministic(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                                       const at::Tensor& source, int op, bool include_self) {
  const int64_t n = index.numel();
  if (n == 0) {
    return;
  }
  TORCH_CHECK(n <= std::numeric_limits<int>::max(), "index_reduce (deterministic): more than INT_MAX indices");
  const at::Tensor self_v = self.dim() == 0 ? self.reshape({1}) : self;
  const at::Tensor source_v = source.dim() == 0 ? source.reshape({1}) : source;
  const int64_t d = self.dim() == 0 ? 0 : dim;
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < d; ++k) {
    outer *= self_v.size(k);
  }
  for (int64_t k = d + 1; k < self_v.dim(); ++k) {
    inner *= self_v.size(k);
  }
  const int64_t slice = outer * inner;
  if (slice == 0) {
    return;
  }
  const at::Tensor self_c = self_v.is_contiguous() ? self_v : self_v.contiguous();
  const at::Tensor source_c = source_v.contiguous();
  const at::Tensor index_c = index.reshape({n}).contiguous();
  const int64_t d_self = self_v.size(d);
  c10::DataPtr scratch_owner = c10::cuda::CUDACachingAllocator::get()->allocate(4 * n * sizeof(int64_t));
  int64_t* scratch = static_cast<int64_t*>(scratch_owner.get());
  auto stream = at::cuda::getCurrentCUDAStream();
  if (index_c.scalar_type() == at::ScalarType::Int) {
    det_gr_index_keys_kernel<int><<<det_gr_grid(n), kDetGrThreads, 0, stream>>>(
        index_c.data_ptr<int>(), n, d_self, scratch, scratch + n);
  } else {
    det_gr_index_keys_kernel<int64_t><<<det_gr_grid(n), kDetGrThreads, 0, stream>>>(
        index_c.data_ptr<int64_t>(), n, d_self, scratch, scratch + n);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  det_gr_sort_and_reduce(self_c, source_c, scratch, n, d_self, slice, inner, d_self, /*d_src=*/n, op,
                         include_self, /*opmath=*/false, /*divide=*/true);
  if (!self_c.is_same(self_v)) {
    self_v.copy_(self_c);
  }
}
// END det_gather_reduce
