// Host-side launchers of the CUDA op set (kernels/cuda/*.cu). cuda_ops.cu wires them
// into the Ops interface; tests and benchmarks may call them directly.
// Every launcher asserts its preconditions, takes an explicit stream and checks the
// launch. Activations are fp32 or bf16 (the kernels compute in fp32); parameter
// gradients are always fp32 on CUDA (GradDType). Launchers that reduce across rows do
// it deterministically, through `scratch` (device memory, *_scratch_bytes() bytes).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <string>
#include <unordered_map>
#include "kernels/ops.h"

namespace flashgpt {
class DeviceContext;
}

namespace flashgpt::cuda {

// ---- embedding.cu ----
// out (N=B·T, C) = wte[tokens] + wpe[t] (wpe undefined: no position term). Overwrites.
void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, cudaStream_t stream);
size_t embedding_backward_scratch_bytes(int64_t n_tokens, int64_t vocab_rows);
// dwte (Vp, C), dwpe (maxT, C; undefined: none) fp32 accumulate; deterministic: tokens are radix-sorted
// (stable) and one thread block per distinct token sums its rows in order.
void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, void* scratch,
                        size_t scratch_bytes, cudaStream_t stream);

// ---- rope.cu ----
// In place: q, k of row b·T + t rotated by +t·θ (inverse: −t·θ); see ops.h.
void rope(Tensor qkv, int T_len, int H, bool inverse, int64_t pos0, cudaStream_t stream);

// ---- layernorm.cu ----
// out = LN(x)·w + b with x = inp1 (residual undefined, inp2 undefined) or
// x = residual = inp1 + inp2 (residual overwritten). mean, rstd (N) fp32 overwritten.
void layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd, Tensor inp1,
                       Tensor inp2, Tensor weight, Tensor bias, cudaStream_t stream);
size_t layernorm_backward_scratch_bytes(int64_t N, int64_t C);
// dinp (N,C) accumulates; dweight, dbias (C) fp32 accumulate.
void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                        Tensor weight, Tensor mean, Tensor rstd, void* scratch,
                        cudaStream_t stream);

// ---- gelu.cu (tanh approximation) ----
void gelu_forward(Tensor out, Tensor inp, cudaStream_t stream);                 // overwrites
// dinp = dout · GELU'(inp); dinp may alias dout (in place).
void gelu_backward(Tensor dinp, Tensor inp, Tensor dout, cudaStream_t stream);  // overwrites

// ---- bias_grad.cu ----
size_t bias_grad_scratch_bytes(int64_t N, int64_t OC);
// dbias (OC) fp32 += column sums of dout (N, OC).
void bias_grad(Tensor dbias, Tensor dout, void* scratch, cudaStream_t stream);

// ---- cross_entropy.cu ----
void softmax_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int V, float dloss,
                           cudaStream_t stream);

// ---- adamw.cu ----
void adamw_update(const AdamWArgs& a, cudaStream_t stream);
// Whether adamw_update takes the 4-elements-per-thread kernel (every array 16-byte aligned).
bool adamw_vectorized(const AdamWArgs& a);
size_t sum_squares_scratch_bytes();
void sum_squares(Tensor out, Tensor grad, void* scratch, cudaStream_t stream);

// ---- elementwise.cu ----
void cast(Tensor dst, Tensor src, cudaStream_t stream);
void scale(Tensor x, float s, cudaStream_t stream);

// ---- matmul.cu: cuBLASLt with cached descriptors and algorithms ----
// dgelu: D = (A·B) ∘ GELU'(aux), the backward through a GELU whose output was the input.
enum class Epilogue { none, bias, gelu_aux, gelu_aux_bias, dgelu };

// One column-major GEMM  D (m,n) = alpha·op(A)·op(B) + beta·D  [+ epilogue].
struct Gemm {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  const void* A = nullptr; int lda = 0; DType a_type = DType::f32;
  const void* B = nullptr; int ldb = 0; DType b_type = DType::f32;
  void* D = nullptr; int ldd = 0; DType d_type = DType::f32;
  float alpha = 1.f, beta = 0.f;  // beta != 0: D is also the C input (accumulation)
  Epilogue epilogue = Epilogue::none;
  const void* bias = nullptr;     // (m) of d_type, for bias epilogues
  void* aux = nullptr;            // (m, n) ld = m, of d_type, for gelu_aux and dgelu
};

// Algorithm choice: cuBLASLt's first heuristic candidate; or, with tuning on (training
// in bf16, Matmul::tune), the fastest of its first candidates as timed inside the run
// itself: a new shape's first calls cycle through them, each call timed by CUDA events
// on the real operands in its place in the step, and once every candidate has been
// timed the one with the lowest median is kept (matmul.cu, Matmul::Tuning).
class Matmul {
 public:
  explicit Matmul(DeviceContext& ctx);
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // Row-major op contract of kernels/ops.h, mapped onto column-major cuBLASLt.
  void forward(const MatmulForward& a, cudaStream_t stream);
  void backward(const MatmulBackward& a, void* scratch, cudaStream_t stream);
  // Returns false (without running) only when allow_fail and no algorithm exists.
  bool run(const Gemm& g, cudaStream_t stream, bool allow_fail = false);
  size_t cached_plans() const { return plans_.size(); }
  // Tuning for the plans made from now on (bf16 GEMMs only; fp32 is the exact mode).
  void tune(bool on) { tune_ = on; }
  // Plans whose tuning is still running.
  size_t plans_tuning() const;

 private:
  struct Plan;
  struct Tuning;
  DeviceContext& ctx_;
  bool tune_ = false;
  std::unordered_map<std::string, Plan*> plans_;  // key: shapes, types, epilogue, alignment
};

// ---- attention_naive.cu: S and P materialised (AttentionAlgo::naive) ----
// a.probs (B,H,T,T) overwritten with P; a.lse written. Uses ctx's cuBLAS handle.
void attention_naive_forward(const AttentionForward& a, DeviceContext& ctx, cudaStream_t stream);
size_t attention_naive_scratch_bytes(int H, int T, DType dtype);
void attention_naive_backward(const AttentionBackward& a, DeviceContext& ctx, void* scratch,
                              cudaStream_t stream);

// ---- attention_rowwise.cu: O(T) memory, one warp per row; fp32 flash path ----
void attention_rowwise_forward(const AttentionForward& a, cudaStream_t stream);
void attention_rowwise_backward(const AttentionBackward& a, cudaStream_t stream);

}  // namespace flashgpt::cuda
