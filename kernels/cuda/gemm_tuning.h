// The rule by which Matmul's in-place tuning (kernels/cuda/matmul.cu) picks a cuBLASLt
// algorithm from the timings of its candidates. Host-only, so the CPU tests check it.
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

namespace flashgpt::cuda {

// ms[c]: the timings (ms) of candidate c, in launch order. The first of each is not
// counted (it may include loading the kernel). Once every candidate has at least
// 1 + runs timings: the candidate with the lowest median of the others (ties to the lower
// index: cuBLASLt ranks its candidates best first); before that, and with no candidates,
// -1.
inline int fastest_candidate(const std::vector<std::vector<float>>& ms, int runs) {
  int best = -1;
  float best_ms = 0.f;
  for (size_t c = 0; c < ms.size(); ++c) {
    if (ms[c].size() < size_t(1 + runs)) return -1;
    std::vector<float> v(ms[c].begin() + 1, ms[c].end());
    std::sort(v.begin(), v.end());
    const size_t h = v.size() / 2;
    const float median = v.size() % 2 ? v[h] : 0.5f * (v[h - 1] + v[h]);
    if (best < 0 || median < best_ms) best = int(c), best_ms = median;
  }
  return best;
}

}  // namespace flashgpt::cuda
