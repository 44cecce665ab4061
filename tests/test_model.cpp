// The whole GPT-2 model on the CPU: gradients against finite differences in fp64,
// flash vs naive attention, loss at init, overfitting one batch, bit-exact resume.
#include <gtest/gtest.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>
#include "layers/gpt2.h"
#include "optim/adamw.h"
#include "train/checkpoint.h"

namespace flashgpt {
namespace {

struct Batch { std::vector<int32_t> in, tg; };

Batch random_batch(int B, int T, int V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(0, V - 1);
  Batch b{std::vector<int32_t>(size_t(B * T)), std::vector<int32_t>(size_t(B * T))};
  for (auto& x : b.in) x = tok(rng);
  for (auto& x : b.tg) x = tok(rng);
  return b;
}

template <class T>
std::vector<T> host(Ops& ops, const Tensor& t) {
  std::vector<T> v(size_t(t.numel()));
  ops.to_host(v.data(), t);
  return v;
}

ModelConfig tiny(int V = 29, int Vp = 32) { return {2, 2, 12, V, Vp, 16}; }

// Loss and all gradients of the fp64 model against central differences. The step
// h = 1e-5 balances truncation error (~h²·|L'''| ≈ 1e-10) against cancellation
// (~eps·|L|/h ≈ 1e-10), so analytic and numeric gradients agree to ~1e-9 absolute;
// we allow 1e-7 absolute + 1e-5 relative, far below any real bug (≥ 1e-3).
void check_gradients(AttentionAlgo algo, int T, PositionEncoding pos = PositionEncoding::learned) {
  auto ops = make_cpu_ops();
  const int B = 2;
  ModelConfig cfg = tiny();
  cfg.position = pos;
  GPT2 model(cfg, *ops, DType::f64, B, T, algo);
  model.init_random(7);
  // Larger weights than GPT-2's init so every path carries a visible gradient.
  std::vector<double> p = host<double>(*ops, model.params());
  std::mt19937_64 rng(11);
  std::normal_distribution<double> n(0, 0.3);
  for (const auto& info : model.param_list())
    for (int64_t i = 0; i < info.numel(); ++i) p[info.offset + size_t(i)] += n(rng);
  ops->from_host(model.params(), p.data());
  Batch b = random_batch(B, T, cfg.vocab_size, 3);
  b.tg[1] = -1;  // one ignored target
  model.set_batch(b.in.data(), b.tg.data());
  model.zero_grad();
  const int valid = B * T - 1;
  model.forward(float(1.0 / valid));
  model.backward();
  std::vector<double> g = host<double>(*ops, model.grads());

  auto loss_at = [&](size_t i, double x) {
    std::vector<double> q = p;
    q[i] = x;
    ops->from_host(model.params(), q.data());
    model.forward(0.0f);
    return model.last_loss();
  };
  const double h = 1e-5;
  int checked = 0;
  std::uniform_int_distribution<int64_t> pick(0, 1 << 30);
  for (const auto& info : model.param_list()) {
    // a few random elements of every tensor (wte: only real-vocab rows)
    int64_t limit = info.name == "wte" ? int64_t(cfg.vocab_size) * cfg.n_embd : info.numel();
    if (info.name == "wpe") limit = int64_t(T) * cfg.n_embd;
    for (int k = 0; k < 4; ++k) {
      size_t i = info.offset + size_t(pick(rng) % limit);
      double fd = (loss_at(i, p[i] + h) - loss_at(i, p[i] - h)) / (2 * h);
      EXPECT_NEAR(g[i], fd, 1e-7 + 1e-5 * std::fabs(fd)) << info.name << " element " << i - info.offset;
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(Model, GradientsMatchFiniteDifferencesFlash) { check_gradients(AttentionAlgo::flash, 7); }
TEST(Model, GradientsMatchFiniteDifferencesNaive) { check_gradients(AttentionAlgo::naive, 7); }
TEST(Model, GradientsMatchFiniteDifferencesSingleToken) { check_gradients(AttentionAlgo::flash, 1); }
TEST(Model, GradientsMatchFiniteDifferencesRotaryPositions) {
  check_gradients(AttentionAlgo::flash, 7, PositionEncoding::rope);
}

TEST(Model, FlashAndNaiveAttentionGiveTheSameLossAndGradients) {
  auto ops = make_cpu_ops();
  const int B = 3, T = 11;
  GPT2 a(tiny(), *ops, DType::f64, B, T, AttentionAlgo::flash);
  GPT2 b(tiny(), *ops, DType::f64, B, T, AttentionAlgo::naive);
  a.init_random(5);
  b.init_random(5);
  Batch x = random_batch(B, T, 29, 9);
  for (GPT2* m : {&a, &b}) {
    m->set_batch(x.in.data(), x.tg.data());
    m->zero_grad();
    m->forward(1.0f / (B * T));
    m->backward();
  }
  EXPECT_NEAR(a.last_loss(), b.last_loss(), 1e-12);
  auto ga = host<double>(*ops, a.grads()), gb = host<double>(*ops, b.grads());
  for (size_t i = 0; i < ga.size(); ++i) ASSERT_NEAR(ga[i], gb[i], 1e-12) << "gradient element " << i;
}

TEST(Model, LossAtInitIsLogVocab) {
  auto ops = make_cpu_ops();
  const int B = 4, T = 32;
  ModelConfig cfg{2, 2, 32, 50257, 50304, 64};
  GPT2 model(cfg, *ops, DType::f32, B, T);
  model.init_random(1);
  Batch x = random_batch(B, T, cfg.vocab_size, 2);
  model.set_batch(x.in.data(), x.tg.data());
  // Logits have std ≈ 0.02·sqrt(C) ≈ 0.11 at init, so the loss is ln(V) + ~0.006.
  EXPECT_NEAR(model.forward(0.0f), std::log(50257.0), 0.05);
}

TEST(Model, OverfitsOneBatch) {
  auto ops = make_cpu_ops();
  const int B = 2, T = 16;
  ModelConfig cfg{2, 2, 32, 64, 64, 16};
  GPT2 model(cfg, *ops, DType::f32, B, T);
  model.init_random(3);
  AdamW opt(model, {0.9, 0.95, 1e-8, 0.0, 1.0});
  Batch x = random_batch(B, T, cfg.vocab_size, 4);
  model.set_batch(x.in.data(), x.tg.data());
  float loss = 0;
  for (int step = 0; step < 300; ++step) {
    model.zero_grad();
    loss = model.forward(1.0f / (B * T));
    model.backward();
    opt.step(1e-2, opt.grad_norm(), 0);
  }
  EXPECT_LT(loss, 0.1f);
}

// Two steps, checkpoint, two more steps from the checkpoint in a fresh model whose arena
// is padded differently (as with another world size): bit-identical to four
// uninterrupted steps.
TEST(Model, ResumeFromCheckpointIsBitExact) {
  auto ops = make_cpu_ops();
  const int B = 2, T = 8;
  ModelConfig cfg = tiny();
  std::vector<Batch> batches;
  for (int i = 0; i < 4; ++i) batches.push_back(random_batch(B, T, cfg.vocab_size, 100 + i));
  auto run = [&](GPT2& m, AdamW& o, int from, int to) {
    for (int s = from; s < to; ++s) {
      m.set_batch(batches[size_t(s)].in.data(), batches[size_t(s)].tg.data());
      m.zero_grad();
      m.forward(1.0f / (B * T));
      m.backward();
      o.step(1e-3, o.grad_norm(), uint32_t(s));
    }
  };
  GPT2 ref(cfg, *ops, DType::f32, B, T);
  ref.init_random(1);
  AdamW ref_opt(ref, {});
  run(ref, ref_opt, 0, 4);

  auto dir = std::filesystem::temp_directory_path() / "flashgpt_resume_test";
  std::filesystem::remove_all(dir);
  std::string ckpt;
  {
    GPT2 m(cfg, *ops, DType::f32, B, T);
    m.init_random(1);
    AdamW o(m, {});
    run(m, o, 0, 2);
    OptimizerSnapshot snap = snapshot_of(o);
    ckpt = save_checkpoint(dir.string(), m, &snap, {2, nlohmann::json::object(), {}}, "model: {}\n");
  }
  ModelOptions aligned;
  aligned.layer_align = 3 * 64;
  GPT2 m(cfg, *ops, DType::f32, B, T, aligned);
  ASSERT_NE(m.num_params(), ref.num_params()) << "the test wants another arena layout";
  AdamW o(m, {});
  OptimizerSnapshot snap{0, DType::f32, std::vector<std::string>(2)};
  CheckpointState st = load_checkpoint(resolve_checkpoint(dir.string()), m, &snap);
  restore_from(o, snap);
  EXPECT_EQ(st.step, 2);
  EXPECT_EQ(o.steps_done(), 2);
  run(m, o, 2, 4);
  auto a = host<float>(*ops, ref.params()), b = host<float>(*ops, m.params());
  for (size_t k = 0; k < ref.param_list().size(); ++k) {
    const ParamInfo &p = ref.param_list()[k], &q = m.param_list()[k];
    for (int64_t i = 0; i < p.numel(); ++i)
      ASSERT_EQ(a[p.offset + size_t(i)], b[q.offset + size_t(i)]) << p.name << " element " << i;
  }
  std::filesystem::remove_all(dir);
}

TEST(Model, CorruptCheckpointIsRejected) {
  auto ops = make_cpu_ops();
  GPT2 m(tiny(), *ops, DType::f32, 1, 4);
  m.init_random(1);
  auto dir = std::filesystem::temp_directory_path() / "flashgpt_corrupt_test";
  std::filesystem::remove_all(dir);
  std::string ckpt = save_checkpoint(dir.string(), m, nullptr, {1, {}, {}}, "");
  {  // flip one byte of the weights
    std::fstream f(std::filesystem::path(ckpt) / "model.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  EXPECT_THROW(load_model_weights(ckpt, m), InputError);
  std::filesystem::remove_all(dir);
}

// The layer ranges tile the arena in order -1 (embeddings), 0..L-1, L (final LN), each
// a multiple of layer_align long, and each holds exactly its own layer's parameters.
TEST(Model, LayerRangesTileTheArenaLayerMajor) {
  auto ops = make_cpu_ops();
  for (size_t align : {size_t(1), size_t(64 * 3), size_t(64 * 8)}) {
    ModelOptions opts;
    opts.layer_align = align;
    GPT2 m(tiny(), *ops, DType::f32, 1, 4, opts);
    size_t prev_end = 0;
    for (int l = -1; l <= m.config().n_layer; ++l) {
      auto [b, e] = m.layer_range(l);
      EXPECT_EQ(b, prev_end) << "layer " << l;
      EXPECT_GT(e, b);
      EXPECT_EQ(b % align, 0u) << "layer " << l;
      EXPECT_EQ((e - b) % align, 0u) << "layer " << l;
      prev_end = e;
    }
    EXPECT_EQ(prev_end, m.num_params());
    size_t packed = 0;
    for (const ParamInfo& p : m.param_list()) {
      auto [b, e] = m.layer_range(p.layer);
      EXPECT_GE(p.offset, b) << p.name;
      EXPECT_LE(p.offset + size_t(p.numel()), e) << p.name;
      EXPECT_EQ(p.packed, packed) << p.name;
      packed += size_t(p.numel());
    }
    EXPECT_EQ(m.num_packed(), packed);
  }
}

}  // namespace
}  // namespace flashgpt
