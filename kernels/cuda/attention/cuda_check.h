// FA_CUDA_CHECK: every CUDA runtime call of the attention kernels goes through it, so a
// failure names the call, the file and the line (DESIGN.md: "every CUDA call is checked").
#pragma once
#include <cuda_runtime.h>
#include "src/errors.h"

#define FA_CUDA_CHECK(call)                                                          \
  do {                                                                               \
    cudaError_t fa_err_ = (call);                                                    \
    if (fa_err_ != cudaSuccess)                                                      \
      ::flashgpt::fail(__FILE__, ":", __LINE__, ": ", #call, " failed: ",            \
                       cudaGetErrorString(fa_err_));                                 \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next call.
#define FA_CHECK_LAUNCH() FA_CUDA_CHECK(cudaGetLastError())
