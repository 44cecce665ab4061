// GELU, tanh approximation (GPT-2's):
//   gelu(x)  = 0.5·x·(1 + tanh(u)),  u = √(2/π)·(x + 0.044715·x³)
//   gelu'(x) = 0.5·(1 + tanh u) + 0.5·x·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·x²)
// Elementwise over x128 packs (a scalar tail when n is not a multiple of the pack).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace flashgpt::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
constexpr int kThreads = 256;

__device__ __forceinline__ float gelu(float x) {
  float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.f + tanhf(u));
}
__device__ __forceinline__ float gelu_grad(float x) {
  float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  float th = tanhf(u);
  return 0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * kSqrt2OverPi * (1.f + 3.f * kGeluCubic * x * x);
}

// ---------------------------------------------------------------- kernels

// Thread i owns elements [i·P, i·P + P) ∩ [0, n).
template <class T>
__global__ void gelu_forward_kernel(T* __restrict__ out, const T* __restrict__ inp, int64_t n) {
  constexpr int P = Pack<T>::N;
  int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * P;
  if (i + P <= n) {
    Pack<T> x = load_pack_cs(inp + i), y;
#pragma unroll
    for (int k = 0; k < P; ++k) y.v[k] = from_f<T>(gelu(to_f(x.v[k])));
    store_pack(out + i, y);
  } else {
    for (int64_t j = i; j < n; ++j) out[j] = from_f<T>(gelu(to_f(inp[j])));
  }
}

// dinp may alias dout: each element is read before it is written, by the same thread.
template <class T>
__global__ void gelu_backward_kernel(T* dinp, const T* __restrict__ inp, const T* dout, int64_t n) {
  constexpr int P = Pack<T>::N;
  int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * P;
  if (i + P <= n) {
    Pack<T> x = load_pack_cs(inp + i), d = load_pack(dout + i), r;
#pragma unroll
    for (int k = 0; k < P; ++k) r.v[k] = from_f<T>(to_f(d.v[k]) * gelu_grad(to_f(x.v[k])));
    store_pack(dinp + i, r);
  } else {
    for (int64_t j = i; j < n; ++j) dinp[j] = from_f<T>(to_f(dout[j]) * gelu_grad(to_f(inp[j])));
  }
}

}  // namespace

// ---------------------------------------------------------------- launchers

void gelu_forward(Tensor out, Tensor inp, cudaStream_t stream) {
  FG_ASSERT(out.numel() == inp.numel() && out.dtype == inp.dtype, "gelu shapes/dtypes");
  FG_ASSERT(aligned16(out.data) && aligned16(inp.data), "gelu needs 16-byte aligned tensors");
  int64_t n = inp.numel();
  if (n == 0) return;
  FG_DISPATCH_FLOAT(inp.dtype, T, {
    gelu_forward_kernel<T><<<unsigned(ceil_div(ceil_div(n, Pack<T>::N), kThreads)), kThreads, 0,
                             stream>>>(out.as<T>(), inp.as<T>(), n);
    CUDA_CHECK_LAUNCH();
  });
}

void gelu_backward(Tensor dinp, Tensor inp, Tensor dout, cudaStream_t stream) {
  FG_ASSERT(dinp.numel() == inp.numel() && dout.numel() == inp.numel(), "gelu backward shapes");
  FG_ASSERT(dinp.dtype == inp.dtype && dout.dtype == inp.dtype, "gelu backward dtypes");
  FG_ASSERT(aligned16(dinp.data) && aligned16(inp.data) && aligned16(dout.data),
            "gelu needs 16-byte aligned tensors");
  int64_t n = inp.numel();
  if (n == 0) return;
  FG_DISPATCH_FLOAT(inp.dtype, T, {
    gelu_backward_kernel<T><<<unsigned(ceil_div(ceil_div(n, Pack<T>::N), kThreads)), kThreads, 0,
                              stream>>>(dinp.as<T>(), inp.as<T>(), dout.as<T>(), n);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace flashgpt::cuda
