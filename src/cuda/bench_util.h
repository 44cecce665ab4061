// Helpers of the GPU micro-benchmarks (`bench attention`, `bench decode`, the roofline of
// `bench train --breakdown`): device memory freed on scope exit, random bf16 fills, the
// median time of a call by CUDA events, an L2 flush that leaves no dirty lines, and the
// floors of a memory-bound kernel (a plain read, the decode kernel's reading alone, an
// empty launch).
#pragma once
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
#include "src/cuda/cuda_check.h"
#include "src/errors.h"

namespace flashgpt::bench {

struct DeviceMem {
  void* ptr = nullptr;
  explicit DeviceMem(size_t bytes) { CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(bytes, 16))); }
  ~DeviceMem() { cudaFree(ptr); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
};

// The name of GPU 0; `command` fails with an InputError (exit 2) when there is none.
inline std::string gpu_name_or_fail(const char* command) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    fail_input(command, " needs a CUDA GPU, and none is visible");
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.name;
}

// n random bf16 values in about [-2, 2) (never time on zeros: they can run faster): a
// 64 MiB block drawn once on the host, read from element `offset` on (so that tensors
// filled with different offsets differ), repeated on the device past the block's size.
inline void fill_random_bf16(void* dst, size_t n, size_t offset = 0) {
  constexpr size_t kBlock = size_t(32) << 20;  // elements
  static std::vector<uint16_t> host;
  if (host.empty()) {
    host.resize(kBlock);
    uint32_t x = 2463534242u;
    for (auto& h : host) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      const float f = float(int32_t(x >> 8) - (1 << 23)) / float(1 << 22);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      h = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
  auto* d = static_cast<uint16_t*>(dst);
  const size_t first = std::min(n, kBlock);
  for (size_t at = 0; at < first;) {  // the block from offset, wrapping around
    const size_t from = (offset + at) % kBlock, piece = std::min(first - at, kBlock - from);
    CUDA_CHECK(cudaMemcpy(d + at, host.data() + from, piece * 2, cudaMemcpyHostToDevice));
    at += piece;
  }
  for (size_t at = first; at < n; at += first)
    CUDA_CHECK(cudaMemcpy(d + at, d, std::min(first, n - at) * 2, cudaMemcpyDeviceToDevice));
}

// Reads `bytes` (a multiple of 16) of `buf` with ordinary loads on `stream`. With a
// buffer far larger than the L2, the L2 afterwards holds clean lines of `buf` only: what
// was cached is evicted, and dirty lines are written back during this call, not during
// the next one (a flush by writing leaves the L2 full of dirty lines, whose write-back
// the next kernel's reads then pay for). src/cuda/bench_util.cu.
void read_through_l2(const void* buf, size_t bytes, cudaStream_t stream);

// What reading bytes costs at best (`bench decode --floor`): read_pair reads two buffers
// of bytes_each (a multiple of 16) once with streaming 16-byte loads, 8 in flight per
// thread, 256 threads a block, blocks_per_sm (1-8) blocks on every SM; launch_empty runs
// a kernel that does nothing (a launch's fixed cost as CUDA events see it).
void read_pair(const void* a, const void* b, size_t bytes_each, int blocks_per_sm, cudaStream_t stream);
// The bulk decode kernel's reading alone (`bench decode --floor`): `pairs` (batch, head)
// caches of K and V, head_bytes apart, rows of key_bytes (D·2 in bf16), the first `keys`
// rows of each read in `splits` chunks of whole 16 KB tiles, a block a chunk with
// `threads` threads, through the decode kernel's two shared-memory stages, with no
// scores and no merge: what the decode kernel's reading costs without its arithmetic.
// Returns false, launching nothing, where no sm_90a code was built. With xor_out (device
// memory, the tests), the XOR of every 32-bit word of those rows of K and V is XORed into
// *xor_out.
bool stream_chunks(const void* k, const void* v, int64_t pairs, int64_t head_bytes, int key_bytes, int64_t keys,
                   int splits, int threads, cudaStream_t stream, unsigned* xor_out = nullptr);
void launch_empty(cudaStream_t stream);

// Keeps `stream` busy for about `us` microseconds (one thread waiting on the GPU's global
// timer), so that what the host enqueues behind it meanwhile starts back to back.
void hold_stream(cudaStream_t stream, unsigned us);
// The hold ahead of every timed call: FLASHGPT_BENCH_HOLD_US read once by parse_hold_us:
// 0 to 100000 microseconds, 200 when unset or empty; 0 times each call from an idle GPU,
// launch latency included. Anything else is an InputError.
unsigned hold_us();
inline unsigned parse_hold_us(const char* value) {
  if (!value || !*value) return 200;
  if (std::string(value) == "0") return 0;
  return unsigned(parse_positive_int(value, "FLASHGPT_BENCH_HOLD_US", "0 to 100000 (microseconds)", 100000));
}

// The median of `iters` calls of fn after `warmup` untimed ones, timed by CUDA events on
// `stream`; before() runs ahead of every call, outside the timing (an L2 flush, say).
// Each call is enqueued behind hold_stream(stream, hold_us()), so that the events time the
// GPU's work and not the host's launch latency (scripts/bench_attention.py times PyTorch's
// calls the same way).
template <class Fn, class Before>
float median_ms(Fn&& fn, int warmup, int iters, cudaStream_t stream, Before&& before) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < warmup + iters; ++i) {
    before();
    hold_stream(stream, hold_us());
    CUDA_CHECK(cudaEventRecord(start, stream));
    fn();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (i >= warmup) ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
template <class Fn>
float median_ms(Fn&& fn, int warmup, int iters, cudaStream_t stream) {
  return median_ms(fn, warmup, iters, stream, [] {});
}

// The device copy bandwidth: (read + written) bytes / time of a device-to-device copy of
// `bytes` from src to dst (filled first), the median of `iters` after `warmup`. The
// yardstick of the memory-bound kernels (`bench decode`, the roofline's TB/s ceiling).
inline double copy_tbs(void* dst, void* src, size_t bytes, int warmup, int iters, cudaStream_t stream) {
  CUDA_CHECK(cudaMemsetAsync(src, 1, bytes, stream));
  const double ms = median_ms(
      [&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)); }, warmup, iters, stream);
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e12;
}

}  // namespace flashgpt::bench
