// Checked CUDA / cuBLAS / cuBLASLt calls. Every runtime or library call in the CUDA
// backend goes through one of these macros, so that a failure names the call, the
// file and the line (a bug or a failing system call: std::runtime_error, exit code 1).
// Also the current device's attributes, which every layer of the backend reads.
//   CUDA_CHECK(cudaMemcpyAsync(...));
//   CUBLAS_CHECK(cublasLtMatmul(...));      // cublasStatus_t, from cuBLAS or cuBLASLt
//   CUDA_CHECK_LAUNCH();                    // after a <<<...>>> launch
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include "src/errors.h"

#define CUDA_CHECK(call)                                                               \
  do {                                                                                 \
    cudaError_t fg_err_ = (call);                                                      \
    if (fg_err_ != cudaSuccess)                                                        \
      ::flashgpt::fail(__FILE__, ":", __LINE__, ": ", #call, " failed: ",              \
                       cudaGetErrorName(fg_err_), " (", cudaGetErrorString(fg_err_), ")"); \
  } while (0)

#define CUBLAS_CHECK(call)                                                             \
  do {                                                                                 \
    cublasStatus_t fg_st_ = (call);                                                    \
    if (fg_st_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::flashgpt::fail(__FILE__, ":", __LINE__, ": ", #call, " failed: ",              \
                       cublasGetStatusName(fg_st_), " (", cublasGetStatusString(fg_st_), ")"); \
  } while (0)

// A kernel launch reports configuration errors (bad grid, too much shared memory)
// through cudaGetLastError; asynchronous faults surface at the next synchronising call.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace flashgpt::cuda {

// The current device's ordinal (host code).
inline int current_device() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

// An attribute of the current device (host code; launchers cache it where it is per call).
inline int current_device_attribute(cudaDeviceAttr attr) {
  int value = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, current_device()));
  return value;
}

// Peak DRAM bandwidth of `device` in bytes/s: two transfers a memory clock (kHz) over the
// bus (bits), for `flashgpt info`; 0 (unknown) where the driver does not report them:
// information only, so never an error.
inline double device_dram_bytes_per_s(int device) {
  int khz = 0, bits = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
    cudaGetLastError();  // clear it: nothing failed that a caller needs
    return 0;
  }
  return 2.0 * 1e3 * khz * bits / 8;
}

// SMs of the current device, read once: one process drives one GPU (docs/ARCHITECTURE.md).
inline int device_sm_count() {
  static const int sms = current_device_attribute(cudaDevAttrMultiProcessorCount);
  return sms;
}

}  // namespace flashgpt::cuda
