// Shared device helpers of the CUDA op set: element types, 16-byte packs, conversions,
// warp/block reductions, the dtype dispatch and the launch helpers. Included by the
// kernel files of kernels/cuda/ only (nvcc).
//
// Indexing rule (audited for issue 10): an index into a whole activation is int64_t —
// at a million tokens B·T·4C, B·T·3C and B·T·C pass 2^31 — computed as
// int64_t(blockIdx.x) * blockDim.x + threadIdx.x or row * C with an int64_t row. int is
// kept only for what is bounded by one row or one sequence (a column, a position t < T,
// a head). tests/cuda/test_cuda_int64.cu runs every op family just past 2^31 elements.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cmath>
#include <cstdint>
#include "src/cuda/cuda_check.h"
#include "src/tensor.h"

namespace flashgpt::cuda {

using bf16 = __nv_bfloat16;

constexpr int kWarpSize = 32;
constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = exp2(x·log2 e)
constexpr int kPackBytes = 16;  // one 128-bit load/store: 8 bf16 or 4 fp32

// 16 bytes of T, loaded and stored with one instruction (LDG.128 / STG.128).
template <class T>
struct alignas(kPackBytes) Pack {
  static constexpr int N = kPackBytes / int(sizeof(T));
  T v[N];
};

template <class T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T>*>(p);
}
// Streaming load (evict-first): for data read exactly once.
template <class T>
__device__ __forceinline__ Pack<T> load_pack_cs(const T* p) {
  Pack<T> r;
  *reinterpret_cast<int4*>(&r) = __ldcs(reinterpret_cast<const int4*>(p));
  return r;
}
template <class T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& x) {
  *reinterpret_cast<Pack<T>*>(p) = x;
}

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = kWarpSize / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int o = kWarpSize / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
// Sum over the block, result broadcast to every thread. Fixed order: deterministic.
// Uses 32 floats of shared memory; blockDim.x a multiple of 32, at most 1024.
__device__ __forceinline__ float block_sum(float x) {
  __shared__ float partial[kWarpSize];
  int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  int nwarps = blockDim.x / kWarpSize;
  x = warp_sum(x);
  __syncthreads();  // `partial` may still be read by a previous call
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  x = lane < nwarps ? partial[lane] : 0.f;
  return warp_sum(x);
}

// 32-bit integer hash (a mix of multiply/xor-shift rounds), used for stochastic rounding.
__device__ __forceinline__ uint32_t hash_u32(uint32_t x) {
  x ^= x >> 16; x *= 0x7feb352du;
  x ^= x >> 15; x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// fp32 → bf16 rounded stochastically: add 16 random bits below the kept mantissa and
// truncate, so E[result] = x. Keeps small AdamW updates from being rounded away.
__device__ __forceinline__ bf16 bf16_stochastic(float x, uint32_t seed, uint32_t index) {
  uint32_t r = hash_u32(index * 0x9e3779b9u ^ hash_u32(seed)) & 0xffffu;
  uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(x);  // inf/nan as is
  bits = (bits + r) & 0xffff0000u;
  return __ushort_as_bfloat16(static_cast<unsigned short>(bits >> 16));
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) % kPackBytes) == 0; }
__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace flashgpt::cuda

// Runs `...` with `T` bound to the C++ type of a floating activation dtype (fp32 or bf16).
#define FG_DISPATCH_FLOAT(dtype, T, ...)                                                   \
  do {                                                                                     \
    switch (dtype) {                                                                       \
      case ::flashgpt::DType::f32: { using T = float; __VA_ARGS__; break; }                \
      case ::flashgpt::DType::bf16: { using T = ::flashgpt::cuda::bf16; __VA_ARGS__; break; } \
      default: ::flashgpt::fail(__FILE__, ":", __LINE__, ": CUDA ops take fp32 or bf16, got ", \
                                ::flashgpt::dtype_name(dtype));                            \
    }                                                                                      \
  } while (0)
