// CPU attention (kernels/cpu/attention.cpp) through the Ops interface:
//  * both algorithms' backward against central finite differences in fp64 (causal and
//    not, T of 1, 7, 33, several H and D), with dqkv pre-filled with garbage (overwrite);
//  * the naive forward against a direct fp64 formula (O and LSE);
//  * flash equals naive: O, LSE, dQ, dK, dV, for T in {1, 7, 33, 50} (not multiples of
//    the 16×16 tiles), fp64 to 1e-12 and fp32 within twice naive fp32's own error.
#include <gtest/gtest.h>
#include <cmath>
#include <limits>
#include "kernels/ops.h"
#include "testing.h"

namespace flashgpt {
namespace {

using test::expect_all_close;
using test::expect_gradient_matches;
using test::fill_uniform;
using test::HostTensor;
using test::RandomProjection;
using test::test_rng;

const char* algo_name(AttentionAlgo a) { return a == AttentionAlgo::flash ? "flash" : "naive"; }

struct Shape {
  int B, T, H, D;
};

// Buffers of one attention problem in dtype T, with forward/backward through Ops.
template <class T> struct AttentionProblem {
  Shape s;
  bool causal;
  AttentionAlgo algo;
  HostTensor<T> qkv, out, lse, probs, dout, dqkv, delta;

  AttentionProblem(Shape sh, bool c, AttentionAlgo a)
      : s(sh), causal(c), algo(a),
        qkv({s.B, s.T, 3 * s.H * s.D}), out({s.B, s.T, s.H, s.D}), lse({s.B, s.H, s.T}),
        probs({s.B, s.H, s.T, s.T}), dout({s.B, s.T, s.H, s.D}), dqkv({s.B, s.T, 3 * s.H * s.D}),
        delta({s.B, s.H, s.T}) {}

  void forward(Ops& ops) {
    AttentionForward f;
    f.out = out, f.lse = lse, f.qkv = qkv, f.B = s.B, f.T = s.T, f.H = s.H, f.D = s.D;
    f.causal = causal, f.algo = algo;
    if (algo == AttentionAlgo::naive) f.probs = probs;
    ops.attention_forward(f);
  }
  void backward(Ops& ops) {
    AttentionBackward b;
    b.dqkv = dqkv, b.dout = dout, b.qkv = qkv, b.out = out, b.lse = lse, b.delta = delta;
    b.B = s.B, b.T = s.T, b.H = s.H, b.D = s.D, b.causal = causal, b.algo = algo;
    if (algo == AttentionAlgo::naive) b.probs = probs;
    ops.attention_backward(b);
  }
};

// ---------------------------------------------------------------- gradients ----
struct GradCase {
  AttentionAlgo algo;
  bool causal;
  Shape shape;
};

std::string case_name(const GradCase& c) {
  return std::string(algo_name(c.algo)) + (c.causal ? "_causal" : "_full") + "_B" +
         std::to_string(c.shape.B) + "_T" + std::to_string(c.shape.T) + "_H" +
         std::to_string(c.shape.H) + "_D" + std::to_string(c.shape.D);
}
void PrintTo(const GradCase& c, std::ostream* os) { *os << case_name(c); }

class CpuAttentionGrad : public ::testing::TestWithParam<GradCase> {};

TEST_P(CpuAttentionGrad, BackwardMatchesFiniteDifferences) {
  const GradCase gc = GetParam();
  auto ops = make_cpu_ops();
  auto rng = test_rng();
  AttentionProblem<double> p(gc.shape, gc.causal, gc.algo);
  fill_uniform(p.qkv, rng, -1.5, 1.5);  // scores spread enough for a peaked softmax
  RandomProjection loss_of(p.out.numel(), rng);
  auto loss = [&] {
    p.forward(*ops);
    return loss_of(p.out);
  };
  loss();
  p.dout.vec() = loss_of.weights().vec();
  fill_uniform(p.dqkv, rng);  // overwritten: garbage must not survive
  fill_uniform(p.delta, rng);
  p.backward(*ops);
  expect_gradient_matches("dqkv", p.dqkv.vec(), p.qkv, loss);
}

std::vector<GradCase> grad_cases() {
  std::vector<GradCase> cases;
  for (AttentionAlgo algo : {AttentionAlgo::naive, AttentionAlgo::flash})
    for (bool causal : {true, false})
      for (Shape s : {Shape{2, 1, 2, 4}, Shape{2, 7, 3, 8}, Shape{1, 33, 2, 5}, Shape{2, 33, 1, 16}})
        cases.push_back({algo, causal, s});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cpu, CpuAttentionGrad, ::testing::ValuesIn(grad_cases()),
                         [](const auto& info) { return case_name(info.param); });

// ---------------------------------------------------------------- forward ----
// O and LSE of the naive algorithm against the definition, written independently here.
TEST(CpuAttention, NaiveForwardMatchesDefinition) {
  auto ops = make_cpu_ops();
  auto rng = test_rng();
  for (bool causal : {true, false}) {
    const Shape s{2, 19, 3, 6};
    AttentionProblem<double> p(s, causal, AttentionAlgo::naive);
    fill_uniform(p.qkv, rng, -2, 2);
    p.forward(*ops);
    std::vector<double> want_out(p.out.numel()), want_lse(p.lse.numel());
    const double scale = 1 / std::sqrt(double(s.D));
    auto at = [&](int b, int t, int which, int h, int d) {
      return p.qkv[(((int64_t(b) * s.T + t) * 3 + which) * s.H + h) * s.D + d];
    };
    for (int b = 0; b < s.B; ++b)
      for (int h = 0; h < s.H; ++h)
        for (int i = 0; i < s.T; ++i) {
          const int last = causal ? i : s.T - 1;
          std::vector<double> e(last + 1);
          double sum = 0;
          for (int j = 0; j <= last; ++j) {
            double dot = 0;
            for (int d = 0; d < s.D; ++d) dot += at(b, i, 0, h, d) * at(b, j, 1, h, d);
            e[j] = std::exp(dot * scale);  // scores are small here: no max needed
            sum += e[j];
          }
          want_lse[(int64_t(b) * s.H + h) * s.T + i] = std::log(sum);
          for (int d = 0; d < s.D; ++d) {
            double o = 0;
            for (int j = 0; j <= last; ++j) o += e[j] / sum * at(b, j, 2, h, d);
            want_out[((int64_t(b) * s.T + i) * s.H + h) * s.D + d] = o;
          }
        }
    SCOPED_TRACE(causal ? "causal" : "full");
    expect_all_close(p.out.vec(), want_out, 1e-13, 1e-14, "O");
    expect_all_close(p.lse.vec(), want_lse, 1e-13, 1e-14, "LSE");
  }
}

// ---------------------------------------------------------------- flash == naive ----
template <class T> struct Results {
  std::vector<T> out, lse, dqkv;
};

template <class T>
Results<T> run(Ops& ops, Shape s, bool causal, AttentionAlgo algo, const std::vector<double>& qkv,
               const std::vector<double>& dout) {
  AttentionProblem<T> p(s, causal, algo);
  for (size_t i = 0; i < qkv.size(); ++i) p.qkv[int64_t(i)] = T(qkv[i]);
  for (size_t i = 0; i < dout.size(); ++i) p.dout[int64_t(i)] = T(dout[i]);
  p.forward(ops);
  p.backward(ops);
  return {p.out.vec(), p.lse.vec(), p.dqkv.vec()};
}

class CpuAttentionFlashVsNaive : public ::testing::TestWithParam<std::tuple<bool, int>> {};

// fp64: the two algorithms sum in different orders (online rescaling vs one pass), so
// they agree to rounding: ~T·u relative to the magnitudes involved, far below 1e-12.
TEST_P(CpuAttentionFlashVsNaive, Fp64FlashEqualsNaive) {
  const auto [causal, T] = GetParam();
  const Shape s{2, T, 4, 16};  // T=50: enough work to run the (b,h) loop in parallel
  auto ops = make_cpu_ops();
  auto rng = test_rng(uint64_t(T) * 2 + causal);
  HostTensor<double> qkv({s.B, s.T, 3 * s.H * s.D}), dout({s.B, s.T, s.H, s.D});
  fill_uniform(qkv, rng, -2, 2);
  fill_uniform(dout, rng);
  const auto flash = run<double>(*ops, s, causal, AttentionAlgo::flash, qkv.vec(), dout.vec());
  const auto naive = run<double>(*ops, s, causal, AttentionAlgo::naive, qkv.vec(), dout.vec());
  constexpr double kTol = 1e-12;
  expect_all_close(flash.out, naive.out, kTol, kTol, "O");
  expect_all_close(flash.lse, naive.lse, kTol, kTol, "LSE");
  expect_all_close(flash.dqkv, naive.dqkv, kTol, kTol, "dQKV");
}

// fp32, FlashAttention-3's criterion: flash in fp32 must be no further from the fp64
// reference than twice what the naive algorithm in fp32 is, per tensor (max abs error),
// plus a few ulps of the tensor's magnitude for tensors where naive fp32 happens to be
// (nearly) exact.
TEST_P(CpuAttentionFlashVsNaive, Fp32FlashIsAsAccurateAsNaive) {
  const auto [causal, T] = GetParam();
  const Shape s{2, T, 4, 16};  // T=50: enough work to run the (b,h) loop in parallel
  auto ops = make_cpu_ops();
  auto rng = test_rng(uint64_t(T) * 2 + causal);
  HostTensor<double> qkv({s.B, s.T, 3 * s.H * s.D}), dout({s.B, s.T, s.H, s.D});
  fill_uniform(qkv, rng, -2, 2);
  fill_uniform(dout, rng);
  for (auto& x : qkv.vec()) x = double(float(x));  // the same inputs in both precisions
  for (auto& x : dout.vec()) x = double(float(x));
  const auto ref = run<double>(*ops, s, causal, AttentionAlgo::naive, qkv.vec(), dout.vec());
  const auto flash = run<float>(*ops, s, causal, AttentionAlgo::flash, qkv.vec(), dout.vec());
  const auto naive = run<float>(*ops, s, causal, AttentionAlgo::naive, qkv.vec(), dout.vec());
  constexpr double kUlps = 4 * std::numeric_limits<float>::epsilon();
  auto check = [&](const char* what, const auto& f, const auto& n, const std::vector<double>& r) {
    const double naive_err = test::max_abs_diff(n, r), flash_err = test::max_abs_diff(f, r);
    EXPECT_LE(flash_err, 2 * naive_err + kUlps * test::max_abs(r))
        << what << ": flash fp32 error " << flash_err << ", naive fp32 error " << naive_err;
  };
  check("O", flash.out, naive.out, ref.out);
  check("LSE", flash.lse, naive.lse, ref.lse);
  check("dQKV", flash.dqkv, naive.dqkv, ref.dqkv);
}

INSTANTIATE_TEST_SUITE_P(Cpu, CpuAttentionFlashVsNaive,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(1, 7, 33, 50)),
                         [](const ::testing::TestParamInfo<std::tuple<bool, int>>& info) {
                           return std::string(std::get<0>(info.param) ? "causal" : "full") +
                                  "_T" + std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace flashgpt
