#include "train/backend.h"
#include <cstdlib>
#include <utility>
#include "src/errors.h"
#ifdef FLASHGPT_WITH_CUDA
#include "src/cuda/device_context.h"
#endif

namespace flashgpt {

bool cuda_available() {
#ifdef FLASHGPT_WITH_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

#ifdef FLASHGPT_WITH_CUDA
// Dense bf16 tensor-core peak (TFLOP/s) of GPUs we know; 0 = unknown (print TFLOP/s).
static double known_peak_tflops(const std::string& name) {
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989.0;
  if (name.find("A100") != std::string::npos) return 312.0;
  return 0.0;
}

// Which GPU this process uses: its rank on the node; or the only visible GPU when the
// launcher binds one GPU per process (CUDA_VISIBLE_DEVICES set per rank).
static int pick_gpu(int local_rank, int local_world) {
  const int n = cuda_device_count();
  if (local_world <= n) return local_rank;
  if (n == 1 && std::getenv("CUDA_VISIBLE_DEVICES")) return 0;
  fail_input(local_world, " processes run on this node but only ", n, " GPU(s) are visible: start at most ", n,
             " rank(s) per node (e.g. mpirun -np ", n, ", or --map-by ppr:", n, ":node for several nodes)");
}
#endif

Backend make_backend(const std::string& device, const std::string& precision, int local_rank, int local_world,
                     bool training) {
  Backend b;
  bool use_cuda = device == "cuda" || (device == "auto" && cuda_available());
  if (device == "cuda" && !cuda_available())
    fail_input("run.device is 'cuda' but ",
#ifdef FLASHGPT_WITH_CUDA
               "no CUDA GPU is visible"
#else
               "this flashgpt was built without CUDA (-DFLASHGPT_CUDA=OFF or no nvcc)"
#endif
    );
  if (use_cuda) {
#ifdef FLASHGPT_WITH_CUDA
    if (precision == "fp64") fail_input("train.precision fp64 is only supported on the CPU");
    b.dtype = precision == "fp32" ? DType::f32 : DType::bf16;
    auto ctx = std::make_shared<DeviceContext>(pick_gpu(local_rank, local_world));
    b.ops = make_cuda_ops(*ctx, /*tune_gemms=*/training && b.dtype == DType::bf16 && gemm_tuning_requested());
    b.gpu_name = ctx->props().name;
    b.context = ctx;
    b.peak_tflops = known_peak_tflops(b.gpu_name);
#endif
  } else {
    if (precision == "bf16") fail_input("train.precision bf16 needs a GPU; use fp32 on the CPU");
    b.dtype = precision == "fp64" ? DType::f64 : DType::f32;
    b.ops = make_cpu_ops();
  }
  return b;
}

ModelConfig model_config(const Config& c) {
  return {c.model.n_layer, c.model.n_head, c.model.n_embd, c.model.vocab_size, c.model.padded_vocab,
          c.model.max_seq_len,
          c.model.position == "rope" ? PositionEncoding::rope : PositionEncoding::learned};
}

void set_model_config(Config& c, const ModelConfig& m) {
  c.model.n_layer = m.n_layer;
  c.model.n_head = m.n_head;
  c.model.n_embd = m.n_embd;
  c.model.vocab_size = m.vocab_size;
  c.model.padded_vocab = m.padded_vocab;
  c.model.max_seq_len = m.max_seq_len;
  c.model.position = position_name(m.position);
}

AttentionAlgo attention_algo(const Config& c) {
  return c.model.attention == "naive" ? AttentionAlgo::naive : AttentionAlgo::flash;
}

bool deterministic_requested() {
  const char* env = std::getenv("FLASHGPT_DETERMINISTIC");
  return env && std::string(env) == "1";
}

bool gemm_tuning_requested() {
  const char* env = std::getenv("FLASHGPT_GEMM_TUNE");
  const std::string v = env && *env ? env : "1";
  if (v != "0" && v != "1") fail_input("FLASHGPT_GEMM_TUNE must be 0 or 1, got '", v, "'");
  return v == "1" && !deterministic_requested();
}

ModelOptions model_options(const Config& c) {
  ModelOptions o(attention_algo(c));
  o.recompute = RecomputePolicy::parse(c.train.recompute);
  o.deterministic = deterministic_requested();
  return o;
}

AdamWConfig adamw_config(const Config& c) {
  const auto& t = c.train;
  return {t.beta1, t.beta2, t.eps, t.weight_decay, t.grad_clip};
}

std::unique_ptr<Communicator> make_device_communicator(Backend& be, Communicator& host) {
#ifdef FLASHGPT_WITH_CUDA
  if (be.context && launched_by_mpi())
    return make_nccl_communicator(host, *static_cast<DeviceContext*>(be.context.get()));
#endif
  return nullptr;
}

std::pair<size_t, size_t> cuda_memory_info() {
  size_t free_b = 0, total_b = 0;
#ifdef FLASHGPT_WITH_CUDA
  if (cuda_available() && cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    free_b = total_b = 0;
  }
#endif
  return {free_b, total_b};
}

size_t Backend::device_memory_used() const {
  if (!context) return 0;
  auto [free_b, total_b] = cuda_memory_info();
  return total_b - free_b;
}
size_t Backend::device_memory_free() const { return context ? cuda_memory_info().first : 0; }
size_t Backend::device_memory_total() const { return context ? cuda_memory_info().second : 0; }

}  // namespace flashgpt
