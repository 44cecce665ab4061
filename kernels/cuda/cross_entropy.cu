// Fused softmax + cross-entropy over a padded vocabulary, one thread block per row:
//   pass 1 (read):  max m and rescaled sum s = Σ exp(x − m) over columns < V, per
//                   16-byte pack: the pack's max first, one rescale of s when it grows,
//                   then exp(x − m) = 2^(x·log2 e − m·log2 e) (one FMA and one ex2 an
//                   element); each thread keeps its own (m, s), the block merges them, so
//                   lse = m + log s after one read of the row;
//   loss[n] = lse − x[target]
//   pass 2 (read + write, only when dloss ≠ 0): x ← dloss·(2^(x·log2 e − lse·log2 e)
//                   − [j = target]), 0 in the padding columns ≥ V. Probabilities are never
//                   stored. The second read of the row mostly hits L2.
// A target < 0 means "ignore": loss 0 and the whole row's gradient 0. Each thread keeps
// kLoadsInFlight 16-byte loads in flight.
// Why not read the row once: kept in shared memory it measured slower (softmax-CE 7.997
// against 6.938 ms a step), and kept in registers (13 packs a thread, 127 registers, one
// 512-thread block per SM) too (7.165 against 5.481 ms; BENCHMARKS.md): the blocks per SM
// drop, and the second read was already coming from L2. So were two Hopper kernels that
// bulk-copied the row into shared memory (BENCHMARKS.md, sixth and seventh sessions):
// two blocks per SM, 5.842 against 5.602 ms (a block could not load its next row while
// writing this one's gradient), and one 1024-thread block per SM double-buffering rows,
// the next row's copy running under this one's work, 7.016 against 5.609 ms.
#include <cfloat>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace flashgpt::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kLoadsInFlight = 4;

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

__device__ __forceinline__ float ex2(float x) {  // 2^x, ex2.approx (2 ulp), 2^-inf = 0
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Adds the pack's elements with column < V (at least its first) to a.
template <class T>
__device__ __forceinline__ void add_pack(MaxSum& a, const Pack<T>& p, int col0, int V) {
  constexpr int P = Pack<T>::N;
  float x[P], pm = -INFINITY;
#pragma unroll
  for (int k = 0; k < P; ++k) {
    x[k] = col0 + k < V ? to_f(p.v[k]) : -INFINITY;
    pm = fmaxf(pm, x[k]);
  }
  if (pm > a.m) {  // pm is finite: column col0 < V
    a.s *= ex2((a.m - pm) * kLog2e);
    a.m = pm;
  }
  const float neg_m = -a.m * kLog2e;
#pragma unroll
  for (int k = 0; k < P; ++k) a.s += ex2(fmaf(x[k], kLog2e, neg_m));
}

// ---------------------------------------------------------------- kernels

template <class T>
__global__ void __launch_bounds__(kThreads) softmax_cross_entropy_kernel(
    float* __restrict__ losses, T* __restrict__ logits, const int* __restrict__ targets, int V,
    int Vp, float dloss) {
  constexpr int P = Pack<T>::N;
  __shared__ MaxSum warp_parts[kThreads / kWarpSize];
  __shared__ float shared_lse;
  const int64_t row = blockIdx.x;
  T* x = logits + row * Vp;
  const int target = targets[row];
  const int packs = Vp / P, valid_packs = (V + P - 1) / P;
  // Read the target logit before pass 2 overwrites the row (the block reduction below
  // synchronises the block in between).
  const float x_target = target >= 0 ? to_f(x[target]) : 0.f;

  MaxSum ms{-INFINITY, 0.f};
  for (int c0 = threadIdx.x; c0 < valid_packs; c0 += kLoadsInFlight * kThreads) {
    Pack<T> p[kLoadsInFlight];
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int c = c0 + u * kThreads;
      if (c < valid_packs) p[u] = load_pack(x + int64_t(c) * P);
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int c = c0 + u * kThreads;
      if (c < valid_packs) add_pack(ms, p[u], c * P, V);
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
  __syncthreads();
  if (dloss == 0.f) return;
  const float neg_lse = -shared_lse * kLog2e;
  for (int c = threadIdx.x; c < packs; c += kThreads) {
    Pack<T> p = load_pack(x + int64_t(c) * P);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int j = c * P + k;
      float g = 0.f;
      if (target >= 0 && j < V) g = dloss * (ex2(fmaf(to_f(p.v[k]), kLog2e, neg_lse)) - (j == target ? 1.f : 0.f));
      p.v[k] = from_f<T>(g);
    }
    store_pack(x + int64_t(c) * P, p);
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
