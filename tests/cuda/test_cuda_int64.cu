// 64-bit indexing at the 2^31-element boundary, on the device (issue 10's audit). At a
// context of a million tokens, B·T·4C (3.2·10^9 for GPT-2 small), B·T·3C and B·T·C
// pass 2^31; an index computed in 32 bits wraps there. Each test makes tensors just past
// 2^31 elements (inputs drawn on the device from a hash of the element index) and checks:
//  * row-wise and elementwise ops (GELU, residual+layernorm forward and backward, RoPE,
//    embedding forward, FlashAttention forward and backward): the rows straddling
//    element 2^31 and the last rows are bitwise what the same op gives for those rows
//    alone (a small tensor that needs no 64-bit index);
//  * reductions over rows (matmul weight gradient, bias gradient, embedding backward):
//    inputs of the form sign(row)·w(column), w in {0, ±1/4, ±1/2}, whose sums are exact
//    in fp32 in any order, so the expected result is known bit for bit;
//  * matmul outputs past 2^31 elements: sampled rows against the fp64 reference with the
//    project's derived bf16 bound (cuda_test_util.h), as the algorithm cuBLASLt picks
//    for a small matrix may differ.
// Each test needs 20-45 GiB of device memory and skips on smaller GPUs.
#include <cuda_bf16.h>
#include <algorithm>
#include <cstring>
#include <tuple>
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda/cuda_test_util.h"

namespace flashgpt::test {
namespace {

constexpr int64_t k2To31 = int64_t(1) << 31;
using bf16 = __nv_bfloat16;

// ---------------------------------------------------------------- inputs from the index

__host__ __device__ inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}
// In [-1, 1), 24 bits: a different value for (nearly) every index.
__host__ __device__ inline float uniform_at(uint64_t i, uint64_t seed) {
  return float(mix64(i * 0x9E3779B97F4A7C15ULL + seed) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}
__host__ __device__ inline float sign_at(uint64_t row, uint64_t seed) {
  return (mix64(row * 0xD1B54A32D192ED03ULL + seed) >> 63) ? -1.0f : 1.0f;
}
__host__ __device__ inline float column_weight(int64_t c) { return 0.25f * float(int(c % 5) - 2); }
__host__ __device__ inline int token_at(uint64_t n, uint64_t seed, int V) { return int(mix64(n + seed) % uint64_t(V)); }

template <class T> __device__ T to_t(float x);
template <> __device__ float to_t<float>(float x) { return x; }
template <> __device__ bf16 to_t<bf16>(float x) { return __float2bfloat16_rn(x); }

template <class T>
__global__ void fill_uniform_kernel(T* x, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = to_t<T>(scale * uniform_at(uint64_t(i), seed));
}
// x (rows, cols) = sign(row)·w(column): exact in bf16.
__global__ void fill_outer_kernel(bf16* x, int64_t rows, int64_t cols, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * cols; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16_rn(sign_at(uint64_t(i / cols), seed) * column_weight(i % cols));
}
__global__ void fill_tokens_kernel(int* x, int64_t n, uint64_t seed, int V) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = token_at(uint64_t(i), seed, V);
}
constexpr unsigned kFillBlocks = 65535, kFillThreads = 256;

size_t free_device_bytes() {
  size_t f = 0, t = 0;
  cudaMemGetInfo(&f, &t);
  return f;
}

class CudaInt64 : public CudaTest {
 protected:
  void TearDown() override {
    for (void* p : owned_) gpu_->free(p);
    owned_.clear();
    CudaTest::TearDown();
  }
  Tensor dev(DType t, std::initializer_list<int64_t> shape) {
    Tensor x(nullptr, t, Device::cuda, shape);
    x.data = gpu_->alloc(x.nbytes());
    owned_.push_back(x.data);
    return x;
  }
  void release(const Tensor& t) {
    for (auto it = owned_.begin(); it != owned_.end(); ++it)
      if (*it == t.data) { gpu_->free(t.data); owned_.erase(it); return; }
  }
  void fill(const Tensor& t, uint64_t seed, float scale = 1.0f) {
    if (t.dtype == DType::bf16)
      fill_uniform_kernel<<<kFillBlocks, kFillThreads>>>(t.as<bf16>(), t.numel(), seed, scale);
    else
      fill_uniform_kernel<<<kFillBlocks, kFillThreads>>>(t.as<float>(), t.numel(), seed, scale);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  void fill_outer(const Tensor& t, uint64_t seed) {
    fill_outer_kernel<<<kFillBlocks, kFillThreads>>>(t.as<bf16>(), t.shape[0], t.numel() / t.shape[0], seed);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  // Rows [row0, row0 + rows) of t (first dimension) as bytes on the host.
  std::vector<uint8_t> host_rows(const Tensor& t, int64_t row0, int64_t rows) {
    const size_t row_bytes = t.nbytes() / size_t(t.shape[0]);
    std::vector<uint8_t> h(size_t(rows) * row_bytes);
    EXPECT_EQ(cudaMemcpy(h.data(), static_cast<char*>(t.data) + size_t(row0) * row_bytes, h.size(),
                         cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  // A new tensor holding rows [row0, row0 + rows) of t. The copy is checked against the
  // rows read back from t, so that a failure below is the kernel's and not the copy's (two
  // runs beside other test processes found rows near a 4 GiB multiple of a tensor differing:
  // BENCHMARKS.md, fourteenth session).
  Tensor copy_rows(const Tensor& t, int64_t row0, int64_t rows) {
    Tensor s = t;
    s.shape[0] = rows;
    s.data = gpu_->alloc(s.nbytes());
    owned_.push_back(s.data);
    const size_t row_bytes = t.nbytes() / size_t(t.shape[0]);
    EXPECT_EQ(cudaMemcpy(s.data, static_cast<char*>(t.data) + size_t(row0) * row_bytes, s.nbytes(),
                         cudaMemcpyDeviceToDevice), cudaSuccess);
    EXPECT_EQ(first_difference(host_rows(t, row0, rows), host_rows(s, 0, rows)), s.nbytes())
        << "the device-to-device copy of rows from " << row0 << " differs from the rows read back (byte offset)";
    return s;
  }
  // Rows [row0, row0 + rows) of t (bf16, drawn by fill(t, seed, scale)) hold the values
  // drawn for them: the tensor's memory itself, apart from any kernel or copy.
  void expect_drawn(const Tensor& t, int64_t row0, int64_t rows, uint64_t seed, float scale = 1.0f) {
    const auto h = host_rows(t, row0, rows);
    const int64_t cols = t.numel() / t.shape[0];
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < rows * cols; ++i) {
      const bf16 want = __float2bfloat16_rn(scale * uniform_at(uint64_t(row0 * cols + i), seed));
      if (std::memcmp(&h[size_t(i) * sizeof(bf16)], &want, sizeof(bf16)) != 0) {
        if (first < 0) first = i;
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << "input rows from " << row0 << " do not hold the values drawn for them, first at element "
                      << first << " of the slice";
  }
  static size_t first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      if (a[i] != b[i]) return i;
    return std::min(a.size(), b.size());
  }
  // Rows [row0, row0 + rows) of big are bitwise those of small.
  void expect_same_rows(const Tensor& big, int64_t row0, const Tensor& small, const std::string& what) {
    const auto a = host_rows(big, row0, small.shape[0]), b = host_rows(small, 0, small.shape[0]);
    ASSERT_EQ(a.size(), b.size());
    const size_t first = first_difference(a, b);
    EXPECT_EQ(first, a.size()) << what << ": rows from " << row0 << " differ from the same rows alone, first at byte "
                               << first << " (element " << int64_t(first / dtype_size(big.dtype)) << " of the slice)";
  }
  std::vector<void*> owned_;
};

#define REQUIRE_FREE_GIB(gib)                                                                    \
  if (free_device_bytes() < size_t((gib) * double(size_t(1) << 30)))                             \
    GTEST_SKIP() << "needs " << (gib) << " GiB of free device memory, has "                    \
                 << free_device_bytes() / double(size_t(1) << 30)

TEST_F(CudaInt64, GeluPast2To31Elements) {
  REQUIRE_FREE_GIB(18);
  const int64_t n = k2To31 + (1 << 20) + 5;  // a scalar tail after the last whole pack
  Tensor x = dev(DType::bf16, {n}), y = dev(DType::bf16, {n}), dy = dev(DType::bf16, {n}), dx = dev(DType::bf16, {n});
  fill(x, 1, 4.0f);
  fill(dy, 2);
  ASSERT_EQ(device_memset_sync(y.data, 0xff, y.nbytes()), cudaSuccess);  // NaN: unwritten elements fail
  ASSERT_EQ(device_memset_sync(dx.data, 0xff, dx.nbytes()), cudaSuccess);
  gpu_->gelu_forward(y, x);
  gpu_->gelu_backward(dx, x, dy);
  gpu_->synchronize();
  for (int64_t start : {k2To31 - (1 << 19), n - (1 << 20) - 5}) {
    const int64_t len = start < k2To31 ? (1 << 20) : n - start;
    Tensor xs = copy_rows(x, start, len), dys = copy_rows(dy, start, len);
    Tensor ys = dev(DType::bf16, {len}), dxs = dev(DType::bf16, {len});
    gpu_->gelu_forward(ys, xs);
    gpu_->gelu_backward(dxs, xs, dys);
    gpu_->synchronize();
    expect_same_rows(y, start, ys, "gelu_forward");
    expect_same_rows(dx, start, dxs, "gelu_backward");
  }
}

TEST_F(CudaInt64, LayerNormPast2To31Elements) {
  REQUIRE_FREE_GIB(28);
  const int64_t C = 768, N = 2800000;  // N·C = 2.15·10^9
  ASSERT_GT(N * C, k2To31);
  Tensor a = dev(DType::bf16, {N, C}), b = dev(DType::bf16, {N, C}), res = dev(DType::bf16, {N, C}),
         out = dev(DType::bf16, {N, C}), dout = dev(DType::bf16, {N, C}), dinp = dev(DType::bf16, {N, C});
  Tensor mean = dev(DType::f32, {N}), rstd = dev(DType::f32, {N});
  Tensor w = dev(DType::bf16, {C}), bias = dev(DType::bf16, {C}), dw = dev(DType::f32, {C}), db = dev(DType::f32, {C});
  fill(a, 3); fill(b, 4); fill(dout, 5); fill(dinp, 6); fill(w, 7); fill(bias, 8);
  gpu_->memset_zero(dw);
  gpu_->memset_zero(db);
  gpu_->residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias);
  // The backward accumulates into dinp: keep the starting rows for the small runs.
  const int64_t cross = k2To31 / C - 512, tail = N - 1000;
  Tensor dinp_cross = copy_rows(dinp, cross, 1024), dinp_tail = copy_rows(dinp, tail, 1000);
  gpu_->layernorm_backward(dinp, dw, db, dout, res, w, mean, rstd);
  gpu_->synchronize();
  for (auto [row0, rows, dinp0] : {std::tuple{cross, int64_t(1024), dinp_cross}, std::tuple{tail, int64_t(1000), dinp_tail}}) {
    expect_drawn(a, row0, rows, 3);
    expect_drawn(b, row0, rows, 4);
    expect_drawn(dout, row0, rows, 5);
    Tensor as = copy_rows(a, row0, rows), bs = copy_rows(b, row0, rows), douts = copy_rows(dout, row0, rows);
    Tensor ress = dev(DType::bf16, {rows, C}), outs = dev(DType::bf16, {rows, C});
    Tensor means = dev(DType::f32, {rows}), rstds = dev(DType::f32, {rows});
    Tensor dws = dev(DType::f32, {C}), dbs = dev(DType::f32, {C});
    gpu_->residual_layernorm_forward(ress, outs, means, rstds, as, bs, w, bias);
    gpu_->layernorm_backward(dinp0, dws, dbs, douts, ress, w, means, rstds);
    gpu_->synchronize();
    expect_same_rows(res, row0, ress, "residual");
    expect_same_rows(out, row0, outs, "layernorm out");
    expect_same_rows(mean, row0, means, "mean");
    expect_same_rows(rstd, row0, rstds, "rstd");
    expect_same_rows(dinp, row0, dinp0, "layernorm dinp");
  }
}

TEST_F(CudaInt64, RopePast2To31Elements) {
  REQUIRE_FREE_GIB(10);
  const int T = 1024, H = 12, D = 64;  // GPT-2 small: 3·H·D = 2304 per row
  const int64_t W = 3 * int64_t(H) * D, B = k2To31 / (T * W) + 2, N = B * T;
  ASSERT_GT(N * W, k2To31);
  Tensor qkv = dev(DType::bf16, {N, W});
  fill(qkv, 9);
  const int64_t cross_seq = k2To31 / (T * W);  // the sequence holding element 2^31
  Tensor cross = copy_rows(qkv, cross_seq * T, 2 * T);  // it and the last one
  gpu_->rope(qkv, T, H, /*inverse=*/false, /*pos0=*/0);
  gpu_->rope(cross, T, H, /*inverse=*/false, /*pos0=*/0);
  gpu_->synchronize();
  expect_same_rows(qkv, cross_seq * T, cross, "rope forward");
  gpu_->rope(qkv, T, H, /*inverse=*/true, /*pos0=*/0);
  gpu_->rope(cross, T, H, /*inverse=*/true, /*pos0=*/0);
  gpu_->synchronize();
  expect_same_rows(qkv, cross_seq * T, cross, "rope inverse");
}

TEST_F(CudaInt64, EmbeddingPast2To31Elements) {
  REQUIRE_FREE_GIB(12);
  const int V = 50257, Vp = 50304, C = 768, T = 1024;
  const int64_t B = k2To31 / (int64_t(T) * C) + 2, N = B * T;
  ASSERT_GT(N * C, k2To31);
  Tensor tokens = dev(DType::i32, {B, T}), wte = dev(DType::bf16, {Vp, C}), wpe = dev(DType::bf16, {T, C});
  Tensor out = dev(DType::bf16, {N, C});
  fill_tokens_kernel<<<kFillBlocks, kFillThreads>>>(tokens.as<int>(), N, 10, V);
  fill(wte, 11);
  fill(wpe, 12);
  gpu_->embedding_forward(out, tokens, wte, wpe);
  const int64_t cross_seq = k2To31 / (int64_t(T) * C);
  Tensor toks = copy_rows(tokens, cross_seq, 2);  // the straddling and the last sequence
  Tensor outs = dev(DType::bf16, {2 * int64_t(T), C});
  gpu_->embedding_forward(outs, toks, wte, wpe);
  gpu_->synchronize();
  expect_same_rows(out, cross_seq * T, outs, "embedding forward");
  release(out);

  // Backward: dout = sign(row)·w(column), so dwte[v, c] = w(c)·Σ_{n: token n = v} sign(n)
  // and dwpe[t, c] = w(c)·Σ_b sign(b·T + t), exactly.
  Tensor dout = dev(DType::bf16, {N, C}), dwte = dev(DType::f32, {Vp, C}), dwpe = dev(DType::f32, {T, C});
  fill_outer(dout, 13);
  gpu_->memset_zero(dwte);
  gpu_->memset_zero(dwpe);
  gpu_->embedding_backward(dwte, dwpe, dout, tokens);
  gpu_->synchronize();
  std::vector<double> by_token(size_t(Vp), 0.0), by_pos(size_t(T), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    by_token[size_t(token_at(uint64_t(n), 10, V))] += sign_at(uint64_t(n), 13);
    by_pos[size_t(n % T)] += sign_at(uint64_t(n), 13);
  }
  std::vector<float> got_wte(size_t(Vp) * C), got_wpe(size_t(T) * C);
  ASSERT_EQ(cudaMemcpy(got_wte.data(), dwte.data, dwte.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_wpe.data(), dwpe.data, dwpe.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t bad = 0;
  for (int64_t v = 0; v < Vp; ++v)
    for (int64_t c = 0; c < C; ++c) bad += got_wte[size_t(v * C + c)] != float(by_token[size_t(v)] * column_weight(c));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) bad += got_wpe[size_t(t * C + c)] != float(by_pos[size_t(t)] * column_weight(c));
  EXPECT_EQ(bad, 0) << "embedding backward: elements of dwte, dwpe not exactly the expected sums";
}

// ---------------------------------------------------------------- matmuls

// fp64 reference and fp32 "naive" (rounded to bf16) of rows of out = inp·Wᵀ + b [GELU].
struct RowRef {
  std::vector<double> ref, naive;
};
double gelu64(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

std::vector<double> bf16_bytes_to_doubles(const std::vector<uint8_t>& raw) {
  std::vector<double> v(raw.size() / 2);
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, raw.data() + 2 * i, 2);
    v[i] = bf16_to_double(h);
  }
  return v;
}

TEST_F(CudaInt64, MatmulPast2To31Elements) {
  REQUIRE_FREE_GIB(30);
  const int64_t N = int64_t(1) << 20, C = 768, F = 3072;  // N·F = 3.2·10^9
  Tensor inp = dev(DType::bf16, {N, C}), w = dev(DType::bf16, {F, C}), bias = dev(DType::bf16, {F});
  Tensor pre = dev(DType::bf16, {N, F}), out = dev(DType::bf16, {N, F});
  fill(inp, 20); fill(w, 21, 0.05f); fill(bias, 22);
  ASSERT_EQ(device_memset_sync(out.data, 0xff, out.nbytes()), cudaSuccess);
  MatmulForward fwd;
  fwd.out = out; fwd.inp = inp; fwd.weight = w; fwd.bias = bias; fwd.gelu = true; fwd.pre_gelu = pre;
  gpu_->matmul_forward(fwd);
  gpu_->synchronize();
  auto wv = bf16_bytes_to_doubles(host_rows(w, 0, F)), bv = bf16_bytes_to_doubles(host_rows(bias, 0, F));
  const int64_t cross = k2To31 / F;  // the row holding element 2^31 of out
  for (int64_t row : {int64_t(0), cross, cross + 1, N - 1}) {
    auto x = bf16_bytes_to_doubles(host_rows(inp, row, 1));
    auto got_out = bf16_bytes_to_doubles(host_rows(out, row, 1)), got_pre = bf16_bytes_to_doubles(host_rows(pre, row, 1));
    std::vector<double> ref_pre(F), naive_pre(F), ref_out(F), naive_out(F);
    for (int64_t o = 0; o < F; ++o) {
      double acc = bv[size_t(o)];
      float acc32 = float(bv[size_t(o)]);
      for (int64_t c = 0; c < C; ++c) {
        acc += x[size_t(c)] * wv[size_t(o * C + c)];
        acc32 += float(x[size_t(c)]) * float(wv[size_t(o * C + c)]);
      }
      ref_pre[size_t(o)] = acc;
      naive_pre[size_t(o)] = round_to(DType::bf16, acc32);
      ref_out[size_t(o)] = gelu64(acc);
      naive_out[size_t(o)] = round_to(DType::bf16, gelu64(double(acc32)));
    }
    expect_rule(got_pre, naive_pre, ref_pre, int64_t(ref_pre.size()), unit_roundoff(DType::bf16), cat("matmul pre-GELU row ", row));
    expect_rule(got_out, naive_out, ref_out, int64_t(ref_out.size()), unit_roundoff(DType::bf16), cat("matmul GELU out row ", row));
  }
  release(inp);

  // The MLP projection's backward through the DGELU epilogue: dinp (N, F) past 2^31.
  Tensor w2 = dev(DType::bf16, {C, F}), dout = dev(DType::bf16, {N, C}), dinp = dev(DType::bf16, {N, F});
  fill(w2, 23, 0.05f); fill(dout, 24);
  ASSERT_EQ(device_memset_sync(dinp.data, 0xff, dinp.nbytes()), cudaSuccess);
  MatmulBackward bwd;
  bwd.dinp = dinp; bwd.dout = dout; bwd.inp = out; bwd.weight = w2; bwd.dinp_gelu_pre = pre;
  gpu_->matmul_backward(bwd);
  gpu_->synchronize();
  auto w2v = bf16_bytes_to_doubles(host_rows(w2, 0, C));
  for (int64_t row : {cross, cross + 1, N - 1}) {
    auto d = bf16_bytes_to_doubles(host_rows(dout, row, 1)), p = bf16_bytes_to_doubles(host_rows(pre, row, 1));
    auto got = bf16_bytes_to_doubles(host_rows(dinp, row, 1));
    std::vector<double> ref(F), naive(F);
    for (int64_t f = 0; f < F; ++f) {
      double acc = 0;
      float acc32 = 0;
      for (int64_t c = 0; c < C; ++c) {
        acc += d[size_t(c)] * w2v[size_t(c * F + f)];
        acc32 += float(d[size_t(c)]) * float(w2v[size_t(c * F + f)]);
      }
      const double x = p[size_t(f)], h = 1e-6;
      const double g = (gelu64(x + h) - gelu64(x - h)) / (2 * h);  // GELU'(x), to ~1e-10
      ref[size_t(f)] = acc * g;
      naive[size_t(f)] = round_to(DType::bf16, double(acc32 * float(g)));
    }
    expect_rule(got, naive, ref, int64_t(ref.size()), unit_roundoff(DType::bf16), cat("matmul DGELU dinp row ", row));
  }
  for (const Tensor& t : {pre, out, dinp, dout}) release(t);

  // Weight and bias gradients over N rows of sign(row)·w(column) inputs: exact sums.
  Tensor x_fc = dev(DType::bf16, {N, C}), d_fc = dev(DType::bf16, {N, F});  // MLP c_fc
  Tensor x_pj = dev(DType::bf16, {N, F}), d_pj = dev(DType::bf16, {N, C});  // MLP c_proj
  fill_outer(x_fc, 30); fill_outer(d_fc, 31); fill_outer(x_pj, 32); fill_outer(d_pj, 33);
  Tensor dw_fc = dev(DType::f32, {F, C}), db_fc = dev(DType::f32, {F}), dw_pj = dev(DType::f32, {C, F});
  for (const Tensor& t : {dw_fc, db_fc, dw_pj}) gpu_->memset_zero(t);
  MatmulBackward fc, pj;
  fc.dweight = dw_fc; fc.dbias = db_fc; fc.dout = d_fc; fc.inp = x_fc; fc.weight = w;
  pj.dweight = dw_pj; pj.dout = d_pj; pj.inp = x_pj; pj.weight = w2;
  gpu_->matmul_backward(fc);
  gpu_->matmul_backward(pj);
  gpu_->synchronize();
  double s_fc = 0, s_pj = 0, s_b = 0;
  for (int64_t n = 0; n < N; ++n) {
    s_fc += sign_at(uint64_t(n), 30) * sign_at(uint64_t(n), 31);
    s_pj += sign_at(uint64_t(n), 32) * sign_at(uint64_t(n), 33);
    s_b += sign_at(uint64_t(n), 31);
  }
  std::vector<float> g_fc(static_cast<size_t>(F * C)), g_b(static_cast<size_t>(F)), g_pj(static_cast<size_t>(C * F));
  ASSERT_EQ(cudaMemcpy(g_fc.data(), dw_fc.data, dw_fc.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(g_b.data(), db_fc.data, db_fc.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(g_pj.data(), dw_pj.data, dw_pj.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t bad = 0;
  for (int64_t o = 0; o < F; ++o) {
    bad += g_b[size_t(o)] != float(s_b * column_weight(o));
    for (int64_t c = 0; c < C; ++c) bad += g_fc[size_t(o * C + c)] != float(s_fc * column_weight(o) * column_weight(c));
  }
  for (int64_t o = 0; o < C; ++o)
    for (int64_t f = 0; f < F; ++f) bad += g_pj[size_t(o * F + f)] != float(s_pj * column_weight(o) * column_weight(f));
  EXPECT_EQ(bad, 0) << "weight/bias gradients not exactly the expected sums";
}

// ---------------------------------------------------------------- FlashAttention

// qkv of B = 2048 sequences × T = 1024 × 3·16·64: 6.4·10^9 elements. The straddling and the
// last sequence against themselves alone, forward, backward with deterministic dQ (bitwise)
// and with atomic dQ: dK, dV bitwise; dQ within one bf16 ulp of the element plus 2^-10 of
// the largest |dQ|. (Atomics only reorder the fp32 additions of at most T/16 = 64
// partial sums: an error of at most 64·2^-24 of their magnitudes, which can move an
// element across one bf16 rounding boundary, or more where partials cancel; an indexing
// error is of the order of the largest |dQ| itself.)
TEST_F(CudaInt64, FlashAttentionPast2To31Elements) {
  REQUIRE_FREE_GIB(46);
  const int B = 2048, T = 1024, H = 16, D = 64;
  const int64_t BT = int64_t(B) * T, W = 3 * int64_t(H) * D;
  Tensor qkv = dev(DType::bf16, {BT, W}), out = dev(DType::bf16, {BT, int64_t(H) * D}),
         dout = dev(DType::bf16, {BT, int64_t(H) * D}), dqkv = dev(DType::bf16, {BT, W});
  Tensor lse = dev(DType::f32, {int64_t(B) * H, T}), delta = dev(DType::f32, {int64_t(B) * H, T});
  fill(qkv, 40);
  fill(dout, 41);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::vector<std::string> paths = {"sm80"};
  if (prop.major == 9) paths.push_back("sm90");
  const int64_t cross = k2To31 / (int64_t(T) * W);
  for (const std::string& path : paths)
    for (const char* det : {"1", "0"}) {
      SCOPED_TRACE("FLASHGPT_ATTENTION_PATH=" + path + " FLASHGPT_DETERMINISTIC=" + det);
      ScopedEnv p("FLASHGPT_ATTENTION_PATH", path.c_str()), d("FLASHGPT_DETERMINISTIC", det);
      auto run = [&](int b, const Tensor& q, const Tensor& o, const Tensor& l, const Tensor& dl, const Tensor& dO,
                     const Tensor& dq) {
        AttentionForward f;
        f.out = o; f.lse = l; f.qkv = q; f.B = b; f.T = T; f.H = H; f.D = D; f.causal = true;
        gpu_->attention_forward(f);
        AttentionBackward g;
        g.dqkv = dq; g.dout = dO; g.qkv = q; g.out = o; g.lse = l; g.delta = dl;
        g.B = b; g.T = T; g.H = H; g.D = D; g.causal = true;
        gpu_->attention_backward(g);
      };
      run(B, qkv, out, lse, delta, dout, dqkv);
      gpu_->synchronize();
      for (int64_t b : {cross, int64_t(B - 1)}) {
        expect_drawn(qkv, b * T, T, 40);
        expect_drawn(dout, b * T, T, 41);
        Tensor qs = copy_rows(qkv, b * T, T), dOs = copy_rows(dout, b * T, T);
        Tensor os = dev(DType::bf16, {T, int64_t(H) * D}), dqs = dev(DType::bf16, {T, W});
        Tensor ls = dev(DType::f32, {H, T}), dls = dev(DType::f32, {H, T});
        run(1, qs, os, ls, dls, dOs, dqs);
        gpu_->synchronize();
        expect_same_rows(out, b * T, os, cat("attention O, sequence ", b));
        expect_same_rows(lse, b * H, ls, cat("attention LSE, sequence ", b));
        if (std::string(det) == "1") {
          expect_same_rows(dqkv, b * T, dqs, cat("attention dQKV, sequence ", b));
        } else {
          auto big = bf16_bytes_to_doubles(host_rows(dqkv, b * T, T)), alone = bf16_bytes_to_doubles(host_rows(dqs, 0, T));
          double max_dq = 0;
          for (int64_t t = 0; t < T; ++t)
            for (int64_t j = 0; j < int64_t(H) * D; ++j) max_dq = std::max(max_dq, std::fabs(alone[size_t(t * W + j)]));
          int64_t bad = 0;
          for (int64_t t = 0; t < T; ++t)
            for (int64_t j = 0; j < W; ++j) {
              const size_t i = size_t(t * W + j);
              if (j >= int64_t(H) * D) {
                bad += big[i] != alone[i];  // dK, dV: no atomics
              } else {
                const double mag = std::max(std::fabs(alone[i]), std::fabs(big[i]));
                const double ulp = mag < 1e-30 ? 0.0 : std::ldexp(1.0, std::ilogb(mag) - 7);  // bf16: 8 significant bits
                bad += !(std::fabs(big[i] - alone[i]) <= ulp + std::ldexp(max_dq, -10));
              }
            }
          EXPECT_EQ(bad, 0) << "attention dQKV (atomic dQ), sequence " << b;
        }
      }
    }
}

}  // namespace
}  // namespace flashgpt::test
