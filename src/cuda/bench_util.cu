// The kernel behind bench::read_through_l2 (src/cuda/bench_util.h).
#include <cstdint>
#include "src/cuda/bench_util.h"

namespace flashgpt::bench {
namespace {

// Every 16 bytes of buf once, by plain (L2-allocating) loads. The XOR of what was read is
// stored only if it equals a value it practically never does, so the loads are kept.
__global__ void read_through_kernel(const uint4* __restrict__ buf, int64_t n, unsigned* __restrict__ sink) {
  unsigned x = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = buf[i];
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9e3779b9u) *sink = x;
}

}  // namespace

void read_through_l2(const void* buf, size_t bytes, cudaStream_t stream) {
  FG_ASSERT(bytes % 16 == 0 && reinterpret_cast<uintptr_t>(buf) % 16 == 0, "read_through_l2: 16-byte multiples");
  static unsigned* sink = [] {
    unsigned* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, sizeof(unsigned)));
    return p;
  }();
  int dev = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  read_through_kernel<<<unsigned(sms) * 8, 256, 0, stream>>>(static_cast<const uint4*>(buf), int64_t(bytes / 16), sink);
  CUDA_CHECK_LAUNCH();
}

}  // namespace flashgpt::bench
