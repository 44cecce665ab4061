// Tests of the CPU op set (kernels/cpu/) through the Ops interface: every backward
// against central finite differences in fp64 on awkward shapes (T of 1, 7, 33; C not a
// power of two; OC != C), accumulate-vs-overwrite semantics, exact small-integer
// matmuls in fp32, AdamW against a scalar formula, sum_squares, casts and bf16 rounding.
// Attention has its own file (test_attention_cpu.cpp).
#include <gtest/gtest.h>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/softmax_ce.h"
#include "kernels/ops.h"
#include "src/bf16.h"
#include "testing.h"

namespace flashgpt {
namespace {

using test::expect_all_close;
using test::expect_gradient_matches;
using test::fill_ints;
using test::fill_uniform;
using test::HostTensor;
using test::RandomProjection;
using test::test_rng;
using H64 = HostTensor<double>;

constexpr int kB = 2;
constexpr int kLengths[] = {1, 7, 33};

std::vector<double> plus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> s(a.size());
  for (size_t i = 0; i < a.size(); ++i) s[i] = a[i] + b[i];
  return s;
}

class CpuOps : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_cpu_ops();
};

// ---------------------------------------------------------------- embedding ----
TEST_F(CpuOps, EmbeddingBackwardMatchesFiniteDifferencesAndAccumulates) {
  constexpr int64_t V = 11, C = 24, kMaxT = 40;
  for (int T : kLengths) {
    SCOPED_TRACE("T=" + std::to_string(T));
    auto rng = test_rng(T);
    HostTensor<int32_t> tokens({kB, T});
    fill_ints(tokens, rng, 0, int32_t(V));  // repeats are likely: they must add up
    H64 wte({V, C}), wpe({kMaxT, C}), out({kB, T, C});
    fill_uniform(wte, rng);
    fill_uniform(wpe, rng);
    RandomProjection loss_of(out.numel(), rng);
    auto loss = [&] {
      ops->embedding_forward(out, tokens, wte, wpe);
      return loss_of(out);
    };
    H64 dwte({V, C}), dwpe({kMaxT, C});
    fill_uniform(dwte, rng);  // a prior gradient: backward must add to it
    fill_uniform(dwpe, rng);
    const H64 dwte0 = dwte, dwpe0 = dwpe;
    ops->embedding_backward(dwte, dwpe, loss_of.weights(), tokens);
    expect_gradient_matches("dwte", dwte.vec(), wte, loss, dwte0.vec());
    expect_gradient_matches("dwpe", dwpe.vec(), wpe, loss, dwpe0.vec());
  }
}

// ---------------------------------------------------------------- layernorm ----
TEST_F(CpuOps, LayerNormBackwardMatchesFiniteDifferences) {
  constexpr int64_t C = 36;
  for (int T : kLengths) {
    SCOPED_TRACE("T=" + std::to_string(T));
    auto rng = test_rng(T);
    const int64_t N = kB * T;
    H64 inp({N, C}), w({C}), b({C}), out({N, C}), mean({N}), rstd({N});
    fill_uniform(inp, rng, -2, 3);  // a non-zero mean per row
    fill_uniform(w, rng);
    fill_uniform(b, rng);
    RandomProjection loss_of(out.numel(), rng);
    auto loss = [&] {
      ops->layernorm_forward(out, mean, rstd, inp, w, b);
      return loss_of(out);
    };
    loss();
    H64 dinp({N, C}), dw({C}), db({C});
    fill_uniform(dinp, rng);  // all three accumulate
    fill_uniform(dw, rng);
    fill_uniform(db, rng);
    const H64 dinp0 = dinp, dw0 = dw, db0 = db;
    ops->layernorm_backward(dinp, dw, db, loss_of.weights(), inp, w, mean, rstd);
    expect_gradient_matches("dinp", dinp.vec(), inp, loss, dinp0.vec());
    expect_gradient_matches("dweight", dw.vec(), w, loss, dw0.vec());
    expect_gradient_matches("dbias", db.vec(), b, loss, db0.vec());
  }
}

TEST_F(CpuOps, LayerNormForwardSavesMeanAndRstd) {
  constexpr int64_t N = 5, C = 24;
  auto rng = test_rng();
  H64 inp({N, C}), w({C}), b({C}), out({N, C}), mean({N}), rstd({N});
  fill_uniform(inp, rng, -1, 4);
  fill_uniform(w, rng);
  fill_uniform(b, rng);
  ops->layernorm_forward(out, mean, rstd, inp, w, b);
  std::vector<double> want_mean(N), want_rstd(N);
  for (int64_t n = 0; n < N; ++n) {
    double s = 0, ss = 0;
    for (int64_t c = 0; c < C; ++c) s += inp[n * C + c];
    for (int64_t c = 0; c < C; ++c) ss += std::pow(inp[n * C + c] - s / C, 2);
    want_mean[n] = s / C;
    want_rstd[n] = 1 / std::sqrt(ss / C + 1e-5);  // biased variance, eps 1e-5
  }
  expect_all_close(mean.vec(), want_mean, 1e-14, 0, "mean");
  expect_all_close(rstd.vec(), want_rstd, 1e-14, 0, "rstd");
  // The output against the definition, element by element: (x - mean)·rstd·w + b, a few
  // fp64 roundings of its terms: within 1e-14 of (|x| + |mean|)·rstd·|w| + |b|.
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const double x = inp[n * C + c], m = want_mean[n], r = want_rstd[n];
      const double terms = (std::fabs(x) + std::fabs(m)) * r * std::fabs(w[c]) + std::fabs(b[c]);
      EXPECT_NEAR(out[n * C + c], (x - m) * r * w[c] + b[c], 1e-14 * terms) << n << "," << c;
    }
}

// out[b, t] = wte[token[b, t]] + wpe[t], exactly (one fp64 addition), for every position
// including the last and tokens that repeat.
TEST_F(CpuOps, EmbeddingForwardIsTheLookupPlusThePosition) {
  constexpr int64_t V = 11, C = 24, kMaxT = 40;
  for (int T : kLengths) {
    SCOPED_TRACE("T=" + std::to_string(T));
    auto rng = test_rng(T);
    HostTensor<int32_t> tokens({kB, T});
    fill_ints(tokens, rng, 0, int32_t(V));
    H64 wte({V, C}), wpe({kMaxT, C}), out({kB, T, C});
    fill_uniform(wte, rng);
    fill_uniform(wpe, rng);
    fill_uniform(out, rng);  // overwritten
    ops->embedding_forward(out, tokens, wte, wpe);
    for (int64_t b = 0; b < kB; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < C; ++c)
          ASSERT_EQ(out[(b * T + t) * C + c], wte[tokens[b * T + t] * C + c] + wpe[t * C + c])
              << "b " << b << " t " << t << " c " << c;
  }
}

// residual = inp1 + inp2 (a second output, seen by the loss too), out = LN(residual).
// Backward as the model does it: d(residual) holds the gradient from its other use,
// and layernorm_backward accumulates into it.
TEST_F(CpuOps, ResidualLayerNormBackwardMatchesFiniteDifferences) {
  constexpr int64_t C = 36;
  for (int T : kLengths) {
    SCOPED_TRACE("T=" + std::to_string(T));
    auto rng = test_rng(T);
    const int64_t N = kB * T;
    H64 inp1({N, C}), inp2({N, C}), w({C}), b({C}), res({N, C}), out({N, C}), mean({N}), rstd({N});
    fill_uniform(inp1, rng);
    fill_uniform(inp2, rng, 0, 2);
    fill_uniform(w, rng);
    fill_uniform(b, rng);
    RandomProjection loss_out(out.numel(), rng), loss_res(res.numel(), rng);
    auto loss = [&] {
      ops->residual_layernorm_forward(res, out, mean, rstd, inp1, inp2, w, b);
      return loss_out(out) + loss_res(res);
    };
    loss();
    H64 dres = loss_res.weights(), dw({C}), db({C});
    ops->layernorm_backward(dres, dw, db, loss_out.weights(), res, w, mean, rstd);
    expect_gradient_matches("dinp1", dres.vec(), inp1, loss);
    expect_gradient_matches("dinp2", dres.vec(), inp2, loss);
    expect_gradient_matches("dweight", dw.vec(), w, loss);
    expect_gradient_matches("dbias", db.vec(), b, loss);
  }
}

// ---------------------------------------------------------------- matmul ----
struct MatmulCase {
  bool bias, gelu;
};

TEST_F(CpuOps, MatmulBackwardMatchesFiniteDifferences) {
  constexpr int64_t C = 36, OC = 20;  // OC != C, neither a power of two
  for (MatmulCase mc : {MatmulCase{false, false}, MatmulCase{true, false}, MatmulCase{true, true}})
    for (int T : kLengths) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " bias=" << mc.bias << " gelu=" << mc.gelu);
      auto rng = test_rng(T * 4 + mc.bias * 2 + mc.gelu);
      const int64_t N = kB * T;
      H64 inp({N, C}), w({OC, C}), b({OC}), out({N, OC}), pre({N, OC});
      fill_uniform(inp, rng);
      fill_uniform(w, rng, -0.5, 0.5);
      fill_uniform(b, rng);
      RandomProjection loss_of(out.numel(), rng);
      MatmulForward fwd;
      fwd.out = out, fwd.inp = inp, fwd.weight = w, fwd.gelu = mc.gelu;
      if (mc.bias) fwd.bias = b;
      if (mc.gelu) fwd.pre_gelu = pre;
      auto loss = [&] {
        ops->matmul_forward(fwd);
        return loss_of(out);
      };
      loss();
      // With the GELU epilogue, backward starts from d(pre-activation).
      H64 dout = loss_of.weights();
      if (mc.gelu) ops->gelu_backward(dout, pre, dout);
      H64 dinp({N, C}), dw({OC, C}), db({OC});
      fill_uniform(dinp, rng);  // overwritten: garbage must not leak through
      fill_uniform(dw, rng);    // accumulate
      fill_uniform(db, rng);
      const H64 dw0 = dw, db0 = db;
      MatmulBackward bwd;
      bwd.dinp = dinp, bwd.dweight = dw, bwd.dout = dout, bwd.inp = inp, bwd.weight = w;
      if (mc.bias) bwd.dbias = db;
      ops->matmul_backward(bwd);
      expect_gradient_matches("dinp", dinp.vec(), inp, loss);
      expect_gradient_matches("dweight", dw.vec(), w, loss, dw0.vec());
      if (mc.bias) expect_gradient_matches("dbias", db.vec(), b, loss, db0.vec());
    }
}

// The model's MLP: h = GELU(x) feeds this matmul; backward with dinp_gelu_pre = x
// writes dL/dx directly (the DGELU epilogue).
TEST_F(CpuOps, MatmulBackwardDGeluEpilogueMatchesFiniteDifferences) {
  constexpr int64_t C = 36, OC = 24;
  for (int T : kLengths) {
    SCOPED_TRACE("T=" + std::to_string(T));
    auto rng = test_rng(T);
    const int64_t N = kB * T;
    H64 x({N, C}), h({N, C}), w({OC, C}), out({N, OC});
    fill_uniform(x, rng, -3, 3);  // GELU's curved region and both tails
    fill_uniform(w, rng);
    RandomProjection loss_of(out.numel(), rng);
    MatmulForward fwd;
    fwd.out = out, fwd.inp = h, fwd.weight = w;
    auto loss = [&] {
      ops->gelu_forward(h, x);
      ops->matmul_forward(fwd);
      return loss_of(out);
    };
    loss();
    H64 dx({N, C}), dw({OC, C});
    fill_uniform(dx, rng);  // overwritten
    MatmulBackward bwd;
    bwd.dinp = dx, bwd.dweight = dw, bwd.dout = loss_of.weights(), bwd.inp = h, bwd.weight = w;
    bwd.dinp_gelu_pre = x;
    ops->matmul_backward(bwd);
    expect_gradient_matches("d(gelu pre-activation)", dx.vec(), x, loss);
  }
}

// Small integers make every product and sum exact in fp32 (CUTLASS's trick), so fp32
// results must equal the reference bit for bit — on shapes that cover full 4×32 tiles
// and ragged edges.
TEST_F(CpuOps, MatmulFp32IsExactOnSmallIntegers) {
  constexpr int64_t N = 67, C = 129, OC = 70;
  auto rng = test_rng();
  auto ints = [&](HostTensor<float>& t, int lo, int hi) {
    std::uniform_int_distribution<int> u(lo, hi);
    for (auto& v : t.vec()) v = float(u(rng));
  };
  HostTensor<float> inp({N, C}), w({OC, C}), b({OC}), out({N, OC}), dout({N, OC});
  HostTensor<float> dinp({N, C}), dw({OC, C}), db({OC});
  ints(inp, -8, 8), ints(w, -8, 8), ints(b, -8, 8), ints(dout, -8, 8), ints(dw, -8, 8),
      ints(db, -8, 8);
  const HostTensor<float> dw0 = dw, db0 = db;
  MatmulForward fwd;
  fwd.out = out, fwd.inp = inp, fwd.weight = w, fwd.bias = b;
  ops->matmul_forward(fwd);
  MatmulBackward bwd;
  bwd.dinp = dinp, bwd.dweight = dw, bwd.dbias = db, bwd.dout = dout, bwd.inp = inp,
  bwd.weight = w;
  ops->matmul_backward(bwd);

  std::vector<float> want_out(N * OC), want_dinp(N * C), want_dw(dw0.vec()), want_db(db0.vec());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b[o];
      for (int64_t c = 0; c < C; ++c) s += double(inp[n * C + c]) * w[o * C + c];
      want_out[n * OC + o] = float(s);
      want_db[o] += dout[n * OC + o];
      for (int64_t c = 0; c < C; ++c) {
        want_dinp[n * C + c] += dout[n * OC + o] * w[o * C + c];
        want_dw[o * C + c] += dout[n * OC + o] * inp[n * C + c];
      }
    }
  EXPECT_EQ(out.vec(), want_out);
  EXPECT_EQ(dinp.vec(), want_dinp);
  EXPECT_EQ(dw.vec(), want_dw);
  EXPECT_EQ(db.vec(), want_db);
}

// ---------------------------------------------------------------- GELU ----
// The matmul kernel at every x86-64 level this CPU runs (SSE4.2, AVX2, AVX-512: other
// tile shapes and vector widths), with A as it is and given transposed (gemm_tn), gives
// the bits of a plain loop that sums each element in k order (this test is built without fused multiply-adds), on shapes that leave partial
// tiles on every side, both ways of walking the tiles, with and without accumulation.
template <class T>
void check_gemm_levels(std::mt19937_64& rng) {
  std::normal_distribution<double> n(0, 1);
  struct Shape { int64_t M, K, P; };
  for (const Shape sh : {Shape{1, 1, 1}, Shape{7, 13, 65}, Shape{33, 70, 129}, Shape{130, 9, 3},
                         Shape{5, 300, 1000}, Shape{1000, 40, 7}}) {
    std::vector<T> A(size_t(sh.M * sh.K)), B(size_t(sh.K * sh.P)), init(size_t(sh.M * sh.P));
    for (auto& x : A) x = T(n(rng));
    for (auto& x : B) x = T(n(rng));
    for (auto& x : init) x = T(n(rng));
    for (bool accumulate : {false, true}) {
      std::vector<T> want = init;
      for (int64_t i = 0; i < sh.M; ++i)
        for (int64_t j = 0; j < sh.P; ++j) {
          T acc = accumulate ? want[size_t(i * sh.P + j)] : T(0);
          for (int64_t k = 0; k < sh.K; ++k) {
            const T prod = A[size_t(i * sh.K + k)] * B[size_t(k * sh.P + j)];
            acc = acc + prod;
          }
          want[size_t(i * sh.P + j)] = acc;
        }
      std::vector<T> At(A.size());  // A transposed, (K, M), for gemm_tn
      for (int64_t i = 0; i < sh.M; ++i)
        for (int64_t k = 0; k < sh.K; ++k) At[size_t(k * sh.M + i)] = A[size_t(i * sh.K + k)];
      for (int level = 2; level <= flashgpt::cpu::gemm_level(); ++level) {
        std::vector<T> got = init;
        flashgpt::cpu::gemm_nn_at(level, got.data(), A.data(), B.data(), sh.M, sh.K, sh.P, accumulate);
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(T)))
            << "level " << level << ", M " << sh.M << " K " << sh.K << " P " << sh.P << ", accumulate " << accumulate;
        got = init;
        flashgpt::cpu::gemm_tn_at(level, got.data(), At.data(), B.data(), sh.M, sh.K, sh.P, accumulate);
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(T)))
            << "gemm_tn, level " << level << ", M " << sh.M << " K " << sh.K << " P " << sh.P << ", accumulate "
            << accumulate;
      }
    }
  }
}

// The forward with a few rows (decoding: dot products against W, several outputs at a
// time) gives the bits of the plain k-order loop too, with output counts that leave a
// partial group of outputs.
TEST_F(CpuOps, MatmulForwardWithFewRowsGivesThePlainLoopsBits) {
  auto rng = test_rng();
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const int64_t N : {1, 3, 7})
    for (const int64_t OC : {1, 13, 64, 77}) {
      const int64_t C = 45;
      HostTensor<float> inp({N, C}), w({OC, C}), out({N, OC});
      for (auto& v : inp.vec()) v = nd(rng);
      for (auto& v : w.vec()) v = nd(rng);
      MatmulForward fwd;
      fwd.out = out, fwd.inp = inp, fwd.weight = w;
      ops->matmul_forward(fwd);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t o = 0; o < OC; ++o) {
          float acc = 0.f;
          for (int64_t k = 0; k < C; ++k) {
            const float prod = inp[n * C + k] * w[o * C + k];
            acc = acc + prod;
          }
          ASSERT_EQ(0, std::memcmp(&acc, &out[n * OC + o], sizeof(float))) << "N " << N << " OC " << OC << " o " << o;
        }
    }
}

TEST(CpuGemm, EveryVectorLevelGivesTheBitsOfThePlainLoop) {
  auto rng = test::test_rng();
  std::printf("[   GEMM   ] levels 2..%d (x86-64-v2 SSE4.2, v3 AVX2, v4 AVX-512)\n", flashgpt::cpu::gemm_level());
  check_gemm_levels<float>(rng);
  check_gemm_levels<double>(rng);
}

TEST_F(CpuOps, GeluBackwardMatchesFiniteDifferences) {
  auto rng = test_rng();
  H64 x({3, 7, 37}), y({3, 7, 37});
  fill_uniform(x, rng, -5, 5);
  RandomProjection loss_of(y.numel(), rng);
  auto loss = [&] {
    ops->gelu_forward(y, x);
    return loss_of(y);
  };
  loss();
  H64 dx({3, 7, 37});
  fill_uniform(dx, rng);  // overwritten
  ops->gelu_backward(dx, x, loss_of.weights());
  expect_gradient_matches("dinp", dx.vec(), x, loss);
}

TEST_F(CpuOps, GeluForwardIsTheTanhApproximation) {
  // Reference values of 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))).
  H64 x({4}), y({4});
  x.vec() = {-3.0, -0.5, 1.0, 2.5};
  ops->gelu_forward(y, x);
  std::vector<double> want(4);
  for (int i = 0; i < 4; ++i) {
    const double v = x[i];
    want[i] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  }
  expect_all_close(y.vec(), want, 1e-15, 1e-300, "gelu");
  EXPECT_NEAR(y[2], 0.8411919906082768, 1e-15);  // GELU_tanh(1), independently known
}

// ---------------------------------------------------------------- cross-entropy ----
TEST_F(CpuOps, SoftmaxCrossEntropyMatchesFiniteDifferencesWithPaddingAndIgnoredTargets) {
  constexpr int V = 37, Vp = 48;  // padded vocabulary: columns 37..47 must be ignored
  constexpr double kDloss = 0.75;  // exact in fp32, as the op takes it
  for (int T : kLengths) {
    SCOPED_TRACE("T=" + std::to_string(T));
    auto rng = test_rng(T);
    const int64_t N = kB * T;
    HostTensor<int32_t> targets({N});
    fill_ints(targets, rng, 0, V);
    targets[N - 1] = -1;  // ignored
    H64 logits({N, Vp}), losses({N});
    fill_uniform(logits, rng, -4, 4);
    for (int64_t n = 0; n < N; ++n)  // huge padding values would dominate if read
      for (int j = V; j < Vp; ++j) logits[n * Vp + j] = 1e3;
    auto loss = [&] {
      ops->softmax_cross_entropy(losses, logits, targets, V, /*dloss=*/0);  // no gradient
      long double s = 0;
      for (int64_t n = 0; n < N; ++n) s += kDloss * losses[n];
      return s;
    };
    loss();
    // Loss values against a direct formula; ignored row: 0.
    for (int64_t n = 0; n < N; ++n) {
      double want = 0;
      if (targets[n] >= 0) {
        double sum = 0;
        for (int j = 0; j < V; ++j) sum += std::exp(logits[n * Vp + j]);
        want = std::log(sum) - logits[n * Vp + targets[n]];
      }
      EXPECT_NEAR(losses[n], want, 1e-13 * (1 + std::fabs(want))) << "row " << n;
    }
    H64 dlogits = logits;  // overwritten in place with the gradient
    ops->softmax_cross_entropy(losses, dlogits, targets, V, float(kDloss));
    expect_gradient_matches("dlogits", dlogits.vec(), logits, loss);
    for (int j = 0; j < Vp; ++j) EXPECT_EQ(dlogits[(N - 1) * Vp + j], 0.0) << "ignored row, col " << j;
  }
}

// The cross-entropy's exponential (softmax_ce_kernel.cpp) against the C library's: within
// 2 ulp over the whole normal range of e^x for x <= 0, exactly 1 at 0, 0 below -708, NaN for
// NaN, and the same bits at every vector level.
TEST(CpuCrossEntropy, ExpNonpositiveIsWithinTwoUlp) {
  auto rng = test::test_rng();
  std::uniform_real_distribution<double> wide(-708.0, 0.0), near0(-1e-3, 0.0);
  auto ulps = [](double a, double b) {
    int64_t ia, ib;
    std::memcpy(&ia, &a, 8);
    std::memcpy(&ib, &b, 8);
    return std::llabs(ia - ib);
  };
  const int top = flashgpt::cpu::gemm_level();
  for (int i = 0; i < 200000; ++i) {
    const double x = i % 4 == 0 ? near0(rng) : i % 4 == 1 ? -double(i % 708) - 0.5 : wide(rng);
    const double got = flashgpt::cpu::exp_nonpositive_at(top, x), want = std::exp(x);
    ASSERT_LE(ulps(got, want), 2) << "x = " << x << ": " << got << " against " << want;
    for (int level = 2; level < top; ++level)
      ASSERT_EQ(flashgpt::cpu::exp_nonpositive_at(level, x), got) << "level " << level << ", x = " << x;
  }
  for (int level = 2; level <= top; ++level) {
    EXPECT_EQ(flashgpt::cpu::exp_nonpositive_at(level, 0.0), 1.0);
    EXPECT_EQ(flashgpt::cpu::exp_nonpositive_at(level, -708.5), 0.0);
    EXPECT_EQ(flashgpt::cpu::exp_nonpositive_at(level, -INFINITY), 0.0);
    EXPECT_TRUE(std::isnan(flashgpt::cpu::exp_nonpositive_at(level, NAN)));
  }
}

// A row of the cross-entropy gives the same bits at every vector level (fixed summation
// lanes), and the loss and gradient of the plain formula (std::exp, a sequential sum) to
// within 1e-14, over GPT-2's vocabulary and lengths that leave a partial group of lanes.
TEST(CpuCrossEntropy, RowKernelIsTheSameAtEveryLevelAndMatchesThePlainFormula) {
  auto rng = test::test_rng();
  std::normal_distribution<double> nd(0.0, 3.0);
  for (const int64_t V : {int64_t(1), int64_t(13), int64_t(64), int64_t(50257)}) {
    const int64_t Vp = V + 7;
    std::vector<double> logits(static_cast<size_t>(Vp));
    for (auto& x : logits) x = nd(rng);
    for (const int64_t target : {int64_t(0), V - 1, V / 2}) {
      double max = -INFINITY, sum = 0;
      for (int64_t j = 0; j < V; ++j) max = std::max(max, logits[size_t(j)]);
      for (int64_t j = 0; j < V; ++j) sum += std::exp(logits[size_t(j)] - max);
      const double want_loss = max + std::log(sum) - logits[size_t(target)];
      std::vector<double> first;
      double first_loss = 0;
      for (int level = 2; level <= flashgpt::cpu::gemm_level(); ++level) {
        std::vector<double> row = logits, e(static_cast<size_t>(V));
        const double loss = flashgpt::cpu::ce_row_at(level, row.data(), V, Vp, target, 0.5f, e.data());
        EXPECT_NEAR(loss, want_loss, 1e-14 * (1 + std::fabs(want_loss))) << "V " << V << " level " << level;
        for (int64_t j = 0; j < Vp; ++j) {
          const double want = j >= V ? 0.0 : 0.5 * (std::exp(logits[size_t(j)] - max) / sum - (j == target));
          ASSERT_NEAR(row[size_t(j)], want, 1e-14) << "V " << V << " level " << level << " column " << j;
        }
        if (level == 2) first = row, first_loss = loss;
        EXPECT_EQ(loss, first_loss) << "V " << V << " level " << level;
        EXPECT_EQ(row, first) << "V " << V << " level " << level;
      }
    }
  }
}

// ---------------------------------------------------------------- optimizer ----
TEST_F(CpuOps, AdamWStepMatchesScalarFormula) {
  constexpr int64_t n = 1003;
  auto rng = test_rng();
  H64 p({n}), g({n}), m({n}), v({n});
  fill_uniform(p, rng);
  fill_uniform(g, rng);
  fill_uniform(m, rng, -0.1, 0.1);
  fill_uniform(v, rng, 0, 0.01);
  const H64 p0 = p, m0 = m, v0 = v;
  AdamWArgs a;
  a.param = p, a.grad = g, a.m = m, a.v = v;
  a.lr = 3e-3f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay = 0.1f;
  a.grad_scale = 0.5f, a.step = 3;
  ops->adamw_update(a);
  std::vector<double> want_p(n), want_m(n), want_v(n);
  const double b1 = a.beta1, b2 = a.beta2;
  for (int64_t i = 0; i < n; ++i) {
    const double gi = g[i] * double(a.grad_scale);
    want_m[i] = b1 * m0[i] + (1 - b1) * gi;
    want_v[i] = b2 * v0[i] + (1 - b2) * gi * gi;
    const double mhat = want_m[i] / (1 - std::pow(b1, 3)), vhat = want_v[i] / (1 - std::pow(b2, 3));
    want_p[i] = p0[i] - double(a.lr) * (mhat / (std::sqrt(vhat) + double(a.eps)) +
                                        double(a.weight_decay) * p0[i]);
  }
  // The same formula in the same precision: only a few roundings apart.
  expect_all_close(m.vec(), want_m, 1e-14, 1e-300, "m");
  expect_all_close(v.vec(), want_v, 1e-14, 1e-300, "v");
  expect_all_close(p.vec(), want_p, 1e-14, 1e-300, "param");
}

TEST_F(CpuOps, SumSquaresAddsIntoOutput) {
  auto rng = test_rng();
  H64 g({300003});  // parallel, several chunks and a ragged one
  fill_uniform(g, rng);
  H64 out({1});
  out[0] = 2.5;  // adds, does not overwrite
  ops->sum_squares(out, g);
  double want = 2.5;
  for (double x : g.vec()) want += x * x;
  EXPECT_NEAR(out[0], want, 1e-12 * want);
  HostTensor<float> g32({777}), out32({1});
  for (int64_t i = 0; i < g32.numel(); ++i) g32[i] = float(g[i]);
  ops->sum_squares(out32, g32);
  double want32 = 0;
  for (float x : g32.vec()) want32 += double(x) * x;
  EXPECT_NEAR(out32[0], want32, 1e-6 * want32);  // accumulated in double, rounded once
}

TEST_F(CpuOps, ScaleMultipliesEveryElement) {
  HostTensor<float> x({5});
  x.vec() = {1, -2, 0.5f, 0, 3};
  ops->scale(x, 0.25f);
  EXPECT_EQ(x.vec(), (std::vector<float>{0.25f, -0.5f, 0.125f, 0, 0.75f}));
}

// ---------------------------------------------------------------- fp32 ----
// The fp32 instantiations against the fp64 ones (validated above) on the same
// fp32-representable inputs. Every element here is a handful of fp32 roundings after
// reductions of <= 40 terms that are accumulated in double (layernorm, cross-entropy)
// or are elementwise (GELU, AdamW), so it is within kRoundings·u of the fp64 value,
// measured against the tensor's largest magnitude.
template <class T> HostTensor<T> convert(const H64& x, std::initializer_list<int64_t> shape) {
  HostTensor<T> y(shape);
  for (int64_t i = 0; i < x.numel(); ++i) y[i] = T(x[i]);
  return y;
}

template <class T> void expect_fp32_close(const HostTensor<float>& f, const HostTensor<T>& d,
                                          const std::string& what) {
  constexpr double kRoundings = 16;
  const double atol = kRoundings * std::numeric_limits<float>::epsilon() * test::max_abs(d.vec());
  expect_all_close(f.vec(), d.vec(), 0, atol, what + " fp32 vs fp64");
}

TEST_F(CpuOps, Fp32OpsMatchFp64WithinFp32Rounding) {
  constexpr int64_t N = 13, C = 40, V = 37, Vp = 40;
  auto rng = test_rng();
  H64 x({N, C}), w({C}), b({C}), dy({N, C}), p({N * C}), g({N * C}), m({N * C}), v({N * C});
  for (H64* t : {&x, &w, &b, &dy, &p, &g, &m}) fill_uniform(*t, rng, -2, 2);
  fill_uniform(v, rng, 0, 1);
  for (H64* t : {&x, &w, &b, &dy, &p, &g, &m, &v})  // the same inputs in both precisions
    for (double& e : t->vec()) e = double(float(e));
  HostTensor<int32_t> targets({N});
  fill_ints(targets, rng, -1, V);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    std::vector<HostTensor<T>> r;
    HostTensor<T> xt = convert<T>(x, {N, C}), wt = convert<T>(w, {C}), bt = convert<T>(b, {C});
    HostTensor<T> out({N, C}), mean({N}), rstd({N}), dx({N, C}), dw({C}), db({C});
    ops->layernorm_forward(out, mean, rstd, xt, wt, bt);
    ops->layernorm_backward(dx, dw, db, convert<T>(dy, {N, C}), xt, wt, mean, rstd);
    HostTensor<T> gl({N, C}), dgl({N, C});
    ops->gelu_forward(gl, xt);
    ops->gelu_backward(dgl, xt, convert<T>(dy, {N, C}));
    HostTensor<T> logits = convert<T>(x, {N, Vp}), losses({N});
    ops->softmax_cross_entropy(losses, logits, targets, V, 0.5f);
    AdamWArgs a;
    HostTensor<T> pt = convert<T>(p, {N * C}), mt = convert<T>(m, {N * C}),
                  vt = convert<T>(v, {N * C}), gt = convert<T>(g, {N * C});
    a.param = pt, a.grad = gt, a.m = mt, a.v = vt, a.lr = 0.01f, a.step = 2;
    a.weight_decay = 0.1f;
    ops->adamw_update(a);
    for (auto* t : {&out, &mean, &rstd, &dx, &dw, &db, &gl, &dgl, &logits, &losses, &pt, &mt, &vt})
      r.push_back(*t);
    return r;
  };
  const auto f32 = run(float{});
  const auto f64 = run(double{});
  const char* names[] = {"LN out", "LN mean", "LN rstd", "LN dinp", "LN dweight", "LN dbias",
                         "GELU", "GELU backward", "dlogits", "CE loss", "AdamW param",
                         "AdamW m", "AdamW v"};
  for (size_t i = 0; i < f32.size(); ++i) expect_fp32_close(f32[i], f64[i], names[i]);
}

// ---------------------------------------------------------------- memory, cast ----
TEST_F(CpuOps, AllocIsAlignedAndCopiesRoundTrip) {
  void* p = ops->alloc(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  Tensor t(p, DType::f32, Device::cpu, {10, 25});
  std::vector<float> src(250), back(250, -1);
  for (int i = 0; i < 250; ++i) src[i] = float(i) * 0.5f;
  ops->from_host(t, src.data());
  ops->to_host(back.data(), t);
  EXPECT_EQ(back, src);
  ops->memset_zero(t);
  ops->to_host(back.data(), t);
  EXPECT_EQ(back, std::vector<float>(250, 0.0f));
  ops->free(p);
}

TEST(CpuBf16, RoundsToNearestEven) {
  const float one = 1.0f, tie_down = 1.0f + 0x1p-8f, tie_up = 1.0f + 3 * 0x1p-8f;
  EXPECT_EQ(float_to_bf16(one), 0x3F80);
  EXPECT_EQ(float_to_bf16(tie_down), 0x3F80);  // halfway to 0x3F81: to the even 0x3F80
  EXPECT_EQ(float_to_bf16(tie_up), 0x3F82);    // halfway between 0x3F81 and 0x3F82
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // just above the tie
  EXPECT_EQ(float_to_bf16(-tie_down), 0xBF80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  // A double just above a tie must not be rounded twice (to the tie in float, then even).
  EXPECT_EQ(double_to_bf16(1.0 + 0x1p-8 + 0x1p-40), 0x3F81);
  EXPECT_EQ(double_to_bf16(1.0 + 0x1p-8), 0x3F80);
  EXPECT_EQ(double_to_bf16(-(1.0 + 0x1p-8 + 0x1p-40)), 0xBF81);
  EXPECT_EQ(double_to_bf16(1e300), 0x7F80);
}

TEST(CpuBf16, EveryFiniteBf16SurvivesARoundTrip) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = bf16_to_float(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f), h);
    ASSERT_EQ(double_to_bf16(double(f)), h);
  }
}

TEST_F(CpuOps, CastRoundTripsBetweenFp32Fp64AndBf16) {
  auto rng = test_rng();
  H64 d({257});
  fill_uniform(d, rng, -100, 100);
  d[0] = 1.0 + 0x1p-8 + 0x1p-40;  // the double-rounding trap
  HostTensor<float> f({257});
  HostTensor<uint16_t> h({257});
  H64 back({257});
  ops->cast(f, d);
  for (int64_t i = 0; i < 257; ++i) ASSERT_EQ(f[i], float(d[i]));
  ops->cast(back, f);
  for (int64_t i = 0; i < 257; ++i) ASSERT_EQ(back[i], double(f[i]));
  ops->cast(h, d);
  for (int64_t i = 0; i < 257; ++i) ASSERT_EQ(h[i], double_to_bf16(d[i]));
  EXPECT_EQ(h[0], 0x3F81);
  ops->cast(back, h);  // bf16 -> fp64 is exact
  for (int64_t i = 0; i < 257; ++i) ASSERT_EQ(back[i], double(bf16_to_float(h[i])));
  HostTensor<uint16_t> h2({257});
  ops->cast(f, h);
  ops->cast(h2, f);  // bf16 -> fp32 -> bf16 is the identity
  EXPECT_EQ(h2.vec(), h.vec());
  // Within one dtype a cast is a copy of every element (a view's rows only), bit for bit.
  H64 d2({257});
  ops->cast(d2, d);
  EXPECT_EQ(d2.vec(), d.vec());
  HostTensor<float> f2({257});
  f2[0] = f2[256] = -1.f;
  ops->cast(Tensor(f2.tensor()).rows(1, 256), Tensor(f.tensor()).rows(1, 256));
  EXPECT_EQ(f2[0], -1.f);
  EXPECT_EQ(f2[256], -1.f);
  for (int64_t i = 1; i < 256; ++i) ASSERT_EQ(f2[i], f[i]) << i;
}

TEST_F(CpuOps, RejectsUnsupportedDtypesAndMismatchedShapes) {
  HostTensor<uint16_t> a({8}), b({8});
  EXPECT_THROW(ops->gelu_forward(a, b), std::runtime_error);  // bf16 is CUDA-only
  H64 x({8}), y({9}), z({8});
  EXPECT_THROW(ops->gelu_forward(y, x), std::runtime_error);
  HostTensor<float> xf({8});
  EXPECT_THROW(ops->gelu_backward(z, x, xf), std::runtime_error);  // mixed dtypes
  H64 inp({3, 5}), w({4, 6}), out({3, 4});
  MatmulForward fwd;
  fwd.out = out, fwd.inp = inp, fwd.weight = w;
  EXPECT_THROW(ops->matmul_forward(fwd), std::runtime_error);  // C mismatch
}

}  // namespace
}  // namespace flashgpt
