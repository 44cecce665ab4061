// Bias gradient: dbias[oc] += Σ_n dout[n, oc]  (dout (N, OC) activation dtype, dbias fp32).
// Deterministic two-kernel column sum: grid (column tiles, row splits); a block is
// 32 × kRowGroups threads: lane x owns one x128 pack of columns, thread row y walks
// the split's rows y, y + kRowGroups, ...; the block adds its row groups in order and
// writes one partial per split; the second kernel adds the splits in order.
// Why not cuBLASLt's BGRADB epilogue on the dweight GEMM, which reads dout anyway: it was
// measured slower (the four bias-carrying matmul backwards 37.35 → 38.71 ms a step with a
// partial row + a small add kernel, BENCHMARKS.md "Fifth session"); and it overwrites the
// bias gradient, where the op contract accumulates.
#include <algorithm>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace flashgpt::cuda {
namespace {

constexpr int kRowGroups = 8;
constexpr int kRowsPerSplit = 512;
constexpr int kMaxSplits = 128;

int splits_for(int64_t N) { return int(std::clamp<int64_t>(ceil_div(N, kRowsPerSplit), 1, kMaxSplits)); }

// ---------------------------------------------------------------- kernels

// partials: (gridDim.y, OC) fp32
template <class T>
__global__ void bias_grad_partial_kernel(float* __restrict__ partials, const T* __restrict__ dout,
                                         int64_t N, int OC) {
  constexpr int P = Pack<T>::N;
  __shared__ float tile[kRowGroups][kWarpSize * P];
  int c = (blockIdx.x * kWarpSize + threadIdx.x) * P;
  int64_t rows_per_split = ceil_div(N, gridDim.y);
  int64_t r0 = blockIdx.y * rows_per_split, r1 = std::min<int64_t>(N, r0 + rows_per_split);
  float acc[P] = {};
  if (c < OC) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowGroups) {
      Pack<T> d = load_pack(dout + r * OC + c);
#pragma unroll
      for (int k = 0; k < P; ++k) acc[k] += to_f(d.v[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < P; ++k) tile[threadIdx.y][threadIdx.x * P + k] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < OC) {
#pragma unroll
    for (int k = 0; k < P; ++k) {
      float s = 0.f;
      for (int g = 0; g < kRowGroups; ++g) s += tile[g][threadIdx.x * P + k];
      partials[int64_t(blockIdx.y) * OC + c + k] = s;
    }
  }
}

__global__ void bias_grad_reduce_kernel(float* __restrict__ dbias, const float* __restrict__ partials,
                                        int splits, int OC) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  float s = 0.f;
  for (int g = 0; g < splits; ++g) s += partials[int64_t(g) * OC + c];
  dbias[c] += s;
}

}  // namespace

// ---------------------------------------------------------------- launchers

size_t bias_grad_scratch_bytes(int64_t N, int64_t OC) {
  return size_t(splits_for(N)) * size_t(OC) * sizeof(float);
}

void bias_grad(Tensor dbias, Tensor dout, void* scratch, cudaStream_t stream) {
  int OC = int(dbias.numel());
  int64_t N = dout.numel() / OC;
  FG_ASSERT(dbias.dtype == DType::f32, "dbias is fp32");
  FG_ASSERT(dout.numel() == N * OC, "dout must be (N, OC)");
  FG_ASSERT(aligned16(dout.data), "dout must be 16-byte aligned");
  int splits = splits_for(N);
  FG_DISPATCH_FLOAT(dout.dtype, T, {
    constexpr int P = Pack<T>::N;
    FG_ASSERT(OC % P == 0, "OC=", OC, " must be a multiple of ", P);
    dim3 grid(unsigned(ceil_div(OC, kWarpSize * P)), unsigned(splits));
    bias_grad_partial_kernel<T><<<grid, dim3(kWarpSize, kRowGroups), 0, stream>>>(
        static_cast<float*>(scratch), dout.as<T>(), N, OC);
    CUDA_CHECK_LAUNCH();
  });
  bias_grad_reduce_kernel<<<unsigned(ceil_div(OC, 256)), 256, 0, stream>>>(
      dbias.as<float>(), static_cast<const float*>(scratch), splits, OC);
  CUDA_CHECK_LAUNCH();
}

}  // namespace flashgpt::cuda
