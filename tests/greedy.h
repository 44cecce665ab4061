// Greedy decoding two ways, for the generation tests on the CPU (test_decode.cpp) and
// the GPU (cuda/test_flash_decode.cpp): with the KV cache (GPT2Decoder), and by the
// training forward over the whole sequence so far (positions after it padded; causal
// attention makes them irrelevant), argmax of its last row, at every step.
#pragma once
#include <gtest/gtest.h>
#include <algorithm>
#include <functional>
#include <vector>
#include "layers/gpt2.h"
#include "layers/gpt2_infer.h"

namespace flashgpt::test {

struct GreedyRuns {
  std::vector<int32_t> cached, recomputed;
  std::vector<float> top2_gap;  // per new token of `recomputed`: its logit minus the runner-up's
};

// model: sized for one sequence of prompt.size() + steps positions.
inline GreedyRuns greedy_both_ways(GPT2& model, const std::vector<int32_t>& prompt, int steps) {
  const int P = int(prompt.size()), Tfull = P + steps, V = model.config().vocab_size;
  const size_t Vp = size_t(model.config().padded_vocab);
  GreedyRuns r{prompt, prompt, {}};
  GPT2Decoder dec(model, 1, Tfull);
  std::vector<double> logits;
  dec.step(prompt.data(), P, logits);
  for (int t = 0; t < steps; ++t) {
    r.cached.push_back(int32_t(std::max_element(logits.begin(), logits.begin() + V) - logits.begin()));
    if (t + 1 < steps) dec.step(&r.cached.back(), 1, logits);
  }
  std::vector<int32_t> in(size_t(Tfull), 0), tg(size_t(Tfull), -1);
  std::vector<float> rows(size_t(Tfull) * Vp);
  for (int t = 0; t < steps; ++t) {
    std::copy(r.recomputed.begin(), r.recomputed.end(), in.begin());
    model.set_batch(in.data(), tg.data());
    model.forward(0.0f);
    model.logits_to_host(rows.data());
    std::vector<float> row(rows.begin() + std::ptrdiff_t((r.recomputed.size() - 1) * Vp),
                           rows.begin() + std::ptrdiff_t((r.recomputed.size() - 1) * Vp + size_t(V)));
    r.recomputed.push_back(int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
    r.top2_gap.push_back(row[0] - row[1]);
  }
  return r;
}

// The same tokens both ways, and not a constant sequence (which would prove little).
inline void expect_same_greedy(const GreedyRuns& r) {
  ASSERT_EQ(r.cached.size(), r.recomputed.size());
  const size_t P = r.cached.size() - r.top2_gap.size();
  for (size_t i = P; i < r.cached.size(); ++i)
    ASSERT_EQ(r.cached[i], r.recomputed[i]) << "token " << i << ": the full forward's top-2 logits differ by "
                                            << r.top2_gap[i - P];
  int distinct = 0;
  for (size_t i = P; i < r.recomputed.size(); ++i) distinct += r.recomputed[i] != r.recomputed[i - 1];
  EXPECT_GT(distinct, 20) << "the greedy sequence should not be a constant";
}

}  // namespace flashgpt::test
