// AdamW with fp32 master weights (when the model's weights are bf16), decoupled weight
// decay on 2-D weights only, and clipping by the global gradient norm.
//
// The optimizer updates, and keeps state (m, v, master) for, a list of *owned* ranges
// of the parameter arena: the whole arena by default; with ZeRO-1 each rank owns one
// shard of every layer (train/data_parallel.h decides which). The state is compact:
// the owned ranges one after another.
#pragma once
#include <vector>
#include "layers/gpt2.h"

namespace flashgpt {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // 0: no clipping
};

struct Range {  // [begin, end) elements of the parameter arena
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

class AdamW {
 public:
  // owned: ascending, disjoint ranges of the arena; empty = the whole arena.
  AdamW(GPT2& model, const AdamWConfig& cfg, std::vector<Range> owned = {});
  ~AdamW();
  // Σ g² over the owned ranges (deterministic): this rank's part of the global norm².
  double grad_sum_squares();
  // Global L2 norm of the gradients when this optimizer owns the whole arena.
  double grad_norm();
  // One update of the owned ranges with learning rate lr; clips by cfg.grad_clip using
  // `norm`, the global gradient norm. Increments steps_done(). Stochastic rounding of
  // bf16 weights hashes (seed, packed parameter index), so the result does not depend
  // on how the arena is split between ranks.
  void step(double lr, double norm, uint32_t seed);
  int steps_done() const { return step_; }
  void set_steps_done(int s) { step_ = s; }
  // State tensors (compact over the owned ranges): m, v, and master (undefined if not used).
  Tensor m() const { return m_; }
  Tensor v() const { return v_; }
  Tensor master() const { return master_; }
  const std::vector<Range>& owned() const { return owned_; }
  // Where owned()[i] starts in the compact state tensors.
  size_t state_offset(size_t i) const { return state_offset_[i]; }

 private:
  GPT2& model_;
  AdamWConfig cfg_;
  std::vector<Range> owned_;
  std::vector<size_t> state_offset_;
  // Per owned range, its parameters as AdamW segments (weight decay, packed index; the
  // arena's padding a segment without decay): fixed by the ranges and the model, so made
  // once.
  std::vector<std::vector<AdamWSegment>> segments_;
  Tensor m_, v_, master_, norm_;
  void *m_mem_ = nullptr, *v_mem_ = nullptr, *master_mem_ = nullptr, *norm_mem_ = nullptr;
  int step_ = 0;
};

}  // namespace flashgpt
