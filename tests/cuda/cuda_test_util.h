// Helpers of the CUDA tests: a fixture that skips cleanly without a GPU, and OpCase, which
// runs one op three times on the same inputs and compares:
//   ref   - the CPU op in fp64                                       (the reference)
//   naive - the same computation done plainly at the GPU's precision: fp32 arithmetic,
//           outputs of the activation dtype stored as bf16 in bf16 runs (NaiveOps,
//           tests/naive_ops.h)
//   gpu   - the CUDA op in fp32 or bf16
// Inputs are rounded to the GPU's activation dtype first, so all three see the same
// values. Every checked output must satisfy, element by element, the bound of
// tests/testing.h (check_rule):
//   |gpu − ref| ≤ 2·(|naive − ref| + λ·σ_row + u·|ref|)
// with σ_row the RMS of naive's errors over the element's row (at least 64 elements),
// λ from the element count and u the unit roundoff of the dtype the GPU stores the output
// in. It fails on any single element that is further from fp64 than rounding at that
// precision explains, at that element's own scale; nothing in it is tuned by hand.
#pragma once
#include <gtest/gtest.h>
#include <cuda_runtime.h>
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
#include "tests/naive_ops.h"
#include "tests/testing.h"

namespace flashgpt::test {

// True when device 0 is a Hopper (the bulk-copy and wgmma kernels run there).
inline bool is_hopper() {
  int major = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess && major == 9;
}

// Sets `bytes` of device memory at p to the byte `value` (0xff: NaN in bf16 and fp32) and
// waits until it is done. A bare cudaMemset goes to the legacy default stream, which the
// ops' streams (created non-blocking, DeviceContext) are not ordered against: a kernel
// launched on them next could run before the fill and have its output overwritten
// (seen once: a FlashDecode test's output and LSE partly NaN, beside three other test
// processes on an H200, eighteenth session).
inline cudaError_t device_memset_sync(void* p, int value, size_t bytes) {
  const cudaError_t e = cudaMemset(p, value, bytes);
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

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

  struct Runs {
    std::map<std::string, std::vector<double>> ref, naive, gpu;
  };
  // Runs ref (CPU fp64), naive (NaiveOps) and the GPU on the same (rounded) inputs.
  Runs run_all(Ops& cpu, Ops& gpu, DType act, const Body& body) {
    round_inputs(act);
    NaiveOps naive_ops(act == DType::bf16 ? NaiveOps::Bf16Storage::on : NaiveOps::Bf16Storage::off);
    Runs r;
    r.ref = run(cpu, DType::f64, body);
    r.naive = run(naive_ops, DType::f32, body);
    r.gpu = run(gpu, act, body);
    return r;
  }
  // The rule's unit roundoff and row length for argument `name` in a run of dtype act.
  double roundoff(const std::string& name, DType act) const {
    return unit_roundoff(dtype_for(args_.at(name).kind, act, Device::cuda));
  }
  int64_t row(const std::string& name) const { return args_.at(name).shape.back(); }

  // run_all, then checks every `check` argument with the bound of testing.h.
  void compare(Ops& cpu, Ops& gpu, DType act, const Body& body, const std::string& what) {
    Runs r = run_all(cpu, gpu, act, body);
    for (const auto& name : order_)
      if (args_.at(name).check)
        expect_rule(r.gpu[name], r.naive[name], r.ref[name], row(name), roundoff(name, act),
                    what + " [" + dtype_name(act) + "] " + name);
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
