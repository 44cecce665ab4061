// How much dQ moves with the bf16 rounding of the attention output O, on the CPU.
//
// The backward computes D_i = rowsum(dO∘O) from O as stored (bf16), and
// dQ_i = scale·Σ_j P_ij (dP_ij − D_i) K_j. When attention is sharp and the keys are large,
// the sum nearly cancels and dQ follows D_i's rounding error. This program builds one
// causal head (T = 1023, keys scaled by 1 + ramp·j/T as tests/cuda/test_flash_attention.cpp's
// ramped_problem does, everything else N(0, 1), all rounded to bf16) and computes dQ in
// fp64 from three O's: exact; the naive reference's (P against the row's max, rounded to
// bf16, summed in fp32, O rounded to bf16); and a flash forward's (128-key tiles, a running
// max, fp32 sums; with `lazy`, the max moves only when a tile's max passes it by more than
// 2^8). It prints each O's effect on dQ (largest and rms difference from the exact O's dQ)
// and how far the flash O's dQ is from the naive O's.
//   g++ -O2 -I. -o /tmp/o_rounding scripts/o_rounding_sensitivity.cpp
//   /tmp/o_rounding RAMP D [lazy]          e.g. /tmp/o_rounding 10 64
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/bf16.h"

namespace {
float round_bf16(float x) { return flashgpt::bf16_to_float(flashgpt::float_to_bf16(x)); }
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4 || (argc == 4 && std::string(argv[3]) != "lazy")) {
    std::fprintf(stderr, "usage: %s RAMP D [lazy]   (D: 64 or 128)\n", argv[0]);
    return 2;
  }
  const float ramp = std::strtof(argv[1], nullptr);
  const int D = std::atoi(argv[2]), T = 1023, kTile = 128;
  const bool lazy = argc == 4;
  if (D != 64 && D != 128) {
    std::fprintf(stderr, "D must be 64 or 128, got %s\n", argv[2]);
    return 2;
  }
  std::mt19937 gen(12345);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> q(size_t(T) * D), k(q.size()), v(q.size()), dO(q.size());
  for (auto* a : {&q, &k, &v, &dO})
    for (auto& x : *a) x = round_bf16(normal(gen));
  for (int t = 0; t < T; ++t)
    for (int d = 0; d < D; ++d) k[size_t(t) * D + d] = round_bf16(k[size_t(t) * D + d] * (1.f + ramp * t / T));

  const double scale = 1.0 / std::sqrt(double(D));
  const float log2e = 1.4426950408889634f;
  double max_dq = 0, max_naive = 0, max_flash = 0, max_apart = 0, ss_naive = 0, ss_flash = 0;
  for (int i = 0; i < T; ++i) {
    const int n = i + 1;  // causal
    const float* qi = &q[size_t(i) * D];
    const float* doi = &dO[size_t(i) * D];
    std::vector<double> s(n), P(n), dP(n), o_exact(D, 0.0);
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < n; ++j) {
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += double(qi[d]) * k[size_t(j) * D + d];
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    for (int j = 0; j < n; ++j) sum += std::exp(s[j] - mx);
    for (int j = 0; j < n; ++j) {
      P[j] = std::exp(s[j] - mx) / sum;
      for (int d = 0; d < D; ++d) o_exact[d] += P[j] * v[size_t(j) * D + d];
    }
    std::vector<float> o_naive(D), o_flash(D);
    {  // the naive reference's forward
      std::vector<float> acc(D, 0.f);
      float l = 0.f;
      for (int j = 0; j < n; ++j) {
        const float p = std::exp(float(s[j] - mx)), pr = round_bf16(p);
        l += p;
        for (int d = 0; d < D; ++d) acc[d] += pr * v[size_t(j) * D + d];
      }
      for (int d = 0; d < D; ++d) o_naive[d] = round_bf16(acc[d] / l);
    }
    {  // a flash forward's: key tiles, running max
      std::vector<float> acc(D, 0.f);
      float m = -INFINITY, l = 0.f;
      for (int j0 = 0; j0 < n; j0 += kTile) {
        const int j1 = std::min(n, j0 + kTile);
        float tm = m;
        for (int j = j0; j < j1; ++j) tm = std::max(tm, float(s[j]));
        if (lazy && m != -INFINITY && !((tm - m) * log2e > 8.f)) tm = m;
        const float alpha = m == -INFINITY ? 0.f : std::exp2((m - tm) * log2e);
        float tile_sum = 0.f;
        for (int d = 0; d < D; ++d) acc[d] *= alpha;
        for (int j = j0; j < j1; ++j) {
          const float p = std::exp2(float(s[j]) * log2e - tm * log2e);
          tile_sum += p;
          const float pr = round_bf16(p);
          for (int d = 0; d < D; ++d) acc[d] += pr * v[size_t(j) * D + d];
        }
        l = l * alpha + tile_sum;
        m = tm;
      }
      for (int d = 0; d < D; ++d) o_flash[d] = round_bf16(acc[d] / l);
    }
    double d_exact = 0, d_naive = 0, d_flash = 0;
    for (int d = 0; d < D; ++d) {
      d_exact += o_exact[d] * doi[d];
      d_naive += double(o_naive[d]) * doi[d];
      d_flash += double(o_flash[d]) * doi[d];
    }
    for (int j = 0; j < n; ++j) {
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += double(doi[d]) * v[size_t(j) * D + d];
      dP[j] = dot;
    }
    for (int d = 0; d < D; ++d) {
      double g_exact = 0, g_naive = 0, g_flash = 0;
      for (int j = 0; j < n; ++j) {
        const double kj = k[size_t(j) * D + d];
        g_exact += P[j] * (dP[j] - d_exact) * kj;
        g_naive += P[j] * (dP[j] - d_naive) * kj;
        g_flash += P[j] * (dP[j] - d_flash) * kj;
      }
      g_exact *= scale, g_naive *= scale, g_flash *= scale;
      max_dq = std::max(max_dq, std::fabs(g_exact));
      max_naive = std::max(max_naive, std::fabs(g_naive - g_exact));
      max_flash = std::max(max_flash, std::fabs(g_flash - g_exact));
      max_apart = std::max(max_apart, std::fabs(g_flash - g_naive));
      ss_naive += (g_naive - g_exact) * (g_naive - g_exact);
      ss_flash += (g_flash - g_exact) * (g_flash - g_exact);
    }
  }
  const double count = double(T) * D;
  std::printf("ramp %g, D %d, %s max: largest |dQ| %.4f\n", ramp, D, lazy ? "lazy" : "eager", max_dq);
  std::printf("  dQ moved by O's rounding: naive O largest %.5f rms %.6f; flash O largest %.5f rms %.6f\n", max_naive,
              std::sqrt(ss_naive / count), max_flash, std::sqrt(ss_flash / count));
  std::printf("  flash O's dQ against naive O's: largest %.5f\n", max_apart);
}
