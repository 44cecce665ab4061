// The decode kernels' programmatic dependent launch (flash_decode.cu, AttentionDecode::
// settled): a Hopper decode call starts while the kernel before it still runs, loads the
// first tiles of the settled keys [0, settled) early and reads everything else only after
// that kernel has finished.
//
// The kernel before it here is a slow writer: it lets its dependents start at once
// (griddepcontrol.launch_dependents), spins for about 0.2 ms, then writes q and the cache
// positions [settled, T), which held NaN until then. So a decode kernel that read q or an
// unsettled key before its wait, or counted a tile reaching past `settled` as settled,
// reads NaN and its output is NaN. The output must be bit for bit that of the same call on
// the finished inputs with nothing before it (the same plan and kernel: the same
// arithmetic), for the tensor-core kernel (D = 64) and the bulk kernel (D = 128), with
// `settled` the model's T - 1, mid-tile, a tile boundary and 0, each with the kernel's own
// plan and with chunks of two tiles (every tile one that is loaded before the wait).
#include <cuda_bf16.h>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <algorithm>
#include <vector>
#include "kernels/cuda/attention/flash_attention.h"
#include "tests/cuda/cuda_test_util.h"

namespace flashgpt::test {
namespace {

using bf16 = __nv_bfloat16;

// n elements of each of `rows` rows, row r at r * stride (in the destination and the source).
struct Region {
  bf16* dst;
  const bf16* src;
  int64_t rows, n, stride;
};

// Lets the next kernel start (once all its blocks have said so), waits about `cycles` clock cycles, then copies the regions.
__global__ void slow_writer(Region q, Region k, Region v, long long cycles) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (const Region& r : {q, k, v})
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < r.rows * r.n; i += int64_t(gridDim.x) * blockDim.x) {
      const int64_t at = (i / r.n) * r.stride + i % r.n;
      r.dst[at] = r.src[at];
    }
}

struct Dev {  // a device buffer
  void* p = nullptr;
  explicit Dev(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~Dev() { cudaFree(p); }
  bf16* b() const { return static_cast<bf16*>(p); }
};

std::vector<uint16_t> download(const void* p, size_t n) {
  std::vector<uint16_t> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

void check_overlap(int D, int settled, bool short_chunks) {
  const int B = 2, H = 3, T = 8191;
  const int64_t HD = int64_t(H) * D, cache_n = int64_t(B) * H * T * D;
  // Short chunks: two 16 KB tiles a split (128 keys at D = 128, 256 at D = 64), so that
  // every tile is one a split loads before its wait; otherwise the kernel's own plan.
  const int splits = short_chunks ? (T + 2 * (16384 / (2 * D)) - 1) / (2 * (16384 / (2 * D))) : 0;
  std::vector<uint16_t> qkv(size_t(B * 3 * HD)), kv[2] = {std::vector<uint16_t>(size_t(cache_n)),
                                                         std::vector<uint16_t>(size_t(cache_n))};
  uint64_t z = 0x2545F4914F6CDD1Dull + uint64_t(D) * 7919 + uint64_t(settled);
  auto draw = [&] {  // bf16 bits of a value in about [-2, 2)
    z ^= z << 13, z ^= z >> 7, z ^= z << 17;
    return double_to_bf16(double(z >> 11) * 0x1.0p-53 * 4.0 - 2.0);
  };
  for (auto& x : qkv) x = draw();
  for (auto& c : kv)
    for (auto& x : c) x = draw();

  Dev q_ok(qkv.size() * 2), k_ok(size_t(cache_n) * 2), v_ok(size_t(cache_n) * 2);
  Dev q(qkv.size() * 2), k(size_t(cache_n) * 2), v(size_t(cache_n) * 2), out(size_t(B * HD) * 2), lse(size_t(B * H) * 4);
  ASSERT_EQ(cudaMemcpy(q_ok.p, qkv.data(), qkv.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(k_ok.p, kv[0].data(), size_t(cache_n) * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(v_ok.p, kv[1].data(), size_t(cache_n) * 2, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);

  AttentionDecode a;
  a.qkv = Tensor(q.p, DType::bf16, Device::cuda, {B, 3 * HD});
  a.k_cache = Tensor(k.p, DType::bf16, Device::cuda, {B, H, T, D});
  a.v_cache = Tensor(v.p, DType::bf16, Device::cuda, {B, H, T, D});
  a.out = Tensor(out.p, DType::bf16, Device::cuda, {B, HD});
  a.lse = Tensor(lse.p, DType::f32, Device::cuda, {B, H});
  a.B = B, a.H = H, a.D = D, a.T = T;
  const size_t ws_bytes = cuda::flash_decode_workspace_bytes(a, splits);
  Dev ws(std::max<size_t>(ws_bytes, 16));
  ASSERT_EQ(device_memset_sync(ws.p, 0, ws_bytes), cudaSuccess);  // the split counters start at 0

  // The reference: finished inputs, nothing running before the call.
  ASSERT_EQ(cudaMemcpy(q.p, q_ok.p, qkv.size() * 2, cudaMemcpyDeviceToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(k.p, k_ok.p, size_t(cache_n) * 2, cudaMemcpyDeviceToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(v.p, v_ok.p, size_t(cache_n) * 2, cudaMemcpyDeviceToDevice), cudaSuccess);
  // A device-to-device cudaMemcpy returns before it is done, and `stream` does not wait for
  // the legacy default stream that runs it (cudaStreamNonBlocking).
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cuda::flash_decode(a, ws.p, ws_bytes, stream, splits);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const std::vector<uint16_t> want_out = download(out.p, size_t(B * HD));
  const std::vector<uint16_t> want_lse = download(lse.p, size_t(2 * B * H));
  for (uint16_t x : want_out) ASSERT_FALSE(std::isnan(bf16_to_float(x))) << "reference output is NaN";
  ASSERT_TRUE(std::any_of(want_out.begin(), want_out.end(), [](uint16_t x) { return (x & 0x7fff) != 0; }))
      << "reference output is all zero: the call did not read the inputs";

  // q and the unsettled keys NaN until the slow writer fills them; outputs NaN before.
  ASSERT_EQ(device_memset_sync(q.p, 0xff, qkv.size() * 2), cudaSuccess);
  for (Dev* c : {&k, &v})
    for (int64_t bh = 0; bh < int64_t(B) * H; ++bh)
      ASSERT_EQ(cudaMemset(c->b() + (bh * T + settled) * D, 0xff, size_t(T - settled) * D * 2), cudaSuccess);
  ASSERT_EQ(device_memset_sync(out.p, 0xff, size_t(B * HD) * 2), cudaSuccess);
  ASSERT_EQ(device_memset_sync(lse.p, 0xff, size_t(B * H) * 4), cudaSuccess);
  a.settled = settled;
  const long long spin = 400000;  // about 0.2 ms at 2 GHz: far longer than the decode call
  const int64_t tail = int64_t(settled) * D;  // the first unsettled element of a (b, h)
  slow_writer<<<32, 256, 0, stream>>>(Region{q.b(), q_ok.b(), 1, int64_t(qkv.size()), 0},
                                     Region{k.b() + tail, k_ok.b() + tail, int64_t(B) * H, int64_t(T) * D - tail, int64_t(T) * D},
                                     Region{v.b() + tail, v_ok.b() + tail, int64_t(B) * H, int64_t(T) * D - tail, int64_t(T) * D},
                                     spin);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  cuda::flash_decode(a, ws.p, ws_bytes, stream, splits);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(download(out.p, size_t(B * HD)), want_out) << "output after the slow writer";
  EXPECT_EQ(download(lse.p, size_t(2 * B * H)), want_lse) << "lse after the slow writer";
  cudaStreamDestroy(stream);
}

class CudaDecodeOverlap : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

TEST_P(CudaDecodeOverlap, WaitsForTheKernelBefore) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible";
  if (!is_hopper()) GTEST_SKIP() << "the decode kernels with programmatic dependent launch need a Hopper GPU";
  ScopedEnv kernel("FLASHGPT_DECODE_KERNEL", "auto"), pdl("FLASHGPT_DECODE_PDL", "1");
  check_overlap(std::get<0>(GetParam()), std::get<1>(GetParam()), std::get<2>(GetParam()));
}

// settled: the model's T - 1, mid-tile, a tile boundary of both kernels' 16 KB tiles
// (128 keys at D = 64, 64 at D = 128), and nothing settled; the plan's splits (at D = 64
// merged in a cluster) and short chunks (merged through L2).
INSTANTIATE_TEST_SUITE_P(Settled, CudaDecodeOverlap,
                         ::testing::Combine(::testing::Values(64, 128), ::testing::Values(8190, 3000, 4096, 0),
                                            ::testing::Bool()),
                         [](const auto& i) {
                           return "D" + std::to_string(std::get<0>(i.param)) + "_settled" +
                                  std::to_string(std::get<1>(i.param)) + (std::get<2>(i.param) ? "_short" : "_plan");
                         });

}  // namespace
}  // namespace flashgpt::test
