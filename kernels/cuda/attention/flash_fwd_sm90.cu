// FlashAttention forward, Hopper path (sm_90a): the sm80 algorithm with its two matmuls
// on warpgroup MMA (wgmma) instead of mma.sync (flash_fwd_sm90_consumer.cuh).
//
// One block = 2 warpgroups = 128 query rows (64 per warpgroup); every thread loads: K/V
// tiles of kBlockN keys by cp.async into shared memory, in the 128B-swizzled layout wgmma
// reads. Two variants (FLASHGPT_ATTENTION_FWD_TILE on the sm90 path):
//   0 (default)  each tile's matmuls one after the other (Sm90FwdConsumer::step);
//   1 (pipelined)  QKᵀ of tile j issued with P·V of tile j−1, softmax of j under it
//                (step_overlapped). Same bits as 0
//                (CudaFlashAttention.Sm90ForwardVariantsAreBitwiseEqual). V_{j−1} is
//                still read while tile j+1 loads, so V has three buffers.
// The warp-specialised variant with TMA loads is flash_fwd_sm90_ws.cu; the Hopper
// backward is flash_bwd_sm90.cu.
#include <cmath>
#include <string>
#include "src/cuda/cuda_check.h"
#include "kernels/cuda/attention/flash_fwd_sm90_consumer.cuh"
#include "kernels/cuda/attention/flash_params.h"

namespace flashgpt::cuda::attn {
namespace {

template <int kHeadDim_, int kBlockN_, bool kPipelined_>
struct Sm90FwdTile : Sm90FwdTileShape<kHeadDim_, kBlockN_> {
  using Shape = Sm90FwdTileShape<kHeadDim_, kBlockN_>;
  static constexpr int kThreads = 256;  // 2 warpgroups
  static constexpr bool kPipelined = kPipelined_;
  static constexpr int kVBuffers = kPipelined ? 3 : 2;
  // Q + 2 × K + kVBuffers × V, and slack to align the base to 1024 bytes (the swizzle period).
  static constexpr size_t kSmemBytes =
      size_t(Shape::kBlockM + (2 + kVBuffers) * kBlockN_) * kHeadDim_ * sizeof(bf16) + 1024;
};
template <int kHeadDim, bool kPipelined>
struct Sm90FwdConfig { using Tile = Sm90FwdTile<kHeadDim, /*kBlockN=*/128, kPipelined>; };

template <class Tile, bool kCausal>
__global__ void __launch_bounds__(Tile::kThreads, 1) flash_fwd_sm90_kernel(const FlashParams p) {
#if FLASHGPT_HAS_WGMMA
  constexpr int D = Tile::kHeadDim, BM = Tile::kBlockM, BN = Tile::kBlockN;
  extern __shared__ unsigned char smem_raw[];
  // The hardware applies the 128B swizzle from address bits: tiles start 1024-aligned.
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [BM][D]      wgmma layout
  bf16* sK = sQ + BM * D;                    // [2][BN][D]
  bf16* sV = sK + 2 * BN * D;                // [kVBuffers][BN][D]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest (causal) tiles first
  const int h = blockIdx.y, b = blockIdx.z;
  const int m0 = m_block * BM;

  const bf16* q = p.qkv + int64_t(b) * p.T * p.qkv_row_stride + h * D;
  const bf16* k = q + int64_t(p.H) * D;
  const bf16* v = k + int64_t(p.H) * D;
  const int n_end = kCausal ? min(p.T, m0 + BM) : p.T;
  const int n_blocks = (n_end + BN - 1) / BN;

  sm90::load_tile_async<BM, D, Tile::kThreads>(sQ, q, p.qkv_row_stride, m0, p.T, tid);
  sm90::load_tile_async<BN, D, Tile::kThreads>(sK, k, p.qkv_row_stride, 0, p.T, tid);
  sm90::load_tile_async<BN, D, Tile::kThreads>(sV, v, p.qkv_row_stride, 0, p.T, tid);
  cp_async_commit();

  Sm90FwdConsumer<Tile, kCausal> c(p, m0, warp / 4, warp % 4, lane, sQ);
  auto v_tile = [&](int nb) { return smem_u32(sV + (nb % Tile::kVBuffers) * BN * D); };
  auto nothing = [] {};
  for (int nb = 0; nb < n_blocks; ++nb) {
    // Tile nb has landed, and every warp is done with the buffers the next loads overwrite:
    // K of tile nb−1 and V of tile nb−1 (pipelined: nb−2), whose matmuls finished in
    // iteration nb−1.
    cp_async_wait<0>();
    sm90::fence_proxy_async();
    __syncthreads();
    if (nb + 1 < n_blocks) {
      const int nxt = (nb + 1) * BN;
      sm90::load_tile_async<BN, D, Tile::kThreads>(sK + ((nb + 1) & 1) * BN * D, k, p.qkv_row_stride, nxt, p.T, tid);
      sm90::load_tile_async<BN, D, Tile::kThreads>(sV + ((nb + 1) % Tile::kVBuffers) * BN * D, v,
                                                   p.qkv_row_stride, nxt, p.T, tid);
      cp_async_commit();
    }
    const uint32_t k_base = smem_u32(sK + (nb & 1) * BN * D);
    if constexpr (Tile::kPipelined) c.step_overlapped(nb, k_base, v_tile(nb > 0 ? nb - 1 : 0), nothing, nothing);
    else c.step(nb, k_base, v_tile(nb));
  }
  if constexpr (Tile::kPipelined) c.finish_overlapped(v_tile(n_blocks - 1));
  c.store(b, h);
#else
  static_assert(Tile::kMTiles == 1 && Tile::kNTiles > 0 && Tile::kDTiles > 0, "tile shape");
  __trap();  // never launched: the dispatcher checks that sm_90a code was built
#endif
}

template <int kHeadDim, bool kCausal, bool kPipelined>
void launch_fwd_sm90_variant(const FlashParams& p, cudaStream_t stream) {
  using Tile = typename Sm90FwdConfig<kHeadDim, kPipelined>::Tile;
  auto kernel = flash_fwd_sm90_kernel<Tile, kCausal>;
  static const bool opted_in = opt_in_dynamic_smem(kernel, Tile::kSmemBytes);  // once
  (void)opted_in;
  const dim3 grid((p.T + Tile::kBlockM - 1) / Tile::kBlockM, p.H, p.B);
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

template <int kHeadDim, bool kCausal>
void launch_fwd_sm90(const FlashParams& p, int variant, cudaStream_t stream) {
  if (variant == 1) launch_fwd_sm90_variant<kHeadDim, kCausal, /*kPipelined=*/true>(p, stream);
  else launch_fwd_sm90_variant<kHeadDim, kCausal, /*kPipelined=*/false>(p, stream);
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
      &attr, flash_fwd_sm90_kernel<typename Sm90FwdConfig<64, false>::Tile, /*kCausal=*/true>));
  return attr.binaryVersion >= 90;
}

template void launch_fwd_sm90<64, /*kCausal=*/true>(const FlashParams&, int, cudaStream_t);
template void launch_fwd_sm90<64, /*kCausal=*/false>(const FlashParams&, int, cudaStream_t);
template void launch_fwd_sm90<128, /*kCausal=*/true>(const FlashParams&, int, cudaStream_t);
template void launch_fwd_sm90<128, /*kCausal=*/false>(const FlashParams&, int, cudaStream_t);

}  // namespace flashgpt::cuda::attn
