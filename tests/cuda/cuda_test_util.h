// Helpers of the CUDA tests: a fixture that skips cleanly without a GPU, and OpCase, which
// runs one op three times on the same inputs and compares:
//   ref   - the CPU op in fp64            (the reference)
//   naive - the CPU op in fp32, outputs rounded to the GPU's storage dtype
//           (what a straightforward implementation at that precision produces)
//   gpu   - the CUDA op in fp32 or bf16
// Inputs are rounded to the GPU's activation dtype first, so all three see the same
// values. Tolerances, by the dtype the GPU stores the output in:
//   fp32 (all outputs of fp32 runs; gradients, statistics and losses of bf16 runs, which
//   the GPU accumulates in fp32 from exactly representable inputs):
//              |gpu − ref| ≤ 1e-5·|ref| + 1e-5·max|ref|
//   bf16:      |gpu − ref| ≤ 2·|naive − ref| + max_j |naive_j − ref_j|, per element.
// (The CPU op accumulates long row reductions in fp64, so its fp32 run is not a naive
// fp32-accumulation reference; for fp32 outputs the 1e-5 rule is the meaningful one.)
// The bf16 bound is derived from the naive computation (FlashAttention-3's rule, made
// per element): it fails on any single element that is off by more than a rounding
// difference of the naive same-precision computation, and is never tuned by hand.
#pragma once
#include <gtest/gtest.h>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>
#include "kernels/ops.h"
#include "src/bf16.h"
#include "src/cuda/device_context.h"
#include "tests/testing.h"

namespace flashgpt::test {

// Sets an environment variable for the scope (run-time switches such as
// FLASHGPT_DETERMINISTIC), restoring the previous value after.
struct ScopedEnv {
  std::string name, old;
  bool had = false;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (const char* v = std::getenv(n)) had = true, old = v;
    setenv(n, value, 1);
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
  }
};

// Skips (GTEST_SKIP) when no GPU is visible; otherwise owns a context and both op sets.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible";
    ctx_ = std::make_unique<DeviceContext>(0);
    gpu_ = make_cuda_ops(*ctx_);
    cpu_ = make_cpu_ops();
  }
  void TearDown() override {
    gpu_.reset();
    ctx_.reset();
  }
  std::unique_ptr<DeviceContext> ctx_;
  std::unique_ptr<Ops> gpu_, cpu_;
};

inline double round_to(DType t, double x) {
  if (t == DType::bf16) return bf16_to_double(double_to_bf16(x));
  if (t == DType::f32) return double(float(x));
  return x;
}

// What an argument of an op is, which fixes its dtype on each backend.
enum class Kind {
  act,   // activation dtype: fp64/fp32 on the CPU, fp32/bf16 on the GPU
  grad,  // parameter gradient: GradDType (fp32 on the GPU)
  stat,  // per-row statistics, optimizer state: fp32 on the GPU, = activation dtype on the CPU
  i32,   // token ids, targets
};

struct OpArg {
  std::vector<int64_t> shape;
  Kind kind;
  std::vector<double> init;  // empty: zeros
  bool check;                // compare this argument after the op
};

class OpCase {
 public:
  using Body = std::function<void(Ops&, OpCase&)>;

  void add(const std::string& name, std::vector<int64_t> shape, Kind kind,
           std::vector<double> init = {}, bool check = false) {
    args_[name] = OpArg{std::move(shape), kind, std::move(init), check};
    order_.push_back(name);
  }
  // The tensor of `name` during a run (valid inside the body only).
  Tensor operator[](const std::string& name) const { return live_.at(name); }
  DType act() const { return act_; }

  // Runs body on `ops` with activation dtype act; returns every argument as doubles.
  std::map<std::string, std::vector<double>> run(Ops& ops, DType act, const Body& body) {
    act_ = act;
    std::vector<void*> owned;
    for (const auto& name : order_) {
      const OpArg& a = args_.at(name);
      DType dt = dtype_for(a.kind, act, ops.device());
      int64_t n = 1;
      for (int64_t s : a.shape) n *= s;
      void* p = ops.alloc(size_t(n) * dtype_size(dt));
      owned.push_back(p);
      Tensor t(p, dt, ops.device(), {1});
      t.ndim = int(a.shape.size());
      for (int i = 0; i < t.ndim; ++i) t.shape[i] = a.shape[i];
      std::vector<double> init = a.init.empty() ? std::vector<double>(size_t(n), 0.0) : a.init;
      upload(ops, t, init);
      live_[name] = t;
    }
    body(ops, *this);
    std::map<std::string, std::vector<double>> out;
    for (const auto& name : order_) out[name] = download(ops, live_[name]);
    for (void* p : owned) ops.free(p);
    live_.clear();
    return out;
  }

  // Rounds every floating input to what the GPU will store for activation dtype act.
  void round_inputs(DType act) {
    for (auto& [name, a] : args_) {
      if (a.kind == Kind::i32) continue;
      DType dt = dtype_for(a.kind, act, Device::cuda);
      for (double& x : a.init) x = round_to(dt, x);
    }
  }

  // Runs ref (CPU fp64), naive (CPU fp32) and the GPU and checks every `check` argument.
  void compare(Ops& cpu, Ops& gpu, DType act, const Body& body, const std::string& what) {
    round_inputs(act);
    auto ref = run(cpu, DType::f64, body);
    auto naive = run(cpu, DType::f32, body);
    auto got = run(gpu, act, body);
    for (const auto& name : order_) {
      const OpArg& a = args_.at(name);
      if (!a.check) continue;
      std::string label = what + " [" + dtype_name(act) + "] " + name;
      DType stored = dtype_for(a.kind, act, Device::cuda);
      std::vector<double>& nv = naive[name];
      for (double& x : nv) x = round_to(stored, x);
      expect_within(got[name], nv, ref[name], /*derived=*/stored == DType::bf16, label);
    }
  }

  static void expect_within(const std::vector<double>& got, const std::vector<double>& naive,
                            const std::vector<double>& ref, bool derived, const std::string& what) {
    ASSERT_EQ(got.size(), ref.size()) << what;
    double ref_max = 0, naive_max_err = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ref_max = std::max(ref_max, std::fabs(ref[i]));
      naive_max_err = std::max(naive_max_err, std::fabs(naive[i] - ref[i]));
    }
    size_t bad = 0, worst = 0;
    double worst_ratio = -1;
    for (size_t i = 0; i < ref.size(); ++i) {
      double bound = derived
                         ? 2 * std::fabs(naive[i] - ref[i]) + naive_max_err
                         : 1e-5 * std::fabs(ref[i]) + 1e-5 * ref_max;
      bound = std::max(bound, 1e-300);
      double ratio = std::fabs(got[i] - ref[i]) / bound;
      if (!(ratio <= 1)) ++bad;  // NaN counts as bad
      if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size()
                       << " elements out of bound; worst [" << worst << "] gpu " << got[worst]
                       << " ref " << ref[worst] << " naive " << naive[worst] << " (error/bound "
                       << worst_ratio << ", max|ref| " << ref_max << ", naive max err "
                       << naive_max_err << ")";
  }

  static DType dtype_for(Kind k, DType act, Device dev) {
    switch (k) {
      case Kind::act: return act;
      case Kind::grad: return GradDType(act);
      case Kind::stat: return dev == Device::cuda ? DType::f32 : act;
      case Kind::i32: return DType::i32;
    }
    return act;
  }

  static void upload(Ops& ops, const Tensor& t, const std::vector<double>& v) {
    size_t n = v.size();
    switch (t.dtype) {
      case DType::f64: ops.from_host(t, v.data()); break;
      case DType::f32: { std::vector<float> h(v.begin(), v.end()); ops.from_host(t, h.data()); break; }
      case DType::i32: { std::vector<int32_t> h(n); for (size_t i = 0; i < n; ++i) h[i] = int32_t(v[i]); ops.from_host(t, h.data()); break; }
      case DType::bf16: { std::vector<uint16_t> h(n); for (size_t i = 0; i < n; ++i) h[i] = double_to_bf16(v[i]); ops.from_host(t, h.data()); break; }
    }
  }
  static std::vector<double> download(Ops& ops, const Tensor& t) {
    size_t n = size_t(t.numel());
    std::vector<double> v(n);
    switch (t.dtype) {
      case DType::f64: ops.to_host(v.data(), t); break;
      case DType::f32: { std::vector<float> h(n); ops.to_host(h.data(), t); v.assign(h.begin(), h.end()); break; }
      case DType::i32: { std::vector<int32_t> h(n); ops.to_host(h.data(), t); v.assign(h.begin(), h.end()); break; }
      case DType::bf16: { std::vector<uint16_t> h(n); ops.to_host(h.data(), t); for (size_t i = 0; i < n; ++i) v[i] = bf16_to_double(h[i]); break; }
    }
    return v;
  }

 private:
  std::map<std::string, OpArg> args_;
  std::vector<std::string> order_;
  std::map<std::string, Tensor> live_;
  DType act_ = DType::f32;
};

inline std::vector<double> uniform(int64_t n, std::mt19937_64& rng, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = u(rng);
  return v;
}
inline std::vector<double> ints(int64_t n, std::mt19937_64& rng, int lo, int hi_excl) {
  std::uniform_int_distribution<int> u(lo, hi_excl - 1);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = u(rng);
  return v;
}

}  // namespace flashgpt::test
