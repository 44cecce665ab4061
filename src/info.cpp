// `flashgpt info`: what this build can do and which GPUs it sees.
#include <cstdio>
#include "src/commands.h"
#ifdef FLASHGPT_WITH_CUDA
#include "src/cuda/device_context.h"
#endif

namespace flashgpt {

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print build features and visible GPUs");
  cmd->callback([] {
#ifdef FLASHGPT_WITH_CUDA
    std::printf("CUDA:   on (archs %s)\n", FLASHGPT_CUDA_ARCHS);
    std::printf("NCCL:   on\n");
#else
    std::printf("CUDA:   off (CPU-only build)\nNCCL:   off\n");
#endif
#ifdef FLASHGPT_WITH_MPI
    std::printf("MPI:    on\n");
#else
    std::printf("MPI:    off\n");
#endif
#ifdef _OPENMP
    std::printf("OpenMP: on\n");
#endif
#ifdef FLASHGPT_WITH_CUDA
    std::printf("GPUs:\n%s\n", describe_gpus().c_str());
#else
    std::printf("GPUs:   none (CPU-only build)\n");
#endif
  });
}

}  // namespace flashgpt
