// kernels/op_work.h: the FLOPs and bytes that `bench train --breakdown` divides by each
// op's time, against counts written out by hand for small shapes.
#include <gtest/gtest.h>

#include "kernels/op_work.h"

namespace flashgpt {
namespace {

// Shape-only tensors: op_work never reads data.
Tensor shaped(DType t, std::initializer_list<int64_t> dims) {
  static char dummy[16];
  return Tensor(dummy, t, Device::cpu, dims);
}

TEST(OpWork, MatmulForwardAndBackward) {
  const int64_t N = 6, C = 4, OC = 5;  // fp32: 4 bytes per element
  MatmulForward f;
  f.out = shaped(DType::f32, {N, OC});
  f.inp = shaped(DType::f32, {N, C});
  f.weight = shaped(DType::f32, {OC, C});
  f.bias = shaped(DType::f32, {OC});
  OpWork w = matmul_forward_work(f);
  EXPECT_EQ(w.flops, 2.0 * 6 * 4 * 5);
  EXPECT_EQ(w.bytes, 4.0 * (24 + 20 + 5 + 30));  // inp, weight, bias read; out written
  f.gelu = true;
  f.pre_gelu = shaped(DType::f32, {N, OC});
  EXPECT_EQ(matmul_forward_work(f).bytes, 4.0 * (24 + 20 + 5 + 30 + 30));  // and the pre-activation

  MatmulBackward b;
  b.dout = shaped(DType::f32, {N, OC});
  b.inp = f.inp;
  b.weight = f.weight;
  b.dinp = shaped(DType::f32, {N, C});
  b.dweight = shaped(DType::f32, {OC, C});
  b.dbias = shaped(DType::f32, {OC});
  w = matmul_backward_work(b);
  EXPECT_EQ(w.flops, 2 * 2.0 * 6 * 4 * 5);  // dout·W and doutᵀ·inp
  // dout, W and inp read; dinp written; dweight and dbias accumulated (read and written).
  EXPECT_EQ(w.bytes, 4.0 * (30 + 20 + 24 + 24 + 2 * 20 + 2 * 5));
  b.dweight = Tensor();
  b.dbias = Tensor();
  w = matmul_backward_work(b);  // dinp only: inp is not needed
  EXPECT_EQ(w.flops, 2.0 * 6 * 4 * 5);
  EXPECT_EQ(w.bytes, 4.0 * (30 + 20 + 24));
}

TEST(OpWork, AttentionByTheFlashAttentionConvention) {
  const int B = 2, T = 8, H = 3, D = 4;  // bf16: 2 bytes per element
  AttentionForward f;
  f.B = B, f.T = T, f.H = H, f.D = D, f.causal = false;
  f.qkv = shaped(DType::bf16, {B * T, 3 * H * D});
  f.out = shaped(DType::bf16, {B * T, H * D});
  f.lse = shaped(DType::f32, {B * H, T});
  OpWork full = attention_forward_work(f);
  EXPECT_EQ(full.flops, 4.0 * B * H * T * T * D);  // QKᵀ and PV, 2 FLOPs per multiply-add
  EXPECT_EQ(full.bytes, 2.0 * (B * T * 3 * H * D) + 2.0 * (B * T * H * D) + 4.0 * (B * H * T));
  f.causal = true;
  EXPECT_EQ(attention_forward_work(f).flops, full.flops / 2);
  AttentionBackward g;
  g.B = B, g.T = T, g.H = H, g.D = D, g.causal = true;
  g.qkv = f.qkv, g.out = f.out, g.lse = f.lse, g.dout = f.out, g.dqkv = f.qkv;
  EXPECT_EQ(attention_backward_work(g).flops, 2.5 * full.flops / 2);
  EXPECT_EQ(attention_backward_work(g).bytes, 2 * (2.0 * B * T * 3 * H * D) + 2 * (2.0 * B * T * H * D) + 4.0 * B * H * T);
}

TEST(OpWork, BytesOfMemoryBoundOps) {
  Tensor a = shaped(DType::bf16, {10, 8}), b = shaped(DType::f32, {8});
  OpWork w = bytes_work({&a}, {&b}, {&a});
  EXPECT_EQ(w.flops, 0);
  EXPECT_EQ(w.bytes, 160.0 + 32 + 2 * 160);
  Tensor undefined;
  EXPECT_EQ(bytes_work({&undefined}, {&undefined}).bytes, 0);  // absent tensors move nothing
}

}  // namespace
}  // namespace flashgpt
