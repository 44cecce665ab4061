// NaiveOps: the "naive" computation of the tests' bound (testing.h, check_rule) — what
// a straightforward implementation at the precision under test produces:
//   * fp32 arithmetic throughout. The CPU op set in fp32 is that, except where it sums
//     in double for accuracy (layernorm statistics and backward sums, the softmax sum of
//     cross-entropy, sum_squares); those four ops are written again here with fp32 sums,
//     as a plain GPU kernel would do them: rows of C <= a few thousand summed in order,
//     longer sums (the vocabulary, all gradients) as fp32 partial sums of kChunk
//     elements added in order — one thread's share, then the block's.
//   * with bf16 storage (Bf16Storage::on): every output of the activation dtype is
//     rounded to bf16 after each op (round to nearest even), as a bf16 implementation
//     stores it; statistics and parameter gradients stay fp32. So a whole bf16 model can
//     be run naively on the CPU, op by op, and its error compared with ours.
// Tensors are fp32 CPU tensors. Everything else is delegated to the CPU op set.
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>
#include "kernels/ops.h"
#include "src/bf16.h"

namespace flashgpt::test {

class NaiveOps final : public Ops {
 public:
  enum class Bf16Storage { off, on };
  explicit NaiveOps(Bf16Storage storage = Bf16Storage::off)
      : cpu_(make_cpu_ops()), bf16_(storage == Bf16Storage::on) {}

  Device device() const override { return Device::cpu; }
  std::string name() const override { return bf16_ ? "naive-bf16" : "naive-fp32"; }
  void* alloc(size_t bytes) override { return cpu_->alloc(bytes); }
  void free(void* p) override { cpu_->free(p); }
  void memset_zero(Tensor t) override { cpu_->memset_zero(t); }
  void to_host(void* dst, const Tensor& src) override { cpu_->to_host(dst, src); }
  void from_host(const Tensor& dst, const void* src) override { cpu_->from_host(dst, src); }
  void synchronize() override {}
  void cast(Tensor dst, Tensor src) override { cpu_->cast(dst, src); }

  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) override {
    cpu_->embedding_forward(out, tokens, wte, wpe);
    store(out);
  }
  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) override {
    cpu_->embedding_backward(dwte, dwpe, dout, tokens);  // fp32 sums in position order
  }

  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w,
                         Tensor b) override {
    const int64_t C = inp.size(-1), N = inp.numel() / C;
    const float *x = f32(inp), *wp = f32(w), *bp = f32(b);
    float *o = f32(out), *mp = f32(mean), *rp = f32(rstd);
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * C;
      float sum = 0, var = 0;
      for (int64_t c = 0; c < C; ++c) sum += xr[c];
      const float m = sum / float(C);
      for (int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
      const float r = 1.0f / std::sqrt(var / float(C) + 1e-5f);
      mp[n] = m;
      rp[n] = r;
      for (int64_t c = 0; c < C; ++c) o[n * C + c] = (xr[c] - m) * r * wp[c] + bp[c];
    }
    store(out);
  }
  void residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd,
                                  Tensor inp1, Tensor inp2, Tensor w, Tensor b) override {
    const float *a = f32(inp1), *c = f32(inp2);
    float* r = f32(residual);
    for (int64_t i = 0; i < residual.numel(); ++i) r[i] = a[i] + c[i];
    store(residual);  // the statistics read the stored residual, like the next layer
    layernorm_forward(out, mean, rstd, residual, w, b);
  }
  void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                          Tensor weight, Tensor mean, Tensor rstd) override {
    const int64_t C = inp.size(-1), N = inp.numel() / C;
    const float *dy = f32(dout), *x = f32(inp), *w = f32(weight), *mp = f32(mean), *rp = f32(rstd);
    float *dx = f32(dinp), *dw = f32(dweight), *db = f32(dbias);
    for (int64_t n = 0; n < N; ++n) {
      const float m = mp[n], r = rp[n];
      float g_sum = 0, gx_sum = 0;
      for (int64_t c = 0; c < C; ++c) {
        const float g = dy[n * C + c] * w[c], xhat = (x[n * C + c] - m) * r;
        g_sum += g;
        gx_sum += g * xhat;
        dw[c] += dy[n * C + c] * xhat;
        db[c] += dy[n * C + c];
      }
      const float g_mean = g_sum / float(C), gx_mean = gx_sum / float(C);
      for (int64_t c = 0; c < C; ++c) {
        const float xhat = (x[n * C + c] - m) * r;
        dx[n * C + c] += r * (dy[n * C + c] * w[c] - g_mean - xhat * gx_mean);
      }
    }
    store(dinp);
  }

  void matmul_forward(const MatmulForward& a) override {
    cpu_->matmul_forward(a);  // fp32 sums
    store(a.out);
    if (a.gelu) store(a.pre_gelu);
  }
  void matmul_backward(const MatmulBackward& a) override {
    cpu_->matmul_backward(a);
    if (a.dinp.defined()) store(a.dinp);
  }
  void gelu_forward(Tensor out, Tensor inp) override {
    cpu_->gelu_forward(out, inp);
    store(out);
  }
  void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) override {
    cpu_->gelu_backward(dinp, inp, dout);
    store(dinp);
  }

  void attention_forward(const AttentionForward& a) override {
    cpu_->attention_forward(a);  // fp32 dot products and sums
    store(a.out);
    if (a.probs.defined()) store(a.probs);  // the naive backward then reads stored P
  }
  void attention_backward(const AttentionBackward& a) override {
    cpu_->attention_backward(a);
    store(a.dqkv);
  }

  void softmax_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int V,
                             float dloss) override {
    const int64_t Vp = logits.size(-1), N = logits.numel() / Vp;
    float* lp = f32(logits);
    float* loss = f32(losses);
    const int32_t* tg = targets.as<int32_t>();
    for (int64_t n = 0; n < N; ++n) {
      float* x = lp + n * Vp;
      const int64_t t = tg[n];
      if (t < 0) {
        loss[n] = 0;
        if (dloss != 0) std::fill(x, x + Vp, 0.0f);
        continue;
      }
      float m = -INFINITY;
      for (int64_t j = 0; j < V; ++j) m = std::max(m, x[j]);
      const float lse = m + std::log(chunked_sum(V, [&](int64_t j) { return std::exp(x[j] - m); }));
      loss[n] = lse - x[t];
      if (dloss == 0) continue;
      for (int64_t j = 0; j < V; ++j) x[j] = dloss * (std::exp(x[j] - lse) - (j == t ? 1.0f : 0.0f));
      std::fill(x + V, x + Vp, 0.0f);
    }
    store(logits);
  }

  void adamw_update(const AdamWArgs& a) override {
    FG_ASSERT(!bf16_, "NaiveOps: AdamW with bf16 storage is not emulated");
    cpu_->adamw_update(a);
  }
  void sum_squares(Tensor out, Tensor grad) override {
    const float* g = f32(grad);
    f32(out)[0] += chunked_sum(grad.numel(), [&](int64_t i) { return g[i] * g[i]; });
  }
  void scale(Tensor x, float s) override { cpu_->scale(x, s); }
  void rope(Tensor qkv, int T, int H, bool inverse, int64_t pos0) override {
    cpu_->rope(qkv, T, H, inverse, pos0);
    store(qkv);
  }
  // Inference ops: the plain CPU ones (no stored activation to round).
  void attention_decode(const AttentionDecode& a) override { cpu_->attention_decode(a); }
  void kv_cache_write(const KVCacheWrite& a) override { cpu_->kv_cache_write(a); }

 private:
  static constexpr int64_t kChunk = 128;
  // Σ_{i<n} term(i) in fp32: partial sums of kChunk terms, then the partials, in order.
  template <class Term> static float chunked_sum(int64_t n, Term term) {
    float total = 0;
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      float part = 0;
      for (int64_t i = i0; i < std::min(n, i0 + kChunk); ++i) part += term(i);
      total += part;
    }
    return total;
  }
  static float* f32(const Tensor& t) {
    FG_ASSERT(t.dtype == DType::f32 && t.device == Device::cpu, "NaiveOps takes fp32 CPU tensors");
    return t.as<float>();
  }
  // An activation-dtype output as a bf16 implementation stores it.
  void store(const Tensor& t) const {
    if (!bf16_) return;
    float* p = f32(t);
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16_to_float(float_to_bf16(p[i]));
  }

  std::unique_ptr<Ops> cpu_;
  bool bf16_;
};

}  // namespace flashgpt::test
