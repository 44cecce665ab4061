// AdamW over fp32 master weights, and the deterministic global sum of squares used for
// gradient-norm clipping.
//   g = grad·grad_scale;  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//   w = w − lr·( m/(1−β1^t) / (√(v/(1−β2^t)) + ε) + wd·w )      (PyTorch AdamW)
// w is the fp32 master when there is one (bf16 runs): the bf16 parameter is then
// written from it with stochastic rounding (a hash of seed and the element's index in
// the packed parameter order, index0 + i), so the
// expected bf16 weight equals the master weight. fp32 runs update the parameter itself.
// Two kernels, one element function: 4 elements per thread with 16-byte accesses when
// every array is 16-byte aligned (the optimizer's flat buffers always are), else one per
// thread; both give the same bits (CudaOps.AdamWVectorAndScalarKernelsAgreeBitwise).
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

struct AdamWConsts {
  float lr, beta1, beta2, eps, wd, grad_scale, bc1, bc2;
  uint32_t seed;
  uint64_t index0;
};

// One element: updates m, v and the master weight w, and returns the parameter to store.
// Both kernels below go through this function, so they produce the same bits.
template <class T>
__device__ __forceinline__ T adamw_element(float g, float& m, float& v, float& w, bool has_master,
                                           int64_t i, const AdamWConsts& c) {
  g *= c.grad_scale;
  m = c.beta1 * m + (1.f - c.beta1) * g;
  v = c.beta2 * v + (1.f - c.beta2) * g * g;
  w -= c.lr * ((m / c.bc1) / (sqrtf(v / c.bc2) + c.eps) + c.wd * w);
  if constexpr (std::is_same_v<T, bf16>)
    if (has_master) return bf16_stochastic(w, c.seed, uint32_t(c.index0 + uint64_t(i)));
  return from_f<T>(w);
}

// One element per thread: any alignment.
template <class T>
__global__ void adamw_kernel(T* __restrict__ param, float* __restrict__ master,
                             const float* __restrict__ grad, float* __restrict__ m_state,
                             float* __restrict__ v_state, int64_t n, AdamWConsts c) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float m = m_state[i], v = v_state[i];
  float w = master ? master[i] : to_f(param[i]);
  param[i] = adamw_element<T>(grad[i], m, v, w, master != nullptr, i, c);
  m_state[i] = m;
  v_state[i] = v;
  if (master) master[i] = w;
}

// kVec elements per thread with one 16-byte access per fp32 array (8 bytes for bf16
// params): every array 16-byte aligned. The last n % kVec elements go one by one.
constexpr int kVec = 4;
template <class T>
struct alignas(kVec * sizeof(T)) VecT {
  T v[kVec];
};

template <class T>
__global__ void adamw_vec_kernel(T* __restrict__ param, float* __restrict__ master,
                                 const float* __restrict__ grad, float* __restrict__ m_state,
                                 float* __restrict__ v_state, int64_t n, AdamWConsts c) {
  const int64_t i0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (i0 >= n) return;
  const bool has_master = master != nullptr;
  if (i0 + kVec <= n) {
    float4 g = *reinterpret_cast<const float4*>(grad + i0);
    float4 m = *reinterpret_cast<const float4*>(m_state + i0);
    float4 v = *reinterpret_cast<const float4*>(v_state + i0);
    VecT<T> p;
    float4 w;
    if (has_master) {
      w = *reinterpret_cast<const float4*>(master + i0);
    } else {
      p = *reinterpret_cast<const VecT<T>*>(param + i0);
      w = make_float4(to_f(p.v[0]), to_f(p.v[1]), to_f(p.v[2]), to_f(p.v[3]));
    }
    p.v[0] = adamw_element<T>(g.x, m.x, v.x, w.x, has_master, i0 + 0, c);
    p.v[1] = adamw_element<T>(g.y, m.y, v.y, w.y, has_master, i0 + 1, c);
    p.v[2] = adamw_element<T>(g.z, m.z, v.z, w.z, has_master, i0 + 2, c);
    p.v[3] = adamw_element<T>(g.w, m.w, v.w, w.w, has_master, i0 + 3, c);
    *reinterpret_cast<VecT<T>*>(param + i0) = p;
    *reinterpret_cast<float4*>(m_state + i0) = m;
    *reinterpret_cast<float4*>(v_state + i0) = v;
    if (has_master) *reinterpret_cast<float4*>(master + i0) = w;
    return;
  }
  for (int64_t i = i0; i < n; ++i) {
    float m = m_state[i], v = v_state[i];
    float w = has_master ? master[i] : to_f(param[i]);
    param[i] = adamw_element<T>(grad[i], m, v, w, has_master, i, c);
    m_state[i] = m;
    v_state[i] = v;
    if (has_master) master[i] = w;
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
  AdamWConsts c{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale,
                1.f - std::pow(a.beta1, float(a.step)), 1.f - std::pow(a.beta2, float(a.step)),
                a.seed, a.index0};
  float* master = a.master.defined() ? a.master.as<float>() : nullptr;
  const bool vec = adamw_vectorized(a);
  FG_DISPATCH_FLOAT(a.param.dtype, T, {
    if (vec)
      adamw_vec_kernel<T><<<unsigned(ceil_div(n, kThreads * kVec)), kThreads, 0, stream>>>(
          a.param.as<T>(), master, a.grad.as<float>(), a.m.as<float>(), a.v.as<float>(), n, c);
    else
      adamw_kernel<T><<<unsigned(ceil_div(n, kThreads)), kThreads, 0, stream>>>(
          a.param.as<T>(), master, a.grad.as<float>(), a.m.as<float>(), a.v.as<float>(), n, c);
    CUDA_CHECK_LAUNCH();
  });
}

bool adamw_vectorized(const AdamWArgs& a) {
  return aligned16(a.param.data) && aligned16(a.grad.data) && aligned16(a.m.data) &&
         aligned16(a.v.data) && (!a.master.defined() || aligned16(a.master.data));
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
