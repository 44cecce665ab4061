// The CUDA op set (make_cuda_ops): checks each call's tensors (device, dtype) and
// dispatches to the launchers of cuda_kernels.h on the context's main stream.
// Activations bf16 (fp32 accumulation) or fp32 (verification); gradients fp32.
// Device memory this object needs for itself (reduction partials, the embedding sort,
// the FlashAttention backward workspace) is allocated on first use for a shape and
// kept, so a training loop allocates nothing after its first step.
#include <algorithm>
#include <tuple>
#include "kernels/cuda/attention/flash_attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "src/cuda/device_context.h"

namespace flashgpt {
namespace {

void check_dev(const Tensor& t, const char* what) {
  FG_ASSERT(t.defined(), what, " is undefined");
  FG_ASSERT(t.device == Device::cuda, what, " is not on the GPU");
}
void check_dev_opt(const Tensor& t, const char* what) {
  if (t.defined()) check_dev(t, what);
}

// cudaMalloc that reports running out of memory as such (an InputError: the run is too
// big for this GPU, which the pre-flight check of train/memory_plan.h normally says
// before anything is allocated); any other failure is an error as usual.
void* device_malloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky, but leave no error behind
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail_input("out of GPU memory: allocating ", bytes / double(1 << 20), " MiB with ",
               free_b / double(1 << 20), " MiB free of ", total_b / double(1 << 20),
               " MiB (`flashgpt memory` shows what a run needs)");
  }
  CUDA_CHECK(err);
  return p;
}

// A grow-only device buffer. Growing synchronises the stream first (the old buffer may
// still be in use by queued kernels); it only happens while shapes are first seen.
class DeviceBuffer {
 public:
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }
  void* get(size_t bytes, cudaStream_t stream) {
    if (bytes > cap_) {
      if (ptr_) {
        CUDA_CHECK(cudaStreamSynchronize(stream));
        CUDA_CHECK(cudaFree(ptr_));
        ptr_ = nullptr;
      }
      ptr_ = device_malloc(bytes);
      cap_ = bytes;
      // Zeroed when allocated: FlashDecoding's split counters must start at 0 (each call leaves
      // them so; attention_decode zeroes them again when their place moves).
      CUDA_CHECK(cudaMemsetAsync(ptr_, 0, bytes, stream));
    }
    return ptr_;
  }

 private:
  void* ptr_ = nullptr;
  size_t cap_ = 0;
};

class CudaOps final : public Ops {
 public:
  CudaOps(DeviceContext& ctx, bool tune_gemms) : ctx_(ctx), matmul_(ctx) { matmul_.tune(tune_gemms); }
  Device device() const override { return Device::cuda; }
  std::string name() const override { return "cuda"; }

  // ---- memory ----
  void* alloc(size_t bytes) override { return device_malloc(bytes); }
  void free(void* p) override {
    if (p) CUDA_CHECK(cudaFree(p));
  }
  void memset_zero(Tensor t) override {
    check_dev(t, "memset_zero tensor");
    CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), stream()));
  }
  void to_host(void* dst, const Tensor& src) override {
    check_dev(src, "to_host source");
    CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void from_host(const Tensor& dst, const void* src) override {
    check_dev(dst, "from_host destination");
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, stream()));
    // The caller may free or reuse its host buffer as soon as we return.
    CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream())); }
  void* alloc_host(size_t bytes) override {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 1)));
    return p;
  }
  void free_host(void* p) override {
    if (p) CUDA_CHECK(cudaFreeHost(p));
  }
  void from_host_async(const Tensor& dst, const void* src) override {
    check_dev(dst, "from_host_async destination");
    // Ordered on the compute stream: the next kernels see the data; the host returns at once.
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, stream()));
  }
  void cast(Tensor dst, Tensor src) override {
    check_dev(dst, "cast destination");
    check_dev(src, "cast source");
    cuda::cast(dst, src, stream());
  }

  // ---- embedding ----
  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) override {
    check_dev(out, "out"); check_dev(tokens, "tokens"); check_dev(wte, "wte"); check_dev_opt(wpe, "wpe");
    cuda::embedding_forward(out, tokens, wte, wpe, stream());
  }
  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) override {
    check_dev(dwte, "dwte"); check_dev_opt(dwpe, "dwpe"); check_dev(dout, "dout"); check_dev(tokens, "tokens");
    size_t bytes = cuda::embedding_backward_scratch_bytes(tokens.numel(), dwte.shape[0]);
    void* s = scratch_.get(bytes, stream());
    cuda::embedding_backward(dwte, dwpe, dout, tokens, s, bytes, stream());
  }

  // ---- rotary position embedding ----
  void rope(Tensor qkv, int T, int H, bool inverse, int64_t pos0) override {
    check_dev(qkv, "qkv");
    cuda::rope(qkv, T, H, inverse, pos0, stream());
  }

  // ---- layernorm ----
  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight,
                         Tensor bias) override {
    check_dev(out, "out"); check_dev(mean, "mean"); check_dev(rstd, "rstd");
    check_dev(inp, "inp"); check_dev(weight, "weight"); check_dev(bias, "bias");
    cuda::layernorm_forward(Tensor(), out, mean, rstd, inp, Tensor(), weight, bias, stream());
  }
  void residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd,
                                  Tensor inp1, Tensor inp2, Tensor weight, Tensor bias) override {
    check_dev(residual, "residual"); check_dev(out, "out"); check_dev(mean, "mean");
    check_dev(rstd, "rstd"); check_dev(inp1, "inp1"); check_dev(inp2, "inp2");
    check_dev(weight, "weight"); check_dev(bias, "bias");
    cuda::layernorm_forward(residual, out, mean, rstd, inp1, inp2, weight, bias, stream());
  }
  void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                          Tensor weight, Tensor mean, Tensor rstd) override {
    check_dev(dinp, "dinp"); check_dev(dweight, "dweight"); check_dev(dbias, "dbias");
    check_dev(dout, "dout"); check_dev(inp, "inp"); check_dev(weight, "weight");
    check_dev(mean, "mean"); check_dev(rstd, "rstd");
    int64_t C = weight.numel();
    void* s = scratch_.get(cuda::layernorm_backward_scratch_bytes(inp.numel() / C, C), stream());
    cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, s, stream());
  }

  // ---- matmul ----
  void matmul_forward(const MatmulForward& a) override {
    check_dev(a.out, "out"); check_dev(a.inp, "inp"); check_dev(a.weight, "weight");
    check_dev_opt(a.bias, "bias"); check_dev_opt(a.pre_gelu, "pre_gelu");
    matmul_.forward(a, stream());
  }
  void matmul_backward(const MatmulBackward& a) override {
    check_dev_opt(a.dinp, "dinp"); check_dev_opt(a.dweight, "dweight"); check_dev_opt(a.dbias, "dbias");
    check_dev(a.dout, "dout"); check_dev(a.inp, "inp"); check_dev(a.weight, "weight");
    check_dev_opt(a.dinp_gelu_pre, "dinp_gelu_pre");
    void* s = nullptr;
    if (a.dbias.defined()) {
      int64_t OC = a.weight.shape[0];
      s = scratch_.get(cuda::bias_grad_scratch_bytes(a.dout.numel() / OC, OC), stream());
    }
    matmul_.backward(a, s, stream());
  }

  // ---- GELU ----
  void gelu_forward(Tensor out, Tensor inp) override {
    check_dev(out, "out"); check_dev(inp, "inp");
    cuda::gelu_forward(out, inp, stream());
  }
  void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) override {
    check_dev(dinp, "dinp"); check_dev(inp, "inp"); check_dev(dout, "dout");
    cuda::gelu_backward(dinp, inp, dout, stream());
  }

  // ---- attention ----
  void attention_forward(const AttentionForward& a) override {
    check_dev(a.out, "out"); check_dev(a.lse, "lse"); check_dev(a.qkv, "qkv");
    if (a.algo == AttentionAlgo::naive) {
      check_dev(a.probs, "probs");
      cuda::attention_naive_forward(a, ctx_, stream());
    } else if (a.qkv.dtype == DType::bf16) {
      cuda::flash_attention_forward(a, stream());
    } else {
      cuda::attention_rowwise_forward(a, stream());  // fp32: the exact O(T)-memory path
    }
  }
  void attention_backward(const AttentionBackward& a) override {
    check_dev(a.dqkv, "dqkv"); check_dev(a.dout, "dout"); check_dev(a.qkv, "qkv");
    check_dev(a.out, "out"); check_dev(a.lse, "lse");
    if (a.algo == AttentionAlgo::naive) {
      check_dev(a.probs, "probs");
      void* s = scratch_.get(cuda::attention_naive_scratch_bytes(a.H, a.T, a.qkv.dtype), stream());
      cuda::attention_naive_backward(a, ctx_, s, stream());
    } else if (a.qkv.dtype == DType::bf16) {
      size_t bytes = cuda::flash_attention_workspace_bytes(a.B, a.T, a.H, a.D);
      void* ws = bytes ? flash_ws_.get(bytes, stream()) : nullptr;
      cuda::flash_attention_backward(a, ws, stream());
    } else {
      check_dev(a.delta, "delta");
      cuda::attention_rowwise_backward(a, stream());
    }
  }

  // ---- decoding with a KV cache ----
  void attention_decode(const AttentionDecode& a) override {
    check_dev(a.out, "out"); check_dev(a.qkv, "qkv"); check_dev(a.k_cache, "k_cache"); check_dev(a.v_cache, "v_cache");
    check_dev_opt(a.lse, "lse");
    // Rounded up to a power of two: the workspace grows (and synchronises) only a few
    // times while a sequence gets longer.
    const size_t need = cuda::flash_decode_workspace_bytes(a);
    size_t bytes = need ? 4096 : 0;
    while (bytes < need) bytes *= 2;
    void* ws = bytes ? decode_ws_.get(bytes, stream()) : nullptr;
    // The split counters sit after the partials, so they move when the split count, B·H
    // or D does (need, B·H and D fix the split count), and land where partials were:
    // zeroed again then (a few times while a sequence grows; flash_attention.h).
    const std::tuple<size_t, int64_t, int> layout{need, int64_t(a.B) * a.H, a.D};
    if (ws && layout != decode_layout_) CUDA_CHECK(cudaMemsetAsync(ws, 0, need, stream()));
    decode_layout_ = layout;
    cuda::flash_decode(a, ws, bytes, stream());
  }
  void kv_cache_write(const KVCacheWrite& a) override {
    check_dev(a.k_cache, "k_cache"); check_dev(a.v_cache, "v_cache"); check_dev(a.qkv, "qkv");
    cuda::kv_cache_write(a, stream());
  }

  // ---- softmax + cross-entropy ----
  void softmax_cross_entropy(Tensor losses, Tensor logits, Tensor targets, int V,
                             float dloss) override {
    check_dev(losses, "losses"); check_dev(logits, "logits"); check_dev(targets, "targets");
    cuda::softmax_cross_entropy(losses, logits, targets, V, dloss, stream());
  }

  // ---- optimizer ----
  void adamw_update(const AdamWArgs& a) override {
    check_dev(a.param, "param"); check_dev_opt(a.master, "master"); check_dev(a.grad, "grad");
    check_dev(a.m, "m"); check_dev(a.v, "v");
    cuda::adamw_update(a, stream());
  }
  void sum_squares(Tensor out, Tensor grad) override {
    check_dev(out, "out"); check_dev(grad, "grad");
    cuda::sum_squares(out, grad, scratch_.get(cuda::sum_squares_scratch_bytes(), stream()), stream());
  }
  void scale(Tensor x, float s) override {
    check_dev(x, "x");
    cuda::scale(x, s, stream());
  }

 private:
  cudaStream_t stream() const { return ctx_.main_stream(); }

  DeviceContext& ctx_;
  cuda::Matmul matmul_;
  DeviceBuffer scratch_;   // reduction partials, sort buffers, naive dP: one op at a time
  DeviceBuffer flash_ws_;  // FlashAttention backward workspace, sized for the largest shape
  DeviceBuffer decode_ws_;  // FlashDecoding per-split partials
  std::tuple<size_t, int64_t, int> decode_layout_{};  // (bytes, B·H, D) of the last decode call
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(DeviceContext& ctx, bool tune_gemms) {
  return std::make_unique<CudaOps>(ctx, tune_gemms);
}

}  // namespace flashgpt
