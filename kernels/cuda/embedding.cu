// Token + position embedding, forward and backward.
//   forward:  out[n, :] = wte[tokens[n], :] + wpe[n % T, :]          (x128 packs)
//   backward: dwpe[t, :] += Σ_b dout[b, t, :]  (one thread per (t, pack), b in order)
//             dwte[v, :] += Σ_{n: tokens[n] = v} dout[n, :]
// The wte backward is deterministic without float atomics: the (token, position)
// pairs are radix-sorted by token (CUB, stable, so positions stay in increasing
// order), then one thread block per distinct token walks its run of the sorted list
// and adds the rows in that fixed order. Blocks that do not start a run exit at once.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace flashgpt::cuda {
namespace {

constexpr int kThreads = 256;

// ---------------------------------------------------------------- kernels

template <class T>
__global__ void embedding_forward_kernel(T* __restrict__ out, const int* __restrict__ tokens,
                                         const T* __restrict__ wte, const T* __restrict__ wpe,
                                         int64_t N, int T_len, int C) {
  constexpr int P = Pack<T>::N;
  int64_t packs_per_row = C / P;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * packs_per_row) return;
  int64_t n = i / packs_per_row;
  int c = int(i % packs_per_row) * P;
  int t = int(n % T_len);
  Pack<T> a = load_pack(wte + int64_t(tokens[n]) * C + c);
  Pack<T> r;
  if (wpe) {
    Pack<T> b = load_pack(wpe + int64_t(t) * C + c);
#pragma unroll
    for (int k = 0; k < P; ++k) r.v[k] = from_f<T>(to_f(a.v[k]) + to_f(b.v[k]));
  } else {
    r = a;  // rotary positions: no position table
  }
  store_pack(out + n * C + c, r);
}

// dwpe[t, c..c+P) += Σ_b dout[b, t, c..c+P)
template <class T>
__global__ void wpe_backward_kernel(float* __restrict__ dwpe, const T* __restrict__ dout,
                                    int B, int T_len, int C) {
  constexpr int P = Pack<T>::N;
  int64_t packs_per_row = C / P;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T_len * packs_per_row) return;
  int t = int(i / packs_per_row);
  int c = int(i % packs_per_row) * P;
  float acc[P] = {};
  for (int b = 0; b < B; ++b) {
    Pack<T> d = load_pack(dout + (int64_t(b) * T_len + t) * C + c);
#pragma unroll
    for (int k = 0; k < P; ++k) acc[k] += to_f(d.v[k]);
  }
  float* dst = dwpe + int64_t(t) * C + c;
#pragma unroll
  for (int k = 0; k < P; ++k) dst[k] += acc[k];
}

__global__ void iota_kernel(int* out, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = int(i);
}

// grid.x: positions of the sorted token list; grid.y × blockDim.x: packs of C.
template <class T>
__global__ void wte_backward_kernel(float* __restrict__ dwte, const T* __restrict__ dout,
                                    const int* __restrict__ sorted_tokens,
                                    const int* __restrict__ sorted_rows, int64_t N, int C) {
  constexpr int P = Pack<T>::N;
  int64_t s = blockIdx.x;
  int token = sorted_tokens[s];
  if (s > 0 && sorted_tokens[s - 1] == token) return;  // not the start of a run
  int c = (blockIdx.y * blockDim.x + threadIdx.x) * P;
  if (c >= C) return;
  float acc[P] = {};
  for (int64_t j = s; j < N && sorted_tokens[j] == token; ++j) {
    Pack<T> d = load_pack(dout + int64_t(sorted_rows[j]) * C + c);
#pragma unroll
    for (int k = 0; k < P; ++k) acc[k] += to_f(d.v[k]);
  }
  float* dst = dwte + int64_t(token) * C + c;
#pragma unroll
  for (int k = 0; k < P; ++k) dst[k] += acc[k];
}

// Scratch layout for the wte backward: keys_out, rows_in, rows_out (N ints each), then
// CUB's temporary storage.
struct SortScratch {
  int* keys_out;
  int* rows_in;
  int* rows_out;
  void* cub_temp;
  size_t cub_bytes;
};

size_t cub_sort_bytes(int64_t N, int end_bit) {
  size_t bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int*>(nullptr),
                                             static_cast<int*>(nullptr),
                                             static_cast<const int*>(nullptr),
                                             static_cast<int*>(nullptr), N, 0, end_bit));
  return bytes;
}

int bits_for(int64_t v) {
  int b = 1;
  while ((int64_t(1) << b) < v) ++b;
  return b;
}

size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

// ---------------------------------------------------------------- launchers

void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, cudaStream_t stream) {
  FG_ASSERT(tokens.dtype == DType::i32 && tokens.ndim == 2, "tokens must be (B,T) int32");
  int64_t N = tokens.numel();
  int T_len = int(tokens.shape[1]);
  int C = int(wte.shape[1]);
  const bool has_wpe = wpe.defined();
  FG_ASSERT(out.dtype == wte.dtype && (!has_wpe || wpe.dtype == wte.dtype), "embedding dtypes differ");
  FG_ASSERT(out.numel() == N * C, "out must be (B,T,C): ", out.shape_str());
  FG_ASSERT(!has_wpe || (wpe.shape[1] == C && wpe.shape[0] >= T_len), "wpe too small: ", wpe.shape_str());
  FG_ASSERT(aligned16(out.data) && aligned16(wte.data) && (!has_wpe || aligned16(wpe.data)),
            "embedding needs 16-byte aligned tensors");
  FG_DISPATCH_FLOAT(out.dtype, T, {
    FG_ASSERT(C % Pack<T>::N == 0, "C=", C, " must be a multiple of ", Pack<T>::N);
    int64_t work = N * (C / Pack<T>::N);
    embedding_forward_kernel<T><<<unsigned(ceil_div(work, kThreads)), kThreads, 0, stream>>>(
        out.as<T>(), tokens.as<int>(), wte.as<T>(), has_wpe ? wpe.as<T>() : nullptr, N, T_len, C);
    CUDA_CHECK_LAUNCH();
  });
}

size_t embedding_backward_scratch_bytes(int64_t n_tokens, int64_t vocab_rows) {
  return 3 * align_up(size_t(n_tokens) * sizeof(int)) +
         align_up(cub_sort_bytes(n_tokens, bits_for(vocab_rows)));
}

void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, void* scratch,
                        size_t scratch_bytes, cudaStream_t stream) {
  FG_ASSERT(tokens.dtype == DType::i32 && tokens.ndim == 2, "tokens must be (B,T) int32");
  int64_t N = tokens.numel();
  int B = int(tokens.shape[0]), T_len = int(tokens.shape[1]);
  int64_t Vp = dwte.shape[0];
  int C = int(dwte.shape[1]);
  const bool has_wpe = dwpe.defined();
  FG_ASSERT(dwte.dtype == DType::f32 && (!has_wpe || dwpe.dtype == DType::f32), "embedding grads are fp32");
  FG_ASSERT(dout.numel() == N * C, "dout must be (B,T,C): ", dout.shape_str());
  FG_ASSERT(!has_wpe || (dwpe.shape[1] == C && dwpe.shape[0] >= T_len), "dwpe too small");
  // The sort's row indices are int: N < 2^31 tokens per micro-batch.
  FG_ASSERT(N < (int64_t(1) << 31), "embedding backward takes fewer than 2^31 tokens, got ", N);
  FG_ASSERT(scratch_bytes >= embedding_backward_scratch_bytes(N, Vp), "scratch too small");
  FG_ASSERT(aligned16(dout.data), "dout must be 16-byte aligned");

  char* p = static_cast<char*>(scratch);
  SortScratch s;
  size_t ints = align_up(size_t(N) * sizeof(int));
  s.keys_out = reinterpret_cast<int*>(p);
  s.rows_in = reinterpret_cast<int*>(p + ints);
  s.rows_out = reinterpret_cast<int*>(p + 2 * ints);
  s.cub_temp = p + 3 * ints;
  int end_bit = bits_for(Vp);
  s.cub_bytes = cub_sort_bytes(N, end_bit);

  iota_kernel<<<unsigned(ceil_div(N, kThreads)), kThreads, 0, stream>>>(s.rows_in, N);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.cub_temp, s.cub_bytes, tokens.as<int>(),
                                             s.keys_out, s.rows_in, s.rows_out, N, 0, end_bit,
                                             stream));
  FG_DISPATCH_FLOAT(dout.dtype, T, {
    constexpr int P = Pack<T>::N;
    FG_ASSERT(C % P == 0, "C=", C, " must be a multiple of ", P);
    int packs = C / P;
    if (has_wpe) {
      int64_t wpe_work = int64_t(T_len) * packs;
      wpe_backward_kernel<T><<<unsigned(ceil_div(wpe_work, kThreads)), kThreads, 0, stream>>>(
          dwpe.as<float>(), dout.as<T>(), B, T_len, C);
      CUDA_CHECK_LAUNCH();
    }
    int threads = int(std::min<int64_t>(kThreads, ceil_div(packs, kWarpSize) * kWarpSize));
    dim3 grid(unsigned(N), unsigned(ceil_div(packs, threads)));
    wte_backward_kernel<T><<<grid, threads, 0, stream>>>(dwte.as<float>(), dout.as<T>(),
                                                         s.keys_out, s.rows_out, N, C);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace flashgpt::cuda
