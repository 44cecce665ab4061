// GPT-2 forward and backward, written once against the op set.
// Notation: BT = B·T rows, C = n_embd, H heads of D = C/H, Vp = padded vocab.
#include "layers/gpt2.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include "src/errors.h"
#include "src/host_floats.h"

namespace flashgpt {
namespace {

constexpr size_t kAlignElems = 64;   // every tensor starts 128-byte aligned (bf16) or better
constexpr int64_t kHeadChunkRows = 8192;  // rows of logits alive at once (B·T·Vp never exists)
constexpr double kInitStd = 0.02;

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
DType stat_dtype(DType act) { return act == DType::f64 ? DType::f64 : DType::f32; }

// Host copy of any float tensor as doubles.
std::vector<double> host_doubles(Ops& ops, const Tensor& t) {
  std::vector<char> raw(t.nbytes());
  ops.to_host(raw.data(), t);
  return doubles_from_raw(raw.data(), t.dtype, size_t(t.numel()));
}

void upload_doubles(Ops& ops, const Tensor& t, const std::vector<double>& v) {
  std::vector<char> raw(t.nbytes());
  doubles_to_raw(raw.data(), t.dtype, v);
  ops.from_host(t, raw.data());
}

// View of one parameter inside a flat arena (parameters or gradients).
Tensor slice_as(const Tensor& flat, const ParamInfo& p) {
  Tensor t = flat;
  t.data = static_cast<char*>(flat.data) + p.offset * dtype_size(flat.dtype);
  t.ndim = int(p.shape.size());
  for (int i = 0; i < t.ndim; ++i) t.shape[i] = p.shape[size_t(i)];
  return t;
}

// Lays out tensors in one allocation; offsets first, memory later. Each buffer has a
// kind (for the memory plan) and is seen through one or more views: a tensor that the
// backward recomputes is one buffer shared by the views of every layer.
struct ArenaPlan {
  struct Entry { std::vector<Tensor*> views; size_t offset; };
  std::vector<Entry> entries;
  std::vector<std::pair<std::string, size_t>> kinds;  // bytes per kind, first-seen order
  size_t bytes = 0;
  void add(std::vector<Tensor*> views, const char* kind, DType dtype, Device dev,
           std::initializer_list<int64_t> shape) {
    const Tensor t(nullptr, dtype, dev, shape);
    for (Tensor* v : views) *v = t;
    bytes = align_up(bytes, 256);  // 256: also what keys cuBLASLt's algorithm cache
    entries.push_back({std::move(views), bytes});
    bytes += t.nbytes();
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == kind; });
    if (it == kinds.end()) kinds.emplace_back(kind, t.nbytes());
    else it->second += t.nbytes();
  }
  void* allocate(Ops& ops) {
    char* base = static_cast<char*>(ops.alloc(bytes));
    for (auto& e : entries)
      for (Tensor* v : e.views) v->data = base + e.offset;
    return base;
  }
};

// An op set that only hands out addresses: GPT2::memory constructs the model on it to
// learn what the model allocates, by running the very code that allocates. Nothing is
// ever read or written through those addresses, and no op may run.
class PlanningOps final : public Ops {
 public:
  explicit PlanningOps(Device d) : device_(d) {}
  Device device() const override { return device_; }
  std::string name() const override { return "planning"; }
  void* alloc(size_t) override { return reinterpret_cast<void*>(kFakeBase); }
  void free(void*) override {}
  void* alloc_host(size_t) override { return nullptr; }
  void free_host(void*) override {}
  void memset_zero(Tensor) override {}
  void to_host(void*, const Tensor&) override { no_compute(); }
  void from_host(const Tensor&, const void*) override { no_compute(); }
  void synchronize() override {}
  void cast(Tensor, Tensor) override { no_compute(); }
  void embedding_forward(Tensor, Tensor, Tensor, Tensor) override { no_compute(); }
  void embedding_backward(Tensor, Tensor, Tensor, Tensor) override { no_compute(); }
  void rope(Tensor, int, int, bool, int64_t) override { no_compute(); }
  void layernorm_forward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor) override { no_compute(); }
  void residual_layernorm_forward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor) override { no_compute(); }
  void layernorm_backward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor) override { no_compute(); }
  void matmul_forward(const MatmulForward&) override { no_compute(); }
  void matmul_backward(const MatmulBackward&) override { no_compute(); }
  void gelu_forward(Tensor, Tensor) override { no_compute(); }
  void gelu_backward(Tensor, Tensor, Tensor) override { no_compute(); }
  void attention_forward(const AttentionForward&) override { no_compute(); }
  void attention_backward(const AttentionBackward&) override { no_compute(); }
  void softmax_cross_entropy(Tensor, Tensor, Tensor, int, float) override { no_compute(); }
  void adamw_update(const AdamWArgs&) override { no_compute(); }
  void sum_squares(Tensor, Tensor) override { no_compute(); }
  void scale(Tensor, float) override { no_compute(); }
  void attention_decode(const AttentionDecode&) override { no_compute(); }
  void kv_cache_write(const KVCacheWrite&) override { no_compute(); }

 private:
  static constexpr uintptr_t kFakeBase = uintptr_t(1) << 40;  // aligned, never dereferenced
  [[noreturn]] static void no_compute() { fail("PlanningOps only plans memory; it cannot compute"); }
  Device device_;
};

}  // namespace

// Views into the parameter and gradient arenas for one block.
struct GPT2::Layer {
  Tensor ln1_w, ln1_b, qkv_w, qkv_b, attproj_w, attproj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  Tensor d_ln1_w, d_ln1_b, d_qkv_w, d_qkv_b, d_attproj_w, d_attproj_b, d_ln2_w, d_ln2_b, d_fc_w, d_fc_b, d_fcproj_w, d_fcproj_b;
};

// Views of the parameters outside the blocks: embeddings and the final layernorm.
struct GPT2::Ends {
  Tensor wte, wpe, lnf_w, lnf_b, d_wte, d_wpe, d_lnf_w, d_lnf_b;
};

// Activations: per layer what backward needs, plus scratch shared by all layers. A
// tensor the recompute policy does not keep is one buffer seen by every layer's view:
// the forward overwrites it layer after layer, the backward recomputes it (recompute()).
struct GPT2::Acts {
  struct PerLayer {
    Tensor ln1, ln1_mean, ln1_rstd;   // (BT,C), (BT), (BT)
    Tensor qkv;                       // (BT,3C) = (B,T,3,H,D); q, k rotated with rope
    Tensor atty, lse, probs;          // (BT,C) = (B,T,H,D), (B,H,T), naive: (B,H,T,T)
    Tensor res2;                      // (BT,C) residual after attention
    Tensor ln2, ln2_mean, ln2_rstd;   // (BT,C), (BT), (BT)
    Tensor fch_pre, fch;              // (BT,4C) before / after GELU
    Tensor res3;                      // (BT,C) residual after the MLP = block output; always kept
  };
  std::vector<PerLayer> l;
  Tensor tokens, targets;             // (B,T) and (BT) int32
  Tensor encoded;                     // (BT,C) embeddings
  Tensor lnf, lnf_mean, lnf_rstd;     // (BT,C), (BT), (BT)
  Tensor losses;                      // (BT)
  Tensor logits;                      // (chunk, Vp) head scratch, becomes dlogits
  // scratch
  Tensor proj;                        // (BT,C) output of attn/MLP projections
  Tensor dres, dln, datty;            // (BT,C)
  Tensor dqkv;                        // (BT,3C)
  Tensor dfch;                        // (BT,4C)
  Tensor delta;                       // (B,H,T) attention backward rowsum(dO∘O)
};

GPT2::GPT2(const ModelConfig& cfg, Ops& ops, DType dtype, int B, int T, const ModelOptions& opts)
    : cfg_(cfg), ops_(ops), dtype_(dtype), B_(B), T_(T), opts_(opts),
      unfused_gelu_(opts.recompute.gelu || opts.deterministic) {
  FG_ASSERT(opts.layer_align >= 1, "layer_align must be >= 1");
  FG_ASSERT(cfg.n_embd % cfg.n_head == 0, "n_embd must be divisible by n_head");
  FG_ASSERT(T <= cfg.max_seq_len, "T exceeds max_seq_len");
  FG_ASSERT(cfg.padded_vocab >= cfg.vocab_size, "padded_vocab < vocab_size");
  FG_ASSERT(cfg.position == PositionEncoding::learned || (cfg.n_embd / cfg.n_head) % 2 == 0,
            "rotary positions need an even head dim");
  try {
    plan_params();
    plan_activations();
  } catch (...) {  // e.g. out of device memory: give back what was allocated
    release();
    throw;
  }
}

GPT2::~GPT2() { release(); }

void GPT2::release() {
  if (param_mem_) ops_.free(param_mem_);
  if (grad_mem_) ops_.free(grad_mem_);
  if (act_mem_) ops_.free(act_mem_);
  if (staging_) ops_.free_host(staging_);
  param_mem_ = grad_mem_ = act_mem_ = nullptr;
  staging_ = nullptr;
}

ModelMemory GPT2::memory(const ModelConfig& cfg, Device device, DType dtype, int B, int T,
                         const ModelOptions& opts) {
  PlanningOps planning(device);
  GPT2 m(cfg, planning, dtype, B, T, opts);
  ModelMemory r;
  r.num_params = m.num_params();
  for (const ParamInfo& p : m.param_list_) r.largest_param = std::max(r.largest_param, size_t(p.numel()));
  r.param_bytes = m.params_.nbytes();
  r.grad_bytes = m.grads_.nbytes();
  r.activation_bytes = m.act_bytes_;
  r.activation_kinds = m.act_kinds_;
  r.params = m.param_list_;
  return r;
}

void GPT2::plan_params() {
  const int64_t C = cfg_.n_embd, L = cfg_.n_layer;
  size_t off = 0, packed = 0;
  // Each parameter is named once; its parameter and gradient views are bound after
  // the two arenas exist.
  struct Binding { size_t index; Tensor* param; Tensor* grad; };
  std::vector<Binding> bindings;
  const size_t layer_align = std::lcm(opts_.layer_align, kAlignElems);
  auto add = [&](const std::string& name, int layer, std::vector<int64_t> shape, bool decay,
                 Tensor* param, Tensor* grad) {
    if (layer + 2 > int(layer_start_.size())) {  // the first parameter of a new layer
      off = align_up(off, layer_align);
      layer_start_.push_back(off);
    }
    ParamInfo p{name, layer, off, packed, shape, decay};
    off = align_up(off + size_t(p.numel()), kAlignElems);
    packed += size_t(p.numel());
    bindings.push_back({param_list_.size(), param, grad});
    param_list_.push_back(p);
  };
  // Layer-major: one layer's parameters (and so its gradients) are one contiguous range.
  ends_ = std::make_unique<Ends>();
  Ends& e = *ends_;
  add("wte", -1, {cfg_.padded_vocab, C}, true, &e.wte, &e.d_wte);
  if (cfg_.position == PositionEncoding::learned)
    add("wpe", -1, {cfg_.max_seq_len, C}, true, &e.wpe, &e.d_wpe);
  layers_.resize(size_t(L));
  for (int l = 0; l < L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    Layer& y = layers_[size_t(l)];
    add(h + "ln_1.weight", l, {C}, false, &y.ln1_w, &y.d_ln1_w);
    add(h + "ln_1.bias", l, {C}, false, &y.ln1_b, &y.d_ln1_b);
    add(h + "attn.c_attn.weight", l, {3 * C, C}, true, &y.qkv_w, &y.d_qkv_w);
    add(h + "attn.c_attn.bias", l, {3 * C}, false, &y.qkv_b, &y.d_qkv_b);
    add(h + "attn.c_proj.weight", l, {C, C}, true, &y.attproj_w, &y.d_attproj_w);
    add(h + "attn.c_proj.bias", l, {C}, false, &y.attproj_b, &y.d_attproj_b);
    add(h + "ln_2.weight", l, {C}, false, &y.ln2_w, &y.d_ln2_w);
    add(h + "ln_2.bias", l, {C}, false, &y.ln2_b, &y.d_ln2_b);
    add(h + "mlp.c_fc.weight", l, {4 * C, C}, true, &y.fc_w, &y.d_fc_w);
    add(h + "mlp.c_fc.bias", l, {4 * C}, false, &y.fc_b, &y.d_fc_b);
    add(h + "mlp.c_proj.weight", l, {C, 4 * C}, true, &y.fcproj_w, &y.d_fcproj_w);
    add(h + "mlp.c_proj.bias", l, {C}, false, &y.fcproj_b, &y.d_fcproj_b);
  }
  add("ln_f.weight", int(L), {C}, false, &e.lnf_w, &e.d_lnf_w);
  add("ln_f.bias", int(L), {C}, false, &e.lnf_b, &e.d_lnf_b);
  off = align_up(off, layer_align);
  layer_start_.push_back(off);

  DType gd = GradDType(dtype_);
  param_mem_ = ops_.alloc(off * dtype_size(dtype_));
  params_ = Tensor(param_mem_, dtype_, ops_.device(), {int64_t(off)});
  ops_.memset_zero(params_);
  if (opts_.gradients) {
    grad_mem_ = ops_.alloc(off * dtype_size(gd));
    grads_ = Tensor(grad_mem_, gd, ops_.device(), {int64_t(off)});
    ops_.memset_zero(grads_);
  }
  for (const Binding& b : bindings) {
    *b.param = slice_as(params_, param_list_[b.index]);
    if (opts_.gradients) *b.grad = slice_as(grads_, param_list_[b.index]);
  }
}

std::pair<size_t, size_t> GPT2::layer_range(int layer) const {
  FG_ASSERT(layer >= -1 && layer <= cfg_.n_layer, "no parameters for layer ", layer);
  return {layer_start_[size_t(layer + 1)], layer_start_[size_t(layer + 2)]};
}

size_t GPT2::num_packed() const {
  const ParamInfo& last = param_list_.back();
  return last.packed + size_t(last.numel());
}

void GPT2::plan_activations() {
  const int64_t B = B_, T = T_, BT = B * T, C = cfg_.n_embd, H = cfg_.n_head;
  const int64_t Vp = cfg_.padded_vocab;
  const DType a = dtype_, s = stat_dtype(dtype_);
  const Device dev = ops_.device();
  const RecomputePolicy& rc = opts_.recompute;
  acts_ = std::make_unique<Acts>();
  Acts& A = *acts_;
  A.l.resize(size_t(cfg_.n_layer));
  ArenaPlan plan;
  // One tensor per layer, or one buffer for all layers when backward recomputes it.
  auto per_layer = [&](Tensor Acts::PerLayer::*member, bool recomputed, const char* kind, DType dt,
                       std::initializer_list<int64_t> shape) {
    std::vector<Tensor*> views;
    for (auto& y : A.l) views.push_back(&(y.*member));
    if (recomputed) {
      plan.add(views, kind, dt, dev, shape);
    } else {
      for (Tensor* v : views) plan.add({v}, kind, dt, dev, shape);
    }
  };
  using PerLayer = Acts::PerLayer;
  per_layer(&PerLayer::ln1, rc.ln || rc.block, "layernorm outputs", a, {BT, C});
  per_layer(&PerLayer::ln2, rc.ln || rc.block, "layernorm outputs", a, {BT, C});
  per_layer(&PerLayer::ln1_mean, rc.block, "layernorm statistics", s, {BT});
  per_layer(&PerLayer::ln1_rstd, rc.block, "layernorm statistics", s, {BT});
  per_layer(&PerLayer::ln2_mean, rc.block, "layernorm statistics", s, {BT});
  per_layer(&PerLayer::ln2_rstd, rc.block, "layernorm statistics", s, {BT});
  per_layer(&PerLayer::qkv, rc.block, "QKV", a, {BT, 3 * C});
  per_layer(&PerLayer::atty, rc.attn || rc.block, "attention output", a, {BT, C});
  per_layer(&PerLayer::lse, rc.attn || rc.block, "attention LSE", s, {B, H, T});
  if (opts_.attention == AttentionAlgo::naive)
    per_layer(&PerLayer::probs, rc.attn || rc.block, "attention P (naive)", a, {B, H, T, T});
  per_layer(&PerLayer::fch_pre, rc.block, "MLP pre-GELU", a, {BT, 4 * C});
  per_layer(&PerLayer::fch, rc.gelu || rc.block, "MLP GELU output", a, {BT, 4 * C});
  per_layer(&PerLayer::res2, rc.block, "residual stream", a, {BT, C});
  per_layer(&PerLayer::res3, /*recomputed=*/false, "residual stream", a, {BT, C});
  plan.add({&A.encoded}, "residual stream", a, dev, {BT, C});
  plan.add({&A.lnf}, "layernorm outputs", a, dev, {BT, C});
  plan.add({&A.lnf_mean}, "layernorm statistics", s, dev, {BT});
  plan.add({&A.lnf_rstd}, "layernorm statistics", s, dev, {BT});
  plan.add({&A.tokens}, "tokens, targets, losses", DType::i32, dev, {B, T});
  plan.add({&A.targets}, "tokens, targets, losses", DType::i32, dev, {BT});
  plan.add({&A.losses}, "tokens, targets, losses", s, dev, {BT});
  plan.add({&A.logits}, "LM-head chunk", a, dev, {std::min(BT, kHeadChunkRows), Vp});
  // Shared by all layers: projection outputs (forward) and activation gradients (backward).
  plan.add({&A.proj}, "scratch (projections, gradients)", a, dev, {BT, C});
  plan.add({&A.dres}, "scratch (projections, gradients)", a, dev, {BT, C});
  plan.add({&A.dln}, "scratch (projections, gradients)", a, dev, {BT, C});
  plan.add({&A.datty}, "scratch (projections, gradients)", a, dev, {BT, C});
  plan.add({&A.dqkv}, "scratch (projections, gradients)", a, dev, {BT, 3 * C});
  plan.add({&A.dfch}, "scratch (projections, gradients)", a, dev, {BT, 4 * C});
  plan.add({&A.delta}, "scratch (projections, gradients)", s, dev, {B, H, T});
  act_bytes_ = plan.bytes;
  act_kinds_ = plan.kinds;
  act_mem_ = plan.allocate(ops_);
  staging_ = static_cast<int32_t*>(ops_.alloc_host(size_t(2 * BT) * sizeof(int32_t)));
}

// One tensor at a time, so the host holds the largest tensor's draws, not the arena's (for
// GPT-2 1.5B 0.6 GB instead of 12 GB of doubles); the draws in the same order, so the same
// weights. The gaps between tensors stay as the arena was built: zero.
void GPT2::init_random(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const double proj_std = kInitStd / std::sqrt(2.0 * cfg_.n_layer);
  std::vector<double> host;
  for (const auto& p : param_list_) {
    const int64_t n = p.numel();
    host.assign(size_t(n), 0.0);
    double* w = host.data();
    auto ends_with = [&](const char* suffix) {
      size_t k = std::strlen(suffix);
      return p.name.size() >= k && p.name.compare(p.name.size() - k, k, suffix) == 0;
    };
    if (ends_with("ln_1.weight") || ends_with("ln_2.weight") || p.name == "ln_f.weight") {
      for (int64_t i = 0; i < n; ++i) w[i] = 1.0;
    } else if (p.shape.size() == 2) {
      bool residual_proj = ends_with("c_proj.weight");
      std::normal_distribution<double> dist(0.0, residual_proj ? proj_std : kInitStd);
      for (int64_t i = 0; i < n; ++i) w[i] = dist(rng);
      if (p.name == "wte")  // padding rows never receive gradient; keep them zero
        for (int64_t i = int64_t(cfg_.vocab_size) * cfg_.n_embd; i < n; ++i) w[i] = 0.0;
    }  // biases stay 0
    upload_doubles(ops_, slice_as(params_, p), host);
  }
}

void GPT2::set_batch(const int32_t* inputs, const int32_t* targets) {
  const int64_t BT = int64_t(B_) * T_;
  for (int64_t i = 0; i < BT; ++i) {
    if (inputs[i] < 0 || inputs[i] >= cfg_.vocab_size)
      fail_input("token id ", inputs[i], " at position ", i, " is outside the vocabulary [0, ", cfg_.vocab_size, ")");
    if (targets[i] >= cfg_.vocab_size)
      fail_input("target id ", targets[i], " at position ", i, " is outside the vocabulary");
  }
  // Stage in page-locked memory and upload asynchronously: the copy overlaps with
  // whatever the GPU is still doing. forward() reads the losses back (a synchronising
  // to_host), so the staging buffer is free again by the next set_batch().
  std::memcpy(staging_, inputs, size_t(BT) * sizeof(int32_t));
  std::memcpy(staging_ + BT, targets, size_t(BT) * sizeof(int32_t));
  ops_.from_host_async(acts_->tokens, staging_);
  ops_.from_host_async(acts_->targets, staging_ + BT);
  host_targets_.assign(targets, targets + BT);
}

void GPT2::zero_grad() {
  FG_ASSERT(opts_.gradients, "zero_grad() on a model built without gradients");
  ops_.memset_zero(grads_);
}

float GPT2::forward(float dloss) {
  FG_ASSERT(dloss == 0.0f || opts_.gradients, "forward(dloss != 0) on a model built without gradients");
  Acts& A = *acts_;
  ops_.embedding_forward(A.encoded, A.tokens, ends_->wte, ends_->wpe);  // wpe undefined with rope
  for (int l = 0; l < cfg_.n_layer; ++l) block_forward(l, /*recompute=*/false);
  // LM head, chunk by chunk: logits → loss (+ dlogits in place) → head backward.
  const int64_t BT = int64_t(B_) * T_;
  const int64_t chunk = A.logits.shape[0];
  for (int64_t r = 0; r < BT; r += chunk) head_chunk(r, std::min(BT, r + chunk), dloss);
  std::vector<double> losses = host_doubles(ops_, A.losses);
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < BT; ++i)
    if (host_targets_[size_t(i)] >= 0) { sum += losses[size_t(i)]; ++count; }
  last_loss_ = count ? sum / double(count) : 0.0;
  return float(last_loss_);
}

void GPT2::block_forward(int l, bool recompute) {
  Acts& A = *acts_;
  const int L = cfg_.n_layer;
  Layer& w = layers_[size_t(l)];
  Acts::PerLayer& y = A.l[size_t(l)];
  const Tensor& res_in = l == 0 ? A.encoded : A.l[size_t(l - 1)].res3;
  // ln_1 of layer 0 (and of any re-run block); the forward of later layers got theirs fused
  // into the previous block's last residual add, with the same bits.
  if (l == 0 || recompute) ops_.layernorm_forward(y.ln1, y.ln1_mean, y.ln1_rstd, res_in, w.ln1_w, w.ln1_b);
  ops_.matmul_forward({.out = y.qkv, .inp = y.ln1, .weight = w.qkv_w, .bias = w.qkv_b});
  if (cfg_.position == PositionEncoding::rope) ops_.rope(y.qkv, T_, cfg_.n_head, /*inverse=*/false, /*pos0=*/0);
  attention_forward(l);
  ops_.matmul_forward({.out = A.proj, .inp = y.atty, .weight = w.attproj_w, .bias = w.attproj_b});
  ops_.residual_layernorm_forward(y.res2, y.ln2, y.ln2_mean, y.ln2_rstd, res_in, A.proj, w.ln2_w, w.ln2_b);
  if (unfused_gelu_) {
    ops_.matmul_forward({.out = y.fch_pre, .inp = y.ln2, .weight = w.fc_w, .bias = w.fc_b});
    ops_.gelu_forward(y.fch, y.fch_pre);
  } else {
    ops_.matmul_forward({.out = y.fch, .inp = y.ln2, .weight = w.fc_w, .bias = w.fc_b, .gelu = true, .pre_gelu = y.fch_pre});
  }
  if (recompute) return;  // the rest only makes res3, which is kept, and the next ln_1
  ops_.matmul_forward({.out = A.proj, .inp = y.fch, .weight = w.fcproj_w, .bias = w.fcproj_b});
  if (l + 1 < L) {
    Layer& nw = layers_[size_t(l + 1)];
    Acts::PerLayer& ny = A.l[size_t(l + 1)];
    ops_.residual_layernorm_forward(y.res3, ny.ln1, ny.ln1_mean, ny.ln1_rstd, y.res2, A.proj, nw.ln1_w, nw.ln1_b);
  } else {
    ops_.residual_layernorm_forward(y.res3, A.lnf, A.lnf_mean, A.lnf_rstd, y.res2, A.proj, ends_->lnf_w, ends_->lnf_b);
  }
}

void GPT2::attention_forward(int l) {
  Acts::PerLayer& y = acts_->l[size_t(l)];
  AttentionForward att;
  att.out = y.atty; att.lse = y.lse; att.qkv = y.qkv; att.probs = y.probs;
  att.B = B_; att.T = T_; att.H = cfg_.n_head; att.D = cfg_.n_embd / cfg_.n_head;
  att.causal = true; att.algo = opts_.attention;
  ops_.attention_forward(att);
}

void GPT2::recompute(int l) {
  const RecomputePolicy& rc = opts_.recompute;
  if (rc.block) {
    block_forward(l, /*recompute=*/true);
    return;
  }
  Layer& w = layers_[size_t(l)];
  Acts::PerLayer& y = acts_->l[size_t(l)];
  const Tensor& res_in = l == 0 ? acts_->encoded : acts_->l[size_t(l - 1)].res3;
  if (rc.ln) {  // the kept statistics are rewritten with the same values
    ops_.layernorm_forward(y.ln1, y.ln1_mean, y.ln1_rstd, res_in, w.ln1_w, w.ln1_b);
    ops_.layernorm_forward(y.ln2, y.ln2_mean, y.ln2_rstd, y.res2, w.ln2_w, w.ln2_b);
  }
  if (rc.attn) attention_forward(l);
  if (rc.gelu) ops_.gelu_forward(y.fch, y.fch_pre);
}

void GPT2::head_chunk(int64_t row0, int64_t row1, float dloss) {
  Acts& A = *acts_;
  const Tensor& wte = ends_->wte;
  Tensor logits = A.logits.rows(0, row1 - row0);
  Tensor lnf = A.lnf.rows(row0, row1);
  ops_.matmul_forward({.out = logits, .inp = lnf, .weight = wte});
  ops_.softmax_cross_entropy(A.losses.rows(row0, row1), logits, A.targets.rows(row0, row1),
                             cfg_.vocab_size, dloss);
  if (dloss != 0.0f) {
    // dlnf rows (overwritten) and dwte (+=) from this chunk's dlogits; dln is free
    // until the last layer's backward, so it holds dlnf.
    ops_.matmul_backward({.dinp = A.dln.rows(row0, row1), .dweight = ends_->d_wte, .dout = logits,
                          .inp = lnf, .weight = wte});
  }
}

void GPT2::backward() {
  FG_ASSERT(opts_.gradients, "backward() on a model built without gradients");
  Acts& A = *acts_;
  const int B = B_, T = T_, C = cfg_.n_embd, H = cfg_.n_head, D = C / H, L = cfg_.n_layer;
  // dres accumulates the gradient of the residual stream as we walk back.
  ops_.memset_zero(A.dres);
  ops_.layernorm_backward(A.dres, ends_->d_lnf_w, ends_->d_lnf_b, A.dln, A.l[size_t(L - 1)].res3,
                          ends_->lnf_w, A.lnf_mean, A.lnf_rstd);
  if (grads_ready_) grads_ready_(L);
  for (int l = L - 1; l >= 0; --l) {
    recompute(l);
    Layer& w = layers_[size_t(l)];
    Acts::PerLayer& y = A.l[size_t(l)];
    const Tensor& res_in = l == 0 ? A.encoded : A.l[size_t(l - 1)].res3;
    // res3 = res2 + c_proj(gelu(c_fc(ln2))): dres is d(res3) = d(mlp out), and flows on to d(res2).
    ops_.matmul_backward({.dinp = A.dfch, .dweight = w.d_fcproj_w, .dbias = w.d_fcproj_b, .dout = A.dres,
                          .inp = y.fch, .weight = w.fcproj_w, .dinp_gelu_pre = y.fch_pre});
    ops_.matmul_backward({.dinp = A.dln, .dweight = w.d_fc_w, .dbias = w.d_fc_b, .dout = A.dfch,
                          .inp = y.ln2, .weight = w.fc_w});
    ops_.layernorm_backward(A.dres, w.d_ln2_w, w.d_ln2_b, A.dln, y.res2, w.ln2_w, y.ln2_mean, y.ln2_rstd);
    // res2 = res_in + c_proj(attn(c_attn(ln1))): dres is now d(res2).
    ops_.matmul_backward({.dinp = A.datty, .dweight = w.d_attproj_w, .dbias = w.d_attproj_b, .dout = A.dres,
                          .inp = y.atty, .weight = w.attproj_w});
    AttentionBackward att;
    att.dqkv = A.dqkv; att.dout = A.datty; att.qkv = y.qkv; att.out = y.atty; att.lse = y.lse;
    att.delta = A.delta; att.probs = y.probs;
    att.B = B; att.T = T; att.H = H; att.D = D; att.causal = true; att.algo = opts_.attention;
    ops_.attention_backward(att);
    // dq, dk were taken w.r.t. the rotated q, k: rotate them back.
    if (cfg_.position == PositionEncoding::rope) ops_.rope(A.dqkv, T, H, /*inverse=*/true, /*pos0=*/0);
    ops_.matmul_backward({.dinp = A.dln, .dweight = w.d_qkv_w, .dbias = w.d_qkv_b, .dout = A.dqkv,
                          .inp = y.ln1, .weight = w.qkv_w});
    ops_.layernorm_backward(A.dres, w.d_ln1_w, w.d_ln1_b, A.dln, res_in, w.ln1_w, y.ln1_mean, y.ln1_rstd);
    if (grads_ready_) grads_ready_(l);
  }
  ops_.embedding_backward(ends_->d_wte, ends_->d_wpe, A.dres, A.tokens);
  if (grads_ready_) grads_ready_(-1);
}

void GPT2::logits_to_host(float* out) {
  Acts& A = *acts_;
  const int64_t BT = int64_t(B_) * T_, Vp = cfg_.padded_vocab, chunk = A.logits.shape[0];
  const Tensor& wte = ends_->wte;
  for (int64_t r = 0; r < BT; r += chunk) {
    int64_t r1 = std::min(BT, r + chunk);
    Tensor logits = A.logits.rows(0, r1 - r);
    ops_.matmul_forward({.out = logits, .inp = A.lnf.rows(r, r1), .weight = wte});
    std::vector<double> v = host_doubles(ops_, logits);
    for (size_t i = 0; i < v.size(); ++i) out[size_t(r * Vp) + i] = float(v[i]);
  }
}

double GPT2::flops_per_token() const {
  // 6 FLOPs per parameter per token (forward 2, backward 4), embeddings' lookups
  // excluded but the tied LM head included; plus attention: QKᵀ and PV, forward
  // 2·2·T·C per token per layer (causal halves it), backward twice that.
  const double C = cfg_.n_embd, L = cfg_.n_layer, T = T_;
  double n = 0;
  for (const auto& p : param_list_) if (p.name != "wpe") n += double(p.numel());
  double attn = L * 2.0 * 2.0 * T * C * 0.5 * 3.0;
  return 6.0 * n + attn;
}

Tensor GPT2::param(const ParamInfo& p) const { return slice_as(params_, p); }

}  // namespace flashgpt
