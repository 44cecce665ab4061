// TimedOps (see timed_ops.h): every forwarded call is bracketed by two events from a
// pool; collect() synchronises the stream once and sums cudaEventElapsedTime per key.
#include "kernels/cuda/timed_ops.h"
#include <algorithm>
#include <cstdio>
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
    }
    keys_.clear();
  }
  void reset() override { totals_.clear(); keys_.clear(); }
  void set_enabled(bool on) override { enabled_ = on; }
  const std::map<std::string, OpTime>& totals() const override { return totals_; }

  Device device() const override { return in_.device(); }
  std::string name() const override { return in_.name() + "+timed"; }
  void* alloc(size_t b) override { return in_.alloc(b); }
  void free(void* p) override { in_.free(p); }
  void memset_zero(Tensor t) override { timed("memset", [&] { in_.memset_zero(t); }); }
  void to_host(void* d, const Tensor& s) override { in_.to_host(d, s); }
  void from_host(const Tensor& d, const void* s) override { in_.from_host(d, s); }
  void synchronize() override { in_.synchronize(); }
  void* alloc_host(size_t b) override { return in_.alloc_host(b); }
  void free_host(void* p) override { in_.free_host(p); }
  void from_host_async(const Tensor& d, const void* s) override { in_.from_host_async(d, s); }
  void cast(Tensor d, Tensor s) override { timed("cast", [&] { in_.cast(d, s); }); }
  void embedding_forward(Tensor o, Tensor t, Tensor a, Tensor b) override {
    timed("embedding_forward", [&] { in_.embedding_forward(o, t, a, b); });
  }
  void embedding_backward(Tensor a, Tensor b, Tensor d, Tensor t) override {
    timed("embedding_backward", [&] { in_.embedding_backward(a, b, d, t); });
  }
  void rope(Tensor qkv, int T, int H, bool inverse) override {
    timed(inverse ? "rope_backward" : "rope_forward", [&] { in_.rope(qkv, T, H, inverse); });
  }
  void layernorm_forward(Tensor o, Tensor m, Tensor r, Tensor i, Tensor w, Tensor b) override {
    timed("layernorm_forward", [&] { in_.layernorm_forward(o, m, r, i, w, b); });
  }
  void residual_layernorm_forward(Tensor res, Tensor o, Tensor m, Tensor r, Tensor i1, Tensor i2,
                                  Tensor w, Tensor b) override {
    timed("residual_layernorm_forward", [&] { in_.residual_layernorm_forward(res, o, m, r, i1, i2, w, b); });
  }
  void layernorm_backward(Tensor di, Tensor dw, Tensor db, Tensor d, Tensor i, Tensor w, Tensor m,
                          Tensor r) override {
    timed("layernorm_backward", [&] { in_.layernorm_backward(di, dw, db, d, i, w, m, r); });
  }
  void matmul_forward(const MatmulForward& a) override {
    std::string k = cat("matmul_forward ", a.weight.shape[1], "->", a.weight.shape[0],
                        a.gelu ? " +gelu" : "", a.bias.defined() ? " +bias" : "");
    timed(k, [&] { in_.matmul_forward(a); });
  }
  void matmul_backward(const MatmulBackward& a) override {
    std::string k = cat("matmul_backward ", a.weight.shape[1], "->", a.weight.shape[0],
                        a.dinp_gelu_pre.defined() ? " +dgelu" : "", a.dbias.defined() ? " +dbias" : "");
    timed(k, [&] { in_.matmul_backward(a); });
  }
  void gelu_forward(Tensor o, Tensor i) override { timed("gelu_forward", [&] { in_.gelu_forward(o, i); }); }
  void gelu_backward(Tensor di, Tensor i, Tensor d) override {
    timed("gelu_backward", [&] { in_.gelu_backward(di, i, d); });
  }
  void attention_forward(const AttentionForward& a) override {
    timed("attention_forward", [&] { in_.attention_forward(a); });
  }
  void attention_backward(const AttentionBackward& a) override {
    timed("attention_backward", [&] { in_.attention_backward(a); });
  }
  void attention_decode(const AttentionDecode& a) override {
    timed("attention_decode", [&] { in_.attention_decode(a); });
  }
  void kv_cache_write(const KVCacheWrite& a) override {
    timed("kv_cache_write", [&] { in_.kv_cache_write(a); });
  }
  void softmax_cross_entropy(Tensor l, Tensor lg, Tensor t, int V, float d) override {
    timed("softmax_cross_entropy", [&] { in_.softmax_cross_entropy(l, lg, t, V, d); });
  }
  void adamw_update(const AdamWArgs& a) override { timed("adamw_update", [&] { in_.adamw_update(a); }); }
  void sum_squares(Tensor o, Tensor g) override { timed("sum_squares", [&] { in_.sum_squares(o, g); }); }
  void scale(Tensor x, float s) override { timed("scale", [&] { in_.scale(x, s); }); }

 private:
  template <class F>
  void timed(const std::string& key, F&& f) {
    size_t i = keys_.size();
    if (!enabled_ || 2 * i + 1 >= events_.size()) {  // pool exhausted: run untimed rather than allocate
      f();
      return;
    }
    CUDA_CHECK(cudaEventRecord(events_[2 * i], ctx_.main_stream()));
    f();
    CUDA_CHECK(cudaEventRecord(events_[2 * i + 1], ctx_.main_stream()));
    keys_.push_back(key);
  }

  Ops& in_;
  DeviceContext& ctx_;
  std::vector<cudaEvent_t> events_;
  std::vector<std::string> keys_;
  std::map<std::string, OpTime> totals_;
  bool enabled_ = true;
};

}  // namespace

std::string TimedOps::report(int steps) const {
  std::vector<std::pair<std::string, OpTime>> rows(totals().begin(), totals().end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.ms > b.second.ms; });
  double total = 0;
  for (auto& r : rows) total += r.second.ms;
  std::string s;
  char line[256];
  std::snprintf(line, sizeof line, "%-44s %10s %8s %7s\n", "op", "ms/step", "calls", "share");
  s += line;
  for (auto& [k, t] : rows) {
    std::snprintf(line, sizeof line, "%-44s %10.3f %8lld %6.1f%%\n", k.c_str(), t.ms / steps,
                  (long long)(t.calls / std::max(1, steps)), 100.0 * t.ms / std::max(total, 1e-9));
    s += line;
  }
  std::snprintf(line, sizeof line, "%-44s %10.3f\n", "total (sum of op times)", total / steps);
  s += line;
  return s;
}

std::unique_ptr<TimedOps> make_timed_ops(Ops& inner, DeviceContext& ctx, int max_calls) {
  return std::make_unique<TimedOpsImpl>(inner, ctx, max_calls);
}

}  // namespace flashgpt
