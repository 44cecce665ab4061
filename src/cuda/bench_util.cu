// The kernels behind bench::read_through_l2, read_pair, launch_empty and hold_stream
// (src/cuda/bench_util.h).
#include <cstdint>
#include <cstdlib>
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

// Both buffers (n 16-byte words each) once, with streaming loads: every thread keeps
// 2·kUnroll loads in flight per iteration, a grid of blocks_per_sm blocks on every SM
// strides over them. Kept alive as above.
constexpr int kReadUnroll = 4;
__global__ void __launch_bounds__(256) read_pair_kernel(const uint4* __restrict__ a, const uint4* __restrict__ b,
                                                        int64_t n, unsigned* __restrict__ sink) {
  unsigned x = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i0 = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i0 < n; i0 += stride * kReadUnroll) {
    uint4 va[kReadUnroll], vb[kReadUnroll];
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) {
      const int64_t i = i0 + u * stride;
      if (i < n) va[u] = __ldcs(a + i), vb[u] = __ldcs(b + i);
      else va[u] = vb[u] = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) x ^= va[u].x ^ va[u].y ^ va[u].z ^ va[u].w ^ vb[u].x ^ vb[u].y ^ vb[u].z ^ vb[u].w;
  }
  if (x == 0x9e3779b9u) *sink = x;
}

__global__ void empty_kernel() {}

__global__ void hold_kernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

unsigned* sink_word() {
  static unsigned* sink = [] {
    unsigned* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, sizeof(unsigned)));
    return p;
  }();
  return sink;
}

}  // namespace

void read_pair(const void* a, const void* b, size_t bytes_each, int blocks_per_sm, cudaStream_t stream) {
  FG_ASSERT(bytes_each % 16 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0,
            "read_pair: 16-byte multiples");
  FG_ASSERT(blocks_per_sm >= 1 && blocks_per_sm <= 8, "read_pair: 1-8 blocks an SM, got ", blocks_per_sm);
  read_pair_kernel<<<unsigned(cuda::device_sm_count() * blocks_per_sm), 256, 0, stream>>>(
      static_cast<const uint4*>(a), static_cast<const uint4*>(b), int64_t(bytes_each / 16), sink_word());
  CUDA_CHECK_LAUNCH();
}

void launch_empty(cudaStream_t stream) {
  empty_kernel<<<1, 32, 0, stream>>>();
  CUDA_CHECK_LAUNCH();
}

void hold_stream(cudaStream_t stream, unsigned us) {
  if (us == 0) return;
  hold_kernel<<<1, 1, 0, stream>>>(uint64_t(us) * 1000);
  CUDA_CHECK_LAUNCH();
}

unsigned hold_us() {
  static const unsigned us = parse_hold_us(std::getenv("FLASHGPT_BENCH_HOLD_US"));
  return us;
}

void read_through_l2(const void* buf, size_t bytes, cudaStream_t stream) {
  FG_ASSERT(bytes % 16 == 0 && reinterpret_cast<uintptr_t>(buf) % 16 == 0, "read_through_l2: 16-byte multiples");
  read_through_kernel<<<unsigned(cuda::device_sm_count()) * 8, 256, 0, stream>>>(static_cast<const uint4*>(buf), int64_t(bytes / 16),
                                                                     sink_word());
  CUDA_CHECK_LAUNCH();
}

}  // namespace flashgpt::bench
