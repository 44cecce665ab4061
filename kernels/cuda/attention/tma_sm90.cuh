// Hopper (sm_90a) asynchronous-copy building blocks for the warp-specialised forward
// (flash_fwd_sm90_ws.cu), the backward (flash_bwd_sm90.cu) and the bulk-copy decode
// (flash_decode.cu): TMA tile loads (cp.async.bulk.tensor) and plain bulk copies that
// complete on an mbarrier, TMA reduce-adds tracked by bulk groups, the
// mbarrier operations, register reallocation between warpgroups (setmaxnreg), named
// barriers, and the cluster barrier with stores into another block's shared memory. Only
// compiled into sm_90a code (FLASHGPT_HAS_WGMMA).
#pragma once
#include <cuda.h>  // CUtensorMap (the type only: the map is encoded on the host)
#include <cstdint>
#include "kernels/cuda/attention/wgmma_sm90.cuh"

namespace flashgpt::cuda::attn::sm90 {

#if FLASHGPT_HAS_WGMMA
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA) and the other threads
// (with the __syncthreads that follows).
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(bar)) : "memory");
}
// `count` arrivals at once (one thread standing in for others that have nothing to do).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar, uint32_t count) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}
// Waits until the phase of parity `parity` has completed. A pipeline bug would otherwise
// hang the GPU: after 2^28 unsuccessful tries (seconds) the kernel traps instead. The
// loop is inside the asm: as a C++ loop (each thread leaving it on its own) it made ptxas
// treat the code after it as divergent, and the warp-specialised forward's consumers were
// then allocated within the launch's even share of registers (168 at 384 threads), not
// the 240 (160 with three consumers) that setmaxnreg gives them: the overlapped step
// spilled at D = 128 and with three consumers at D = 64 (scripts/ptxas_report.sh).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done, more;\n.reg .u32 tries;\nmov.u32 tries, 0;\n"
      "WAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@done bra.uni DONE_%=;\n"
      "add.u32 tries, tries, 1;\nsetp.lt.u32 more, tries, 268435456;\n@more bra.uni WAIT_%=;\ntrap;\n"
      "DONE_%=:\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
// The same wait as a C++ loop around one try: the sm90 backward and the decode kernel,
// which use no setmaxnreg, keep the code they were measured with. The backward with
// mbar_wait instead measured the same within noise (BENCHMARKS.md "Thirteenth session":
// 38.23-38.31 ms against 38.13-38.14 at T = 65,536, the sweep within -3%..+2%), so it
// did not move.
// kClusterAcquire: acquire at cluster scope (the wait for other blocks'
// store_async_in_block), not the default, the block's.
template <bool kClusterAcquire = false>
__device__ __forceinline__ void mbar_wait_spin(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_u32(bar);
  for (uint32_t tries = 0;; ++tries) {
    uint32_t done;
    if constexpr (kClusterAcquire)
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(addr), "r"(parity)
          : "memory");
    else
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(addr), "r"(parity)
          : "memory");
    if (done) return;
    if (tries == (1u << 28)) __trap();
  }
}

// TMA: the box at coordinates (c0, c1, c2) of the 3-D tensor map → shared memory at dst;
// completion (its bytes) is counted on bar.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// The same, the lines it brings into the L2 under the cache policy `policy`
// (createpolicy_evict_first): the decode's reading of a cache once.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                            uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%3, "
      "%4, %5}], [%2], %6;\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "l"(policy)
      : "memory");
}

// Programmatic dependent launch (the decode kernels, flash_decode.cu). griddep_wait holds
// the thread until the grids before this one in the stream have completed and their
// writes are visible; it returns at once where the launch did not ask to overlap them.
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// Thread-block clusters (the decode's merge of a cache's splits, flash_decode.cu). The
// cluster barrier, arrived at without ordering anything (`relaxed`): a block's arrival at
// its start tells the others, once their wait returns, that it runs, so that they may
// store into its shared memory.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }
// Stores v at `p` (an address in this block's shared memory) in block `rank`'s shared
// memory instead (st.async), its 4 bytes counted on block `rank`'s copy of `bar` (a
// complete_tx with release semantics at cluster scope); the receiving block waits on that
// barrier with mbar_wait_spin<true>. The sender need not wait for it.
__device__ __forceinline__ void store_async_in_block(const float* p, uint32_t rank, float v, uint64_t* bar) {
  asm volatile(
      "{\n.reg .b32 a, b;\nmapa.shared::cluster.u32 a, %0, %1;\nmapa.shared::cluster.u32 b, %3, %1;\n"
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [a], %2, [b];\n}\n" ::"r"(smem_u32(p)),
      "r"(rank), "r"(__float_as_uint(v)), "r"(smem_u32(bar))
      : "memory");
}

// Bulk copy (no tensor map): `bytes` contiguous bytes (a multiple of 16, both addresses
// 16-byte aligned) from global memory to shared memory at dst; completion is counted on
// bar. The lines it brings into the L2 take the cache policy `policy`
// (createpolicy_evict_first).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

// Bulk-group TMA stores (the backward's dQ): the box at (c0, c1, c2) of the fp32 tensor
// map += the box in shared memory at src (elements outside the tensor are skipped).
__device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// Bulk-group reduce-add without a tensor map: `bytes` contiguous fp32 (a multiple of 16,
// both addresses 16-byte aligned) at dst in global memory += those in shared memory at
// src, under the L2 cache policy `policy` (createpolicy_evict_last) for the lines it adds to.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const void* src, uint32_t bytes, uint64_t policy) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.L2::cache_hint.add.f32 [%0], [%1], %2, %3;\n" ::"l"(
                   reinterpret_cast<uint64_t>(dst)),
               "r"(smem_u32(src)), "r"(bytes), "l"(policy)
               : "memory");
}
__device__ __forceinline__ uint64_t createpolicy_evict_last() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t createpolicy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// The box at (c0, c1, c2) of the tensor map = the box in shared memory at src (TMA).
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
// Orders this thread's view of global memory written by the async proxy (TMA) before
// its later generic accesses (and, with a barrier, the other threads').
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
// Closes this thread's bulk group of the operations issued since the last one.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// At most kPending of this thread's bulk groups are still reading shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Every bulk group of this thread is complete (its writes performed).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Register reallocation between the warpgroups of a block (every warp of the warpgroup
// executes it): the producer gives registers back, the consumers take them.
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Named barriers (id 0 is __syncthreads): `threads` arrivals complete one; sync waits,
// arrive does not.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
#endif

}  // namespace flashgpt::cuda::attn::sm90
