// AdamW over fp32 master weights, and the deterministic global sum of squares used for
// gradient-norm clipping.
//   g = grad·grad_scale;  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//   w = w − lr·( m/(1−β1^t) / (√(v/(1−β2^t)) + ε) + wd·w )      (PyTorch AdamW)
// w is the fp32 master when there is one (bf16 runs): the bf16 parameter is then
// written from it with stochastic rounding (a hash of seed and the element's index in
// the packed parameter order, index0 + i), so the
// expected bf16 weight equals the master weight. fp32 runs update the parameter itself.
// One call updates many parameters (AdamWArgs::segments: each its own weight decay and
// rounding index), one launch per kMaxSegments of them.
// Two kernels, one element function: 4 elements per thread with 16-byte accesses when
// every array is 16-byte aligned (the optimizer's flat buffers always are), else one per
// thread; both give the same bits (CudaOps.AdamWVectorAndScalarKernelsAgreeBitwise).
// sum_squares: a fixed grid of kSumSqBlocks blocks (grid-stride) writes one partial per
// block, and one block adds them in order: the same bits on every run.
#include <algorithm>
#include <cmath>
#include <vector>
#include <type_traits>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace flashgpt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kSumSqBlocks = 1024;
constexpr int kSumSqThreads = 512;

// ---------------------------------------------------------------- kernels

// Up to kMaxSegments parameters per launch (a call with more is split into launches),
// passed by value (__grid_constant__: indexed in the parameter bank, never copied):
// segment s covers [begin[s], begin[s + 1]) of the launch's elements (the last ends at n),
// with weight decay wd[s] and rounding index index0[s] + (i − begin[s]).
constexpr int kMaxSegments = 128;
struct AdamWConsts {
  float lr, beta1, beta2, eps, grad_scale, bc1, bc2;
  uint32_t seed;
  int segments;
  int64_t begin[kMaxSegments];
  uint64_t index0[kMaxSegments];
  float wd[kMaxSegments];
};

// The segment of element i, searching forward from segment s (elements come in order).
__device__ __forceinline__ int segment_from(const AdamWConsts& c, int s, int64_t i) {
  while (s + 1 < c.segments && c.begin[s + 1] <= i) ++s;
  return s;
}
// The segment of element i: binary search.
__device__ __forceinline__ int segment_of(const AdamWConsts& c, int64_t i) {
  int lo = 0, hi = c.segments - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (c.begin[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// One element i of segment s: updates m, v and the master weight w, and returns the
// parameter to store. Both kernels below go through this function: the same bits.
template <class T>
__device__ __forceinline__ T adamw_element(float g, float& m, float& v, float& w, bool has_master,
                                           int64_t i, int s, const AdamWConsts& c) {
  g *= c.grad_scale;
  m = c.beta1 * m + (1.f - c.beta1) * g;
  v = c.beta2 * v + (1.f - c.beta2) * g * g;
  w -= c.lr * ((m / c.bc1) / (sqrtf(v / c.bc2) + c.eps) + c.wd[s] * w);
  if constexpr (std::is_same_v<T, bf16>)
    if (has_master) return bf16_stochastic(w, c.seed, uint32_t(c.index0[s] + uint64_t(i - c.begin[s])));
  return from_f<T>(w);
}

// One element per thread: any alignment.
template <class T>
__global__ void adamw_kernel(T* __restrict__ param, float* __restrict__ master,
                             const float* __restrict__ grad, float* __restrict__ m_state,
                             float* __restrict__ v_state, int64_t n, const __grid_constant__ AdamWConsts c) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float m = m_state[i], v = v_state[i];
  float w = master ? master[i] : to_f(param[i]);
  param[i] = adamw_element<T>(grad[i], m, v, w, master != nullptr, i, segment_of(c, i), c);
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
                                 float* __restrict__ v_state, int64_t n, const __grid_constant__ AdamWConsts c) {
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
    int sg = segment_of(c, i0);
    p.v[0] = adamw_element<T>(g.x, m.x, v.x, w.x, has_master, i0 + 0, sg, c);
    sg = segment_from(c, sg, i0 + 1);
    p.v[1] = adamw_element<T>(g.y, m.y, v.y, w.y, has_master, i0 + 1, sg, c);
    sg = segment_from(c, sg, i0 + 2);
    p.v[2] = adamw_element<T>(g.z, m.z, v.z, w.z, has_master, i0 + 2, sg, c);
    sg = segment_from(c, sg, i0 + 3);
    p.v[3] = adamw_element<T>(g.w, m.w, v.w, w.w, has_master, i0 + 3, sg, c);
    *reinterpret_cast<VecT<T>*>(param + i0) = p;
    *reinterpret_cast<float4*>(m_state + i0) = m;
    *reinterpret_cast<float4*>(v_state + i0) = v;
    if (has_master) *reinterpret_cast<float4*>(master + i0) = w;
    return;
  }
  for (int64_t i = i0; i < n; ++i) {
    float m = m_state[i], v = v_state[i];
    float w = has_master ? master[i] : to_f(param[i]);
    param[i] = adamw_element<T>(grad[i], m, v, w, has_master, i, segment_of(c, i), c);
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
  AdamWConsts c{};
  c.lr = a.lr; c.beta1 = a.beta1; c.beta2 = a.beta2; c.eps = a.eps; c.grad_scale = a.grad_scale;
  c.bc1 = 1.f - std::pow(a.beta1, float(a.step));
  c.bc2 = 1.f - std::pow(a.beta2, float(a.step));
  c.seed = a.seed;
  const bool vec = adamw_vectorized(a);
  const std::vector<AdamWSpan> spans = adamw_spans(a);
  // One launch per kMaxSegments segments, over the elements they cover; a launch whose first
  // element is not 16-byte aligned takes the one-element kernel.
  for (size_t s0 = 0; s0 < spans.size(); s0 += kMaxSegments) {
    const size_t s1 = std::min(spans.size(), s0 + kMaxSegments);
    const int64_t lo = spans[s0].begin, hi = spans[s1 - 1].end;
    c.segments = int(s1 - s0);
    for (size_t s = s0; s < s1; ++s) {
      c.begin[s - s0] = spans[s].begin - lo;
      c.index0[s - s0] = spans[s].index0;
      c.wd[s - s0] = spans[s].weight_decay;
    }
    const int64_t len = hi - lo;
    float* master = a.master.defined() ? a.master.as<float>() + lo : nullptr;
    const bool aligned = vec && lo % kVec == 0;
    FG_DISPATCH_FLOAT(a.param.dtype, T, {
      if (aligned)
        adamw_vec_kernel<T><<<unsigned(ceil_div(len, kThreads * kVec)), kThreads, 0, stream>>>(
            a.param.as<T>() + lo, master, a.grad.as<float>() + lo, a.m.as<float>() + lo,
            a.v.as<float>() + lo, len, c);
      else
        adamw_kernel<T><<<unsigned(ceil_div(len, kThreads)), kThreads, 0, stream>>>(
            a.param.as<T>() + lo, master, a.grad.as<float>() + lo, a.m.as<float>() + lo,
            a.v.as<float>() + lo, len, c);
      CUDA_CHECK_LAUNCH();
    });
  }
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
