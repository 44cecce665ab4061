// Recompute policies (layers/recompute.h) on the CPU: the loss and every gradient of
// each policy are bitwise those of `none` (fp32; both attention algorithms, both
// position encodings, gradients accumulated over two micro-batches with an evaluation
// forward in between, which overwrites every shared buffer); each policy keeps less;
// the memory plan of the model is what the model allocates. The names parse and print
// back.
#include <gtest/gtest.h>
#include <cstring>
#include <random>
#include <vector>
#include "layers/gpt2.h"
#include "testing.h"

namespace flashgpt {
namespace {

const char* kPolicies[] = {"gelu", "ln", "attn", "gelu+ln", "gelu+ln+attn", "block"};

using test::Batch;
using test::random_batch;

ModelConfig tiny(PositionEncoding pos) {
  ModelConfig c{3, 2, 16, 37, 64, 32};
  c.position = pos;
  return c;
}

struct Result {
  std::vector<double> losses;
  std::vector<uint32_t> grad_bits;  // the fp32 gradient arena, as bits
};

// Two micro-batches of gradient accumulation, an evaluation forward between them.
Result run(const ModelConfig& cfg, const ModelOptions& opts, int B, int T) {
  auto ops = make_cpu_ops();
  GPT2 m(cfg, *ops, DType::f32, B, T, opts);
  m.init_random(11);
  Result r;
  m.zero_grad();
  for (int step = 0; step < 2; ++step) {
    Batch b = random_batch(B, T, cfg.vocab_size, 100 + step);
    b.tg[3] = -1;  // an ignored target
    m.set_batch(b.in.data(), b.tg.data());
    r.losses.push_back(m.forward(1.0f / float(B * T)));
    m.backward();
    Batch e = random_batch(B, T, cfg.vocab_size, 200 + step);
    e.tg[3] = -1;
    m.set_batch(e.in.data(), e.tg.data());
    r.losses.push_back(m.forward(0.0f));
  }
  r.grad_bits.resize(size_t(m.grads().numel()));
  ops->to_host(r.grad_bits.data(), m.grads());
  return r;
}

TEST(Recompute, EveryPolicyGivesTheSameBitsAsNone) {
  const int B = 2, T = 13;
  for (PositionEncoding pos : {PositionEncoding::learned, PositionEncoding::rope})
    for (AttentionAlgo algo : {AttentionAlgo::flash, AttentionAlgo::naive}) {
      const ModelConfig cfg = tiny(pos);
      const Result ref = run(cfg, ModelOptions(algo), B, T);
      for (const char* name : kPolicies) {
        SCOPED_TRACE(cat(name, ", ", position_name(pos),
                         algo == AttentionAlgo::naive ? ", naive" : ", flash"));
        ModelOptions o(algo);
        o.recompute = RecomputePolicy::parse(name);
        const Result got = run(cfg, o, B, T);
        ASSERT_EQ(got.losses.size(), ref.losses.size());
        for (size_t i = 0; i < got.losses.size(); ++i) EXPECT_EQ(got.losses[i], ref.losses[i]) << "loss " << i;
        ASSERT_EQ(got.grad_bits.size(), ref.grad_bits.size());
        size_t differ = 0;
        for (size_t i = 0; i < got.grad_bits.size(); ++i) differ += got.grad_bits[i] != ref.grad_bits[i];
        EXPECT_EQ(differ, 0u) << "gradient elements whose bits differ from recompute=none";
      }
    }
}

// The deterministic option only moves the GELU out of the matmul epilogue, which on the
// CPU is the same computation: the same bits again.
TEST(Recompute, DeterministicOptionChangesNothingOnTheCpu) {
  ModelOptions o;
  o.deterministic = true;
  const ModelConfig cfg = tiny(PositionEncoding::learned);
  EXPECT_EQ(run(cfg, o, 2, 5).grad_bits, run(cfg, ModelOptions(), 2, 5).grad_bits);
}

TEST(Recompute, PoliciesKeepLessAndThePlanIsWhatTheModelAllocates) {
  auto ops = make_cpu_ops();
  const int B = 3, T = 17;
  for (PositionEncoding pos : {PositionEncoding::learned, PositionEncoding::rope})
    for (AttentionAlgo algo : {AttentionAlgo::flash, AttentionAlgo::naive}) {
      const ModelConfig cfg = tiny(pos);
      size_t none_bytes = 0;
      for (const char* name : {"none", "gelu", "ln", "attn", "gelu+ln+attn", "block"}) {
        SCOPED_TRACE(name);
        ModelOptions o(algo);
        o.recompute = RecomputePolicy::parse(name);
        GPT2 m(cfg, *ops, DType::f32, B, T, o);
        const ModelMemory plan = GPT2::memory(cfg, Device::cpu, DType::f32, B, T, o);
        EXPECT_EQ(plan.activation_bytes, m.activation_bytes());
        EXPECT_EQ(plan.activation_kinds, m.activation_kinds());
        EXPECT_EQ(plan.num_params, m.num_params());
        EXPECT_EQ(plan.param_bytes, m.params().nbytes());
        EXPECT_EQ(plan.grad_bytes, m.grads().nbytes());
        size_t kinds = 0;
        for (const auto& k : plan.activation_kinds) kinds += k.second;
        EXPECT_LE(kinds, plan.activation_bytes);
        EXPECT_GT(kinds + 256 * 200, plan.activation_bytes) << "more than alignment between the kinds and the arena";
        if (std::string(name) == "none") none_bytes = m.activation_bytes();
        else EXPECT_LT(m.activation_bytes(), none_bytes);
      }
    }
}

TEST(Recompute, RotaryPositionsHaveNoPositionTable) {
  auto ops = make_cpu_ops();
  GPT2 learned(tiny(PositionEncoding::learned), *ops, DType::f32, 1, 4);
  GPT2 rope(tiny(PositionEncoding::rope), *ops, DType::f32, 1, 4);
  auto has_wpe = [](const GPT2& m) {
    for (const auto& p : m.param_list())
      if (p.name == "wpe") return true;
    return false;
  };
  EXPECT_TRUE(has_wpe(learned));
  EXPECT_FALSE(has_wpe(rope));
  EXPECT_LT(rope.num_params(), learned.num_params());
}

TEST(Recompute, PolicyNamesParseAndPrintBack) {
  EXPECT_EQ(RecomputePolicy::parse("none").name(), "none");
  EXPECT_TRUE(RecomputePolicy::parse("none").none());
  EXPECT_EQ(RecomputePolicy::parse("ln+gelu").name(), "gelu+ln");
  EXPECT_EQ(RecomputePolicy::parse("attn+ln+gelu").name(), "gelu+ln+attn");
  EXPECT_EQ(RecomputePolicy::parse("block").name(), "block");
  for (const char* bad : {"", "gelu+", "+gelu", "fast", "gelu+gelu", "block+gelu", "none+gelu", "GELU"})
    EXPECT_THROW(RecomputePolicy::parse(bad), InputError) << "'" << bad << "'";
}

}  // namespace
}  // namespace flashgpt
