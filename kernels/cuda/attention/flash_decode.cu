// FlashDecoding: attention of one new token per sequence against a long KV cache.
//
// With one query per (b, h) there is no matmul to feed: the work is reading K and V
// once, so the kernel is memory-bound and must keep the whole GPU reading even at
// B·H = 12. The cache of each (b, h) is split along the sequence into chunks handled by
// different thread blocks (grid = splits × H × B), one kernel in all:
//
//   read      block (s, h, b) reads keys [s·chunk, (s+1)·chunk) in tiles of K (and as
//             much V): 16 KB (or, on request, 32 KB: decode_bulk_tile_kb) in the
//             bulk kernel, 8 KB in the register kernel. Three kernels (choose_variant):
//             decode_bulk_kernel (Hopper, the default there): thread 0 streams the
//             chunk through shared-memory stages (two of 16 KB tiles or one of 32 KB)
//             with bulk copies (cp.async.bulk, one per tile of K and of V, completing
//             on the stage's mbarrier): a block keeps 64 KB in flight whatever its
//             thread count, so a chunk costs one memory latency, not one per tile.
//             decode_kernel (any GPU): each thread loads straight into registers, one
//             16-byte load per key and tensor, kUnroll keys in flight; occupancy hides
//             the latency. (A cp.async ring of shared-memory tiles was measured slower:
//             3.45–3.99 TB/s against 3.67–4.29 at T = 256K, BENCHMARKS.md.)
//             decode_mma_kernel (Hopper, bf16): the bulk kernel's tiles and stages, loaded
//             by TMA with the 128-byte swizzle, and the arithmetic on the tensor cores
//             (mma.sync: scores with q padded to 16 rows, P·V); see the kernel.
//   compute   (register and bulk kernels) a key's D values are taken by a group of D/8 (bf16) or D/4 (fp32) threads,
//             one 16-byte pack each, and a block's groups take consecutive keys (a warp
//             reads contiguous memory). Per group: scores by a shuffle reduction within
//             the group, online softmax (running max m and sum l, in the log2 domain: q
//             is pre-scaled by scale·log2 e so exp is exp2), unnormalised O in fp32
//             registers. The groups are merged through shared memory.
//   combine   each block writes its partial O / l (fp32) and its log2-sum-exp m + log2 l,
//             then counts itself done on a per-(b, h) counter; the last block of a
//             (b, h) merges every split with the logsumexp rescaling, in split order
//             (deterministic whichever block is last):
//             M = max_s lse_s, w_s = 2^(lse_s − M), O = Σ w_s·O_s / Σ w_s,
//             lse = (M + log2 Σ w_s)·ln 2, and resets the counter to 0. No second kernel:
//             at short caches a launch costs as much as the reading. With one split the
//             block writes O and lse itself. The tensor-core kernel merges a plan of 2
//             to 8 splits that fits in one wave in a thread-block cluster instead
//             (merge_in_cluster): no counter, no workspace, no round trip through L2.
//
// Launch (Hopper kernels): with programmatic dependent launch, so that the blocks start while
// the kernel before them finishes; a block loads the first tiles of its chunk that lie in
// the settled keys (AttentionDecode::settled, which that kernel does not write), then waits
// for it (griddep_wait) before it reads q or any other key and before it writes anything.
//
// Split choice (plan_decode, decode_plan.h): the split count that a model of waves of
// resident blocks says is cheapest, with chunks of whole tiles and at most
// Variant::kMaxChunk keys, or 8 tiles (T / 128 keys where longer) where the Hopper
// kernels' blocks at 8 tiles make 8 waves or more (decode_max_chunk) (and, when B·H blocks
// already cover the SMs, a price for the merge);
// for the tensor-core kernel at most 8 splits (a cluster) where 8 chunks of at most 8K
// keys cover the cache in one wave.
#include <cuda_bf16.h>
#include <cuda/atomic>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include "kernels/cuda/attention/decode_plan.h"
#include "kernels/cuda/attention/flash_attention.h"
#include "kernels/cuda/attention/flash_params.h"
#include "kernels/cuda/attention/tma_sm90.cuh"
#include "kernels/cuda/common.cuh"

namespace flashgpt::cuda {
namespace {

namespace sm90 = attn::sm90;

// The bulk kernel keeps 64 KB in flight a block: two stages of 16 KB tiles of K (and as
// much V), or on request one of 32 KB (decode_bulk_tile_kb). Four stages of 8 KB were slower
// at 31 of the 36 suite shapes on an H200, by up to 4.5%, and faster at 4 by up to 3.7%
// (BENCHMARKS.md, "Twenty-third session", call 5); two of 32 KB (one block an SM) lost up
// to 13% at batch 16 with short caches ("Thirtieth session", call 1).
constexpr int kBulkInFlightBytes = 65536, kRegisterTileBytes = 8192;
constexpr int bulk_stages(int tile_bytes) { return kBulkInFlightBytes / (2 * tile_bytes); }  // K and V tiles
constexpr float kLn2 = 0.6931471805599453f;

// A kernel's shape: element type, head dim, threads per block and keys per thread group
// per tile (the register kernel's loads in flight). A tile is 8, 16 or 32 KB of K (Variant).
template <class T, int kD, int kBlockThreads, int kKeysPerGroup>
struct Traits {
  using Elem = T;
  static constexpr int kHeadDim = kD, kThreads = kBlockThreads, kUnroll = kKeysPerGroup;
  static constexpr int kElems = kPackBytes / int(sizeof(T));  // per 16-byte pack
  static constexpr int kGroup = kD / kElems;                   // threads per key
  static constexpr int kGroups = kThreads / kGroup;            // keys side by side in a block
  static constexpr int kTile = kGroups * kUnroll;              // keys per block per iteration
  static_assert(kD % kElems == 0, "head dim must be a whole number of 16-byte packs");
  static_assert(kGroup <= kWarpSize && kWarpSize % kGroup == 0, "a key's threads must share a warp");
};

template <class T>
struct DecodeParams {
  const T* qkv;      // (B, 3·H·D): q of (b, h) at b·3HD + h·D
  const T* k;        // (B, H, Tmax, D)
  const T* v;
  T* out;            // (B, H·D)
  float* lse;        // (B, H) natural log, or nullptr
  float* o_part;     // (B, H, splits, D) fp32 partial outputs (normalised by their own l)
  float* lse_part;   // (B, H, splits) log2-sum-exp of each split's scaled scores
  unsigned* done;    // (B, H) splits finished; zero between calls
  int H, keys, splits;  // keys: cache positions attended to (AttentionDecode::T)
  int64_t Tmax, chunk;
  float scale_log2;  // 1/sqrt(D) · log2 e
  int64_t settled;   // keys [0, settled) may be loaded before griddep_wait (AttentionDecode::settled)
};

// The last block of (b, h): merges the splits' partials (written by other blocks: read
// from L2, __ldcg) in one pass, so the merge costs one round of L2 latency: a thread
// takes one 16-byte column of the partials and every (kThreads / columns)-th split,
// loads their log2-sum-exps and columns together, and keeps its own running max,
// weight and sum (rescaled when the max grows); the threads' sums are then merged in a
// fixed order through shared memory. The order depends only on the split count, never
// on which block came last.
template <class Tr, class T = typename Tr::Elem>
__device__ void combine_splits(const DecodeParams<T>& p, int64_t bh) {
  constexpr int kD = Tr::kHeadDim, kThreads = Tr::kThreads;
  constexpr int kCols = kD / 4, kRows = kThreads / kCols;  // float4 columns; splits side by side
  const int S = p.splits;
  const float* lp = p.lse_part + bh * S;
  const float4* op = reinterpret_cast<const float4*>(p.o_part + bh * S * kD);
  const int col = threadIdx.x % kCols, row = threadIdx.x / kCols;
  float m = -INFINITY, w = 0.f;  // this thread's max log2-sum-exp and Σ 2^(lse_s − m)
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);  // Σ 2^(lse_s − m)·O_s of its column
#pragma unroll 4
  for (int s = row; s < S; s += kRows) {
    const float lse = __ldcg(lp + s);
    const float4 x = __ldcg(op + int64_t(s) * kCols + col);
    const float mx = fmaxf(m, lse), corr = exp2f(m - mx), e = exp2f(lse - mx);  // corr = 0 at the first split
    w = w * corr + e;
    o.x = o.x * corr + e * x.x, o.y = o.y * corr + e * x.y, o.z = o.z * corr + e * x.z, o.w = o.w * corr + e * x.w;
    m = mx;
  }
  __shared__ float4 rows[kRows][kCols];
  __shared__ float row_m[kRows], row_w[kRows];
  rows[row][col] = o;
  if (col == 0) row_m[row] = m, row_w[row] = w;  // the same in every column of the row
  __syncthreads();
  if (row != 0) return;
  float M = row_m[0];
  for (int r = 1; r < kRows; ++r) M = fmaxf(M, row_m[r]);  // row 0 always saw a split
  float W = 0.f;
  o = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int r = 0; r < kRows; ++r) {
    if (row_w[r] == 0.f) continue;  // a row past the last split
    const float c = exp2f(row_m[r] - M);
    const float4 x = rows[r][col];
    W += c * row_w[r];
    o.x += c * x.x, o.y += c * x.y, o.z += c * x.z, o.w += c * x.w;
  }
  T* dst = p.out + bh * kD + col * 4;
  dst[0] = from_f<T>(o.x / W), dst[1] = from_f<T>(o.y / W), dst[2] = from_f<T>(o.z / W), dst[3] = from_f<T>(o.w / W);
  if (col == 0 && p.lse) p.lse[bh] = (M + log2f(W)) * kLn2;
}

// Column d of a block's O, its groups' unnormalised sums rescaled to the block's max M.
template <int kGroups, int kD>
__device__ __forceinline__ float merged_column(const float (&sm_m)[kGroups], const float (&sm_acc)[kGroups][kD],
                                               float M, int d) {
  float o = 0.f;
#pragma unroll
  for (int i = 0; i < kGroups; ++i) o += sm_acc[i][d] * exp2f(sm_m[i] - M);
  return o;
}

#if FLASHGPT_HAS_WGMMA
// The barrier on which the first block of a cluster counts the others' partials
// (merge_in_cluster; a __shared__ variable of a device function is one a block).
__device__ __forceinline__ uint64_t* cluster_merge_barrier() {
  __shared__ __align__(8) uint64_t bar;
  return &bar;
}
#endif

// The splits of (b, h) as one thread-block cluster, split s its block of rank s
// (plan_decode's `cluster`; the tensor-core kernel only): each other block stores its O / L
// and log2-sum-exp into the first block's shared memory by st.async, whose bytes complete
// on the first block's cluster_merge_barrier (armed at the kernel's start for the splits - 1
// others' bytes), and leaves; the first block waits on that barrier and merges them with
// its own in split order, with the same rescaling as combine_splits. No count and no round
// trip through L2, which cost 1.7 us a call at B = 1 with 16K keys on an H100 (plan_decode),
// and no second cluster barrier: on an H100 the st.async merge was 0.1-0.6 us a call
// faster than stores followed by a release/acquire cluster barrier at batch 1 from 1K to
// 64K keys, 0.5-0.8 us at batch 16 with 8K and 16K (BENCHMARKS.md, "Sixty-seventh
// session", call 2). Every block arrived at the cluster barrier at its start, so the wait
// here tells a block that the first block runs, with its barrier armed, before it stores
// into its shared memory.
template <class Tr, int kGroups, class T = typename Tr::Elem>
__device__ void merge_in_cluster(const DecodeParams<T>& p, const float (&sm_m)[kGroups],
                                 const float (&sm_acc)[kGroups][Tr::kHeadDim], float M, float L, int split, int64_t bh) {
#if FLASHGPT_HAS_WGMMA
  constexpr int kD = Tr::kHeadDim, kThreads = Tr::kThreads, kMax = kDecodeMaxClusterSplits;
  __shared__ float cl_lse[kMax];
  __shared__ float cl_o[kMax][kD];
  uint64_t* const bar = cluster_merge_barrier();
  sm90::cluster_wait();  // every block of the cluster runs
  if (split != 0) {
    for (int d = threadIdx.x; d < kD; d += kThreads)
      sm90::store_async_in_block(&cl_o[split][d], 0, merged_column(sm_m, sm_acc, M, d) / L, bar);
    if (threadIdx.x == 0) sm90::store_async_in_block(&cl_lse[split], 0, M + log2f(L), bar);
    return;
  }
  // This block's own partial, and splits S to kMax - 1 as empty ones (log2-sum-exp −inf,
  // O zero), so that the merge below runs over kMax splits in straight-line code: each
  // thread issues all its shared-memory loads and exponentials at once, where a loop to S
  // took a round trip a split, on every call's critical path (after the last partial).
  const int S = p.splits;
  for (int d = threadIdx.x; d < kD; d += kThreads) cl_o[0][d] = merged_column(sm_m, sm_acc, M, d) / L;
  for (int i = threadIdx.x; i < (kMax - S) * kD; i += kThreads) cl_o[S + i / kD][i % kD] = 0.f;
  if (threadIdx.x == 0) cl_lse[0] = M + log2f(L);
  if (threadIdx.x < kMax - S) cl_lse[S + threadIdx.x] = -INFINITY;
  sm90::mbar_wait_spin</*kClusterAcquire=*/true>(bar, 0);
  __syncthreads();
  float Mx = -INFINITY;
#pragma unroll
  for (int s = 0; s < kMax; ++s) Mx = fmaxf(Mx, cl_lse[s]);
  for (int d = threadIdx.x; d < kD; d += kThreads) {
    float W = 0.f, o = 0.f;
#pragma unroll
    for (int s = 0; s < kMax; ++s) {
      const float w = exp2f(cl_lse[s] - Mx);  // 0 past S
      W += w;
      o += w * cl_o[s][d];
    }
    p.out[bh * kD + d] = from_f<T>(o / W);
    if (d == 0 && p.lse) p.lse[bh] = (Mx + log2f(W)) * kLn2;
  }
#endif
}

// One group's step over kUnroll keys (their K and V packs in registers; keys from t1 on
// are masked): scores, online-softmax update, O += p·V.
template <class Tr, class T = typename Tr::Elem>
__device__ __forceinline__ void consume(const Pack<T> (&kp)[Tr::kUnroll], const Pack<T> (&vp)[Tr::kUnroll],
                                        const float (&q)[Tr::kElems], int64_t first, int g, int64_t t1, float& m,
                                        float& l, float (&acc)[Tr::kElems]) {
  constexpr int E = Tr::kElems, kUnroll = Tr::kUnroll;
  float s[kUnroll];
  float mx = m;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    float d = 0.f;
#pragma unroll
    for (int i = 0; i < E; ++i) d += q[i] * to_f(kp[u].v[i]);
#pragma unroll
    for (int o = Tr::kGroup / 2; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
    s[u] = first + u * Tr::kGroups + g < t1 ? d : -INFINITY;
    mx = fmaxf(mx, s[u]);
  }
  if (mx == -INFINITY) return;  // no key for this group yet (avoid −inf − (−inf) = NaN)
  const float corr = exp2f(m - mx);  // 0 on the group's first key
  l *= corr;
#pragma unroll
  for (int i = 0; i < E; ++i) acc[i] *= corr;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const float pu = exp2f(s[u] - mx);  // 0 for a masked key (whose V may be garbage)
    l += pu;
    if (pu > 0.f) {
#pragma unroll
      for (int i = 0; i < E; ++i) acc[i] += pu * to_f(vp[u].v[i]);
    }
  }
  m = mx;
}

// The start of every split's block: this lane's slice of q, pre-scaled to the log2
// domain, and a zero accumulator.
template <class Tr, class T = typename Tr::Elem>
__device__ __forceinline__ void start_split(const DecodeParams<T>& p, int h, int b, int lane, float (&q)[Tr::kElems],
                                            float (&acc)[Tr::kElems]) {
  constexpr int E = Tr::kElems, kD = Tr::kHeadDim;
  const Pack<T> qp = load_pack(p.qkv + int64_t(b) * 3 * p.H * kD + h * kD + lane * E);
#pragma unroll
  for (int i = 0; i < E; ++i) q[i] = to_f(qp.v[i]) * p.scale_log2, acc[i] = 0.f;
}

// The end of every split's block, once each of its kGroups groups has put its max m
// (log2 domain), sum l and unnormalised O in shared memory (and the block has synced):
// merges the groups (group 0 always saw a key: t1 > t0), writes the split's partial O and
// log2-sum-exp (or, with one split, the output), and the last split of (b, h) to finish
// combines them all (or, in_cluster, merge_in_cluster: only where kInCluster compiled it,
// the tensor-core kernel; a runtime flag alone changed the other 22 decode kernels' PTX,
// the merge's code compiled into them: scripts/same_cubin.sh --kernels, sixty-seventh
// session).
template <class Tr, int kGroups, bool kInCluster = false, class T = typename Tr::Elem>
__device__ void merge_groups(const DecodeParams<T>& p, const float (&sm_m)[kGroups], const float (&sm_l)[kGroups],
                             const float (&sm_acc)[kGroups][Tr::kHeadDim], int split, int h, int b,
                             bool in_cluster = false) {
  constexpr int kD = Tr::kHeadDim, kThreads = Tr::kThreads;
  float M = -INFINITY;
#pragma unroll
  for (int i = 0; i < kGroups; ++i) M = fmaxf(M, sm_m[i]);
  float L = 0.f;
#pragma unroll
  for (int i = 0; i < kGroups; ++i) L += sm_l[i] * exp2f(sm_m[i] - M);
  const int64_t bh = int64_t(b) * p.H + h;
  if constexpr (kInCluster) {
    if (in_cluster) return merge_in_cluster<Tr>(p, sm_m, sm_acc, M, L, split, bh);
  }
  for (int d = threadIdx.x; d < kD; d += kThreads) {
    const float o = merged_column(sm_m, sm_acc, M, d);
    if (p.splits == 1) p.out[bh * kD + d] = from_f<T>(o / L);
    else p.o_part[(bh * p.splits + split) * kD + d] = o / L;
  }
  if (p.splits == 1) {
    if (threadIdx.x == 0 && p.lse) p.lse[bh] = (M + log2f(L)) * kLn2;
    return;
  }
  if (threadIdx.x == 0) p.lse_part[bh * p.splits + split] = M + log2f(L);

  // Count this split done; the last one combines. One thread counts, with an acq_rel
  // atomic at GPU scope: the barrier before it orders the block's partials before the
  // count (release is cumulative in the PTX memory model), and the barrier after it orders
  // the last block's reads of the others' partials after it (acquire). That replaced a
  // __threadfence() by every thread before a relaxed atomicAdd and another after it:
  // 0.1-0.5 us less a call at B = 1 (BENCHMARKS.md, "Twenty-first session", call 1).
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    ::cuda::atomic_ref<unsigned, ::cuda::thread_scope_device> done(p.done[bh]);
    last = done.fetch_add(1u, ::cuda::memory_order_acq_rel) == unsigned(p.splits - 1);
  }
  __syncthreads();
  if (!last) return;
  combine_splits<Tr>(p, bh);
  if (threadIdx.x == 0) p.done[bh] = 0;  // ready for the next call
}

// The end of a split's block in the register and bulk kernels: each thread group's state
// (its lanes' slices of O) into shared memory, then merge_groups.
template <class Tr, class T = typename Tr::Elem>
__device__ void finish_split(const DecodeParams<T>& p, float m, float l, const float (&acc)[Tr::kElems], int split,
                             int h, int b) {
  constexpr int E = Tr::kElems, kD = Tr::kHeadDim;
  const int g = threadIdx.x / Tr::kGroup, lane = threadIdx.x % Tr::kGroup;
  __shared__ float sm_m[Tr::kGroups], sm_l[Tr::kGroups];
  __shared__ float sm_acc[Tr::kGroups][kD];
  if (lane == 0) {
    sm_m[g] = m;
    sm_l[g] = l;
  }
#pragma unroll
  for (int i = 0; i < E; ++i) sm_acc[g][lane * E + i] = acc[i];
  __syncthreads();
  merge_groups<Tr>(p, sm_m, sm_l, sm_acc, split, h, b);
}

template <class Tr, class T = typename Tr::Elem>
__global__ void __launch_bounds__(Tr::kThreads) decode_kernel(const DecodeParams<T> p) {
  constexpr int E = Tr::kElems, kTile = Tr::kTile, kD = Tr::kHeadDim, kUnroll = Tr::kUnroll;
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int g = threadIdx.x / Tr::kGroup, lane = threadIdx.x % Tr::kGroup;
  const int64_t t0 = int64_t(split) * p.chunk, t1 = min(t0 + p.chunk, int64_t(p.keys));
  const int64_t head = (int64_t(b) * p.H + h) * p.Tmax * kD;
  const T* const kh = p.k + head;
  const T* const vh = p.v + head;

  float q[E], m = -INFINITY, l = 0.f, acc[E];
  start_split<Tr>(p, h, b, lane, q, acc);
  Pack<T> kp[kUnroll], vp[kUnroll];

  for (int64_t first = t0; first < t1; first += kTile) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // all loads first: 2·kUnroll in flight per thread
      const int64_t j = first + u * Tr::kGroups + g;
      if (j < t1) {
        kp[u] = load_pack_cs(kh + j * kD + lane * E);
        vp[u] = load_pack_cs(vh + j * kD + lane * E);
      }
    }
    consume<Tr>(kp, vp, q, first, g, t1, m, l, acc);
  }

  finish_split<Tr>(p, m, l, acc, split, h, b);
}

// The blocks an SM the bulk kernel is compiled to fit (__launch_bounds__): 0, no minimum,
// with two stages; with one (32 KB tiles, 64 KB of shared memory) 3 blocks of 128 threads
// and 2 of 256, the residency its registers gave it unasked in bf16, while unasked ptxas
// gave the fp32 kernel of 256 threads 80 registers and a spill.
constexpr int bulk_min_blocks(int threads, int stages) { return stages == 1 ? (threads == 128 ? 3 : 2) : 0; }

// The same split with the chunk streamed through shared memory by bulk copies (Hopper):
// thread 0 keeps kStages tiles of K and of V in flight (cp.async.bulk, one contiguous
// copy of up to 16 or 32 KB each, completing on the stage's mbarrier), every thread computes
// from the tile that has landed exactly as decode_kernel does from registers, and the
// stage is refilled once the whole block has read it. A block's in-flight bytes no
// longer depend on its thread count, so a chunk costs one memory latency instead of one
// per tile.
template <class Tr, int kStages, class T = typename Tr::Elem>
__global__ void __launch_bounds__(Tr::kThreads, bulk_min_blocks(Tr::kThreads, kStages))
    decode_bulk_kernel(const DecodeParams<T> p) {
#if FLASHGPT_HAS_WGMMA
  constexpr int E = Tr::kElems, kTile = Tr::kTile, kD = Tr::kHeadDim, kUnroll = Tr::kUnroll;
  constexpr int kTileElems = kTile * kD;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const ks = reinterpret_cast<T*>(smem_raw);  // [kStages][kTile][kD]
  T* const vs = ks + kStages * kTileElems;
  __shared__ __align__(8) uint64_t full[kStages];
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int g = threadIdx.x / Tr::kGroup, lane = threadIdx.x % Tr::kGroup;
  const int64_t t0 = int64_t(split) * p.chunk, t1 = min(t0 + p.chunk, int64_t(p.keys));
  const int64_t head = (int64_t(b) * p.H + h) * p.Tmax * kD;
  const int tiles = int((t1 - t0 + kTile - 1) / kTile);

  // Tile i (keys t0 + i·kTile on, at most kTile) into stage i % kStages. A step reads the
  // cache once, so its lines go first from the L2: 0.2-0.4% faster at batch 16 from 64K
  // keys, level elsewhere (BENCHMARKS.md, "Forty-ninth session"). (Prefetching the tiles
  // after the two in flight into the L2 as well, cp.async.bulk.prefetch, was 13-74% slower.)
  const uint64_t policy = sm90::createpolicy_evict_first();
  auto issue = [&](int i) {
    const int s = i % kStages;
    const int64_t first = t0 + int64_t(i) * kTile;
    const uint32_t bytes = uint32_t(min(int64_t(kTile), t1 - first) * kD * int64_t(sizeof(T)));
    sm90::mbar_arrive_expect_tx(&full[s], 2 * bytes);
    sm90::bulk_load(ks + s * kTileElems, p.k + head + first * kD, bytes, &full[s], policy);
    sm90::bulk_load(vs + s * kTileElems, p.v + head + first * kD, bytes, &full[s], policy);
  };
  const int first_tiles = min(kStages, tiles);
  int early = 0;  // thread 0: tiles issued before the wait
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) sm90::mbar_init(&full[s], 1);
    sm90::fence_mbar_init();
    while (early < first_tiles && min(t0 + int64_t(early + 1) * kTile, t1) <= p.settled) issue(early++);
  }
  sm90::griddep_wait();
  if (threadIdx.x == 0)
    for (int i = early; i < first_tiles; ++i) issue(i);
  __syncthreads();

  float q[E], m = -INFINITY, l = 0.f, acc[E];
  start_split<Tr>(p, h, b, lane, q, acc);
  Pack<T> kp[kUnroll], vp[kUnroll];
  for (int i = 0; i < tiles; ++i) {
    const int s = i % kStages;
    sm90::mbar_wait_spin(&full[s], uint32_t(i / kStages) & 1u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // past the chunk's end: stale or unset, masked in consume
      const int key = u * Tr::kGroups + g;
      kp[u] = *reinterpret_cast<const Pack<T>*>(ks + s * kTileElems + key * kD + lane * E);
      vp[u] = *reinterpret_cast<const Pack<T>*>(vs + s * kTileElems + key * kD + lane * E);
    }
    __syncthreads();  // the stage is free
    if (threadIdx.x == 0 && i + kStages < tiles) issue(i + kStages);
    consume<Tr>(kp, vp, q, t0 + int64_t(i) * kTile, g, t1, m, l, acc);
  }
  finish_split<Tr>(p, m, l, acc, split, h, b);
#else
  static_assert(Tr::kHeadDim % Tr::kElems == 0, "never launched: the dispatcher checks that sm_90a code was built");
#endif
}

// The bulk kernel's split with the arithmetic on the tensor cores (bf16, Hopper): the
// same 16 KB tiles in two stages, loaded by TMA through tensor maps of the caches (rows
// of 64 elements, 128-byte swizzle, so that ldmatrix meets all 32 banks; the maps end at
// the T keys attended, so rows past them arrive as zeros), and each of the 4 warps takes
// a quarter of a tile's keys. Scores: mma.sync m16n8k16 with q in every row of A's top
// half (rows 8-15 zero) and 8 keys of K as B; a lane then holds the scores of keys
// 2·(lane % 4) and +1 of each group of 8, as every lane with the same lane % 4. The online
// softmax is the warp's (a quad's max), P goes to bf16 as A (the flash forward's
// C-to-A fragment reuse) and O += P·V takes V as B by ldmatrix.trans; O's 8 columns of an
// n-tile sit in the quad, two a lane. A tile costs a lane 16 ldmatrix and 32 mma where the
// bulk kernel spends about 300 scalar instructions a thread (conversions, FMAs, shuffles).
// At D = 64 each warp's K fragments stay in registers across the stage's release, so that
// the refill waits for no mma (134 registers; at most 168 keep the 3 blocks an SM that its
// 64 KB of stages allow). `cluster`: the launch made the splits of each (b, h) one
// thread-block cluster (a plan of 2 to kDecodeMaxClusterSplits splits), merged by
// merge_in_cluster.
template <class Tr, int kStages>
__global__ void __launch_bounds__(Tr::kThreads, 3) decode_mma_kernel(const __grid_constant__ CUtensorMap k_map,
                                                                  const __grid_constant__ CUtensorMap v_map,
                                                                  const DecodeParams<bf16> p, const bool cluster) {
#if FLASHGPT_HAS_WGMMA
  constexpr int kD = Tr::kHeadDim, kTile = Tr::kTile, kWarps = Tr::kThreads / kWarpSize;
  constexpr int kWarpKeys = kTile / kWarps, kKeyGroups = kWarpKeys / 8, kSteps = kD / 16, kNTiles = kD / 8;
  constexpr int kBoxElems = kTile * 64, kStageElems = (kD / 64) * kBoxElems;  // a tensor's tile: D / 64 boxes
  constexpr bool kHoldK = kD == 64;  // K's fragments held across the stage's release (below)
  static_assert(kWarpKeys % 16 == 0 && kD % 64 == 0, "a warp takes whole k16 steps of keys");
  extern __shared__ unsigned char smem_raw[];
  bf16* const ks = reinterpret_cast<bf16*>(smem_raw + ((1024u - (attn::smem_u32(smem_raw) & 1023u)) & 1023u));
  bf16* const vs = ks + kStages * kStageElems;
  __shared__ __align__(8) uint64_t full[kStages];
  __shared__ float sm_m[kWarps], sm_l[kWarps];
  __shared__ float sm_acc[kWarps][kD];
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, quad = lane % 4;
  const int64_t t0 = int64_t(split) * p.chunk, t1 = min(t0 + p.chunk, int64_t(p.keys));
  const int bh = b * p.H + h;
  const int tiles = int((t1 - t0 + kTile - 1) / kTile);

  // q as the A fragment of each k-step (loaded first, so that it does not queue behind the
  // tiles): a[0] = q[16kk + 2·quad ..], a[2] = q[16kk + 8 + 2·quad ..] (row lane / 4 of the
  // top half); a[1] = a[3] = 0 (rows 8-15).
  uint32_t qa[kSteps][4];
  const bf16* const qp = p.qkv + int64_t(b) * 3 * p.H * kD + h * kD;
  auto load_q = [&] {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      qa[kk][0] = *reinterpret_cast<const uint32_t*>(qp + 16 * kk + 2 * quad);
      qa[kk][2] = *reinterpret_cast<const uint32_t*>(qp + 16 * kk + 8 + 2 * quad);
      qa[kk][1] = qa[kk][3] = 0u;
    }
  };
  const uint64_t policy = sm90::createpolicy_evict_first();  // read once, as in the bulk kernel
  auto issue = [&](int i) {
    const int s = i % kStages, first = int(t0) + i * kTile;
    sm90::mbar_arrive_expect_tx(&full[s], 2u * kStageElems * sizeof(bf16));
#pragma unroll
    for (int box = 0; box < kD / 64; ++box) {
      sm90::tma_load_3d(ks + s * kStageElems + box * kBoxElems, &k_map, &full[s], box * 64, first, bh, policy);
      sm90::tma_load_3d(vs + s * kStageElems + box * kBoxElems, &v_map, &full[s], box * 64, first, bh, policy);
    }
  };
  const int first_tiles = min(kStages, tiles);
  int early = 0;  // thread 0: tiles issued before the wait
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) sm90::mbar_init(&full[s], 1);
    if (cluster && split == 0) sm90::mbar_init(cluster_merge_barrier(), 1);
    sm90::fence_mbar_init();
    if (cluster && split == 0)  // armed for the other splits' partials (merge_in_cluster)
      sm90::mbar_arrive_expect_tx(cluster_merge_barrier(), uint32_t(p.splits - 1) * (kD + 1) * sizeof(float));
    while (early < first_tiles && min(t0 + int64_t(early + 1) * kTile, t1) <= p.settled) issue(early++);
  }
  sm90::griddep_wait();
  load_q();
  if (threadIdx.x == 0)
    for (int i = early; i < first_tiles; ++i) issue(i);
  __syncthreads();
  if (cluster) sm90::cluster_arrive_relaxed();  // this block runs: the others may store into it (merge_in_cluster)

  float m = -INFINITY, l = 0.f;  // the warp's running max of raw scores; this lane's share of Σ p
  float o[kNTiles][4] = {};      // O's n-tile j: o[j][0..1] = columns 8j + 2·quad, +1 (rows 8-15: 0)
  const int row0 = warp * kWarpKeys;  // the warp's first key within a tile

  for (int i = 0; i < tiles; ++i) {
    const int s = i % kStages;
    sm90::mbar_wait_spin(&full[s], uint32_t(i / kStages) & 1u);
    const bf16* const kt = ks + s * kStageElems;
    const bf16* const vt = vs + s * kStageElems;
    // The warp's K and V fragments into registers, so that the stage can be refilled before
    // the arithmetic; at D = 128 K's would not fit beside the rest (ptxas spilled), so the
    // scores' mma take them as they come.
    float sc[kKeyGroups][4] = {};  // scores of key group g: sc[g][0..1] keys 8g + 2·quad, +1
    uint32_t kb[kSteps][kKeyGroups / 2][4];  // K as B: k-step kk, key groups 2g and 2g + 1
    auto scores = [&](int kk, int g, const uint32_t (&b)[4]) {  // key groups 2g and 2g + 1, k-step kk
      attn::mma_16816(sc[2 * g], qa[kk], b[0], b[1]);
      attn::mma_16816(sc[2 * g + 1], qa[kk], b[2], b[3]);
    };
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
      for (int g = 0; g < kKeyGroups / 2; ++g) {
        attn::load_b_pair<64>(kb[kk][g], kt + (kk / 4) * kBoxElems, row0 + 16 * g, kk % 4, lane);
        if constexpr (!kHoldK) scores(kk, g, kb[kk][g]);
      }
    uint32_t vb[kWarpKeys / 16][kNTiles / 2][4];  // V as B: k16 step c, n-tiles 2j and 2j + 1
#pragma unroll
    for (int c = 0; c < kWarpKeys / 16; ++c)
#pragma unroll
      for (int j = 0; j < kNTiles / 2; ++j)
        attn::load_b_pair_trans<64>(vb[c][j], vt + (j / 4) * kBoxElems, row0 + 16 * c, (16 * j) % 64, lane);
    __syncthreads();  // the stage is free
    if (threadIdx.x == 0 && i + kStages < tiles) issue(i + kStages);
    if constexpr (kHoldK) {
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
        for (int g = 0; g < kKeyGroups / 2; ++g) scores(kk, g, kb[kk][g]);
    }

    const int64_t first = t0 + int64_t(i) * kTile + row0;  // the key of the warp's row 0
    if (first + kWarpKeys > t1) {
#pragma unroll
      for (int g = 0; g < kKeyGroups; ++g)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (first + 8 * g + 2 * quad + e >= t1) sc[g][e] = -INFINITY;
    }
    float mx = m;
#pragma unroll
    for (int g = 0; g < kKeyGroups; ++g) mx = fmaxf(mx, fmaxf(sc[g][0], sc[g][1]));
    mx = attn::quad_max(mx);   // the same in every quad: each holds the warp's keys
    if (mx == -INFINITY) continue;  // no key for this warp yet (avoid −inf − (−inf) = NaN)
    const float corr = exp2f((m - mx) * p.scale_log2), mx_scaled = mx * p.scale_log2;  // corr = 0 at the first key
    l *= corr;
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) o[j][0] *= corr, o[j][1] *= corr;
    uint32_t pa[kWarpKeys / 16][4];
#pragma unroll
    for (int g = 0; g < kKeyGroups; ++g) {
      const float p0 = exp2f(fmaf(sc[g][0], p.scale_log2, -mx_scaled));  // 0 for a masked key
      const float p1 = exp2f(fmaf(sc[g][1], p.scale_log2, -mx_scaled));
      l += p0 + p1;
      pa[g / 2][(g % 2) * 2] = attn::pack_bf16(p0, p1);
      pa[g / 2][(g % 2) * 2 + 1] = 0u;
    }
#pragma unroll
    for (int c = 0; c < kWarpKeys / 16; ++c)
#pragma unroll
      for (int j = 0; j < kNTiles / 2; ++j) {
        attn::mma_16816(o[2 * j], pa[c], vb[c][j][0], vb[c][j][1]);
        attn::mma_16816(o[2 * j + 1], pa[c], vb[c][j][2], vb[c][j][3]);
      }
    m = mx;
  }

  l = attn::quad_sum(l);
  if (lane == 0) {
    sm_m[warp] = m * p.scale_log2;  // log2 domain, as merge_groups takes it (−inf: no key)
    sm_l[warp] = l;
  }
  if (lane < 4) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) sm_acc[warp][8 * j + 2 * quad] = o[j][0], sm_acc[warp][8 * j + 2 * quad + 1] = o[j][1];
  }
  __syncthreads();
  merge_groups<Tr, kWarps, /*kInCluster=*/true>(p, sm_m, sm_l, sm_acc, split, h, b, cluster);
#else
  static_assert(Tr::kHeadDim % Tr::kElems == 0, "never launched: the dispatcher checks that sm_90a code was built");
#endif
}

// One kernel variant: decode_kernel (loads into registers, 128 threads) or, kBulk,
// decode_bulk_kernel with kThreads threads a block and tiles of kBulkKB KB (Hopper builds
// only). A tile is 8 KB of K in the register kernel and 16 or 32 KB in the bulk kernel:
// threads × keys per group × 16 bytes, whatever the element type and head dim.
template <class T, int kD, bool kBulk, int kThreads, int kBulkKB = 16, bool kMma = false>
struct Variant {
  static_assert(!kMma || (kBulk && kThreads == 128 && kBulkKB == 16 && std::is_same_v<T, bf16>),
                "the tensor-core kernel: bf16, 128 threads, two stages of 16 KB");
  static constexpr bool kTensorCores = kMma, kBulkCopies = kBulk;
  static constexpr int kTileBytes = kBulk ? kBulkKB * 1024 : kRegisterTileBytes;
  static constexpr int kStages = bulk_stages(kTileBytes);  // (bulk and tensor-core kernels)
  using Tr = Traits<T, kD, kThreads, kTileBytes / 16 / kThreads>;
  static_assert(Tr::kTile * kD * int(sizeof(T)) == kTileBytes, "a tile is kTileBytes of K");
  // (the tensor-core kernel also the slack that aligns its tiles to 1024 bytes, the swizzle's)
  static constexpr size_t kSmemBytes = kBulk ? size_t(kStages) * 2 * kTileBytes + (kMma ? 1024 : 0) : 0;
  // Keys per block at most: the register kernel's chunks were measured no faster when
  // longer (BENCHMARKS.md); a bulk block reads its chunk in one stream, so longer chunks
  // mostly save blocks (decode_max_chunk lowers it where they measured slower).
  static constexpr int64_t kMaxChunk = kBulk ? 16384 : 2048;
  // "registers", or bulk|mma<stages>x<tile KB>KB/<threads>
  static std::string name() {
    if (!kBulk) return "registers";
    return std::string(kMma ? "mma" : "bulk") + std::to_string(kStages) + "x" + std::to_string(kBulkKB) + "KB/" +
           std::to_string(kThreads);
  }
  static constexpr auto kernel() {
    if constexpr (kMma) return decode_mma_kernel<Tr, kStages>;
    else if constexpr (kBulk) return decode_bulk_kernel<Tr, kStages>;
    else return decode_kernel<Tr>;
  }
  // Blocks resident on the whole GPU. One process drives one GPU (docs/ARCHITECTURE.md):
  // computed once, which also opts the kernel into its shared memory.
  static int64_t resident() {
    static const int64_t n = [] {
      int per_sm = 0;
      if (kSmemBytes > 48 * 1024) attn::opt_in_dynamic_smem(kernel(), kSmemBytes);
      CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel(), kThreads, kSmemBytes));
      return int64_t(device_sm_count()) * std::max(per_sm, 1);
    }();
    return n;
  }
  static DecodePlan plan(const AttentionDecode& a, int want_splits) {
    const int64_t sms = device_sm_count();
    const bool cluster = kMma && decode_cluster_merge(std::getenv("FLASHGPT_DECODE_CLUSTER"));
    const int max_cluster = cluster ? kDecodeMaxClusterSplits : 0;
    const int64_t max_chunk = kBulk ? decode_max_chunk(a.B, a.H, a.T, Tr::kTile, resident(), kMaxChunk) : kMaxChunk;
    return plan_decode(a.B, a.H, a.T, Tr::kTile, max_chunk, resident(), sms, want_splits, max_cluster);
  }
};

// The variant of a call: FLASHGPT_DECODE_KERNEL = auto | registers | bulk | mma, for bulk
// FLASHGPT_DECODE_THREADS = 128 | 256 (threads a block) and FLASHGPT_DECODE_TILE_KB = 16 |
// 32 (the tile, decode_bulk_tile_kb). auto at D = 64 is the tensor-core kernel (bf16 caches;
// fp32 ones the bulk kernel of 128 threads): on an H100 0.9-2.6% faster than the bulk
// kernel at D = 64 a call (B = 16 with 1K-8K keys, B = 1 with 16K-64K), where at D = 128
// it was 5-6% slower at batch 1 and level at batch 16 (BENCHMARKS.md, "Sixty-sixth
// session", call 1, both with the L2 merge; the whole GPU suite passed with it as auto).
// Measured on an H200 (BENCHMARKS.md, "Decoding", sixth session; the 36 shapes of the
// suite): the bulk kernel beat the register one on 28 (the register kernel stays 2-6%
// ahead at B = 1 with 16K-32K keys at D = 64 and 1K-8K at D = 128, and at B = 16 with
// 1K-2K keys at D = 64); 256 threads beat 128 at D = 128 with B = 16 (0.97-1.01x of SDPA
// against 0.89-0.98x) but not at D = 64; 2 stages of 8 KB against 4 was a wash. So auto
// at D = 128 is bulk with 256 threads wherever the Hopper kernels are built. threads = 0:
// the register kernel.
struct VariantChoice {
  int threads, tile_kb;
  bool tensor_cores = false;  // the tensor-core kernel (bf16 caches; fp32 ones take the bulk kernel)
};
VariantChoice choose_variant(int D) {
  static const bool hopper = attn::sm90_kernels_built();
  const char* env = std::getenv("FLASHGPT_DECODE_KERNEL");
  const std::string want = env && *env ? env : "auto";
  if (want == "registers") return {0, 8};
  if (want != "bulk" && want != "auto" && want != "mma")
    fail_input("FLASHGPT_DECODE_KERNEL must be auto, registers, bulk or mma, got '", want, "'");
  if (!hopper) {
    if (want == "auto") return {0, 8};
    fail_input("FLASHGPT_DECODE_KERNEL=", want, " needs a Hopper GPU and a build with the 90a architecture");
  }
  if (want == "mma" || (want == "auto" && D == 64)) return {128, 16, true};
  const char* t = std::getenv("FLASHGPT_DECODE_THREADS");
  const int threads = t && *t ? std::atoi(t) : D == 128 ? 256 : 128;
  if (threads != 128 && threads != 256) fail_input("FLASHGPT_DECODE_THREADS must be 128 or 256, got '", t, "'");
  return {threads, decode_bulk_tile_kb(std::getenv("FLASHGPT_DECODE_TILE_KB"))};
}

// Calls f(Variant<T, kD, ...>{}) for the chosen variant.
template <class T, int kD, class F>
auto with_variant(F&& f) {
  const VariantChoice v = choose_variant(kD);
  if (v.threads == 0) return f(Variant<T, kD, /*kBulk=*/false, 128>{});
  if constexpr (std::is_same_v<T, bf16>)
    if (v.tensor_cores) return f(Variant<T, kD, /*kBulk=*/true, 128, 16, /*kMma=*/true>{});
  if (v.tile_kb == 32)
    return v.threads == 128 ? f(Variant<T, kD, /*kBulk=*/true, 128, 32>{}) : f(Variant<T, kD, /*kBulk=*/true, 256, 32>{});
  return v.threads == 128 ? f(Variant<T, kD, /*kBulk=*/true, 128>{}) : f(Variant<T, kD, /*kBulk=*/true, 256>{});
}

template <class T, int kD>
DecodePlan plan_for(const AttentionDecode& a, int want_splits) {
  return with_variant<T, kD>([&](auto v) { return decltype(v)::plan(a, want_splits); });
}

// Workspace: the partial outputs, their log2-sum-exps, then one counter per (b, h); none
// for one split or a merge in a cluster.
size_t workspace_for(int B, int H, int D, const DecodePlan& plan) {
  if (plan.splits <= 1 || plan.cluster) return 0;
  const size_t parts = size_t(B) * H * plan.splits;
  return parts * (D + 1) * sizeof(float) + size_t(B) * H * sizeof(unsigned);
}

}  // namespace

// Runs the statements with T (bf16 or float) and kD (64 or 128) bound for a dtype and a
// head dim; anything else is an InputError.
#define FG_DECODE_DISPATCH(dtype, D, ...)                                                         \
  do {                                                                                            \
    if ((D) != 64 && (D) != 128) fail_input("decoding attention on CUDA supports head dim 64 or 128, got ", (D)); \
    if ((dtype) == DType::bf16) {                                                                 \
      using T = bf16;                                                                             \
      if ((D) == 64) { constexpr int kD = 64; __VA_ARGS__; } else { constexpr int kD = 128; __VA_ARGS__; } \
    } else if ((dtype) == DType::f32) {                                                           \
      using T = float;                                                                            \
      if ((D) == 64) { constexpr int kD = 64; __VA_ARGS__; } else { constexpr int kD = 128; __VA_ARGS__; } \
    } else {                                                                                      \
      fail_input("decoding attention on CUDA takes bf16 or fp32, got ", dtype_name(dtype));      \
    }                                                                                             \
  } while (0)

namespace {

void check_tensor(const Tensor& t, const char* what, DType dtype, int64_t numel) {
  FG_ASSERT(t.defined() && t.device == Device::cuda, "flash decode: ", what, " must be on the GPU");
  FG_ASSERT(t.dtype == dtype, "flash decode: ", what, " is ", dtype_name(t.dtype), ", expected ", dtype_name(dtype));
  FG_ASSERT(t.numel() == numel, "flash decode: ", what, " ", t.shape_str(), " has ", t.numel(), " elements, expected ", numel);
  FG_ASSERT(aligned16(t.data), "flash decode: ", what, " must be 16-byte aligned");
}

void check_cache(const Tensor& k, const Tensor& v, DType dtype, int B, int H, int D) {
  for (const Tensor* c : {&k, &v}) {
    FG_ASSERT(c->ndim == 4 && c->shape[0] == B && c->shape[1] == H && c->shape[3] == D,
              "KV cache ", c->shape_str(), " is not (B=", B, ", H=", H, ", Tmax, D=", D, ")");
    check_tensor(*c, "KV cache", dtype, c->numel());
  }
  FG_ASSERT(k.shape[2] == v.shape[2], "k and v caches differ in capacity");
}

template <class T>
__global__ void kv_cache_write_kernel(T* __restrict__ kc, T* __restrict__ vc, const T* __restrict__ qkv, int n, int H,
                                      int D, int64_t Tmax, int pos, int64_t packs) {
  constexpr int E = Pack<T>::N;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= packs) return;
  const int per_row = D / E;  // packs per head row
  const int c = int(i % per_row);
  const int64_t row = i / per_row;  // (b, t, h)
  const int hh = int(row % H);
  const int64_t bt = row / H;
  const int t = int(bt % n);
  const int64_t b = bt / n;
  const T* src = qkv + (bt * 3 * H + hh) * D + c * E;
  const int64_t dst = ((b * H + hh) * Tmax + pos + t) * D + c * E;
  store_pack(kc + dst, load_pack(src + int64_t(H) * D));
  store_pack(vc + dst, load_pack(src + 2 * int64_t(H) * D));
}

}  // namespace

size_t flash_decode_workspace_bytes(const AttentionDecode& a, int splits) {
  FG_DECODE_DISPATCH(a.qkv.dtype, a.D, {
    return workspace_for(a.B, a.H, kD, plan_for<T, kD>(a, splits));
  });
  return 0;  // not reached
}

std::string flash_decode_kernel(int D, DType dtype) {
  FG_DECODE_DISPATCH(dtype, D, { return with_variant<T, kD>([](auto v) { return decltype(v)::name(); }); });
  return "";  // not reached
}

int flash_decode_splits(const AttentionDecode& a, int splits) {
  FG_DECODE_DISPATCH(a.qkv.dtype, a.D, { return plan_for<T, kD>(a, splits).splits; });
  return 0;  // not reached
}

void flash_decode(const AttentionDecode& a, void* workspace, size_t workspace_bytes, cudaStream_t stream, int splits) {
  const DType dt = a.qkv.dtype;
  FG_ASSERT(a.B >= 1 && a.H >= 1 && a.B <= 65535 && a.H <= 65535, "flash decode: B=", a.B, " H=", a.H);
  if (a.D != 64 && a.D != 128) fail_input("decoding attention on CUDA supports head dim 64 or 128, got ", a.D);
  if (dt != DType::bf16 && dt != DType::f32) fail_input("decoding attention on CUDA takes bf16 or fp32, got ", dtype_name(dt));
  check_cache(a.k_cache, a.v_cache, dt, a.B, a.H, a.D);
  FG_ASSERT(a.T >= 1 && a.T <= a.k_cache.shape[2], "flash decode: T = ", a.T, " outside [1, cache capacity ",
            a.k_cache.shape[2], "]");
  check_tensor(a.qkv, "qkv", dt, int64_t(a.B) * 3 * a.H * a.D);
  check_tensor(a.out, "out", dt, int64_t(a.B) * a.H * a.D);
  if (a.lse.defined()) check_tensor(a.lse, "lse", DType::f32, int64_t(a.B) * a.H);
  FG_DECODE_DISPATCH(dt, a.D, {
    with_variant<T, kD>([&](auto v) {
      using V = decltype(v);
      const DecodePlan plan = V::plan(a, splits);  // also opts the kernel into its shared memory
      DecodeParams<T> p{};
      p.qkv = a.qkv.as<T>();
      p.k = a.k_cache.as<T>();
      p.v = a.v_cache.as<T>();
      p.out = a.out.as<T>();
      p.lse = a.lse.defined() ? a.lse.as<float>() : nullptr;
      p.H = a.H;
      p.keys = a.T;
      p.splits = plan.splits;
      p.Tmax = a.k_cache.shape[2];
      p.chunk = plan.chunk;
      p.scale_log2 = kLog2e / std::sqrt(float(kD));
      // The Hopper kernels start while the kernel before them finishes (programmatic
      // dependent launch), loading the settled keys' first tiles before they wait for it.
      const bool overlap = V::kBulkCopies && decode_overlap(std::getenv("FLASHGPT_DECODE_PDL"));
      p.settled = overlap ? std::clamp<int64_t>(a.settled, 0, a.T) : 0;
      if (plan.splits > 1 && !plan.cluster) {
        const size_t parts = size_t(a.B) * a.H * plan.splits, need = workspace_for(a.B, a.H, kD, plan);
        FG_ASSERT(workspace && workspace_bytes >= need, "flash decode: workspace of ", workspace_bytes,
                  " bytes, needs ", need);
        p.o_part = static_cast<float*>(workspace);
        p.lse_part = p.o_part + parts * kD;
        p.done = reinterpret_cast<unsigned*>(p.lse_part + parts);
      }
      // A cluster plan: the splits of a (b, h), consecutive in x, are one cluster.
      cudaLaunchAttribute attrs[2]{};
      unsigned n_attrs = 0;
      if (plan.cluster) {
        attrs[n_attrs].id = cudaLaunchAttributeClusterDimension;
        attrs[n_attrs].val.clusterDim.x = unsigned(plan.splits);
        attrs[n_attrs].val.clusterDim.y = attrs[n_attrs].val.clusterDim.z = 1;
        ++n_attrs;
      }
      if (overlap) {
        attrs[n_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n_attrs].val.programmaticStreamSerializationAllowed = 1;
        ++n_attrs;
      }
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(unsigned(plan.splits), unsigned(a.H), unsigned(a.B));
      cfg.blockDim = dim3(V::Tr::kThreads);
      cfg.dynamicSmemBytes = V::kSmemBytes;
      cfg.stream = stream;
      cfg.attrs = attrs;
      cfg.numAttrs = n_attrs;
      if constexpr (V::kTensorCores) {
        // The caches as (D, T, B·H) tensors of rows Tmax apart a (b, h): keys past T come as zeros.
        const uint64_t dims[3] = {uint64_t(kD), uint64_t(a.T), uint64_t(a.B) * uint64_t(a.H)};
        const uint64_t strides[2] = {uint64_t(kD) * sizeof(T), uint64_t(p.Tmax) * kD * sizeof(T)};
        const uint32_t box[3] = {64, uint32_t(V::Tr::kTile), 1};
        const CUtensorMap k_map = attn::tensor_map_3d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, p.k, dims, strides, box, "K cache");
        const CUtensorMap v_map = attn::tensor_map_3d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, p.v, dims, strides, box, "V cache");
        CUDA_CHECK(cudaLaunchKernelEx(&cfg, V::kernel(), k_map, v_map, p, plan.cluster));
      } else {
        CUDA_CHECK(cudaLaunchKernelEx(&cfg, V::kernel(), p));
      }
    });
    CUDA_CHECK_LAUNCH();
  });
}

void kv_cache_write(const KVCacheWrite& a, cudaStream_t stream) {
  const DType dt = a.qkv.dtype;
  check_cache(a.k_cache, a.v_cache, dt, a.B, a.H, a.D);
  FG_ASSERT(a.n >= 1 && a.pos >= 0 && a.pos + a.n <= a.k_cache.shape[2], "kv_cache_write: positions [", a.pos, ", ",
            a.pos + a.n, ") outside the cache capacity ", a.k_cache.shape[2]);
  check_tensor(a.qkv, "qkv", dt, int64_t(a.B) * a.n * 3 * a.H * a.D);
  FG_DISPATCH_FLOAT(dt, T, {
    FG_ASSERT(a.D % Pack<T>::N == 0, "kv_cache_write: head dim ", a.D, " must be a multiple of ", Pack<T>::N);
    const int64_t packs = int64_t(a.B) * a.n * a.H * (a.D / Pack<T>::N);
    constexpr int kBlock = 256;
    kv_cache_write_kernel<T><<<unsigned(ceil_div(packs, kBlock)), kBlock, 0, stream>>>(
        a.k_cache.as<T>(), a.v_cache.as<T>(), a.qkv.as<T>(), a.n, a.H, a.D, a.k_cache.shape[2], a.pos, packs);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace flashgpt::cuda
