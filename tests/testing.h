// Shared test helpers: owning host tensors, seeded random fills, a central
// finite-difference gradient checker in fp64, and error measures that fail on any
// single bad element (never a mean).
#pragma once
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>
#include "src/errors.h"
#include "src/tensor.h"

namespace flashgpt::test {

// The flashgpt binary the tests run: FLASHGPT_TEST_BINARY when set (binaries built in
// another directory and copied, as scripts/test_gpu.sh's FLASHGPT_NO_BUILD=1 runs them),
// else the one built beside this test binary (its path compiled in).
inline const char* flashgpt_binary() {
  const char* env = std::getenv("FLASHGPT_TEST_BINARY");
  return env && *env ? env : FLASHGPT_BINARY;
}

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

// The seed of the running test: FLASHGPT_TEST_SEED when set (to explore other inputs),
// else a hash of the test's name (reproducible, different per test). Every random input
// of the suite derives from it, and a failing test prints it (SeedReporter below), so
// any failure can be re-run with FLASHGPT_TEST_SEED=<seed>.
inline uint64_t seed_for(const ::testing::TestInfo& info) {
  if (const char* env = std::getenv("FLASHGPT_TEST_SEED")) return std::stoull(env);
  return std::hash<std::string>()(std::string(info.test_suite_name()) + "." + info.name());
}

// Keeps the running test's seed (set when each test starts: asking gtest for the current
// test from inside its failure reporting would deadlock) and prints it after every
// failure. Installed once per test binary by the inline variable below.
class SeedReporter : public ::testing::EmptyTestEventListener {
 public:
  static uint64_t& current() {
    static uint64_t seed = 0;
    return seed;
  }
  void OnTestStart(const ::testing::TestInfo& info) override { current() = seed_for(info); }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::printf("[   SEED   ] reproduce with FLASHGPT_TEST_SEED=%llu\n",
                  static_cast<unsigned long long>(current()));
  }
};
inline const bool kSeedReporterInstalled = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SeedReporter);
  return true;
}();

inline uint64_t test_seed() { return SeedReporter::current(); }

// The one random generator of the tests: seeded from test_seed(); salt gives
// independent streams within one test. The seed is also in the test's XML output.
inline std::mt19937_64 test_rng(uint64_t salt = 0) {
  const uint64_t seed = test_seed();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return std::mt19937_64(seed ^ (salt * 0x9E3779B97F4A7C15ull));
}

// Sets (or, with value nullptr, unsets) an environment variable for one scope and
// restores what was there before: a previous value, or its absence.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// A batch of B·T uniformly random input and target ids below V, from `seed`.
struct Batch {
  std::vector<int32_t> in, tg;
};
inline Batch random_batch(int B, int T, int V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(0, V - 1);
  Batch b{std::vector<int32_t>(size_t(B) * size_t(T)), std::vector<int32_t>(size_t(B) * size_t(T))};
  for (auto& x : b.in) x = tok(rng);
  for (auto& x : b.tg) x = tok(rng);
  return b;
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

// ---- the bound of every comparison of ours with an fp64 reference -----------------
// ref is exact (fp64, on the same inputs); naive is a straightforward computation in the
// precision under test (fp32 arithmetic and the storage dtype of ours: NaiveOps). Each
// element i of ours must satisfy
//
//   |ours_i − ref_i| ≤ 2·( |naive_i − ref_i| + λ·σ_i + u·|ref_i| )
//
//  * |naive_i − ref_i|: this element's own error at that precision. FlashAttention's
//    criterion "no worse than twice the naive error", made per element.
//  * σ_i: the error scale of elements like i. One element's naive error can be small by
//    chance while ours, rounded another way, is not. Elements like i are in its row (the
//    last dimension; consecutive rows joined up to kMinGroup elements), in two ways:
//    its neighbours (the row cut into blocks of kMinGroup: the Q, K and V parts of a
//    fused bias, a head's slice) and the elements of similar size (the row sorted by
//    |ref|, then cut: the small dlogits of a row apart from the large). Each block's
//    scale is the RMS of naive's errors over it, leaving out its largest eighth so that
//    one large element among small ones (the target's dlogit) does not set the others'
//    scale; σ_i is the larger of i's two blocks' scales. Structural zeros (0 in ref and
//    in naive: padding, masked entries) belong to no block and have σ = 0.
//  * λ = sqrt(2·ln(N/δ)), N elements, δ = 1e-6: if the errors of a correct
//    implementation were Gaussian with deviation σ_i, P(|e| > λσ_i) ≤ exp(−λ²/2) per
//    element (Chernoff), so a false failure anywhere in the tensor has chance ≤ δ.
//  * u·|ref_i|: one rounding of the stored result (u = 2^-24 fp32, 2^-8 bf16): ours and
//    naive may round an element that lies near a tie to different neighbours.
//  * the factor 2: ours may sum in another order, with other intrinsics (FA-3's factor).
// The bound is per element, at the element's own scale, never the tensor's maximum: a
// non-target dlogit a thousand times smaller than the target's in its row gets a bound
// a thousand times smaller. Where naive is exact for a block (copies, padding, sums of
// small integers), the bound is equality.
inline double unit_roundoff(DType t) {
  switch (t) {
    case DType::bf16: return 0x1p-8;
    case DType::f32: return 0x1p-24;
    case DType::f64: return 0x1p-53;
    default: return 0;  // integers are exact
  }
}

constexpr int64_t kMinGroup = 64;
constexpr double kRuleDelta = 1e-6;

struct RuleResult {
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;  // error/bound of the worst element (NaN counts as infinite)
  double lambda = 0;
};

// Cuts [0, n) into pieces of `size` (the last piece takes a remainder < kMinGroup).
inline std::vector<size_t> cut(size_t n, size_t size) {
  std::vector<size_t> edges;
  for (size_t g = 0; g < n; g += size) edges.push_back(g);
  if (edges.size() > 1 && n - edges.back() < size_t(kMinGroup)) edges.pop_back();
  edges.push_back(n);
  return edges;
}

// Trimmed RMS of naive's errors over elements idx[b0..b1): the largest eighth left out.
inline double trimmed_rms(const std::vector<double>& naive, const std::vector<double>& ref,
                          const std::vector<size_t>& idx, size_t b0, size_t b1) {
  std::vector<double> sq;
  for (size_t j = b0; j < b1; ++j) sq.push_back((naive[idx[j]] - ref[idx[j]]) * (naive[idx[j]] - ref[idx[j]]));
  std::sort(sq.begin(), sq.end());
  const size_t keep = sq.size() - sq.size() / 8;
  double sum = 0;
  for (size_t j = 0; j < keep; ++j) sum += sq[j];
  return std::sqrt(sum / double(keep));
}

// σ_i of every element (see above). row: elements per row (<= 0: one row).
inline std::vector<double> error_scales(const std::vector<double>& naive,
                                        const std::vector<double>& ref, int64_t row) {
  const size_t n = ref.size();
  std::vector<double> sigma(n, 0.0);
  if (n == 0) return sigma;
  if (row <= 0 || size_t(row) > n) row = int64_t(n);
  const size_t rows_per_group = size_t((kMinGroup + row - 1) / row);
  const std::vector<size_t> groups = cut(n, std::min(n, rows_per_group * size_t(row)));
  std::vector<size_t> members;
  for (size_t k = 0; k + 1 < groups.size(); ++k) {
    // Structural zeros (padding, masked or ignored entries: 0 in ref and naive alike)
    // are not computed like the rest: they keep σ = 0, so ours must be 0 there too.
    members.clear();
    for (size_t i = groups[k]; i < groups[k + 1]; ++i)
      if (ref[i] != 0 || naive[i] != 0) members.push_back(i);
    // Neighbours in the row, then neighbours in size; σ is the larger of the two scales.
    for (int by_size = 0; by_size < 2; ++by_size) {
      if (by_size)
        std::stable_sort(members.begin(), members.end(),
                         [&](size_t a, size_t b) { return std::fabs(ref[a]) < std::fabs(ref[b]); });
      const std::vector<size_t> blocks = cut(members.size(), size_t(kMinGroup));
      for (size_t b = 0; b + 1 < blocks.size(); ++b) {
        const double s = trimmed_rms(naive, ref, members, blocks[b], blocks[b + 1]);
        for (size_t j = blocks[b]; j < blocks[b + 1]; ++j)
          sigma[members[j]] = std::max(sigma[members[j]], s);
      }
    }
  }
  return sigma;
}

// u: unit roundoff of the dtype ours is stored in.
// floor (optional, per element): an error ours may have that the naive yardstick cannot
// show, derived by the caller (e.g. the rounding left by a cancellation that naive
// happens to compute exactly); added inside the bound like the other terms.
inline RuleResult check_rule(const std::vector<double>& ours, const std::vector<double>& naive,
                             const std::vector<double>& ref, int64_t row, double u,
                             const std::vector<double>* floor = nullptr) {
  const size_t n = ref.size();
  RuleResult r;
  r.lambda = std::sqrt(2 * std::log(double(std::max<size_t>(n, 1)) / kRuleDelta));
  if (ours.size() != n || naive.size() != n || (floor && floor->size() != n)) return r.bad = n + 1, r;
  const std::vector<double> sigma = error_scales(naive, ref, row);
  for (size_t i = 0; i < n; ++i) {
    const double bound =
        2 * (std::fabs(naive[i] - ref[i]) + r.lambda * sigma[i] + u * std::fabs(ref[i]) + (floor ? (*floor)[i] : 0.0));
    const double err = std::fabs(ours[i] - ref[i]);
    const double ratio = err == 0 ? 0 : (bound > 0 ? err / bound : INFINITY);
    if (!(ratio <= 1)) ++r.bad;  // NaN counts as bad
    if (!(ratio <= r.worst_ratio)) r.worst_ratio = std::isnan(ratio) ? INFINITY : ratio, r.worst = i;
  }
  return r;
}

inline void expect_rule(const std::vector<double>& ours, const std::vector<double>& naive,
                        const std::vector<double>& ref, int64_t row, double u,
                        const std::string& what, const std::vector<double>* floor = nullptr) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  ASSERT_EQ(naive.size(), ref.size()) << what;
  const RuleResult r = check_rule(ours, naive, ref, row, u, floor);
  if (std::getenv("FLASHGPT_TEST_MARGINS"))  // how close a passing check came to its bound
    std::printf("[  MARGIN  ] %s: worst error/bound %.3g\n", what.c_str(), r.worst_ratio);
  EXPECT_EQ(r.bad, 0u) << what << ": " << r.bad << " of " << ref.size()
                       << " elements out of bound; worst [" << r.worst << "] ours " << ours[r.worst]
                       << ", fp64 " << ref[r.worst] << ", naive " << naive[r.worst]
                       << " (error/bound " << r.worst_ratio << ", lambda " << r.lambda << ")";
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

// Runs f, expects an InputError whose message contains every needle.
template <class F>
void expect_input_error(F f, std::initializer_list<std::string> needles) {
  try {
    f();
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

}  // namespace flashgpt::test
