// FlashAttention kernels (kernels/cuda/attention/) against an fp64 CPU reference.
//
// Every case draws fresh random bf16 inputs, computes
//   ref64  - exact attention in double precision on the same bf16 inputs,
//   naive  - the same math as a plain bf16 kernel would do it: fp32 scores and sums,
//            P and dS rounded to bf16 before their matmuls, outputs rounded to bf16;
//            in the forward, P is rounded unnormalised (exp(s − row max), divided by the
//            row sum after P·V) as a flash forward must. That rounding of O feeds
//            D = rowsum(dO∘O), and an error in D moves a whole row of dQ together
//            (dQᵢ −= scale·ΔDᵢ·Σⱼ Pᵢⱼ Kⱼ), so the row-local scale σ below cannot show it;
//            a yardstick rounding normalised P instead was off by 1.2× the bound on
//            3 dQ elements of a T=17 row (FLASHGPT_TEST_SEED=326581116246184555),
//            which this form of naive reproduces to the bit,
// and requires for O, LSE, dQ, dK and dV, on EVERY element, the bound of tests/testing.h
// (check_rule), the FlashAttention repository's criterion made per element:
//   |ours − ref64| ≤ 2·(|naive − ref64| + λ·σ + u·|ref64|)
// σ: the error scale naive shows on elements like this one (its row of D — one query's
// head — sorted by size into blocks of 64), λ from the element count, u the unit
// roundoff of the stored output (bf16 for O and dQKV, fp32 for LSE). So a late row of a
// long causal sequence, whose |O| is small, is held to its own scale, not to the largest
// error of the tensor. Awkward lengths (1, 17, 113, 239, 1023, 4100) exercise the
// predicated loads and the column masks. Outputs are poisoned with NaN before each
// launch, so an unwritten element fails. The inputs come from the test's seed
// (tests/testing.h: printed on failure, FLASHGPT_TEST_SEED overrides).
//
// Two errors of a fused kernel that naive cannot show are added as per-element floors,
// computed alongside ref64 (first-order forward error bounds, u = 2^-24 of fp32):
//  * dS = P∘(dP − Dᵢ) cancels exactly where the true dS is 0 (a row with one key, the
//    first query of a causal row): naive computes dP and Dᵢ by the same fp32 sums and
//    gets an exact 0, the kernel forms Dᵢ = rowsum(dO∘O) from the stored O and dP on
//    the tensor cores. Each is an fp32 dot product of length D, so |err dS_ij| ≤
//    P_ij·(D+2)·u·(|dP_ij| + |Dᵢ|), and dQ_i ≤ scale·Σ_j that·|K_j|, dK_j ≤ scale·Σ_i that·|Q_i|.
//  * LSE: the kernel rescales its running sum once per key tile (≥ 64 keys), each time
//    by an ex2.approx (relative error ≤ 2^-22) and a rounding, and forms the exponents
//    s·scale·log2 e − m·log2 e in fp32, so (in nats) |err LSEᵢ| ≤ (⌈n/64⌉ + 2)·(u + 2^-22)
//    + u·Σ_j P_ij·(|s_ij| + |mᵢ|).
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/attention/flash_attention.h"
#include "kernels/cuda/attention/tile_choice.h"
#include "src/errors.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/testing.h"

namespace flashgpt {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// ---- bf16 on the host ---------------------------------------------------------------
uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float round_bf16(float f) { return from_bf16(to_bf16(f)); }

// ---- references ------------------------------------------------------------------------
struct Problem {
  int B, T, H, D;
  bool causal;
  std::vector<float> qkv;   // (B,T,3,H,D), values exactly representable in bf16
  std::vector<float> dout;  // (B,T,H,D), likewise
  // true (ramped_problem): the backward runs on the naive reference's O, not the forward's,
  // and ref64's D = rowsum(dO∘O) is taken from that O too (see there).
  bool backward_on_naive_o = false;
  // Rows of length D.
  const float* q(int b, int t, int h) const { return &qkv[(((size_t(b) * T + t) * 3 + 0) * H + h) * D]; }
  const float* k(int b, int t, int h) const { return &qkv[(((size_t(b) * T + t) * 3 + 1) * H + h) * D]; }
  const float* v(int b, int t, int h) const { return &qkv[(((size_t(b) * T + t) * 3 + 2) * H + h) * D]; }
  const float* dO(int b, int t, int h) const { return &dout[((size_t(b) * T + t) * H + h) * D]; }
};

// x·y in Real arithmetic; four partial sums so the loop is not one long dependency chain.
template <class Real>
Real dot(const float* x, const float* y, int n) {
  Real s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int d = 0; d < n; d += 4) {
    s0 += Real(x[d]) * Real(y[d]);
    s1 += Real(x[d + 1]) * Real(y[d + 1]);
    s2 += Real(x[d + 2]) * Real(y[d + 2]);
    s3 += Real(x[d + 3]) * Real(y[d + 3]);
  }
  return (s0 + s1) + (s2 + s3);
}

struct Result {
  std::vector<double> out;   // (B,T,H,D)
  std::vector<double> lse;   // (B,H,T)
  std::vector<double> dqkv;  // (B,T,3,H,D)
  std::vector<double> lse_floor, dqkv_floor;  // ref64 only: see the header
};

// Real: the arithmetic type (double for ref64, float for the naive bf16 kernel).
// kBf16: round P, dS and the outputs to bf16 where a bf16 kernel would.
constexpr double kU = 1.0 / (1 << 24);  // fp32 unit roundoff, for the floors

// The terms of query row i of head (b, h): O, LSE, D = rowsum(dO∘O), dQ, and the LSE and
// dQ floors (ref64's; see the header). Everything the row needs is the row against its keys.
// o_given (D values, or null): the O that D is taken from, in place of the row's own.
struct RowTerms {
  std::vector<double> o, dq, dq_floor;  // D each
  double lse = 0, delta = 0, lse_floor = 0;
};
template <class Real, bool kBf16>
RowTerms row_terms(const Problem& pb, int b, int h, int i, const double* o_given = nullptr) {
  const int D = pb.D, n = pb.causal ? i + 1 : pb.T;
  const Real scale = Real(1) / std::sqrt(Real(D));
  auto rnd = [](Real x) { return kBf16 ? Real(round_bf16(float(x))) : x; };
  const double gamma = (D + 2) * kU;
  std::vector<Real> s(static_cast<size_t>(n)), o(static_cast<size_t>(D), 0), dq(static_cast<size_t>(D), 0);
  Real mx = -INFINITY;
  for (int j = 0; j < n; ++j) mx = std::max(mx, s[size_t(j)] = dot<Real>(pb.q(b, i, h), pb.k(b, j, h), D) * scale);
  Real sum = 0;
  for (int j = 0; j < n; ++j) sum += std::exp(s[size_t(j)] - mx);
  const Real lse = mx + std::log(sum);
  // As a flash forward does: P·V with P unnormalised (relative to the row max) and
  // rounded to bf16, then O = that / sum. See the header: D inherits this rounding.
  for (int j = 0; j < n; ++j) {
    const Real p = rnd(std::exp(s[size_t(j)] - mx));
    const float* vj = pb.v(b, j, h);
    for (int d = 0; d < D; ++d) o[size_t(d)] += p * Real(vj[d]);
  }
  RowTerms r;
  r.o.resize(size_t(D)), r.dq.resize(size_t(D)), r.dq_floor.assign(size_t(D), 0);
  const float* doi = pb.dO(b, i, h);
  Real dlt = 0;
  for (int d = 0; d < D; ++d) {
    o[size_t(d)] = rnd(o[size_t(d)] / sum);
    dlt += (o_given ? Real(o_given[d]) : o[size_t(d)]) * Real(doi[d]);
    r.o[size_t(d)] = double(o[size_t(d)]);
  }
  r.lse = double(lse);
  r.delta = double(dlt);
  r.lse_floor = ((n + 63) / 64 + 2) * (kU + std::ldexp(1.0, -22));
  for (int j = 0; j < n; ++j) {
    const Real p = std::exp(s[size_t(j)] - lse);
    const Real dp = dot<Real>(doi, pb.v(b, j, h), D);
    const Real ds = rnd(p * (dp - dlt));
    const float* kj = pb.k(b, j, h);
    const double cancel = double(p) * gamma * (std::fabs(double(dp)) + std::fabs(double(dlt)));
    r.lse_floor += kU * double(p) * (std::fabs(double(s[size_t(j)])) + std::fabs(double(mx)));
    for (int d = 0; d < D; ++d) {
      dq[size_t(d)] += ds * Real(kj[d]);
      r.dq_floor[size_t(d)] += cancel * std::fabs(double(kj[d]));
    }
  }
  for (int d = 0; d < D; ++d) {
    r.dq[size_t(d)] = double(rnd(dq[size_t(d)] * scale));
    r.dq_floor[size_t(d)] *= double(scale);
  }
  return r;
}

// The terms of key j of head (b, h): dK, dV and the dK floor, from the rows that see the
// key; row(i) gives row i's RowTerms (its LSE and D).
struct ColTerms {
  std::vector<double> dk, dv, dk_floor;  // D each
};
template <class Real, bool kBf16, class RowOf>
ColTerms col_terms(const Problem& pb, int b, int h, int j, RowOf&& row) {
  const int D = pb.D;
  const Real scale = Real(1) / std::sqrt(Real(D));
  auto rnd = [](Real x) { return kBf16 ? Real(round_bf16(float(x))) : x; };
  const double gamma = (D + 2) * kU;
  std::vector<Real> dk(static_cast<size_t>(D), 0), dv(static_cast<size_t>(D), 0);
  ColTerms c;
  c.dk.resize(size_t(D)), c.dv.resize(size_t(D)), c.dk_floor.assign(size_t(D), 0);
  for (int i = pb.causal ? j : 0; i < pb.T; ++i) {
    const RowTerms& ri = row(i);
    const Real lse = Real(ri.lse), dlt = Real(ri.delta);
    const Real p = std::exp(dot<Real>(pb.q(b, i, h), pb.k(b, j, h), D) * scale - lse);
    const float* doi = pb.dO(b, i, h);
    const float* qi = pb.q(b, i, h);
    const Real dp = dot<Real>(doi, pb.v(b, j, h), D);
    const Real ds = rnd(p * (dp - dlt));
    const Real pr = rnd(p);
    const double cancel = double(p) * gamma * (std::fabs(double(dp)) + std::fabs(double(dlt)));
    for (int d = 0; d < D; ++d) {
      dk[size_t(d)] += ds * Real(qi[d]);
      dv[size_t(d)] += pr * Real(doi[d]);
      c.dk_floor[size_t(d)] += cancel * std::fabs(double(qi[d]));
    }
  }
  for (int d = 0; d < D; ++d) {
    c.dk[size_t(d)] = double(rnd(dk[size_t(d)] * scale));
    c.dk_floor[size_t(d)] *= double(scale);
    c.dv[size_t(d)] = double(rnd(dv[size_t(d)]));
  }
  return c;
}

// Every element: the rows, then the columns from the rows' LSE and D. o_given ((B,T,H,D) or
// null): the O that D is taken from (the backward's input), in place of the reference's own.
template <class Real, bool kBf16>
Result attention_reference(const Problem& pb, const std::vector<double>* o_given = nullptr) {
  const int B = pb.B, T = pb.T, H = pb.H, D = pb.D;
  Result r;
  r.out.assign(size_t(B) * T * H * D, 0);
  r.lse.assign(size_t(B) * H * T, 0);
  r.dqkv.assign(size_t(B) * T * 3 * H * D, 0);
  r.lse_floor.assign(r.lse.size(), 0);
  r.dqkv_floor.assign(r.dqkv.size(), 0);
  std::vector<RowTerms> rows(size_t(B) * H * T);
  auto at = [&](int b, int t, int slot, int h) { return (((size_t(b) * T + t) * 3 + size_t(slot)) * H + h) * D; };
#pragma omp parallel for collapse(3) schedule(dynamic)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        const size_t bhi = (size_t(b) * H + h) * T + i;
        const size_t oi = ((size_t(b) * T + i) * H + h) * D;
        RowTerms& ri = rows[bhi] = row_terms<Real, kBf16>(pb, b, h, i, o_given ? o_given->data() + oi : nullptr);
        r.lse[bhi] = ri.lse;
        r.lse_floor[bhi] = ri.lse_floor;
        std::copy(ri.o.begin(), ri.o.end(), r.out.begin() + std::ptrdiff_t(oi));
        std::copy(ri.dq.begin(), ri.dq.end(), r.dqkv.begin() + std::ptrdiff_t(at(b, i, 0, h)));
        std::copy(ri.dq_floor.begin(), ri.dq_floor.end(), r.dqkv_floor.begin() + std::ptrdiff_t(at(b, i, 0, h)));
      }
#pragma omp parallel for collapse(3) schedule(dynamic)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < T; ++j) {
        const ColTerms c = col_terms<Real, kBf16>(pb, b, h, j, [&](int i) -> const RowTerms& {
          return rows[(size_t(b) * H + h) * T + size_t(i)];
        });
        std::copy(c.dk.begin(), c.dk.end(), r.dqkv.begin() + std::ptrdiff_t(at(b, j, 1, h)));
        std::copy(c.dk_floor.begin(), c.dk_floor.end(), r.dqkv_floor.begin() + std::ptrdiff_t(at(b, j, 1, h)));
        std::copy(c.dv.begin(), c.dv.end(), r.dqkv.begin() + std::ptrdiff_t(at(b, j, 2, h)));
      }
  return r;
}

Problem random_problem(int B, int T, int H, int D, bool causal, uint32_t seed) {
  Problem pb{B, T, H, D, causal, {}, {}};
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  pb.qkv.resize(size_t(B) * T * 3 * H * D);
  pb.dout.resize(size_t(B) * T * H * D);
  for (auto& x : pb.qkv) x = round_bf16(normal(gen));
  for (auto& x : pb.dout) x = round_bf16(normal(gen));
  return pb;
}

// random_problem with each key scaled by 1 + 10·j/T (key j): a row's scores spread more the
// further its keys go, so its running max climbs tile after tile, often by more than the
// forward's lazy threshold (kLazyMaxLog2 = 8 in the log2 domain: O rescaled) and as often
// by less (the max kept, P above 1). With plain N(0, 1) inputs the max settles within the
// first key tile, and a forward that never rescaled O after it would pass.
// With keys up to 11 times N(0, 1) the attention is sharp, and dQ = scale·Σ_j P_ij (dP_ij −
// D_i) K_j nearly cancels, so it hangs on D_i = rowsum(dO∘O), which the backward computes
// from O as stored in bf16. Two O's that each pass the O check (rounded from different fp32
// sums) then give dQ's far apart: scripts/o_rounding_sensitivity.cpp finds, at T = 1023,
// D = 64, an O summed in 128-key tiles and the naive reference's O giving dQ's up to 0.06
// apart (dQ up to 22), where N(0, 1) keys give 0.0005. The bound (tests/testing.h) takes the
// naive reference's error as the scale of a kernel's, which does not hold for an O rounded
// otherwise than naive's: on an H100 every forward and backward path, the eager max's too,
// put 17-191 dQ elements out of it when the backward took the forward's O (BENCHMARKS.md,
// fifty-fifth session). So here the backward is given the naive reference's O (its input,
// as the forward's would be), and ref64's D is taken from that O too: the three then agree
// on D, and dQ and dK are held to the bound for what the backward itself computes (a CPU
// emulation of a flash backward in fp32 passes it, one whose D is off by 2^-8 fails it:
// FlashAttentionReference.SharpAttentionChecksTheBackwardOnTheNaiveO). The forward is held
// to the bound on O and LSE as in every case.
Problem ramped_problem(int B, int T, int H, int D, bool causal, uint32_t seed) {
  Problem pb = random_problem(B, T, H, D, causal, seed);
  pb.backward_on_naive_o = true;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        float* k = &pb.qkv[(((size_t(b) * T + t) * 3 + 1) * H + h) * D];
        for (int d = 0; d < D; ++d) k[d] = round_bf16(k[d] * (1.f + 10.f * float(t) / float(T)));
      }
  return pb;
}

// How far (log2 domain, as the kernels' exponentials see it) the last row's max score
// climbs from its first 192 keys (more than any forward's first key tile: 128 or 176) to
// all T: over 8 means that every forward moves that row's lazy max at least once after
// its first tile (the kept max is at most the first tile's until it moves).
double last_row_max_climb_log2(const Problem& pb) {
  const int i = pb.T - 1;
  const double c = std::log2(std::exp(1.0)) / std::sqrt(double(pb.D));
  double first = -INFINITY, all = -INFINITY;
  for (int j = 0; j < pb.T; ++j) {
    const double score = dot<double>(pb.q(0, i, 0), pb.k(0, j, 0), pb.D) * c;
    if (j < 192) first = std::max(first, score);
    all = std::max(all, score);
  }
  return all - first;
}

// ---- the device side -------------------------------------------------------------------
struct DeviceRun {
  std::vector<float> out, lse, dqkv;
};

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(size_t n) {
    if (cudaMalloc(&ptr, n * sizeof(T)) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
};

std::vector<uint16_t> to_bf16_vec(const std::vector<float>& v) {
  std::vector<uint16_t> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = to_bf16(v[i]);
  return r;
}

// Runs forward then backward on the GPU; outputs are NaN-poisoned first. o_for_backward
// ((B,T,H,D) bf16 values, or null: the forward's): the O the backward is given.
void run_flash(const Problem& pb, DeviceRun& res, const std::vector<double>* o_for_backward = nullptr) {
  const int B = pb.B, T = pb.T, H = pb.H, D = pb.D;
  const size_t n_qkv = pb.qkv.size(), n_o = pb.dout.size(), n_lse = size_t(B) * H * T;
  DeviceBuffer<uint16_t> qkv(n_qkv), out(n_o), dout(n_o), dqkv(n_qkv), given_o(o_for_backward ? n_o : 0);
  DeviceBuffer<float> lse(n_lse), delta(n_lse);
  const size_t ws_bytes = cuda::flash_attention_workspace_bytes(B, T, H, D);
  DeviceBuffer<unsigned char> ws(ws_bytes);
  ASSERT_TRUE(qkv.ptr && out.ptr && dout.ptr && dqkv.ptr && lse.ptr && delta.ptr && ws.ptr);
  ASSERT_TRUE(!o_for_backward || (given_o.ptr && o_for_backward->size() == n_o));
  const auto h_qkv = to_bf16_vec(pb.qkv), h_dout = to_bf16_vec(pb.dout);
  CUDA_OK(cudaMemcpy(qkv.ptr, h_qkv.data(), n_qkv * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dout.ptr, h_dout.data(), n_o * 2, cudaMemcpyHostToDevice));
  // 0xFF bytes are NaN in both bf16 and fp32.
  CUDA_OK(cudaMemset(out.ptr, 0xFF, n_o * 2));
  CUDA_OK(cudaMemset(lse.ptr, 0xFF, n_lse * 4));
  CUDA_OK(cudaMemset(dqkv.ptr, 0xFF, n_qkv * 2));
  CUDA_OK(cudaMemset(delta.ptr, 0xFF, n_lse * 4));
  CUDA_OK(cudaMemset(ws.ptr, 0xFF, ws_bytes));

  const int64_t rows = int64_t(B) * T;
  AttentionForward f;
  f.out = Tensor(out.ptr, DType::bf16, Device::cuda, {rows, int64_t(H) * D});
  f.lse = Tensor(lse.ptr, DType::f32, Device::cuda, {int64_t(B) * H, T});
  f.qkv = Tensor(qkv.ptr, DType::bf16, Device::cuda, {rows, int64_t(3) * H * D});
  f.B = B, f.T = T, f.H = H, f.D = D, f.causal = pb.causal;
  cuda::flash_attention_forward(f, nullptr);
  CUDA_OK(cudaDeviceSynchronize());

  AttentionBackward bk;
  bk.dqkv = Tensor(dqkv.ptr, DType::bf16, Device::cuda, {rows, int64_t(3) * H * D});
  bk.dout = Tensor(dout.ptr, DType::bf16, Device::cuda, {rows, int64_t(H) * D});
  bk.qkv = f.qkv;
  bk.out = f.out;
  if (o_for_backward) {
    std::vector<uint16_t> h_o(n_o);
    for (size_t i = 0; i < n_o; ++i) h_o[i] = to_bf16(float((*o_for_backward)[i]));
    CUDA_OK(cudaMemcpy(given_o.ptr, h_o.data(), n_o * 2, cudaMemcpyHostToDevice));
    bk.out = Tensor(given_o.ptr, DType::bf16, Device::cuda, {rows, int64_t(H) * D});
  }
  bk.lse = f.lse;
  bk.delta = Tensor(delta.ptr, DType::f32, Device::cuda, {int64_t(B) * H, T});
  bk.B = B, bk.T = T, bk.H = H, bk.D = D, bk.causal = pb.causal;
  cuda::flash_attention_backward(bk, ws.ptr, nullptr);
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<uint16_t> h_out(n_o), h_dqkv(n_qkv);
  res.lse.resize(n_lse);
  CUDA_OK(cudaMemcpy(h_out.data(), out.ptr, n_o * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_dqkv.data(), dqkv.ptr, n_qkv * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(res.lse.data(), lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost));
  res.out.resize(n_o);
  res.dqkv.resize(n_qkv);
  for (size_t i = 0; i < n_o; ++i) res.out[i] = from_bf16(h_out[i]);
  for (size_t i = 0; i < n_qkv; ++i) res.dqkv[i] = from_bf16(h_dqkv[i]);
}

// The elements of got, ref and naive for which select(i) holds (the Q, K or V slot of
// dqkv), checked with the bound of tests/testing.h in rows of `row` elements.
template <class Select>
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<double>& ref,
                  const std::vector<double>& naive, const std::vector<double>& floor, int64_t row,
                  DType stored, Select select) {
  std::vector<double> g, r, n, f;
  for (size_t i = 0; i < ref.size(); ++i)
    if (select(i)) g.push_back(got[i]), r.push_back(ref[i]), n.push_back(naive[i]), f.push_back(floor[i]);
  test::expect_rule(g, n, r, row, test::unit_roundoff(stored), what, &f);
}

struct Case {
  int B, T, H, D;
  bool causal;
  bool ramped = false;  // ramped_problem instead of random_problem
};
std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "B" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_H" + std::to_string(c.H) + "_D" +
         std::to_string(c.D) + (c.causal ? "_causal" : "_full") + (c.ramped ? "_ramped" : "");
}

class FlashAttentionVsReference : public testing::TestWithParam<Case> {};

using test::is_hopper;
using test::ScopedEnv;

void check_against(const Problem& pb, const Result& ref, const Result& naive, const std::string& label) {
  DeviceRun run;
  run_flash(pb, run, pb.backward_on_naive_o ? &naive.out : nullptr);
  if (testing::Test::HasFatalFailure()) return;
  const size_t HD = size_t(pb.H) * pb.D;
  auto all = [](size_t) { return true; };
  auto slot = [HD](int s) { return [HD, s](size_t i) { return (i / HD) % 3 == size_t(s); }; };
  const int64_t D = pb.D;
  const std::vector<double> no_floor(ref.out.size(), 0.0);
  expect_close(label + " O", run.out, ref.out, naive.out, no_floor, D, DType::bf16, all);
  expect_close(label + " LSE", run.lse, ref.lse, naive.lse, ref.lse_floor, pb.T, DType::f32, all);
  expect_close(label + " dQ", run.dqkv, ref.dqkv, naive.dqkv, ref.dqkv_floor, D, DType::bf16, slot(0));
  expect_close(label + " dK", run.dqkv, ref.dqkv, naive.dqkv, ref.dqkv_floor, D, DType::bf16, slot(1));
  expect_close(label + " dV", run.dqkv, ref.dqkv, naive.dqkv, ref.dqkv_floor, D, DType::bf16, slot(2));
}

// Which code paths to check: FLASHGPT_TEST_ATTENTION_PATHS, a subset of
// "sm80,sm90,sm90ws,auto" (default: all; sm90 and sm90ws only on a Hopper GPU). Lets a run
// keep paths in separate processes.
bool path_wanted(const char* path) {
  const char* env = std::getenv("FLASHGPT_TEST_ATTENTION_PATHS");
  const std::string paths = env && *env ? env : "sm80,sm90,sm90ws,auto";
  return ("," + paths + ",").find(std::string(",") + path + ",") != std::string::npos;
}

TEST_P(FlashAttentionVsReference, OutputsAndGradients) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Case c = GetParam();
  const uint32_t seed = uint32_t(test::test_rng()());
  const Problem pb = c.ramped ? ramped_problem(c.B, c.T, c.H, c.D, c.causal, seed)
                              : random_problem(c.B, c.T, c.H, c.D, c.causal, seed);
  if (c.ramped) {
    ASSERT_GT(last_row_max_climb_log2(pb), 8.0) << "the ramp no longer climbs past the lazy threshold";
  }
  const Result naive = attention_reference<float, true>(pb);
  const Result ref = attention_reference<double, false>(pb, pb.backward_on_naive_o ? &naive.out : nullptr);
  if (path_wanted("sm80")) {
    ScopedEnv path("FLASHGPT_ATTENTION_PATH", "sm80");
    // Both tile shapes of every kernel (the tuning knobs of flash_attention.cu).
    for (const char* tile : {"0", "1"}) {
      ScopedEnv fwd_tile("FLASHGPT_ATTENTION_FWD_TILE", tile), bwd_tile("FLASHGPT_ATTENTION_BWD_TILE", tile);
      const std::string label = std::string("sm80 tile ") + tile;
      check_against(pb, ref, naive, label + " atomic-dQ");
      ScopedEnv det("FLASHGPT_DETERMINISTIC", "1");
      check_against(pb, ref, naive, label + " deterministic");
    }
  }
  if (path_wanted("sm90") && is_hopper()) {
    ScopedEnv path("FLASHGPT_ATTENTION_PATH", "sm90");
    // Every backward schedule: one block per item; persistent on every SM (an item or
    // fewer per block at these sizes); persistent on 7 blocks, so that each block walks
    // through items of different key tiles, heads and batches (both K/V buffers, the
    // hand-over from one item to the next, uneven shares). The TMA dQ the same three ways
    // (its own K/V buffering at D = 128). Also the owner-mode dQ, with a block per (batch,
    // head) and with 2 blocks claiming several each. The flat dQ as the tma one. The tma and atomic items also in
    // groups of 2 and of 5 (batch, head) pairs (at these sizes auto makes one group of
    // them all; 5 leaves a smaller last group at B·H = 6).
    struct Config { const char* schedule; const char* blocks; const char* dq; const char* group = nullptr; };
    for (const Config& k : {Config{"grid", nullptr, "atomic"}, Config{"persistent", nullptr, "atomic"},
                            Config{"persistent", "7", "atomic"}, Config{"persistent", "7", "atomic", "5"},
                            Config{"grid", nullptr, "tma"}, Config{"persistent", nullptr, "tma"},
                            Config{"persistent", "7", "tma"}, Config{"persistent", "7", "tma", "2"},
                            Config{"grid", nullptr, "flat"}, Config{"persistent", nullptr, "flat"},
                            Config{"persistent", "7", "flat"}, Config{"persistent", "7", "flat", "2"},
                            Config{"grid", nullptr, "owner"}, Config{"persistent", "2", "owner"}}) {
      ScopedEnv sched("FLASHGPT_ATTENTION_BWD_SCHEDULE", k.schedule), blocks("FLASHGPT_ATTENTION_BWD_BLOCKS", k.blocks),
          dq("FLASHGPT_ATTENTION_BWD_DQ", k.dq), group("FLASHGPT_ATTENTION_BWD_HEAD_GROUP", k.group);
      check_against(pb, ref, naive, std::string("sm90 ") + k.schedule + (k.blocks ? std::string(":") + k.blocks : "") +
                                        " " + k.dq + "-dQ" + (k.group ? std::string(" groups of ") + k.group : ""));
    }
    // The sm90 backward has no deterministic dQ: this mode must fall back to sm80's.
    ScopedEnv det("FLASHGPT_DETERMINISTIC", "1");
    check_against(pb, ref, naive, "sm90 deterministic");
  }
  if (path_wanted("sm90ws") && is_hopper()) {  // the warp-specialised TMA forward
    ScopedEnv path("FLASHGPT_ATTENTION_PATH", "sm90ws");
    // Every tile shape (unset, the tile rule picks one of them by shape: "auto" below):
    // two consumers with 128-key tiles; at D = 128 176-key tiles (so a partial last key
    // tile at every T here), and at D = 64 three consumer warpgroups (192 query rows a
    // block).
    for (const char* tile : {"0", "1"}) {
      ScopedEnv fwd_tile("FLASHGPT_ATTENTION_FWD_TILE", tile);
      check_against(pb, ref, naive, std::string("sm90ws tile ") + tile);
      // Tile 1's persistent kernel: three consumers; none for 176-key tiles (those run a
      // block per query tile, checked above).
      if (tile[0] == '1' && c.D == 128) continue;
      // A block per query tile, where auto may take the persistent kernel (a sequence's
      // last block may hold fewer rows than consumers: its idle consumers leave at once).
      {
        ScopedEnv sched("FLASHGPT_ATTENTION_FWD_SCHEDULE", "grid");
        check_against(pb, ref, naive, std::string("sm90ws tile ") + tile + " grid");
      }
      // The persistent schedule on every SM (the grid that balances its rounds), and on
      // 3 blocks, so that each block walks through query tiles of different heads and
      // batches; three consumers each in auto's order (claimed tiles), in rounds, and
      // claimed in groups of 4 pairs (B·H = 6 here: a shorter last group).
      const bool claims = tile[0] == '1';
      for (const char* blocks : {static_cast<const char*>(nullptr), "3"})
        for (const char* group : {static_cast<const char*>(nullptr), "0", "4"}) {
          if (group && !claims) continue;
          ScopedEnv sched("FLASHGPT_ATTENTION_FWD_SCHEDULE", "persistent"), n("FLASHGPT_ATTENTION_FWD_BLOCKS", blocks),
              g("FLASHGPT_ATTENTION_FWD_HEAD_GROUP", group);
          check_against(pb, ref, naive,
                        std::string("sm90ws tile ") + tile + " persistent" + (blocks ? " on 3 blocks" : "") +
                            (group ? std::string(" head group ") + group : ""));
        }
    }
    // One consumer warpgroup, two blocks an SM (auto's at D = 64 without a mask below T = 1024).
    ScopedEnv one("FLASHGPT_ATTENTION_FWD_CONSUMERS", "1");
    check_against(pb, ref, naive, "sm90ws one consumer");
  }
  if (path_wanted("auto")) {
    ScopedEnv path("FLASHGPT_ATTENTION_PATH", "auto");
    check_against(pb, ref, naive, "auto");
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int D : {64, 128})
    for (bool causal : {true, false})
      for (int T : {1, 17, 113, 239, 1023, 1024, 4100}) {
        // Long sequences: few heads, so the fp64 reference stays quick.
        const int B = T > 2048 ? 1 : 2, H = T > 2048 ? 2 : 3;
        cases.push_back({B, T, H, D, causal});
      }
  // D = 64 without a mask, T = 448: a split last tile of four key tiles (1023 and 1024:
  // eight), whose V the producer loads in another order than K's (tile_choice.h's
  // sm90ws_split_v_at).
  cases.push_back({2, 448, 3, 64, false});
  // Scores whose running max climbs along the keys (ramped_problem): the lazy max's moves.
  for (int D : {64, 128})
    for (bool causal : {true, false}) cases.push_back({2, 1023, 3, D, causal, true});
  cases.push_back({1, 4100, 2, 64, true, true});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Cuda, FlashAttentionVsReference, testing::ValuesIn(all_cases()), case_name);

// ---- one sequence of a million tokens, checked on sampled rows and columns -------------
// The cases above stop at T = 4100. At T = 1,048,583 (one sequence, the regime of the
// 1M-token training step) an exact reference of every element would take hours, but a
// query row's O, LSE and dQ need only that row against its keys, and a key's dK and dV
// only the rows at and after it. So: O, LSE and dQ of the first row, 15 rows spread over
// the sequence and the last 48; dK and dV of the last 48 keys (whose rows are all among
// those). Same references (fp64 and the naive bf16 yardstick, with the flash forward's
// rounding), same per-element rule and floors as above.
struct Sampled {
  std::vector<double> out, lse, dq, dk, dv;               // rows × D (lse: rows)
  std::vector<double> lse_floor, dq_floor, dk_floor;     // ref64 only
};

template <class Real, bool kBf16>
Sampled sampled_reference(const Problem& pb, const std::vector<int>& rows, int first_col) {
  const int T = pb.T, h = 0;  // B = 1; the first head
  const size_t R = rows.size(), K = size_t(T - first_col);
  std::vector<RowTerms> terms(R);
#pragma omp parallel for schedule(dynamic)
  for (int64_t k = 0; k < int64_t(R); ++k) terms[size_t(k)] = row_terms<Real, kBf16>(pb, 0, h, rows[size_t(k)]);
  Sampled r;
  for (const RowTerms& t : terms) {
    r.out.insert(r.out.end(), t.o.begin(), t.o.end());
    r.dq.insert(r.dq.end(), t.dq.begin(), t.dq.end());
    r.dq_floor.insert(r.dq_floor.end(), t.dq_floor.begin(), t.dq_floor.end());
    r.lse.push_back(t.lse);
    r.lse_floor.push_back(t.lse_floor);
  }
  // Keys first_col … T−1: the rows at and after them are the last K of `rows`.
  const size_t tail0 = R - K;
  for (size_t c = 0; c < K; ++c) {
    const ColTerms ct = col_terms<Real, kBf16>(pb, 0, h, first_col + int(c), [&](int i) -> const RowTerms& {
      return terms[tail0 + size_t(i - first_col)];
    });
    r.dk.insert(r.dk.end(), ct.dk.begin(), ct.dk.end());
    r.dv.insert(r.dv.end(), ct.dv.begin(), ct.dv.end());
    r.dk_floor.insert(r.dk_floor.end(), ct.dk_floor.begin(), ct.dk_floor.end());
  }
  return r;
}

// The sampled reference gathers the same row and column terms as the full one (row_terms,
// col_terms), for chosen rows and keys: the same bits, on the CPU (no GPU needed), for both
// precisions; this checks its indexing (which rows feed which keys' dK and dV).
TEST(FlashAttentionReference, SampledRowsAndColumnsEqualTheFullReference) {
  const int T = 301, D = 64, tail = 7;
  const Problem pb = random_problem(1, T, 2, D, true, uint32_t(test::test_rng()()));
  const std::vector<int> rows = {0, 50, 150, 294, 295, 296, 297, 298, 299, 300};
  auto check = [&](const Result& full, const Sampled& part, const char* what) {
    const size_t HD = 2 * size_t(D), W = 3 * HD;
    for (size_t k = 0; k < rows.size(); ++k) {
      const size_t i = size_t(rows[k]);
      EXPECT_EQ(part.lse[k], full.lse[i]) << what << " LSE row " << i;  // (B, H, T), head 0
      for (int d = 0; d < D; ++d) {
        EXPECT_EQ(part.out[k * D + size_t(d)], full.out[i * HD + size_t(d)]) << what << " O row " << i;
        EXPECT_EQ(part.dq[k * D + size_t(d)], full.dqkv[i * W + size_t(d)]) << what << " dQ row " << i;
      }
    }
    for (int c = 0; c < tail; ++c)
      for (int d = 0; d < D; ++d) {
        const size_t j = size_t(T - tail + c);
        EXPECT_EQ(part.dk[size_t(c) * D + size_t(d)], full.dqkv[j * W + HD + size_t(d)]) << what << " dK key " << j;
        EXPECT_EQ(part.dv[size_t(c) * D + size_t(d)], full.dqkv[j * W + 2 * HD + size_t(d)]) << what << " dV key " << j;
      }
  };
  check(attention_reference<double, false>(pb), sampled_reference<double, false>(pb, rows, T - tail), "fp64");
  check(attention_reference<float, true>(pb), sampled_reference<float, true>(pb, rows, T - tail), "naive");
}

// A flash backward emulated on the CPU (fp32, the dot products in 16-element pieces as the
// tensor cores take them, P = 2^(s·scale·log2 e − LSE·log2 e), dS and P rounded to bf16,
// dQ summed key tile by key tile): from O, LSE and the inputs, dQ, dK, dV (B,T,3,H,D).
// d_scale multiplies D = rowsum(dO∘O), to make a wrong backward.
std::vector<double> emulated_flash_backward(const Problem& pb, const std::vector<double>& o,
                                            const std::vector<double>& lse, float d_scale = 1.f) {
  const int B = pb.B, T = pb.T, H = pb.H, D = pb.D, kKeyTile = 128;
  const float scale = 1.f / std::sqrt(float(D)), log2e = 1.4426950408889634f;
  auto dot16 = [D](const float* x, const float* y) {
    float s = 0;
    for (int d0 = 0; d0 < D; d0 += 16) {
      float piece = 0;
      for (int d = d0; d < d0 + 16; ++d) piece += x[d] * y[d];
      s += piece;
    }
    return s;
  };
  std::vector<double> dqkv(pb.qkv.size());
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      std::vector<float> oi(static_cast<size_t>(D)), dlt(static_cast<size_t>(T));
      for (int i = 0; i < T; ++i) {
        for (int d = 0; d < D; ++d) oi[size_t(d)] = float(o[((size_t(b) * T + i) * H + h) * D + size_t(d)]);
        dlt[size_t(i)] = dot16(oi.data(), pb.dO(b, i, h)) * d_scale;
      }
      const size_t n = size_t(T) * size_t(D);
      std::vector<float> dq(n, 0.f), dk(n, 0.f), dv(n, 0.f), part(static_cast<size_t>(D));
      for (int j0 = 0; j0 < T; j0 += kKeyTile)
        for (int i = pb.causal ? j0 : 0; i < T; ++i) {
          std::fill(part.begin(), part.end(), 0.f);
          const float l2 = float(lse[(size_t(b) * H + h) * T + size_t(i)]) * log2e;
          for (int j = j0; j < std::min(T, j0 + kKeyTile) && (!pb.causal || j <= i); ++j) {
            const float p = std::exp2(dot16(pb.q(b, i, h), pb.k(b, j, h)) * scale * log2e - l2);
            const float dp = dot16(pb.dO(b, i, h), pb.v(b, j, h));
            const float ds = round_bf16(p * (dp - dlt[size_t(i)])), pr = round_bf16(p);
            for (int d = 0; d < D; ++d) {
              part[size_t(d)] += ds * pb.k(b, j, h)[d];
              dk[size_t(j) * D + size_t(d)] += ds * pb.q(b, i, h)[d];
              dv[size_t(j) * D + size_t(d)] += pr * pb.dO(b, i, h)[d];
            }
          }
          for (int d = 0; d < D; ++d) dq[size_t(i) * D + size_t(d)] += part[size_t(d)];
        }
      for (int t = 0; t < T; ++t)
        for (int slot = 0; slot < 3; ++slot)
          for (int d = 0; d < D; ++d) {
            const std::vector<float>& g = slot == 0 ? dq : slot == 1 ? dk : dv;
            const float x = g[size_t(t) * D + size_t(d)] * (slot < 2 ? scale : 1.f);
            dqkv[(((size_t(b) * T + t) * 3 + size_t(slot)) * H + h) * D + size_t(d)] = round_bf16(x);
          }
    }
  return dqkv;
}

// What the ramped cases' dQ and dK checks allow (see ramped_problem), on the CPU: a flash
// backward given the naive reference's O and LSE passes them, and one whose D is off by a
// relative 2^-8 (half a bf16 step) fails them.
TEST(FlashAttentionReference, SharpAttentionChecksTheBackwardOnTheNaiveO) {
  for (bool causal : {true, false}) {
    const Problem pb = ramped_problem(1, 700, 2, 64, causal, uint32_t(test::test_rng()()));
    ASSERT_TRUE(pb.backward_on_naive_o);
    const Result naive = attention_reference<float, true>(pb);
    const Result ref = attention_reference<double, false>(pb, &naive.out);
    const size_t HD = size_t(pb.H) * pb.D;
    auto slot_of = [&](const std::vector<double>& v, int s) {
      std::vector<double> r;
      for (size_t i = 0; i < v.size(); ++i)
        if ((i / HD) % 3 == size_t(s)) r.push_back(v[i]);
      return r;
    };
    for (float d_scale : {1.f, 1.f + 1.f / 256}) {
      const std::vector<double> ours = emulated_flash_backward(pb, naive.out, naive.lse, d_scale);
      size_t bad_dq = 0;
      for (int s = 0; s < 3; ++s) {
        const std::vector<double> floor = slot_of(ref.dqkv_floor, s);
        const test::RuleResult r = test::check_rule(slot_of(ours, s), slot_of(naive.dqkv, s), slot_of(ref.dqkv, s),
                                                    pb.D, test::unit_roundoff(DType::bf16), &floor);
        if (d_scale == 1.f) {
          EXPECT_EQ(r.bad, 0u) << (causal ? "causal" : "full") << " slot " << s << " worst ratio " << r.worst_ratio;
        }
        if (s == 0) bad_dq = r.bad;
      }
      if (d_scale != 1.f) {
        EXPECT_GT(bad_dq, ref.dqkv.size() / 3 / 20) << (causal ? "causal" : "full");
      }
    }
  }
}

TEST(CudaFlashAttention, MillionTokenSequenceOnSampledRowsAndColumns) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int T = 1048583, H = 2, D = 64, kTail = 48;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess || free_b < (size_t(4) << 30))
    GTEST_SKIP() << "needs 4 GiB of free device memory";
  // Inputs from the test's seed: uniform in [-2, 2), bf16, generated in parallel.
  Problem pb{1, T, H, D, true, {}, {}};
  pb.qkv.resize(size_t(T) * 3 * H * D);
  pb.dout.resize(size_t(T) * H * D);
  const uint64_t seed = test::test_rng()();
  auto fill = [&](std::vector<float>& v, uint64_t salt) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(v.size()); ++i) {
      uint64_t z = (seed ^ salt) * 0x9E3779B97F4A7C15ull + uint64_t(i) * 0xD1B54A32D192ED03ull + 1;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      v[size_t(i)] = round_bf16(float(double(z >> 11) * 0x1.0p-53 * 4.0 - 2.0));
    }
  };
  fill(pb.qkv, 1);
  fill(pb.dout, 2);
  std::vector<int> rows = {0};
  for (int k = 1; k <= 15; ++k) rows.push_back(int(int64_t(T - kTail) * k / 16));
  for (int i = T - kTail; i < T; ++i) rows.push_back(i);
  const Sampled ref = sampled_reference<double, false>(pb, rows, T - kTail);
  const Sampled naive = sampled_reference<float, true>(pb, rows, T - kTail);
  const size_t HD = size_t(H) * D, W = 3 * HD;
  std::vector<const char*> paths = {"auto", "sm80"};
  if (is_hopper()) paths.push_back("sm90ws");  // TMA coordinates at a million rows
  for (const char* path : paths) {
    ScopedEnv env("FLASHGPT_ATTENTION_PATH", path);
    DeviceRun run;
    run_flash(pb, run);
    if (HasFatalFailure()) return;
    std::vector<double> o, l, dq, dk, dv;
    for (int i : rows) {
      l.push_back(run.lse[size_t(i)]);  // (B, H, T): head 0
      for (int d = 0; d < D; ++d) {
        o.push_back(run.out[size_t(i) * HD + size_t(d)]);
        dq.push_back(run.dqkv[size_t(i) * W + size_t(d)]);
      }
    }
    for (int j = T - kTail; j < T; ++j)
      for (int d = 0; d < D; ++d) {
        dk.push_back(run.dqkv[size_t(j) * W + HD + size_t(d)]);
        dv.push_back(run.dqkv[size_t(j) * W + 2 * HD + size_t(d)]);
      }
    const std::string label = std::string(path) + " T=1048583";
    const std::vector<double> none(ref.out.size(), 0.0), none_v(ref.dv.size(), 0.0);
    test::expect_rule(o, naive.out, ref.out, D, test::unit_roundoff(DType::bf16), label + " O", &none);
    test::expect_rule(l, naive.lse, ref.lse, 1, test::unit_roundoff(DType::f32), label + " LSE", &ref.lse_floor);
    test::expect_rule(dq, naive.dq, ref.dq, D, test::unit_roundoff(DType::bf16), label + " dQ", &ref.dq_floor);
    test::expect_rule(dk, naive.dk, ref.dk, D, test::unit_roundoff(DType::bf16), label + " dK", &ref.dk_floor);
    test::expect_rule(dv, naive.dv, ref.dv, D, test::unit_roundoff(DType::bf16), label + " dV", &none_v);
  }
}

// Deterministic mode gives the same bits twice. (Suite names hold "Cuda" so that the GPU
// suite, scripts/test_gpu.sh's '*Cuda*', runs them.)
TEST(CudaFlashAttention, DeterministicModeIsBitwiseRepeatable) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Problem pb = random_problem(2, 777, 2, 64, true, 1234);
  ScopedEnv det("FLASHGPT_DETERMINISTIC", "1");
  DeviceRun a, b;
  run_flash(pb, a);
  run_flash(pb, b);
  EXPECT_EQ(std::memcmp(a.dqkv.data(), b.dqkv.data(), a.dqkv.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)), 0);
}

// The two Hopper forwards do the same arithmetic in the same order with the same 128-key
// tiles (sm90ws's tile 0 at both head dims; its overlap of the softmax with the previous
// P·V changes the schedule, not the order of the additions): the same bits. Lengths that
// give 1, 2 and many key tiles, partial tiles, causal and not.
TEST(CudaFlashAttention, Sm90WsForwardIsBitwiseEqualToSm90) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  if (!is_hopper()) GTEST_SKIP() << "the sm90 paths need a Hopper GPU";
  for (int D : {64, 128})
    for (bool causal : {true, false})
      for (int T : {1, 17, 128, 129, 300, 448, 1023, 4100}) {
        const Problem pb = random_problem(2, T, 3, D, causal, uint32_t(test::test_rng()()));
        auto run = [&](const char* path, const char* tile, const char* sched = nullptr, const char* blocks = nullptr) {
          ScopedEnv p("FLASHGPT_ATTENTION_PATH", path), t("FLASHGPT_ATTENTION_FWD_TILE", tile),
              s("FLASHGPT_ATTENTION_FWD_SCHEDULE", sched), n("FLASHGPT_ATTENTION_FWD_BLOCKS", blocks);
          DeviceRun r;
          run_flash(pb, r);
          return r;
        };
        const DeviceRun plain = run("sm90", "0"), ws = run("sm90ws", "0");
        if (HasFatalFailure()) return;
        const std::string shape = " D=" + std::to_string(D) + (causal ? " causal" : " full") +
                                  " T=" + std::to_string(T);
        // Rows from `rows` on are left out: a split short tile's (below).
        auto expect_same = [&](const DeviceRun& r, const std::string& name, int rows = -1) {
          if (rows < 0) rows = T;
          ASSERT_EQ(plain.out.size(), r.out.size());
          ASSERT_EQ(plain.lse.size(), r.lse.size());
          const size_t HD = size_t(pb.H) * D;
          int out_rows = 0, lse_rows = 0;  // rows that differ
          for (int bt = 0; bt < pb.B * T; ++bt)
            if (bt % T < rows)
              out_rows += std::memcmp(&plain.out[bt * HD], &r.out[bt * HD], HD * sizeof(float)) != 0;
          for (int bht = 0; bht < pb.B * pb.H * T; ++bht)
            if (bht % T < rows) lse_rows += std::memcmp(&plain.lse[bht], &r.lse[bht], sizeof(float)) != 0;
          EXPECT_EQ(out_rows, 0) << name << shape << ": O differs from sm90's";
          EXPECT_EQ(lse_rows, 0) << name << shape << ": LSE differs from sm90's";
        };
        expect_same(ws, "sm90ws");
        expect_same(run("sm90ws", "0", "grid"), "sm90ws grid");
        expect_same(run("sm90ws", "0", "persistent"), "sm90ws persistent");
        expect_same(run("sm90ws", "0", "persistent", "3"), "sm90ws persistent on 3 blocks");
        {  // (the runs above: a list after the rounds where it balances the blocks better,
           // tile_choice.h's persistent_forward_schedule; T = 4100 causal, all of it a list)
          ScopedEnv rounds("FLASHGPT_ATTENTION_FWD_TAIL", "off");
          expect_same(run("sm90ws", "0", "persistent"), "sm90ws persistent, rounds alone");
          expect_same(run("sm90ws", "0", "persistent", "3"), "sm90ws persistent on 3 blocks, rounds alone");
        }
        if (D == 64) {  // three consumers, 192 rows a block: under a causal mask each consumer
                        // skips the key tiles it sees none of, so its rows meet sm90's tiles;
                        // one consumer, 64 rows a block, the same 128-key tiles
          // Without a mask the grid kernel's short tile of one consumer's rows splits its key
          // tiles between the three (tile_choice.h's sm90ws_splits_keys): other additions
          // there, left out here and checked against the reference by
          // FlashAttentionVsReference (T = 239, 448, 1023, 1024). (With one key tile, T <= 128,
          // consumer 0 runs it all: the same bits.)
          const int grid_rows = !causal && cuda::attn::sm90ws_splits_last_tile(T) && T > 128 ? (T - 1) / 192 * 192 : T;
          const DeviceRun ws3 = run("sm90ws", "1");
          {
            expect_same(run("sm90ws", "1", "grid"), "sm90ws tile 1 grid", grid_rows);
            expect_same(run("sm90ws", "1", "persistent"), "sm90ws tile 1 persistent");
            expect_same(run("sm90ws", "1", "persistent", "3"), "sm90ws tile 1 persistent on 3 blocks");
            // Claimed tiles (FLASHGPT_ATTENTION_FWD_HEAD_GROUP; the runs above: auto's groups
            // of 64), one launch after another on one stream, so that each finds the claim
            // counter reset by the one before (a tile left out would leave its NaN rows).
            for (const char* group : {"0", "4", "all", "1"}) {
              ScopedEnv g("FLASHGPT_ATTENTION_FWD_HEAD_GROUP", group);
              const std::string name = std::string("sm90ws tile 1 persistent, head group ") + group;
              expect_same(run("sm90ws", "1", "persistent"), name);
              expect_same(run("sm90ws", "1", "persistent", "5"), name + " on 5 blocks");
            }
          }
          DeviceRun ws1;
          {
            ScopedEnv one("FLASHGPT_ATTENTION_FWD_CONSUMERS", "1");
            ws1 = run("sm90ws", "0");
          }
          if (HasFatalFailure()) return;
          expect_same(ws3, "sm90ws tile 1", grid_rows);  // (auto's schedule: the grid without a mask)
          expect_same(ws1, "sm90ws one consumer");
        }
      }
}

// The persistent forward keeps its schedule (grid, rounds and list) for the last shape asked:
// a launch at another length with the same heads and knobs must make a new one, or it would
// leave tiles out (longer) or take tiles past the end (shorter).
TEST(CudaFlashAttention, Sm90WsPersistentScheduleFollowsTheLength) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  if (!is_hopper()) GTEST_SKIP() << "the sm90 paths need a Hopper GPU";
  ScopedEnv t("FLASHGPT_ATTENTION_FWD_TILE", "0");
  for (int T : {4100, 300, 2050, 4100, 129}) {
    const Problem pb = random_problem(2, T, 3, 64, true, uint32_t(test::test_rng()()));
    DeviceRun plain, persistent;
    {
      ScopedEnv path("FLASHGPT_ATTENTION_PATH", "sm90");
      run_flash(pb, plain);
    }
    {
      ScopedEnv path("FLASHGPT_ATTENTION_PATH", "sm90ws"), s("FLASHGPT_ATTENTION_FWD_SCHEDULE", "persistent");
      run_flash(pb, persistent);
    }
    if (HasFatalFailure()) return;
    ASSERT_EQ(plain.out.size(), persistent.out.size());
    EXPECT_EQ(std::memcmp(plain.out.data(), persistent.out.data(), plain.out.size() * sizeof(float)), 0)
        << "T=" << T << ": O differs from sm90's";
    EXPECT_EQ(std::memcmp(plain.lse.data(), persistent.lse.data(), plain.lse.size() * sizeof(float)), 0)
        << "T=" << T << ": LSE differs from sm90's";
  }
}

// ---- launcher preconditions (no GPU needed: they are checked before any launch) ---------
AttentionForward fake_forward(int D, DType dtype, uintptr_t offset) {
  alignas(256) static unsigned char dummy[1024];  // never dereferenced
  void* p = dummy + offset;
  AttentionForward f;
  f.B = 1, f.T = 4, f.H = 2, f.D = D;
  f.qkv = Tensor(p, dtype, Device::cuda, {4, 3 * 2 * int64_t(D)});
  f.out = Tensor(p, dtype, Device::cuda, {4, 2 * int64_t(D)});
  f.lse = Tensor(p, DType::f32, Device::cuda, {2, 4});
  return f;
}

TEST(FlashAttention, RejectsUnsupportedHeadDim) {
  test::expect_input_error([] { cuda::flash_attention_forward(fake_forward(80, DType::bf16, 0), nullptr); },
                           {"head dim 64 or 128, got 80"});
}

TEST(FlashAttention, RejectsFp32) {
  EXPECT_THROW(cuda::flash_attention_forward(fake_forward(64, DType::f32, 0), nullptr), InputError);
}

TEST(FlashAttention, RejectsMisalignedPointer) {
  EXPECT_THROW(cuda::flash_attention_forward(fake_forward(64, DType::bf16, 8), nullptr), InputError);
}

AttentionBackward fake_backward() {
  alignas(256) static unsigned char dummy[4096];  // never dereferenced
  AttentionBackward a;
  a.B = 1, a.T = 4, a.H = 2, a.D = 64;
  a.qkv = a.dqkv = Tensor(dummy, DType::bf16, Device::cuda, {4, 3 * 2 * 64});
  a.out = a.dout = Tensor(dummy, DType::bf16, Device::cuda, {4, 2 * 64});
  a.lse = a.delta = Tensor(dummy, DType::f32, Device::cuda, {2, 4});
  return a;
}

TEST(CudaFlashAttention, RejectsBadBackwardSchedule) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  if (!is_hopper()) GTEST_SKIP() << "the schedule belongs to the sm90 backward";
  ScopedEnv path("FLASHGPT_ATTENTION_PATH", "sm90");
  alignas(16) static unsigned char workspace[16];  // never dereferenced
  for (const char* bad : {"dynamic", "Persistent"}) {
    ScopedEnv sched("FLASHGPT_ATTENTION_BWD_SCHEDULE", bad);
    EXPECT_THROW(cuda::flash_attention_backward(fake_backward(), workspace, nullptr), InputError) << bad;
  }
  ScopedEnv sched("FLASHGPT_ATTENTION_BWD_SCHEDULE", "persistent");
  for (const char* bad : {"0", "-3", "7x"}) {
    ScopedEnv blocks("FLASHGPT_ATTENTION_BWD_BLOCKS", bad);
    EXPECT_THROW(cuda::flash_attention_backward(fake_backward(), workspace, nullptr), InputError) << bad;
  }
  ScopedEnv dq("FLASHGPT_ATTENTION_BWD_DQ", "owners");
  EXPECT_THROW(cuda::flash_attention_backward(fake_backward(), workspace, nullptr), InputError);
}

TEST(CudaFlashAttention, RejectsBadForwardConsumers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  if (!is_hopper()) GTEST_SKIP() << "the knob belongs to the sm90ws forward";
  ScopedEnv path("FLASHGPT_ATTENTION_PATH", "sm90ws");
  for (const char* bad : {"0", "2", "one", " 1"}) {
    ScopedEnv consumers("FLASHGPT_ATTENTION_FWD_CONSUMERS", bad);
    EXPECT_THROW(cuda::flash_attention_forward(fake_forward(64, DType::bf16, 0), nullptr), InputError) << bad;
  }
}

TEST(CudaFlashAttention, RejectsBadForwardSchedule) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  if (!is_hopper()) GTEST_SKIP() << "the knobs belong to the sm90ws forward";
  ScopedEnv path("FLASHGPT_ATTENTION_PATH", "sm90ws");
  for (const char* bad : {"Persistent", "on", " grid"}) {
    ScopedEnv sched("FLASHGPT_ATTENTION_FWD_SCHEDULE", bad);
    EXPECT_THROW(cuda::flash_attention_forward(fake_forward(128, DType::bf16, 0), nullptr), InputError) << bad;
  }
  ScopedEnv sched("FLASHGPT_ATTENTION_FWD_SCHEDULE", "persistent");
  for (const char* bad : {"0", "-3", "many"}) {
    ScopedEnv blocks("FLASHGPT_ATTENTION_FWD_BLOCKS", bad);
    EXPECT_THROW(cuda::flash_attention_forward(fake_forward(128, DType::bf16, 0), nullptr), InputError) << bad;
  }
  // The persistent kernels' knobs, checked on every call: a bad value is an InputError on a
  // shape that takes the grid too, at both head dims (for the head group, the tile knob 1:
  // the three-consumer kernel at D = 64, which reads it).
  for (const char* schedule : {"persistent", "grid"}) {
    ScopedEnv s("FLASHGPT_ATTENTION_FWD_SCHEDULE", schedule);
    for (int D : {64, 128}) {
      for (const char* bad : {"on", "0", "rounds"}) {
        ScopedEnv tail("FLASHGPT_ATTENTION_FWD_TAIL", bad);
        test::expect_input_error([D] { cuda::flash_attention_forward(fake_forward(D, DType::bf16, 0), nullptr); },
                                 {"FLASHGPT_ATTENTION_FWD_TAIL", bad});
      }
      for (const char* bad : {"-1", "some", "2x"}) {
        ScopedEnv tile("FLASHGPT_ATTENTION_FWD_TILE", "1"), group("FLASHGPT_ATTENTION_FWD_HEAD_GROUP", bad);
        test::expect_input_error([D] { cuda::flash_attention_forward(fake_forward(D, DType::bf16, 0), nullptr); },
                                 {"FLASHGPT_ATTENTION_FWD_HEAD_GROUP", bad});
      }
    }
  }
}

TEST(FlashAttention, RejectsUnknownPath) {
  ScopedEnv path("FLASHGPT_ATTENTION_PATH", "sm70");
  EXPECT_THROW(cuda::flash_attention_forward(fake_forward(64, DType::bf16, 0), nullptr), InputError);
}

}  // namespace
}  // namespace flashgpt
