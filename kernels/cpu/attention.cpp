// CPU attention, scale 1/sqrt(D), two algorithms (AttentionArgs::algo):
//
//  naive  S = Q·Kᵀ·scale (causal: -inf above the diagonal), P = softmax(S) stored in
//         probs (B,H,T,T), O = P·V, LSE = logsumexp(S row). Backward reads P:
//         dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P∘(dP - rowsum(dP∘P)), dQ = dS·K·scale,
//         dK = dSᵀ·Q·scale.
//  flash  the CPU reference of FlashAttention: tiles of kBr query rows × kBc key rows,
//         online softmax (running max m and sum l, O rescaled by exp(m_old - m_new)),
//         causal tiles entirely above the diagonal skipped, O = acc/l, LSE = m + log l.
//         Backward: delta = rowsum(dO∘O), then for each K/V tile and each Q tile
//         recompute P = exp(S - LSE): dV += Pᵀ·dO, dS = P∘(dP - delta),
//         dK += dSᵀ·Q·scale, dQ += dS·K·scale. Memory O(T) per head, never T×T.
//
// Layouts: qkv (B,T,3,H,D) with q at [b,t,0,h,:], k at [b,t,1,h,:], v at [b,t,2,h,:];
// out/dout (B,T,H,D); lse/delta (B,H,T). OpenMP over (b,h): every (b,h) reads and writes
// only its own head's slices, so tasks never race.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>
#include "cpu_kernels.h"

namespace flashgpt::cpu {

namespace {
constexpr int kBr = 16;  // flash: query rows per tile
constexpr int kBc = 16;  // flash: key/value rows per tile

// Element offsets into one (b,h) head of the packed layouts.
struct Head {
  int64_t HD;                            // H·D: offset between q, k and v of one token
  int64_t qkv_base, out_base, stat_base;  // offsets of t = 0
  Head(int64_t b, int64_t h, int64_t Tn, int64_t H, int64_t D)
      : HD(H * D), qkv_base((b * Tn * 3 * H + h) * D), out_base((b * Tn * H + h) * D),
        stat_base((b * H + h) * Tn) {}
  // which: 0 = q, 1 = k, 2 = v; token t.
  int64_t qkv(int which, int64_t t) const { return qkv_base + (3 * t + which) * HD; }
  int64_t out(int64_t t) const { return out_base + t * HD; }
};

template <class T> T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

template <class T> void axpy(T* y, T alpha, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

template <class T> constexpr T kNegInf = -std::numeric_limits<T>::infinity();
}  // namespace

// ---------------------------------------------------------------- naive ----
template <class T> void attention_forward_naive(const AttentionForward& a) {
  const int64_t B = a.B, Tn = a.T, H = a.H, D = a.D;
  const T scale = T(1) / std::sqrt(T(D));
  const T* qkv = a.qkv.as<T>();
  T* out = a.out.as<T>();
  T* probs = a.probs.as<T>();
  const StatView lse(a.lse);
#pragma omp parallel for schedule(dynamic) if (cpu::worth_parallel(B * H * Tn * Tn * D))
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const Head hd(bh / H, bh % H, Tn, H, D);
    T* P = probs + bh * Tn * Tn;  // (T, T) of this head
    for (int64_t i = 0; i < Tn; ++i) {
      T* p = P + i * Tn;
      const T* q = qkv + hd.qkv(0, i);
      T max = kNegInf<T>;
      for (int64_t j = 0; j < Tn; ++j) {
        p[j] = (a.causal && j > i) ? kNegInf<T> : dot(q, qkv + hd.qkv(1, j), D) * scale;
        max = std::max(max, p[j]);
      }
      T sum = 0;
      for (int64_t j = 0; j < Tn; ++j) sum += (p[j] = std::exp(p[j] - max));  // exp(-inf) = 0
      for (int64_t j = 0; j < Tn; ++j) p[j] /= sum;
      lse.set(hd.stat_base + i, double(max + std::log(sum)));
      T* o = out + hd.out(i);
      std::fill(o, o + D, T(0));
      for (int64_t j = 0; j < Tn; ++j) axpy(o, p[j], qkv + hd.qkv(2, j), D);
    }
  }
}

template <class T> void attention_backward_naive(const AttentionBackward& a) {
  const int64_t B = a.B, Tn = a.T, H = a.H, D = a.D;
  const T scale = T(1) / std::sqrt(T(D));
  const T* qkv = a.qkv.as<T>();
  const T* dout = a.dout.as<T>();
  const T* probs = a.probs.as<T>();
  T* dqkv = a.dqkv.as<T>();
#pragma omp parallel for schedule(dynamic) if (cpu::worth_parallel(B * H * Tn * Tn * D))
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const Head hd(bh / H, bh % H, Tn, H, D);
    for (int64_t t = 0; t < Tn; ++t)  // dqkv is overwritten: clear this head's q, k, v
      for (int w = 0; w < 3; ++w) std::fill_n(dqkv + hd.qkv(w, t), D, T(0));
    const T* P = probs + bh * Tn * Tn;
    std::vector<T> dp(static_cast<size_t>(Tn));  // one row of dP
    for (int64_t i = 0; i < Tn; ++i) {
      const T* p = P + i * Tn;
      const T* dO = dout + hd.out(i);
      T row_dot = 0;  // rowsum(dP∘P)
      for (int64_t j = 0; j < Tn; ++j) {
        dp[j] = dot(dO, qkv + hd.qkv(2, j), D);
        row_dot += dp[j] * p[j];
        axpy(dqkv + hd.qkv(2, j), p[j], dO, D);  // dV_j += P_ij dO_i
      }
      for (int64_t j = 0; j < Tn; ++j) {
        const T ds = p[j] * (dp[j] - row_dot) * scale;  // masked: P = 0, so ds = 0
        axpy(dqkv + hd.qkv(0, i), ds, qkv + hd.qkv(1, j), D);  // dQ_i += dS_ij K_j
        axpy(dqkv + hd.qkv(1, j), ds, qkv + hd.qkv(0, i), D);  // dK_j += dS_ij Q_i
      }
    }
  }
}

// ---------------------------------------------------------------- flash ----
template <class T> void attention_forward_flash(const AttentionForward& a) {
  const int64_t B = a.B, Tn = a.T, H = a.H, D = a.D;
  const T scale = T(1) / std::sqrt(T(D));
  const T* qkv = a.qkv.as<T>();
  T* out = a.out.as<T>();
  const StatView lse(a.lse);
#pragma omp parallel for schedule(dynamic) if (cpu::worth_parallel(B * H * Tn * Tn * D))
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const Head hd(bh / H, bh % H, Tn, H, D);
    T s[kBr][kBc];                        // scores, then probabilities, of one tile
    T m[kBr], l[kBr];                     // running row max and row sum
    std::vector<T> acc(size_t(kBr * D));  // unnormalised O rows of the Q tile
    for (int64_t i0 = 0; i0 < Tn; i0 += kBr) {
      const int64_t nr = std::min<int64_t>(kBr, Tn - i0);
      std::fill(m, m + kBr, kNegInf<T>);
      std::fill(l, l + kBr, T(0));
      std::fill(acc.begin(), acc.end(), T(0));
      // Causal: key tiles starting after the last query row of this tile are all masked.
      const int64_t j_end = a.causal ? i0 + nr : Tn;
      for (int64_t j0 = 0; j0 < j_end; j0 += kBc) {
        const int64_t nc = std::min<int64_t>(kBc, j_end - j0);
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t i = i0 + r;
          const T* q = qkv + hd.qkv(0, i);
          T tile_max = kNegInf<T>;
          for (int64_t c = 0; c < nc; ++c) {
            const int64_t j = j0 + c;
            s[r][c] = (a.causal && j > i) ? kNegInf<T> : dot(q, qkv + hd.qkv(1, j), D) * scale;
            tile_max = std::max(tile_max, s[r][c]);
          }
          const T m_new = std::max(m[r], tile_max);
          // A row with every key so far masked: nothing to add (and avoid
          // exp(-inf - (-inf)), which is NaN). Cannot happen for the first key tile
          // (key 0 is visible to every row), kept for safety.
          if (m_new == kNegInf<T>) continue;
          const T correction = std::exp(m[r] - m_new);  // exp(-inf) = 0 on the first tile
          T* o = acc.data() + r * D;
          for (int64_t d = 0; d < D; ++d) o[d] *= correction;
          T tile_sum = 0;
          for (int64_t c = 0; c < nc; ++c) {
            const T p = std::exp(s[r][c] - m_new);
            tile_sum += p;
            axpy(o, p, qkv + hd.qkv(2, j0 + c), D);
          }
          l[r] = l[r] * correction + tile_sum;
          m[r] = m_new;
        }
      }
      for (int64_t r = 0; r < nr; ++r) {
        T* o = out + hd.out(i0 + r);
        for (int64_t d = 0; d < D; ++d) o[d] = acc[r * D + d] / l[r];
        lse.set(hd.stat_base + i0 + r, double(m[r] + std::log(l[r])));
      }
    }
  }
}

template <class T> void attention_backward_flash(const AttentionBackward& a) {
  const int64_t B = a.B, Tn = a.T, H = a.H, D = a.D;
  const T scale = T(1) / std::sqrt(T(D));
  const T* qkv = a.qkv.as<T>();
  const T* dout = a.dout.as<T>();
  const T* out = a.out.as<T>();
  T* dqkv = a.dqkv.as<T>();
  const StatView lse(a.lse), delta(a.delta);
#pragma omp parallel for schedule(dynamic) if (cpu::worth_parallel(B * H * Tn * Tn * D))
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const Head hd(bh / H, bh % H, Tn, H, D);
    // Preprocess: delta_i = rowsum(dO_i ∘ O_i) (= rowsum(dP∘P) of the naive backward).
    // dQ accumulates over key tiles, so this head's dQ starts at zero.
    for (int64_t i = 0; i < Tn; ++i) {
      delta.set(hd.stat_base + i, double(dot(dout + hd.out(i), out + hd.out(i), D)));
      std::fill_n(dqkv + hd.qkv(0, i), D, T(0));
    }
    std::vector<T> dk(size_t(kBc * D)), dv(size_t(kBc * D));  // accumulators of the K/V tile
    for (int64_t j0 = 0; j0 < Tn; j0 += kBc) {
      const int64_t nc = std::min<int64_t>(kBc, Tn - j0);
      std::fill(dk.begin(), dk.end(), T(0));
      std::fill(dv.begin(), dv.end(), T(0));
      // Causal: Q tiles ending before key j0 see none of this tile's keys.
      const int64_t i_begin = a.causal ? (j0 / kBr) * kBr : 0;
      for (int64_t i0 = i_begin; i0 < Tn; i0 += kBr) {
        const int64_t nr = std::min<int64_t>(kBr, Tn - i0);
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t i = i0 + r;
          const T* q = qkv + hd.qkv(0, i);
          const T* dO = dout + hd.out(i);
          T* dq = dqkv + hd.qkv(0, i);
          const T lse_i = T(lse.get(hd.stat_base + i));
          const T delta_i = T(delta.get(hd.stat_base + i));
          for (int64_t c = 0; c < nc; ++c) {
            const int64_t j = j0 + c;
            if (a.causal && j > i) break;  // the rest of this row is masked: P = 0
            const T* k = qkv + hd.qkv(1, j);
            const T p = std::exp(dot(q, k, D) * scale - lse_i);
            axpy(dv.data() + c * D, p, dO, D);                     // dV_j += P_ij dO_i
            const T dp = dot(dO, qkv + hd.qkv(2, j), D);           // dP_ij = dO_i · V_j
            const T ds = p * (dp - delta_i) * scale;
            axpy(dq, ds, k, D);                                     // dQ_i += dS_ij K_j
            axpy(dk.data() + c * D, ds, q, D);                      // dK_j += dS_ij Q_i
          }
        }
      }
      for (int64_t c = 0; c < nc; ++c) {  // dK, dV overwritten
        std::copy_n(dk.data() + c * D, D, dqkv + hd.qkv(1, j0 + c));
        std::copy_n(dv.data() + c * D, D, dqkv + hd.qkv(2, j0 + c));
      }
    }
  }
}

#define FG_INSTANTIATE(T)                                                   \
  template void attention_forward_naive<T>(const AttentionForward&);        \
  template void attention_backward_naive<T>(const AttentionBackward&);      \
  template void attention_forward_flash<T>(const AttentionForward&);        \
  template void attention_backward_flash<T>(const AttentionBackward&);
FG_INSTANTIATE(float)
FG_INSTANTIATE(double)
#undef FG_INSTANTIATE

}  // namespace flashgpt::cpu
