// DeviceContext (see device_context.h) and the GPU listing for `flashgpt info`.
#include "src/cuda/device_context.h"
#include <cstdio>
#include "src/cuda/cuda_check.h"

namespace flashgpt {

DeviceContext::DeviceContext(int device) : device_(device) {
  int n = cuda_device_count();
  if (device < 0 || device >= n)
    fail("DeviceContext: CUDA device ", device, " requested but ", n, " visible");
  CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaGetDeviceProperties(&props_, device_));
  CUDA_CHECK(cudaStreamCreateWithFlags(&main_stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
  CUBLAS_CHECK(cublasCreate(&cublas_));
  CUBLAS_CHECK(cublasSetStream(cublas_, main_stream_));
  // Exact fp32 in fp32 runs (the verification mode): no silent TF32.
  CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  CUBLAS_CHECK(cublasSetWorkspace(cublas_, workspace_, kWorkspaceBytes));
}

DeviceContext::~DeviceContext() {
  // Destructors must not throw: report and carry on.
  if (main_stream_) cudaStreamSynchronize(main_stream_);
  if (cublas_) cublasDestroy(cublas_);
  if (cublaslt_) cublasLtDestroy(cublaslt_);
  if (workspace_) cudaFree(workspace_);
  if (comm_stream_) cudaStreamDestroy(comm_stream_);
  if (main_stream_) cudaStreamDestroy(main_stream_);
}

void DeviceContext::synchronize() const { CUDA_CHECK(cudaStreamSynchronize(main_stream_)); }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error; no GPU is not an error here
    return 0;
  }
  return n;
}

std::string describe_gpus() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return cat("no CUDA GPU visible (", cudaGetErrorString(err), ")");
  }
  if (n == 0) return "no CUDA GPU visible";
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::string s = cat(n, " CUDA GPU(s), driver ", driver / 1000, ".", (driver % 1000) / 10,
                      ", runtime ", runtime / 1000, ".", (runtime % 1000) / 10, "\n");
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, i));
    const double dram = cuda::device_dram_bytes_per_s(i);
    char bw[32] = "peak DRAM unknown";
    if (dram > 0) std::snprintf(bw, sizeof bw, "%.2f TB/s peak DRAM", dram / 1e12);
    char line[320];
    std::snprintf(line, sizeof line, "  [%d] %s  cc %d.%d  %.1f GiB  %d SMs  %d MiB L2  %s\n", i, p.name,
                  p.major, p.minor, double(p.totalGlobalMem) / double(1ull << 30), p.multiProcessorCount,
                  p.l2CacheSize >> 20, bw);
    s += line;
  }
  return s;
}

}  // namespace flashgpt
