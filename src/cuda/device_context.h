// DeviceContext: everything the CUDA backend needs from "the GPU", in one object that
// the caller creates once and passes by reference (no globals): the device ordinal,
// its properties, the main compute stream, a stream for communication, the cuBLAS and
// cuBLASLt handles and the cuBLASLt workspace. All kernels of one training step run
// on main_stream() in order, so no op needs to synchronise with another.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <string>

namespace flashgpt {

class DeviceContext {
 public:
  // Binds this thread to `device` and creates the streams and handles.
  // Throws std::runtime_error when no such device is visible.
  explicit DeviceContext(int device = 0);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int device() const { return device_; }
  const cudaDeviceProp& props() const { return props_; }
  int sm_count() const { return props_.multiProcessorCount; }
  cudaStream_t main_stream() const { return main_stream_; }
  cudaStream_t comm_stream() const { return comm_stream_; }
  cublasLtHandle_t cublaslt() const { return cublaslt_; }
  cublasHandle_t cublas() const { return cublas_; }  // bound to main_stream()
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return kWorkspaceBytes; }
  void synchronize() const;

  // 32 MiB: what cuBLAS recommends for Hopper (the larger split-K / stream-K
  // algorithms need it); smaller workspaces silently restrict the algorithm choice.
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;

 private:
  int device_ = 0;
  cudaDeviceProp props_{};
  cudaStream_t main_stream_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
  cublasLtHandle_t cublaslt_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* workspace_ = nullptr;
};

// Number of visible CUDA devices; 0 (not an error) when there is no driver or GPU.
int cuda_device_count();
// One line per visible GPU: index, name, compute capability, memory, SMs; or
// "no CUDA GPU visible" (with the reason the runtime gave). For `flashgpt info`.
std::string describe_gpus();

}  // namespace flashgpt
