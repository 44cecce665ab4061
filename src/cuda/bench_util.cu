// The kernels behind bench::read_through_l2, read_pair, stream_chunks, launch_empty and
// hold_stream (src/cuda/bench_util.h).
#include <cstdint>
#include <cstdlib>
#include "kernels/cuda/attention/flash_params.h"
#include "kernels/cuda/attention/tma_sm90.cuh"
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

// The bulk decode kernel's reading alone (flash_decode.cu's decode_bulk_kernel, Hopper):
// block (split, pair) streams keys [split·chunk, ...) of its (batch, head) pair's K and V
// (rows of key_bytes, head_bytes apart) through two shared-memory stages of 16 KB tiles
// of K and of V with bulk copies (evict-first), thread 0 issuing, every thread reading its
// 16-byte words of each tile once it has landed; a stage is refilled once the whole block
// has read it. No scores and no merge. The XOR of the 32-bit words read (those of the
// first `keys` rows only) is kept as in read_pair, or with xor_out (the tests) XORed into
// *xor_out by every thread.
constexpr int kStreamTileBytes = 16384, kStreamStages = 2;
constexpr size_t kStreamSmemBytes = size_t(kStreamStages) * 2 * kStreamTileBytes;
template <int kThreads>
__global__ void __launch_bounds__(kThreads) stream_chunks_kernel(const char* __restrict__ k, const char* __restrict__ v,
                                                                 int64_t head_bytes, int key_bytes, int64_t keys,
                                                                 int64_t chunk, unsigned* __restrict__ sink,
                                                                 unsigned* __restrict__ xor_out) {
#if FLASHGPT_HAS_WGMMA
  namespace sm90 = cuda::attn::sm90;
  constexpr int kWords = kStreamTileBytes / 16 / kThreads;  // per thread, tile and tensor
  extern __shared__ __align__(128) unsigned char smem_raw[];
  uint4* const ks = reinterpret_cast<uint4*>(smem_raw);  // [stage][tile]
  uint4* const vs = ks + kStreamStages * kStreamTileBytes / 16;
  __shared__ __align__(8) uint64_t full[kStreamStages];
  const int64_t head = int64_t(blockIdx.y) * head_bytes;
  const int64_t t0 = int64_t(blockIdx.x) * chunk, t1 = t0 + chunk < keys ? t0 + chunk : keys;
  const int64_t tile_keys = kStreamTileBytes / key_bytes;
  const int tiles = int((t1 - t0 + tile_keys - 1) / tile_keys);
  const uint64_t policy = sm90::createpolicy_evict_first();
  auto tile_bytes = [&](int i) {  // tile i's bytes of K (and of V): whole tiles but the chunk's last
    const int64_t first = t0 + int64_t(i) * tile_keys, n = t1 - first < tile_keys ? t1 - first : tile_keys;
    return uint32_t(n * key_bytes);
  };
  auto issue = [&](int i) {
    const int s = i % kStreamStages;
    const int64_t first = t0 + int64_t(i) * tile_keys;
    const uint32_t bytes = tile_bytes(i);
    sm90::mbar_arrive_expect_tx(&full[s], 2 * bytes);
    sm90::bulk_load(ks + s * kStreamTileBytes / 16, k + head + first * key_bytes, bytes, &full[s], policy);
    sm90::bulk_load(vs + s * kStreamTileBytes / 16, v + head + first * key_bytes, bytes, &full[s], policy);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStreamStages; ++s) sm90::mbar_init(&full[s], 1);
    sm90::fence_mbar_init();
    for (int i = 0; i < tiles && i < kStreamStages; ++i) issue(i);
  }
  __syncthreads();
  unsigned x = 0;
  for (int i = 0; i < tiles; ++i) {
    const int s = i % kStreamStages;
    sm90::mbar_wait_spin(&full[s], uint32_t(i / kStreamStages) & 1u);
    const uint32_t words = tile_bytes(i) / 16;
#pragma unroll
    for (int w = 0; w < kWords; ++w) {  // past the chunk's end: stale or unset words, read but not kept
      const int at = w * kThreads + int(threadIdx.x);
      const uint4 a = ks[s * kStreamTileBytes / 16 + at];
      const uint4 b = vs[s * kStreamTileBytes / 16 + at];
      if (uint32_t(at) < words) x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
    }
    __syncthreads();  // the stage is free
    if (threadIdx.x == 0 && i + kStreamStages < tiles) issue(i + kStreamStages);
  }
  if (xor_out) atomicXor(xor_out, x);
  else if (x == 0x9e3779b9u) *sink = x;
#endif
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

bool stream_chunks(const void* k, const void* v, int64_t pairs, int64_t head_bytes, int key_bytes, int64_t keys,
                   int splits, int threads, cudaStream_t stream, unsigned* xor_out) {
  if (!cuda::attn::sm90_kernels_built()) return false;
  FG_ASSERT(threads == 128 || threads == 256, "stream_chunks: 128 or 256 threads, got ", threads);
  FG_ASSERT(key_bytes % 16 == 0 && kStreamTileBytes % key_bytes == 0 && head_bytes % 16 == 0 && splits >= 1 &&
                pairs >= 1 && pairs <= 65535 && keys >= 1,
            "stream_chunks: key_bytes ", key_bytes, ", head_bytes ", head_bytes, ", splits ", splits, ", pairs ", pairs,
            ", keys ", keys);
  // Both kernels into their shared memory, once (one static a kernel: they share a type).
  static const bool opted = cuda::attn::opt_in_dynamic_smem(stream_chunks_kernel<128>, kStreamSmemBytes) &&
                            cuda::attn::opt_in_dynamic_smem(stream_chunks_kernel<256>, kStreamSmemBytes);
  (void)opted;
  const int64_t tile_keys = kStreamTileBytes / key_bytes;
  const int64_t chunk = (keys + splits - 1) / splits;  // then whole tiles, as the decode plan's chunks
  const int64_t tiled = (chunk + tile_keys - 1) / tile_keys * tile_keys;
  const dim3 grid(unsigned((keys + tiled - 1) / tiled), unsigned(pairs));
  const auto kernel = threads == 128 ? stream_chunks_kernel<128> : stream_chunks_kernel<256>;
  kernel<<<grid, unsigned(threads), kStreamSmemBytes, stream>>>(static_cast<const char*>(k), static_cast<const char*>(v),
                                                                 head_bytes, key_bytes, keys, tiled, sink_word(), xor_out);
  CUDA_CHECK_LAUNCH();
  return true;
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
