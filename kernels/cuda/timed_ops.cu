// TimedOps (see timed_ops.h): every forwarded call is bracketed by two events from a
// pool; collect() synchronises the stream once and sums cudaEventElapsedTime per key.
#include "kernels/cuda/timed_ops.h"
#include <algorithm>
#include <cstdio>
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/op_work.h"
#include "src/cuda/bench_util.h"
#include "src/cuda/cuda_check.h"
#include "src/cuda/device_context.h"

namespace flashgpt {
namespace {

class TimedOpsImpl final : public TimedOps {
 public:
  TimedOpsImpl(Ops& inner, DeviceContext& ctx, int max_calls) : in_(inner), ctx_(ctx) {
    events_.resize(size_t(2 * max_calls));
    for (auto& e : events_) CUDA_CHECK(cudaEventCreate(&e));
    keys_.reserve(size_t(max_calls));
    work_.reserve(size_t(max_calls));
  }
  ~TimedOpsImpl() override {
    for (auto& e : events_) cudaEventDestroy(e);
  }

  void collect() override {
    CUDA_CHECK(cudaStreamSynchronize(ctx_.main_stream()));
    for (size_t i = 0; i < keys_.size(); ++i) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, events_[2 * i], events_[2 * i + 1]));
      OpTime& t = totals_[keys_[i]];
      t.ms += ms;
      t.calls += 1;
      t.flops += work_[i].flops;
      t.bytes += work_[i].bytes;
    }
    keys_.clear();
    work_.clear();
  }
  void reset() override { totals_.clear(); keys_.clear(); work_.clear(); }
  void set_enabled(bool on) override { enabled_ = on; }
  const std::map<std::string, OpTime>& totals() const override { return totals_; }

  Device device() const override { return in_.device(); }
  std::string name() const override { return in_.name() + "+timed"; }
  void* alloc(size_t b) override { return in_.alloc(b); }
  void free(void* p) override { in_.free(p); }
  void memset_zero(Tensor t) override { timed("memset", [&] { in_.memset_zero(t); }, bytes_work({}, {&t})); }
  void to_host(void* d, const Tensor& s) override { in_.to_host(d, s); }
  void from_host(const Tensor& d, const void* s) override { in_.from_host(d, s); }
  void synchronize() override { in_.synchronize(); }
  void* alloc_host(size_t b) override { return in_.alloc_host(b); }
  void free_host(void* p) override { in_.free_host(p); }
  void from_host_async(const Tensor& d, const void* s) override { in_.from_host_async(d, s); }
  void cast(Tensor d, Tensor s) override { timed("cast", [&] { in_.cast(d, s); }, bytes_work({&s}, {&d})); }
  void embedding_forward(Tensor o, Tensor t, Tensor a, Tensor b) override {
    // Gathers: a wte row per token (and a wpe row when there is a table) read, o written.
    OpWork w = bytes_work({&t}, {&o});
    w.bytes += double(o.nbytes()) * (b.defined() ? 2 : 1);
    timed("embedding_forward", [&] { in_.embedding_forward(o, t, a, b); }, w);
  }
  void embedding_backward(Tensor a, Tensor b, Tensor d, Tensor t) override {
    // Scatter-adds into the touched wte rows (counted as one read and write of dout's
    // size) and into the wpe gradient.
    OpWork w = bytes_work({&d, &t}, {}, {&b});
    w.bytes += 2 * double(d.nbytes());
    timed("embedding_backward", [&] { in_.embedding_backward(a, b, d, t); }, w);
  }
  void rope(Tensor qkv, int T, int H, bool inverse, int64_t pos0) override {
    // q and k of qkv, read and written: two thirds of it, twice.
    OpWork w = bytes_work({}, {}, {&qkv});
    w.bytes *= 2.0 / 3.0;
    timed(inverse ? "rope_backward" : "rope_forward", [&] { in_.rope(qkv, T, H, inverse, pos0); }, w);
  }
  void layernorm_forward(Tensor o, Tensor m, Tensor r, Tensor i, Tensor w, Tensor b) override {
    timed("layernorm_forward", [&] { in_.layernorm_forward(o, m, r, i, w, b); }, bytes_work({&i, &w, &b}, {&o, &m, &r}));
  }
  void residual_layernorm_forward(Tensor res, Tensor o, Tensor m, Tensor r, Tensor i1, Tensor i2,
                                  Tensor w, Tensor b) override {
    timed("residual_layernorm_forward", [&] { in_.residual_layernorm_forward(res, o, m, r, i1, i2, w, b); },
          bytes_work({&i1, &i2, &w, &b}, {&res, &o, &m, &r}));
  }
  void layernorm_backward(Tensor di, Tensor dw, Tensor db, Tensor d, Tensor i, Tensor w, Tensor m,
                          Tensor r) override {
    timed("layernorm_backward", [&] { in_.layernorm_backward(di, dw, db, d, i, w, m, r); },
          bytes_work({&d, &i, &w, &m, &r}, {}, {&di, &dw, &db}));
  }
  void matmul_forward(const MatmulForward& a) override {
    std::string k = cat("matmul_forward ", a.weight.shape[1], "->", a.weight.shape[0],
                        a.gelu ? " +gelu" : "", a.bias.defined() ? " +bias" : "");
    timed(k, [&] { in_.matmul_forward(a); }, matmul_forward_work(a));
  }
  void matmul_backward(const MatmulBackward& a) override {
    std::string k = cat("matmul_backward ", a.weight.shape[1], "->", a.weight.shape[0],
                        a.dinp_gelu_pre.defined() ? " +dgelu" : "", a.dbias.defined() ? " +dbias" : "");
    timed(k, [&] { in_.matmul_backward(a); }, matmul_backward_work(a));
  }
  void gelu_forward(Tensor o, Tensor i) override {
    timed("gelu_forward", [&] { in_.gelu_forward(o, i); }, bytes_work({&i}, {&o}));
  }
  void gelu_backward(Tensor di, Tensor i, Tensor d) override {
    timed("gelu_backward", [&] { in_.gelu_backward(di, i, d); }, bytes_work({&i, &d}, {&di}));
  }
  void attention_forward(const AttentionForward& a) override {
    timed("attention_forward", [&] { in_.attention_forward(a); }, attention_forward_work(a));
  }
  void attention_backward(const AttentionBackward& a) override {
    timed("attention_backward", [&] { in_.attention_backward(a); }, attention_backward_work(a));
  }
  void attention_decode(const AttentionDecode& a) override {
    timed("attention_decode", [&] { in_.attention_decode(a); }, {});
  }
  void kv_cache_write(const KVCacheWrite& a) override {
    timed("kv_cache_write", [&] { in_.kv_cache_write(a); }, {});
  }
  void softmax_cross_entropy(Tensor l, Tensor lg, Tensor t, int V, float d) override {
    // The logits are read, and written back as dlogits when d != 0.
    timed("softmax_cross_entropy", [&] { in_.softmax_cross_entropy(l, lg, t, V, d); },
          d != 0 ? bytes_work({&t}, {&l}, {&lg}) : bytes_work({&lg, &t}, {&l}));
  }
  void adamw_update(const AdamWArgs& a) override {
    timed("adamw_update", [&] { in_.adamw_update(a); }, bytes_work({&a.grad}, {}, {&a.param, &a.master, &a.m, &a.v}));
  }
  void sum_squares(Tensor o, Tensor g) override {
    timed("sum_squares", [&] { in_.sum_squares(o, g); }, bytes_work({&g}, {&o}));
  }
  void scale(Tensor x, float s) override { timed("scale", [&] { in_.scale(x, s); }, bytes_work({}, {}, {&x})); }

 private:
  template <class F>
  void timed(const std::string& key, F&& f, const OpWork& work) {
    size_t i = keys_.size();
    if (!enabled_ || 2 * i + 1 >= events_.size()) {  // pool exhausted: run untimed rather than allocate
      f();
      return;
    }
    CUDA_CHECK(cudaEventRecord(events_[2 * i], ctx_.main_stream()));
    f();
    CUDA_CHECK(cudaEventRecord(events_[2 * i + 1], ctx_.main_stream()));
    keys_.push_back(key);
    work_.push_back(work);
  }

  Ops& in_;
  DeviceContext& ctx_;
  std::vector<cudaEvent_t> events_;
  std::vector<std::string> keys_;
  std::vector<OpWork> work_;
  std::map<std::string, OpTime> totals_;
  bool enabled_ = true;
};

}  // namespace

std::string TimedOps::report(int steps, const Roofline& roof, double step_ms) const {
  std::vector<std::pair<std::string, OpTime>> rows(totals().begin(), totals().end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.ms > b.second.ms; });
  double total = 0;
  for (auto& r : rows) total += r.second.ms;
  const bool have_roof = roof.gemm_tflops > 0 && roof.copy_tbs > 0;
  const double ridge = have_roof ? roof.gemm_tflops / roof.copy_tbs : 0;  // FLOPs per byte
  std::string s;
  char line[320];
  std::snprintf(line, sizeof line, "%-44s %10s %8s %7s %9s %8s %14s\n", "op", "ms/step", "calls", "share", "TFLOP/s",
                "TB/s", "of ceiling");
  s += line;
  for (auto& [k, t] : rows) {
    const double sec = t.ms * 1e-3;
    const double tflops = sec > 0 ? t.flops / sec / 1e12 : 0, tbs = sec > 0 ? t.bytes / sec / 1e12 : 0;
    char ceiling[32] = "";
    if (have_roof && t.bytes > 0) {
      const bool compute = t.flops / t.bytes >= ridge;
      std::snprintf(ceiling, sizeof ceiling, "%5.1f%% %s", 100 * (compute ? tflops / roof.gemm_tflops : tbs / roof.copy_tbs),
                    compute ? "GEMM" : "copy");
    }
    std::snprintf(line, sizeof line, "%-44s %10.3f %8lld %6.1f%% %9.1f %8.2f %14s\n", k.c_str(), t.ms / steps,
                  (long long)(t.calls / std::max(1, steps)), 100.0 * t.ms / std::max(total, 1e-9), tflops, tbs, ceiling);
    s += line;
  }
  std::snprintf(line, sizeof line, "%-44s %10.3f\n", "total (sum of op times)", total / steps);
  s += line;
  if (step_ms > 0) {
    std::snprintf(line, sizeof line, "%-44s %10.3f  (%.1f%% of the step: launch gaps, host work, what is not an op)\n",
                  "step time minus the sum", step_ms - total / steps, 100.0 * (step_ms - total / steps) / step_ms);
    s += line;
  }
  if (have_roof) {
    std::snprintf(line, sizeof line, "ceilings measured in this run: dense bf16 GEMM %.1f TFLOP/s, device copy %.2f TB/s\n",
                  roof.gemm_tflops, roof.copy_tbs);
    s += line;
  }
  return s;
}

Roofline measure_roofline(Ops& ops, DeviceContext& ctx) {
  cudaStream_t stream = ctx.main_stream();
  auto time_ms = [&](auto&& body) { return double(bench::median_ms(body, 2, 5, stream)); };
  Roofline r;
  {
    const size_t bytes = size_t(1) << 30;
    void* a = ops.alloc(bytes);
    void* b = ops.alloc(bytes);
    r.copy_tbs = bench::copy_tbs(b, a, bytes, 2, 5, stream);
    ops.free(a);
    ops.free(b);
  }
  {
    const int64_t n = 8192;
    const size_t bytes = size_t(n * n) * 2;
    void* p[3];
    for (void*& x : p) {
      x = ops.alloc(bytes);
      CUDA_CHECK(cudaMemsetAsync(x, 0x3c, bytes, stream));  // bf16 0x3c3c ≈ 0.0115 everywhere
    }
    MatmulForward mm;
    mm.out = Tensor(p[0], DType::bf16, Device::cuda, {n, n});
    mm.inp = Tensor(p[1], DType::bf16, Device::cuda, {n, n});
    mm.weight = Tensor(p[2], DType::bf16, Device::cuda, {n, n});
    // A Matmul of its own, untuned (cuBLASLt's first candidate): the op set's may be
    // tuning, and would time several algorithms here.
    cuda::Matmul gemm(ctx);
    const double ms = time_ms([&] { gemm.forward(mm, stream); });
    r.gemm_tflops = 2.0 * double(n) * n * n / (ms * 1e-3) / 1e12;
    for (void* x : p) ops.free(x);
  }
  return r;
}

std::unique_ptr<TimedOps> make_timed_ops(Ops& inner, DeviceContext& ctx, int max_calls) {
  return std::make_unique<TimedOpsImpl>(inner, ctx, max_calls);
}

}  // namespace flashgpt
