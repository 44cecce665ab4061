// Naive attention (AttentionAlgo::naive): S and P are materialised, (B, H, T, T) each
// batch, to show what FlashAttention avoids and to test it against. Per batch b, the
// H heads are one strided-batched cuBLAS GEMM (head h of Q, K, V starts h·D columns
// into the qkv row; stride between heads D, between rows 3·H·D):
//   forward:  S = Q·Kᵀ (into probs);  P = softmax(scale·S) with the causal mask, in place,
//             lse = log Σ exp(scale·S);  O = P·V
//   backward: dV = Pᵀ·dO;  dP = dO·Vᵀ (scratch);  dS = P∘(dP − rowsum(P∘dP)) (in place);
//             dQ = scale·dS·K;  dK = scale·dSᵀ·Q
// Column-major view (cuBLAS): a row-major (T, D) block with row stride ld is a
// column-major (D, T) matrix with leading dimension ld. So with Xᶜ = Xᵀ:
//   Sᶜ(Tk,Tq) = Kᶜᵀ·Qᶜ;  Oᶜ(D,Tq) = Vᶜ·Pᶜ;  dVᶜ(D,Tk) = dOᶜ·Pᶜᵀ;  dPᶜ(Tk,Tq) = Vᶜᵀ·dOᶜ;
//   dQᶜ(D,Tq) = Kᶜ·dSᶜ;  dKᶜ(D,Tk) = Qᶜ·dSᶜᵀ.
#include <cmath>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "src/cuda/device_context.h"

namespace flashgpt::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// ---------------------------------------------------------------- kernels

// One warp per row (b, h, i) of P (T columns). Causal: columns j > i are 0.
template <class T>
__global__ void softmax_rows_kernel(T* __restrict__ probs, float* __restrict__ lse, int64_t rows,
                                    int T_len, float scale, bool causal) {
  int lane = threadIdx.x % kWarpSize;
  int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  int i = int(row % T_len);
  int valid = causal ? i + 1 : T_len;
  T* p = probs + row * T_len;
  float m = -INFINITY;
  for (int j = lane; j < valid; j += kWarpSize) m = fmaxf(m, scale * to_f(p[j]));
  m = warp_max(m);
  float s = 0.f;
  for (int j = lane; j < valid; j += kWarpSize) s += expf(scale * to_f(p[j]) - m);
  s = warp_sum(s);
  float inv = 1.f / s;
  for (int j = lane; j < T_len; j += kWarpSize)
    p[j] = from_f<T>(j < valid ? expf(scale * to_f(p[j]) - m) * inv : 0.f);
  if (lane == 0) lse[row] = m + logf(s);
}

// dS = P ∘ (dP − Σ_j P∘dP), written over dP. One warp per row.
template <class T>
__global__ void softmax_rows_backward_kernel(T* __restrict__ dp, const T* __restrict__ probs,
                                             int64_t rows, int T_len) {
  int lane = threadIdx.x % kWarpSize;
  int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const T* p = probs + row * T_len;
  T* d = dp + row * T_len;
  float dot = 0.f;
  for (int j = lane; j < T_len; j += kWarpSize) dot += to_f(p[j]) * to_f(d[j]);
  dot = warp_sum(dot);
  for (int j = lane; j < T_len; j += kWarpSize) d[j] = from_f<T>(to_f(p[j]) * (to_f(d[j]) - dot));
}

// ---------------------------------------------------------------- helpers

// C (m,n) = alpha·op(A)·op(B), H batches with the given strides (column-major).
void gemm_batched(DeviceContext& ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                  int k, float alpha, const void* A, int lda, int64_t sA, const void* B, int ldb,
                  int64_t sB, void* C, int ldc, int64_t sC, int batch, DType dtype) {
  cudaDataType_t t = dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  float beta = 0.f;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(ctx.cublas(), ta, tb, m, n, k, &alpha, A, t, lda, sA, B,
                                          t, ldb, sB, &beta, C, t, ldc, sC, batch,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void check_args(const Tensor& qkv, const Tensor& probs, int B, int T_len, int H, int D) {
  FG_ASSERT(B > 0 && T_len > 0 && H > 0 && D > 0, "attention sizes");
  FG_ASSERT(qkv.numel() == int64_t(B) * T_len * 3 * H * D, "qkv must be (B,T,3,H,D)");
  FG_ASSERT(probs.defined() && probs.numel() == int64_t(B) * H * T_len * T_len &&
                probs.dtype == qkv.dtype, "naive attention needs probs (B,H,T,T) of the activation dtype");
}

}  // namespace

// ---------------------------------------------------------------- launchers

void attention_naive_forward(const AttentionForward& a, DeviceContext& ctx, cudaStream_t stream) {
  const int B = a.B, T_len = a.T, H = a.H, D = a.D;
  check_args(a.qkv, a.probs, B, T_len, H, D);
  FG_ASSERT(a.out.numel() == int64_t(B) * T_len * H * D && a.out.dtype == a.qkv.dtype, "out (B,T,H,D)");
  FG_ASSERT(a.lse.dtype == DType::f32 && a.lse.numel() == int64_t(B) * H * T_len, "lse (B,H,T) fp32");
  CUBLAS_CHECK(cublasSetStream(ctx.cublas(), stream));
  size_t es = dtype_size(a.qkv.dtype);
  int ld_qkv = 3 * H * D, ld_o = H * D;
  float scale = 1.f / std::sqrt(float(D));
  for (int b = 0; b < B; ++b) {
    const char* q = static_cast<const char*>(a.qkv.data) + size_t(b) * T_len * ld_qkv * es;
    const char* k = q + size_t(H) * D * es;
    const char* v = q + size_t(2) * H * D * es;
    char* p = static_cast<char*>(a.probs.data) + size_t(b) * H * T_len * T_len * es;
    char* o = static_cast<char*>(a.out.data) + size_t(b) * T_len * ld_o * es;
    gemm_batched(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T_len, T_len, D, 1.f, k, ld_qkv, D, q, ld_qkv, D, p,
                 T_len, int64_t(T_len) * T_len, H, a.qkv.dtype);
    int64_t rows = int64_t(H) * T_len;
    float* lse = a.lse.as<float>() + int64_t(b) * H * T_len;
    FG_DISPATCH_FLOAT(a.qkv.dtype, T, {
      softmax_rows_kernel<T><<<unsigned(ceil_div(rows, kWarpsPerBlock)), kWarpsPerBlock * kWarpSize,
                               0, stream>>>(reinterpret_cast<T*>(p), lse, rows, T_len, scale, a.causal);
      CUDA_CHECK_LAUNCH();
    });
    gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_N, D, T_len, T_len, 1.f, v, ld_qkv, D, p, T_len,
                 int64_t(T_len) * T_len, o, ld_o, D, H, a.qkv.dtype);
  }
}

size_t attention_naive_scratch_bytes(int H, int T, DType dtype) {
  return size_t(H) * T * T * dtype_size(dtype);
}

void attention_naive_backward(const AttentionBackward& a, DeviceContext& ctx, void* scratch,
                              cudaStream_t stream) {
  const int B = a.B, T_len = a.T, H = a.H, D = a.D;
  check_args(a.qkv, a.probs, B, T_len, H, D);
  FG_ASSERT(a.dqkv.numel() == a.qkv.numel() && a.dqkv.dtype == a.qkv.dtype, "dqkv (B,T,3,H,D)");
  FG_ASSERT(a.dout.numel() == int64_t(B) * T_len * H * D && a.dout.dtype == a.qkv.dtype, "dout (B,T,H,D)");
  CUBLAS_CHECK(cublasSetStream(ctx.cublas(), stream));
  size_t es = dtype_size(a.qkv.dtype);
  int ld_qkv = 3 * H * D, ld_o = H * D;
  int64_t sP = int64_t(T_len) * T_len;
  float scale = 1.f / std::sqrt(float(D));
  for (int b = 0; b < B; ++b) {
    size_t row0 = size_t(b) * T_len * ld_qkv * es;
    const char* q = static_cast<const char*>(a.qkv.data) + row0;
    const char* k = q + size_t(H) * D * es;
    const char* v = q + size_t(2) * H * D * es;
    char* dq = static_cast<char*>(a.dqkv.data) + row0;
    char* dk = dq + size_t(H) * D * es;
    char* dv = dq + size_t(2) * H * D * es;
    const char* p = static_cast<const char*>(a.probs.data) + size_t(b) * H * sP * es;
    const char* dout = static_cast<const char*>(a.dout.data) + size_t(b) * T_len * ld_o * es;
    char* ds = static_cast<char*>(scratch);
    // dVᶜ(D,Tk) = dOᶜ(D,Tq) · Pᶜ(Tk,Tq)ᵀ
    gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_T, D, T_len, T_len, 1.f, dout, ld_o, D, p, T_len, sP,
                 dv, ld_qkv, D, H, a.qkv.dtype);
    // dPᶜ(Tk,Tq) = Vᶜ(D,Tk)ᵀ · dOᶜ(D,Tq)
    gemm_batched(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T_len, T_len, D, 1.f, v, ld_qkv, D, dout, ld_o, D,
                 ds, T_len, sP, H, a.qkv.dtype);
    int64_t rows = int64_t(H) * T_len;
    FG_DISPATCH_FLOAT(a.qkv.dtype, T, {
      softmax_rows_backward_kernel<T><<<unsigned(ceil_div(rows, kWarpsPerBlock)),
                                        kWarpsPerBlock * kWarpSize, 0, stream>>>(
          reinterpret_cast<T*>(ds), reinterpret_cast<const T*>(p), rows, T_len);
      CUDA_CHECK_LAUNCH();
    });
    // dQᶜ(D,Tq) = scale · Kᶜ(D,Tk) · dSᶜ(Tk,Tq)
    gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_N, D, T_len, T_len, scale, k, ld_qkv, D, ds, T_len, sP,
                 dq, ld_qkv, D, H, a.qkv.dtype);
    // dKᶜ(D,Tk) = scale · Qᶜ(D,Tq) · dSᶜ(Tk,Tq)ᵀ
    gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_T, D, T_len, T_len, scale, q, ld_qkv, D, ds, T_len, sP,
                 dk, ld_qkv, D, H, a.qkv.dtype);
  }
}

}  // namespace flashgpt::cuda
