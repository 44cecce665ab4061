#include "optim/adamw.h"
#include <cmath>
#include <vector>

namespace flashgpt {

static Tensor slice(const Tensor& flat, size_t offset, int64_t n) {
  Tensor t = flat;
  t.data = static_cast<char*>(flat.data) + offset * dtype_size(flat.dtype);
  t.shape[0] = n;
  return t;
}

AdamW::AdamW(GPT2& model, const AdamWConfig& cfg) : model_(model), cfg_(cfg) {
  Ops& ops = model.ops();
  const int64_t n = int64_t(model.num_params());
  // Optimizer state is fp32, except in fp64 runs (gradient checks) where it is fp64.
  const DType sd = model.dtype() == DType::f64 ? DType::f64 : DType::f32;
  m_mem_ = ops.alloc(size_t(n) * dtype_size(sd));
  v_mem_ = ops.alloc(size_t(n) * dtype_size(sd));
  m_ = Tensor(m_mem_, sd, ops.device(), {n});
  v_ = Tensor(v_mem_, sd, ops.device(), {n});
  ops.memset_zero(m_);
  ops.memset_zero(v_);
  if (model.dtype() == DType::bf16) {  // master copy of the bf16 weights
    master_mem_ = ops.alloc(size_t(n) * 4);
    master_ = Tensor(master_mem_, DType::f32, ops.device(), {n});
    ops.cast(master_, model.params());
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

double AdamW::grad_norm() {
  Ops& ops = model_.ops();
  ops.memset_zero(norm_);
  ops.sum_squares(norm_, model_.grads());
  double ss = 0;
  if (norm_.dtype == DType::f64) ops.to_host(&ss, norm_);
  else { float f; ops.to_host(&f, norm_); ss = f; }
  return std::sqrt(ss);
}

void AdamW::step(double lr, double norm, uint32_t seed) {
  Ops& ops = model_.ops();
  ++step_;
  const double scale = (cfg_.grad_clip > 0 && norm > cfg_.grad_clip) ? cfg_.grad_clip / norm : 1.0;
  for (const ParamInfo& p : model_.param_list()) {
    AdamWArgs a;
    const int64_t n = p.numel();
    a.param = slice(model_.params(), p.offset, n);
    a.grad = slice(model_.grads(), p.offset, n);
    a.m = slice(m_, p.offset, n);
    a.v = slice(v_, p.offset, n);
    if (master_.defined()) a.master = slice(master_, p.offset, n);
    a.lr = float(lr);
    a.beta1 = float(cfg_.beta1);
    a.beta2 = float(cfg_.beta2);
    a.eps = float(cfg_.eps);
    a.weight_decay = p.decay ? float(cfg_.weight_decay) : 0.0f;
    a.grad_scale = float(scale);
    a.step = step_;
    a.seed = seed + uint32_t(p.offset);
    ops.adamw_update(a);
  }
}

}  // namespace flashgpt
