#include "train/bench_train.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
#include "layers/gpt2.h"
#include "optim/adamw.h"
#include "src/config.h"
#include "train/backend.h"
#include "train/memory_plan.h"
#ifdef FLASHGPT_WITH_CUDA
#include "kernels/cuda/timed_ops.h"
#include "src/cuda/device_context.h"
#endif

namespace flashgpt {
namespace {

struct BenchTrainOptions {
  std::string config = "configs/gpt2-124m.yaml";
  std::vector<std::string> sets;
  int warmup = 3;
  int steps = 10;
  bool breakdown = false;
};

void run_bench_train(const BenchTrainOptions& o) {
  Config cfg = load_config(o.config, o.sets);
  Backend be = make_backend(cfg.run.device, cfg.train.precision);
  Ops* ops = be.ops.get();
#ifdef FLASHGPT_WITH_CUDA
  std::unique_ptr<TimedOps> timed;
  if (o.breakdown && be.context) {
    timed = make_timed_ops(*be.ops, *static_cast<DeviceContext*>(be.context.get()));
    timed->set_enabled(false);
    ops = timed.get();
  }
#endif
  const int B = cfg.train.batch_size, T = cfg.train.seq_len;
  check_memory_fits(cfg, be, /*world=*/1, /*zero=*/0);  // before anything is allocated
  const size_t used_before = be.device_memory_used();
  GPT2 model(model_config(cfg), *ops, be.dtype, B, T, model_options(cfg));
  model.init_random(cfg.train.seed);
  AdamW opt(model, adamw_config(cfg));
  // Fresh random tokens (never zeros: they can time faster than real data).
  std::mt19937_64 rng(cfg.train.seed);
  std::uniform_int_distribution<int32_t> tok(0, cfg.model.vocab_size - 1);
  // A few batches made up front and rotated, so token generation stays out of the timing.
  constexpr int kBatches = 4;
  std::vector<std::vector<int32_t>> in(kBatches), tg(kBatches);
  for (int k = 0; k < kBatches; ++k) {
    in[k].resize(size_t(B) * T);
    tg[k].resize(size_t(B) * T);
    for (size_t i = 0; i < in[k].size(); ++i) { in[k][i] = tok(rng); tg[k][i] = tok(rng); }
  }
  auto step = [&](int s) {
    model.set_batch(in[s % kBatches].data(), tg[s % kBatches].data());
    model.zero_grad();
    model.forward(1.0f / float(int64_t(B) * T));
    model.backward();
    opt.step(cfg.train.lr, opt.grad_norm(), uint32_t(s));
    ops->synchronize();
  };
  for (int s = 0; s < o.warmup; ++s) step(s);
  std::vector<double> ms;
  for (int s = 0; s < o.steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    step(o.warmup + s);  // ends with a synchronize, so the host clock covers the GPU work
    ms.push_back(1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double med = sorted[sorted.size() / 2];
  const double tok_s = double(B) * T / (med / 1e3);
  const double tflops = tok_s * model.flops_per_token() / 1e12;
  std::printf("bench train: %s on %s (%s), B=%d T=%d, attention %s, recompute %s, positions %s, %.2fM params\n",
              o.config.c_str(), be.gpu_name.empty() ? "cpu" : be.gpu_name.c_str(), dtype_name(be.dtype), B, T,
              cfg.model.attention.c_str(), model.options().recompute.name().c_str(), cfg.model.position.c_str(),
              double(model.num_params()) / 1e6);
  std::printf("step time: median %.2f ms (min %.2f, max %.2f) over %d steps after %d warm-up\n", med,
              sorted.front(), sorted.back(), o.steps, o.warmup);
  std::printf("throughput: %.0f tokens/s, %.1f TFLOP/s (model FLOPs %.4g/token = 6N + attention)", tok_s,
              tflops, model.flops_per_token());
  if (be.peak_tflops > 0) std::printf(", MFU %.1f%% of %.0f", 100 * tflops / be.peak_tflops, be.peak_tflops);
  std::printf("\n");
  if (!be.gpu_name.empty()) {
    const MemoryPlan plan = plan_memory(cfg, {Device::cuda, be.dtype, 1, 0});
    std::printf("GPU memory in use: %.1f GiB (%.2f GiB for this run; the plan: %.2f GiB)\n",
                double(be.device_memory_used()) / double(1ull << 30),
                double(be.device_memory_used() - used_before) / double(1ull << 30), double(plan.total) / double(1ull << 30));
  }
  std::printf("FLASHGPT_BENCH_TRAIN_JSON {\"B\": %d, \"T\": %d, \"ms_per_step\": %.3f, \"tokens_per_s\": %.1f, \"tflops\": %.2f}\n",
              B, T, med, tok_s, tflops);
#ifdef FLASHGPT_WITH_CUDA
  if (timed) {
    timed->set_enabled(true);
    for (int s = 0; s < o.steps; ++s) {
      step(1000 + s);
      timed->collect();
    }
    std::printf("per-op breakdown (CUDA events around each op call, %d steps):\n%s", o.steps,
                timed->report(o.steps).c_str());
  }
#endif
}

}  // namespace

void add_bench_train_command(CLI::App& bench) {
  auto o = std::make_shared<BenchTrainOptions>();
  auto* cmd = bench.add_subcommand("train", "Time whole training steps (forward, backward, AdamW) on random tokens");
  cmd->add_option("-c,--config", o->config, "YAML config (model, batch_size, seq_len, precision, device)")->capture_default_str()->check(CLI::ExistingFile);
  cmd->add_option("--set", o->sets, "Override a config key (repeatable)");
  cmd->add_option("--warmup", o->warmup, "Untimed steps first")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--steps", o->steps, "Timed steps (the median is reported)")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_flag("--breakdown", o->breakdown, "Per-op time table (CUDA events; GPU only)");
  cmd->callback([o] { run_bench_train(*o); });
}

}  // namespace flashgpt
