// Fused softmax + cross-entropy over a padded vocabulary, one thread block per row:
//   pass 1 (read):  online max m and rescaled sum s = Σ exp(x − m) over columns < V
//                   (each thread keeps its own (m, s); the block merges them), so
//                   lse = m + log s after one read of the row;
//   loss[n] = lse − x[target]
//   pass 2 (write, only when dloss ≠ 0): x ← dloss·(exp(x − lse) − [j = target]),
//                   0 in the padding columns ≥ V. Probabilities are never stored.
// A target < 0 means "ignore": loss 0 and the whole row's gradient 0.
// Two kernels with the same arithmetic (one row function, so the same bits): when two
// rows fit in one SM's shared memory (bf16 at the GPT-2 vocabulary: 98 KiB a row), pass 1
// also keeps the row in shared memory and pass 2 reads it from there, so the logits are
// read from DRAM once instead of twice; otherwise (fp32 at 50K, any larger vocabulary)
// pass 2 reads the row again. Pass 1 keeps four 16-byte loads in flight per thread.
#include <cfloat>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace flashgpt::cuda {
namespace {

constexpr int kThreads = 512;

struct MaxSum {
  float m, s;
};

// Merge two (max, Σexp(x − max)) pairs; an empty side has m = −inf and s = 0
// (avoid −inf − (−inf), which is NaN).
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ void add(MaxSum& a, float x) {
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.f;
    a.m = x;
  } else {
    a.s += expf(x - a.m);
  }
}

// ---------------------------------------------------------------- kernels

constexpr int kLoadsInFlight = 4;

// The whole row, as one template for both kernels: kRowInSmem keeps the row's packs in
// `row_copy` (dynamic shared memory, Vp/P packs) during pass 1 and reads them back in pass 2.
template <class T, bool kRowInSmem>
__device__ __forceinline__ void softmax_cross_entropy_row(float* __restrict__ losses,
                                                          T* __restrict__ logits,
                                                          const int* __restrict__ targets, int V,
                                                          int Vp, float dloss,
                                                          Pack<T>* __restrict__ row_copy) {
  constexpr int P = Pack<T>::N;
  __shared__ MaxSum warp_parts[kThreads / kWarpSize];
  __shared__ float shared_lse;
  const int64_t row = blockIdx.x;
  T* x = logits + row * Vp;
  const int target = targets[row];
  const int packs = Vp / P;
  // Read the target logit before pass 2 overwrites the row (the block reduction below
  // synchronises the block in between).
  const float x_target = target >= 0 ? to_f(x[target]) : 0.f;

  MaxSum ms{-INFINITY, 0.f};
  for (int c0 = threadIdx.x; c0 < packs; c0 += kLoadsInFlight * kThreads) {
    Pack<T> p[kLoadsInFlight];
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int c = c0 + u * kThreads;
      if (c < packs) p[u] = load_pack(x + int64_t(c) * P);
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int c = c0 + u * kThreads;
      if (c >= packs) break;
      if constexpr (kRowInSmem) row_copy[c] = p[u];
#pragma unroll
      for (int k = 0; k < P; ++k)
        if (c * P + k < V) add(ms, to_f(p[u].v[k]));
    }
  }
  for (int o = kWarpSize / 2; o > 0; o /= 2) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, ms.m, o), __shfl_xor_sync(0xffffffffu, ms.s, o)};
    ms = merge(ms, other);
  }
  if (threadIdx.x % kWarpSize == 0) warp_parts[threadIdx.x / kWarpSize] = ms;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum all = warp_parts[0];
    for (int w = 1; w < kThreads / kWarpSize; ++w) all = merge(all, warp_parts[w]);
    const float lse = all.m + logf(all.s);
    shared_lse = lse;
    losses[row] = target >= 0 ? lse - x_target : 0.f;
  }
  __syncthreads();  // also: every thread's packs are in row_copy
  if (dloss == 0.f) return;
  const float lse = shared_lse;
  for (int c = threadIdx.x; c < packs; c += kThreads) {
    Pack<T> p;
    if constexpr (kRowInSmem) p = row_copy[c];
    else p = load_pack(x + int64_t(c) * P);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int j = c * P + k;
      float g = 0.f;
      if (target >= 0 && j < V) g = dloss * (expf(to_f(p.v[k]) - lse) - (j == target ? 1.f : 0.f));
      p.v[k] = from_f<T>(g);
    }
    store_pack(x + int64_t(c) * P, p);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) softmax_cross_entropy_kernel(
    float* __restrict__ losses, T* __restrict__ logits, const int* __restrict__ targets, int V,
    int Vp, float dloss) {
  softmax_cross_entropy_row<T, false>(losses, logits, targets, V, Vp, dloss, nullptr);
}

template <class T>
__global__ void __launch_bounds__(kThreads) softmax_cross_entropy_smem_kernel(
    float* __restrict__ losses, T* __restrict__ logits, const int* __restrict__ targets, int V,
    int Vp, float dloss) {
  extern __shared__ unsigned char row_bytes[];
  softmax_cross_entropy_row<T, true>(losses, logits, targets, V, Vp, dloss,
                                     reinterpret_cast<Pack<T>*>(row_bytes));
}

// Shared memory of the current device: per SM, and the most one block may opt in to.
struct SmemLimits {
  int per_sm = 0, per_block = 0;
};
SmemLimits smem_limits() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  SmemLimits l;
  CUDA_CHECK(cudaDeviceGetAttribute(&l.per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&l.per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return l;
}

}  // namespace

// ---------------------------------------------------------------- launchers

bool softmax_cross_entropy_row_in_smem(const Tensor& logits, float dloss) {
  if (dloss == 0.f) return false;  // one read either way
  static const SmemLimits limits = smem_limits();
  // Two blocks per SM, each with its row, its static shared memory and the 1 KiB the
  // hardware reserves per block.
  const int64_t row = logits.shape[1] * int64_t(dtype_size(logits.dtype));
  const int64_t per_block = row + 2048;
  return row <= limits.per_block && 2 * per_block <= limits.per_sm;
}

void softmax_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int V, float dloss,
                           cudaStream_t stream) {
  FG_ASSERT(logits.ndim == 2, "logits must be (N, Vp): ", logits.shape_str());
  int64_t N = logits.shape[0];
  int Vp = int(logits.shape[1]);
  FG_ASSERT(V > 0 && V <= Vp, "V=", V, " Vp=", Vp);
  FG_ASSERT(losses.dtype == DType::f32 && losses.numel() == N, "losses must be (N) fp32");
  FG_ASSERT(targets.dtype == DType::i32 && targets.numel() == N, "targets must be (N) int32");
  FG_ASSERT(aligned16(logits.data), "logits must be 16-byte aligned");
  if (N == 0) return;
  const bool in_smem = softmax_cross_entropy_row_in_smem(logits, dloss);
  FG_DISPATCH_FLOAT(logits.dtype, T, {
    FG_ASSERT(Vp % Pack<T>::N == 0, "Vp=", Vp, " must be a multiple of ", Pack<T>::N);
    if (in_smem) {
      const size_t bytes = size_t(Vp) * sizeof(T);
      auto kernel = softmax_cross_entropy_smem_kernel<T>;
      if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
      kernel<<<unsigned(N), kThreads, bytes, stream>>>(losses.as<float>(), logits.as<T>(),
                                                       targets.as<int>(), V, Vp, dloss);
    } else {
      softmax_cross_entropy_kernel<T><<<unsigned(N), kThreads, 0, stream>>>(
          losses.as<float>(), logits.as<T>(), targets.as<int>(), V, Vp, dloss);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace flashgpt::cuda
