// One row of the fused softmax cross-entropy over the LM head's logits (layers.cpp's
// softmax_cross_entropy runs it on every row), compiled once per x86-64 level like the
// matmul kernel (level_namespace.h) and run at gemm_level():
//   returns lse(row[0..V)) − row[target] (in double); with dloss != 0 it overwrites
//   row[0..V) with dloss·(softmax − onehot(target)) and zeroes the padding row[V..Vp).
// `e` is scratch for V doubles. The exponentials are exp_nonpositive's (below), the sum
// of the V of them is taken in kCeLanes fixed lanes, then the lanes in order, so every
// level computes the same bits.
#pragma once
#include <cstdint>

namespace flashgpt::cpu {

constexpr int kCeLanes = 8;

#define FLASHGPT_CE_ROW_DECLS                                                                    \
  double ce_row(float* row, int64_t V, int64_t Vp, int64_t target, float dloss, double* e);    \
  double ce_row(double* row, int64_t V, int64_t Vp, int64_t target, float dloss, double* e);  \
  double exp_nonpositive_at_level(double x);
namespace v2 { FLASHGPT_CE_ROW_DECLS }
namespace v3 { FLASHGPT_CE_ROW_DECLS }
namespace v4 { FLASHGPT_CE_ROW_DECLS }
#undef FLASHGPT_CE_ROW_DECLS

// At `level` (2..gemm_level(); the tests compare the levels).
template <class T>
double ce_row_at(int level, T* row, int64_t V, int64_t Vp, int64_t target, float dloss, double* e);
double exp_nonpositive_at(int level, double x);

}  // namespace flashgpt::cpu
