// Elementwise utilities: dtype casts (fp32 ↔ bf16, fp64 → either) and in-place scaling.
// x128 packs when both sides are 16-byte aligned and have the same element size
// per pack; a plain grid-stride loop otherwise (casts are rare: setup and tests).
#include <algorithm>
#include <type_traits>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace flashgpt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;

__device__ __forceinline__ float to_f(double x) { return float(x); }

// ---------------------------------------------------------------- kernels

template <class D, class S>
__global__ void cast_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<D, double>)
      dst[i] = double(::flashgpt::cuda::to_f(src[i]));
    else
      dst[i] = from_f<D>(::flashgpt::cuda::to_f(src[i]));
  }
}

template <class T>
__global__ void scale_kernel(T* x, float s, int64_t n) {
  constexpr int P = Pack<T>::N;
  int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * P;
  if (i + P <= n) {
    Pack<T> p = load_pack(x + i);
#pragma unroll
    for (int k = 0; k < P; ++k) p.v[k] = from_f<T>(to_f(p.v[k]) * s);
    store_pack(x + i, p);
  } else {
    for (int64_t j = i; j < n; ++j) x[j] = from_f<T>(to_f(x[j]) * s);
  }
}

template <class T>
__global__ void scale_scalar_kernel(T* x, float s, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_f<T>(to_f(x[i]) * s);
}

template <class D>
void launch_cast(D* dst, Tensor src, int64_t n, cudaStream_t stream) {
  unsigned blocks = unsigned(std::min<int64_t>(ceil_div(n, kThreads), kMaxBlocks));
  switch (src.dtype) {
    case DType::f32: cast_kernel<D, float><<<blocks, kThreads, 0, stream>>>(dst, src.as<float>(), n); break;
    case DType::bf16: cast_kernel<D, bf16><<<blocks, kThreads, 0, stream>>>(dst, src.as<bf16>(), n); break;
    case DType::f64: cast_kernel<D, double><<<blocks, kThreads, 0, stream>>>(dst, src.as<double>(), n); break;
    default: fail("cast: unsupported source dtype ", dtype_name(src.dtype));
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

// ---------------------------------------------------------------- launchers

void cast(Tensor dst, Tensor src, cudaStream_t stream) {
  FG_ASSERT(dst.numel() == src.numel(), "cast changes the element count");
  int64_t n = src.numel();
  if (n == 0) return;
  if (dst.dtype == src.dtype) {
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  switch (dst.dtype) {
    case DType::f32: launch_cast(dst.as<float>(), src, n, stream); break;
    case DType::bf16: launch_cast(dst.as<bf16>(), src, n, stream); break;
    case DType::f64: launch_cast(dst.as<double>(), src, n, stream); break;
    default: fail("cast: unsupported destination dtype ", dtype_name(dst.dtype));
  }
}

void scale(Tensor x, float s, cudaStream_t stream) {
  int64_t n = x.numel();
  if (n == 0) return;
  FG_DISPATCH_FLOAT(x.dtype, T, {
    if (aligned16(x.data)) {
      scale_kernel<T><<<unsigned(ceil_div(ceil_div(n, Pack<T>::N), kThreads)), kThreads, 0,
                        stream>>>(x.as<T>(), s, n);
    } else {
      unsigned blocks = unsigned(std::min<int64_t>(ceil_div(n, kThreads), kMaxBlocks));
      scale_scalar_kernel<T><<<blocks, kThreads, 0, stream>>>(x.as<T>(), s, n);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace flashgpt::cuda
