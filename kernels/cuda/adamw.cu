// AdamW over fp32 master weights, and the deterministic global sum of squares used for
// gradient-norm clipping.
//   g = grad·grad_scale;  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//   w = w − lr·( m/(1−β1^t) / (√(v/(1−β2^t)) + ε) + wd·w )      (PyTorch AdamW)
// w is the fp32 master when there is one (bf16 runs): the bf16 parameter is then
// written from it with stochastic rounding (a hash of seed and the element's index in
// the packed parameter order, index0 + i), so the
// expected bf16 weight equals the master weight. fp32 runs update the parameter itself.
// sum_squares: a fixed grid of kSumSqBlocks blocks (grid-stride) writes one partial per
// block, and one block adds them in order: the same bits on every run.
#include <cmath>
#include <type_traits>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace flashgpt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kSumSqBlocks = 1024;
constexpr int kSumSqThreads = 512;

// ---------------------------------------------------------------- kernels

template <class T>
__global__ void adamw_kernel(T* __restrict__ param, float* __restrict__ master,
                             const float* __restrict__ grad, float* __restrict__ m_state,
                             float* __restrict__ v_state, int64_t n, float lr, float beta1,
                             float beta2, float eps, float wd, float grad_scale, float bc1,
                             float bc2, uint32_t seed, uint64_t index0) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = grad[i] * grad_scale;
  float m = beta1 * m_state[i] + (1.f - beta1) * g;
  float v = beta2 * v_state[i] + (1.f - beta2) * g * g;
  m_state[i] = m;
  v_state[i] = v;
  float w = master ? master[i] : to_f(param[i]);
  w -= lr * ((m / bc1) / (sqrtf(v / bc2) + eps) + wd * w);
  if (master) {
    master[i] = w;
    if constexpr (std::is_same_v<T, bf16>)
      param[i] = bf16_stochastic(w, seed, uint32_t(index0 + uint64_t(i)));
    else
      param[i] = from_f<T>(w);
  } else {
    param[i] = from_f<T>(w);
  }
}

template <class G>
__global__ void sum_squares_partial_kernel(float* __restrict__ partials, const G* __restrict__ x,
                                           int64_t n) {
  float s = 0.f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = to_f(x[i]);
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void sum_squares_final_kernel(float* __restrict__ out, const float* __restrict__ partials,
                                         int blocks) {
  float s = 0.f;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out += s;
}

}  // namespace

// ---------------------------------------------------------------- launchers

void adamw_update(const AdamWArgs& a, cudaStream_t stream) {
  int64_t n = a.param.numel();
  FG_ASSERT(a.grad.numel() == n && a.m.numel() == n && a.v.numel() == n, "adamw sizes differ");
  FG_ASSERT(a.grad.dtype == DType::f32 && a.m.dtype == DType::f32 && a.v.dtype == DType::f32,
            "adamw: grad, m, v must be fp32");
  FG_ASSERT(a.step >= 1, "adamw step is 1-based");
  if (a.param.dtype == DType::bf16)
    FG_ASSERT(a.master.defined() && a.master.dtype == DType::f32 && a.master.numel() == n,
              "bf16 params need an fp32 master copy");
  else
    FG_ASSERT(!a.master.defined(), "fp32 params take no master copy");
  if (n == 0) return;
  float bc1 = 1.f - std::pow(a.beta1, float(a.step));
  float bc2 = 1.f - std::pow(a.beta2, float(a.step));
  FG_DISPATCH_FLOAT(a.param.dtype, T, {
    adamw_kernel<T><<<unsigned(ceil_div(n, kThreads)), kThreads, 0, stream>>>(
        a.param.as<T>(), a.master.defined() ? a.master.as<float>() : nullptr, a.grad.as<float>(),
        a.m.as<float>(), a.v.as<float>(), n, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
        a.grad_scale, bc1, bc2, a.seed, a.index0);
    CUDA_CHECK_LAUNCH();
  });
}

size_t sum_squares_scratch_bytes() { return kSumSqBlocks * sizeof(float); }

void sum_squares(Tensor out, Tensor grad, void* scratch, cudaStream_t stream) {
  FG_ASSERT(out.dtype == DType::f32 && out.numel() == 1, "out must be a (1) fp32 tensor");
  int64_t n = grad.numel();
  FG_DISPATCH_FLOAT(grad.dtype, G, {
    sum_squares_partial_kernel<G><<<kSumSqBlocks, kSumSqThreads, 0, stream>>>(
        static_cast<float*>(scratch), grad.as<G>(), n);
    CUDA_CHECK_LAUNCH();
  });
  sum_squares_final_kernel<<<1, kSumSqThreads, 0, stream>>>(out.as<float>(),
                                                            static_cast<const float*>(scratch),
                                                            kSumSqBlocks);
  CUDA_CHECK_LAUNCH();
}

}  // namespace flashgpt::cuda
