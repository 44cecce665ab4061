// FlashAttention for flashgpt: fused causal/non-causal attention that never stores the
// T×T matrix. Forward writes O and the logsumexp (LSE) per row; backward recomputes P
// from Q, K and LSE. Called by the CUDA op set (kernels/cuda/) for AttentionAlgo::flash.
// Decoding (one query against a KV cache) is FlashDecoding, below.
#pragma once
#include <cuda_runtime.h>
#include <string>
#include "kernels/ops.h"

namespace flashgpt::cuda {

// a.out (B,T,H,D) bf16 and a.lse (B,H,T) fp32 are overwritten; a.qkv is (B,T,3,H,D).
void flash_attention_forward(const AttentionForward& a, cudaStream_t stream);
// a.dqkv (B,T,3,H,D) is overwritten. workspace: flash_attention_workspace_bytes(...)
// bytes of device memory (e.g. the fp32 dQ accumulator), owned by the caller.
void flash_attention_backward(const AttentionBackward& a, void* workspace, cudaStream_t stream);
size_t flash_attention_workspace_bytes(int B, int T, int H, int D);

// FlashDecoding (flash_decode.cu): one query per sequence against a KV cache, bf16 or
// fp32, head dim 64 or 128. a.out (B, H·D) and a.lse (B, H) fp32 (if defined) are
// overwritten. The cache is split along the sequence over thread blocks; `workspace`
// (flash_decode_workspace_bytes(a) bytes; 0 for one split, or where the splits merge in a
// thread-block cluster) holds the per-split partials and the split counters, placed after
// the partials: zero it after allocating it, and again whenever the split count, B·H or
// D changes (the counters move, into bytes another layout filled with partials; the split
// count can fall as a cache grows). Every call leaves it valid for the next call of the
// same layout.
// splits > 0 forces about that many splits (tests, tuning); 0 chooses.
size_t flash_decode_workspace_bytes(const AttentionDecode& a, int splits = 0);
int flash_decode_splits(const AttentionDecode& a, int splits = 0);
// The kernel a call at head dim D on a cache of dtype would run now: "registers" or
// "bulk|mma<stages>x<tile>KB/<threads>" (FLASHGPT_DECODE_KERNEL, FLASHGPT_DECODE_THREADS,
// FLASHGPT_DECODE_TILE_KB).
std::string flash_decode_kernel(int D, DType dtype = DType::bf16);
void flash_decode(const AttentionDecode& a, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                  int splits = 0);
// Copies k and v of a.n new tokens into the caches at positions [a.pos, a.pos + a.n).
void kv_cache_write(const KVCacheWrite& a, cudaStream_t stream);

}  // namespace flashgpt::cuda
