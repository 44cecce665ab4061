#include "train/trainer.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
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
#include "train/data_parallel.h"
#include "train/load_model.h"
#include "train/memory_plan.h"
#include "train/stop_signals.h"

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
    model.forward(0.0f);
    sum += model.last_loss();
  }
  return batches ? sum / batches : 0.0;
}

// Faults for the tests, read once per run (never set in real runs):
//   FLASHGPT_TEST_FAIL_AT="RANK:STEP"  that rank throws in the middle of that step (after
//       its first forward, while the other ranks go on into the step's collectives);
//   FLASHGPT_TEST_NAN_AT="STEP,STEP,..." at those steps the loss gradient is NaN, so every
//       parameter gradient and the gradient norm are NaN (tests of train.nonfinite).
struct InjectedFaults {
  int fail_rank = -1, fail_step = -1;
  std::vector<int> nan_steps;
  InjectedFaults() {
    if (const char* s = std::getenv("FLASHGPT_TEST_FAIL_AT")) std::sscanf(s, "%d:%d", &fail_rank, &fail_step);
    if (const char* s = std::getenv("FLASHGPT_TEST_NAN_AT")) {
      for (const char* p = s; *p;) {
        char* end = nullptr;
        const long v = std::strtol(p, &end, 10);
        if (end == p) break;
        nan_steps.push_back(int(v));
        p = *end == ',' ? end + 1 : end;
      }
    }
  }
  bool fail(int rank, int step) const { return rank == fail_rank && step == fail_step; }
  bool nan(int step) const { return std::find(nan_steps.begin(), nan_steps.end(), step) != nan_steps.end(); }
};

}  // namespace

TrainResult train(const Config& cfg, const std::string& resume) {
  auto single = make_host_communicator();
  FG_ASSERT(single->world() == 1, "train(cfg, resume) is the single-process entry");
  return train(cfg, resume, *single);
}

TrainResult train(const Config& cfg, const std::string& resume, Communicator& host) {
  const auto& t = cfg.train;
  const int world = host.world(), rank = host.rank();
  const bool lead = rank == 0;
  StopSignals signals;  // from here on a signal stops the run after a step, with a checkpoint
  const int64_t micro_tokens = int64_t(t.batch_size) * t.seq_len * world;
  const int64_t total = t.total_batch ? t.total_batch : micro_tokens;
  if (total % micro_tokens != 0)
    fail_input("config key 'train.total_batch': ", total, " is not a multiple of batch_size·seq_len·ranks = ",
               t.batch_size, "·", t.seq_len, "·", world, " = ", micro_tokens);
  const int accum = int(total / micro_tokens);
  // A new run must not write into another run's directory: its checkpoints would mix with
  // the old run's (replacing those of the same steps), and so would its metrics.
  if (lead && resume.empty()) {
    const std::vector<std::string> old = checkpoints_in(cfg.run.out_dir);
    if (!old.empty())
      fail_input("run.out_dir '", cfg.run.out_dir, "' holds another run's checkpoints (", old.size(), ", newest ",
                 old.back(), "): continue that run with --resume ", cfg.run.out_dir,
                 ", start over in it with --overwrite, or choose another run.out_dir");
  }

  Backend be = make_backend(cfg.run.device, t.precision, host.local_rank(), host.local_world(), /*training=*/true);
  if (be.dtype == DType::bf16) validate_bf16_model(cfg);  // precision auto resolved to bf16
  check_memory_fits(cfg, be, world, t.zero, host.local_world());  // before anything is allocated
  std::unique_ptr<Communicator> device_comm = make_device_communicator(be, host);
  Communicator& comm = device_comm ? *device_comm : host;
  ModelOptions mopts = model_options(cfg);
  mopts.layer_align = DataParallel::layer_align(world);
  GPT2 model(model_config(cfg), *be.ops, be.dtype, t.batch_size, t.seq_len, mopts);
  // Random weights only for a new run: a resumed or fine-tuned one takes every weight from
  // its checkpoint (GPT-2 124M's init draws 124M normals on the host: about 1.4 s).
  if (resume.empty() && t.init_from.empty()) model.init_random(t.seed);
  // Fine-tuning: rank 0 loads the weights, the broadcast below hands them to every rank.
  if (!t.init_from.empty() && resume.empty() && lead) init_from_checkpoint(t.init_from, model);
  DataParallel dp(model, comm, t.zero);
  dp.broadcast_weights();  // the init is deterministic; this makes "identical" a fact
  AdamW opt(model, adamw_config(cfg), dp.owned());
  LRSchedule sched{t.lr, t.warmup_steps, t.steps, t.min_lr_frac, t.schedule};

  const uint64_t rows_per_step = uint64_t(total / t.seq_len);
  DataLoader train_loader({cfg.data.train, t.batch_size, t.seq_len, rank, world, t.seed, true,
                           cfg.model.vocab_size, rows_per_step});
  std::unique_ptr<DataLoader> val_loader;
  if (t.eval_steps > 0)
    val_loader = std::make_unique<DataLoader>(
        LoaderOptions{cfg.data.val, t.batch_size, t.seq_len, rank, world, t.seed, false, cfg.model.vocab_size, 0});
  const int val_batches = val_loader ? int(std::min<uint64_t>(uint64_t(t.eval_steps), val_loader->batches_per_epoch())) : 0;

  const std::string config_yaml = config_to_yaml(cfg);
  std::ofstream metrics;
  if (lead) {
    create_output_dir(cfg.run.out_dir, "run.out_dir");
    std::ofstream(fs::path(cfg.run.out_dir) / "config.yaml") << config_yaml;
    metrics.open(fs::path(cfg.run.out_dir) / "metrics.jsonl", std::ios::app);
  }

  int start = 0;
  if (!resume.empty()) {
    // Rank 0 reads the checkpoint; everything in it reaches the others by broadcast, so
    // only rank 0's filesystem needs it.
    // The optimizer state streams from the file to every rank, one tensor at a time.
    const OptimizerSink sink{opt.m().dtype, DataParallel::state_count(opt),
                             [&](int k, const std::string& bytes) { dp.scatter_state(opt, k, &bytes); }};
    std::string state, dir;
    if (lead) {
      dir = resolve_checkpoint(resume);
      check_checkpoint_model(dir, model, "--resume");
      CheckpointState st = load_checkpoint(dir, model, sink);
      state = nlohmann::json{{"step", st.step}, {"optimizer_step", st.optimizer_step}, {"loader", st.loader}}.dump();
    }
    const nlohmann::json st = nlohmann::json::parse(comm.broadcast_string(state, 0));
    dp.broadcast_weights();
    if (lead) load_optimizer_state(dir, model, sink);
    else
      for (int k = 0; k < sink.count; ++k) dp.scatter_state(opt, k, nullptr);
    opt.set_steps_done(st.at("optimizer_step").get<int>());
    train_loader.restore(st.at("loader"));
    start = st.at("step").get<int>();
    if (lead) std::printf("resumed from %s at step %d\n", dir.c_str(), start);
  }

  if (lead) {
    std::printf("--- resolved config ---\n%s-----------------------\n", config_yaml.c_str());
    std::printf("device: %s (%s), params: %.2fM, activations: %.1f MB, grad accumulation: %d, tokens/step: %ld\n",
                be.ops->name().c_str(), dtype_name(be.dtype), double(model.num_packed()) / 1e6,
                double(model.activation_bytes()) / 1e6, accum, long(total));
    if (dp.active())
      std::printf("ranks: %d (%s), ZeRO-%d, %zu gradient buckets\n", world, comm.name(), t.zero, dp.bucket_count());
    std::printf("train data: %s (%.2fM tokens)\n", cfg.data.train.c_str(), double(train_loader.total_tokens()) / 1e6);
    std::fflush(stdout);
  }

  const size_t BT = size_t(t.batch_size) * size_t(t.seq_len);
  std::vector<int32_t> in(BT), tg(BT);
  // The gradient of the global mean loss: each rank's sum over its micro-batches, summed
  // over ranks by the data-parallel reduction.
  const float dloss = float(1.0 / (double(BT) * accum * world));
  TrainResult res;
  const InjectedFaults faults;
  int skipped_in_row = 0, skipped = 0;
  int saved_step = -1;
  auto t0 = Clock::now();
  double window_seconds = 0;
  int window_steps = 0;

  auto save = [&](int step) {
    if (saved_step == step) return;
    // Rank 0 writes; the optimizer state is gathered to it tensor by tensor as the file
    // is written (collective: the other ranks take part in each gather).
    const OptimizerSource source{opt.steps_done(), opt.m().dtype, DataParallel::state_count(opt),
                                 [&](int k, std::string& bytes) { dp.gather_state(opt, k, &bytes); }};
    if (lead) {
      CheckpointState st{step, train_loader.state(), {}};
      res.last_checkpoint = save_checkpoint(cfg.run.out_dir, model, &source, st, config_yaml, t.keep_checkpoints);
    } else {
      for (int k = 0; k < source.count; ++k) dp.gather_state(opt, k, nullptr);
    }
    saved_step = step;
  };
  auto validate = [&](int step) {
    if (!val_loader) return;
    const double vl = comm.mean(mean_loss(model, *val_loader, val_batches, in, tg));
    res.last_val_loss = vl;
    if (!lead) return;
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
      model.forward(faults.nan(step + 1) ? std::numeric_limits<float>::quiet_NaN() : dloss);
      loss += model.last_loss() / accum;  // double: fp64 runs keep every digit
      if (faults.fail(rank, step + 1)) fail("injected failure (FLASHGPT_TEST_FAIL_AT) at step ", step + 1);
      dp.set_last_micro_batch(a + 1 == accum);
      model.backward();
    }
    dp.finish_gradients();
    // One host collective per step: the global mean loss, and whether any rank got a
    // stop signal (then every rank stops after this same step).
    const std::vector<double> gathered = comm.all_gather_host({loss, double(signals.requested())});
    double loss_sum = 0;
    int stop_signal = 0;
    for (int r = 0; r < world; ++r) {
      loss_sum += gathered[size_t(2 * r)];  // rank order: the same bits everywhere
      stop_signal = std::max(stop_signal, int(gathered[size_t(2 * r + 1)]));
    }
    loss = loss_sum / world;
    const double norm = dp.grad_norm(opt);
    const double lr = sched.at(step);
    // A NaN/Inf loss or gradient norm (the same value on every rank) is caught here,
    // before it can reach the weights or a checkpoint.
    const bool finite = std::isfinite(loss) && std::isfinite(norm);
    if (!finite) {
      const std::string what = cat("non-finite ", std::isfinite(loss) ? "gradient norm" : "loss", " at step ",
                                   step + 1, " (loss ", loss, ", gradient norm ", norm, ")");
      const std::string last = saved_step >= 0 ? cat("the last checkpoint is step ", saved_step)
                                               : std::string("no checkpoint was written in this run");
      if (t.nonfinite == "abort")
        fail(what, ": training stopped (train.nonfinite=abort); nothing was written from this state, ", last);
      ++skipped;
      if (++skipped_in_row >= t.nonfinite_limit)
        fail(what, ": ", skipped_in_row, " non-finite steps in a row (train.nonfinite_limit); ", last);
      if (lead) {
        std::printf("step %5d/%d | %s: update skipped (%d in a row, %d in all)\n", step + 1, t.steps, what.c_str(),
                    skipped_in_row, skipped);
        metrics << nlohmann::json{{"step", step + 1}, {"skipped", true}, {"skips", skipped},
                                  {"loss", std::isfinite(loss) ? nlohmann::json(loss) : nlohmann::json(nullptr)}}.dump()
                << "\n";
        metrics.flush();
      }
    } else {
      skipped_in_row = 0;
      opt.step(lr, norm, uint32_t(t.seed) + uint32_t(step));
      dp.sync_weights();
    }
    be.ops->synchronize();
    const double dt = std::chrono::duration<double>(Clock::now() - s0).count();
    res.steps_done = step + 1;
    res.last_train_loss = loss;
    // Throughput over the steps since the last line (the first step includes warm-up).
    window_seconds += dt;
    ++window_steps;
    if (finite && ((step + 1) % t.log_every == 0 || step + 1 == t.steps)) {
      const double mem = be.gpu_name.empty() ? 0.0 : comm.max(double(be.device_memory_used()));  // collective
      const double tok_s = double(total) * window_steps / window_seconds;
      const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
      const double eta = window_seconds / window_steps * (t.steps - step - 1);
      std::string perf;
      if (!be.gpu_name.empty()) {
        const double tflops = tok_s * model.flops_per_token() / 1e12 / world;  // per GPU
        char buf[96];
        if (be.peak_tflops > 0) std::snprintf(buf, sizeof buf, " | MFU %.1f%%", 100.0 * tflops / be.peak_tflops);
        else std::snprintf(buf, sizeof buf, " | %.1f TFLOP/s/GPU", tflops);
        perf = buf;
        std::snprintf(buf, sizeof buf, world > 1 ? " | mem %.1f GB/GPU" : " | mem %.1f GB", mem / 1e9);
        perf += buf;
      }
      if (lead) {
        std::printf("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %s tok/s%s | %s elapsed, ETA %s\n",
                    step + 1, t.steps, loss, lr, norm, human(tok_s).c_str(), perf.c_str(),
                    hms(elapsed).c_str(), hms(eta).c_str());
        std::fflush(stdout);
        nlohmann::json line{{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                            {"tokens_per_s", tok_s}, {"elapsed_s", elapsed}};
        if (skipped) line["skips"] = skipped;
        metrics << line.dump() << "\n";
        metrics.flush();
      }
      window_seconds = 0;
      window_steps = 0;
    }
    const bool last = step + 1 == t.steps;
    if ((t.eval_every && (step + 1) % t.eval_every == 0) || last) validate(step + 1);
    if ((t.checkpoint_every && (step + 1) % t.checkpoint_every == 0) || last) save(step + 1);
    if (const int sig = stop_signal) {
      save(step + 1);
      res.stop_signal = sig;
      if (lead)
        std::printf("stopped by %s after step %d: checkpoint %s; continue with --resume %s\n",
                    StopSignals::name(sig), step + 1, res.last_checkpoint.c_str(), cfg.run.out_dir.c_str());
      break;
    }
  }
  if (t.steps == 0 && resume.empty()) {
    // The model as initialised (or as --init-from loaded it): a baseline for eval, or a
    // starting point to share.
    validate(0);
    save(0);
    if (lead) std::printf("train.steps=0: no step taken; the initial model is checkpoint %s\n", res.last_checkpoint.c_str());
  } else if (start >= t.steps && lead) {
    std::printf("nothing to do: checkpoint is at step %d of %d\n", start, t.steps);
  }
  return res;
}

EvalResult evaluate_checkpoint(const std::string& ckpt, const std::string& pattern, int steps,
                               const std::string& device, int batch_size) {
  std::string dir = resolve_checkpoint(ckpt);
  Config cfg = load_checkpoint_config(dir);
  if (batch_size > 0) cfg.train.batch_size = batch_size;
  const std::string data = pattern.empty() ? cfg.data.val : pattern;
  std::string precision = cfg.train.precision;
  Backend be = make_backend(device, precision == "fp64" && device != "cpu" ? "auto" : precision);
  if (be.dtype == DType::bf16) validate_bf16_model(cfg);
  ModelOptions opts = model_options(cfg);
  opts.gradients = false;  // forward only
  GPT2 model(model_config(cfg), *be.ops, be.dtype, cfg.train.batch_size, cfg.train.seq_len, opts);
  load_model_weights(dir, model);
  DataLoader loader({data, cfg.train.batch_size, cfg.train.seq_len, 0, 1, 0, false, cfg.model.vocab_size, 0});
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
