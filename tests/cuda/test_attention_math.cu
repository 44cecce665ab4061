// The attention forwards' exponentials on the device: poly_exp2 (sm80_primitives.cuh), the
// cubic on the FMA pipe that the Hopper forwards take for one softmax exponential in 4,
// against 2^x in fp64. Its bounds: relative error at most 1.02e-4 from x = -126 to the
// scores' largest (0, or a rounding error above it), 2^j exactly at integers j (so a row's
// maximum gives P = 1, as the special-function unit's ex2 does), and 2^-126 below -126 (a
// masked score, -inf included).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <limits>
#include <vector>
#include "kernels/cuda/attention/sm80_primitives.cuh"
#include "tests/cuda/cuda_test_util.h"

namespace flashgpt::test {
namespace {

__global__ void poly_exp2_kernel(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = cuda::attn::poly_exp2(x[i]);
}

std::vector<float> poly_exp2_on_device(const std::vector<float>& x) {
  float *dx = nullptr, *dy = nullptr;
  const size_t bytes = x.size() * sizeof(float);
  EXPECT_EQ(cudaMalloc(&dx, bytes), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&dy, bytes), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dx, x.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  const int n = int(x.size());
  poly_exp2_kernel<<<(n + 255) / 256, 256>>>(dx, dy, n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> y(x.size());
  EXPECT_EQ(cudaMemcpy(y.data(), dy, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dx);
  cudaFree(dy);
  return y;
}

TEST(CudaAttentionMath, PolyExp2IsWithinItsBound) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible";
  std::vector<float> x;
  for (int i = 0; i <= (1 << 20); ++i) x.push_back(-30.f * float(i) / float(1 << 20));  // where P matters
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  for (double u : uniform(1 << 16, rng, -126, 0)) x.push_back(float(u));  // down to the clamp
  for (float e : {1e-7f, 3e-7f, 1e-6f}) x.push_back(e);  // a row maximum's fma rounding above 0
  const std::vector<float> y = poly_exp2_on_device(x);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp2(double(x[i]));
    worst = std::max(worst, std::abs(double(y[i]) - want) / want);
  }
  EXPECT_LE(worst, 1.02e-4) << "seed " << seed;
  EXPECT_GT(worst, 1e-6);  // a cubic, not the special-function unit
}

TEST(CudaAttentionMath, PolyExp2IsExactAtIntegersAndClampsBelowMinus126) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible";
  std::vector<float> x;
  for (int j = -126; j <= 0; ++j) x.push_back(float(j));
  x.push_back(-0.f);
  const float below[] = {-126.5f, -200.f, -1e30f, -std::numeric_limits<float>::infinity()};
  for (float b : below) x.push_back(b);
  const std::vector<float> y = poly_exp2_on_device(x);
  for (int j = -126; j <= 0; ++j) EXPECT_EQ(y[size_t(j + 126)], std::ldexp(1.f, j)) << "2^" << j;
  EXPECT_EQ(y[127], 1.f);  // -0
  for (size_t i = 0; i < std::size(below); ++i) EXPECT_EQ(y[128 + i], std::ldexp(1.f, -126)) << below[i];
}

}  // namespace
}  // namespace flashgpt::test
