#include "optim/adamw.h"
#include <algorithm>
#include <cmath>
#include <vector>
#include "src/errors.h"

namespace flashgpt {

AdamW::AdamW(GPT2& model, const AdamWConfig& cfg, std::vector<Range> owned)
    : model_(model), cfg_(cfg), owned_(std::move(owned)) {
  Ops& ops = model.ops();
  if (owned_.empty()) owned_.push_back({0, model.num_params()});
  size_t n = 0;
  for (size_t i = 0; i < owned_.size(); ++i) {
    const Range& r = owned_[i];
    FG_ASSERT(r.begin < r.end && r.end <= model.num_params() && (i == 0 || owned_[i - 1].end <= r.begin),
              "owned ranges must be ascending, disjoint and inside the arena");
    state_offset_.push_back(n);
    n += r.size();
    // Each parameter's part inside the range: a segment with its own weight decay and
    // packed index; the padding between parameters a segment without decay (its grads and
    // state are zero, so it stays as it is).
    std::vector<AdamWSegment>& segs = segments_.emplace_back();
    size_t at = r.begin;  // first element not yet in a segment
    for (const ParamInfo& p : model.param_list()) {
      const size_t b = std::max(r.begin, p.offset), e = std::min(r.end, p.offset + size_t(p.numel()));
      if (b >= e) continue;
      if (b > at) segs.push_back({int64_t(at - r.begin), false, 0});  // padding
      segs.push_back({int64_t(b - r.begin), p.decay, p.packed + (b - p.offset)});
      at = e;
    }
    if (at < r.end) segs.push_back({int64_t(at - r.begin), false, 0});
  }
  // Optimizer state is fp32, except in fp64 runs (gradient checks) where it is fp64.
  const DType sd = model.dtype() == DType::f64 ? DType::f64 : DType::f32;
  m_mem_ = ops.alloc(n * dtype_size(sd));
  v_mem_ = ops.alloc(n * dtype_size(sd));
  m_ = Tensor(m_mem_, sd, ops.device(), {int64_t(n)});
  v_ = Tensor(v_mem_, sd, ops.device(), {int64_t(n)});
  ops.memset_zero(m_);
  ops.memset_zero(v_);
  if (model.dtype() == DType::bf16) {  // master copy of the bf16 weights
    master_mem_ = ops.alloc(n * 4);
    master_ = Tensor(master_mem_, DType::f32, ops.device(), {int64_t(n)});
    for (size_t i = 0; i < owned_.size(); ++i)
      ops.cast(master_.rows(int64_t(state_offset_[i]), int64_t(state_offset_[i] + owned_[i].size())),
               model.params().rows(int64_t(owned_[i].begin), int64_t(owned_[i].end)));
  }
  const DType nd = GradDType(model.dtype());
  norm_mem_ = ops.alloc(dtype_size(nd));
  norm_ = Tensor(norm_mem_, nd, ops.device(), {1});
}

AdamW::~AdamW() {
  Ops& ops = model_.ops();
  for (void* p : {m_mem_, v_mem_, master_mem_, norm_mem_})
    if (p) ops.free(p);
}

double AdamW::grad_sum_squares() {
  Ops& ops = model_.ops();
  ops.memset_zero(norm_);
  for (const Range& r : owned_) ops.sum_squares(norm_, model_.grads().rows(int64_t(r.begin), int64_t(r.end)));
  double ss = 0;
  if (norm_.dtype == DType::f64) ops.to_host(&ss, norm_);
  else { float f; ops.to_host(&f, norm_); ss = f; }
  return ss;
}

double AdamW::grad_norm() {
  FG_ASSERT(owned_.size() == 1 && owned_[0].size() == model_.num_params(),
            "grad_norm() needs the whole arena; a shard's part is grad_sum_squares()");
  return std::sqrt(grad_sum_squares());
}

void AdamW::step(double lr, double norm, uint32_t seed) {
  Ops& ops = model_.ops();
  ++step_;
  const double scale = (cfg_.grad_clip > 0 && norm > cfg_.grad_clip) ? cfg_.grad_clip / norm : 1.0;
  for (size_t i = 0; i < owned_.size(); ++i) {
    const Range& r = owned_[i];
    // One call for the whole range, its parameters as segments.
    AdamWArgs a;
    const int64_t s0 = int64_t(state_offset_[i]), s1 = s0 + int64_t(r.size());
    a.param = model_.params().rows(int64_t(r.begin), int64_t(r.end));
    a.grad = model_.grads().rows(int64_t(r.begin), int64_t(r.end));
    a.m = m_.rows(s0, s1);
    a.v = v_.rows(s0, s1);
    if (master_.defined()) a.master = master_.rows(s0, s1);
    a.lr = float(lr);
    a.beta1 = float(cfg_.beta1);
    a.beta2 = float(cfg_.beta2);
    a.eps = float(cfg_.eps);
    a.weight_decay = float(cfg_.weight_decay);
    a.grad_scale = float(scale);
    a.step = step_;
    a.seed = seed;
    a.segments = segments_[i];
    ops.adamw_update(a);
  }
}

}  // namespace flashgpt
