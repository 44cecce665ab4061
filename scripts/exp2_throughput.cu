// How fast one SM takes exponentials, the attention forward's other bottleneck beside its
// matmuls at head dim 64 (BENCHMARKS.md, "Fifty-third session"): 2^x on the
// special-function unit in fp32 (as the kernels do, ex2.approx.ftz.f32), on packed fp16 and
// bf16 pairs, by a degree-3 polynomial on the FMA pipe, and mixes of the polynomial with
// the special-function unit. Every thread runs kChains independent chains
// x = 2^(x·a − b) (one fma and one exponential an element, as the softmax does). Prints the
// median of 5 runs after 2, exponentials per clock per SM at the device's rated clock.
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -I. -o /tmp/exp2 scripts/exp2_throughput.cu && /tmp/exp2
// The SASS (cuobjdump -sass /tmp/exp2) shows what each became: on sm_90a a packed ex2 is
// two MUFU.EX2.F16 (or .BF16) instructions, one a value.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include "kernels/cuda/attention/sm80_primitives.cuh"  // fast_exp2, the kernels' exponential

using flashgpt::cuda::attn::fast_exp2;
// 2^u and 2^v by one packed instruction: fp16 pairs (kHalf) or bf16 pairs.
template <bool kHalf>
__device__ __forceinline__ float2 ex2_pair(float u, float v) {
  uint32_t in, out;
  if constexpr (kHalf) {
    const __half2 h = __floats2half2_rn(u, v);
    in = reinterpret_cast<const uint32_t&>(h);
    asm("ex2.approx.f16x2 %0, %1;" : "=r"(out) : "r"(in));
    return __half22float2(reinterpret_cast<const __half2&>(out));
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(u, v);
    in = reinterpret_cast<const uint32_t&>(h);
    asm("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(out) : "r"(in));
    return __bfloat1622float2(reinterpret_cast<const __nv_bfloat162&>(out));
  }
}
// 2^x for x <= 0: x = j + f with j = round(x) (by adding 1.5·2^23) and f in [-0.5, 0.5],
// 2^f by a degree-3 Taylor polynomial, j added to the exponent bits. Relative error up
// to 8e-4 on [-30, 0] (an fp32 emulation in Python), a fifth of a bf16 ulp.
__device__ __forceinline__ float poly2(float x) {
  x = fmaxf(x, -126.f);
  const float t = x + 12582912.f;           // 1.5 * 2^23: rounds x to an integer in t's low bits
  const float j = t - 12582912.f;
  const float f = x - j;                     // [-0.5, 0.5]
  float p = fmaf(fmaf(fmaf(0.0555041086648216f, f, 0.2402264923172690f), f, 0.6931471805599453f), f, 1.f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}
constexpr int kChains = 16, kIters = 4096;
// kMode: 0 fp32 ex2, 1 fp16x2, 2 bf16x2, 3 the polynomial, 4-6 one chain in 4, 2 or 8 by the
// polynomial and the others by fp32 ex2.
template <int kMode>
__global__ void bench(float* out, float a, float b) {
  float x[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) x[c] = -0.001f * (threadIdx.x + c);
  for (int it = 0; it < kIters; ++it) {
    if constexpr (kMode == 1 || kMode == 2) {
#pragma unroll
      for (int c = 0; c < kChains; c += 2) {
        const float u = fmaf(x[c], a, -b), v = fmaf(x[c + 1], a, -b);
        const float2 f = ex2_pair<kMode == 1>(u, v);
        x[c] = f.x, x[c + 1] = f.y;
      }
    } else {
#pragma unroll
      for (int c = 0; c < kChains; ++c) {
        const float u = fmaf(x[c], a, -b);
        bool poly = kMode == 3 || (kMode == 4 && c % 4 == 3) || (kMode == 5 && c % 2 == 1) || (kMode == 6 && c % 8 == 7);
        x[c] = poly ? poly2(u) : fast_exp2(u);
      }
    }
  }
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) s += x[c];
  if (s == 12345.f) out[threadIdx.x] = s;
}
template <int kMode>
float run(float* out, int sms, const char* name) {
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int r = 0; r < 7; ++r) {
    cudaEventRecord(e0);
    bench<kMode><<<sms * 4, 256>>>(out, 0.5f, 1.0f);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    float t; cudaEventElapsedTime(&t, e0, e1); if (r >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double exps = double(sms) * 4 * 256 * kIters * kChains;
  int clk; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  const double per_sm_clk = exps / (ms[2] * 1e-3) / sms / (clk * 1e3);
  std::printf("%-28s %8.3f ms  %7.1f Gexp/s  %5.2f exp/clk/SM (at %d MHz)\n", name, ms[2], exps / (ms[2] * 1e-3) / 1e9,
              per_sm_clk, clk / 1000);
  return ms[2];
}
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* out; cudaMalloc(&out, 4096);
  run<0>(out, sms, "f32 ex2 (MUFU)");
  run<1>(out, sms, "f16x2 ex2 (MUFU)");
  run<2>(out, sms, "bf16x2 ex2 (MUFU)");
  run<3>(out, sms, "poly deg 3 (FMA)");
  run<4>(out, sms, "mix 1 poly : 3 MUFU");
  run<5>(out, sms, "mix 1 poly : 1 MUFU");
  run<6>(out, sms, "mix 1 poly : 7 MUFU");
  cudaError_t e = cudaDeviceSynchronize();
  std::printf("status: %s\n", cudaGetErrorString(e));
  return 0;
}
