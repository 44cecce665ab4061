// The whole GPT-2 model on the CPU: gradients against finite differences in fp64,
// flash vs naive attention, loss at init, overfitting one batch, bit-exact resume.
#include <gtest/gtest.h>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>
#include "layers/gpt2.h"
#include <iterator>
#include <nlohmann/json.hpp>
#include "optim/adamw.h"
#include "src/checksum.h"
#include "tests/testing.h"
#include "train/checkpoint.h"
#include "train/comm.h"
#include "train/data_parallel.h"

namespace flashgpt {
namespace {

using test::Batch;
using test::random_batch;

template <class T>
std::vector<T> host(Ops& ops, const Tensor& t) {
  std::vector<T> v(size_t(t.numel()));
  ops.to_host(v.data(), t);
  return v;
}

ModelConfig tiny(int V = 29, int Vp = 32) { return {2, 2, 12, V, Vp, 20}; }

// Loss and every gradient element of the fp64 model against central differences — all
// elements of every tensor: whole rows, the last position, the padding rows of wte and
// the rows of wpe past T (whose gradient must then be exactly 0). The step h = 1e-5
// balances truncation error (~h²·|L'''|/6 ≈ 1e-11) against cancellation (~u·|L|/h ≈
// 1e-10 for u = 1.1e-16, |L| ≈ 3.4), so analytic and numeric gradients agree to ~1e-10
// absolute; we allow 1e-7 absolute + 1e-5 relative, far below any real bug (a missing
// term or row is off by >= 1e-3 here).
void check_gradients(AttentionAlgo algo, int T, PositionEncoding pos = PositionEncoding::learned) {
  auto ops = make_cpu_ops();
  const int B = 2;
  ModelConfig cfg = tiny();
  cfg.position = pos;
  GPT2 model(cfg, *ops, DType::f64, B, T, algo);
  model.init_random(7);
  // Larger weights than GPT-2's init so every path carries a visible gradient.
  std::vector<double> p = host<double>(*ops, model.params());
  auto rng = test::test_rng();
  std::normal_distribution<double> n(0, 0.3);
  for (const auto& info : model.param_list())
    for (int64_t i = 0; i < info.numel(); ++i) p[info.offset + size_t(i)] += n(rng);
  ops->from_host(model.params(), p.data());
  Batch b = random_batch(B, T, cfg.vocab_size, rng());
  b.tg[1] = -1;  // one ignored target
  model.set_batch(b.in.data(), b.tg.data());
  model.zero_grad();
  const int valid = B * T - 1;
  model.forward(float(1.0 / valid));
  model.backward();
  std::vector<double> g = host<double>(*ops, model.grads());

  auto loss_at = [&](size_t i, double x) {
    const double saved = p[i];
    p[i] = x;
    ops->from_host(model.params(), p.data());
    p[i] = saved;
    model.forward(0.0f);
    return model.last_loss();
  };
  const double h = 1e-5;
  for (const auto& info : model.param_list()) {
    std::vector<double> analytic(size_t(info.numel())), numeric(size_t(info.numel()));
    for (int64_t k = 0; k < info.numel(); ++k) {
      const size_t i = info.offset + size_t(k);
      analytic[size_t(k)] = g[i];
      numeric[size_t(k)] = (loss_at(i, p[i] + h) - loss_at(i, p[i] - h)) / (2 * h);
    }
    test::expect_all_close(analytic, numeric, 1e-5, 1e-7, info.name + " vs finite differences");
  }
}

// T = 17 = 16 + 1: the CPU flash kernel's second query and key tiles hold one row.
TEST(Model, GradientsMatchFiniteDifferencesFlash) { check_gradients(AttentionAlgo::flash, 17); }
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

  test::ScratchDir scratch("flashgpt_resume_");  // unique: concurrent runs do not collide
  const auto& dir = scratch.path;
  std::string ckpt;
  {
    GPT2 m(cfg, *ops, DType::f32, B, T);
    m.init_random(1);
    AdamW o(m, {});
    run(m, o, 0, 2);
    auto single = make_host_communicator();
    DataParallel dp(m, *single, 1);
    const OptimizerSource source{o.steps_done(), DType::f32, 2,
                                 [&](int k, std::string& bytes) { dp.gather_state(o, k, &bytes); }};
    ckpt = save_checkpoint(dir.string(), m, &source, {2, nlohmann::json::object(), {}}, "model: {}\n");
  }
  ModelOptions aligned;
  aligned.layer_align = 3 * 64;
  GPT2 m(cfg, *ops, DType::f32, B, T, aligned);
  ASSERT_NE(m.num_params(), ref.num_params()) << "the test wants another arena layout";
  AdamW o(m, {});
  auto single = make_host_communicator();
  DataParallel dp(m, *single, 1);
  const OptimizerSink sink{DType::f32, 2, [&](int k, const std::string& bytes) { dp.scatter_state(o, k, &bytes); }};
  CheckpointState st = load_checkpoint(resolve_checkpoint(dir.string()), m, sink);
  load_optimizer_state(resolve_checkpoint(dir.string()), m, sink);
  o.set_steps_done(st.optimizer_step);
  EXPECT_EQ(st.step, 2);
  EXPECT_EQ(o.steps_done(), 2);
  run(m, o, 2, 4);
  auto a = host<float>(*ops, ref.params()), b = host<float>(*ops, m.params());
  for (size_t k = 0; k < ref.param_list().size(); ++k) {
    const ParamInfo &p = ref.param_list()[k], &q = m.param_list()[k];
    for (int64_t i = 0; i < p.numel(); ++i)
      ASSERT_EQ(a[p.offset + size_t(i)], b[q.offset + size_t(i)]) << p.name << " element " << i;
  }
}

TEST(Model, CorruptCheckpointIsRejected) {
  auto ops = make_cpu_ops();
  GPT2 m(tiny(), *ops, DType::f32, 1, 4);
  m.init_random(1);
  test::ScratchDir scratch("flashgpt_corrupt_");
  const auto& dir = scratch.path;
  std::string ckpt = save_checkpoint(dir.string(), m, nullptr, {1, {}, {}}, "");
  {  // flip one byte of the weights
    std::fstream f(std::filesystem::path(ckpt) / "model.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  EXPECT_THROW(load_model_weights(ckpt, m), InputError);
}

std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// checksums.json is {"algorithm": "crc32c", "files": {...}}; a checkpoint written before
// it (a flat object of LegacyFnv64 sums) still loads, and is still checked; a malformed or
// unknown algorithm entry is refused.
TEST(Model, CheckpointChecksumsOldAndNew) {
  auto ops = make_cpu_ops();
  GPT2 m(tiny(), *ops, DType::f32, 1, 4);
  m.init_random(3);
  test::ScratchDir scratch("flashgpt_checksums_");
  const std::filesystem::path ckpt = save_checkpoint(scratch.path.string(), m, nullptr, {1, {}, {}}, "");
  const nlohmann::json sums = nlohmann::json::parse(read_bytes(ckpt / "checksums.json"));
  ASSERT_EQ(sums.at("algorithm"), "crc32c");
  ASSERT_EQ(sums.at("files").size(), 3u);  // model.bin, state.json, config.yaml
  for (auto& [name, sum] : sums.at("files").items()) {
    Crc32c c;
    const std::string bytes = read_bytes(ckpt / name);
    c.add(bytes.data(), bytes.size());
    EXPECT_EQ(sum.get<uint64_t>(), c.value()) << name;
  }
  GPT2 back(tiny(), *ops, DType::f32, 1, 4);
  const auto load_with = [&](const nlohmann::json& j) {
    write_bytes(ckpt / "checksums.json", j.dump(1));
    load_model_weights(ckpt.string(), back);
  };
  EXPECT_NO_THROW(load_with(sums));

  nlohmann::json legacy;  // as the checkpoints of earlier versions
  for (auto& [name, sum] : sums.at("files").items()) {
    LegacyFnv64 f;
    const std::string bytes = read_bytes(ckpt / name);
    f.add(bytes.data(), bytes.size());
    legacy[name] = f.value();
  }
  EXPECT_NO_THROW(load_with(legacy));
  EXPECT_EQ(host<float>(*ops, back.params()), host<float>(*ops, m.params()));
  nlohmann::json legacy_crc;  // CRC values in the flat (old) layout: wrong sums
  for (auto& [name, sum] : sums.at("files").items()) legacy_crc[name] = sum;
  EXPECT_THROW(load_with(legacy_crc), InputError);

  nlohmann::json bad = sums;
  bad["algorithm"] = "fnv1a";
  EXPECT_THROW(load_with(bad), InputError) << "an unknown algorithm";
  bad = sums;
  bad.erase("algorithm");
  EXPECT_THROW(load_with(bad), InputError) << "no algorithm";
  bad = sums;
  bad["files"] = nlohmann::json::array();
  EXPECT_THROW(load_with(bad), InputError) << "files not an object";
  bad = sums;
  bad["extra"] = 1;
  EXPECT_THROW(load_with(bad), InputError) << "a key besides algorithm and files";
  bad = sums;
  bad["files"]["model.bin"] = bad["files"]["model.bin"].get<uint64_t>() + (uint64_t(1) << 32);
  EXPECT_THROW(load_with(bad), InputError) << "a CRC-32C past 32 bits";

  {  // the new sums, one flipped byte of the weights
    std::string w = read_bytes(ckpt / "model.bin");
    w[w.size() - 3] ^= 0x10;
    write_bytes(ckpt / "model.bin", w);
  }
  EXPECT_THROW(load_with(sums), InputError);
  EXPECT_THROW(load_with(legacy), InputError);
}

// A model built for inference has no gradient arena, and its forward is the training
// model's to the bit; asking it for gradients is an error, not a write through null.
TEST(Model, InferenceModelHasNoGradients) {
  auto ops = make_cpu_ops();
  const int B = 2, T = 6;
  ModelOptions inference;
  inference.gradients = false;
  GPT2 train(tiny(), *ops, DType::f64, B, T), infer(tiny(), *ops, DType::f64, B, T, inference);
  train.init_random(5);
  ops->cast(infer.params(), train.params());
  EXPECT_FALSE(infer.grads().defined());
  EXPECT_EQ(GPT2::memory(tiny(), Device::cpu, DType::f64, B, T, inference).grad_bytes, 0u);
  EXPECT_GT(GPT2::memory(tiny(), Device::cpu, DType::f64, B, T, {}).grad_bytes, 0u);
  const Batch b = random_batch(B, T, tiny().vocab_size, 17);
  train.set_batch(b.in.data(), b.tg.data());
  infer.set_batch(b.in.data(), b.tg.data());
  train.forward(0.0f);
  infer.forward(0.0f);
  EXPECT_EQ(infer.last_loss(), train.last_loss());
  EXPECT_THROW(infer.forward(1.0f), std::runtime_error);
  EXPECT_THROW(infer.backward(), std::runtime_error);
  EXPECT_THROW(infer.zero_grad(), std::runtime_error);
}

// Loading the weights (eval, sample, export) checks and reads only model.bin, config.yaml
// and state.json: a damaged optimizer.bin does not stop them, and they load every weight
// exactly; resuming, and verify_checkpoint, still refuse it.
TEST(Model, WeightsLoadWithoutReadingTheOptimizerState) {
  auto ops = make_cpu_ops();
  ModelOptions opts;
  opts.layer_align = 64;  // gaps between the layers' parameters: they must stay zero
  GPT2 m(tiny(), *ops, DType::f32, 1, 4, opts);
  m.init_random(7);
  const size_t bytes = m.num_params() * sizeof(float);
  const OptimizerSource source{3, DType::f32, 2,
                               [&](int k, std::string& t) { t.assign(bytes, char(1 + k)); }};
  test::ScratchDir scratch("flashgpt_weights_only_");
  const std::string ckpt = save_checkpoint(scratch.path.string(), m, &source, {3, {}, {}}, "");
  {  // flip one byte of the optimizer state
    std::fstream f(std::filesystem::path(ckpt) / "optimizer.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  GPT2 back(tiny(), *ops, DType::f32, 1, 4, opts);
  ASSERT_NO_THROW(load_model_weights(ckpt, back));
  EXPECT_EQ(host<float>(*ops, back.params()), host<float>(*ops, m.params())) << "every weight, padding zero";
  EXPECT_THROW(verify_checkpoint(ckpt), InputError);
  const OptimizerSink into{DType::f32, 2, [](int, const std::string&) {}};
  EXPECT_THROW(load_checkpoint(ckpt, back, into), InputError);
}

// The optimizer state goes to the file and back one tensor at a time, in order, each in
// the arena's layout (the padding between layers zero): three tensors as a bf16 run
// keeps (m, v, the fp32 master), which only a GPU trains, so it is checked here directly.
TEST(Model, OptimizerStateRoundTripsTensorByTensor) {
  auto ops = make_cpu_ops();
  ModelOptions opts;
  opts.layer_align = 64;
  GPT2 m(tiny(), *ops, DType::f32, 1, 4, opts);
  std::vector<std::vector<float>> state(3, std::vector<float>(m.num_params(), 0.f));
  for (size_t k = 0; k < 3; ++k)
    for (const ParamInfo& p : m.param_list())
      for (int64_t i = 0; i < p.numel(); ++i) state[k][p.offset + size_t(i)] = float(k * 100000 + p.packed) + float(i);
  std::vector<int> asked;
  const OptimizerSource source{7, DType::f32, 3, [&](int k, std::string& t) {
                                 asked.push_back(k);
                                 t.assign(reinterpret_cast<const char*>(state[size_t(k)].data()), m.num_params() * 4);
                               }};
  test::ScratchDir scratch("flashgpt_opt_stream_");
  const std::string ckpt = save_checkpoint(scratch.path.string(), m, &source, {7, {}, {}}, "");
  EXPECT_EQ(asked, (std::vector<int>{0, 1, 2}));
  std::vector<std::vector<float>> back;
  const OptimizerSink sink{DType::f32, 3, [&](int k, const std::string& t) {
                             EXPECT_EQ(k, int(back.size()));
                             ASSERT_EQ(t.size(), m.num_params() * 4);
                             back.emplace_back(m.num_params());
                             std::memcpy(back.back().data(), t.data(), t.size());
                           }};
  GPT2 into(tiny(), *ops, DType::f32, 1, 4, opts);
  const CheckpointState st = load_checkpoint(ckpt, into, sink);
  EXPECT_EQ(st.optimizer_step, 7);
  EXPECT_TRUE(back.empty()) << "load_checkpoint only checks the optimizer state";
  load_optimizer_state(ckpt, into, sink);
  EXPECT_EQ(back, state);
  const OptimizerSink two{DType::f32, 2, [](int, const std::string&) {}};
  EXPECT_THROW(load_checkpoint(ckpt, into, two), InputError) << "a run without the master refuses it";
}

// Token ids come from data files: one outside the vocabulary is bad input (exit 2),
// caught before it indexes wte. Negative targets mean "ignore" and are accepted.
TEST(Model, SetBatchRejectsIdsOutsideTheVocabulary) {
  auto ops = make_cpu_ops();
  const int B = 1, T = 4;
  GPT2 m(tiny(), *ops, DType::f32, B, T);
  const int V = tiny().vocab_size;
  std::vector<int32_t> ok{0, 1, V - 1, 2}, targets{1, -1, 0, V - 1};
  EXPECT_NO_THROW(m.set_batch(ok.data(), targets.data()));
  for (int32_t bad : {V, V + 3, -1, tiny().padded_vocab}) {
    std::vector<int32_t> in = ok;
    in[2] = bad;
    EXPECT_THROW(m.set_batch(in.data(), targets.data()), InputError) << "input id " << bad;
    std::vector<int32_t> tg = targets;
    tg[3] = bad;
    if (bad >= 0) EXPECT_THROW(m.set_batch(ok.data(), tg.data()), InputError) << "target id " << bad;
  }
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
