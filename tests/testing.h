// Shared test helpers: owning host tensors, seeded random fills, a central
// finite-difference gradient checker in fp64, and error measures that fail on any
// single bad element (never a mean).
#pragma once
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>
#include "src/tensor.h"

namespace flashgpt::test {

// A fresh scratch directory under the system temp dir, removed with everything in it
// when the object goes out of scope.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& prefix) {
    path = std::filesystem::temp_directory_path() / (prefix + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};


template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::bf16; }

// An owning host tensor for tests: a std::vector and its shape. Converts to a Tensor
// view (CPU device) on use, so copies stay valid.
template <class T> class HostTensor {
 public:
  HostTensor() = default;
  explicit HostTensor(std::initializer_list<int64_t> shape) : shape_(shape) {
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    data_.assign(size_t(n), T(0));
  }
  Tensor tensor() const {
    Tensor t(const_cast<T*>(data_.data()), dtype_of<T>(), Device::cpu, {1});
    t.ndim = int(shape_.size());
    for (int i = 0; i < t.ndim; ++i) t.shape[i] = shape_[i];
    return t;
  }
  operator Tensor() const { return tensor(); }
  int64_t numel() const { return int64_t(data_.size()); }
  T* data() { return data_.data(); }
  const T* data() const { return data_.data(); }
  T& operator[](int64_t i) { return data_[size_t(i)]; }
  const T& operator[](int64_t i) const { return data_[size_t(i)]; }
  std::vector<T>& vec() { return data_; }
  const std::vector<T>& vec() const { return data_; }

 private:
  std::vector<int64_t> shape_;
  std::vector<T> data_;
};

// A generator seeded from the running test's name (reproducible, different per test),
// or from FLASHGPT_TEST_SEED when set (to explore other inputs). The seed is recorded
// in the test's XML output.
inline std::mt19937_64 test_rng(uint64_t salt = 0) {
  uint64_t seed = 0;
  if (const char* env = std::getenv("FLASHGPT_TEST_SEED")) {
    seed = std::stoull(env);
  } else if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info()) {
    seed = std::hash<std::string>()(std::string(info->test_suite_name()) + "." + info->name());
  }
  seed ^= salt * 0x9E3779B97F4A7C15ull;
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return std::mt19937_64(seed);
}

template <class T>
void fill_uniform(HostTensor<T>& t, std::mt19937_64& rng, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> u(lo, hi);
  for (auto& x : t.vec()) x = T(u(rng));
}

inline void fill_ints(HostTensor<int32_t>& t, std::mt19937_64& rng, int32_t lo, int32_t hi_excl) {
  std::uniform_int_distribution<int32_t> u(lo, hi_excl - 1);
  for (auto& x : t.vec()) x = u(rng);
}

// |a - b| / max(|a|, |b|, floor), maximised over elements; floor keeps elements that
// are (near) zero in both from dominating.
template <class A, class B>
double max_rel_error(const std::vector<A>& a, const std::vector<B>& b, double floor = 1e-30) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double x = double(a[i]), y = double(b[i]);
    worst = std::max(worst, std::fabs(x - y) / std::max({std::fabs(x), std::fabs(y), floor}));
  }
  return worst;
}

template <class A, class B> double max_abs_diff(const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
  return worst;
}

template <class T> double max_abs(const std::vector<T>& a) {
  double m = 0;
  for (const T& x : a) m = std::max(m, std::fabs(double(x)));
  return m;
}

// Every element: |actual - expected| <= atol + rtol·|expected|. Reports the worst one.
template <class A, class B>
void expect_all_close(const std::vector<A>& actual, const std::vector<B>& expected, double rtol,
                      double atol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  size_t bad = 0, worst_i = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = double(actual[i]), e = double(expected[i]);
    const double allowed = atol + rtol * std::fabs(e);
    const double excess = std::fabs(a - e) / allowed;
    if (!(excess <= 1)) ++bad;  // also catches NaN
    if (!(excess <= worst_excess)) worst_excess = excess, worst_i = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << actual.size()
                     << " elements out of tolerance; worst at [" << worst_i
                     << "]: " << double(actual[worst_i]) << " vs " << double(expected[worst_i])
                     << " (rtol " << rtol << ", atol " << atol << ")";
}

// A scalar loss from any output: L = Σ w_i·y_i with fixed random weights w, so that
// dL/dy = w exercises every output element with a different weight. Summed in long
// double: see the finite-difference note below.
class RandomProjection {
 public:
  RandomProjection(int64_t n, std::mt19937_64& rng) : w_({n}) { fill_uniform(w_, rng); }
  template <class T> long double operator()(const HostTensor<T>& y) const {
    long double s = 0;
    for (int64_t i = 0; i < y.numel(); ++i) s += (long double)w_[i] * (long double)y[i];
    return s;
  }
  const HostTensor<double>& weights() const { return w_; }

 private:
  HostTensor<double> w_;
};

// Central finite differences: g_i = (L(x + h·e_i) - L(x - h·e_i)) / 2h, x restored after
// each element. The ops run in fp64; the loss is summed and differenced in long double.
//
// Step and tolerance (u = 1.1e-16, the unit roundoff of fp64):
//  * truncation error h²·L'''/6: ~1e-13 relative for h = 1e-6, O(1) inputs and the
//    smooth functions here.
//  * rounding: the outputs that depend on x_i carry fp64 rounding of ~k·u·|y| (k: the
//    depth of the op, a few tens) → k·u·Σ_affected|w·y| / h ≈ 1e-9 for the ≤ ~100 O(1)
//    affected outputs of these tests. The *sum* over all outputs must not add its own
//    rounding: in fp64 a total of |L| ~ 300 would add u·300/h ≈ 3e-8 of noise to every
//    element, which is why the loss is accumulated in long double (x87, u = 5.4e-20).
// Hence kFdAtol = 1e-8 and kFdRtol = 1e-6: a real bug (a missing term, a wrong factor,
// an off-by-one row) is off by many orders of magnitude more.
constexpr double kFdStep = 1e-6;
constexpr double kFdRtol = 1e-6;
constexpr double kFdAtol = 1e-8;
using Loss = std::function<long double()>;

inline std::vector<double> finite_difference_gradient(double* x, int64_t n, const Loss& loss,
                                                      double h = kFdStep) {
  std::vector<double> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up_step = x[i] - saved;  // the step actually taken (exact)
    const long double up = loss();
    x[i] = saved - h;
    const double down_step = saved - x[i];
    const long double down = loss();
    x[i] = saved;
    g[size_t(i)] = double((up - down) / ((long double)up_step + down_step));
  }
  return g;
}

// Checks an analytic gradient of x against finite differences of loss(). For an
// accumulating gradient, pass the buffer's content before backward as prior: the
// expected result is then prior + gradient.
inline void expect_gradient_matches(const std::string& what, const std::vector<double>& analytic,
                                    HostTensor<double>& x, const Loss& loss,
                                    const std::vector<double>& prior = {}) {
  std::vector<double> expected = finite_difference_gradient(x.data(), x.numel(), loss);
  if (!prior.empty()) {
    ASSERT_EQ(prior.size(), expected.size()) << what;
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += prior[i];
  }
  expect_all_close(analytic, expected, kFdRtol, kFdAtol, what + " vs finite differences");
}

}  // namespace flashgpt::test
