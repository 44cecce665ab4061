// The memory plan (train/memory_plan.h) on the GPU: the plan against what a training
// step really holds (cudaMemGetInfo before and after: within 5%), the sizes the plan
// mirrors against the functions of the op set, and the pre-flight check stopping
// `train` and `bench train` with exit code 2 before anything is allocated.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include "kernels/cuda/attention/flash_attention.h"
#include "kernels/cuda/cuda_kernels.h"
#include "layers/gpt2.h"
#include "optim/adamw.h"
#include "src/config.h"
#include "tests/gpt2_config.h"
#include "tests/cuda/cuda_test_util.h"
#include "train/backend.h"
#include "train/memory_plan.h"

namespace flashgpt::test {
namespace {

const std::string& kConfig = kGpt2Config;

class CudaMemory : public CudaTest {};

// Device memory in use after one training step, less that in use before the step's
// backend (context, handles, workspace) existed: what `flashgpt memory --measure` reports.
double measure_step(const Config& c) {
  const auto [free0, total0] = cuda_memory_info();
  double used = 0;
  {
    Backend be = make_backend("cuda", "bf16");
    GPT2 m(model_config(c), *be.ops, be.dtype, c.train.batch_size, c.train.seq_len, model_options(c));
    m.init_random(1);
    AdamW opt(m, adamw_config(c));
    std::vector<int32_t> tok(size_t(c.train.batch_size) * c.train.seq_len);
    for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 7919) % 50257);
    m.set_batch(tok.data(), tok.data());
    m.zero_grad();
    m.forward(1.0f / float(tok.size()));
    m.backward();
    opt.step(1e-4, opt.grad_norm(), 0);
    be.ops->synchronize();
    const auto [free1, total1] = cuda_memory_info();
    used = double(free0) - double(free1);
  }
  return used;
}

TEST_F(CudaMemory, PlanIsWithinFivePercentOfWhatAStepHolds) {
  // A first step loads the kernels' code into device memory (lazy module loading) once
  // per process; later points do not pay it, so it is left out of the comparison.
  measure_step(gpt2_124m(1, 1024, "none", "naive", "learned"));
  measure_step(gpt2_124m(1, 1024, "gelu", "flash", "rope"));
  struct Case { int B, T; const char* recompute; const char* attention; const char* position; };
  for (Case k : {Case{16, 1024, "none", "flash", "learned"}, Case{16, 1024, "gelu", "flash", "learned"},
                 Case{1, 32768, "block", "flash", "rope"}, Case{2, 2048, "none", "naive", "learned"},
                 Case{4, 4096, "gelu+ln+attn", "flash", "rope"}}) {
    SCOPED_TRACE(cat("B=", k.B, " T=", k.T, " ", k.recompute, " ", k.attention, " ", k.position));
    const Config c = gpt2_124m(k.B, k.T, k.recompute, k.attention, k.position);
    const double plan = double(plan_memory(c, {Device::cuda, DType::bf16, 1, 0}).total);
    const double measured = measure_step(c);
    std::printf("B=%d T=%d %s %s %s: plan %.3f GiB, measured %.3f GiB (%+.2f%%)\n", k.B, k.T, k.recompute,
                k.attention, k.position, plan / (1 << 30), measured / (1 << 30), 100 * (plan - measured) / measured);
    EXPECT_LE(std::fabs(plan - measured), 0.05 * measured);
  }
}

// The plan's copies of the op set's sizes: the attention dQ accumulator exactly, the
// reusable scratch at least as large as every op asks for.
TEST_F(CudaMemory, PlanMirrorsTheOpSetsScratchSizes) {
  for (auto [B, T, attention] : {std::tuple{64, 1024, "flash"}, std::tuple{1, 1 << 20, "flash"}, std::tuple{4, 2048, "naive"}}) {
    SCOPED_TRACE(cat("B=", B, " T=", T, " ", attention));
    const Config c = gpt2_124m(B, T, "none", attention, "rope");
    const MemoryPlan p = plan_memory(c, {Device::cuda, DType::bf16, 1, 0});
    const int64_t N = int64_t(B) * T, C = 768, H = 12;
    size_t accum = 0, scratch = 0;
    for (const auto& l : p.lines) {
      if (l.name == "attention dQ accumulator (fp32)") accum = l.bytes;
      if (l.group == "op scratch" && l.name.rfind("reductions", 0) == 0) scratch = l.bytes;
    }
    if (std::string(attention) == "flash")
      EXPECT_EQ(accum, cuda::flash_attention_workspace_bytes(B, T, int(H), int(C / H)));
    EXPECT_GE(scratch, cuda::embedding_backward_scratch_bytes(N, 50304));
    EXPECT_GE(scratch, cuda::layernorm_backward_scratch_bytes(N, C));
    EXPECT_GE(scratch, cuda::bias_grad_scratch_bytes(N, 4 * C));
    if (std::string(attention) == "naive") EXPECT_GE(scratch, cuda::attention_naive_scratch_bytes(int(H), T, DType::bf16));
  }
}

// Runs the program; returns (exit code, stderr).
std::pair<int, std::string> run_flashgpt(const std::string& args) {
  ScratchDir dir("flashgpt_preflight_");
  const std::string err = dir.file("err.txt");
  const int status = std::system((std::string(flashgpt_binary()) + " " + args + " >/dev/null 2>" + err).c_str());
  std::ifstream f(err);
  std::stringstream ss;
  ss << f.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ss.str()};
}

// T = 1M with no recompute and the learned position table needs ~330 GiB: train and
// bench train stop before allocating, name what would fit, exit 2.
TEST_F(CudaMemory, PreflightStopsTrainAndBenchWithExit2) {
  const std::string big = " -c " + kConfig + " --set train.batch_size=1 --set train.seq_len=1048576"
                          " --set model.max_seq_len=1048576 --set train.total_batch=0 --set train.steps=1";
  for (const char* cmd : {"train", "bench train"}) {
    auto [rc, err] = run_flashgpt(std::string(cmd) + big);
    EXPECT_EQ(rc, 2) << cmd << ": " << err;
    EXPECT_NE(err.find("needs "), std::string::npos) << err;
    EXPECT_NE(err.find("GiB free; "), std::string::npos) << err;
    EXPECT_NE(err.find("train.recompute="), std::string::npos) << err;
    EXPECT_EQ(err.find("cudaMalloc"), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace flashgpt::test
