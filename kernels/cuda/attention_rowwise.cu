// Row-wise exact attention with O(T) memory: one warp per query row (forward, dQ) or
// key row (dK, dV), online softmax, nothing T×T stored. Simple and slow (a warp
// reduction per score); it is the fp32 path of AttentionAlgo::flash (the FlashAttention
// kernels are bf16-only) so fp32 verification runs use the same O/LSE contract.
//   forward:   s_ij = scale·q_i·k_j;  online m, l;  o_i = Σ_j exp(s_ij − m)·v_j / l;
//              lse_i = m + log l
//   backward:  δ_i = do_i·o_i;  p_ij = exp(s_ij − lse_i);  ds_ij = p_ij·(do_i·v_j − δ_i)
//              dq_i = scale·Σ_j ds_ij·k_j;  dk_j = scale·Σ_i ds_ij·q_i;  dv_j = Σ_i p_ij·do_i
// Lane l holds head-dimension elements l, l + 32, … (D ≤ kMaxD).
#include <cmath>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace flashgpt::cuda {
namespace {

constexpr int kMaxD = 128;
constexpr int kPerLane = kMaxD / kWarpSize;
constexpr int kWarpsPerBlock = 4;

struct Geometry {
  int B, T, H, D;
  __device__ int64_t qkv_row(int b, int t) const { return (int64_t(b) * T + t) * 3 * H * D; }
  __device__ int64_t o_row(int b, int t) const { return (int64_t(b) * T + t) * H * D; }
};

template <class T>
__device__ __forceinline__ void load_vec(float (&x)[kPerLane], const T* p, int D, int lane) {
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    int d = lane + r * kWarpSize;
    x[r] = d < D ? to_f(p[d]) : 0.f;
  }
}

__device__ __forceinline__ float dot(const float (&a)[kPerLane], const float (&b)[kPerLane]) {
  float s = 0.f;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) s += a[r] * b[r];
  return warp_sum(s);
}

// ---------------------------------------------------------------- kernels

// One warp per (b, h, i).
template <class T>
__global__ void rowwise_forward_kernel(T* __restrict__ out, float* __restrict__ lse,
                                       const T* __restrict__ qkv, Geometry g, float scale, bool causal) {
  int lane = threadIdx.x % kWarpSize;
  int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= int64_t(g.B) * g.H * g.T) return;
  int i = int(row % g.T), h = int(row / g.T % g.H), b = int(row / (int64_t(g.T) * g.H));
  int HD = g.H * g.D;
  float q[kPerLane], acc[kPerLane] = {}, k[kPerLane], v[kPerLane];
  load_vec(q, qkv + g.qkv_row(b, i) + h * g.D, g.D, lane);
  float m = -INFINITY, l = 0.f;
  int last = causal ? i : g.T - 1;
  for (int j = 0; j <= last; ++j) {
    const T* kv = qkv + g.qkv_row(b, j) + h * g.D;
    load_vec(k, kv + HD, g.D, lane);
    load_vec(v, kv + 2 * HD, g.D, lane);
    float s = scale * dot(q, k);
    float m_new = fmaxf(m, s);
    float corr = expf(m - m_new), e = expf(s - m_new);
    l = l * corr + e;
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) acc[r] = acc[r] * corr + e * v[r];
    m = m_new;
  }
  T* o = out + g.o_row(b, i) + h * g.D;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    int d = lane + r * kWarpSize;
    if (d < g.D) o[d] = from_f<T>(acc[r] / l);
  }
  if (lane == 0) lse[(int64_t(b) * g.H + h) * g.T + i] = m + logf(l);
}

// δ (B,H,T) = rowsum(dO ∘ O)
template <class T>
__global__ void rowwise_delta_kernel(float* __restrict__ delta, const T* __restrict__ out,
                                     const T* __restrict__ dout, Geometry g) {
  int lane = threadIdx.x % kWarpSize;
  int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= int64_t(g.B) * g.H * g.T) return;
  int i = int(row % g.T), h = int(row / g.T % g.H), b = int(row / (int64_t(g.T) * g.H));
  float o[kPerLane], d[kPerLane];
  load_vec(o, out + g.o_row(b, i) + h * g.D, g.D, lane);
  load_vec(d, dout + g.o_row(b, i) + h * g.D, g.D, lane);
  float s = dot(o, d);
  if (lane == 0) delta[row] = s;
}

// One warp per query row: dq_i.
template <class T>
__global__ void rowwise_dq_kernel(T* __restrict__ dqkv, const T* __restrict__ qkv,
                                  const T* __restrict__ dout, const float* __restrict__ lse,
                                  const float* __restrict__ delta, Geometry g, float scale, bool causal) {
  int lane = threadIdx.x % kWarpSize;
  int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= int64_t(g.B) * g.H * g.T) return;
  int i = int(row % g.T), h = int(row / g.T % g.H), b = int(row / (int64_t(g.T) * g.H));
  int HD = g.H * g.D;
  float q[kPerLane], dO[kPerLane], k[kPerLane], v[kPerLane], dq[kPerLane] = {};
  load_vec(q, qkv + g.qkv_row(b, i) + h * g.D, g.D, lane);
  load_vec(dO, dout + g.o_row(b, i) + h * g.D, g.D, lane);
  float L = lse[row], dl = delta[row];
  int last = causal ? i : g.T - 1;
  for (int j = 0; j <= last; ++j) {
    const T* kv = qkv + g.qkv_row(b, j) + h * g.D;
    load_vec(k, kv + HD, g.D, lane);
    load_vec(v, kv + 2 * HD, g.D, lane);
    float p = expf(scale * dot(q, k) - L);
    float ds = p * (dot(dO, v) - dl);
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) dq[r] += ds * k[r];
  }
  T* dst = dqkv + g.qkv_row(b, i) + h * g.D;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    int d = lane + r * kWarpSize;
    if (d < g.D) dst[d] = from_f<T>(scale * dq[r]);
  }
}

// One warp per key row: dk_j, dv_j.
template <class T>
__global__ void rowwise_dkv_kernel(T* __restrict__ dqkv, const T* __restrict__ qkv,
                                   const T* __restrict__ dout, const float* __restrict__ lse,
                                   const float* __restrict__ delta, Geometry g, float scale, bool causal) {
  int lane = threadIdx.x % kWarpSize;
  int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= int64_t(g.B) * g.H * g.T) return;
  int j = int(row % g.T), h = int(row / g.T % g.H), b = int(row / (int64_t(g.T) * g.H));
  int HD = g.H * g.D;
  float k[kPerLane], v[kPerLane], q[kPerLane], dO[kPerLane], dk[kPerLane] = {}, dv[kPerLane] = {};
  const T* kv = qkv + g.qkv_row(b, j) + h * g.D;
  load_vec(k, kv + HD, g.D, lane);
  load_vec(v, kv + 2 * HD, g.D, lane);
  int64_t stats = (int64_t(b) * g.H + h) * g.T;
  for (int i = causal ? j : 0; i < g.T; ++i) {
    load_vec(q, qkv + g.qkv_row(b, i) + h * g.D, g.D, lane);
    load_vec(dO, dout + g.o_row(b, i) + h * g.D, g.D, lane);
    float p = expf(scale * dot(q, k) - lse[stats + i]);
    float ds = p * (dot(dO, v) - delta[stats + i]);
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      dk[r] += ds * q[r];
      dv[r] += p * dO[r];
    }
  }
  T* dst = dqkv + g.qkv_row(b, j) + h * g.D;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    int d = lane + r * kWarpSize;
    if (d < g.D) {
      dst[HD + d] = from_f<T>(scale * dk[r]);
      dst[2 * HD + d] = from_f<T>(dv[r]);
    }
  }
}

Geometry geometry(int B, int T, int H, int D) {
  FG_ASSERT(B > 0 && T > 0 && H > 0 && D > 0 && D <= kMaxD, "attention sizes B=", B, " T=", T,
            " H=", H, " D=", D, " (D ≤ ", kMaxD, ")");
  return Geometry{B, T, H, D};
}

}  // namespace

// ---------------------------------------------------------------- launchers

void attention_rowwise_forward(const AttentionForward& a, cudaStream_t stream) {
  Geometry g = geometry(a.B, a.T, a.H, a.D);
  int64_t rows = int64_t(a.B) * a.H * a.T;
  FG_ASSERT(a.qkv.numel() == rows * 3 * a.D && a.out.numel() == rows * a.D, "qkv/out shapes");
  FG_ASSERT(a.lse.dtype == DType::f32 && a.lse.numel() == rows, "lse (B,H,T) fp32");
  FG_ASSERT(a.out.dtype == a.qkv.dtype, "attention dtypes differ");
  float scale = 1.f / std::sqrt(float(a.D));
  unsigned grid = unsigned(ceil_div(rows, kWarpsPerBlock));
  FG_DISPATCH_FLOAT(a.qkv.dtype, T, {
    rowwise_forward_kernel<T><<<grid, kWarpsPerBlock * kWarpSize, 0, stream>>>(
        a.out.as<T>(), a.lse.as<float>(), a.qkv.as<T>(), g, scale, a.causal);
    CUDA_CHECK_LAUNCH();
  });
}

void attention_rowwise_backward(const AttentionBackward& a, cudaStream_t stream) {
  Geometry g = geometry(a.B, a.T, a.H, a.D);
  int64_t rows = int64_t(a.B) * a.H * a.T;
  FG_ASSERT(a.qkv.numel() == rows * 3 * a.D && a.dqkv.numel() == a.qkv.numel(), "qkv/dqkv shapes");
  FG_ASSERT(a.out.numel() == rows * a.D && a.dout.numel() == rows * a.D, "out/dout shapes");
  FG_ASSERT(a.lse.dtype == DType::f32 && a.lse.numel() == rows, "lse (B,H,T) fp32");
  FG_ASSERT(a.delta.dtype == DType::f32 && a.delta.numel() == rows, "delta (B,H,T) fp32 scratch");
  float scale = 1.f / std::sqrt(float(a.D));
  unsigned grid = unsigned(ceil_div(rows, kWarpsPerBlock));
  FG_DISPATCH_FLOAT(a.qkv.dtype, T, {
    rowwise_delta_kernel<T><<<grid, kWarpsPerBlock * kWarpSize, 0, stream>>>(
        a.delta.as<float>(), a.out.as<T>(), a.dout.as<T>(), g);
    CUDA_CHECK_LAUNCH();
    rowwise_dq_kernel<T><<<grid, kWarpsPerBlock * kWarpSize, 0, stream>>>(
        a.dqkv.as<T>(), a.qkv.as<T>(), a.dout.as<T>(), a.lse.as<float>(), a.delta.as<float>(), g,
        scale, a.causal);
    CUDA_CHECK_LAUNCH();
    rowwise_dkv_kernel<T><<<grid, kWarpsPerBlock * kWarpSize, 0, stream>>>(
        a.dqkv.as<T>(), a.qkv.as<T>(), a.dout.as<T>(), a.lse.as<float>(), a.delta.as<float>(), g,
        scale, a.causal);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace flashgpt::cuda
