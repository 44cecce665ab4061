#include "train/bench_train.h"
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <random>
#include <vector>
#include "layers/gpt2.h"
#include "optim/adamw.h"
#include "src/config.h"
#include "train/backend.h"
#include "train/comm.h"
#include "train/data_parallel.h"
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
  bool comm_profile = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The gradient buckets of one step (the first window of the profile: everything queued
// before finish_gradients()), as a table, and how much of it ran after backward ended.
void print_comm_window(const Communicator::Window& w, int world) {
  std::printf("%-16s %10s %10s %10s %9s %10s %10s\n", "collective", "MB", "ready ms", "start ms", "time ms",
              "algbw GB/s", "busbw GB/s");
  double busy = 0, last_end = 0;
  for (const auto& op : w.ops) {
    const double t = op.end_ms - op.start_ms, algbw = double(op.bytes) / (t * 1e-3) / 1e9;
    // NCCL's bus-bandwidth convention: the bytes each link must carry, per second.
    const double factor = op.op == "all_reduce" ? 2.0 * (world - 1) / world : double(world - 1) / world;
    std::printf("%-16s %10.2f %10.3f %10.3f %9.3f %10.1f %10.1f\n", op.op.c_str(), double(op.bytes) / 1e6,
                op.ready_ms, op.start_ms, t, algbw, algbw * factor);
    busy += t;
    last_end = std::max(last_end, op.end_ms);
  }
  const double exposed = std::max(0.0, last_end - w.wait_ms);
  std::printf("backward ended at %.3f ms; collectives busy %.3f ms, done at %.3f ms: %.3f ms exposed, %.1f%% hidden\n",
              w.wait_ms, busy, last_end, exposed, busy > 0 ? 100.0 * (1.0 - exposed / busy) : 100.0);
}

void run_bench_train(const BenchTrainOptions& o, Communicator& host) {
  Config cfg = load_config(o.config, o.sets);
  const int world = host.world();
  const bool lead = host.rank() == 0;
  Backend be = make_backend(cfg.run.device, cfg.train.precision, host.local_rank(), host.local_world(), /*training=*/true);
  if (be.dtype == DType::bf16) validate_bf16_model(cfg);  // precision auto resolved to bf16
  std::unique_ptr<Communicator> device_comm = make_device_communicator(be, host);
  Communicator& comm = device_comm ? *device_comm : host;
  Ops* ops = be.ops.get();
#ifdef FLASHGPT_WITH_CUDA
  std::unique_ptr<TimedOps> timed;
  Roofline roof;
  if (o.breakdown && be.context) {
    // The ceilings first, while the memory is still free.
    roof = measure_roofline(*be.ops, *static_cast<DeviceContext*>(be.context.get()));
    timed = make_timed_ops(*be.ops, *static_cast<DeviceContext*>(be.context.get()));
    timed->set_enabled(false);
    ops = timed.get();
  }
#endif
  const int B = cfg.train.batch_size, T = cfg.train.seq_len;
  check_memory_fits(cfg, be, world, cfg.train.zero, host.local_world());  // before anything is allocated
  const size_t used_before = be.device_memory_used();
  ModelOptions mopts = model_options(cfg);
  mopts.layer_align = DataParallel::layer_align(world);
  GPT2 model(model_config(cfg), *ops, be.dtype, B, T, mopts);
  model.init_random(cfg.train.seed);
  DataParallel dp(model, comm, cfg.train.zero);
  dp.broadcast_weights();
  AdamW opt(model, adamw_config(cfg), dp.owned());
  // Fresh random tokens (never zeros: they can time faster than real data), other ones
  // on every rank.
  std::mt19937_64 rng(cfg.train.seed + uint64_t(host.rank()));
  std::uniform_int_distribution<int32_t> tok(0, cfg.model.vocab_size - 1);
  // A few batches made up front and rotated, so token generation stays out of the timing.
  constexpr int kBatches = 4;
  std::vector<std::vector<int32_t>> in(kBatches), tg(kBatches);
  for (int k = 0; k < kBatches; ++k) {
    in[k].resize(size_t(B) * T);
    tg[k].resize(size_t(B) * T);
    for (size_t i = 0; i < in[k].size(); ++i) { in[k][i] = tok(rng); tg[k][i] = tok(rng); }
  }
  // One data-parallel step, as train() does it with one micro-batch.
  auto step = [&](int s) {
    model.set_batch(in[s % kBatches].data(), tg[s % kBatches].data());
    model.zero_grad();
    model.forward(float(1.0 / (double(B) * T * world)));
    dp.set_last_micro_batch(true);
    model.backward();
    dp.finish_gradients();
    opt.step(cfg.train.lr, dp.grad_norm(opt), uint32_t(s));
    dp.sync_weights();
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
  const double med = comm.max(sorted[sorted.size() / 2]);  // the slowest rank sets the pace
  const double tok_s = double(B) * T * world / (med / 1e3);
  const double tflops = tok_s * model.flops_per_token() / 1e12 / world;
  const double mem = comm.max(double(be.device_memory_used())), mem_min = comm.min(double(be.device_memory_used()));
  const double opt_bytes = double(opt.m().nbytes() + opt.v().nbytes() + (opt.master().defined() ? opt.master().nbytes() : 0));
  if (lead) {
    std::printf("bench train: %s on %s (%s), B=%d T=%d per rank, attention %s, recompute %s, positions %s, %.2fM params\n",
                o.config.c_str(), be.gpu_name.empty() ? "cpu" : be.gpu_name.c_str(), dtype_name(be.dtype), B, T,
                cfg.model.attention.c_str(), model.options().recompute.name().c_str(), cfg.model.position.c_str(),
                double(model.num_packed()) / 1e6);
    if (dp.active())
      std::printf("ranks: %d (%s), ZeRO-%d, %zu gradient buckets, optimizer state %.2f GB per rank\n", world,
                  comm.name(), cfg.train.zero, dp.bucket_count(), opt_bytes / 1e9);
    std::printf("step time: median %.2f ms (min %.2f, max %.2f on rank 0) over %d steps after %d warm-up\n", med,
                sorted.front(), sorted.back(), o.steps, o.warmup);
    std::printf("throughput: %.0f tokens/s over %d rank(s), %.1f TFLOP/s per rank (model FLOPs %.4g/token = 6N + attention)",
                tok_s, world, tflops, model.flops_per_token());
    if (be.peak_tflops > 0) std::printf(", MFU %.1f%% of %.0f", 100 * tflops / be.peak_tflops, be.peak_tflops);
    std::printf("\n");
    if (!be.gpu_name.empty()) {
      const MemoryPlan plan = plan_memory(cfg, {Device::cuda, be.dtype, world, cfg.train.zero});
      std::printf("GPU memory in use: %.1f GiB per GPU (max over ranks; min %.1f); rank 0: %.2f GiB for this run, "
                  "the plan: %.2f GiB\n", mem / double(1ull << 30), mem_min / double(1ull << 30),
                  double(be.device_memory_used() - used_before) / double(1ull << 30), double(plan.total) / double(1ull << 30));
    }
    std::printf("FLASHGPT_BENCH_TRAIN_JSON {\"B\": %d, \"T\": %d, \"ranks\": %d, \"zero\": %d, \"ms_per_step\": %.3f, "
                "\"tokens_per_s\": %.1f, \"tflops_per_rank\": %.2f, \"gpu_mem_gib\": %.2f, \"optimizer_gb_per_rank\": %.3f}\n",
                B, T, world, cfg.train.zero, med, tok_s, tflops, mem / double(1ull << 30), opt_bytes / 1e9);
  }
  if (o.comm_profile) {
    comm.set_profiling(true);
    std::vector<double> exposed, hidden;
    std::vector<Communicator::Window> last;
    for (int s = 0; s < o.steps; ++s) {
      step(2000 + s);
      last = comm.take_profile();
      if (last.empty()) break;  // not NCCL: nothing is timed
      const auto& w = last.front();
      double busy = 0, end = 0;
      for (const auto& op : w.ops) busy += op.end_ms - op.start_ms, end = std::max(end, op.end_ms);
      exposed.push_back(std::max(0.0, end - w.wait_ms));
      hidden.push_back(busy > 0 ? 1.0 - exposed.back() / busy : 1.0);
    }
    comm.set_profiling(false);
    if (lead && !last.empty()) {
      std::printf("gradient collectives of the last step, rank 0 (ms from the first bucket's release):\n");
      print_comm_window(last.front(), world);
      for (size_t k = 1; k < last.size(); ++k) {
        std::printf("then (after the optimizer):\n");
        print_comm_window(last[k], world);
      }
      std::printf("over %d steps: exposed communication median %.3f ms per step, %.1f%% of it hidden behind backward\n",
                  o.steps, median(exposed), 100.0 * median(hidden));
    } else if (lead) {
      std::printf("--comm-profile: nothing to time (the %s communicator has no GPU timing)\n", comm.name());
    }
  }
#ifdef FLASHGPT_WITH_CUDA
  if (timed) {
    timed->set_enabled(true);
    for (int s = 0; s < o.steps; ++s) {
      step(1000 + s);
      timed->collect();
    }
    if (lead)
      std::printf("per-op breakdown (CUDA events around each op call, %d steps):\n%s", o.steps,
                  timed->report(o.steps, roof, med).c_str());
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
  cmd->add_option("--steps", o->steps, "Timed steps (the median is reported)")->capture_default_str()->check(CLI::Range(1, INT_MAX));
  cmd->add_flag("--breakdown", o->breakdown,
                "Per-op time table (CUDA events; GPU only): achieved TFLOP/s and TB/s against the GEMM rate and copy "
                "bandwidth measured first, and the step time the ops do not account for");
  cmd->add_flag("--comm-profile", o->comm_profile,
                "Under mpirun on GPUs: per-bucket NCCL timing and how much of it backward hides");
  cmd->callback([o] {
    auto comm = make_host_communicator();  // under mpirun: data parallel over the ranks
    on_every_rank(*comm, [&] { run_bench_train(*o, *comm); });
  });
}

}  // namespace flashgpt
