// Stand-ins for the few torch 1.4 names that the code cut from DilatedMaxPool2d.cu
// uses and that a current torch no longer has (THC is gone, ATenCeilDiv, lastPow2
// and safe_downcast moved). Pasted by run.py *inside* the namespace that holds
// each extracted copy, so these names win over any global ones. No #include here.
// Each one behaves like its 1.4 original.

template <typename T>
struct THCNumerics {
  static __host__ __device__ inline bool isnan(T v) { return at::_isnan(v); }
};

template <typename In, typename Out>
struct ScalarConvert {
  static __host__ __device__ inline Out to(const In v) { return static_cast<Out>(v); }
};

template <typename Out, typename In>
__host__ __device__ inline Out scalar_cast(In v) { return static_cast<Out>(v); }

namespace cuda {
// 1.4: aten/src/ATen/cuda/CUDAApplyUtils.cuh, one type for both arguments.
template <typename T>
__host__ __device__ inline T ATenCeilDiv(T a, T b) { return (a + b - 1) / b; }
}  // namespace cuda

// 1.4: aten/src/ATen/native/cuda/LaunchUtils.h, largest power of two <= n (n >= 1).
static inline int lastPow2(unsigned int n) {
  n |= (n >> 1);
  n |= (n >> 2);
  n |= (n >> 4);
  n |= (n >> 8);
  n |= (n >> 16);
  return std::max<int>(1, n - (n >> 1));
}

// 1.4: aten/src/ATen/native/Pool.h
template <typename dest_t, typename src_t>
static inline dest_t safe_downcast(src_t v) {
  TORCH_CHECK(std::numeric_limits<dest_t>::min() <= v && v <= std::numeric_limits<dest_t>::max(),
              "integer out of range");
  return static_cast<dest_t>(v);
}
