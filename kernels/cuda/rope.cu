// Rotary position embedding, in place on the QKV activation (ops.h, kRopeBase):
//   for row n = b·T + t, each head h of q and of k, i < D/2:
//     (x_i, x_{i+D/2}) ← (x_i·cos φ − x_{i+D/2}·sin φ, x_{i+D/2}·cos φ + x_i·sin φ),
//     φ = ±(pos0 + t)·θ_i (− for the backward, which rotates the gradient back; pos0 > 0
//     for a decode step's rows after the KV cache).
// One thread per (row, i): one fp64 sincos (an fp32 angle would be off by ~0.03 rad at
// t = 10^6), then the 2·H rotations of that pair in fp32. The frequencies θ_i come from
// the host (rope_inv_freq, the CPU reference's own function), so both agree bit for bit.
// Indices are 64-bit: N·3·H·D passes 2^31 at a million tokens.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace flashgpt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHalf = 64;  // head dim ≤ 128

struct RopeFreqs {
  double inv_freq[kMaxHalf];
};

// ---------------------------------------------------------------- kernels

template <class T>
__global__ void rope_kernel(T* __restrict__ qkv, int64_t N, int T_len, int64_t pos0, int H, int half,
                            const RopeFreqs f, double sign) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= N * half) return;
  const int64_t n = idx / half;
  const int i = int(idx % half);
  double s, c;
  sincos(double(pos0 + n % T_len) * f.inv_freq[i], &s, &c);
  const float cf = float(c), sf = float(sign * s);
  const int D = 2 * half;
  T* row = qkv + n * 3 * int64_t(H) * D;
  for (int part = 0; part < 2; ++part)  // q, then k
    for (int h = 0; h < H; ++h) {
      T* head = row + (int64_t(part) * H + h) * D;
      const float a = to_f(head[i]), b = to_f(head[i + half]);
      head[i] = from_f<T>(a * cf - b * sf);
      head[i + half] = from_f<T>(b * cf + a * sf);
    }
}

}  // namespace

// ---------------------------------------------------------------- launchers

void rope(Tensor qkv, int T_len, int H, bool inverse, int64_t pos0, cudaStream_t stream) {
  FG_ASSERT(qkv.ndim == 2 && T_len > 0 && H > 0 && qkv.shape[0] % T_len == 0 &&
                qkv.shape[1] % (3 * H) == 0,
            "rope: qkv must be (B·T, 3·H·D), got ", qkv.shape_str(), " for T = ", T_len, ", H = ", H);
  FG_ASSERT(pos0 >= 0, "rope: the first position must not be negative, got ", pos0);
  const int64_t N = qkv.shape[0];
  const int D = int(qkv.shape[1] / (3 * H)), half = D / 2;
  FG_ASSERT(D % 2 == 0 && half <= kMaxHalf, "rope: head dim must be even and at most ",
            2 * kMaxHalf, ", got ", D);
  if (N == 0) return;
  RopeFreqs f{};
  for (int i = 0; i < half; ++i) f.inv_freq[i] = rope_inv_freq(i, D);
  const int64_t threads = N * half;
  FG_DISPATCH_FLOAT(qkv.dtype, T, {
    rope_kernel<T><<<unsigned(ceil_div(threads, kThreads)), kThreads, 0, stream>>>(
        qkv.as<T>(), N, T_len, pos0, H, half, f, inverse ? -1.0 : 1.0);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace flashgpt::cuda
