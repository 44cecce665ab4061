// `flashgpt bench attention`: times the FlashAttention kernels (kernels/cuda/attention/)
// with CUDA events (warm-up, then the median of --iters runs) and prints TFLOP/s with
// the FlashAttention convention:
//   forward  FLOPs = 4·B·H·T²·D   (halved when causal: half the scores are skipped)
//   backward FLOPs = 2.5 × forward (5 matmuls instead of 2)
// --suite runs the standard shapes (hidden 2048, B = 16384/T, T = 1K..16K, D = 64/128,
// causal and not, plus GPT-2 124M); --json prints one JSON object per shape, which
// scripts/bench_attention.py reads to compare with PyTorch SDPA (FA2, cuDNN).
// Only exists with the CUDA backend; without it the subcommand says so and exits 2.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "src/commands.h"
#include "src/errors.h"
#include "train/bench_decode.h"
#include "train/bench_train.h"
#ifdef FLASHGPT_WITH_CUDA
#include <cuda_runtime.h>
#include "kernels/cuda/attention/flash_attention.h"
#include "src/cuda/bench_util.h"
#endif

namespace flashgpt {
namespace {

struct AttentionShape {
  int B, H, T, D;
  bool causal;
};

struct BenchOptions {
  AttentionShape shape{16, 12, 1024, 64, true};
  bool full = false;  // non-causal
  bool suite = false;
  bool json = false;
  int warmup = 3;
  int iters = 10;
};

#ifdef FLASHGPT_WITH_CUDA
std::vector<AttentionShape> standard_suite() {
  std::vector<AttentionShape> shapes;
  constexpr int kHidden = 2048, kTokens = 16384;
  for (int D : {64, 128})
    for (bool causal : {true, false})
      for (int T : {1024, 2048, 4096, 8192, 16384})
        shapes.push_back({kTokens / T, kHidden / D, T, D, causal});
  shapes.push_back({16, 12, 1024, 64, true});  // GPT-2 124M
  return shapes;
}

double forward_flops(const AttentionShape& s) {
  const double f = 4.0 * s.B * s.H * double(s.T) * s.T * s.D;
  return s.causal ? f / 2 : f;
}

using bench::DeviceMem;
using bench::fill_random_bf16;
using bench::median_ms;

void bench_one(const AttentionShape& s, const BenchOptions& opt, cudaStream_t stream) {
  const int64_t tokens = int64_t(s.B) * s.T;
  const int64_t HD = int64_t(s.H) * s.D;
  DeviceMem qkv(tokens * 3 * HD * 2), out(tokens * HD * 2), dout(tokens * HD * 2),
      dqkv(tokens * 3 * HD * 2), lse(tokens * s.H * 4), delta(tokens * s.H * 4),
      ws(cuda::flash_attention_workspace_bytes(s.B, s.T, s.H, s.D));
  fill_random_bf16(qkv.ptr, tokens * 3 * HD, 0);
  fill_random_bf16(dout.ptr, tokens * HD, 12345);

  AttentionForward f;
  f.qkv = Tensor(qkv.ptr, DType::bf16, Device::cuda, {tokens, 3 * HD});
  f.out = Tensor(out.ptr, DType::bf16, Device::cuda, {tokens, HD});
  f.lse = Tensor(lse.ptr, DType::f32, Device::cuda, {int64_t(s.B) * s.H, s.T});
  f.B = s.B, f.T = s.T, f.H = s.H, f.D = s.D, f.causal = s.causal;
  AttentionBackward b;
  b.dqkv = Tensor(dqkv.ptr, DType::bf16, Device::cuda, {tokens, 3 * HD});
  b.dout = Tensor(dout.ptr, DType::bf16, Device::cuda, {tokens, HD});
  b.qkv = f.qkv, b.out = f.out, b.lse = f.lse;
  b.delta = Tensor(delta.ptr, DType::f32, Device::cuda, {int64_t(s.B) * s.H, s.T});
  b.B = s.B, b.T = s.T, b.H = s.H, b.D = s.D, b.causal = s.causal;

  const float fwd_ms = median_ms([&] { cuda::flash_attention_forward(f, stream); }, opt.warmup, opt.iters, stream);
  const float bwd_ms =
      median_ms([&] { cuda::flash_attention_backward(b, ws.ptr, stream); }, opt.warmup, opt.iters, stream);
  const double fwd_tf = forward_flops(s) / (fwd_ms * 1e-3) / 1e12;
  const double bwd_tf = 2.5 * forward_flops(s) / (bwd_ms * 1e-3) / 1e12;
  if (opt.json)
    std::printf("{\"B\": %d, \"H\": %d, \"T\": %d, \"D\": %d, \"causal\": %s, \"fwd_ms\": %.4f, "
                "\"bwd_ms\": %.4f, \"fwd_tflops\": %.1f, \"bwd_tflops\": %.1f}\n",
                s.B, s.H, s.T, s.D, s.causal ? "true" : "false", fwd_ms, bwd_ms, fwd_tf, bwd_tf);
  else
    std::printf("B=%-3d H=%-3d T=%-6d D=%-4d %-7s fwd %8.3f ms %6.1f TFLOP/s   bwd %8.3f ms %6.1f TFLOP/s\n",
                s.B, s.H, s.T, s.D, s.causal ? "causal" : "full", fwd_ms, fwd_tf, bwd_ms, bwd_tf);
  std::fflush(stdout);
}

void run_attention_bench(const BenchOptions& opt) {
  const std::string gpu = bench::gpu_name_or_fail("bench attention");
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  if (!opt.json)
    std::printf("flash attention on %s; fwd FLOPs = 4*B*H*T^2*D (/2 causal), bwd = 2.5x fwd; "
                "median of %d after %d warm-up\n", gpu.c_str(), opt.iters, opt.warmup);
  for (const auto& s : opt.suite ? standard_suite() : std::vector<AttentionShape>{opt.shape})
    bench_one(s, opt, stream);
  CUDA_CHECK(cudaStreamDestroy(stream));
}
#endif

}  // namespace

void add_bench_commands(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto opt = std::make_shared<BenchOptions>();
  auto* attn = bench->add_subcommand(
      "attention", "Time the FlashAttention kernels (TFLOP/s, FlashAttention FLOP convention)");
  attn->add_option("--batch", opt->shape.B, "batch size B")->capture_default_str();
  attn->add_option("--heads", opt->shape.H, "heads H")->capture_default_str();
  attn->add_option("--seq", opt->shape.T, "sequence length T")->capture_default_str();
  attn->add_option("--head-dim", opt->shape.D, "head dim D (64 or 128)")->capture_default_str();
  attn->add_flag("--full", opt->full, "non-causal attention (default: causal)");
  attn->add_flag("--suite", opt->suite, "the standard shapes (hidden 2048, T 1K..16K, D 64/128) + GPT-2 124M");
  attn->add_flag("--json", opt->json, "one JSON object per shape");
  attn->add_option("--warmup", opt->warmup, "warm-up runs")->capture_default_str()->check(CLI::NonNegativeNumber);
  attn->add_option("--iters", opt->iters, "timed runs (median)")->capture_default_str()->check(CLI::Range(1, INT_MAX));
  attn->callback([opt] {
    opt->shape.causal = !opt->full;
#ifdef FLASHGPT_WITH_CUDA
    run_attention_bench(*opt);
#else
    fail_input("bench attention needs the CUDA backend: this flashgpt was built without CUDA");
#endif
  });
  add_bench_train_command(*bench);
  add_bench_comm_command(*bench);
  add_bench_decode_command(*bench);
}

}  // namespace flashgpt
