// What the FlashAttention kernels read and write, as one struct, and the launchers of
// each code path (defined in flash_{fwd,bwd}_sm{80,90}.cu). Internal to
// kernels/cuda/attention/: the rest of flashgpt calls flash_attention.h.
#pragma once
#include <cuda.h>  // CUtensorMap, CUtensorMapDataType (types only: no libcuda link)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include "src/cuda/cuda_check.h"
#include "kernels/cuda/attention/dq_mode.h"      // DqMode
#include "kernels/cuda/attention/tile_choice.h"  // kSm90WsOneConsumer

namespace flashgpt::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = exp2(x * log2(e))

// A kernel that uses more than 48 KB of dynamic shared memory must opt in first. The
// launchers call this once per kernel (from a function-local static); returns true.
template <class Kernel>
bool opt_in_dynamic_smem(Kernel kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  return true;
}

struct FlashParams {
  // Inputs and outputs; row strides are in elements.
  const __nv_bfloat16* qkv = nullptr;  // (B, T, 3, H, D): row stride 3*H*D
  __nv_bfloat16* out = nullptr;        // (B, T, H, D):    row stride H*D
  float* lse = nullptr;                // (B, H, T) natural-log logsumexp of scaled scores
  // Backward only.
  const __nv_bfloat16* dout = nullptr;  // (B, T, H, D)
  __nv_bfloat16* dqkv = nullptr;        // (B, T, 3, H, D)
  float* delta = nullptr;               // (B, H, T): rowsum(dO ∘ O)
  float* dq_accum = nullptr;            // (B, H, T, D) fp32 workspace (flat mode: tiles in register order)
  int* item_counter = nullptr;          // sm90 backward's work counter (after dq_accum)
  int bwd_head_group = 1 << 30;         // sm90 backward, tma/atomic dQ: (batch·head)s per item group

  int B = 0, T = 0, H = 0, D = 0;
  int64_t qkv_row_stride = 0;  // 3*H*D
  int64_t o_row_stride = 0;    // H*D
  float scale = 0;             // 1/sqrt(D)
  float scale_log2 = 0;        // scale * log2(e): scores go straight into exp2
  // The sm90ws forward's three-consumer persistent kernel with claimed tiles
  // (fwd_head_group > 0, tile_choice.h's grouped_tile): its claim counter, 0 between
  // launches. (Last, so that the other fields keep their offsets.)
  int* fwd_tile_counter = nullptr;
  int fwd_head_group = 0;
  // (Before adding a field: in the forty-second session a pointer and two ints here made
  // ptxas spill 8-12 bytes in two D = 64 backward kernels that never read them, and one
  // int in the padding after fwd_head_group still changed the three-consumer forward's
  // SASS; a value only some kernels need went in as their own kernel parameter instead.
  // Check a change with scripts/same_cubin.sh --kernels and scripts/sass.sh --counts.)
};

// Portable path (mma.sync, cp.async): sm_80 and newer.
// tile: which of the two tile shapes of each launcher (0 = default; a tuning knob).
template <int kHeadDim, bool kCausal>
void launch_fwd_sm80(const FlashParams& p, int tile, cudaStream_t stream);
// Hopper path (wgmma, flash_fwd_sm90.cu, flash_bwd_sm90.cu). Every dQ mode of the
// backward adds with float atomics; the deterministic mode runs the sm80 kernels.
template <int kHeadDim, bool kCausal>
void launch_fwd_sm90(const FlashParams& p, cudaStream_t stream);
// The backward's work items (key tile × batch·head) go to at most max_blocks blocks,
// each looping over items it claims from p.item_counter (persistent: max_blocks = the SM
// count); 0: one block per item. dq: how dQ is added up (dq_mode.h).
template <int kHeadDim, bool kCausal>
void launch_bwd_sm90(const FlashParams& p, int max_blocks, DqMode dq, cudaStream_t stream);
// Warp-specialised Hopper forward (TMA producer, two consumer warpgroups in ping-pong;
// flash_fwd_sm90_ws.cu), each consumer's softmax under its previous P·V. Tile 0: 128-key
// tiles; tile 1: at D = 128 176-key tiles, at D = 64 three consumer warpgroups (192 query
// rows a block, round robin); tile kSm90WsOneConsumer: one consumer, 64 query rows, two
// blocks an SM. The caller picks the tile (tile_choice.h). persistent_blocks > 0 runs
// the tile persistent (only tiles with a persistent kernel, tile_choice.h's
// sm90ws_has_persistent_kernel: tile 0, and at D = 64 tile 1)
// on at most that many blocks, as many as balance its rounds best (the three-consumer
// kernel with p.fwd_head_group > 0: all of them, its tiles claimed), or with exact_blocks
// on exactly that many (no more than tiles).
template <int kHeadDim, bool kCausal>
void launch_fwd_sm90_ws(const FlashParams& p, int tile, int persistent_blocks, bool exact_blocks, cudaStream_t stream);
// True when this build has sm_90a code and the current device runs it.
bool sm90_kernels_built();
// A TMA descriptor of a 3-D tensor (innermost dimension first; strides in bytes of
// dimensions 1 and 2), boxes of box[0..2] elements, 128-byte swizzle unless asked
// otherwise; by the driver's cuTensorMapEncodeTiled (tensor_map.cu). `what` names
// the tensor in the error.
CUtensorMap tensor_map_3d(CUtensorMapDataType type, const void* base, const uint64_t dims[3],
                          const uint64_t strides[2], const uint32_t box[3], const char* what,
                          CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B);
// The TMA boxes of bf16 activations are kTmaBoxCols columns wide: one 128-byte swizzle row.
constexpr int kTmaBoxCols = 64;
// A (B, T, row_stride) bf16 activation (qkv, dout) as a 3-D tensor (row_stride, T, B),
// boxes of kTmaBoxCols columns × `rows` rows × 1, 128-byte swizzle: the wgmma tile layout.
CUtensorMap bf16_rows_tensor_map(const __nv_bfloat16* base, int64_t row_stride, int T, int B, int rows,
                                 const char* what);

// deterministic: dQ by a separate kernel that loops over K/V tiles (no float atomics).
template <int kHeadDim, bool kCausal>
void launch_bwd_sm80(const FlashParams& p, bool deterministic, int tile, cudaStream_t stream);

// The backward's first and last kernels, the same on both paths (flash_bwd_sm80.cu):
// D = rowsum(dO ∘ O) into p.delta, and zeroing of the dQ accumulator's first
// zero_floats floats (a multiple of 4; 0: none);
// dQ accumulator · scale → bf16 into the Q slot of p.dqkv.
template <int kHeadDim>
void launch_bwd_preprocess(const FlashParams& p, int64_t zero_floats, cudaStream_t stream);
template <int kHeadDim>
void launch_bwd_postprocess(const FlashParams& p, cudaStream_t stream);

}  // namespace flashgpt::cuda::attn
