// GPT-2 124M's config (configs/gpt2-124m.yaml) at a given micro-batch, context length,
// recompute policy, attention and positions: the points of the memory-plan tests on the
// CPU (test_memory.cpp) and on the GPU (cuda/test_cuda_memory.cpp).
#pragma once
#include <algorithm>
#include <string>
#include "src/config.h"

namespace flashgpt::test {

inline const std::string kGpt2Config = std::string(FLASHGPT_SOURCE_DIR) + "/configs/gpt2-124m.yaml";

inline Config gpt2_124m(int B, int T, const std::string& recompute, const std::string& attention = "flash",
                        const std::string& position = "learned") {
  Config c = load_config(kGpt2Config, {});
  c.train.batch_size = B;
  c.train.seq_len = T;
  c.model.max_seq_len = std::max(c.model.max_seq_len, T);
  c.train.recompute = recompute;
  c.model.attention = attention;
  c.model.position = position;
  validate_config(c);
  return c;
}

}  // namespace flashgpt::test
