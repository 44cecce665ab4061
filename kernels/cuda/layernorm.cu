// LayerNorm (eps 1e-5), optionally fused with the residual add before it.
//   forward:  x = inp1 [+ inp2, stored as `residual`];  mean, rstd of x;
//             out = (x - mean)·rstd·w + b                       (one warp per row)
//   backward: xhat = (x - mean)·rstd,  g = dout·w
//             dinp += rstd·(g - mean(g) - xhat·mean(g·xhat))    (one warp per row)
//             dw += Σ_rows dout·xhat,  db += Σ_rows dout         (deterministic:)
// The column sums are deterministic (no float atomics): each lane keeps its columns'
// sums over its rows in registers, the block adds its warps in a fixed order and writes
// one partial per block; a second kernel adds the block partials in a fixed order into
// dw, db. The grid is all the blocks that fit on the device, so the bits are the same
// from run to run on one device (not across devices with other SM counts). Statistics
// are computed in fp32 from the rounded residual, which is what the next layers read.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace flashgpt::cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kWarpsPerBlock = 4;  // forward

// ---------------------------------------------------------------- kernels

template <class T, bool kResidual>
__global__ void layernorm_forward_kernel(T* __restrict__ residual, T* __restrict__ out,
                                         float* __restrict__ mean, float* __restrict__ rstd,
                                         const T* __restrict__ inp1, const T* __restrict__ inp2,
                                         const T* __restrict__ w, const T* __restrict__ b,
                                         int64_t N, int C) {
  constexpr int P = Pack<T>::N;
  int lane = threadIdx.x % kWarpSize;
  int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const T* x = inp1 + row * C;
  if (kResidual) {
    // residual = inp1 + inp2, rounded; the statistics below read it back (same lane,
    // same addresses: no synchronisation needed).
    T* r = residual + row * C;
    for (int c = lane * P; c < C; c += kWarpSize * P) {
      Pack<T> a = load_pack_cs(inp1 + row * C + c), bb = load_pack_cs(inp2 + row * C + c), s;
#pragma unroll
      for (int k = 0; k < P; ++k) s.v[k] = from_f<T>(to_f(a.v[k]) + to_f(bb.v[k]));
      store_pack(r + c, s);
    }
    x = r;
  }
  float sum = 0.f;
  for (int c = lane * P; c < C; c += kWarpSize * P) {
    Pack<T> a = load_pack(x + c);
#pragma unroll
    for (int k = 0; k < P; ++k) sum += to_f(a.v[k]);
  }
  float m = warp_sum(sum) / C;
  float var = 0.f;
  for (int c = lane * P; c < C; c += kWarpSize * P) {
    Pack<T> a = load_pack(x + c);
#pragma unroll
    for (int k = 0; k < P; ++k) { float d = to_f(a.v[k]) - m; var += d * d; }
  }
  float rs = rsqrtf(warp_sum(var) / C + kEps);
  for (int c = lane * P; c < C; c += kWarpSize * P) {
    Pack<T> a = load_pack(x + c), wp = load_pack(w + c), bp = load_pack(b + c), o;
#pragma unroll
    for (int k = 0; k < P; ++k)
      o.v[k] = from_f<T>((to_f(a.v[k]) - m) * rs * to_f(wp.v[k]) + to_f(bp.v[k]));
    store_pack(out + row * C + c, o);
  }
  if (lane == 0) { mean[row] = m; rstd[row] = rs; }
}

// Backward: one warp per row, the warps of the grid striding over the rows (the grid is
// as many blocks as fit on the device at once). Lane `lane` owns the columns of packs
// j·32 + lane (j < kPacks); a row's inp, dout (and dinp) are read once into registers,
// and the lane's dw, db column sums stay in registers over all its rows. At the end the
// block's warps add their sums into shared memory one warp after another (fixed order),
// and the block writes one partial (2, C) to `partials`.
//
// Registers (ptxas, sm_90a): the compiler keeps the bf16 row unpacked to fp32, so a lane
// holds ~4 floats per column (x, dy, dw, db) plus the dinp prefetch; bf16 C = 768 (3
// packs) takes 160 registers, i.e. 3 blocks of 4 warps per SM, ~55 KB of loads in flight
// per SM. Where that would pass ~210 registers the dinp prefetch goes (dinp is loaded
// after the row sums), and beyond that the row is read again in the second loop instead
// of kept (L1/L2 hits). No spills up to bf16 C = 1536 and fp32 C = 1664; bf16 C = 1600
// spills 8 bytes, C = 2048 ~300 (ptxas -v, sm_90a). w is read per row (L1 hits):
// kept across rows, the compiler hoists its fp32 conversion out of the loop (+1 float
// per column).
constexpr int kBwdWarps = 4;
constexpr int kBwdThreads = kBwdWarps * kWarpSize;
template <class T> constexpr int kBwdMaxPacks = sizeof(T) == 2 ? 8 : 13;  // bf16 C ≤ 2048, fp32 C ≤ 1664

template <class T, int kPacks>
struct BwdPlan {
  static constexpr int kCols = kPacks * Pack<T>::N;          // columns per lane
  static constexpr int kPackRegs = kPacks * kPackBytes / 4;  // registers of one packed row array
  static constexpr bool kKeepRow = 4 * kCols + 24 <= 210;
  static constexpr bool kPrefetchDinp = kKeepRow && 4 * kCols + kPackRegs + 24 <= 210;
};

// Dynamic shared memory: 2 × C floats (the block's dw, db partial).
// partials: (gridDim.x, 2, C) fp32. Needs C a multiple of P and C ≤ 32·P·kPacks.
template <class T, int kPacks>
__global__ void __launch_bounds__(kBwdThreads)
layernorm_backward_kernel(T* __restrict__ dinp, float* __restrict__ partials,
                          const T* __restrict__ dout, const T* __restrict__ inp,
                          const T* __restrict__ w, const float* __restrict__ mean,
                          const float* __restrict__ rstd, int64_t N, int C) {
  using Plan = BwdPlan<T, kPacks>;
  constexpr int P = Pack<T>::N;
  extern __shared__ float block_part[];  // (2, C): dw then db
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  // First column of this lane's pack j. C is a multiple of P, so a pack lies wholly
  // inside or wholly past the row; only the last j can be past it.
  auto col = [&](int j) { return (j * kWarpSize + lane) * P; };

  float dw[Plan::kCols], db[Plan::kCols];
#pragma unroll
  for (int i = 0; i < Plan::kCols; ++i) dw[i] = db[i] = 0.f;

  for (int64_t row = int64_t(blockIdx.x) * kBwdWarps + warp; row < N;
       row += int64_t(gridDim.x) * kBwdWarps) {
    const int64_t off = row * C;
    Pack<T> x[kPacks], dy[kPacks], di[kPacks], wv[kPacks];
    // Every load of the row first: 2 or 3 × kPacks independent 16-byte loads in flight.
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (col(j) >= C) continue;
      if constexpr (Plan::kKeepRow) {
        x[j] = load_pack_cs(inp + off + col(j));  // read once: evict first
        dy[j] = load_pack_cs(dout + off + col(j));
      } else {
        x[j] = load_pack(inp + off + col(j));  // read twice: the second from L1/L2
        dy[j] = load_pack(dout + off + col(j));
      }
      if constexpr (Plan::kPrefetchDinp) di[j] = load_pack(dinp + off + col(j));
    }
    const float m = mean[row], rs = rstd[row];
    float sum_g = 0.f, sum_gx = 0.f;  // Σ g, Σ g·xhat over this lane's columns
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (col(j) >= C) continue;
      wv[j] = load_pack(w + col(j));
#pragma unroll
      for (int k = 0; k < P; ++k) {
        float xhat = (to_f(x[j].v[k]) - m) * rs, d = to_f(dy[j].v[k]);
        float g = d * to_f(wv[j].v[k]);
        sum_g += g;
        sum_gx += g * xhat;
        dw[j * P + k] += d * xhat;
        db[j * P + k] += d;
      }
    }
    const float mean_g = warp_sum(sum_g) / C, mean_gx = warp_sum(sum_gx) / C;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (col(j) >= C) continue;
      if constexpr (!Plan::kPrefetchDinp) di[j] = load_pack(dinp + off + col(j));
      if constexpr (!Plan::kKeepRow) {
        x[j] = load_pack(inp + off + col(j));
        dy[j] = load_pack(dout + off + col(j));
      }
      wv[j] = load_pack(w + col(j));
#pragma unroll
      for (int k = 0; k < P; ++k) {
        float xhat = (to_f(x[j].v[k]) - m) * rs;
        float g = to_f(dy[j].v[k]) * to_f(wv[j].v[k]);
        di[j].v[k] = from_f<T>(to_f(di[j].v[k]) + rs * (g - mean_g - xhat * mean_gx));
      }
      store_pack(dinp + off + col(j), di[j]);
    }
  }

  // Block partial: warp 0 writes its sums, then warps 1, 2, ... add theirs in turn. Each
  // column c < C belongs to exactly one lane of every warp, so every entry is written.
  for (int turn = 0; turn < kBwdWarps; ++turn) {
    if (warp == turn) {
#pragma unroll
      for (int j = 0; j < kPacks; ++j) {
        if (col(j) >= C) continue;
#pragma unroll
        for (int k = 0; k < P; ++k) {
          int c = col(j) + k;
          block_part[c] = (turn == 0 ? 0.f : block_part[c]) + dw[j * P + k];
          block_part[C + c] = (turn == 0 ? 0.f : block_part[C + c]) + db[j * P + k];
        }
      }
    }
    __syncthreads();
  }
  float* dst = partials + int64_t(blockIdx.x) * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += kBwdThreads) dst[c] = block_part[c];
}

// The same backward with each warp's rows streamed through shared memory (the default
// wherever its shared memory fits a block; FLASHGPT_LN_BWD=registers runs the kernel above). Each lane copies its own packs of a
// row's inp, dout and dinp with cp.async into one of kRowStages stages of its warp, so
// the next row is in flight while this one is computed, and the lane reads back only
// what it copied itself (cp.async.wait_group is the only synchronisation). x and dout
// are read from shared memory in both passes instead of kept in registers, which leaves
// the registers to the dw, db sums; the lane's next mean and rstd are loaded a row ahead.
constexpr int kRowStages = 2;

__device__ __forceinline__ void copy16_async(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(uint32_t(__cvta_generic_to_shared(smem))),
               "l"(gmem) : "memory");
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void copy_wait_all_but_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// Dynamic shared memory of the staged kernel: the block's (2, C) fp32 partial, then per
// warp kRowStages × (inp, dout, dinp) rows of C.
template <class T>
size_t staged_smem_bytes(int C) {
  return 2 * size_t(C) * sizeof(float) + size_t(kBwdWarps) * kRowStages * 3 * size_t(C) * sizeof(T);
}

template <class T, int kPacks>
__global__ void __launch_bounds__(kBwdThreads)
layernorm_backward_staged_kernel(T* __restrict__ dinp, float* __restrict__ partials,
                                 const T* __restrict__ dout, const T* __restrict__ inp,
                                 const T* __restrict__ w, const float* __restrict__ mean,
                                 const float* __restrict__ rstd, int64_t N, int C) {
  constexpr int P = Pack<T>::N, kCols = kPacks * P;
  extern __shared__ __align__(16) unsigned char ln_smem[];
  float* block_part = reinterpret_cast<float*>(ln_smem);  // (2, C): dw then db
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  T* const stages = reinterpret_cast<T*>(block_part + 2 * C) + size_t(warp) * kRowStages * 3 * C;
  auto col = [&](int j) { return (j * kWarpSize + lane) * P; };
  auto slot = [&](int stage, int which) { return stages + (stage * 3 + which) * C; };  // which: x, dy, dinp
  // Row `row` (if < N) into `stage`; always one commit group, so the count stays uniform.
  auto fetch = [&](int64_t row, int stage) {
    if (row < N) {
#pragma unroll
      for (int j = 0; j < kPacks; ++j) {
        if (col(j) >= C) continue;
        copy16_async(slot(stage, 0) + col(j), inp + row * C + col(j));
        copy16_async(slot(stage, 1) + col(j), dout + row * C + col(j));
        copy16_async(slot(stage, 2) + col(j), dinp + row * C + col(j));
      }
    }
    copy_commit();
  };

  float dw[kCols], db[kCols];
#pragma unroll
  for (int i = 0; i < kCols; ++i) dw[i] = db[i] = 0.f;

  const int64_t stride = int64_t(gridDim.x) * kBwdWarps;
  int64_t row = int64_t(blockIdx.x) * kBwdWarps + warp;
  fetch(row, 0);
  float m_next = row < N ? mean[row] : 0.f, rs_next = row < N ? rstd[row] : 0.f;
  for (int stage = 0; row < N; row += stride, stage ^= 1) {
    const float m = m_next, rs = rs_next;
    fetch(row + stride, stage ^ 1);  // that stage's row was finished last iteration
    if (row + stride < N) m_next = mean[row + stride], rs_next = rstd[row + stride];
    copy_wait_all_but_one();  // this row has landed
    const int64_t off = row * C;
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (col(j) >= C) continue;
      const Pack<T> x = load_pack(slot(stage, 0) + col(j)), dy = load_pack(slot(stage, 1) + col(j));
      const Pack<T> wv = load_pack(w + col(j));
#pragma unroll
      for (int k = 0; k < P; ++k) {
        const float xhat = (to_f(x.v[k]) - m) * rs, d = to_f(dy.v[k]);
        const float g = d * to_f(wv.v[k]);
        sum_g += g;
        sum_gx += g * xhat;
        dw[j * P + k] += d * xhat;
        db[j * P + k] += d;
      }
    }
    const float mean_g = warp_sum(sum_g) / C, mean_gx = warp_sum(sum_gx) / C;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (col(j) >= C) continue;
      const Pack<T> x = load_pack(slot(stage, 0) + col(j)), dy = load_pack(slot(stage, 1) + col(j));
      const Pack<T> wv = load_pack(w + col(j));
      Pack<T> di = load_pack(slot(stage, 2) + col(j));
#pragma unroll
      for (int k = 0; k < P; ++k) {
        const float xhat = (to_f(x.v[k]) - m) * rs;
        const float g = to_f(dy.v[k]) * to_f(wv.v[k]);
        di.v[k] = from_f<T>(to_f(di.v[k]) + rs * (g - mean_g - xhat * mean_gx));
      }
      store_pack(dinp + off + col(j), di);
    }
  }

  // Block partial, as in layernorm_backward_kernel.
  for (int turn = 0; turn < kBwdWarps; ++turn) {
    if (warp == turn) {
#pragma unroll
      for (int j = 0; j < kPacks; ++j) {
        if (col(j) >= C) continue;
#pragma unroll
        for (int k = 0; k < P; ++k) {
          int c = col(j) + k;
          block_part[c] = (turn == 0 ? 0.f : block_part[c]) + dw[j * P + k];
          block_part[C + c] = (turn == 0 ? 0.f : block_part[C + c]) + db[j * P + k];
        }
      }
    }
    __syncthreads();
  }
  float* dst = partials + int64_t(blockIdx.x) * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += kBwdThreads) dst[c] = block_part[c];
}

// dw[c] += Σ_g partials[g][0][c];  db[c] += Σ_g partials[g][1][c]   (fixed order).
// Block (32, 32): 32 of the 2C columns (x) × 32 strided slices of the blocks (y); slice y
// sums g = y, y + 32, ... in order, then thread y = 0 adds the 32 slices in order.
constexpr int kReduceCols = 32, kReduceSlices = 32;
__global__ void __launch_bounds__(kReduceCols * kReduceSlices)
layernorm_reduce_kernel(float* __restrict__ dw, float* __restrict__ db,
                        const float* __restrict__ partials, int blocks, int C) {
  __shared__ float slice[kReduceSlices][kReduceCols + 1];
  const int q = blockIdx.x * kReduceCols + threadIdx.x;  // column of the (2C) view
  float s = 0.f;
  if (q < 2 * C) {
#pragma unroll 4
    for (int g = threadIdx.y; g < blocks; g += kReduceSlices) s += partials[int64_t(g) * 2 * C + q];
  }
  slice[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || q >= 2 * C) return;
  float t = 0.f;
  for (int y = 0; y < kReduceSlices; ++y) t += slice[y][threadIdx.x];
  if (q < C) dw[q] += t;
  else db[q - C] += t;
}

template <class T>
using BackwardKernel = void (*)(T*, float*, const T*, const T*, const T*, const float*,
                                const float*, int64_t, int);

// The instantiation with exactly `packs` packs per lane.
template <class T, bool kStaged, int kPacks = 1>
BackwardKernel<T> backward_kernel(int packs) {
  if constexpr (kPacks > kBwdMaxPacks<T>) {
    ::flashgpt::fail("layernorm_backward: no instantiation for ", packs, " packs per lane");
  } else {
    if (packs == kPacks) return kStaged ? layernorm_backward_staged_kernel<T, kPacks> : layernorm_backward_kernel<T, kPacks>;
    return backward_kernel<T, kStaged, kPacks + 1>(packs);
  }
}

// Packs per lane for C in dtype T, or 0 where the kernel does not take this C.
template <class T>
int backward_packs(int64_t C) {
  constexpr int P = Pack<T>::N;
  int64_t packs = ceil_div(C, kWarpSize * P);
  return C > 0 && C % P == 0 && packs <= kBwdMaxPacks<T> ? int(packs) : 0;
}

// Whether the staged kernel's shared memory fits one block on this GPU (all of ours on
// an H100/H200; on an A100, whose blocks get 163 KB, not fp32 rows of C > 1,604). One
// process drives one GPU (docs/ARCHITECTURE.md): the limit is read once.
template <class T>
bool staged_fits(int C) {
  static const size_t limit = size_t(current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  return staged_smem_bytes<T>(C) <= limit;
}

// Blocks of the backward kernel resident on the whole GPU at once, at most
// kBwdMaxBlocksPerSm per SM (train/memory_plan.cpp sizes the partials with that bound),
// with its shared memory opted in above 48 KB. Worked out once per (kernel, shared
// memory): a training step's calls then query nothing.
constexpr int kBwdMaxBlocksPerSm = 8;
int resident_blocks(const void* kernel, size_t smem) {
  static std::map<std::pair<const void*, size_t>, int> known;
  const auto [it, added] = known.try_emplace({kernel, smem}, 0);
  if (added) {
    if (smem > 48 * 1024)
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBwdThreads, smem));
    FG_ASSERT(per_sm > 0, "layernorm backward kernel does not fit on an SM: ", smem, " bytes of shared memory");
    it->second = device_sm_count() * std::min(per_sm, kBwdMaxBlocksPerSm);
  }
  return it->second;
}

// FLASHGPT_LN_BWD = auto (the default: staged where it fits, else registers) | staged |
// registers: which backward kernel runs for rows of C in dtype T.
template <class T>
bool staged_backward(int C) {
  const char* env = std::getenv("FLASHGPT_LN_BWD");
  const std::string want = env && *env ? env : "auto";
  if (want != "auto" && want != "staged" && want != "registers")
    fail_input("FLASHGPT_LN_BWD must be auto, staged or registers, got '", want, "'");
  if (want == "registers") return false;
  const bool fits = staged_fits<T>(C);
  if (want == "staged" && !fits)
    fail_input("FLASHGPT_LN_BWD=staged: its ", staged_smem_bytes<T>(C), " bytes of shared memory for C = ", C,
               " do not fit a block of this GPU");
  return fits;
}

// A backward kernel for (T, C) with its dynamic shared memory.
template <class T>
struct BackwardLaunch {
  BackwardKernel<T> kernel;
  size_t smem;
  BackwardLaunch(bool staged, int C)
      : kernel(staged ? backward_kernel<T, true>(backward_packs<T>(C)) : backward_kernel<T, false>(backward_packs<T>(C))),
        smem(staged ? staged_smem_bytes<T>(C) : 2 * size_t(C) * sizeof(float)) {}
  // Blocks of the grid: all that fit on the device at once (fewer for small N). Fixed per
  // (device, kernel, dtype, N, C), and so is the order of the dw, db sums.
  int blocks(int64_t N) const {
    return int(std::min<int64_t>(ceil_div(N, kBwdWarps), resident_blocks(reinterpret_cast<const void*>(kernel), smem)));
  }
};

}  // namespace

// ---------------------------------------------------------------- launchers

void layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd, Tensor inp1,
                       Tensor inp2, Tensor weight, Tensor bias, cudaStream_t stream) {
  int C = int(weight.numel());
  int64_t N = inp1.numel() / C;
  bool fused = residual.defined();
  FG_ASSERT(fused == inp2.defined(), "residual and inp2 go together");
  FG_ASSERT(out.numel() == N * C && inp1.numel() == N * C, "layernorm shapes");
  FG_ASSERT(!fused || (residual.numel() == N * C && inp2.numel() == N * C), "residual shapes");
  FG_ASSERT(mean.dtype == DType::f32 && rstd.dtype == DType::f32 && mean.numel() == N &&
                rstd.numel() == N, "mean, rstd must be (N) fp32");
  FG_ASSERT(out.dtype == inp1.dtype && weight.dtype == out.dtype && bias.dtype == out.dtype,
            "layernorm dtypes differ");
  FG_ASSERT(aligned16(out.data) && aligned16(inp1.data) && aligned16(weight.data) &&
                aligned16(bias.data) && (!fused || (aligned16(residual.data) && aligned16(inp2.data))),
            "layernorm needs 16-byte aligned tensors");
  unsigned grid = unsigned(ceil_div(N, kWarpsPerBlock));
  FG_DISPATCH_FLOAT(out.dtype, T, {
    FG_ASSERT(C % Pack<T>::N == 0, "C=", C, " must be a multiple of ", Pack<T>::N);
    if (fused)
      layernorm_forward_kernel<T, true><<<grid, kWarpsPerBlock * kWarpSize, 0, stream>>>(
          residual.as<T>(), out.as<T>(), mean.as<float>(), rstd.as<float>(), inp1.as<T>(),
          inp2.as<T>(), weight.as<T>(), bias.as<T>(), N, C);
    else
      layernorm_forward_kernel<T, false><<<grid, kWarpsPerBlock * kWarpSize, 0, stream>>>(
          nullptr, out.as<T>(), mean.as<float>(), rstd.as<float>(), inp1.as<T>(), nullptr,
          weight.as<T>(), bias.as<T>(), N, C);
    CUDA_CHECK_LAUNCH();
  });
}

// Sized for whichever dtype and kernel needs more blocks (the caller does not say which
// it uses, and FLASHGPT_LN_BWD may change between plan and call).
size_t layernorm_backward_scratch_bytes(int64_t N, int64_t C) {
  int64_t blocks = 0;
  if (N <= 0) return 0;
  for (bool staged : {false, true}) {
    if (backward_packs<float>(C) && (!staged || staged_fits<float>(int(C))))
      blocks = std::max<int64_t>(blocks, BackwardLaunch<float>(staged, int(C)).blocks(N));
    if (backward_packs<bf16>(C) && (!staged || staged_fits<bf16>(int(C))))
      blocks = std::max<int64_t>(blocks, BackwardLaunch<bf16>(staged, int(C)).blocks(N));
  }
  return size_t(blocks) * 2 * size_t(C) * sizeof(float);
}

void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                        Tensor weight, Tensor mean, Tensor rstd, void* scratch,
                        cudaStream_t stream) {
  int C = int(weight.numel());
  int64_t N = inp.numel() / C;
  FG_ASSERT(dinp.numel() == N * C && dout.numel() == N * C, "layernorm backward shapes");
  FG_ASSERT(dweight.dtype == DType::f32 && dbias.dtype == DType::f32, "LN grads are fp32");
  FG_ASSERT(dweight.numel() == C && dbias.numel() == C, "dweight, dbias must be (C)");
  FG_ASSERT(mean.dtype == DType::f32 && rstd.dtype == DType::f32 && mean.numel() == N &&
                rstd.numel() == N, "mean, rstd must be (N) fp32");
  FG_ASSERT(dinp.dtype == inp.dtype && dout.dtype == inp.dtype && weight.dtype == inp.dtype,
            "layernorm backward dtypes differ");
  FG_ASSERT(aligned16(dinp.data) && aligned16(dout.data) && aligned16(inp.data) &&
                aligned16(weight.data), "layernorm needs 16-byte aligned tensors");
  if (N == 0) return;
  int blocks = 0;
  FG_DISPATCH_FLOAT(inp.dtype, T, {
    constexpr int P = Pack<T>::N;
    FG_ASSERT(C % P == 0, "C=", C, " must be a multiple of ", P);
    FG_ASSERT(backward_packs<T>(C) > 0, "layernorm_backward takes C ≤ ",
              kWarpSize * P * kBwdMaxPacks<T>, " in this dtype, got ", C);
    // The scratch holds (blocks, 2, C) fp32, blocks as layernorm_backward_scratch_bytes.
    const BackwardLaunch<T> launch(staged_backward<T>(C), C);
    blocks = launch.blocks(N);
    launch.kernel<<<blocks, kBwdThreads, launch.smem, stream>>>(
        dinp.as<T>(), static_cast<float*>(scratch), dout.as<T>(), inp.as<T>(), weight.as<T>(), mean.as<float>(),
        rstd.as<float>(), N, C);
    CUDA_CHECK_LAUNCH();
  });
  dim3 reduce_block(kReduceCols, kReduceSlices);
  layernorm_reduce_kernel<<<unsigned(ceil_div(2 * C, kReduceCols)), reduce_block, 0, stream>>>(
      dweight.as<float>(), dbias.as<float>(), static_cast<const float*>(scratch), blocks, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace flashgpt::cuda
