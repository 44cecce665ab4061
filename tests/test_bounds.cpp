// The bound that every comparison with an fp64 reference uses (testing.h, check_rule) and
// its yardstick, the naive same-precision computation (naive_ops.h), tested on the CPU
// where CI runs them:
//  * the rule is per element and per group: an exact group demands equality, small
//    elements get small bounds;
//  * NaiveOps computes the right thing (against fp64), and its bf16 storage rounds;
//  * correct fp32 ops pass against fp64 with naive as the yardstick, op by op and for the
//    whole model — and deliberately wrong ones fail, among them the one the tensor-wide
//    bound let through (non-target dlogits written as 0).
#include <gtest/gtest.h>
#include <cmath>
#include "layers/gpt2.h"
#include "tests/naive_ops.h"
#include "tests/testing.h"

namespace flashgpt::test {
namespace {

std::vector<double> doubles(const HostTensor<float>& t) { return {t.vec().begin(), t.vec().end()}; }

TEST(Bound, ExactGroupsDemandEqualityAndSmallElementsGetSmallBounds) {
  // Two rows of 64: the first computed exactly by naive, the second with errors.
  std::vector<double> ref(128), naive(128);
  for (int i = 0; i < 128; ++i) ref[i] = naive[i] = 1 + i;
  for (int i = 64; i < 128; ++i) naive[i] += (i % 2 ? 1e-6 : -1e-6);
  std::vector<double> ours = naive;
  EXPECT_EQ(check_rule(ours, naive, ref, 64, 0).bad, 0u);
  ours[3] += 1e-12;  // exact row: any difference fails
  EXPECT_EQ(check_rule(ours, naive, ref, 64, 0).bad, 1u);
  ours = naive;
  ours[70] = ref[70] + 2 * (1e-6 + check_rule(ours, naive, ref, 64, 0).lambda * 1e-6) * 0.99;
  EXPECT_EQ(check_rule(ours, naive, ref, 64, 0).bad, 0u) << "just inside the bound";
  ours[70] = ref[70] + 2 * (1e-6 + check_rule(ours, naive, ref, 64, 0).lambda * 1e-6) * 1.01;
  EXPECT_EQ(check_rule(ours, naive, ref, 64, 0).bad, 1u) << "just outside the bound";
  // Rows shorter than kMinGroup are grouped; a NaN always fails.
  ours = naive;
  ours[5] = NAN;
  EXPECT_EQ(check_rule(ours, naive, ref, 8, 0).bad, 1u);
}

TEST(Testing, ScopedEnvRestoresWhatWasThere) {
  const char* name = "FLASHGPT_SCOPED_ENV_TEST";
  unsetenv(name);
  {
    ScopedEnv a(name, "1");
    EXPECT_STREQ(std::getenv(name), "1");
    {
      ScopedEnv b(name, "2");
      EXPECT_STREQ(std::getenv(name), "2");
      ScopedEnv c(name, nullptr);
      EXPECT_EQ(std::getenv(name), nullptr);
    }
    EXPECT_STREQ(std::getenv(name), "1") << "the outer value was not restored";
  }
  EXPECT_EQ(std::getenv(name), nullptr) << "the variable was not unset again";
}

// The softmax-cross-entropy inputs of the CUDA test: 37 rows of the GPT-2 vocabulary,
// logits exactly representable in `dt` (fp32 or bf16).
struct CrossEntropyCase {
  static constexpr int V = 50257, Vp = 50304, N = 37;
  static constexpr float kDloss = 1.0f / 37;
  HostTensor<double> logits{N, Vp};
  HostTensor<int32_t> targets{N};
  CrossEntropyCase(std::mt19937_64& rng, DType dt = DType::f32) {
    fill_uniform(logits, rng, -4, 4);
    for (double& x : logits.vec()) x = dt == DType::bf16 ? bf16_to_double(double_to_bf16(x)) : double(float(x));
    fill_ints(targets, rng, 0, V);
    targets[3] = -1;
  }
  // dlogits (in place of the logits) and losses, by `ops` in dtype T.
  template <class T> std::pair<std::vector<double>, std::vector<double>> run(Ops& ops) const {
    HostTensor<T> x({N, Vp}), loss({N});
    for (int64_t i = 0; i < x.numel(); ++i) x[i] = T(logits[i]);
    ops.softmax_cross_entropy(loss, x, targets, V, kDloss);
    return {{x.vec().begin(), x.vec().end()}, {loss.vec().begin(), loss.vec().end()}};
  }
};

// The example: every non-target dlogit written as 0. Its largest is ~1e-5·dloss,
// which a bound from the tensor's largest error (the target's) let through everywhere.
// In fp32, ours is the CPU op (correct: passes); in bf16, ours is naive itself.
TEST(Bound, NonTargetDlogitsWrittenAsZeroFail) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto rng = test_rng(int(dt));
    CrossEntropyCase c(rng, dt);
    auto cpu = make_cpu_ops();
    NaiveOps naive_ops(dt == DType::bf16 ? NaiveOps::Bf16Storage::on : NaiveOps::Bf16Storage::off);
    const auto [ref, ref_loss] = c.run<double>(*cpu);
    const auto [naive, naive_loss] = c.run<float>(naive_ops);
    auto [ours, ours_loss] = dt == DType::f32 ? c.run<float>(*cpu) : c.run<float>(naive_ops);
    const double u = unit_roundoff(dt), u32 = unit_roundoff(DType::f32);
    EXPECT_EQ(check_rule(ours, naive, ref, c.Vp, u).bad, 0u);
    EXPECT_EQ(check_rule(ours_loss, naive_loss, ref_loss, 0, u32).bad, 0u);
    std::vector<double> zeroed = ours;
    size_t zeroed_count = 0;
    for (int n = 0; n < c.N; ++n)
      for (int j = 0; j < c.V; ++j)
        if (j != c.targets[n] && c.targets[n] >= 0) zeroed[size_t(n) * c.Vp + j] = 0, ++zeroed_count;
    // In fp32 every zeroed entry fails; in bf16 the smallest of a row are held to the
    // error scale of their neighbours in the row (the larger of an element's two scales,
    // see testing.h), which is larger than they are, and only most fail.
    const size_t zeroed_bad = check_rule(zeroed, naive, ref, c.Vp, u).bad;
    EXPECT_GE(zeroed_bad, dt == DType::f32 ? zeroed_count : zeroed_count * 3 / 4);
    // Probabilities from an lse off by 2^-4 (a sum over the vocabulary kept in bf16, its
    // errors compounding, say): every dlogit off by that factor. Likewise.
    std::vector<double> shifted = ours;
    for (double& g : shifted) g *= std::exp(0x1p-4);
    EXPECT_GE(check_rule(shifted, naive, ref, c.Vp, u).bad, dt == DType::f32 ? zeroed_count : zeroed_count / 3);
  }
}

// The four ops NaiveOps writes itself, against fp64: a worst-case bound per row, k·u·C
// times the row's largest magnitude (k a few roundings per term), so that naive is
// known to compute the right thing (not to be accurate: that is not its job).
TEST(NaiveOps, Fp32OpsMatchFp64) {
  auto rng = test_rng();
  auto cpu = make_cpu_ops();
  NaiveOps naive;
  constexpr int64_t N = 9, C = 200;
  HostTensor<double> x({N, C}), x2({N, C}), w({C}), b({C}), dy({N, C});
  for (auto* t : {&x, &x2, &w, &b, &dy}) {
    fill_uniform(*t, rng, -2, 2);
    for (double& v : t->vec()) v = double(float(v));
  }
  auto run = [&](Ops& ops, auto tag) {
    using T = decltype(tag);
    auto conv = [](const HostTensor<double>& s, std::initializer_list<int64_t> shape) {
      HostTensor<T> d(shape);
      for (int64_t i = 0; i < s.numel(); ++i) d[i] = T(s[i]);
      return d;
    };
    HostTensor<T> res({N, C}), out({N, C}), mean({N}), rstd({N}), dx = conv(dy, {N, C}),
        dw = conv(w, {C}), db = conv(b, {C}), ss({1});
    ops.residual_layernorm_forward(res, out, mean, rstd, conv(x, {N, C}), conv(x2, {N, C}),
                                   conv(w, {C}), conv(b, {C}));
    ops.layernorm_backward(dx, dw, db, conv(dy, {N, C}), res, conv(w, {C}), mean, rstd);
    ops.sum_squares(ss, conv(x, {N, C}));
    std::vector<std::vector<double>> r;
    for (auto* t : {&res, &out, &mean, &rstd, &dx, &dw, &db, &ss}) r.emplace_back(t->vec().begin(), t->vec().end());
    return r;
  };
  const auto got = run(naive, float{}), want = run(*cpu, double{});
  const char* names[] = {"residual", "LN out", "mean", "rstd", "dinp", "dweight", "dbias", "sum_squares"};
  const int64_t rows[] = {C, C, N, N, C, C, C, 1};
  const double k = 8 * double(N * C) * unit_roundoff(DType::f32);  // the longest sum: N·C terms
  for (size_t t = 0; t < got.size(); ++t)
    for (size_t r0 = 0; r0 < got[t].size(); r0 += size_t(rows[t])) {
      std::vector<double> g(got[t].begin() + int64_t(r0), got[t].begin() + int64_t(r0) + rows[t]);
      std::vector<double> e(want[t].begin() + int64_t(r0), want[t].begin() + int64_t(r0) + rows[t]);
      expect_all_close(g, e, 0, k * max_abs(e), std::string(names[t]) + " row at " + std::to_string(r0));
    }
  CrossEntropyCase c(rng);
  const auto [dl, loss] = c.run<float>(naive);
  const auto [dl_ref, loss_ref] = c.run<double>(*cpu);
  expect_all_close(loss, loss_ref, 0, 8 * c.V * unit_roundoff(DType::f32) * max_abs(loss_ref), "CE loss");
  // dlogits: relative to dloss (each is dloss·(p − [target])).
  expect_all_close(dl, dl_ref, 0, 8 * c.V * unit_roundoff(DType::f32) * c.kDloss, "CE dlogits");
}

TEST(NaiveOps, Bf16StorageRoundsActivationOutputsOnly) {
  auto rng = test_rng();
  NaiveOps naive(NaiveOps::Bf16Storage::on);
  constexpr int64_t N = 5, C = 64;
  HostTensor<float> x({N, C}), w({C}), b({C}), out({N, C}), mean({N}), rstd({N});
  fill_uniform(x, rng, -3, 3);
  fill_uniform(w, rng);
  fill_uniform(b, rng);
  for (auto* t : {&x, &w, &b})
    for (float& v : t->vec()) v = bf16_to_float(float_to_bf16(v));
  naive.layernorm_forward(out, mean, rstd, x, w, b);
  for (float v : out.vec()) ASSERT_EQ(v, bf16_to_float(float_to_bf16(v))) << "out not stored as bf16";
  int exact = 0;
  for (float v : rstd.vec()) exact += v == bf16_to_float(float_to_bf16(v));
  EXPECT_LT(exact, N) << "rstd (a statistic, fp32) was rounded to bf16";
}

// A whole model at the precision under test, from the same weights and batch: loss and
// every gradient (rows of the parameter's last dimension).
struct ModelRun {
  double loss;
  std::vector<double> grads;
};
ModelRun run_model(Ops& ops, DType dt, AttentionAlgo algo, const std::vector<double>& params,
                   const HostTensor<int32_t>& in, const HostTensor<int32_t>& tg) {
  const ModelConfig cfg{2, 2, 64, 500, 512, 32};
  const int B = 2, T = int(in.numel()) / 2;
  GPT2 m(cfg, ops, dt, B, T, algo);
  auto upload = [&](const Tensor& t, const std::vector<double>& v) {
    if (t.dtype == DType::f64) return ops.from_host(t, v.data());
    std::vector<float> f(v.begin(), v.end());
    ops.from_host(t, f.data());
  };
  auto download = [&](const Tensor& t) {
    std::vector<double> v(size_t(t.numel()));
    if (t.dtype == DType::f64) {
      ops.to_host(v.data(), t);
    } else {
      std::vector<float> f(v.size());
      ops.to_host(f.data(), t);
      v.assign(f.begin(), f.end());
    }
    return v;
  };
  upload(m.params(), params);
  m.set_batch(in.data(), tg.data());
  m.zero_grad();
  m.forward(1.0f / float(B * T));
  m.backward();
  return {m.last_loss(), download(m.grads())};
}

void expect_model_rule(const ModelRun& ours, const ModelRun& naive, const ModelRun& ref,
                       const std::string& what) {
  const ModelConfig cfg{2, 2, 64, 500, 512, 32};
  auto ops = make_cpu_ops();
  GPT2 layout(cfg, *ops, DType::f32, 1, 1);
  const double u = unit_roundoff(DType::f32);  // gradients are stored in fp32
  expect_rule({ours.loss}, {naive.loss}, {ref.loss}, 0, u, what + " loss");
  for (const ParamInfo& pi : layout.param_list()) {
    auto part = [&](const std::vector<double>& v) {
      return std::vector<double>(v.begin() + int64_t(pi.offset), v.begin() + int64_t(pi.offset) + pi.numel());
    };
    expect_rule(part(ours.grads), part(naive.grads), part(ref.grads), pi.shape.back(), u,
                what + " grad " + pi.name);
  }
}

// The CPU model in fp32 (which sums some reductions in double, so is at least as
// accurate as naive) against fp64 with the naive fp32 model as the yardstick — the check
// the CUDA model test makes of the GPU. And the bf16 regime, which the CPU can only
// emulate: a bf16-storage model with the flash algorithm as "ours" against the one with
// the naive algorithm as the yardstick. Weights are bf16 values, so all see the same.
TEST(Bound, ModelsAtLowerPrecisionPassAgainstFp64WithNaiveYardstick) {
  auto rng = test_rng();
  const ModelConfig cfg{2, 2, 64, 500, 512, 32};
  const int B = 2, T = 24;
  auto cpu = make_cpu_ops();
  std::vector<double> params;
  {
    GPT2 init(cfg, *cpu, DType::f64, B, T);
    init.init_random(5);
    params.resize(init.num_params());
    cpu->to_host(params.data(), init.params());
    for (double& p : params) p = bf16_to_double(double_to_bf16(p));
  }
  HostTensor<int32_t> in({B * T}), tg({B * T});
  fill_ints(in, rng, 0, cfg.vocab_size);
  fill_ints(tg, rng, 0, cfg.vocab_size);
  tg[5] = -1;
  NaiveOps naive32, naive16(NaiveOps::Bf16Storage::on);
  const ModelRun ref = run_model(*cpu, DType::f64, AttentionAlgo::flash, params, in, tg);
  expect_model_rule(run_model(*cpu, DType::f32, AttentionAlgo::flash, params, in, tg),
                    run_model(naive32, DType::f32, AttentionAlgo::flash, params, in, tg), ref, "fp32");
  expect_model_rule(run_model(naive16, DType::f32, AttentionAlgo::flash, params, in, tg),
                    run_model(naive16, DType::f32, AttentionAlgo::naive, params, in, tg), ref,
                    "bf16 storage");
}

}  // namespace
}  // namespace flashgpt::test
