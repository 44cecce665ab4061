#include "train/trainer.h"
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include "data/loader.h"
#include "layers/gpt2.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "src/errors.h"
#include "train/backend.h"
#include "train/checkpoint.h"
#include "train/memory_plan.h"

namespace fs = std::filesystem;

namespace flashgpt {
namespace {

using Clock = std::chrono::steady_clock;

std::string hms(double seconds) {
  long s = long(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

std::string human(double x) {
  char buf[32];
  if (x >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", x / 1e6);
  else if (x >= 1e3) std::snprintf(buf, sizeof buf, "%.1fK", x / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", x);
  return buf;
}

// Mean loss over `batches` batches from the start of `loader`.
double mean_loss(GPT2& model, DataLoader& loader, int batches, std::vector<int32_t>& in,
                 std::vector<int32_t>& tg) {
  loader.reset();
  double sum = 0;
  for (int i = 0; i < batches; ++i) {
    loader.next(in.data(), tg.data());
    model.set_batch(in.data(), tg.data());
    sum += double(model.forward(0.0f));
  }
  return batches ? sum / batches : 0.0;
}

}  // namespace

TrainResult train(const Config& cfg, const std::string& resume) {
  const auto& t = cfg.train;
  const int world = 1, rank = 0;  // single process for now; mpirun support is its own issue
  const int64_t micro_tokens = int64_t(t.batch_size) * t.seq_len * world;
  const int64_t total = t.total_batch ? t.total_batch : micro_tokens;
  if (total % micro_tokens != 0)
    fail_input("config key 'train.total_batch': ", total, " is not a multiple of batch_size·seq_len·ranks = ", micro_tokens);
  const int accum = int(total / micro_tokens);

  Backend be = make_backend(cfg.run.device, t.precision);
  check_memory_fits(cfg, be, world, /*zero=*/0);  // before anything is allocated
  GPT2 model(model_config(cfg), *be.ops, be.dtype, t.batch_size, t.seq_len, model_options(cfg));
  model.init_random(t.seed);
  AdamW opt(model, adamw_config(cfg));
  LRSchedule sched{t.lr, t.warmup_steps, t.steps, t.min_lr_frac, t.schedule};

  DataLoader train_loader({cfg.data.train, t.batch_size, t.seq_len, rank, world, t.seed, true, cfg.model.vocab_size});
  std::unique_ptr<DataLoader> val_loader;
  if (t.eval_steps > 0)
    val_loader = std::make_unique<DataLoader>(
        LoaderOptions{cfg.data.val, t.batch_size, t.seq_len, rank, world, t.seed, false, cfg.model.vocab_size});
  const int val_batches = val_loader ? int(std::min<uint64_t>(uint64_t(t.eval_steps), val_loader->batches_per_epoch())) : 0;

  const std::string config_yaml = config_to_yaml(cfg);
  fs::create_directories(cfg.run.out_dir);
  { std::ofstream(fs::path(cfg.run.out_dir) / "config.yaml") << config_yaml; }
  std::ofstream metrics(fs::path(cfg.run.out_dir) / "metrics.jsonl", std::ios::app);

  int start = 0;
  if (!resume.empty()) {
    std::string dir = resolve_checkpoint(resume);
    CheckpointState st = load_checkpoint(dir, model, opt);
    train_loader.restore(st.loader);
    start = st.step;
    std::printf("resumed from %s at step %d\n", dir.c_str(), start);
  }

  std::printf("--- resolved config ---\n%s-----------------------\n", config_yaml.c_str());
  std::printf("device: %s (%s), params: %.2fM, activations: %.1f MB, grad accumulation: %d, tokens/step: %ld\n",
              be.ops->name().c_str(), dtype_name(be.dtype), double(model.num_params()) / 1e6,
              double(model.activation_bytes()) / 1e6, accum, long(total));
  std::printf("train data: %s (%.2fM tokens)\n", cfg.data.train.c_str(), double(train_loader.total_tokens()) / 1e6);
  std::fflush(stdout);

  const size_t BT = size_t(t.batch_size) * size_t(t.seq_len);
  std::vector<int32_t> in(BT), tg(BT);
  const float dloss = float(1.0 / double(int64_t(BT) * accum));
  TrainResult res;
  auto t0 = Clock::now();
  double window_seconds = 0;
  int window_steps = 0;

  auto save = [&](int step) {
    CheckpointState st{step, train_loader.state(), {}};
    res.last_checkpoint = save_checkpoint(cfg.run.out_dir, model, &opt, st, config_yaml);
  };
  auto validate = [&](int step) {
    if (!val_loader) return;
    double vl = mean_loss(model, *val_loader, val_batches, in, tg);
    res.last_val_loss = vl;
    std::printf("step %5d/%d | val loss %.4f | val ppl %.2f\n", step, t.steps, vl, std::exp(vl));
    metrics << nlohmann::json{{"step", step}, {"val_loss", vl}}.dump() << "\n";
    metrics.flush();
  };

  for (int step = start; step < t.steps; ++step) {
    auto s0 = Clock::now();
    model.zero_grad();
    double loss = 0;
    for (int a = 0; a < accum; ++a) {
      train_loader.next(in.data(), tg.data());
      model.set_batch(in.data(), tg.data());
      loss += double(model.forward(dloss)) / accum;
      model.backward();
    }
    if (!std::isfinite(loss)) fail("loss is ", loss, " at step ", step + 1, ": training diverged (no checkpoint written)");
    const double norm = opt.grad_norm();
    const double lr = sched.at(step);
    opt.step(lr, norm, uint32_t(t.seed) + uint32_t(step));
    be.ops->synchronize();
    const double dt = std::chrono::duration<double>(Clock::now() - s0).count();
    res.steps_done = step + 1;
    res.last_train_loss = loss;
    // Throughput over the steps since the last line (the first step includes warm-up).
    window_seconds += dt;
    ++window_steps;
    if ((step + 1) % t.log_every == 0 || step + 1 == t.steps) {
      const double tok_s = double(total) * window_steps / window_seconds;
      const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
      const double eta = window_seconds / window_steps * (t.steps - step - 1);
      std::string perf;
      if (!be.gpu_name.empty()) {
        const double tflops = tok_s * model.flops_per_token() / 1e12;
        char buf[96];
        if (be.peak_tflops > 0) std::snprintf(buf, sizeof buf, " | MFU %.1f%%", 100.0 * tflops / be.peak_tflops);
        else std::snprintf(buf, sizeof buf, " | %.1f TFLOP/s", tflops);
        perf = buf;
        std::snprintf(buf, sizeof buf, " | mem %.1f GB", double(be.device_memory_used()) / 1e9);
        perf += buf;
      }
      std::printf("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %s tok/s%s | %s elapsed, ETA %s\n",
                  step + 1, t.steps, loss, lr, norm, human(tok_s).c_str(), perf.c_str(),
                  hms(elapsed).c_str(), hms(eta).c_str());
      std::fflush(stdout);
      metrics << nlohmann::json{{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                                {"tokens_per_s", tok_s}, {"elapsed_s", elapsed}}.dump() << "\n";
      metrics.flush();
      window_seconds = 0;
      window_steps = 0;
    }
    const bool last = step + 1 == t.steps;
    if ((t.eval_every && (step + 1) % t.eval_every == 0) || last) validate(step + 1);
    if ((t.checkpoint_every && (step + 1) % t.checkpoint_every == 0) || last) save(step + 1);
  }
  if (start >= t.steps) std::printf("nothing to do: checkpoint is at step %d of %d\n", start, t.steps);
  return res;
}

EvalResult evaluate_checkpoint(const std::string& ckpt, const std::string& pattern, int steps,
                               const std::string& device, int batch_size) {
  std::string dir = resolve_checkpoint(ckpt);
  Config cfg = load_config(checkpoint_config_path(dir), {});
  if (batch_size > 0) cfg.train.batch_size = batch_size;
  const std::string data = pattern.empty() ? cfg.data.val : pattern;
  std::string precision = cfg.train.precision;
  Backend be = make_backend(device, precision == "fp64" && device != "cpu" ? "auto" : precision);
  GPT2 model(model_config(cfg), *be.ops, be.dtype, cfg.train.batch_size, cfg.train.seq_len, model_options(cfg));
  load_model_weights(dir, model);
  DataLoader loader({data, cfg.train.batch_size, cfg.train.seq_len, 0, 1, 0, false, cfg.model.vocab_size});
  const int n = steps > 0 ? int(std::min<uint64_t>(uint64_t(steps), loader.batches_per_epoch()))
                          : int(loader.batches_per_epoch());
  std::vector<int32_t> in(size_t(cfg.train.batch_size) * cfg.train.seq_len), tg(in.size());
  EvalResult r;
  r.loss = mean_loss(model, loader, n, in, tg);
  r.perplexity = std::exp(r.loss);
  r.tokens = long(n) * long(in.size());
  return r;
}

}  // namespace flashgpt
