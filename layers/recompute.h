// Recompute policies (config key train.recompute): which activations the backward pass
// computes again instead of keeping them from the forward pass. Names, combined with '+':
//   none   keep everything the backward needs (the default)
//   gelu   the MLP's GELU output, from its kept pre-activation (one elementwise pass)
//   ln     the outputs of ln_1 and ln_2, from their kept inputs (the residual stream)
//   attn   the attention output O and its logsumexp, by running the attention forward
//          again from the kept QKV
//   block  everything of a block but its input: the block's forward runs again at the
//          start of its backward (includes the three above, so it stands alone)
// Each recomputed tensor keeps one buffer for all layers instead of one per layer.
// Gradients are bitwise those of `none` in fp32 and, on CUDA, with
// FLASHGPT_DETERMINISTIC=1 (tests/test_recompute.cpp, tests/cuda/test_cuda_model.cpp).
#pragma once
#include <string>
#include "src/errors.h"

namespace flashgpt {

struct RecomputePolicy {
  bool gelu = false, ln = false, attn = false, block = false;

  bool none() const { return !gelu && !ln && !attn && !block; }

  // "none", "gelu", "gelu+ln", "block", ...; InputError names the bad part.
  static RecomputePolicy parse(const std::string& text) {
    RecomputePolicy p;
    if (text == "none") return p;
    size_t start = 0;
    while (true) {
      const size_t plus = text.find('+', start);
      const std::string part = text.substr(start, plus == std::string::npos ? plus : plus - start);
      bool* flag = part == "gelu" ? &p.gelu : part == "ln" ? &p.ln : part == "attn" ? &p.attn
                 : part == "block" ? &p.block : nullptr;
      if (!flag)
        fail_input("recompute policy '", text, "': unknown part '", part,
                   "' (none, or gelu, ln, attn joined with '+', or block)");
      if (*flag) fail_input("recompute policy '", text, "' names '", part, "' twice");
      *flag = true;
      if (plus == std::string::npos) break;
      start = plus + 1;
    }
    if (p.block && (p.gelu || p.ln || p.attn))
      fail_input("recompute policy '", text, "': block already recomputes everything; use it alone");
    return p;
  }

  // The canonical name: parts in the order gelu, ln, attn.
  std::string name() const {
    if (block) return "block";
    std::string s;
    for (auto [on, part] : {std::pair{gelu, "gelu"}, {ln, "ln"}, {attn, "attn"}})
      if (on) s += (s.empty() ? "" : "+") + std::string(part);
    return s.empty() ? "none" : s;
  }
};

}  // namespace flashgpt
