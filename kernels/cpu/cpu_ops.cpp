// The CPU op set (make_cpu_ops): fp32 and fp64, the reference every CUDA op is tested
// against and the CPU trainer's backend. This file checks each call's tensors (device,
// dtype, shapes) and dispatches to the templated kernels of cpu_kernels.h.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include "cpu_kernels.h"
#include "src/bf16.h"

namespace flashgpt {

namespace {
constexpr size_t kAlignment = 64;  // a cache line, and enough for any SIMD load

// Calls f(float{}) or f(double{}) for the activation dtype t.
template <class F> void dispatch(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    default: FG_ASSERT(false, op, ": the CPU ops support fp32 and fp64, got ", dtype_name(t));
  }
}

void check_host(const Tensor& t, const char* what) {
  FG_ASSERT(t.defined(), what, " is undefined");
  FG_ASSERT(t.device == Device::cpu, what, " is not on the CPU");
}

// t is defined, on the CPU, of dtype dt and exactly n elements.
void check(const Tensor& t, const char* what, DType dt, int64_t n) {
  check_host(t, what);
  FG_ASSERT(t.dtype == dt, what, " has dtype ", dtype_name(t.dtype), ", expected ", dtype_name(dt));
  FG_ASSERT(t.numel() == n, what, " ", t.shape_str(), " has ", t.numel(), " elements, expected ", n);
}

// Per-row statistics: fp32 or fp64 (the run's precision), n elements.
void check_stat(const Tensor& t, const char* what, int64_t n) {
  check_host(t, what);
  FG_ASSERT(t.dtype == DType::f32 || t.dtype == DType::f64, what, " must be fp32 or fp64");
  FG_ASSERT(t.numel() == n, what, " has ", t.numel(), " elements, expected ", n);
}

double load_as_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::bf16: return bf16_to_double(static_cast<const uint16_t*>(p)[i]);
    default: return 0;  // excluded by cast()'s check
  }
}

// Every source value is exactly a double, so converting from the double is one correct
// rounding to the destination dtype.
void store_from_double(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = float(v); return;
    case DType::f64: static_cast<double*>(p)[i] = v; return;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = double_to_bf16(v); return;
    default: return;
  }
}

class CpuOps final : public Ops {
 public:
  Device device() const override { return Device::cpu; }
  std::string name() const override { return "cpu"; }

  // ---- memory ----
  void* alloc(size_t bytes) override {
    // aligned_alloc wants a multiple of the alignment; 0 bytes still gets a pointer.
    const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (!p)
      fail_input("out of host memory: allocating ", bytes / double(1 << 20), " MiB failed (`flashgpt memory "
                 "--device cpu` shows what a run needs)");
    return p;
  }
  void free(void* p) override { std::free(p); }
  void memset_zero(Tensor t) override {
    check_host(t, "memset_zero tensor");
    std::memset(t.data, 0, t.nbytes());
  }
  void to_host(void* dst, const Tensor& src) override {
    check_host(src, "to_host source");
    std::memcpy(dst, src.data, src.nbytes());
  }
  void from_host(const Tensor& dst, const void* src) override {
    check_host(dst, "from_host destination");
    std::memcpy(dst.data, src, dst.nbytes());
  }
  void synchronize() override {}
  void cast(Tensor dst, Tensor src) override {
    check_host(dst, "cast destination");
    check_host(src, "cast source");
    FG_ASSERT(dst.numel() == src.numel(), "cast between ", dst.numel(), " and ", src.numel(),
              " elements");
    for (DType t : {dst.dtype, src.dtype})
      FG_ASSERT(t == DType::f32 || t == DType::f64 || t == DType::bf16,
                "cast supports fp32, fp64, bf16; got ", dtype_name(t));
    const int64_t n = src.numel();
    if (dst.dtype == src.dtype) {  // a copy (the optimizer state in and out of checkpoints)
      std::memmove(dst.data, src.data, src.nbytes());
      return;
    }
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(n))
    for (int64_t i = 0; i < n; ++i)
      store_from_double(dst.data, dst.dtype, i, load_as_double(src.data, src.dtype, i));
  }

  // ---- embedding ----
  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) override {
    FG_ASSERT(tokens.ndim == 2, "tokens must be (B,T), got ", tokens.shape_str());
    FG_ASSERT(wte.ndim == 2 && (!wpe.defined() || wpe.ndim == 2),
              "wte and wpe must be (V,C) and (maxT,C)");
    const int64_t BT = tokens.numel(), C = wte.size(1);
    check(tokens, "tokens", DType::i32, BT);
    if (wpe.defined()) {
      FG_ASSERT(wpe.size(1) == C && wpe.size(0) >= tokens.size(1), "wpe ", wpe.shape_str(),
                " does not cover T = ", tokens.size(1), " and C = ", C);
      check(wpe, "wpe", wte.dtype, wpe.numel());
    }
    check(out, "out", wte.dtype, BT * C);
    dispatch(wte.dtype, "embedding_forward", [&](auto tag) {
      cpu::embedding_forward<decltype(tag)>(out, tokens, wte, wpe);
    });
  }
  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) override {
    FG_ASSERT(tokens.ndim == 2 && dwte.ndim == 2 && (!dwpe.defined() || dwpe.ndim == 2),
              "embedding_backward: tokens (B,T), dwte (V,C), dwpe (maxT,C)");
    const int64_t BT = tokens.numel(), C = dwte.size(1);
    check(tokens, "tokens", DType::i32, BT);
    if (dwpe.defined()) {
      FG_ASSERT(dwpe.size(1) == C && dwpe.size(0) >= tokens.size(1), "dwpe ", dwpe.shape_str(),
                " does not cover T = ", tokens.size(1));
      check(dwpe, "dwpe", dwte.dtype, dwpe.numel());
    }
    check(dout, "dout", dwte.dtype, BT * C);
    for (int64_t i = 0; i < BT; ++i) {
      const int32_t id = tokens.as<int32_t>()[i];
      FG_ASSERT(id >= 0 && id < dwte.size(0), "token id ", id, " outside the vocabulary");
    }
    dispatch(dwte.dtype, "embedding_backward", [&](auto tag) {
      cpu::embedding_backward<decltype(tag)>(dwte, dwpe, dout, tokens);
    });
  }

  // ---- layernorm ----
  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight,
                         Tensor bias) override {
    const int64_t C = weight.numel(), N = check_layernorm(inp, weight, bias, mean, rstd);
    check(out, "out", inp.dtype, N * C);
    dispatch(inp.dtype, "layernorm_forward", [&](auto tag) {
      cpu::layernorm_forward<decltype(tag)>(out, cpu::StatView(mean), cpu::StatView(rstd), inp,
                                            weight, bias);
    });
  }
  void residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd,
                                  Tensor inp1, Tensor inp2, Tensor weight,
                                  Tensor bias) override {
    check(inp1, "inp1", inp1.dtype, inp1.numel());
    check(inp2, "inp2", inp1.dtype, inp1.numel());
    check(residual, "residual", inp1.dtype, inp1.numel());
    dispatch(inp1.dtype, "residual_layernorm_forward", [&](auto tag) {
      using T = decltype(tag);
      T* r = residual.as<T>();
      const T *a = inp1.as<T>(), *b = inp2.as<T>();
      const int64_t n = inp1.numel();
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(n))
      for (int64_t i = 0; i < n; ++i) r[i] = a[i] + b[i];
    });
    Tensor res = residual;
    res.ndim = inp1.ndim;  // LN over the last dim of the input's shape
    for (int i = 0; i < 4; ++i) res.shape[i] = inp1.shape[i];
    layernorm_forward(out, mean, rstd, res, weight, bias);
  }
  void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                          Tensor weight, Tensor mean, Tensor rstd) override {
    const int64_t C = weight.numel(), N = check_layernorm(inp, weight, weight, mean, rstd);
    check(dinp, "dinp", inp.dtype, N * C);
    check(dout, "dout", inp.dtype, N * C);
    check(dweight, "dweight", inp.dtype, C);
    check(dbias, "dbias", inp.dtype, C);
    dispatch(inp.dtype, "layernorm_backward", [&](auto tag) {
      cpu::layernorm_backward<decltype(tag)>(dinp, dweight, dbias, dout, inp, weight,
                                             cpu::StatView(mean), cpu::StatView(rstd));
    });
  }

  // ---- matmul ----
  void matmul_forward(const MatmulForward& a) override {
    const auto [N, C, OC] = check_matmul(a.inp, a.weight);
    const DType t = a.inp.dtype;
    check(a.out, "out", t, N * OC);
    if (a.bias.defined()) check(a.bias, "bias", t, OC);
    if (a.gelu) check(a.pre_gelu, "pre_gelu", t, N * OC);
    dispatch(t, "matmul_forward", [&](auto tag) { cpu::matmul_forward<decltype(tag)>(a); });
  }
  void matmul_backward(const MatmulBackward& a) override {
    const auto [N, C, OC] = check_matmul(a.inp, a.weight);
    const DType t = a.inp.dtype;
    check(a.dout, "dout", t, N * OC);
    if (a.dinp.defined()) check(a.dinp, "dinp", t, N * C);
    if (a.dweight.defined()) check(a.dweight, "dweight", t, OC * C);
    if (a.dbias.defined()) check(a.dbias, "dbias", t, OC);
    if (a.dinp_gelu_pre.defined()) {
      FG_ASSERT(a.dinp.defined(), "dinp_gelu_pre given but no dinp to write");
      check(a.dinp_gelu_pre, "dinp_gelu_pre", t, N * C);
    }
    dispatch(t, "matmul_backward", [&](auto tag) { cpu::matmul_backward<decltype(tag)>(a); });
  }

  // ---- rotary position embedding ----
  void rope(Tensor qkv, int T, int H, bool inverse, int64_t pos0) override {
    check_host(qkv, "qkv");
    FG_ASSERT(qkv.ndim == 2 && T > 0 && H > 0 && qkv.size(0) % T == 0 && qkv.size(1) % (3 * H) == 0,
              "rope: qkv must be (B·T, 3·H·D), got ", qkv.shape_str(), " for T = ", T, ", H = ", H);
    FG_ASSERT(qkv.size(1) / (3 * H) % 2 == 0, "rope: head dim must be even");
    FG_ASSERT(pos0 >= 0, "rope: the first position must not be negative, got ", pos0);
    dispatch(qkv.dtype, "rope", [&](auto tag) { cpu::rope<decltype(tag)>(qkv, T, H, inverse, pos0); });
  }

  // ---- GELU ----
  void gelu_forward(Tensor out, Tensor inp) override {
    check(out, "out", inp.dtype, inp.numel());
    dispatch(inp.dtype, "gelu_forward", [&](auto tag) {
      cpu::gelu_forward<decltype(tag)>(out, inp);
    });
  }
  void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) override {
    check(dinp, "dinp", inp.dtype, inp.numel());
    check(dout, "dout", inp.dtype, inp.numel());
    dispatch(inp.dtype, "gelu_backward", [&](auto tag) {
      cpu::gelu_backward<decltype(tag)>(dinp, inp, dout);
    });
  }

  // ---- attention ----
  void attention_forward(const AttentionForward& a) override {
    const DType t = a.qkv.dtype;
    const int64_t BT = int64_t(a.B) * a.T, BHT = BT * a.H, HD = int64_t(a.H) * a.D;
    FG_ASSERT(a.B > 0 && a.T > 0 && a.H > 0 && a.D > 0, "attention sizes must be positive");
    check(a.qkv, "qkv", t, BT * 3 * HD);
    check(a.out, "out", t, BT * HD);
    check_stat(a.lse, "lse", BHT);
    if (a.algo == AttentionAlgo::naive) check(a.probs, "probs", t, BHT * a.T);
    dispatch(t, "attention_forward", [&](auto tag) {
      using T = decltype(tag);
      if (a.algo == AttentionAlgo::naive) cpu::attention_forward_naive<T>(a);
      else cpu::attention_forward_flash<T>(a);
    });
  }
  void attention_backward(const AttentionBackward& a) override {
    const DType t = a.qkv.dtype;
    const int64_t BT = int64_t(a.B) * a.T, BHT = BT * a.H, HD = int64_t(a.H) * a.D;
    FG_ASSERT(a.B > 0 && a.T > 0 && a.H > 0 && a.D > 0, "attention sizes must be positive");
    check(a.qkv, "qkv", t, BT * 3 * HD);
    check(a.dqkv, "dqkv", t, BT * 3 * HD);
    check(a.dout, "dout", t, BT * HD);
    if (a.algo == AttentionAlgo::naive) {
      check(a.probs, "probs", t, BHT * a.T);
    } else {
      check(a.out, "out", t, BT * HD);
      check_stat(a.lse, "lse", BHT);
      check_stat(a.delta, "delta", BHT);
    }
    dispatch(t, "attention_backward", [&](auto tag) {
      using T = decltype(tag);
      if (a.algo == AttentionAlgo::naive) cpu::attention_backward_naive<T>(a);
      else cpu::attention_backward_flash<T>(a);
    });
  }

  // ---- decoding with a KV cache ----
  void attention_decode(const AttentionDecode& a) override {
    const DType t = a.qkv.dtype;
    const int64_t HD = int64_t(a.H) * a.D;
    check_kv_cache(a.k_cache, a.v_cache, t, a.B, a.H, a.D);
    FG_ASSERT(a.T >= 1 && a.T <= a.k_cache.size(2), "decode length T = ", a.T,
              " must be in [1, cache capacity ", a.k_cache.size(2), "]");
    check(a.qkv, "qkv", t, int64_t(a.B) * 3 * HD);
    check(a.out, "out", t, int64_t(a.B) * HD);
    if (a.lse.defined()) check_stat(a.lse, "lse", int64_t(a.B) * a.H);
    dispatch(t, "attention_decode", [&](auto tag) { cpu::attention_decode<decltype(tag)>(a); });
  }
  void kv_cache_write(const KVCacheWrite& a) override {
    const DType t = a.qkv.dtype;
    check_kv_cache(a.k_cache, a.v_cache, t, a.B, a.H, a.D);
    FG_ASSERT(a.n >= 1 && a.pos >= 0 && a.pos + a.n <= a.k_cache.size(2), "kv_cache_write: positions [",
              a.pos, ", ", a.pos + a.n, ") outside the cache capacity ", a.k_cache.size(2));
    check(a.qkv, "qkv", t, int64_t(a.B) * a.n * 3 * a.H * a.D);
    dispatch(t, "kv_cache_write", [&](auto tag) { cpu::kv_cache_write<decltype(tag)>(a); });
  }

  // ---- softmax + cross-entropy ----
  void softmax_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int V,
                             float dloss) override {
    check_host(logits, "logits");
    const int64_t Vp = logits.size(-1), N = logits.numel() / Vp;
    FG_ASSERT(V > 0 && V <= Vp, "V = ", V, " must be in [1, padded vocab ", Vp, "]");
    check_stat(losses, "losses", N);
    check(targets, "targets", DType::i32, N);
    dispatch(logits.dtype, "softmax_cross_entropy", [&](auto tag) {
      cpu::softmax_cross_entropy<decltype(tag)>(cpu::StatView(losses), logits, targets, V, dloss);
    });
  }

  // ---- optimizer ----
  void adamw_update(const AdamWArgs& a) override {
    const DType t = a.param.dtype;
    const int64_t n = a.param.numel();
    check(a.param, "param", t, n);
    FG_ASSERT(!a.master.defined(), "the CPU AdamW updates param directly: no master copy");
    check(a.grad, "grad", t, n);
    check(a.m, "m", t, n);
    check(a.v, "v", t, n);
    FG_ASSERT(a.step >= 1, "AdamW step is 1-based, got ", a.step);
    for (const AdamWSpan& sp : adamw_spans(a)) {  // each segment with its own weight decay
      AdamWArgs part = a;
      part.segments.clear();
      part.param = a.param.rows(sp.begin, sp.end);
      part.grad = a.grad.rows(sp.begin, sp.end);
      part.m = a.m.rows(sp.begin, sp.end);
      part.v = a.v.rows(sp.begin, sp.end);
      part.weight_decay = sp.weight_decay;
      part.index0 = sp.index0;
      dispatch(t, "adamw_update", [&](auto tag) { cpu::adamw_update<decltype(tag)>(part); });
    }
  }
  void sum_squares(Tensor out, Tensor grad) override {
    check_host(grad, "grad");
    check_stat(out, "sum_squares out", 1);
    dispatch(grad.dtype, "sum_squares", [&](auto tag) {
      cpu::sum_squares<decltype(tag)>(cpu::StatView(out), grad);
    });
  }
  void scale(Tensor x, float s) override {
    check_host(x, "x");
    dispatch(x.dtype, "scale", [&](auto tag) { cpu::scale<decltype(tag)>(x, s); });
  }

 private:
  // Checks a layernorm's input/parameters/statistics; returns the row count N.
  static int64_t check_layernorm(const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                 const Tensor& mean, const Tensor& rstd) {
    check_host(inp, "inp");
    const int64_t C = inp.size(-1), N = inp.numel() / C;
    check(weight, "weight", inp.dtype, C);
    check(bias, "bias", inp.dtype, C);
    check_stat(mean, "mean", N);
    check_stat(rstd, "rstd", N);
    return N;
  }
  // k and v caches: (B, H, Tmax, D), same dtype t, on the CPU.
  static void check_kv_cache(const Tensor& k, const Tensor& v, DType t, int B, int H, int D) {
    FG_ASSERT(B > 0 && H > 0 && D > 0, "decode sizes must be positive");
    for (const Tensor* c : {&k, &v}) {
      FG_ASSERT(c->ndim == 4 && c->size(0) == B && c->size(1) == H && c->size(3) == D,
                "KV cache ", c->shape_str(), " is not (B=", B, ", H=", H, ", Tmax, D=", D, ")");
      check(*c, "KV cache", t, c->numel());
    }
    FG_ASSERT(k.size(2) == v.size(2), "k and v caches differ in capacity");
  }
  struct MatmulDims { int64_t N, C, OC; };
  static MatmulDims check_matmul(const Tensor& inp, const Tensor& weight) {
    check_host(inp, "inp");
    check_host(weight, "weight");
    FG_ASSERT(weight.ndim == 2, "weight must be (OC, C), got ", weight.shape_str());
    const int64_t C = weight.size(1), OC = weight.size(0);
    FG_ASSERT(inp.size(-1) == C, "inp ", inp.shape_str(), " does not match weight ",
              weight.shape_str());
    check(weight, "weight", inp.dtype, OC * C);
    return {inp.numel() / C, C, OC};
  }
};
}  // namespace

std::unique_ptr<Ops> make_cpu_ops() { return std::make_unique<CpuOps>(); }

}  // namespace flashgpt
