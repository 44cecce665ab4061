// The op set: everything the GPT-2 model (layers/) computes goes through this
// interface. Two implementations:
//   kernels/cpu/   plain loops, fp32 and fp64 - the reference and the CPU trainer
//   kernels/cuda/  bf16 (fp32 accumulation) and fp32 - the fast path
// Granularity is what the GPU wants: fused residual+layernorm, matmul with bias and
// GELU epilogue, attention returning O and logsumexp, fused softmax+cross-entropy.
//
// Conventions (every implementation follows them):
//  * Tensors are contiguous, row-major; shapes are in the comments.
//  * Activations and parameters have the "activation dtype" of the run (fp64/fp32 on
//    the CPU, bf16/fp32 on CUDA). Parameter *gradients* are fp32 when activations are
//    bf16 (otherwise the same dtype as the activations): see GradDType().
//  * "overwrites" means the output is written; "accumulates" means +=. Parameter
//    gradients always accumulate (gradient accumulation over micro-batches); which
//    activation gradients accumulate is said per op.
//  * A matmul weight has the PyTorch nn.Linear layout (OC, C): out = inp · Wᵀ + b.
#pragma once
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>
#include "../src/tensor.h"

namespace flashgpt {

// Parameter-gradient dtype for a given activation dtype.
inline DType GradDType(DType act) { return act == DType::bf16 ? DType::f32 : act; }

enum class AttentionAlgo { flash, naive };

// Rotary position embedding (RoPE, "rotate half" pairing): in each head of q and k,
// element i < D/2 and element i + D/2 of position t are rotated by the angle t·θ_i,
// θ_i = kRopeBase^(−2i/D). Every backend takes θ_i from this function (fp64), so the
// angles agree bit for bit; t·θ_i and its sine and cosine are computed in fp64 too
// (at t = 10^6 an fp32 angle would be off by ~0.03 rad).
constexpr double kRopeBase = 10000.0;
inline double rope_inv_freq(int i, int D) { return std::pow(kRopeBase, -2.0 * i / D); }

struct MatmulForward {
  Tensor out;      // (N, OC)   overwritten: inp·Wᵀ + b, then GELU if gelu
  Tensor inp;      // (N, C)
  Tensor weight;   // (OC, C)
  Tensor bias;     // (OC) or undefined
  bool gelu = false;
  Tensor pre_gelu; // (N, OC)   if gelu: overwritten with the pre-activation (saved for backward)
};

struct MatmulBackward {
  Tensor dinp;     // (N, C)    overwritten (undefined: not computed)
  Tensor dweight;  // (OC, C)   accumulates  (grad dtype)
  Tensor dbias;    // (OC)      accumulates  (grad dtype; undefined: no bias)
  Tensor dout;     // (N, OC)   gradient w.r.t. the matmul output (after GELU if gelu)
  Tensor inp;      // (N, C)
  Tensor weight;   // (OC, C)
  // If defined (N, C): this matmul's input was inp = GELU(dinp_gelu_pre), and dinp is
  // written as d(dinp_gelu_pre) = (dout·W) ∘ GELU'(dinp_gelu_pre) instead of dout·W.
  // This fuses the GELU backward into the matmul epilogue (cuBLASLt DGELU): the MLP's
  // c_proj backward uses it to hand c_fc the gradient of its pre-activation.
  Tensor dinp_gelu_pre;
};

struct AttentionForward {
  Tensor out;      // (B, T, H, D) overwritten
  Tensor lse;      // (B, H, T)    fp32, overwritten: logsumexp of each row of scaled scores
  Tensor qkv;      // (B, T, 3, H, D) as (B, T, 3*H*D)
  int B = 0, T = 0, H = 0, D = 0;
  bool causal = true;
  AttentionAlgo algo = AttentionAlgo::flash;
  Tensor probs;    // naive only: (B, H, T, T) overwritten with P, kept for backward
};

struct AttentionBackward {
  Tensor dqkv;     // (B, T, 3*H*D) overwritten
  Tensor dout;     // (B, T, H, D)
  Tensor qkv;      // (B, T, 3*H*D)
  Tensor out;      // (B, T, H, D)  forward output
  Tensor lse;      // (B, H, T)     fp32 from forward
  Tensor delta;    // (B, H, T)     fp32 scratch: D = rowsum(dO ∘ O)
  int B = 0, T = 0, H = 0, D = 0;
  bool causal = true;
  AttentionAlgo algo = AttentionAlgo::flash;
  Tensor probs;    // naive only: (B, H, T, T) from forward
};

// Decoding: one new token per sequence attends to a KV cache (causal by construction:
// the cache holds exactly the positions before it, and its own key). B sequences move in
// lock-step, so every sequence attends to the same number T of cached positions.
struct AttentionDecode {
  Tensor out;      // (B, H*D)        overwritten: the new token's output ((B,1,H,D))
  Tensor lse;      // (B, H)          fp32 (fp64 in fp64 runs), overwritten; undefined: not written
  Tensor qkv;      // (B, 3*H*D)      the new token's q, k, v ((B,1,3,H,D)); q is read
  Tensor k_cache;  // (B, H, Tmax, D) keys of positions [0, T) are read
  Tensor v_cache;  // (B, H, Tmax, D) values of positions [0, T) are read
  int B = 0, H = 0, D = 0;
  int T = 0;       // positions attended to, the new token's own included: 1 <= T <= Tmax
  // Positions [0, settled) of the caches are not written by the kernel queued just before
  // this call on its stream (the model: settled = T - 1, the position kv_cache_write just
  // filled is T - 1). The Hopper kernels may load them while that kernel still runs
  // (programmatic dependent launch); everything else they read after it has finished.
  // 0: nothing early. Clamped to [0, T]; the CPU ignores it.
  int settled = 0;
};

// Appends n tokens' keys and values to a KV cache.
struct KVCacheWrite {
  Tensor k_cache;  // (B, H, Tmax, D) positions [pos, pos+n) overwritten with k
  Tensor v_cache;  // (B, H, Tmax, D) positions [pos, pos+n) overwritten with v
  Tensor qkv;      // (B, n, 3*H*D)   as (B*n, 3*H*D): k and v of the n new tokens are read
  int B = 0, n = 0, H = 0, D = 0;
  int pos = 0;     // cache position of the first new token; pos + n <= Tmax
};

// A run of elements of one AdamW call that belong to one parameter (see AdamWArgs::segments).
struct AdamWSegment {
  int64_t begin = 0;    // first element, counted from the start of the call's tensors
  bool decay = false;   // takes the call's weight_decay (false: none)
  uint64_t index0 = 0;  // stochastic-rounding index of element `begin`
};

struct AdamWArgs {
  Tensor param;    // (n) activation dtype: the weights the model reads; overwritten
  Tensor master;   // (n) fp32 master copy, or undefined when param is already fp32/fp64
  Tensor grad;     // (n) grad dtype
  Tensor m, v;     // (n) fp32 (fp64 when param is fp64) optimizer state
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  float grad_scale = 1;  // grads are multiplied by this first (clipping)
  int step = 1;          // 1-based, for bias correction
  uint32_t seed = 0;     // stochastic rounding when writing bf16 params: element i hashes
  uint64_t index0 = 0;   // (seed, index0 + i), so any split of an update rounds the same
  // Several parameters in one call (the optimizer updates a whole arena range with one
  // launch): segment s covers [segments[s].begin, segments[s+1].begin) (the last: to n),
  // with weight decay only where `decay`, and rounding index index0 + (i − begin) of its own.
  // Empty: one segment, [0, n) with weight_decay and index0 above. Begins ascend from 0.
  std::vector<AdamWSegment> segments;
};

// The segments of an AdamW call made explicit (one when AdamWArgs::segments is empty), each
// with its end; checks that they ascend from 0 and stay inside [0, n).
struct AdamWSpan {
  int64_t begin, end;
  float weight_decay;
  uint64_t index0;
};
inline std::vector<AdamWSpan> adamw_spans(const AdamWArgs& a) {
  const int64_t n = a.param.numel();
  if (a.segments.empty()) return {{0, n, a.weight_decay, a.index0}};
  std::vector<AdamWSpan> spans;
  for (size_t s = 0; s < a.segments.size(); ++s) {
    const AdamWSegment& g = a.segments[s];
    const int64_t end = s + 1 < a.segments.size() ? a.segments[s + 1].begin : n;
    FG_ASSERT((s == 0 ? g.begin == 0 : g.begin > a.segments[s - 1].begin) && end <= n && g.begin < end,
              "AdamW segments must ascend from 0 inside the call's ", n, " elements");
    spans.push_back({g.begin, end, g.decay ? a.weight_decay : 0.f, g.index0});
  }
  return spans;
}

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  // ---- memory ----
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual void memset_zero(Tensor t) = 0;
  virtual void to_host(void* dst, const Tensor& src) = 0;     // blocking copy
  virtual void from_host(const Tensor& dst, const void* src) = 0;
  virtual void synchronize() = 0;
  // Page-locked host memory (plain host memory on the CPU), for uploads that overlap
  // with compute.
  virtual void* alloc_host(size_t bytes) { return std::malloc(bytes); }
  virtual void free_host(void* p) { std::free(p); }
  // Like from_host but may return before the copy is done: src must come from
  // alloc_host and must not change until the next synchronize() or to_host().
  virtual void from_host_async(const Tensor& dst, const void* src) { from_host(dst, src); }
  // dst = src converted to dst.dtype (same numel; dtypes among f32, f64, bf16).
  virtual void cast(Tensor dst, Tensor src) = 0;

  // ---- embedding ----
  // out (B,T,C) = wte[tokens] + wpe[t]; tokens (B,T) int32 on this device. Overwrites.
  // wpe undefined (rotary positions): out = wte[tokens].
  virtual void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) = 0;
  // dwte, dwpe accumulate (dwpe undefined: no position table). Deterministic (no float
  // atomics).
  virtual void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) = 0;

  // ---- rotary position embedding (see kRopeBase), in place ----
  // qkv (B·T, 3·H·D): q and k of row b·T + t, at position p = pos0 + t, are rotated by
  // +p·θ (inverse: by −p·θ, which is the backward: the gradient of q, k from that of the
  // rotated q, k); v is untouched. pos0 > 0: the rows of a decode step after the cache.
  virtual void rope(Tensor qkv, int T, int H, bool inverse, int64_t pos0) = 0;

  // ---- layernorm (eps 1e-5) ----
  // out (N,C) = LN(inp)·w + b; mean, rstd (N) fp32 saved (fp64 in fp64 runs). Overwrites.
  virtual void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp,
                                 Tensor weight, Tensor bias) = 0;
  // residual (N,C) = inp1 + inp2 (overwritten), then out = LN(residual) as above.
  virtual void residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean,
                                          Tensor rstd, Tensor inp1, Tensor inp2,
                                          Tensor weight, Tensor bias) = 0;
  // dinp (N,C) accumulates; dweight, dbias (C) accumulate.
  virtual void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout,
                                  Tensor inp, Tensor weight, Tensor mean, Tensor rstd) = 0;

  // ---- matmul ----
  virtual void matmul_forward(const MatmulForward& a) = 0;
  virtual void matmul_backward(const MatmulBackward& a) = 0;

  // ---- GELU (tanh approximation), elementwise ----
  virtual void gelu_forward(Tensor out, Tensor inp) = 0;                 // overwrites
  virtual void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) = 0;  // overwrites

  // ---- attention, scale 1/sqrt(D) ----
  virtual void attention_forward(const AttentionForward& a) = 0;
  virtual void attention_backward(const AttentionBackward& a) = 0;

  // ---- decoding with a KV cache (inference only, no backward) ----
  // out = softmax(q·K[0,T)ᵀ·scale)·V[0,T) for each (b, h); see AttentionDecode.
  virtual void attention_decode(const AttentionDecode& a) = 0;
  virtual void kv_cache_write(const KVCacheWrite& a) = 0;

  // ---- fused softmax + cross-entropy over a padded vocabulary ----
  // logits (N, Vp): columns >= V are padding and ignored. For each row n:
  //   losses[n] = logsumexp(logits[n, :V]) - logits[n, targets[n]]   (overwritten;
  //               fp32, or fp64 in fp64 runs: the losses tensor's dtype says which)
  //   if dloss != 0: logits[n, :] overwritten with dloss·(softmax - onehot), 0 in padding.
  // targets (N) int32; a target < 0 means "ignore": loss 0, dlogits 0.
  // Probabilities are never stored.
  virtual void softmax_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int V,
                                     float dloss) = 0;

  // ---- optimizer ----
  virtual void adamw_update(const AdamWArgs& a) = 0;
  // Sum of squares of grad (any length), added into the fp32 scalar *out (on this
  // device, as a (1) tensor; fp64 for fp64 grads). Deterministic.
  virtual void sum_squares(Tensor out, Tensor grad) = 0;
  // x *= s, elementwise (used for gradient scaling when not fused).
  virtual void scale(Tensor x, float s) = 0;
};

std::unique_ptr<Ops> make_cpu_ops();
#ifdef FLASHGPT_WITH_CUDA
class DeviceContext;
// tune_gemms: time cuBLASLt's candidate algorithms in place during each GEMM shape's first
// calls and keep the fastest (kernels/cuda/matmul.cu); the choice depends on timings, so
// it is for training runs, not for tests that compare bits.
std::unique_ptr<Ops> make_cuda_ops(DeviceContext& ctx, bool tune_gemms = false);
#endif

}  // namespace flashgpt
