// Picks the compute backend for a run: CPU ops (fp32/fp64) or CUDA ops (bf16/fp32),
// from run.device and train.precision; and turns a Config into the settings of the
// model and the optimizer (shared by train, eval and bench).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include "kernels/ops.h"
#include "layers/gpt2.h"
#include "optim/adamw.h"
#include "src/config.h"
#include "train/comm.h"

namespace flashgpt {

struct Backend {
  std::shared_ptr<void> context;  // the CUDA DeviceContext when on a GPU (opaque here)
  std::unique_ptr<Ops> ops;
  DType dtype = DType::f32;       // activation / weight dtype
  std::string gpu_name;           // empty on the CPU
  double peak_tflops = 0;         // dense bf16 peak of this GPU, 0 if unknown
  size_t device_memory_used() const;  // bytes in use on the GPU (0 on the CPU)
  size_t device_memory_free() const;  // bytes free on the GPU (0 on the CPU)
  size_t device_memory_total() const; // the GPU's memory (0 on the CPU)
};

// device: auto | cpu | cuda; precision: auto | bf16 | fp32 | fp64. On CUDA, the
// process takes GPU `local_rank` of the node (under mpirun: its rank among the node's
// `local_world` processes); InputError when the node has fewer GPUs than processes.
// training: the caller repeats the same step many times (train, bench train), so a bf16
// CUDA backend tunes its GEMM algorithms in place (gemm_tuning_requested); eval, sample
// and the memory measurements keep cuBLASLt's first choice (short runs, whose choice then
// does not depend on timings).
Backend make_backend(const std::string& device, const std::string& precision, int local_rank = 0,
                     int local_world = 1, bool training = false);
// The communicator for this backend's tensors: NCCL on a GPU when the job was started
// by an MPI launcher (also with one rank, so that path can be tested on one GPU), else
// nullptr: use `host` itself (CPU tensors through MPI, or the single process).
std::unique_ptr<Communicator> make_device_communicator(Backend& be, Communicator& host);
bool cuda_available();  // built with CUDA and at least one GPU visible
// (free, total) bytes of device memory of the current GPU (initialises the CUDA
// context); (0, 0) without a GPU.
std::pair<size_t, size_t> cuda_memory_info();

ModelConfig model_config(const Config& c);
// The inverse: writes m's shape and position encoding into c.model.
void set_model_config(Config& c, const ModelConfig& m);
AttentionAlgo attention_algo(const Config& c);  // model.attention
// model.attention, train.recompute, and FLASHGPT_DETERMINISTIC=1 from the environment.
ModelOptions model_options(const Config& c);
bool deterministic_requested();  // FLASHGPT_DETERMINISTIC=1
// FLASHGPT_GEMM_TUNE = 1 (the default) | 0, and never in deterministic mode: whether a
// CUDA backend in bf16 times cuBLASLt's candidate algorithms in place (Matmul::tune).
bool gemm_tuning_requested();
AdamWConfig adamw_config(const Config& c);

}  // namespace flashgpt
