// The whole model on the GPU (layers/gpt2.h) against the CPU model in fp64, with the
// bound of tests/testing.h (check_rule) on the loss, the logits and every gradient, per
// element; the yardstick "naive" is the same model run plainly at the GPU's precision on
// the CPU (NaiveOps: fp32 arithmetic, and bf16 storage of activations in bf16 runs):
//  * fp32: both attention algorithms;
//  * ten AdamW steps in fp32: the losses;
//  * bf16 (FlashAttention): the whole loss and every gradient against fp64 — no second
//    bf16 GPU path on the other side, so a bf16-only bug cannot cancel;
//  * bf16: FlashAttention in the model vs the naive attention (both GPU), both against
//    fp64; and training in bf16 lowers the loss.
//  * rotary positions (fp32 vs the CPU), and every recompute policy bitwise equal to
//    `none` (bf16 with FLASHGPT_DETERMINISTIC=1, and fp32).
// And a harness that only runs when asked (skipped otherwise): FLASHGPT_PARITY_DIR=dir
// writes the weights, batch, loss and gradients of a small GPT-2 (fp32, GPU) as raw
// files for scripts/parity_torch.py. (The training-step benchmark is
// `flashgpt bench train`.)
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include "layers/gpt2.h"
#include "optim/adamw.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/naive_ops.h"

namespace flashgpt::test {
namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.n_layer = 2; c.n_head = 4; c.n_embd = 64;
  c.vocab_size = 50257; c.padded_vocab = 50304;  // the real GPT-2 vocabulary and padding
  c.max_seq_len = 64;
  return c;
}
constexpr int kB = 2, kT = 48;  // B·T = 96: not a multiple of the head chunk or a block

struct Batch {
  std::vector<int32_t> inputs, targets;
};
Batch random_batch(int B, int T, int V, std::mt19937_64& rng) {
  Batch b;
  std::uniform_int_distribution<int32_t> tok(0, V - 1);
  for (int i = 0; i < B * T; ++i) b.inputs.push_back(tok(rng));
  for (int i = 0; i < B * T; ++i) b.targets.push_back(i % 17 == 5 ? -1 : tok(rng));  // some ignored
  return b;
}

std::vector<double> to_doubles(Ops& ops, const Tensor& t) { return OpCase::download(ops, t); }
void from_doubles(Ops& ops, const Tensor& t, const std::vector<double>& v) { OpCase::upload(ops, t, v); }

// The GPU model's weights (as initialised there) copied into another model.
void copy_params(GPT2& from, GPT2& to) {
  from_doubles(to.ops(), to.params(), to_doubles(from.ops(), from.params()));
}

struct StepResult {
  double loss;
  std::vector<double> logits, grads;
};
StepResult run_step(GPT2& m, const Batch& b, bool want_logits) {
  m.zero_grad();
  m.set_batch(b.inputs.data(), b.targets.data());
  m.forward(1.0f / float(m.B() * m.T()));
  StepResult r;
  r.loss = m.last_loss();
  m.backward();
  r.grads = to_doubles(m.ops(), m.grads());
  if (want_logits) {
    std::vector<float> l(size_t(m.B()) * m.T() * m.config().padded_vocab);
    m.logits_to_host(l.data());
    r.logits.assign(l.begin(), l.end());
  }
  return r;
}

std::vector<double> slice(const std::vector<double>& v, const ParamInfo& p) {
  return std::vector<double>(v.begin() + int64_t(p.offset), v.begin() + int64_t(p.offset) + p.numel());
}

// Per-position losses recomputed on the host (in double) from a model's logits.
std::vector<double> position_losses(const std::vector<double>& logits, const Batch& b, int V, int Vp) {
  std::vector<double> out;
  for (size_t n = 0; n < b.targets.size(); ++n) {
    if (b.targets[n] < 0) continue;
    const double* x = logits.data() + n * size_t(Vp);
    double m = -INFINITY, s = 0;
    for (int j = 0; j < V; ++j) m = std::max(m, x[j]);
    for (int j = 0; j < V; ++j) s += std::exp(x[j] - m);
    out.push_back(m + std::log(s) - x[b.targets[n]]);
  }
  return out;
}

// ours against ref with naive as the yardstick (check_rule): logits (rows of Vp) and
// every parameter's gradient (rows of its last dimension), element by element. The loss
// is one number, whose naive error alone is a poor estimate of its error scale: the
// scale σ is that of the per-position losses (recomputed from naive's and ref's logits),
// which the batch loss averages — the bound is the rule's with that σ.
void expect_model_close(const StepResult& ours, const StepResult& naive, const StepResult& ref,
                        const GPT2& model, const Batch& b, const std::string& what) {
  const ModelConfig& cfg = model.config();
  const double u_act = unit_roundoff(model.dtype()), u_grad = unit_roundoff(GradDType(model.dtype()));
  const auto ln = position_losses(naive.logits, b, cfg.vocab_size, cfg.padded_vocab),
             lr = position_losses(ref.logits, b, cfg.vocab_size, cfg.padded_vocab);
  double ss = 0;
  for (size_t i = 0; i < ln.size(); ++i) ss += (ln[i] - lr[i]) * (ln[i] - lr[i]);
  const double sigma = std::sqrt(ss / double(ln.size())), lambda = std::sqrt(2 * std::log(1 / kRuleDelta));
  const double bound = 2 * (std::fabs(naive.loss - ref.loss) + lambda * sigma +
                            unit_roundoff(DType::f32) * std::fabs(ref.loss));
  EXPECT_LE(std::fabs(ours.loss - ref.loss), bound)
      << what << " loss: ours " << ours.loss << ", naive " << naive.loss << ", fp64 " << ref.loss
      << " (per-position loss error scale " << sigma << ")";
  expect_rule(ours.logits, naive.logits, ref.logits, cfg.padded_vocab, u_act, what + " logits");
  for (const ParamInfo& p : model.param_list())
    expect_rule(slice(ours.grads, p), slice(naive.grads, p), slice(ref.grads, p), p.shape.back(),
                u_grad, what + " grad " + p.name);
}

class CudaModel : public CudaTest {
 protected:
  NaiveOps naive_fp32_, naive_bf16_{NaiveOps::Bf16Storage::on};
  // The naive counterpart of a GPU model of dtype dt (always an fp32 CPU model).
  Ops& naive_ops(DType dt) { return dt == DType::bf16 ? naive_bf16_ : naive_fp32_; }

  // One step of the bf16 model on our FlashAttention kernels against the fp64 CPU model
  // from the same weights, with `yardstick` (ops, dtype, attention) as the naive model.
  void expect_bf16_step_close(Ops& yardstick, DType yardstick_dtype, AttentionAlgo yardstick_algo,
                              const std::string& what) {
    auto rng = test_rng();
    ModelConfig cfg = tiny_config();
    cfg.n_embd = 128; cfg.n_head = 2; cfg.max_seq_len = 128;  // head dim 64
    const int B = 2, T = 113;
    GPT2 gpu(cfg, *gpu_, DType::bf16, B, T, AttentionAlgo::flash);
    GPT2 naive(cfg, yardstick, yardstick_dtype, B, T, yardstick_algo);
    GPT2 ref(cfg, *cpu_, DType::f64, B, T, AttentionAlgo::flash);
    gpu.init_random(21);
    copy_params(gpu, naive);  // bf16 → bf16, fp32 and fp64 are exact
    copy_params(gpu, ref);
    Batch b = random_batch(B, T, cfg.vocab_size, rng);
    StepResult g = run_step(gpu, b, true), n = run_step(naive, b, true), r = run_step(ref, b, true);
    expect_model_close(g, n, r, gpu, b, what);
  }
};

TEST_F(CudaModel, Fp32MatchesCpuLossLogitsAndEveryGradient) {
  for (AttentionAlgo algo : {AttentionAlgo::flash, AttentionAlgo::naive}) {
    SCOPED_TRACE(algo == AttentionAlgo::flash ? "flash" : "naive");
    auto rng = test_rng(int(algo));
    ModelConfig cfg = tiny_config();
    GPT2 gpu(cfg, *gpu_, DType::f32, kB, kT, algo);
    GPT2 ref(cfg, *cpu_, DType::f64, kB, kT, algo);
    GPT2 naive(cfg, naive_ops(DType::f32), DType::f32, kB, kT, algo);
    gpu.init_random(1234);
    copy_params(gpu, ref);
    copy_params(gpu, naive);
    Batch b = random_batch(kB, kT, cfg.vocab_size, rng);
    StepResult g = run_step(gpu, b, true), r = run_step(ref, b, true), n = run_step(naive, b, true);
    expect_model_close(g, n, r, gpu, b, "fp32");
  }
}

std::vector<double> train_losses(GPT2& m, const std::vector<Batch>& batches) {
  AdamWConfig oc;  // defaults: β (0.9, 0.95), wd 0.1, clip 1.0
  AdamW opt(m, oc);
  std::vector<double> losses;
  for (size_t s = 0; s < batches.size(); ++s) {
    m.zero_grad();
    m.set_batch(batches[s].inputs.data(), batches[s].targets.data());
    m.forward(1.0f / float(m.B() * m.T()));
    losses.push_back(m.last_loss());
    m.backward();
    opt.step(1e-3, opt.grad_norm(), uint32_t(s));
  }
  return losses;
}

TEST_F(CudaModel, TenAdamWStepsFp32MatchCpu) {
  auto rng = test_rng();
  ModelConfig cfg = tiny_config();
  std::vector<Batch> batches;
  for (int s = 0; s < 10; ++s) batches.push_back(random_batch(kB, kT, 500, rng));  // learnable: few ids
  GPT2 gpu(cfg, *gpu_, DType::f32, kB, kT);
  GPT2 ref(cfg, *cpu_, DType::f64, kB, kT);
  GPT2 naive(cfg, naive_ops(DType::f32), DType::f32, kB, kT);
  gpu.init_random(7);
  copy_params(gpu, ref);
  copy_params(gpu, naive);
  auto g = train_losses(gpu, batches), r = train_losses(ref, batches), n = train_losses(naive, batches);
  for (size_t s = 0; s < g.size(); ++s)
    std::printf("step %zu: gpu fp32 %.9f  cpu fp64 %.9f  naive fp32 %.9f\n", s, g[s], r[s], n[s]);
  expect_rule(g, n, r, 0, unit_roundoff(DType::f32), "training losses");
  EXPECT_LT(g.back(), g.front()) << "training did not lower the loss";
}

// The bf16 model (FlashAttention, the fused kernels) against the fp64 CPU model from the
// same weights; the yardstick is the CPU model with bf16 storage of every activation
// (naive attention: P stored in bf16, as a plain bf16 kernel does). T = 113 is no
// multiple of any tile.
TEST_F(CudaModel, Bf16MatchesFp64LossLogitsAndEveryGradient) {
  expect_bf16_step_close(naive_ops(DType::bf16), DType::f32, AttentionAlgo::naive, "bf16");
}

// The model on our FlashAttention kernels (bf16) against the same model on the naive
// attention kernels (S and P materialised, bf16) as the yardstick, both against the fp64
// CPU model from the same weights.
TEST_F(CudaModel, Bf16FlashAttentionMatchesNaiveAttentionAgainstFp64) {
  expect_bf16_step_close(*gpu_, DType::bf16, AttentionAlgo::naive, "bf16 flash vs naive attention");
}

// Training in bf16 (master weights, stochastic rounding) on one repeated batch lowers
// the loss clearly (the fp32 test's varied batches lose 0.4 in 10 steps). The accuracy
// of bf16 against fp64 is Bf16MatchesFp64LossLogitsAndEveryGradient's.
TEST_F(CudaModel, Bf16TrainingLowersTheLoss) {
  auto rng = test_rng();
  ModelConfig cfg = tiny_config();
  cfg.n_embd = 128; cfg.n_head = 2;  // head dim 64: the FlashAttention kernels take 64 or 128
  GPT2 gpu(cfg, *gpu_, DType::bf16, kB, kT);
  gpu.init_random(3);
  Batch b = random_batch(kB, kT, cfg.vocab_size, rng);
  std::vector<Batch> same(10, b);
  auto losses = train_losses(gpu, same);
  EXPECT_LT(losses.back(), losses.front() - 0.1) << "training on one batch did not lower the loss";
}

// Rotary positions on the GPU (fp32) against the CPU model in fp64, with the CPU fp32
// model fixing the bound: loss, logits and every gradient.
TEST_F(CudaModel, Fp32RotaryPositionsMatchCpu) {
  auto rng = test_rng();
  ModelConfig cfg = tiny_config();
  cfg.position = PositionEncoding::rope;
  GPT2 gpu(cfg, *gpu_, DType::f32, kB, kT);
  GPT2 ref(cfg, *cpu_, DType::f64, kB, kT);
  GPT2 naive(cfg, naive_ops(DType::f32), DType::f32, kB, kT);
  gpu.init_random(99);
  copy_params(gpu, ref);
  copy_params(gpu, naive);
  Batch b = random_batch(kB, kT, cfg.vocab_size, rng);
  StepResult g = run_step(gpu, b, true), r = run_step(ref, b, true), n = run_step(naive, b, true);
  expect_model_close(g, n, r, gpu, b, "rope fp32");
}

// Every recompute policy gives the bits of `none`: the loss and every gradient after two
// accumulated micro-batches with an evaluation forward between them. bf16 with
// FLASHGPT_DETERMINISTIC=1 (dQ without atomics, GELU outside the matmul epilogue in every
// policy), flash and naive attention, learned and rotary positions; and fp32.
TEST_F(CudaModel, RecomputePoliciesGiveTheBitsOfNone) {
  ScopedEnv det("FLASHGPT_DETERMINISTIC", "1");
  struct Run { std::vector<double> losses, grads; };
  auto run = [&](const ModelConfig& cfg, DType dt, const ModelOptions& o) {
    GPT2 m(cfg, *gpu_, dt, 2, 113, o);  // T = 113: no multiple of any tile
    m.init_random(5);
    auto rng = test_rng();
    Run r;
    m.zero_grad();
    for (int step = 0; step < 2; ++step) {
      Batch b = random_batch(2, 113, cfg.vocab_size, rng), e = random_batch(2, 113, cfg.vocab_size, rng);
      m.set_batch(b.inputs.data(), b.targets.data());
      r.losses.push_back(m.forward(1.0f / 226));
      m.backward();
      m.set_batch(e.inputs.data(), e.targets.data());
      r.losses.push_back(m.forward(0.0f));
    }
    r.grads = to_doubles(*gpu_, m.grads());
    return r;
  };
  ModelConfig base = tiny_config();
  base.n_embd = 128; base.n_head = 2; base.max_seq_len = 128;  // head dim 64 for FlashAttention
  for (DType dt : {DType::bf16, DType::f32})
    for (PositionEncoding pos : {PositionEncoding::learned, PositionEncoding::rope})
      for (AttentionAlgo algo : {AttentionAlgo::flash, AttentionAlgo::naive}) {
        ModelConfig cfg = base;
        cfg.position = pos;
        ModelOptions none(algo);
        none.deterministic = true;
        const Run ref = run(cfg, dt, none);
        for (const char* policy : {"gelu", "ln", "attn", "gelu+ln+attn", "block"}) {
          SCOPED_TRACE(cat(dtype_name(dt), " ", position_name(pos), " ",
                           algo == AttentionAlgo::naive ? "naive " : "flash ", policy));
          ModelOptions o = none;
          o.recompute = RecomputePolicy::parse(policy);
          const Run got = run(cfg, dt, o);
          EXPECT_EQ(got.losses, ref.losses);
          size_t differ = 0;
          for (size_t i = 0; i < got.grads.size(); ++i) differ += !(got.grads[i] == ref.grads[i]);
          EXPECT_EQ(differ, 0u) << "gradient elements that differ from recompute=none";
        }
      }
}

// ---------------------------------------------------------------- harnesses

void write_raw(const std::string& path, const void* p, size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(p), std::streamsize(bytes));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

// Raw dump for scripts/parity_torch.py, in directory $FLASHGPT_PARITY_DIR:
//   meta.json    config, B, T, loss, and the parameter list (name, offset, shape) in
//                ParamInfo order; offsets are elements into params.bin / grads.bin
//   params.bin   fp32, the whole parameter arena (alignment gaps included)
//   grads.bin    fp32, the gradient arena after one forward/backward (dloss = 1/(B·T))
//   inputs.bin, targets.bin   int32, B·T each
TEST_F(CudaModel, DumpForTorchParity) {
  const char* dir = std::getenv("FLASHGPT_PARITY_DIR");
  if (!dir) GTEST_SKIP() << "set FLASHGPT_PARITY_DIR to write the parity dump";
  ModelConfig cfg;
  cfg.n_layer = 2; cfg.n_head = 4; cfg.n_embd = 128;
  cfg.vocab_size = 50257; cfg.padded_vocab = 50304; cfg.max_seq_len = 128;
  const int B = 4, T = 64;
  GPT2 m(cfg, *gpu_, DType::f32, B, T);
  m.init_random(2024);
  auto rng = test_rng();
  Batch b = random_batch(B, T, cfg.vocab_size, rng);
  StepResult s = run_step(m, b, false);
  std::vector<float> params(m.num_params()), grads(m.num_params());
  auto pd = to_doubles(*gpu_, m.params());
  params.assign(pd.begin(), pd.end());
  grads.assign(s.grads.begin(), s.grads.end());
  std::string d(dir);
  write_raw(d + "/params.bin", params.data(), params.size() * 4);
  write_raw(d + "/grads.bin", grads.data(), grads.size() * 4);
  write_raw(d + "/inputs.bin", b.inputs.data(), b.inputs.size() * 4);
  write_raw(d + "/targets.bin", b.targets.data(), b.targets.size() * 4);
  std::ofstream meta(d + "/meta.json");
  char loss[64];
  std::snprintf(loss, sizeof loss, "%.17g", s.loss);
  meta << "{\"n_layer\": " << cfg.n_layer << ", \"n_head\": " << cfg.n_head
       << ", \"n_embd\": " << cfg.n_embd << ", \"vocab_size\": " << cfg.vocab_size
       << ", \"padded_vocab\": " << cfg.padded_vocab << ", \"max_seq_len\": " << cfg.max_seq_len
       << ", \"B\": " << B << ", \"T\": " << T << ", \"loss\": " << loss << ", \"params\": [";
  bool first = true;
  for (const ParamInfo& p : m.param_list()) {
    meta << (first ? "" : ", ") << "{\"name\": \"" << p.name << "\", \"offset\": " << p.offset
         << ", \"shape\": [";
    for (size_t i = 0; i < p.shape.size(); ++i) meta << (i ? ", " : "") << p.shape[i];
    meta << "]}";
    first = false;
  }
  meta << "]}\n";
  std::printf("parity dump written to %s (loss %s)\n", dir, loss);
}

}  // namespace
}  // namespace flashgpt::test
