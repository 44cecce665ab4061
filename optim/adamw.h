// AdamW with fp32 master weights (when the model's weights are bf16), decoupled weight
// decay on 2-D weights only, and clipping by the global gradient norm.
#pragma once
#include <vector>
#include "layers/gpt2.h"

namespace flashgpt {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // 0: no clipping
};

class AdamW {
 public:
  AdamW(GPT2& model, const AdamWConfig& cfg);
  ~AdamW();
  // Global L2 norm of the model's gradients (deterministic).
  double grad_norm();
  // One update with learning rate lr; clips by cfg.grad_clip using `norm`
  // (from grad_norm()). Increments step().
  void step(double lr, double norm, uint32_t seed);
  int steps_done() const { return step_; }
  void set_steps_done(int s) { step_ = s; }
  // State tensors for checkpoints: m, v, and master (undefined if not used).
  Tensor m() const { return m_; }
  Tensor v() const { return v_; }
  Tensor master() const { return master_; }

 private:
  GPT2& model_;
  AdamWConfig cfg_;
  Tensor m_, v_, master_, norm_;
  void *m_mem_ = nullptr, *v_mem_ = nullptr, *master_mem_ = nullptr, *norm_mem_ = nullptr;
  int step_ = 0;
};

}  // namespace flashgpt
