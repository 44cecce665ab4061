// `flashgpt info`: what this build can do and which GPUs it sees.
#include <cstdio>
#include "src/commands.h"
#include <string>
#include "kernels/cpu/gemm.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef FLASHGPT_WITH_CUDA
#include <nccl.h>
#include "src/cuda/device_context.h"
#endif
#ifdef FLASHGPT_WITH_MPI
#include <mpi.h>
#endif

namespace flashgpt {

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print build features and visible GPUs");
  cmd->callback([] {
#ifdef FLASHGPT_WITH_CUDA
    std::printf("CUDA:   on (archs %s)\n", FLASHGPT_CUDA_ARCHS);
    int nccl = 0;
    ncclGetVersion(&nccl);
    std::printf("NCCL:   on (%d.%d.%d; multi-GPU under mpirun)\n", nccl / 10000, nccl / 100 % 100, nccl % 100);
#else
    std::printf("CUDA:   off (CPU-only build)\nNCCL:   off\n");
#endif
#ifdef FLASHGPT_WITH_MPI
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);  // allowed before MPI_Init
    std::string first(version, size_t(len));
    first = first.substr(0, first.find_first_of(",\n"));
    std::printf("MPI:    on (%s; launch with mpirun -np N)\n", first.c_str());
#else
    std::printf("MPI:    off\n");
#endif
#ifdef _OPENMP
    std::printf("OpenMP: on (%d threads)\n", omp_get_max_threads());
#endif
    const int level = cpu::gemm_level();
    std::printf("CPU:    matmul and cross-entropy kernels x86-64-v%d, %s\n", level,
                level == 4 ? "AVX-512" : level == 3 ? "AVX2" : "SSE4.2");
#ifdef FLASHGPT_WITH_CUDA
    std::printf("GPUs:\n%s\n", describe_gpus().c_str());
#else
    std::printf("GPUs:   none (CPU-only build)\n");
#endif
  });
}

}  // namespace flashgpt
