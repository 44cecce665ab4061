// The device arithmetic of the attention kernels on its own: poly_exp2, the polynomial
// 2^x that takes part of the softmax's exponentials off the special-function unit, against
// exp2 in fp64, and split_exp2's choice between it and ex2.approx by accumulator tile.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>
#include "kernels/cuda/attention/sm80_primitives.cuh"
#include "tests/cuda/cuda_test_util.h"

namespace flashgpt::test {
namespace {

using cuda::attn::fast_exp2;
using cuda::attn::poly_exp2;
using cuda::attn::split_exp2;

__global__ void exp2_kernel(const float* x, float* poly, float* sfu, float* split, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  poly[i] = poly_exp2(x[i]);
  sfu[i] = fast_exp2(x[i]);
  split[i] = split_exp2<0xA4u>(x[i], i % 16);  // tiles 2, 5, 7 mod 8
}

class CudaAttentionMath : public CudaTest {};

TEST_F(CudaAttentionMath, PolyExp2MatchesExp2AndSplitPicksByTile) {
  // Random scores over the range the kernels feed it (x <= 0, a little above from
  // rounding), the edges of the exponent field, the integers (f = 0) and -inf (masked).
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> wide(-140.f, 0.75f), near(-8.f, 0.75f);
  std::vector<float> x;
  for (int i = 0; i < (1 << 18); ++i) x.push_back(i % 2 ? wide(rng) : near(rng));
  for (int j = -130; j <= 0; ++j)
    for (float d : {-0.5f, -0.25f, 0.f, 0.25f, 0.4999f}) x.push_back(float(j) + d);
  for (float v : {-125.f, std::nextafter(-125.f, -200.f), std::nextafter(-125.f, 0.f), -124.5f, -0.f, 0.5f})
    x.push_back(v);
  x.push_back(-INFINITY);
  const int n = int(x.size());
  float *dx = nullptr, *dout = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dout, 3 * n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  exp2_kernel<<<(n + 255) / 256, 256>>>(dx, dout, dout + n, dout + 2 * n, n);
  std::vector<float> out(3 * size_t(n));
  ASSERT_EQ(cudaMemcpy(out.data(), dout, out.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dx);
  cudaFree(dout);
  // The cubic's fitted bound (7.49e-5 relative on [-0.5, 0.5]) and a few fp32 roundings.
  const double bound = 7.5e-5 + 8 * 0x1p-24;
  double worst = 0;
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    const float p = out[i], s = out[n + i], sp = out[2 * n + i];
    if (x[i] < -125.f) {  // below 2^-125, and -inf
      if (p != 0.f && ++bad <= 5) ADD_FAILURE() << "poly_exp2(" << x[i] << ") = " << p << ", want 0";
    } else {
      const double want = std::exp2(double(x[i])), err = std::fabs(p - want) / want;
      worst = std::max(worst, err);
      if (!(err <= bound) && ++bad <= 5)
        ADD_FAILURE() << "poly_exp2(" << x[i] << ") = " << p << ", exp2 = " << want << ", relative error " << err;
    }
    const bool poly_tile = (0xA4u >> (i % 16 % 8)) & 1u;
    const float want_split = poly_tile ? p : s;
    if (std::memcmp(&sp, &want_split, sizeof(float)) != 0 && ++bad <= 5)
      ADD_FAILURE() << "split_exp2 at tile " << i % 16 << " gave " << sp << ", want " << want_split;
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(worst, 1e-5);  // the polynomial, not ex2.approx, was measured
  RecordProperty("worst_relative_error", std::to_string(worst));
}

}  // namespace
}  // namespace flashgpt::test
