// Learning-rate schedules: linear warmup from 0, then cosine / linear decay to
// lr·min_lr_frac at the last step, or constant.
#pragma once
#include <cmath>
#include <string>

namespace flashgpt {

struct LRSchedule {
  double lr = 0;
  int warmup_steps = 0;
  int total_steps = 1;
  double min_lr_frac = 0.1;
  std::string kind = "cosine";  // cosine | linear | constant

  // step is 0-based: the lr used for the (step+1)-th optimizer update.
  double at(int step) const {
    if (step < warmup_steps) return lr * double(step + 1) / double(warmup_steps);
    if (kind == "constant") return lr;
    const double min_lr = lr * min_lr_frac;
    const int decay_steps = total_steps - warmup_steps;
    if (decay_steps <= 1) return lr;
    const double progress = std::min(1.0, double(step - warmup_steps) / double(decay_steps - 1));
    if (kind == "linear") return lr + (min_lr - lr) * progress;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));  // cosine
  }
};

}  // namespace flashgpt
