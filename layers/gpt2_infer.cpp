// GPT-2 inference with a KV cache: the forward of layers/gpt2.cpp without what only
// training needs, plus the cache. Notation: R = B·n rows of this step, C = n_embd, H
// heads of D = C/H, Vp = padded vocab, Tmax = max_len.
#include "layers/gpt2_infer.h"
#include <algorithm>
#include <cstring>
#include "src/errors.h"
#include "src/host_floats.h"

namespace flashgpt {
namespace {

DType stat_dtype(DType act) { return act == DType::f64 ? DType::f64 : DType::f32; }

// Tensors laid out in one allocation, each 256-byte aligned.
struct Layout {
  struct Entry { Tensor* t; size_t offset; };
  std::vector<Entry> entries;
  size_t bytes = 0;
  void add(Tensor& t, DType dtype, Device dev, std::initializer_list<int64_t> shape) {
    t = Tensor(nullptr, dtype, dev, shape);
    bytes = (bytes + 255) / 256 * 256;
    entries.push_back({&t, bytes});
    bytes += t.nbytes();
  }
  void* allocate(Ops& ops) {
    char* base = static_cast<char*>(ops.alloc(bytes));
    for (auto& e : entries) e.t->data = base + e.offset;
    return base;
  }
};

}  // namespace

struct GPT2Decoder::Weights {
  struct Layer { Tensor ln1_w, ln1_b, qkv_w, qkv_b, attproj_w, attproj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b; };
  Tensor wte, wpe, lnf_w, lnf_b;
  std::vector<Layer> h;
};

struct GPT2Decoder::Buffers {
  std::vector<Tensor> k, v;        // per layer (B, H, Tmax, D)
  Tensor tokens;                   // (B·Tmax) int32: the step's (B, n) at the front
  Tensor x, res2;                  // (R, C) residual stream: block input, after attention
  Tensor ln, mean, rstd;           // (R, C), (R), (R)
  Tensor qkv;                      // (R, 3C)
  Tensor atty, proj;               // (R, C)
  Tensor fch_pre, fch;             // (R, 4C)
  Tensor lse;                      // (B·H·Tmax): the prompt's (B, H, n) attention statistics
  Tensor logits;                   // (B, Vp)
};

GPT2Decoder::GPT2Decoder(GPT2& model, int B, int max_len)
    : model_(model), ops_(model.ops()), B_(B), max_len_(max_len) {
  const ModelConfig& c = model.config();
  if (B < 1) fail_input("decoding needs at least one sequence, got B = ", B);
  if (max_len < 1 || max_len > c.max_seq_len)
    fail_input("sequence length ", max_len, " is outside the model's context [1, ", c.max_seq_len, "]");

  // Views of the parameters, found by their names in the model's parameter list.
  w_ = std::make_unique<Weights>();
  auto view = [&](const std::string& name) {
    for (const ParamInfo& p : model.param_list())
      if (p.name == name) return model.param(p);
    fail("GPT2Decoder: the model has no parameter '", name, "'");
  };
  w_->wte = view("wte");
  if (c.position == PositionEncoding::learned) w_->wpe = view("wpe");  // rope: no table (undefined)
  w_->lnf_w = view("ln_f.weight");
  w_->lnf_b = view("ln_f.bias");
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    w_->h.push_back({view(p + "ln_1.weight"), view(p + "ln_1.bias"), view(p + "attn.c_attn.weight"),
                     view(p + "attn.c_attn.bias"), view(p + "attn.c_proj.weight"), view(p + "attn.c_proj.bias"),
                     view(p + "ln_2.weight"), view(p + "ln_2.bias"), view(p + "mlp.c_fc.weight"),
                     view(p + "mlp.c_fc.bias"), view(p + "mlp.c_proj.weight"), view(p + "mlp.c_proj.bias")});
  }

  const int64_t C = c.n_embd, H = c.n_head, D = C / H, R = int64_t(B) * max_len;
  const DType a = model.dtype(), s = stat_dtype(a);
  const Device dev = ops_.device();
  buf_ = std::make_unique<Buffers>();
  Buffers& y = *buf_;
  Layout plan;
  y.k.resize(size_t(c.n_layer));
  y.v.resize(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    plan.add(y.k[size_t(l)], a, dev, {B, H, max_len, D});
    plan.add(y.v[size_t(l)], a, dev, {B, H, max_len, D});
  }
  plan.add(y.tokens, DType::i32, dev, {R});
  plan.add(y.x, a, dev, {R, C});
  plan.add(y.res2, a, dev, {R, C});
  plan.add(y.ln, a, dev, {R, C});
  plan.add(y.mean, s, dev, {R});
  plan.add(y.rstd, s, dev, {R});
  plan.add(y.qkv, a, dev, {R, 3 * C});
  plan.add(y.atty, a, dev, {R, C});
  plan.add(y.proj, a, dev, {R, C});
  plan.add(y.fch_pre, a, dev, {R, 4 * C});
  plan.add(y.fch, a, dev, {R, 4 * C});
  plan.add(y.lse, s, dev, {R * H});
  plan.add(y.logits, a, dev, {B, c.padded_vocab});
  mem_ = plan.allocate(ops_);
  staging_.resize(size_t(R));
}

GPT2Decoder::~GPT2Decoder() {
  if (mem_) ops_.free(mem_);
}

size_t GPT2Decoder::cache_bytes() const {
  size_t n = 0;
  for (size_t l = 0; l < buf_->k.size(); ++l) n += buf_->k[l].nbytes() + buf_->v[l].nbytes();
  return n;
}

void GPT2Decoder::step(const int32_t* tokens, int n, std::vector<double>& logits) {
  FG_ASSERT(n >= 1, "step needs at least one token");
  if (pos_ + n > max_len_)
    fail_input("sequence would grow to ", pos_ + n, " tokens, past the decoder's maximum of ", max_len_);
  const int V = model_.config().vocab_size;
  for (int64_t i = 0; i < int64_t(B_) * n; ++i)
    if (tokens[i] < 0 || tokens[i] >= V)
      fail_input("token id ", tokens[i], " is outside the model's vocabulary [0, ", V, ")");
  if (pos_ == 0 || n == 1) {
    forward(tokens, n, logits);
    return;
  }
  // Several tokens after the prompt: one decode step each.
  std::vector<int32_t> one(static_cast<size_t>(B_));
  for (int t = 0; t < n; ++t) {
    for (int b = 0; b < B_; ++b) one[size_t(b)] = tokens[int64_t(b) * n + t];
    forward(one.data(), 1, logits);
  }
}

// One step: n new tokens per sequence at positions [pos_, pos_ + n). n > 1 only as the
// first step (causal attention over the prompt itself); otherwise n == 1 and the token
// attends to the cache.
void GPT2Decoder::forward(const int32_t* tokens, int n, std::vector<double>& logits) {
  const ModelConfig& c = model_.config();
  const int B = B_, C = c.n_embd, H = c.n_head, D = C / H, L = c.n_layer;
  const int64_t R = int64_t(B) * n;
  Buffers& y = *buf_;
  Tensor x = y.x.rows(0, R), res2 = y.res2.rows(0, R), ln = y.ln.rows(0, R), mean = y.mean.rows(0, R),
         rstd = y.rstd.rows(0, R), qkv = y.qkv.rows(0, R), atty = y.atty.rows(0, R), proj = y.proj.rows(0, R),
         fch_pre = y.fch_pre.rows(0, R), fch = y.fch.rows(0, R);

  std::memcpy(staging_.data(), tokens, size_t(R) * sizeof(int32_t));
  Tensor tok = y.tokens.rows(0, R).view({B, n});
  ops_.from_host(tok, staging_.data());
  // wpe rows from pos_: the embedding adds wpe[t] for t in [0, n) of its view. With
  // rotary positions there is no table: q and k are rotated by their positions instead.
  const bool rope = c.position == PositionEncoding::rope;
  ops_.embedding_forward(x, tok, w_->wte, rope ? Tensor() : w_->wpe.rows(pos_, pos_ + n));

  for (int l = 0; l < L; ++l) {
    const Weights::Layer& w = w_->h[size_t(l)];
    // x is the block input; res2 = x + attn(ln_1(x)); x = res2 + mlp(ln_2(res2)).
    // ln = ln_1(x): here for block 0, fused into the previous block's last residual add after.
    if (l == 0) ops_.layernorm_forward(ln, mean, rstd, x, w.ln1_w, w.ln1_b);
    ops_.matmul_forward({.out = qkv, .inp = ln, .weight = w.qkv_w, .bias = w.qkv_b});
    // Rows (b, t) are at positions pos_ + t; the cache keeps k rotated, as training sees it.
    if (rope) ops_.rope(qkv, n, H, /*inverse=*/false, /*pos0=*/pos_);
    ops_.kv_cache_write({.k_cache = y.k[size_t(l)], .v_cache = y.v[size_t(l)], .qkv = qkv,
                         .B = B, .n = n, .H = H, .D = D, .pos = pos_});
    if (pos_ == 0) {
      // The prompt: causal attention within it (the cache has nothing else yet).
      AttentionForward att;
      att.out = atty; att.lse = y.lse.rows(0, R * H).view({B, H, n}); att.qkv = qkv;
      att.B = B; att.T = n; att.H = H; att.D = D; att.causal = true; att.algo = AttentionAlgo::flash;
      ops_.attention_forward(att);
    } else {
      FG_ASSERT(n == 1, "after the prompt, tokens are decoded one at a time");
      ops_.attention_decode({.out = atty, .lse = {}, .qkv = qkv, .k_cache = y.k[size_t(l)],
                             .v_cache = y.v[size_t(l)], .B = B, .H = H, .D = D, .T = pos_ + 1,
                             .settled = pos_});  // kv_cache_write just filled position pos_
    }
    ops_.matmul_forward({.out = proj, .inp = atty, .weight = w.attproj_w, .bias = w.attproj_b});
    ops_.residual_layernorm_forward(res2, ln, mean, rstd, x, proj, w.ln2_w, w.ln2_b);
    ops_.matmul_forward({.out = fch, .inp = ln, .weight = w.fc_w, .bias = w.fc_b, .gelu = true, .pre_gelu = fch_pre});
    ops_.matmul_forward({.out = proj, .inp = fch, .weight = w.fcproj_w, .bias = w.fcproj_b});
    // x = res2 + proj (the block input is no longer needed), ln = the next block's ln_1(x),
    // or ln_f(x) after the last block.
    if (l + 1 < L) {
      ops_.residual_layernorm_forward(x, ln, mean, rstd, res2, proj, w_->h[size_t(l + 1)].ln1_w,
                                      w_->h[size_t(l + 1)].ln1_b);
    } else {
      ops_.residual_layernorm_forward(x, ln, mean, rstd, res2, proj, w_->lnf_w, w_->lnf_b);
    }
  }
  // ln now holds ln_f(x). Logits of each sequence's last new token only.
  const int64_t Vp = c.padded_vocab;
  if (n == 1) {
    ops_.matmul_forward({.out = y.logits, .inp = ln, .weight = w_->wte});
  } else {
    for (int b = 0; b < B; ++b) {
      const int64_t row = int64_t(b) * n + n - 1;
      ops_.matmul_forward({.out = y.logits.rows(b, b + 1), .inp = ln.rows(row, row + 1), .weight = w_->wte});
    }
  }
  std::vector<char> raw(y.logits.nbytes());
  ops_.to_host(raw.data(), y.logits);
  std::vector<double> all = doubles_from_raw(raw.data(), y.logits.dtype, size_t(B) * size_t(Vp));
  logits.resize(size_t(B) * size_t(c.vocab_size));
  for (int b = 0; b < B; ++b)
    std::copy_n(all.begin() + int64_t(b) * Vp, c.vocab_size, logits.begin() + int64_t(b) * c.vocab_size);
  pos_ += n;
}

}  // namespace flashgpt
