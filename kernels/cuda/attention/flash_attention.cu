// The public entry points of flash_attention.h: check what the kernels assume, fill a
// FlashParams, pick the code path and the instantiation (head dim × causal).
//
// Run-time switches (environment):
//   FLASHGPT_ATTENTION_PATH=sm80|sm90|sm90ws|auto  code path. sm80: the portable mma.sync
//       kernels (any GPU from sm_80 on). sm90: forward and backward on wgmma, loads by
//       cp.async (needs an sm_90a build and a Hopper GPU, else InputError). sm90ws: the
//       sm90 backward with the warp-specialised TMA forward (flash_fwd_sm90_ws.cu). auto
//       (default): the fastest as measured on an H200, which is sm90ws (see choose_path);
//       sm80 on non-Hopper GPUs or builds without 90a.
//   FLASHGPT_DETERMINISTIC=1  backward computes dQ without float atomics (a separate
//       kernel looping over key tiles; sm80 kernels on every path). Default: atomics.
//   FLASHGPT_ATTENTION_BWD_SCHEDULE=persistent|grid  the sm90 backward's grid: one block
//       per SM looping over its share of the (key tile, head) items, each prefetching the
//       next item's K and V (persistent, the default), or one block per item (grid).
//       FLASHGPT_ATTENTION_BWD_BLOCKS=N caps the persistent grid at N blocks (tests use
//       it to give each block many items on small problems).
//   FLASHGPT_ATTENTION_BWD_DQ=auto|atomic|tma|flat|owner  the sm90 backward's dQ:
//       per-thread fp32 atomics into a zeroed accumulator, converted to bf16 by a last
//       pass (atomic); the same accumulator, each query tile's partial staged in shared
//       memory and added by the TMA unit (tma); as tma with the tile and the accumulator
//       in register order, one bulk add a tile (flat); or one block per (batch, head)
//       walking its key tiles in order, which stores the first contribution and adds the
//       middle ones through the TMA tile and writes the last in bf16 (owner). auto: flat
//       (dq_mode.h).
//   FLASHGPT_ATTENTION_BWD_HEAD_GROUP=auto|all|N  tma, flat and atomic modes: the items in
//       groups of N (batch, head) pairs, key tile major within each (dq_mode.h).
//   FLASHGPT_ATTENTION_FWD_TILE, FLASHGPT_ATTENTION_BWD_TILE = 0|1  tuning knobs: the
//       tile shape of each sm80 kernel (flash_fwd_sm80.cu, flash_bwd_sm80.cu); 0 is the
//       default. FWD_TILE also picks the sm90ws forward's tile: 0 two consumer
//       warpgroups with 128-key tiles, 1 at D = 128 176-key tiles and at D = 64 three
//       consumers for 192 query rows a block (flash_fwd_sm90_ws.cu); unset, the
//       measured choice of sm90ws_forward_tile in tile_choice.h (at D = 64: one
//       consumer and two blocks an SM below T = 320 without a mask, tile 0 with a causal
//       mask up to T = 1024, then three consumers unless causal with T < 2048; at D = 128 tile 1 without
//       a mask from T = 8192). The other Hopper kernels ignore them.
//   FLASHGPT_ATTENTION_FWD_CONSUMERS=1  the sm90ws forward with one consumer warpgroup
//       (64 query rows) and two blocks an SM at every shape, whatever FWD_TILE says.
//   FLASHGPT_ATTENTION_FWD_SCHEDULE=auto|grid|persistent  the sm90ws forward's two- and
//       (causal) three-consumer tiles as a block per query tile (grid) or one block an SM
//       walking the tiles (persistent, on as many SMs as balance its rounds); auto:
//       persistent at D = 128 up to T = 2048 (causal) or 4096 (full) and, with a causal
//       mask, up to T = 16384 at D = 64 (tile_choice.h). FLASHGPT_ATTENTION_FWD_BLOCKS=N (tests) runs the
//       persistent kernel on exactly N blocks. FLASHGPT_ATTENTION_FWD_HEAD_GROUP=auto|0|N|all
//       the three-consumer persistent kernel's blocks claim their tiles one at a time,
//       in groups of N (batch, head) pairs, each group's longest query tiles first
//       (tile_choice.h's grouped_tile); 0: the rounds; auto: groups of 64. The other
//       kernels ignore it.
#include "kernels/cuda/attention/flash_attention.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include "src/cuda/cuda_check.h"
#include "kernels/cuda/attention/flash_params.h"
#include "kernels/cuda/attention/tile_choice.h"
#include "kernels/cuda/common.cuh"

namespace flashgpt::cuda {
namespace {

using attn::FlashParams;

enum class Path { sm80, sm90, sm90ws };

// One process drives one GPU (docs/ARCHITECTURE.md), so the answer is cached.
bool sm90_available() {
  static const bool available = attn::sm90_kernels_built();
  return available;
}

enum class Pass { forward, backward };

// Measured on an H200 (BENCHMARKS.md "Fifth session", all 21 shapes of the attention
// sweep in one run): forward, the warp-specialised TMA kernel beats the sm90 one
// everywhere (1.08-1.28x) and the sm80 one where that was the previous choice (D = 64
// below T = 4096: 1.13-1.25x); backward ("## Attention"), the wgmma kernel beats the sm80
// one everywhere (1.2-1.5x). So auto is the Hopper kernels wherever they are built.
// The code path of one pass (FLASHGPT_ATTENTION_PATH).
Path choose_path(Pass pass) {
  const char* env = std::getenv("FLASHGPT_ATTENTION_PATH");
  const std::string want = env && *env ? env : "auto";
  if (want == "sm80") return Path::sm80;
  if (want == "sm90" || want == "sm90ws" || want == "auto") {
    if (!sm90_available()) {
      if (want == "auto") return Path::sm80;
      fail_input("FLASHGPT_ATTENTION_PATH=", want, " needs a Hopper GPU and a build with the 90a "
                 "architecture (FLASHGPT_CUDA_ARCHS)");
    }
    // sm90 and sm90ws differ in the forward only.
    return want != "sm90" && pass == Pass::forward ? Path::sm90ws : Path::sm90;
  }
  fail_input("FLASHGPT_ATTENTION_PATH must be sm80, sm90, sm90ws or auto, got '", want, "'");
}

bool deterministic_requested() {
  const char* env = std::getenv("FLASHGPT_DETERMINISTIC");
  return env && std::string(env) == "1";
}

// Tuning knob `var` (tile_choice.h): 0, 1, or -1 when unset.
int tile_choice(const char* var) { return attn::parse_tile_choice(var, std::getenv(var)); }

// FLASHGPT_ATTENTION_FWD_CONSUMERS = 1: the sm90ws forward with one consumer warpgroup
// and two blocks an SM at every shape, whatever the tile knob says; unset: the tile's.
bool one_consumer_forward() {
  const char* env = std::getenv("FLASHGPT_ATTENTION_FWD_CONSUMERS");
  const std::string v = env && *env ? env : "";
  if (!v.empty() && v != "1") fail_input("FLASHGPT_ATTENTION_FWD_CONSUMERS must be 1 or unset, got '", v, "'");
  return v == "1";
}

// A persistent kernel's grid: the SM count, or N when the test knob `blocks_var` is set
// (from_knob).
struct PersistentGrid {
  int blocks;
  bool from_knob;
};
PersistentGrid persistent_grid(const char* blocks_var) {
  if (const char* n = std::getenv(blocks_var); n && *n) return {int(parse_positive_int(n, blocks_var)), true};
  return {device_sm_count(), false};
}

// The sm90ws forward's persistent grid for `tile` (tile_choice.h's rule): at most the SM
// count, as many blocks as balance its rounds (the launch works it out); with
// FLASHGPT_ATTENTION_FWD_BLOCKS=N (a test knob) exactly N. 0 blocks: a block per query tile.
PersistentGrid forward_persistent_grid(attn::FwdSchedule schedule, int tile, const AttentionForward& a) {
  if (!attn::sm90ws_forward_persistent(schedule, tile, a.D, a.T, a.causal)) return {0, false};
  return persistent_grid("FLASHGPT_ATTENTION_FWD_BLOCKS");
}

// The claim counter of the sm90ws persistent forward's claimed schedule on `stream` (one
// per device and stream, so that forwards on two streams never share one): 4 bytes,
// zeroed once, before the first launch on that stream; each launch leaves it at 0.
int* forward_tile_counter(cudaStream_t stream) {
  const int device = current_device();
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, int*> counters;
  const std::lock_guard<std::mutex> lock(mutex);
  int*& counter = counters[{device, stream}];
  if (!counter) {
    CUDA_CHECK(cudaMalloc(&counter, sizeof(int)));
    CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(int), stream));
  }
  return counter;
}

// The sm90 backward's grid cap (FLASHGPT_ATTENTION_BWD_SCHEDULE): the persistent grid
// (FLASHGPT_ATTENTION_BWD_BLOCKS caps it), 0 for a block per item.
int backward_max_blocks() {
  const char* env = std::getenv("FLASHGPT_ATTENTION_BWD_SCHEDULE");
  const std::string v = env && *env ? env : "persistent";
  if (v == "grid") return 0;
  if (v != "persistent")
    fail_input("FLASHGPT_ATTENTION_BWD_SCHEDULE must be persistent or grid, got '", v, "'");
  return persistent_grid("FLASHGPT_ATTENTION_BWD_BLOCKS").blocks;
}

void check_tensor(const Tensor& t, const char* name, DType dtype, int64_t numel) {
  if (!t.defined()) fail_input("flash attention: ", name, " is not set");
  if (t.device != Device::cuda) fail_input("flash attention: ", name, " must be on the GPU");
  if (t.dtype != dtype)
    fail_input("flash attention: ", name, " must be ", dtype_name(dtype), ", got ", dtype_name(t.dtype));
  if (t.numel() != numel)
    fail_input("flash attention: ", name, " has ", t.numel(), " elements ", t.shape_str(),
               ", expected ", numel);
  // cp.async and the vector stores move 16 bytes at a time.
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    fail_input("flash attention: ", name, " must be 16-byte aligned");
}

void check_sizes(int B, int T, int H, int D) {
  if (D != 64 && D != 128) fail_input("flash attention supports head dim 64 or 128, got ", D);
  if (B < 1 || T < 1 || H < 1)
    fail_input("flash attention needs B, T, H >= 1, got B=", B, " T=", T, " H=", H);
  // Grid dimensions y and z hold H and B.
  if (B > 65535 || H > 65535) fail_input("flash attention: B and H must be <= 65535");
  // The sm90 backward numbers its work items (128-key tile × batch·head) with an int, and
  // its claims run up to one grid past the last: counting 64-key tiles keeps both in range.
  if (int64_t(B) * H * ((T + 63) / 64) > INT32_MAX)
    fail_input("flash attention: B * H * ceil(T / 64) must be below 2^31, got B=", B, " T=", T, " H=", H);
}

FlashParams make_params(int B, int T, int H, int D) {
  FlashParams p;
  p.B = B;
  p.T = T;
  p.H = H;
  p.D = D;
  p.qkv_row_stride = int64_t(3) * H * D;
  p.o_row_stride = int64_t(H) * D;
  p.scale = 1.0f / std::sqrt(float(D));
  p.scale_log2 = p.scale * attn::kLog2e;
  return p;
}

}  // namespace

size_t flash_attention_workspace_bytes(int B, int T, int H, int D) {
  return size_t(attn::backward_workspace_bytes(B, T, H, D));  // (dq_mode.h)
}

void flash_attention_forward(const AttentionForward& a, cudaStream_t stream) {
  check_sizes(a.B, a.T, a.H, a.D);
  const int64_t tokens = int64_t(a.B) * a.T;
  check_tensor(a.qkv, "qkv", DType::bf16, tokens * 3 * a.H * a.D);
  check_tensor(a.out, "out", DType::bf16, tokens * a.H * a.D);
  check_tensor(a.lse, "lse", DType::f32, tokens * a.H);
  FlashParams p = make_params(a.B, a.T, a.H, a.D);
  p.qkv = a.qkv.as<const __nv_bfloat16>();
  p.out = a.out.as<__nv_bfloat16>();
  p.lse = a.lse.as<float>();
  const int fwd_tile = tile_choice("FLASHGPT_ATTENTION_FWD_TILE");
  switch (choose_path(Pass::forward)) {
    case Path::sm80: {
      const int tile = attn::sm80_tile(fwd_tile);
      if (a.D == 64)
        a.causal ? attn::launch_fwd_sm80<64, /*kCausal=*/true>(p, tile, stream)
                 : attn::launch_fwd_sm80<64, /*kCausal=*/false>(p, tile, stream);
      else
        a.causal ? attn::launch_fwd_sm80<128, /*kCausal=*/true>(p, tile, stream)
                 : attn::launch_fwd_sm80<128, /*kCausal=*/false>(p, tile, stream);
      break;
    }
    case Path::sm90:
      if (a.D == 64)
        a.causal ? attn::launch_fwd_sm90<64, /*kCausal=*/true>(p, stream)
                 : attn::launch_fwd_sm90<64, /*kCausal=*/false>(p, stream);
      else
        a.causal ? attn::launch_fwd_sm90<128, /*kCausal=*/true>(p, stream)
                 : attn::launch_fwd_sm90<128, /*kCausal=*/false>(p, stream);
      break;
    case Path::sm90ws: {
      const attn::FwdSchedule schedule = attn::parse_forward_schedule(std::getenv("FLASHGPT_ATTENTION_FWD_SCHEDULE"));
      // The knobs of the persistent kernels are checked on every call, so that a bad value is
      // an InputError on a shape that takes the grid too (the launch reads them again where
      // they apply).
      (void)attn::forward_tail_list(std::getenv("FLASHGPT_ATTENTION_FWD_TAIL"));
      const int64_t pairs = int64_t(a.B) * a.H;
      const int head_group =
          attn::forward_head_group(std::getenv("FLASHGPT_ATTENTION_FWD_HEAD_GROUP"), pairs, a.causal, a.T);
      const int ws_tile = one_consumer_forward() ? attn::kSm90WsOneConsumer
                                                 : attn::sm90ws_forward_tile(fwd_tile, a.D, a.T, a.causal, schedule,
                                                                             pairs, device_sm_count());
      const PersistentGrid g = forward_persistent_grid(schedule, ws_tile, a);
      if (g.blocks > 0 && attn::sm90ws_claims_tiles(attn::sm90ws_consumers(ws_tile, a.D))) {
        p.fwd_head_group = head_group;
        if (p.fwd_head_group > 0) p.fwd_tile_counter = forward_tile_counter(stream);
      }
      if (a.D == 64)
        a.causal ? attn::launch_fwd_sm90_ws<64, /*kCausal=*/true>(p, ws_tile, g.blocks, g.from_knob, stream)
                 : attn::launch_fwd_sm90_ws<64, /*kCausal=*/false>(p, ws_tile, g.blocks, g.from_knob, stream);
      else
        a.causal ? attn::launch_fwd_sm90_ws<128, /*kCausal=*/true>(p, ws_tile, g.blocks, g.from_knob, stream)
                 : attn::launch_fwd_sm90_ws<128, /*kCausal=*/false>(p, ws_tile, g.blocks, g.from_knob, stream);
      break;
    }
  }
}

void flash_attention_backward(const AttentionBackward& a, void* workspace, cudaStream_t stream) {
  check_sizes(a.B, a.T, a.H, a.D);
  const int64_t tokens = int64_t(a.B) * a.T;
  check_tensor(a.dqkv, "dqkv", DType::bf16, tokens * 3 * a.H * a.D);
  check_tensor(a.qkv, "qkv", DType::bf16, tokens * 3 * a.H * a.D);
  check_tensor(a.dout, "dout", DType::bf16, tokens * a.H * a.D);
  check_tensor(a.out, "out", DType::bf16, tokens * a.H * a.D);
  check_tensor(a.lse, "lse", DType::f32, tokens * a.H);
  check_tensor(a.delta, "delta", DType::f32, tokens * a.H);
  const bool deterministic = deterministic_requested();
  if (!deterministic && (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0))
    fail_input("flash attention backward needs a 16-byte aligned workspace of "
               "flash_attention_workspace_bytes() bytes");
  FlashParams p = make_params(a.B, a.T, a.H, a.D);
  p.qkv = a.qkv.as<const __nv_bfloat16>();
  p.out = a.out.as<__nv_bfloat16>();
  p.lse = a.lse.as<float>();
  p.dout = a.dout.as<const __nv_bfloat16>();
  p.dqkv = a.dqkv.as<__nv_bfloat16>();
  p.delta = a.delta.as<float>();
  p.dq_accum = static_cast<float*>(workspace);
  if (workspace) p.item_counter = reinterpret_cast<int*>(p.dq_accum + attn::dq_accum_floats(a.B, a.T, a.H, a.D));
  const int bwd_tile = attn::sm80_tile(tile_choice("FLASHGPT_ATTENTION_BWD_TILE"));
  const Path path = choose_path(Pass::backward);
  // Every dQ mode of the sm90 backward adds with float atomics: the deterministic mode runs the sm80 kernels.
  if (path == Path::sm90 && !deterministic) {
    const int max_blocks = backward_max_blocks();
    const attn::DqMode dq = attn::choose_dq_mode(std::getenv("FLASHGPT_ATTENTION_BWD_DQ"));
    p.bwd_head_group = int(attn::choose_head_group(std::getenv("FLASHGPT_ATTENTION_BWD_HEAD_GROUP"), int64_t(a.B) * a.H,
                                                   a.T, device_sm_count()));
    if (a.D == 64)
      a.causal ? attn::launch_bwd_sm90<64, /*kCausal=*/true>(p, max_blocks, dq, stream)
               : attn::launch_bwd_sm90<64, /*kCausal=*/false>(p, max_blocks, dq, stream);
    else
      a.causal ? attn::launch_bwd_sm90<128, /*kCausal=*/true>(p, max_blocks, dq, stream)
               : attn::launch_bwd_sm90<128, /*kCausal=*/false>(p, max_blocks, dq, stream);
    return;
  }
  if (a.D == 64)
    a.causal ? attn::launch_bwd_sm80<64, /*kCausal=*/true>(p, deterministic, bwd_tile, stream)
             : attn::launch_bwd_sm80<64, /*kCausal=*/false>(p, deterministic, bwd_tile, stream);
  else
    a.causal ? attn::launch_bwd_sm80<128, /*kCausal=*/true>(p, deterministic, bwd_tile, stream)
             : attn::launch_bwd_sm80<128, /*kCausal=*/false>(p, deterministic, bwd_tile, stream);
}

}  // namespace flashgpt::cuda
