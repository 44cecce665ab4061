// FlashAttention forward, Hopper path (sm_90a): the sm80 algorithm with its two matmuls
// on warpgroup MMA (wgmma) instead of mma.sync. FLASHGPT_ATTENTION_PATH=sm90's forward; the
// default forward on Hopper (auto) is the faster warp-specialised flash_fwd_sm90_ws.cu
// (TMA loads, the softmax of one tile under the matmuls of another; BENCHMARKS.md
// "## Attention"), which at D = 64 gives the same bits as this kernel
// (CudaFlashAttention.Sm90WsForwardIsBitwiseEqualToSm90).
//
// One block = 2 warpgroups = 128 query rows (64 per warpgroup); every thread loads: K/V
// tiles of kBlockN keys by cp.async into shared memory, in the 128B-swizzled layout wgmma
// reads. Each key tile's matmuls one after the other:
//   S = Q·Kᵀ   wgmma m64n{kBlockN}k16, A (Q) and B (K) from shared memory
//   mask, online softmax   flash_fwd_parts.cuh, per warp, unchanged from sm80
//   O += P·V   wgmma m64n{D}k16, A (P, bf16) from registers, B (V) from shared memory
//              with the transpose flag (V is stored [key][d]: d-contiguous = N-major)
// A pipelined variant of this kernel (cp.async loads, the schedule of
// flash_fwd_sm90_consumer.cuh) was measured slower than flash_fwd_sm90_ws.cu on every
// shape and removed. The Hopper backward is flash_bwd_sm90.cu.
#include <cmath>
#include <string>
#include "src/cuda/cuda_check.h"
#include "kernels/cuda/attention/flash_fwd_parts.cuh"
#include "kernels/cuda/attention/flash_fwd_sm90_consumer.cuh"  // Sm90FwdTileShape, sm90::issue_pv
#include "kernels/cuda/attention/flash_params.h"
#include "kernels/cuda/attention/wgmma_sm90.cuh"

namespace flashgpt::cuda::attn {
namespace {

// The tile shape shared with the warp-specialised forward, plus this kernel's threads and
// shared memory.
template <int kHeadDim_, int kBlockN_>
struct Sm90FwdTile : Sm90FwdTileShape<kHeadDim_, kBlockN_> {
  using Shape = Sm90FwdTileShape<kHeadDim_, kBlockN_>;
  static constexpr int kThreads = 256;  // 2 warpgroups, 64 query rows each
  // Q + 2 × (K, V), and slack to align the base to 1024 bytes (the swizzle period).
  static constexpr size_t kSmemBytes = size_t(Shape::kBlockM + 4 * kBlockN_) * kHeadDim_ * sizeof(bf16) + 1024;
};
template <int kHeadDim> struct Sm90FwdConfig { using Tile = Sm90FwdTile<kHeadDim, /*kBlockN=*/128>; };

template <class Tile, bool kCausal>
__global__ void __launch_bounds__(Tile::kThreads, 1) flash_fwd_sm90_kernel(const FlashParams p) {
#if FLASHGPT_HAS_WGMMA
  constexpr int D = Tile::kHeadDim, BM = Tile::kBlockM, BN = Tile::kBlockN;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [BM][D]      wgmma layout
  bf16* sK = sQ + BM * D;                    // [2][BN][D]
  bf16* sV = sK + 2 * BN * D;                // [2][BN][D]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp / 4;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest (causal) tiles first
  const int h = blockIdx.y, b = blockIdx.z;
  const int m0 = m_block * BM;
  const int warp_row0 = m0 + wg * 64 + (warp % 4) * 16;

  const bf16* q = p.qkv + int64_t(b) * p.T * p.qkv_row_stride + h * D;
  const bf16* k = q + int64_t(p.H) * D;
  const bf16* v = k + int64_t(p.H) * D;
  const int n_end = kCausal ? min(p.T, m0 + BM) : p.T;
  const int n_blocks = (n_end + BN - 1) / BN;
  sm90::load_tile_async<BM, D, Tile::kThreads>(sQ, q, p.qkv_row_stride, m0, p.T, tid);
  sm90::load_tile_async<BN, D, Tile::kThreads>(sK, k, p.qkv_row_stride, 0, p.T, tid);
  sm90::load_tile_async<BN, D, Tile::kThreads>(sV, v, p.qkv_row_stride, 0, p.T, tid);
  cp_async_commit();

  float o[1][Tile::kDTiles][4];
  float row_max[1][2] = {{-INFINITY, -INFINITY}}, row_sum[1][2] = {{0.f, 0.f}};
#pragma unroll
  for (int dt = 0; dt < Tile::kDTiles; ++dt)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[0][dt][i] = 0.f;

  // This warpgroup's 64 query rows: 64 rows × 128 bytes into column block 0.
  const uint32_t q_base = smem_u32(sQ) + wg * 64 * 128;

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int buf = nb & 1;
    cp_async_wait<0>();
    sm90::fence_proxy_async();
    __syncthreads();
    if (nb + 1 < n_blocks) {
      const int nxt = (nb + 1) * BN;
      sm90::load_tile_async<BN, D, Tile::kThreads>(sK + (buf ^ 1) * BN * D, k, p.qkv_row_stride, nxt, p.T, tid);
      sm90::load_tile_async<BN, D, Tile::kThreads>(sV + (buf ^ 1) * BN * D, v, p.qkv_row_stride, nxt, p.T, tid);
      cp_async_commit();
    }
    const uint32_t k_base = smem_u32(sK + buf * BN * D);
    const uint32_t v_base = smem_u32(sV + buf * BN * D);

    // S = Q·Kᵀ
    float s[1][Tile::kNTiles][4];
    sm90::wgmma_fence();
    sm90::issue_abt<D, BM, BN>(s[0], q_base, k_base);
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(s[0]);

    const int n0 = nb * BN;
    const bool needs_mask = n0 + BN > p.T || (kCausal && n0 + BN - 1 > m0);
    if (needs_mask) apply_mask<Tile, kCausal>(s, warp_row0, n0, p.T, lane);
    online_softmax<Tile, hopper_lazy_max<Tile>()>(s, o, row_max, row_sum, p.scale_log2);

    // O += P·V
    uint32_t a[BN / 16][4];
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) c_pair_to_a(a[kk], s[0][2 * kk], s[0][2 * kk + 1]);
    sm90::fence_accumulators(o[0]);
    sm90::wgmma_fence();
    sm90::issue_pv<D, BN>(o[0], a, v_base);
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(o[0]);
  }
  store_output<Tile>(p, o, row_max, row_sum, b, h, warp_row0, lane);
#else
  static_assert(Tile::kMTiles == 1 && Tile::kNTiles > 0 && Tile::kDTiles > 0, "tile shape");
  __trap();  // never launched: the dispatcher checks that sm_90a code was built
#endif
}

}  // namespace

template <int kHeadDim, bool kCausal>
void launch_fwd_sm90(const FlashParams& p, cudaStream_t stream) {
  using Tile = typename Sm90FwdConfig<kHeadDim>::Tile;
  auto kernel = flash_fwd_sm90_kernel<Tile, kCausal>;
  static const bool opted_in = opt_in_dynamic_smem(kernel, Tile::kSmemBytes);  // once
  (void)opted_in;
  const dim3 grid((p.T + Tile::kBlockM - 1) / Tile::kBlockM, p.H, p.B);
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

bool sm90_kernels_built() {
#ifdef FLASHGPT_CUDA_ARCHS
  // A plain sm_90 target (no "a") has no wgmma: its kernel is the stub.
  if (std::string(FLASHGPT_CUDA_ARCHS).find("90a") == std::string::npos) return false;
#endif
  // The kernel's binary version is the SASS target the runtime picked for this device:
  // 90 only when the build included sm_90 code and the device is a Hopper.
  cudaFuncAttributes attr{};
  CUDA_CHECK(cudaFuncGetAttributes(
      &attr, flash_fwd_sm90_kernel<typename Sm90FwdConfig<64>::Tile, /*kCausal=*/true>));
  return attr.binaryVersion >= 90;
}

template void launch_fwd_sm90<64, /*kCausal=*/true>(const FlashParams&, cudaStream_t);
template void launch_fwd_sm90<64, /*kCausal=*/false>(const FlashParams&, cudaStream_t);
template void launch_fwd_sm90<128, /*kCausal=*/true>(const FlashParams&, cudaStream_t);
template void launch_fwd_sm90<128, /*kCausal=*/false>(const FlashParams&, cudaStream_t);

}  // namespace flashgpt::cuda::attn
