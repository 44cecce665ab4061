// FlashDecoding (kernels/cuda/attention/flash_decode.cu) against the CPU decode op in
// fp64, and greedy generation on the GPU.
//
// Each case draws fresh random inputs rounded to the GPU dtype and compares, on EVERY
// element (cuda_test_util.h's rule):
//   out:  |gpu − ref64| ≤ 2·|naive − ref64| + max|naive − ref64|, naive = the CPU op in
//         fp32 on the same inputs with its output rounded to the GPU's dtype;
//   lse:  fp32 on the GPU: |gpu − ref64| ≤ 1e-5·|ref64| + 1e-5·max|ref64|.
// Cache positions at and past T hold NaN, and the outputs are NaN before the launch, so
// a key read past the end or an element never written fails. Lengths are awkward on
// purpose (1, 17, 4097, 65537, 1048583), the cache capacity exceeds T, and forced split
// counts exercise uneven chunks and the single-split path at long T. Every case runs on
// each kernel (FLASHGPT_DECODE_KERNEL): loads into registers, bulk copies through shared
// memory (Hopper only), the bulk kernel also at both block sizes and both tiles (16 KB in
// two stages, 32 KB in one: FLASHGPT_DECODE_TILE_KB), and the tensor-core kernel (Hopper
// only; bf16: its fp32 cases run the bulk kernel), whose plans of 2 to 8 splits in one
// wave merge in a thread-block cluster (forced 3, 7 and 8, and its own plans at 4097
// keys) and the others through L2 (9 forced, and its plans at 65,537 and 1,048,583 keys).
#include <gtest/gtest.h>
#include <cuda_runtime.h>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>
#include "kernels/cuda/attention/flash_attention.h"
#include "layers/gpt2.h"
#include "layers/gpt2_infer.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/greedy.h"

namespace flashgpt::test {
namespace {

struct DecodeCase {
  int B, H, T, D;
  DType dtype;         // of the GPU run: bf16 or f32
  int splits;          // 0: the launcher's choice
  const char* kernel;  // FLASHGPT_DECODE_KERNEL: registers, bulk or mma (Hopper only; mma: bf16, fp32 runs bulk)
  const char* threads;  // FLASHGPT_DECODE_THREADS of the bulk kernel; nullptr: its default
  const char* tile = nullptr;  // FLASHGPT_DECODE_TILE_KB of the bulk kernel; nullptr: its default (16)
};

std::string case_name(const ::testing::TestParamInfo<DecodeCase>& i) {
  const DecodeCase& c = i.param;
  return "B" + std::to_string(c.B) + "_H" + std::to_string(c.H) + "_T" + std::to_string(c.T) + "_D" +
         std::to_string(c.D) + "_" + (c.dtype == DType::bf16 ? "bf16" : "fp32") +
         (c.splits ? "_splits" + std::to_string(c.splits) : "") + "_" + c.kernel +
         (c.threads ? std::string("_threads") + c.threads : "") + (c.tile ? std::string("_tile") + c.tile : "");
}

// Uniform in [-2, 2) from a hash of (seed, i): cheap enough for 10^9 values, parallel,
// and the same on every machine.
double hashed_uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53 * 4.0 - 2.0;
}

// A host buffer of one dtype (f64, f32 or bf16) with a device-or-host Tensor over it.
struct Buf {
  Ops* ops = nullptr;
  void* p = nullptr;
  Tensor t;
  Buf(Ops& o, DType dt, std::initializer_list<int64_t> shape) : ops(&o) {
    t = Tensor(nullptr, dt, o.device(), shape);
    p = o.alloc(t.nbytes());
    t.data = p;
  }
  ~Buf() { ops->free(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

// Values (exactly representable in the GPU dtype) written as dtype dt into t.
void put(Ops& ops, const Tensor& t, const std::vector<double>& v) {
  std::vector<char> raw(t.nbytes());
  const size_t n = v.size();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    if (t.dtype == DType::f64) reinterpret_cast<double*>(raw.data())[i] = v[size_t(i)];
    else if (t.dtype == DType::f32) reinterpret_cast<float*>(raw.data())[i] = float(v[size_t(i)]);
    else reinterpret_cast<uint16_t*>(raw.data())[i] = double_to_bf16(v[size_t(i)]);
  }
  ops.from_host(t, raw.data());
}

// A bf16 KV cache (k, v) filled with hashed_uniform(seed, ·) values.
void put_random_cache(Ops& ops, const Tensor& k, const Tensor& v, uint64_t seed) {
  const int64_t n = k.numel();
  std::vector<double> kh(static_cast<size_t>(n)), vh(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    kh[size_t(i)] = round_to(DType::bf16, hashed_uniform(seed, uint64_t(2 * i)));
    vh[size_t(i)] = round_to(DType::bf16, hashed_uniform(seed, uint64_t(2 * i + 1)));
  }
  put(ops, k, kh);
  put(ops, v, vh);
}

class FlashDecodeVsReference : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(FlashDecodeVsReference, OutputAndLse) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible";
  const DecodeCase c = GetParam();
  if (std::string(c.kernel) != "registers" && !is_hopper())
    GTEST_SKIP() << "the bulk-copy and tensor-core decode kernels need a Hopper GPU";
  ScopedEnv kernel("FLASHGPT_DECODE_KERNEL", c.kernel), threads("FLASHGPT_DECODE_THREADS", c.threads),
      tile("FLASHGPT_DECODE_TILE_KB", c.tile);
  const int B = c.B, H = c.H, T = c.T, D = c.D, Tmax = c.T + 3;
  const int64_t HD = int64_t(H) * D, cache_n = int64_t(B) * H * Tmax * D;
  const uint64_t seed = std::hash<std::string>()(case_name({c, 0}));
  ::testing::Test::RecordProperty("seed", std::to_string(seed));

  // Inputs rounded to the GPU dtype; cache positions >= T are NaN (must never be read).
  std::vector<double> qkv(static_cast<size_t>(B * 3 * HD)), k(static_cast<size_t>(cache_n)), v(static_cast<size_t>(cache_n));
  const double nan = std::numeric_limits<double>::quiet_NaN();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < cache_n; ++i) {
    const bool live = (i / D) % Tmax < T;
    k[size_t(i)] = live ? round_to(c.dtype, hashed_uniform(seed, uint64_t(2 * i))) : nan;
    v[size_t(i)] = live ? round_to(c.dtype, hashed_uniform(seed, uint64_t(2 * i + 1))) : nan;
  }
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = round_to(c.dtype, hashed_uniform(seed + 1, i));

  // ref (fp64) and naive (fp32) on the CPU.
  auto cpu = make_cpu_ops();
  std::vector<double> out[2], lse[2];
  const DType cpu_types[2] = {DType::f64, DType::f32};
  for (int r = 0; r < 2; ++r) {
    Buf q(*cpu, cpu_types[r], {B, 3 * HD}), kc(*cpu, cpu_types[r], {B, H, Tmax, D}), vc(*cpu, cpu_types[r], {B, H, Tmax, D});
    Buf o(*cpu, cpu_types[r], {B, HD}), l(*cpu, cpu_types[r], {B, H});
    put(*cpu, q.t, qkv);
    put(*cpu, kc.t, k);
    put(*cpu, vc.t, v);
    cpu->attention_decode({.out = o.t, .lse = l.t, .qkv = q.t, .k_cache = kc.t, .v_cache = vc.t, .B = B, .H = H, .D = D, .T = T});
    out[r] = OpCase::download(*cpu, o.t);
    lse[r] = OpCase::download(*cpu, l.t);
  }
  std::vector<double> naive_out = out[1];
  for (double& x : naive_out) x = round_to(c.dtype, x);

  // The GPU, through the launcher (forced splits) or the op set (the launcher's choice).
  DeviceContext ctx(0);
  auto gpu = make_cuda_ops(ctx);
  Buf q(*gpu, c.dtype, {B, 3 * HD}), kc(*gpu, c.dtype, {B, H, Tmax, D}), vc(*gpu, c.dtype, {B, H, Tmax, D});
  Buf o(*gpu, c.dtype, {B, HD}), l(*gpu, DType::f32, {B, H});
  put(*gpu, q.t, qkv);
  put(*gpu, kc.t, k);
  put(*gpu, vc.t, v);
  ASSERT_EQ(device_memset_sync(o.p, 0xff, o.t.nbytes()), cudaSuccess);  // NaN
  ASSERT_EQ(device_memset_sync(l.p, 0xff, l.t.nbytes()), cudaSuccess);
  const AttentionDecode a{.out = o.t, .lse = l.t, .qkv = q.t, .k_cache = kc.t, .v_cache = vc.t, .B = B, .H = H, .D = D, .T = T};
  if (c.splits) {
    const size_t bytes = cuda::flash_decode_workspace_bytes(a, c.splits);
    void* ws = nullptr;
    if (bytes) ASSERT_EQ(cudaMalloc(&ws, bytes), cudaSuccess);
    if (bytes) ASSERT_EQ(device_memset_sync(ws, 0, bytes), cudaSuccess);  // the split counters start at 0
    cuda::flash_decode(a, ws, bytes, ctx.main_stream(), c.splits);
    gpu->synchronize();
    // The same workspace again (its split counters must have been left at 0), outputs
    // poisoned in between, and every key settled (loaded before the wait for the kernel
    // before, where the kernel does that: test_decode_overlap.cu): the same bits.
    const std::vector<double> first_out = OpCase::download(*gpu, o.t), first_lse = OpCase::download(*gpu, l.t);
    ASSERT_EQ(device_memset_sync(o.p, 0xff, o.t.nbytes()), cudaSuccess);
    ASSERT_EQ(device_memset_sync(l.p, 0xff, l.t.nbytes()), cudaSuccess);
    AttentionDecode settled = a;
    settled.settled = T;
    cuda::flash_decode(settled, ws, bytes, ctx.main_stream(), c.splits);
    gpu->synchronize();
    cudaFree(ws);
    EXPECT_EQ(OpCase::download(*gpu, o.t), first_out) << "second call on the same workspace";
    EXPECT_EQ(OpCase::download(*gpu, l.t), first_lse) << "second call on the same workspace";
  } else {
    gpu->attention_decode(a);
  }
  ::testing::Test::RecordProperty("splits", std::to_string(cuda::flash_decode_splits(a, c.splits)));
  const std::vector<double> got_out = OpCase::download(*gpu, o.t), got_lse = OpCase::download(*gpu, l.t);
  const std::string what = case_name({c, 0}) + " (" + cuda::flash_decode_kernel(D, c.dtype) + ", " +
                           std::to_string(cuda::flash_decode_splits(a, c.splits)) + " splits)";
  expect_rule(got_out, naive_out, out[0], D, unit_roundoff(c.dtype), what + " out");
  expect_rule(got_lse, lse[1], lse[0], H, unit_roundoff(DType::f32), what + " lse");
}

std::vector<DecodeCase> cases() {
  std::vector<DecodeCase> v;
  for (const char* kernel : {"registers", "bulk", "mma"}) {
    for (int T : {1, 17, 4097, 65537})
      for (int D : {64, 128})
        for (int B : {1, 16}) v.push_back({B, 3, T, D, DType::bf16, 0, kernel, nullptr});
    for (int D : {64, 128}) v.push_back({1, 2, 1048583, D, DType::bf16, 0, kernel, nullptr});  // > 1M keys
    for (int D : {64, 128})
      for (int T : {17, 4097}) v.push_back({2, 3, T, D, DType::f32, 0, kernel, nullptr});
    // (mma: 3, 7 and 8 splits are a cluster merged in it, 9 the most the merge through L2
    // takes at the smallest count it has)
    for (int splits : {1, 3, 7, 8, 9}) v.push_back({2, 3, 4097, 64, DType::bf16, splits, kernel, nullptr});
    v.push_back({1, 2, 65537, 128, DType::f32, 1, kernel, nullptr});  // one block per head over 65537 keys
  }
  // The bulk kernel at both block sizes and both tiles (the default runs above): a partial
  // last tile, several stage wraps, fp32, one split over a whole head.
  for (const char* tile : {"16", "32"})
    for (const char* threads : {"128", "256"})
      for (int D : {64, 128}) {
        v.push_back({3, 3, 65537, D, DType::bf16, 0, "bulk", threads, tile});
        v.push_back({2, 3, 4097, D, DType::f32, 1, "bulk", threads, tile});
      }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cuda, FlashDecodeVsReference, ::testing::ValuesIn(cases()), case_name);

// The op set's decode reuses one workspace from call to call. Its split counters sit after
// the partials, so when the split count falls as the cache grows (B = 8, H = 12, D = 64
// on an H200: 4 splits at 512 keys, 3 at 513) they move into bytes the last call filled
// with partials; the op must zero them again, or no block sees itself last and the output
// is never written. The second call must give exactly what the launcher gives on a fresh
// workspace. (The merge through the workspace at every split count: the tensor-core
// kernel, auto's at D = 64 on a Hopper, would merge up to 8 splits in a cluster, with none.)
TEST(CudaDecodeWorkspace, SplitCountFallingAsTheCacheGrows) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible";
  ScopedEnv merge("FLASHGPT_DECODE_CLUSTER", "0");
  const int B = 8, H = 12, D = 64, Tmax = 4096;
  DeviceContext ctx(0);
  auto gpu = make_cuda_ops(ctx);
  Buf q(*gpu, DType::bf16, {B, 3 * H * D}), kc(*gpu, DType::bf16, {B, H, Tmax, D}), vc(*gpu, DType::bf16, {B, H, Tmax, D});
  Buf o(*gpu, DType::bf16, {B, H * D}), l(*gpu, DType::f32, {B, H});
  Buf o_ref(*gpu, DType::bf16, {B, H * D}), l_ref(*gpu, DType::f32, {B, H});
  std::vector<double> qkv(size_t(B) * 3 * H * D);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = round_to(DType::bf16, hashed_uniform(12, i));
  put(*gpu, q.t, qkv);
  put_random_cache(*gpu, kc.t, vc.t, 11);
  AttentionDecode a{.out = o.t, .lse = l.t, .qkv = q.t, .k_cache = kc.t, .v_cache = vc.t, .B = B, .H = H, .D = D, .T = 1};
  int fall = 0;  // the first cache length whose split count is below the one before it
  for (int T = 2; T <= Tmax && !fall; ++T) {
    a.T = T - 1;
    const int before = cuda::flash_decode_splits(a);
    a.T = T;
    if (cuda::flash_decode_splits(a) < before) fall = T;
  }
  if (!fall) GTEST_SKIP() << "the split count never falls up to " << Tmax << " keys on this GPU";
  ::testing::Test::RecordProperty("fall", std::to_string(fall));
  a.T = fall - 1;
  gpu->attention_decode(a);  // the larger split count: partials where the counters go next
  a.T = fall;
  gpu->attention_decode(a);
  gpu->synchronize();
  AttentionDecode r = a;
  r.out = o_ref.t, r.lse = l_ref.t;
  const size_t bytes = cuda::flash_decode_workspace_bytes(r);
  void* ws = nullptr;
  ASSERT_GT(bytes, 0u);
  ASSERT_EQ(cudaMalloc(&ws, bytes), cudaSuccess);
  ASSERT_EQ(device_memset_sync(ws, 0, bytes), cudaSuccess);
  cuda::flash_decode(r, ws, bytes, ctx.main_stream());
  gpu->synchronize();
  cudaFree(ws);
  EXPECT_EQ(OpCase::download(*gpu, o.t), OpCase::download(*gpu, o_ref.t)) << "T = " << fall;
  EXPECT_EQ(OpCase::download(*gpu, l.t), OpCase::download(*gpu, l_ref.t)) << "T = " << fall;
}

// The last block of a (b, h) merges this call's partials, not what an earlier call left in
// the same workspace: calls alternate between two caches on one workspace, and each must
// give the bits of that cache's call on a fresh workspace. It guards changes to the merge's
// protocol: it killed both mutants of the sixty-first session's tagged merge (an epoch
// that never changed, a merge that did not wait for the tags). A relaxed count in place of
// the acq_rel one passed it on an H100 (BENCHMARKS.md, "Sixty-first session"): a missing
// fence does not show there. (The merge through the workspace, as above.)
TEST(CudaDecodeWorkspace, EachCallMergesItsOwnPartials) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible";
  ScopedEnv merge("FLASHGPT_DECODE_CLUSTER", "0");
  const int B = 1, H = 12, D = 64, T = 16384;
  DeviceContext ctx(0);
  auto gpu = make_cuda_ops(ctx);
  Buf q(*gpu, DType::bf16, {B, 3 * H * D}), o(*gpu, DType::bf16, {B, H * D}), l(*gpu, DType::f32, {B, H});
  Buf kc0(*gpu, DType::bf16, {B, H, T, D}), vc0(*gpu, DType::bf16, {B, H, T, D});
  Buf kc1(*gpu, DType::bf16, {B, H, T, D}), vc1(*gpu, DType::bf16, {B, H, T, D});
  std::vector<double> qkv(size_t(B) * 3 * H * D);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = round_to(DType::bf16, hashed_uniform(21, i));
  put(*gpu, q.t, qkv);
  const Buf* caches[2][2] = {{&kc0, &vc0}, {&kc1, &vc1}};
  for (int c = 0; c < 2; ++c) put_random_cache(*gpu, caches[c][0]->t, caches[c][1]->t, uint64_t(22 + c));
  auto decode_of = [&](int c) {
    return AttentionDecode{.out = o.t, .lse = l.t, .qkv = q.t, .k_cache = caches[c][0]->t, .v_cache = caches[c][1]->t,
                           .B = B, .H = H, .D = D, .T = T};
  };
  const size_t bytes = cuda::flash_decode_workspace_bytes(decode_of(0));
  ASSERT_GT(bytes, 0u) << "one split: nothing to merge";
  auto fresh_workspace = [&] {
    void* ws = nullptr;
    EXPECT_EQ(cudaMalloc(&ws, bytes), cudaSuccess);
    EXPECT_EQ(device_memset_sync(ws, 0, bytes), cudaSuccess);
    return ws;
  };
  std::vector<double> want_out[2], want_lse[2];
  for (int c = 0; c < 2; ++c) {
    void* ws = fresh_workspace();
    cuda::flash_decode(decode_of(c), ws, bytes, ctx.main_stream());
    gpu->synchronize();
    cudaFree(ws);
    want_out[c] = OpCase::download(*gpu, o.t), want_lse[c] = OpCase::download(*gpu, l.t);
  }
  ASSERT_NE(want_out[0], want_out[1]);
  void* ws = fresh_workspace();
  for (int call = 0; call < 16; ++call) {
    const int c = call % 2;
    cuda::flash_decode(decode_of(c), ws, bytes, ctx.main_stream());
    gpu->synchronize();
    EXPECT_EQ(OpCase::download(*gpu, o.t), want_out[c]) << "call " << call;
    EXPECT_EQ(OpCase::download(*gpu, l.t), want_lse[c]) << "call " << call;
  }
  cudaFree(ws);
}

// kv_cache_write copies exactly (any dtype is a copy), at an offset, leaving the rest.
class CudaKVCache : public CudaTest {};
TEST_F(CudaKVCache, WriteMatchesCpu) {
  const int B = 3, n = 5, H = 2, D = 64, Tmax = 11, pos = 4;
  std::mt19937_64 rng = test_rng();
  OpCase oc;
  oc.add("qkv", {B * n, 3 * H * D}, Kind::act, uniform(int64_t(B) * n * 3 * H * D, rng));
  oc.add("k", {B, H, Tmax, D}, Kind::act, uniform(int64_t(B) * H * Tmax * D, rng), true);
  oc.add("v", {B, H, Tmax, D}, Kind::act, uniform(int64_t(B) * H * Tmax * D, rng), true);
  for (DType dt : {DType::f32, DType::bf16}) {
    oc.round_inputs(dt);
    auto body = [&](Ops& ops, OpCase& t) {
      ops.kv_cache_write({.k_cache = t["k"], .v_cache = t["v"], .qkv = t["qkv"], .B = B, .n = n, .H = H, .D = D, .pos = pos});
    };
    auto ref = oc.run(*cpu_, DType::f64, body);
    auto got = oc.run(*gpu_, dt, body);
    EXPECT_EQ(got["k"], ref["k"]) << dtype_name(dt);
    EXPECT_EQ(got["v"], ref["v"]) << dtype_name(dt);
  }
}

// Generation on the GPU in fp32: greedy decoding with the KV cache (FlashDecoding)
// gives exactly the tokens of argmax over a full forward recomputed at every step, and
// the cached logits along a fixed sequence match the CPU fp64 decoder (CPU fp32 as the
// naive computation that fixes the bound); with learned and with rotary positions.
class CudaGenerate : public CudaTest {
 protected:
  static ModelConfig config(PositionEncoding pos) { return {2, 2, 128, 67, 128, 320, pos}; }  // D = 64
  static constexpr PositionEncoding kPositions[] = {PositionEncoding::learned, PositionEncoding::rope};
  // Larger-than-init random weights (spread logits); the same values on every backend.
  static std::vector<double> weights(GPT2& m) {
    m.init_random(3);
    std::vector<double> p = OpCase::download(m.ops(), m.params());
    std::mt19937_64 rng(4);
    std::normal_distribution<double> n(0, 1.0);
    for (const auto& info : m.param_list()) {
      const int64_t limit = info.name == "wte" ? int64_t(m.config().vocab_size) * m.config().n_embd : info.numel();
      for (int64_t i = 0; i < limit; ++i) p[info.offset + size_t(i)] += n(rng) * 0.3;
    }
    for (double& x : p) x = double(float(x));
    return p;
  }
};

TEST_F(CudaGenerate, GreedyFp32WithCacheEqualsFullRecompute) {
  const int P = 5, steps = 300;
  for (PositionEncoding pos : kPositions) {
    SCOPED_TRACE(position_name(pos));
    GPT2 model(config(pos), *gpu_, DType::f32, 1, P + steps);
    OpCase::upload(*gpu_, model.params(), weights(model));
    expect_same_greedy(greedy_both_ways(model, {1, 7, 42, 3, 66}, steps));
  }
}

TEST_F(CudaGenerate, Fp32LogitsMatchCpuAlongASequence) {
  for (PositionEncoding pos : kPositions) {
    SCOPED_TRACE(position_name(pos));
    const ModelConfig cfg = config(pos);
    const int B = 3, P = 7, steps = 60, V = cfg.vocab_size;
    std::mt19937_64 rng = test_rng();
    std::vector<int32_t> tokens(size_t(B) * (P + steps));
    for (auto& t : tokens) t = int32_t(rng() % uint64_t(V));
    auto run = [&](Ops& ops, DType dt) {
      GPT2 model(cfg, ops, dt, 1, 1);
      GPT2 init(cfg, *cpu_, DType::f64, 1, 1);
      OpCase::upload(ops, model.params(), weights(init));
      GPT2Decoder dec(model, B, P + steps);
      std::vector<int32_t> step(size_t(B) * P);
      for (int b = 0; b < B; ++b)
        std::copy_n(tokens.begin() + int64_t(b) * (P + steps), P, step.begin() + int64_t(b) * P);
      std::vector<double> logits, all;
      dec.step(step.data(), P, logits);
      all = logits;
      for (int s = 0; s < steps - 1; ++s) {
        for (int b = 0; b < B; ++b) step[size_t(b)] = tokens[size_t(b) * (P + steps) + size_t(P + s)];
        dec.step(step.data(), 1, logits);
        all.insert(all.end(), logits.begin(), logits.end());
      }
      return all;
    };
    const auto ref = run(*cpu_, DType::f64), naive = run(*cpu_, DType::f32), got = run(*gpu_, DType::f32);
    // Each decoded position's logits are one row of the rule.
    expect_rule(got, naive, ref, int64_t(ref.size()) / (int64_t(B) * steps), unit_roundoff(DType::f32),
                "decoder logits, GPU fp32 vs CPU fp64");
  }
}

}  // namespace
}  // namespace flashgpt::test
