// LayerNorm (eps 1e-5), optionally fused with the residual add before it.
//   forward:  x = inp1 [+ inp2, stored as `residual`];  mean, rstd of x;
//             out = (x - mean)·rstd·w + b                       (one warp per row)
//   backward: xhat = (x - mean)·rstd,  g = dout·w
//             dinp += rstd·(g - mean(g) - xhat·mean(g·xhat))    (one warp per row)
//             dw += Σ_rows dout·xhat,  db += Σ_rows dout         (deterministic:)
// The column sums are deterministic: each warp accumulates its rows into its own
// shared-memory partial (no two threads touch one address), the block adds its warps
// in order and writes one partial per block; a second kernel adds the block partials
// in order into dw, db. Statistics are computed in fp32 from the rounded residual,
// which is what the next layers read.
#include <algorithm>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace flashgpt::cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kWarpsPerBlock = 4;
constexpr int kBwdMaxBlocks = 256;  // fixed per shape: the reduction order never changes

// ---------------------------------------------------------------- kernels

template <class T, bool kResidual>
__global__ void layernorm_forward_kernel(T* __restrict__ residual, T* __restrict__ out,
                                         float* __restrict__ mean, float* __restrict__ rstd,
                                         const T* __restrict__ inp1, const T* __restrict__ inp2,
                                         const T* __restrict__ w, const T* __restrict__ b,
                                         int64_t N, int C) {
  constexpr int P = Pack<T>::N;
  int lane = threadIdx.x % kWarpSize;
  int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const T* x = inp1 + row * C;
  if (kResidual) {
    // residual = inp1 + inp2, rounded; the statistics below read it back (same lane,
    // same addresses: no synchronisation needed).
    T* r = residual + row * C;
    for (int c = lane * P; c < C; c += kWarpSize * P) {
      Pack<T> a = load_pack_cs(inp1 + row * C + c), bb = load_pack_cs(inp2 + row * C + c), s;
#pragma unroll
      for (int k = 0; k < P; ++k) s.v[k] = from_f<T>(to_f(a.v[k]) + to_f(bb.v[k]));
      store_pack(r + c, s);
    }
    x = r;
  }
  float sum = 0.f;
  for (int c = lane * P; c < C; c += kWarpSize * P) {
    Pack<T> a = load_pack(x + c);
#pragma unroll
    for (int k = 0; k < P; ++k) sum += to_f(a.v[k]);
  }
  float m = warp_sum(sum) / C;
  float var = 0.f;
  for (int c = lane * P; c < C; c += kWarpSize * P) {
    Pack<T> a = load_pack(x + c);
#pragma unroll
    for (int k = 0; k < P; ++k) { float d = to_f(a.v[k]) - m; var += d * d; }
  }
  float rs = rsqrtf(warp_sum(var) / C + kEps);
  for (int c = lane * P; c < C; c += kWarpSize * P) {
    Pack<T> a = load_pack(x + c), wp = load_pack(w + c), bp = load_pack(b + c), o;
#pragma unroll
    for (int k = 0; k < P; ++k)
      o.v[k] = from_f<T>((to_f(a.v[k]) - m) * rs * to_f(wp.v[k]) + to_f(bp.v[k]));
    store_pack(out + row * C + c, o);
  }
  if (lane == 0) { mean[row] = m; rstd[row] = rs; }
}

// Dynamic shared memory: kWarpsPerBlock × 2 × C floats (per-warp dw, db partials).
// partials: (gridDim.x, 2, C) fp32.
template <class T>
__global__ void layernorm_backward_kernel(T* __restrict__ dinp, float* __restrict__ partials,
                                          const T* __restrict__ dout, const T* __restrict__ inp,
                                          const T* __restrict__ w, const float* __restrict__ mean,
                                          const float* __restrict__ rstd, int64_t N, int C) {
  constexpr int P = Pack<T>::N;
  extern __shared__ float smem[];
  int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  float* dw_part = smem + warp * 2 * C;
  float* db_part = dw_part + C;
  for (int c = lane; c < 2 * C; c += kWarpSize) dw_part[c] = 0.f;
  __syncwarp();
  for (int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + warp; row < N;
       row += int64_t(gridDim.x) * kWarpsPerBlock) {
    const T* x = inp + row * C;
    const T* dy = dout + row * C;
    float m = mean[row], rs = rstd[row];
    float sum_g = 0.f, sum_gx = 0.f;
    for (int c = lane * P; c < C; c += kWarpSize * P) {
      Pack<T> xp = load_pack(x + c), dp = load_pack(dy + c), wp = load_pack(w + c);
#pragma unroll
      for (int k = 0; k < P; ++k) {
        float xhat = (to_f(xp.v[k]) - m) * rs, d = to_f(dp.v[k]);
        float g = d * to_f(wp.v[k]);
        sum_g += g;
        sum_gx += g * xhat;
        dw_part[c + k] += d * xhat;
        db_part[c + k] += d;
      }
    }
    sum_g = warp_sum(sum_g) / C;
    sum_gx = warp_sum(sum_gx) / C;
    for (int c = lane * P; c < C; c += kWarpSize * P) {
      Pack<T> xp = load_pack(x + c), dp = load_pack(dy + c), wp = load_pack(w + c);
      Pack<T> di = load_pack(dinp + row * C + c);
#pragma unroll
      for (int k = 0; k < P; ++k) {
        float xhat = (to_f(xp.v[k]) - m) * rs;
        float g = to_f(dp.v[k]) * to_f(wp.v[k]);
        di.v[k] = from_f<T>(to_f(di.v[k]) + rs * (g - sum_g - xhat * sum_gx));
      }
      store_pack(dinp + row * C + c, di);
    }
  }
  __syncthreads();
  float* dst = partials + int64_t(blockIdx.x) * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
    float s = 0.f;
    for (int w8 = 0; w8 < kWarpsPerBlock; ++w8) s += smem[w8 * 2 * C + c];
    dst[c] = s;
  }
}

// dw[c] += Σ_g partials[g][0][c];  db[c] += Σ_g partials[g][1][c]   (fixed order)
__global__ void layernorm_reduce_kernel(float* __restrict__ dw, float* __restrict__ db,
                                        const float* __restrict__ partials, int blocks, int C) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sw = 0.f, sb = 0.f;
  for (int g = 0; g < blocks; ++g) {
    sw += partials[int64_t(g) * 2 * C + c];
    sb += partials[int64_t(g) * 2 * C + C + c];
  }
  dw[c] += sw;
  db[c] += sb;
}

int backward_blocks(int64_t N) { return int(std::min<int64_t>(ceil_div(N, kWarpsPerBlock), kBwdMaxBlocks)); }

}  // namespace

// ---------------------------------------------------------------- launchers

void layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd, Tensor inp1,
                       Tensor inp2, Tensor weight, Tensor bias, cudaStream_t stream) {
  int C = int(weight.numel());
  int64_t N = inp1.numel() / C;
  bool fused = residual.defined();
  FG_ASSERT(fused == inp2.defined(), "residual and inp2 go together");
  FG_ASSERT(out.numel() == N * C && inp1.numel() == N * C, "layernorm shapes");
  FG_ASSERT(!fused || (residual.numel() == N * C && inp2.numel() == N * C), "residual shapes");
  FG_ASSERT(mean.dtype == DType::f32 && rstd.dtype == DType::f32 && mean.numel() == N &&
                rstd.numel() == N, "mean, rstd must be (N) fp32");
  FG_ASSERT(out.dtype == inp1.dtype && weight.dtype == out.dtype && bias.dtype == out.dtype,
            "layernorm dtypes differ");
  FG_ASSERT(aligned16(out.data) && aligned16(inp1.data) && aligned16(weight.data) &&
                aligned16(bias.data) && (!fused || (aligned16(residual.data) && aligned16(inp2.data))),
            "layernorm needs 16-byte aligned tensors");
  unsigned grid = unsigned(ceil_div(N, kWarpsPerBlock));
  FG_DISPATCH_FLOAT(out.dtype, T, {
    FG_ASSERT(C % Pack<T>::N == 0, "C=", C, " must be a multiple of ", Pack<T>::N);
    if (fused)
      layernorm_forward_kernel<T, true><<<grid, kWarpsPerBlock * kWarpSize, 0, stream>>>(
          residual.as<T>(), out.as<T>(), mean.as<float>(), rstd.as<float>(), inp1.as<T>(),
          inp2.as<T>(), weight.as<T>(), bias.as<T>(), N, C);
    else
      layernorm_forward_kernel<T, false><<<grid, kWarpsPerBlock * kWarpSize, 0, stream>>>(
          nullptr, out.as<T>(), mean.as<float>(), rstd.as<float>(), inp1.as<T>(), nullptr,
          weight.as<T>(), bias.as<T>(), N, C);
    CUDA_CHECK_LAUNCH();
  });
}

size_t layernorm_backward_scratch_bytes(int64_t N, int64_t C) {
  return size_t(backward_blocks(N)) * 2 * size_t(C) * sizeof(float);
}

void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                        Tensor weight, Tensor mean, Tensor rstd, void* scratch,
                        cudaStream_t stream) {
  int C = int(weight.numel());
  int64_t N = inp.numel() / C;
  FG_ASSERT(dinp.numel() == N * C && dout.numel() == N * C, "layernorm backward shapes");
  FG_ASSERT(dweight.dtype == DType::f32 && dbias.dtype == DType::f32, "LN grads are fp32");
  FG_ASSERT(dinp.dtype == inp.dtype && dout.dtype == inp.dtype && weight.dtype == inp.dtype,
            "layernorm backward dtypes differ");
  FG_ASSERT(aligned16(dinp.data) && aligned16(dout.data) && aligned16(inp.data) &&
                aligned16(weight.data), "layernorm needs 16-byte aligned tensors");
  int blocks = backward_blocks(N);
  size_t smem = size_t(kWarpsPerBlock) * 2 * C * sizeof(float);
  FG_DISPATCH_FLOAT(inp.dtype, T, {
    FG_ASSERT(C % Pack<T>::N == 0, "C=", C, " must be a multiple of ", Pack<T>::N);
    // C = 1600 needs 51 KB: above the 48 KB default, so opt in (up to the device limit).
    CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel<T>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    layernorm_backward_kernel<T><<<blocks, kWarpsPerBlock * kWarpSize, smem, stream>>>(
        dinp.as<T>(), static_cast<float*>(scratch), dout.as<T>(), inp.as<T>(), weight.as<T>(),
        mean.as<float>(), rstd.as<float>(), N, C);
    CUDA_CHECK_LAUNCH();
  });
  layernorm_reduce_kernel<<<unsigned(ceil_div(C, 256)), 256, 0, stream>>>(
      dweight.as<float>(), dbias.as<float>(), static_cast<const float*>(scratch), blocks, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace flashgpt::cuda
