// `flashgpt bench decode`: the FlashDecoding kernels alone, bf16, on random data.
// Protocol (the same in scripts/bench_decode.py for SDPA): before every timed call a
// 512 MiB buffer is read (--flush read, the default) or overwritten (--flush write), so
// the cache starts cold in L2 (a decode step reads each layer's cache once); CUDA events
// around the call; median of --iters after --warmup. After a read the L2 holds clean
// lines, as in a real decode step (the kernels before it read weights and write a few
// rows); after a write it is full of dirty lines, and the timed call also pays for
// writing back up to an L2's worth of them (about 50 MB on an H100/H200).
// Bytes = the K and V read, 2·B·H·T·D·2 (q and the output are negligible); bandwidth =
// bytes / time. --floor also times, by the same protocol, references for a decode kernel:
// a launch that does nothing; the fastest of three plain streaming reads of the same K and
// V bytes (2, 4 and 8 blocks an SM; a reference, not a floor: at B = 16 decode kernels have
// read faster, BENCHMARKS.md); and, where the bulk kernel with 16 KB tiles runs, its
// reading alone (bench::stream_chunks: its grid, splits, threads and shared-memory stages,
// no arithmetic, no merge), which tells the cost of the kernel's way of reading from that
// of its arithmetic and merge. Each is also given as a share of the device copy bandwidth
// ((read + written) bytes / time of a 1 GiB cudaMemcpy, median of 10).
// --layers N (default 1: the protocol above) times a decode step's N layers instead: a
// step runs each layer's call on that layer's own cache, back to back on one stream, and a
// single call's time includes ~3 µs of fixed cost (the empty launch) that N calls share.
// N caches of the shape (each its own random K and V; q, the output and the workspace are
// shared, as the model's layers share the workspace); the L2 flushed once, then between
// the events the N calls on caches 0..N-1 in order; the time reported is elapsed / N. Each
// cache is read once a timed region, after the flush, so every call still reads a cold
// cache (a model runs other kernels between them; here none do; the hold before the start
// event lets the host enqueue the N calls ahead of the GPU). A shape gets only as many
// layers as fit in 8 GiB of K and V, at least one (a cache that big has a negligible fixed
// cost): the layers printed. --floor's references are timed the same way (N launches, on
// the N caches); the copy bandwidth is still the 1 GiB copy's.
#include "train/bench_decode.h"
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>
#include "src/errors.h"
#ifdef FLASHGPT_WITH_CUDA
#include <cuda_runtime.h>
#include "kernels/cuda/attention/flash_attention.h"
#include "src/cuda/bench_util.h"
#endif

namespace flashgpt {
namespace {

struct DecodeBenchOptions {
  std::vector<int> batches = {1};
  std::vector<int> lengths = {4096};
  int heads = 12, head_dim = 64;
  bool suite = false, json = false;
  std::string flush = "read";  // how the L2 is flushed before a timed call: read | write
  int splits = 0;               // splits per (b, h); 0: the kernel's own plan
  bool floor = false;           // also time an empty launch, a plain read and the bulk kernel's reading alone
  int layers = 1;               // calls a timed region, each on its own layer's cache
  int warmup = 3, iters = 10;
};

#ifdef FLASHGPT_WITH_CUDA
constexpr size_t kFlushBytes = size_t(512) << 20;  // far above the L2 of any current GPU (H100/H200: 50 MB)
constexpr double kLayersBudget = double(size_t(8) << 30);  // --layers: K and V bytes of a shape's layers, at most

using bench::DeviceMem;
using bench::fill_random_bf16;

void bench_one(int B, int H, int T, int D, const DecodeBenchOptions& opt, cudaStream_t stream, void* flush,
               double copy) {
  const int64_t cache = int64_t(B) * H * T * D;
  const double bytes = 2.0 * double(cache) * 2.0;
  const int layers = int(std::clamp(std::floor(kLayersBudget / bytes), 1.0, double(opt.layers)));
  // The layers' caches end to end in k and in v; q and the output are shared.
  const size_t cache_bytes = size_t(cache) * 2;
  DeviceMem qkv(size_t(B) * 3 * H * D * 2), k(cache_bytes * layers), v(cache_bytes * layers), out(size_t(B) * H * D * 2);
  auto k_of = [&](int l) { return static_cast<char*>(k.ptr) + cache_bytes * l; };
  auto v_of = [&](int l) { return static_cast<char*>(v.ptr) + cache_bytes * l; };
  fill_random_bf16(qkv.ptr, size_t(B) * 3 * H * D);
  AttentionDecode a;
  a.qkv = Tensor(qkv.ptr, DType::bf16, Device::cuda, {B, 3 * H * D});
  a.out = Tensor(out.ptr, DType::bf16, Device::cuda, {B, H * D});
  a.B = B, a.H = H, a.D = D, a.T = T;
  a.settled = T;  // no kernel of the benchmark writes a cache
  std::vector<AttentionDecode> layer(layers, a);
  for (int l = 0; l < layers; ++l) {
    fill_random_bf16(k_of(l), size_t(cache), size_t(l) * 1000003);  // every layer's data its own
    fill_random_bf16(v_of(l), size_t(cache), size_t(l) * 1000003);
    layer[l].k_cache = Tensor(k_of(l), DType::bf16, Device::cuda, {B, H, T, D});
    layer[l].v_cache = Tensor(v_of(l), DType::bf16, Device::cuda, {B, H, T, D});
  }
  // One workspace for every layer, as in the model: the calls are stream-ordered, of the
  // same layout, and each leaves it valid for the next (flash_attention.h).
  const size_t ws_bytes = cuda::flash_decode_workspace_bytes(layer[0], opt.splits);
  DeviceMem ws(ws_bytes);
  if (ws_bytes) CUDA_CHECK(cudaMemset(ws.ptr, 0, ws_bytes));  // the split counters start at 0
  int call = 0;
  auto evict = [&] {  // the caches out of L2
    if (opt.flush == "write")
      CUDA_CHECK(cudaMemsetAsync(flush, call++ & 0xff, kFlushBytes, stream));
    else
      bench::read_through_l2(flush, kFlushBytes, stream);
  };
  // The time of one call: fn(l) for every layer l after one L2 flush, elapsed / layers.
  auto timed = [&](auto&& fn) {
    auto all_layers = [&] { for (int l = 0; l < layers; ++l) fn(l); };
    return double(bench::median_ms(all_layers, opt.warmup, opt.iters, stream, evict)) / layers;
  };
  const double med = timed([&](int l) { cuda::flash_decode(layer[l], ws.ptr, ws_bytes, stream, opt.splits); });
  const double tbs = bytes / (med * 1e-3) / 1e12;
  const int splits = cuda::flash_decode_splits(layer[0], opt.splits);
  const std::string kernel = cuda::flash_decode_kernel(D);
  // --floor: an empty launch; the fastest plain read of K and V; the bulk kernel's reading
  // alone, with its splits and threads (-1: not timed, no sm_90a code)
  double empty_ms = 0, read_ms = 0, stream_ms = -1;
  if (opt.floor) {
    empty_ms = timed([&](int) { bench::launch_empty(stream); });
    read_ms = timed([&](int l) { bench::read_pair(k_of(l), v_of(l), cache_bytes, 2, stream); });
    for (int per_sm : {4, 8})
      read_ms = std::min(read_ms, timed([&](int l) { bench::read_pair(k_of(l), v_of(l), cache_bytes, per_sm, stream); }));
    // The kernel's name: bulk|mma<stages>x<tile KB>KB/<threads> (flash_decode_kernel): the same tiles and threads.
    const size_t slash = kernel.find('/');
    const int threads = slash == std::string::npos ? 0 : std::atoi(kernel.c_str() + slash + 1);
    auto read_chunks = [&](int l) {
      return bench::stream_chunks(k_of(l), v_of(l), int64_t(B) * H, int64_t(T) * D * 2, D * 2, T, splits, threads, stream);
    };
    if (kernel.find("x16KB/") != std::string::npos && read_chunks(0)) stream_ms = timed(read_chunks);
  }
  auto copy_share = [&](double ms) { return 100.0 * bytes / (ms * 1e-3) / 1e12 / copy; };  // % of the copy bandwidth
  const std::string layers_note = opt.layers > 1 ? ", " + std::to_string(layers) + " layers" : "";
  if (opt.json) {
    std::printf("{\"B\": %d, \"H\": %d, \"T\": %d, \"D\": %d, \"ms\": %.5f, \"bytes\": %.0f, \"tbs\": %.4f, \"splits\": %d, "
                "\"kernel\": \"%s\"",
                B, H, T, D, med, bytes, tbs, splits, kernel.c_str());
    if (opt.layers > 1) std::printf(", \"layers\": %d", layers);
    if (opt.floor)
      std::printf(", \"copy_tbs\": %.4f, \"empty_ms\": %.5f, \"read_ms\": %.5f, \"stream_ms\": %.5f", copy, empty_ms,
                  read_ms, stream_ms);
    std::printf("}\n");
  } else if (opt.floor) {
    std::printf("B=%-3d H=%-3d T=%-8d D=%-4d %10.5f ms  KV read %7.3f TB/s %6.1f%% of copy (%d splits, %s%s) | empty "
                "launch %8.5f ms, plain read %10.5f ms %6.1f%% of copy",
                B, H, T, D, med, tbs, copy_share(med), splits, kernel.c_str(), layers_note.c_str(), empty_ms, read_ms,
                copy_share(read_ms));
    if (stream_ms >= 0) std::printf(", bulk reading alone %10.5f ms %6.1f%% of copy", stream_ms, copy_share(stream_ms));
    std::printf("\n");
  } else {
    std::printf("B=%-3d H=%-3d T=%-8d D=%-4d %10.5f ms  KV read %7.3f TB/s  (%d splits, %s%s)\n", B, H, T, D, med, tbs,
                splits, kernel.c_str(), layers_note.c_str());
  }
  std::fflush(stdout);
}

void run_decode_bench(const DecodeBenchOptions& opt) {
  const std::string gpu = bench::gpu_name_or_fail("bench decode");
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceMem flush(kFlushBytes);
  CUDA_CHECK(cudaMemset(flush.ptr, 0, kFlushBytes));  // defined contents for --flush read
  double copy = 0;  // --floor: the yardstick, a 1 GiB device-to-device copy (median of 10 after 3)
  if (opt.floor) {
    constexpr size_t kCopyBytes = size_t(1) << 30;
    DeviceMem src(kCopyBytes), dst(kCopyBytes);
    copy = bench::copy_tbs(dst.ptr, src.ptr, kCopyBytes, 3, 10, stream);
  }
  if (!opt.json) {
    const std::string when = opt.layers == 1 ? "each call"
        : "each run of N layers' calls, back to back, each on its own K and V (N = " + std::to_string(opt.layers) +
          ", fewer where their K and V would pass 8 GiB: the layers shown); ms = the run's time / N";
    std::printf("flash decode on %s, bf16 KV cache; bytes = K + V = 2*B*H*T*D*2, L2 flushed (by a %s of 512 MiB) "
                "before %s; median of %d after %d warm-up\n", gpu.c_str(), opt.flush.c_str(), when.c_str(), opt.iters,
                opt.warmup);
    if (opt.floor) std::printf("device copy bandwidth %.3f TB/s (read + written, a 1 GiB copy)\n", copy);
  }
  struct Shape { int H, D; };
  std::vector<Shape> shapes = {{opt.heads, opt.head_dim}};
  std::vector<int> lengths = opt.lengths, batches = opt.batches;
  if (opt.suite) {
    shapes = {{12, 64}, {16, 128}};  // GPT-2 124M's heads; hidden 2048 with D = 128
    lengths.clear();
    for (int t = 1024; t <= 262144; t *= 2) lengths.push_back(t);
    batches = {1, 16};
  }
  for (const Shape& s : shapes)
    for (int B : batches)
      for (int T : lengths) bench_one(B, s.H, T, s.D, opt, stream, flush.ptr, copy);
  CUDA_CHECK(cudaStreamDestroy(stream));
}
#endif

}  // namespace

void add_bench_decode_command(CLI::App& bench) {
  auto opt = std::make_shared<DecodeBenchOptions>();
  auto* cmd = bench.add_subcommand("decode", "Time FlashDecoding (one query against a bf16 KV cache): KV read bandwidth");
  cmd->add_option("--batch", opt->batches, "batch sizes B")->capture_default_str();
  cmd->add_option("--seq", opt->lengths, "cache lengths T")->capture_default_str();
  cmd->add_option("--heads", opt->heads, "heads H")->capture_default_str();
  cmd->add_option("--head-dim", opt->head_dim, "head dim D (64 or 128)")->capture_default_str();
  cmd->add_flag("--suite", opt->suite, "T = 1K..256K, B = 1 and 16, (H, D) = (12, 64) and (16, 128)");
  cmd->add_flag("--json", opt->json, "one JSON object per shape");
  cmd->add_option("--splits", opt->splits, "splits of each (b, h)'s cache (about; 0: the kernel's plan)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--flush", opt->flush, "L2 flush before each timed call: read (clean lines) or write (dirty lines)")
      ->capture_default_str()
      ->check(CLI::IsMember({"read", "write"}));
  cmd->add_flag("--floor", opt->floor,
                "also time an empty launch, the fastest plain read of the same bytes and the bulk kernel's reading alone, "
                "as shares of the copy bandwidth");
  cmd->add_option("--layers", opt->layers,
                  "time N calls back to back, each on its own layer's cache (a decode step's N layers), as elapsed / N; "
                  "only as many layers as fit in 8 GiB of K and V")
      ->capture_default_str()
      ->check(CLI::Range(1, INT_MAX));
  cmd->add_option("--warmup", opt->warmup, "warm-up runs")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--iters", opt->iters, "timed runs (median)")->capture_default_str()->check(CLI::Range(1, INT_MAX));
  cmd->callback([opt] {
#ifdef FLASHGPT_WITH_CUDA
    run_decode_bench(*opt);
#else
    fail_input("bench decode needs the CUDA backend: this flashgpt was built without CUDA");
#endif
  });
}

}  // namespace flashgpt
