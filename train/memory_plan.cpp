// The memory plan (memory_plan.h). Where a size below mirrors what another file
// allocates, the comment names that file; tests/cuda/test_cuda_memory.cpp checks the
// mirrors against the real functions and the whole plan against cudaMemGetInfo.
#include "train/memory_plan.h"
#include "train/data_parallel.h"
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include "kernels/cuda/attention/dq_mode.h"
#include "layers/gpt2.h"
#include "src/errors.h"
#include "train/backend.h"
#ifdef FLASHGPT_WITH_CUDA
#include "src/cuda/device_context.h"
#endif

namespace flashgpt {
namespace {

// src/cuda/device_context.h: the cuBLASLt workspace, allocated with the context.
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
#ifdef FLASHGPT_WITH_CUDA
static_assert(kCublasWorkspaceBytes == DeviceContext::kWorkspaceBytes, "mirror of the workspace size");
#endif

size_t align256(size_t n) { return (n + 255) / 256 * 256; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The CUDA op set's reusable scratch buffer (kernels/cuda/cuda_ops.cu, `scratch_`): one
// op uses it at a time, so it grows to the largest of these.
size_t cuda_scratch_bytes(int64_t N, int64_t C, int64_t H, int64_t T, DType act, bool naive) {
  // embedding.cu: 3 int arrays of N, plus CUB's radix-sort temporary storage, which
  // holds the alternate key and value arrays (2·N ints) and per-pass histograms
  // (estimate: 1 MiB; the CUDA test checks that this bounds the real size).
  const size_t embedding = 3 * align256(size_t(N) * 4) + 2 * size_t(N) * 4 + (size_t(1) << 20);
  // layernorm.cu: one (2, C) fp32 partial per block, at most one block per 4 rows, and
  // at most as many as are resident at once (132 SMs × the kernel's cap of 8 a SM).
  const size_t layernorm = size_t(std::min<int64_t>(ceil_div(N, 4), 132 * 8)) * 2 * size_t(C) * 4;
  // bias_grad.cu: one fp32 partial row per split of 512 rows (at most 128), OC ≤ 4C.
  const size_t bias = size_t(std::clamp<int64_t>(ceil_div(N, 512), 1, 128)) * 4 * size_t(C) * 4;
  // attention_naive.cu: dP for one sequence, (H, T, T) of the activation dtype.
  const size_t naive_dp = naive ? size_t(H) * size_t(T) * size_t(T) * dtype_size(act) : 0;
  const size_t sum_squares = 1024 * 4;  // adamw.cu: one partial per block
  return std::max({embedding, layernorm, bias, naive_dp, sum_squares});
}

}  // namespace

size_t MemoryPlan::group_bytes(const std::string& group) const {
  size_t n = 0;
  for (const auto& l : lines)
    if (l.group == group) n += l.bytes;
  return n;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(size_t(1) << 30));
  return buf;
}

MemoryPlan plan_memory(const Config& c, const PlanTarget& target) {
  FG_ASSERT(target.world >= 1 && (target.zero == 0 || target.zero == 1), "world >= 1, zero 0 or 1");
  MemoryPlan p;
  p.B = c.train.batch_size;
  p.T = c.train.seq_len;
  p.attention = c.model.attention;
  p.recompute = RecomputePolicy::parse(c.train.recompute).name();
  p.position = c.model.position;
  p.device = target.device;
  p.dtype = target.dtype;
  p.world = target.world;
  p.zero = target.zero;
  const bool cuda = target.device == Device::cuda;
  ModelOptions opts = model_options(c);
  opts.layer_align = DataParallel::layer_align(target.world);  // as train() builds it
  const ModelMemory mm = GPT2::memory(model_config(c), target.device, target.dtype, p.B, p.T, opts);
  p.num_params = mm.num_params;
  p.activation_bytes = mm.activation_bytes;
  auto add = [&](const char* group, const std::string& name, size_t bytes) {
    p.lines.push_back({group, name, bytes});
  };
  add("parameters", std::string("weights (") + dtype_name(target.dtype) + ")", mm.param_bytes);
  add("gradients", std::string("weight gradients (") + dtype_name(GradDType(target.dtype)) + ")", mm.grad_bytes);

  // optim/adamw.cpp: m and v in fp32 (fp64 in fp64 runs), an fp32 master copy of bf16
  // weights. ZeRO-1 gives each of the `world` ranks one shard of all three.
  const size_t shard = target.zero == 1 ? size_t(ceil_div(int64_t(mm.num_params), target.world)) : mm.num_params;
  const std::string sharding = target.zero == 1 && target.world > 1
                                   ? ", ZeRO-1 shard 1/" + std::to_string(target.world) : "";
  const size_t state = target.dtype == DType::f64 ? 8 : 4;
  add("optimizer", std::string("AdamW m, v (") + (state == 8 ? "fp64" : "fp32") + sharding + ")", 2 * shard * state);
  if (target.dtype == DType::bf16) add("optimizer", "fp32 master weights" + sharding, shard * 4);

  for (const auto& [kind, bytes] : mm.activation_kinds) add("activations", kind, bytes);
  // The activation arena's alignment gaps (each tensor starts on 256 bytes).
  size_t kinds = 0;
  for (const auto& k : mm.activation_kinds) kinds += k.second;
  add("activations", "alignment", mm.activation_bytes - kinds);

  const int64_t N = int64_t(p.B) * p.T, C = c.model.n_embd, H = c.model.n_head;
  const bool naive = c.model.attention == "naive";
  if (cuda) {
    // The bf16 FlashAttention backward's workspace: its fp32 dQ accumulator and work
    // counter (dq_mode.h, which flash_attention.cu sizes it by).
    if (!naive && target.dtype == DType::bf16)
      add("op scratch", "attention dQ accumulator (fp32)", size_t(cuda::attn::backward_workspace_bytes(p.B, p.T, H, C / H)));
    add("op scratch", naive ? "reductions, token sort, naive dP (largest)" : "reductions, token sort (largest)",
        cuda_scratch_bytes(N, C, H, p.T, target.dtype, naive));
    add("workspace", "cuBLASLt workspace", kCublasWorkspaceBytes);
  } else {
    // kernels/cpu/matmul.cpp: the calling thread's buffer of the forward's Wᵀ (C × OC),
    // grown to the largest weight, wte's or the MLP's (the backward transposes nothing).
    const int64_t elems = std::max(c.model.padded_vocab * C, 4 * C * C);
    add("op scratch", "matmul forward's Wᵀ", size_t(elems) * dtype_size(target.dtype));
    // train/checkpoint.cpp, on the host (so counted for CPU runs only): a save holds one
    // arena in the optimizer's dtype (m, v, the master, in turn; the weights go a tensor
    // at a time); a resume holds one such arena and one tensor being read into it.
    add("workspace", "checkpoint save/resume buffer", (mm.num_params + mm.largest_param) * state);
  }
  for (const auto& l : p.lines) p.total += l.bytes;
  return p;
}

std::string memory_shortfall(const Config& c, const PlanTarget& target, size_t free_bytes) {
  auto fits = [&](const MemoryPlan& p) { return p.total + kPreflightMarginBytes <= free_bytes; };
  const MemoryPlan plan = plan_memory(c, target);
  if (fits(plan)) return "";
  const std::string room = target.device == Device::cuda ? cat("the GPU has ", gib(double(free_bytes)), " free")
                                                         : cat("this process may use ", gib(double(free_bytes)),
                                                               " of the host's available memory");
  std::string msg = cat("needs ", gib(double(plan.total)), " (B=", plan.B, ", T=", plan.T,
                        ", model.attention=", plan.attention, ", train.recompute=", plan.recompute, "), ", room);
  // The first setting that fits, cheapest first: policies in order of their cost, then
  // (for naive attention) FlashAttention.
  std::vector<std::pair<std::string, std::string>> tries;  // (attention, recompute)
  for (const char* r : {"gelu", "ln", "gelu+ln", "gelu+ln+attn", "block"}) tries.push_back({c.model.attention, r});
  if (c.model.attention == "naive")
    for (const char* r : {"none", "gelu", "gelu+ln", "block"}) tries.push_back({"flash", r});
  std::string last;
  size_t last_bytes = 0;
  for (const auto& [attention, recompute] : tries) {
    if (attention == plan.attention && recompute == plan.recompute) continue;
    Config d = c;
    d.model.attention = attention;
    d.train.recompute = recompute;
    const MemoryPlan q = plan_memory(d, target);
    std::string change = (attention != c.model.attention ? "model.attention=" + attention + " with " : std::string()) +
                         "train.recompute=" + recompute;
    if (fits(q)) return cat(msg, "; ", change, " would need ", gib(double(q.total)));
    last = change;
    last_bytes = q.total;
  }
  return cat(msg, "; even ", last, " would need ", gib(double(last_bytes)),
             ": lower train.batch_size or train.seq_len");
}

size_t host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  size_t kib = 0;
  while (f >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    std::getline(f, unit);  // the rest of the line ("kB")
  }
  return 0;
}

void check_memory_fits(const Config& c, const Backend& be, int world, int zero, int local_world) {
  const bool cuda = be.context != nullptr;
  size_t room = 0;
  if (cuda) {
    room = be.device_memory_free();
  } else {
    // The host's ranks share its memory; unknown (no /proc/meminfo): no check.
    room = host_memory_available() / size_t(std::max(local_world, 1));
    if (room == 0) return;
  }
  const std::string why = memory_shortfall(c, {cuda ? Device::cuda : Device::cpu, be.dtype, world, zero}, room);
  if (!why.empty())
    fail_input(why, " (", gib(double(kPreflightMarginBytes)), " kept free", cuda ? " for the allocator" : "",
               "; `flashgpt memory` shows the plan by category)");
}

}  // namespace flashgpt
