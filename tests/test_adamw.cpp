// The optimizer (optim/adamw.h) through its public API, against formulas written here
// independently of it: the global gradient norm, clipping by it (on, off, disabled),
// decoupled weight decay on the 2-D weights only (the mask decided here from the
// parameter names), bias correction over two steps. The GPU-vs-CPU model tests share the
// AdamW class, so a mistake in it would cancel there; here it cannot.
#include <gtest/gtest.h>
#include <cmath>
#include <string>
#include <vector>
#include "layers/gpt2.h"
#include "optim/adamw.h"
#include "tests/testing.h"

namespace flashgpt::test {
namespace {

// GPT-2's rule, from the name alone: biases, layernorm weights and biases get no decay;
// every other parameter (wte, wpe, the four matmul weights of each block) does.
bool decays(const std::string& name) {
  const auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return !ends_with(".bias") && name.find("ln_") == std::string::npos;
}

struct TinyModel {
  std::unique_ptr<Ops> ops = make_cpu_ops();
  ModelConfig cfg{2, 2, 16, 37, 40, 12};
  GPT2 model{cfg, *ops, DType::f64, 1, 4};
  std::vector<double> p0;

  explicit TinyModel(std::mt19937_64& rng) {
    p0.assign(model.num_params(), 0.0);
    std::uniform_real_distribution<double> u(-1, 1);
    for (const ParamInfo& p : model.param_list())  // alignment gaps stay 0
      for (int64_t i = 0; i < p.numel(); ++i) p0[p.offset + size_t(i)] = u(rng);
    ops->from_host(model.params(), p0.data());
  }
  // Gradients of scale s: every parameter element gets s·U(-1, 1).
  std::vector<double> set_grads(std::mt19937_64& rng, double s) {
    std::vector<double> g(model.num_params(), 0.0);
    std::uniform_real_distribution<double> u(-1, 1);
    for (const ParamInfo& p : model.param_list())
      for (int64_t i = 0; i < p.numel(); ++i) g[p.offset + size_t(i)] = s * u(rng);
    ops->from_host(model.grads(), g.data());
    return g;
  }
  std::vector<double> params() {
    std::vector<double> p(model.num_params());
    ops->to_host(p.data(), model.params());
    return p;
  }
};

// AdamW step t (1-based) on every parameter element, in double, with the hyperparameters
// as the kernels receive them (fp32 values).
struct Expected {
  std::vector<double> p, m, v;
  void step(const GPT2& model, const AdamWConfig& c, const std::vector<double>& g, double lr,
            double grad_scale, int t) {
    const double b1 = float(c.beta1), b2 = float(c.beta2), eps = float(c.eps), lr32 = float(lr),
                 gs = float(grad_scale);
    for (const ParamInfo& info : model.param_list()) {
      const double wd = decays(info.name) ? double(float(c.weight_decay)) : 0.0;
      for (int64_t k = 0; k < info.numel(); ++k) {
        const size_t i = info.offset + size_t(k);
        const double gi = g[i] * gs;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        const double mhat = m[i] / (1 - std::pow(b1, t)), vhat = v[i] / (1 - std::pow(b2, t));
        p[i] -= lr32 * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
      }
    }
  }
};

// The same fp64 arithmetic in the same order as the kernel: a few roundings apart.
constexpr double kRtol = 1e-12, kAtol = 1e-15;

double l2(const std::vector<double>& g) {
  double s = 0;
  for (double x : g) s += x * x;
  return std::sqrt(s);
}

// Two steps: the first with a gradient norm above grad_clip (scaled down to it), the
// second below (unscaled). Every parameter element against the formula.
TEST(AdamW, ClipsByTheGlobalNormAndDecaysOnlyTwoDimensionalWeights) {
  auto rng = test_rng();
  TinyModel s(rng);
  AdamWConfig cfg;
  cfg.weight_decay = 0.5;  // large, so that a wrong mask is far outside the tolerance
  cfg.grad_clip = 1.0;
  AdamW opt(s.model, cfg);
  Expected want{s.p0, std::vector<double>(s.p0.size(), 0.0), std::vector<double>(s.p0.size(), 0.0)};

  const std::vector<double> g1 = s.set_grads(rng, 1.0);
  const double norm1 = opt.grad_norm();
  EXPECT_NEAR(norm1, l2(g1), 1e-12 * l2(g1));
  ASSERT_GT(norm1, 3 * cfg.grad_clip) << "the first step must clip";
  opt.step(1e-2, norm1, 0);
  want.step(s.model, cfg, g1, 1e-2, cfg.grad_clip / norm1, 1);  // norm1 checked above
  expect_all_close(s.params(), want.p, kRtol, kAtol, "params after a clipped step");

  const std::vector<double> g2 = s.set_grads(rng, 1e-3);
  const double norm2 = opt.grad_norm();
  ASSERT_LT(norm2, cfg.grad_clip) << "the second step must not clip";
  opt.step(3e-3, norm2, 1);
  want.step(s.model, cfg, g2, 3e-3, 1.0, 2);
  expect_all_close(s.params(), want.p, kRtol, kAtol, "params after an unclipped second step");
  EXPECT_EQ(opt.steps_done(), 2);

  // The mask is GPT-2's: at least one tensor of each kind was checked.
  int decayed = 0, kept = 0;
  for (const ParamInfo& p : s.model.param_list()) (decays(p.name) ? decayed : kept) += 1;
  EXPECT_EQ(decayed, 2 + 4 * s.cfg.n_layer);
  EXPECT_EQ(kept, 2 + 8 * s.cfg.n_layer);
}

TEST(AdamW, GradClipZeroDisablesClipping) {
  auto rng = test_rng();
  TinyModel s(rng);
  AdamWConfig cfg;
  cfg.grad_clip = 0;
  AdamW opt(s.model, cfg);
  Expected want{s.p0, std::vector<double>(s.p0.size(), 0.0), std::vector<double>(s.p0.size(), 0.0)};
  const std::vector<double> g = s.set_grads(rng, 100.0);
  opt.step(1e-2, opt.grad_norm(), 0);
  want.step(s.model, cfg, g, 1e-2, 1.0, 1);
  expect_all_close(s.params(), want.p, kRtol, kAtol, "params");
}

// The segments of one adamw_update call (the optimizer's one call per owned range) must
// tile it from 0, ascending: anything else is an error, not a silent partial update.
TEST(AdamW, SegmentsMustAscendFromZeroInsideTheCall) {
  auto ops = make_cpu_ops();
  const int64_t n = 10;
  std::vector<void*> owned;
  auto tensor = [&] {
    void* p = ops->alloc(size_t(n) * sizeof(double));
    owned.push_back(p);
    Tensor t(p, DType::f64, Device::cpu, {n});
    ops->memset_zero(t);
    return t;
  };
  AdamWArgs a;
  a.param = tensor(); a.grad = tensor(); a.m = tensor(); a.v = tensor();
  a.lr = 1e-3f;
  using Segs = std::vector<AdamWSegment>;
  for (const Segs& bad : {Segs{{1, true, 0}}, Segs{{0, true, 0}, {0, false, 0}},
                          Segs{{0, true, 0}, {6, false, 0}, {4, true, 0}}, Segs{{0, true, 0}, {10, false, 0}}}) {
    a.segments = bad;
    EXPECT_THROW(ops->adamw_update(a), std::exception) << bad.size() << " segments";
  }
  a.segments = {{0, true, 0}, {4, false, 0}, {9, true, 0}};
  EXPECT_NO_THROW(ops->adamw_update(a));
  for (void* p : owned) ops->free(p);
}

}  // namespace
}  // namespace flashgpt::test
