// Fused softmax + cross-entropy over a padded vocabulary, one thread block per row:
//   pass 1 (read):  online max m and rescaled sum s = Σ exp(x − m) over columns < V
//                   (each thread keeps its own (m, s); the block merges them), so
//                   lse = m + log s after one read of the row;
//   loss[n] = lse − x[target]
//   pass 2 (read + write, only when dloss ≠ 0): x ← dloss·(exp(x − lse) − [j = target]),
//                   0 in the padding columns ≥ V. Probabilities are never stored.
// A target < 0 means "ignore": loss 0 and the whole row's gradient 0.
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

template <class T>
__global__ void softmax_cross_entropy_kernel(float* __restrict__ losses, T* __restrict__ logits,
                                             const int* __restrict__ targets, int V, int Vp,
                                             float dloss) {
  constexpr int P = Pack<T>::N;
  __shared__ MaxSum warp_parts[kThreads / kWarpSize];
  __shared__ float shared_lse;
  int64_t row = blockIdx.x;
  T* x = logits + row * Vp;
  int target = targets[row];
  // Read the target logit before pass 2 overwrites the row (the block reduction below
  // synchronises the block in between).
  float x_target = target >= 0 ? to_f(x[target]) : 0.f;

  MaxSum ms{-INFINITY, 0.f};
  for (int c = threadIdx.x * P; c < V; c += blockDim.x * P) {
    Pack<T> p = load_pack(x + c);
#pragma unroll
    for (int k = 0; k < P; ++k)
      if (c + k < V) add(ms, to_f(p.v[k]));
  }
  for (int o = kWarpSize / 2; o > 0; o /= 2) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, ms.m, o), __shfl_xor_sync(0xffffffffu, ms.s, o)};
    ms = merge(ms, other);
  }
  if (threadIdx.x % kWarpSize == 0) warp_parts[threadIdx.x / kWarpSize] = ms;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum all = warp_parts[0];
    for (int w = 1; w < int(blockDim.x / kWarpSize); ++w) all = merge(all, warp_parts[w]);
    float lse = all.m + logf(all.s);
    shared_lse = lse;
    losses[row] = target >= 0 ? lse - x_target : 0.f;
  }
  __syncthreads();
  if (dloss == 0.f) return;
  float lse = shared_lse;
  for (int c = threadIdx.x * P; c < Vp; c += blockDim.x * P) {
    Pack<T> p = load_pack(x + c);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      int j = c + k;
      float g = 0.f;
      if (target >= 0 && j < V) g = dloss * (expf(to_f(p.v[k]) - lse) - (j == target ? 1.f : 0.f));
      p.v[k] = from_f<T>(g);
    }
    store_pack(x + c, p);
  }
}

}  // namespace

// ---------------------------------------------------------------- launchers

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
  FG_DISPATCH_FLOAT(logits.dtype, T, {
    FG_ASSERT(Vp % Pack<T>::N == 0, "Vp=", Vp, " must be a multiple of ", Pack<T>::N);
    softmax_cross_entropy_kernel<T><<<unsigned(N), kThreads, 0, stream>>>(
        losses.as<float>(), logits.as<T>(), targets.as<int>(), V, Vp, dloss);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace flashgpt::cuda
