// Decoding with a KV cache on the CPU: the decode attention op against full attention,
// greedy generation with the cache against argmax over a full forward recomputed at
// every step (fp64, a few hundred tokens), batch independence, and the sampler.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>
#include "layers/gpt2.h"
#include "layers/gpt2_infer.h"
#include "tests/greedy.h"
#include "tests/testing.h"
#include "train/sample.h"

namespace flashgpt {
namespace {

using test::HostTensor;

// Attention of the last token against all T positions (decode) equals the last row of
// causal attention over the whole sequence; the cache is larger than T and written in
// two parts (a "prompt" and then one token at a time).
TEST(AttentionDecode, MatchesLastRowOfFullAttention) {
  auto ops = make_cpu_ops();
  std::mt19937_64 rng = test::test_rng();
  for (int T : {1, 2, 17, 64}) {
    const int B = 3, H = 2, D = 8, Tmax = T + 5, HD = H * D;
    HostTensor<double> qkv({B, T, 3 * HD}), out({B, T, HD}), lse({B, H, T});
    test::fill_uniform(qkv, rng);
    AttentionForward f;
    f.out = out; f.lse = lse; f.qkv = qkv; f.B = B; f.T = T; f.H = H; f.D = D; f.causal = true;
    ops->attention_forward(f);

    HostTensor<double> kc({B, H, Tmax, D}), vc({B, H, Tmax, D});
    const int prompt = std::max(1, T / 2);
    HostTensor<double> first({B, prompt, 3 * HD});
    for (int b = 0; b < B; ++b)
      std::copy_n(&qkv[int64_t(b) * T * 3 * HD], prompt * 3 * HD, &first[int64_t(b) * prompt * 3 * HD]);
    ops->kv_cache_write({.k_cache = kc, .v_cache = vc, .qkv = first, .B = B, .n = prompt, .H = H, .D = D, .pos = 0});
    HostTensor<double> last({B, 3 * HD}), y({B, HD}), l({B, H});
    for (int t = prompt; t < T; ++t) {
      for (int b = 0; b < B; ++b) std::copy_n(&qkv[(int64_t(b) * T + t) * 3 * HD], 3 * HD, &last[int64_t(b) * 3 * HD]);
      ops->kv_cache_write({.k_cache = kc, .v_cache = vc, .qkv = last, .B = B, .n = 1, .H = H, .D = D, .pos = t});
    }
    for (int b = 0; b < B; ++b) std::copy_n(&qkv[(int64_t(b) * T + T - 1) * 3 * HD], 3 * HD, &last[int64_t(b) * 3 * HD]);
    ops->attention_decode({.out = y, .lse = l, .qkv = last, .k_cache = kc, .v_cache = vc, .B = B, .H = H, .D = D, .T = T});

    std::vector<double> want_out, want_lse;
    for (int b = 0; b < B; ++b) {
      for (int i = 0; i < HD; ++i) want_out.push_back(out[(int64_t(b) * T + T - 1) * HD + i]);
      for (int h = 0; h < H; ++h) want_lse.push_back(lse[(int64_t(b) * H + h) * T + T - 1]);
    }
    // fp64, the same sums in another order: agreement to a few ulps of O(1) values.
    test::expect_all_close(y.vec(), want_out, 1e-13, 1e-13, "decode out, T=" + std::to_string(T));
    test::expect_all_close(l.vec(), want_lse, 1e-13, 1e-13, "decode lse, T=" + std::to_string(T));
  }
}

// The CPU matmul's few-rows path (decoding) gives the rows the many-rows path gives,
// bit for bit (each output summed in the same order), bias and GELU included.
TEST(AttentionDecode, FewRowsMatmulEqualsManyRows) {
  auto ops = make_cpu_ops();
  std::mt19937_64 rng = test::test_rng();
  const int64_t C = 37, OC = 70, N = 40;
  HostTensor<double> inp({N, C}), w({OC, C}), b({OC}), out({N, OC}), pre({N, OC});
  test::fill_uniform(inp, rng), test::fill_uniform(w, rng), test::fill_uniform(b, rng);
  ops->matmul_forward({.out = out, .inp = inp, .weight = w, .bias = b, .gelu = true, .pre_gelu = pre});
  for (int64_t n : {1, 3, 7}) {
    HostTensor<double> few_out({n, OC}), few_pre({n, OC});
    Tensor few_inp = Tensor(inp).rows(0, n);
    ops->matmul_forward({.out = few_out, .inp = few_inp, .weight = w, .bias = b, .gelu = true, .pre_gelu = few_pre});
    for (int64_t i = 0; i < n * OC; ++i) {
      ASSERT_EQ(few_out[i], out[i]) << n << " rows, element " << i;
      ASSERT_EQ(few_pre[i], pre[i]) << n << " rows, element " << i;
    }
  }
}

// L, H, C, V, Vp, max T; learned positions (GPT-2's table) or rotary ones.
ModelConfig small_model(PositionEncoding pos = PositionEncoding::learned) { return {2, 2, 16, 67, 128, 320, pos}; }
constexpr PositionEncoding kPositions[] = {PositionEncoding::learned, PositionEncoding::rope};

// Random weights larger than GPT-2's init, so logits spread and argmax is well defined.
void randomise(GPT2& m, uint64_t seed) {
  m.init_random(seed);
  std::vector<double> p(m.num_params());
  m.ops().to_host(p.data(), m.params());
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<double> n(0, 1.0);
  for (const auto& info : m.param_list()) {
    const int64_t limit = info.name == "wte" ? int64_t(m.config().vocab_size) * m.config().n_embd : info.numel();
    for (int64_t i = 0; i < limit; ++i) p[info.offset + size_t(i)] += n(rng);
  }
  m.ops().from_host(m.params(), p.data());
}

int argmax(const double* x, int n) { return int(std::max_element(x, x + n) - x); }

// Greedy decoding with the KV cache gives exactly the tokens of argmax over a full
// forward recomputed at every step, for 300 tokens (fp64 on the CPU), with learned and
// with rotary positions (whose cache holds k rotated by its position).
TEST(Generate, GreedyWithCacheEqualsFullRecompute) {
  auto ops = make_cpu_ops();
  const int prompt_len = 5, new_tokens = 300;
  for (PositionEncoding pos : kPositions) {
    SCOPED_TRACE(position_name(pos));
    GPT2 model(small_model(pos), *ops, DType::f64, 1, prompt_len + new_tokens);
    randomise(model, 3);
    test::expect_same_greedy(test::greedy_both_ways(model, {1, 7, 42, 3, 66}, new_tokens));
  }
}

// The logits of the cached path equal those of the full forward (fp64: to rounding),
// and every sequence of a batch decodes as it would alone.
TEST(Generate, BatchedDecodingMatchesSingleSequences) {
  for (PositionEncoding pos : kPositions) {
    SCOPED_TRACE(position_name(pos));
    auto ops = make_cpu_ops();
    const ModelConfig cfg = small_model(pos);
    GPT2 model(cfg, *ops, DType::f64, 1, 1);
    randomise(model, 5);
    const int P = 4, steps = 40, V = cfg.vocab_size;
    const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7, 8}, {60, 2, 2, 9}, {0, 1, 2, 3}};
    const int B = int(prompts.size());
    auto run = [&](const std::vector<std::vector<int32_t>>& ps) {
      const int n = int(ps.size());
      GPT2Decoder dec(model, n, P + steps);
      std::vector<int32_t> batch;
      for (const auto& p : ps) batch.insert(batch.end(), p.begin(), p.end());
      std::vector<double> logits, all;
      dec.step(batch.data(), P, logits);
      std::vector<int32_t> next(static_cast<size_t>(n));
      for (int s = 0; s < steps; ++s) {
        all.insert(all.end(), logits.begin(), logits.end());
        for (int b = 0; b < n; ++b) next[size_t(b)] = argmax(logits.data() + size_t(b) * size_t(V), V);
        dec.step(next.data(), 1, logits);
      }
      return all;  // (steps, n, V)
    };
    const std::vector<double> together = run(prompts);
    for (int b = 0; b < B; ++b) {
      const std::vector<double> alone = run({prompts[size_t(b)]});
      std::vector<double> mine;
      for (int s = 0; s < steps; ++s)
        mine.insert(mine.end(), together.begin() + (int64_t(s) * B + b) * V, together.begin() + (int64_t(s) * B + b + 1) * V);
      test::expect_all_close(mine, alone, 1e-12, 1e-12, "sequence " + std::to_string(b) + " in a batch vs alone");
    }
  }
}

TEST(Sampler, GreedyTopKAndTopPAndDeterminism) {
  const std::vector<double> logits = {0.5, 2.0, -1.0, 2.0, 1.9};
  SampleRng rng(1);
  EXPECT_EQ(sample_token(logits.data(), 5, {0.0, 0, 1.0}, rng), 1);  // ties: the lower id
  EXPECT_EQ(sample_token(logits.data(), 5, {1.0, 1, 1.0}, rng), 1);  // top-1 is greedy
  for (int i = 0; i < 100; ++i) {                                    // top-3: never ids 0, 2
    const int t = sample_token(logits.data(), 5, {1.0, 3, 1.0}, rng);
    EXPECT_TRUE(t == 1 || t == 3 || t == 4) << t;
  }
  for (int i = 0; i < 100; ++i)  // a tiny nucleus holds only the most likely token
    EXPECT_EQ(sample_token(logits.data(), 5, {1.0, 0, 1e-6}, rng), 1);
  SampleRng a(42), b(42);
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(sample_token(logits.data(), 5, {0.8, 0, 0.9}, a), sample_token(logits.data(), 5, {0.8, 0, 0.9}, b));
}

// Frequencies of 200k draws at temperature 0.7 match softmax(logits / 0.7) within 5
// standard deviations of a binomial count, for every token.
TEST(Sampler, DrawsFollowTheTemperedSoftmax) {
  const std::vector<double> logits = {0.5, 2.0, -1.0, 1.0, 1.9};
  const double temp = 0.7;
  const int n = 200000;
  SampleRng rng(7);
  std::vector<int> count(logits.size(), 0);
  for (int i = 0; i < n; ++i) ++count[size_t(sample_token(logits.data(), 5, {temp, 0, 1.0}, rng))];
  double z = 0;
  for (double l : logits) z += std::exp(l / temp);
  for (size_t i = 0; i < logits.size(); ++i) {
    const double p = std::exp(logits[i] / temp) / z;
    EXPECT_NEAR(count[i], n * p, 5 * std::sqrt(n * p * (1 - p))) << "token " << i;
  }
}

}  // namespace
}  // namespace flashgpt
