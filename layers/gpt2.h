// GPT-2, written once against the op set (kernels/ops.h). The same code runs on the
// CPU (fp32/fp64) and on CUDA (bf16/fp32); only the Ops object differs.
//
// Memory: parameters, parameter gradients and activations each live in one arena,
// laid out layer-major, so one layer's gradients are one contiguous range (one
// communication bucket). Nothing is allocated after construction.
//
// One micro-step:   set_batch(inputs, targets);  loss = forward(dloss);  backward();
// forward() runs the LM head chunk by chunk: logits → fused softmax-CE (loss, and
// dlogits in place when dloss != 0) → head backward for that chunk, so the
// (B·T, Vp) logits never exist whole. backward() then runs the blocks in reverse,
// recomputing first what the recompute policy (layers/recompute.h) did not keep.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include "kernels/ops.h"
#include "layers/recompute.h"

namespace flashgpt {

// learned: GPT-2's position table wpe (max_seq_len × C) added to the token embedding.
// rope: no table; q and k are rotated by their position (ops.h, Ops::rope).
enum class PositionEncoding { learned, rope };
// The name model.position gives it in configs: "learned" or "rope".
inline const char* position_name(PositionEncoding p) { return p == PositionEncoding::rope ? "rope" : "learned"; }

struct ModelConfig {
  int n_layer = 0, n_head = 0, n_embd = 0;
  int vocab_size = 0;    // real vocabulary (50257 for GPT-2)
  int padded_vocab = 0;  // rows of wte, a multiple of 128 for fast matmuls (50304)
  int max_seq_len = 0;   // longest T; the rows of wpe with learned positions
  PositionEncoding position = PositionEncoding::learned;
};

// How one model instance computes (not what it computes): the attention algorithm and
// what backward recomputes. Converts from an AttentionAlgo, as the constructor used to
// take one.
struct ModelOptions {
  ModelOptions(AttentionAlgo a = AttentionAlgo::flash) : attention(a) {}  // NOLINT: implicit on purpose
  AttentionAlgo attention;
  RecomputePolicy recompute;
  // FLASHGPT_DETERMINISTIC=1 (set by train/backend.cpp): the MLP's GELU is computed from
  // the rounded pre-activation by the elementwise kernel, never in the matmul epilogue,
  // whatever the policy, so that every recompute policy gives the same bits.
  bool deterministic = false;
  // Each layer's parameter range (and the arena's end) starts at a multiple of this many
  // elements, so a caller can cut every layer into equal shards (ZeRO-1).
  size_t layer_align = 1;
  // false: no gradient arena (inference: eval, sample, export hold the weights once);
  // backward(), zero_grad() and forward(dloss != 0) are then errors.
  bool gradients = true;
};

// One named parameter tensor inside the parameter arena.
struct ParamInfo {
  std::string name;     // e.g. "h.3.attn.c_attn.weight"
  int layer;            // -1: embeddings, n_layer: final layernorm
  size_t offset;        // elements from the start of the arena
  size_t packed;        // elements before it when all parameters are packed without gaps,
                        // in this order (checkpoints; independent of the arena's padding)
  std::vector<int64_t> shape;
  bool decay;           // 2-D weights get weight decay; biases, LN params do not
  int64_t numel() const { int64_t n = 1; for (auto s : shape) n *= s; return n; }
};

// The model's memory, from the shapes alone (GPT2::memory): exactly what the
// constructor allocates, arena by arena, since it comes from the same code.
struct ModelMemory {
  size_t num_params = 0;        // elements of the parameter arena (alignment gaps included)
  size_t largest_param = 0;     // elements of the largest parameter tensor (wte)
  size_t param_bytes = 0;       // parameters, activation dtype
  size_t grad_bytes = 0;        // gradients, GradDType
  size_t activation_bytes = 0;  // the activation arena (alignment gaps included)
  // The activation arena by tensor kind ("QKV", "MLP pre-GELU", ...), in layout order.
  std::vector<std::pair<std::string, size_t>> activation_kinds;
  std::vector<ParamInfo> params;  // the parameter tensors, as the constructor lays them out
};

class GPT2 {
 public:
  // B, T: the micro-batch this model is sized for (activations are planned for it).
  GPT2(const ModelConfig& cfg, Ops& ops, DType dtype, int B, int T, const ModelOptions& opts = {});
  // What GPT2(cfg, ops, dtype, B, T, opts) allocates on `device`, without allocating.
  static ModelMemory memory(const ModelConfig& cfg, Device device, DType dtype, int B, int T,
                            const ModelOptions& opts);
  ~GPT2();
  GPT2(const GPT2&) = delete;
  GPT2& operator=(const GPT2&) = delete;

  // GPT-2 initialisation: N(0, 0.02); residual projections N(0, 0.02/sqrt(2·n_layer));
  // biases 0; layernorm weight 1, bias 0. Deterministic given the seed.
  void init_random(uint64_t seed);

  // inputs, targets: host arrays of B*T token ids (targets < 0 are ignored).
  void set_batch(const int32_t* inputs, const int32_t* targets);
  // Returns the mean loss over the batch's targets (last_loss() has it in double). If dloss != 0, also computes the
  // gradient of the head (dlogits scaled by dloss) ready for backward().
  float forward(float dloss);
  // Accumulates (+=) all parameter gradients. Requires forward(dloss != 0) before it.
  void backward();
  // Called by backward() as soon as a layer's gradients for this micro-batch are final,
  // in the order n_layer (final layernorm), n_layer-1, ..., 0, -1 (embeddings, last:
  // the tied wte also collects the head's gradient). Whoever owns the gradients (the
  // data-parallel trainer) starts communicating that layer while backward goes on.
  using GradReadyHook = std::function<void(int layer)>;
  void on_grads_ready(GradReadyHook hook) { grads_ready_ = std::move(hook); }
  double last_loss() const { return last_loss_; }
  void zero_grad();

  const ModelConfig& config() const { return cfg_; }
  Ops& ops() { return ops_; }
  DType dtype() const { return dtype_; }
  int B() const { return B_; }
  int T() const { return T_; }
  AttentionAlgo attention_algo() const { return opts_.attention; }
  const ModelOptions& options() const { return opts_; }

  Tensor params() const { return params_; }  // all parameters, flat, activation dtype
  Tensor param(const ParamInfo& p) const;     // one of them, with its shape, inside params()
  Tensor grads() const { return grads_; }    // all gradients, flat, GradDType(dtype); undefined without
                                             // ModelOptions::gradients
  const std::vector<ParamInfo>& param_list() const { return param_list_; }
  size_t num_params() const { return size_t(params_.numel()); }  // arena elements, padding included
  size_t num_packed() const;  // parameters without padding (what checkpoints hold)
  // [begin, end) element range of layer l in the arena (-1 embeddings, n_layer final LN):
  // the ranges of -1, 0, ..., n_layer tile the whole arena, padding included.
  std::pair<size_t, size_t> layer_range(int layer) const;
  size_t activation_bytes() const { return act_bytes_; }
  // The activation arena by tensor kind (see ModelMemory).
  const std::vector<std::pair<std::string, size_t>>& activation_kinds() const { return act_kinds_; }
  // The last forward's logits for rows [0, rows) are not kept (chunked); tests that
  // need logits call this: (B*T, Vp) logits of the current batch written to host.
  void logits_to_host(float* out);

  // Model FLOPs per token for forward+backward (6·N + attention), for MFU.
  double flops_per_token() const;

 private:
  struct Layer;    // views into the arenas for one block
  void plan_params();
  void plan_activations();
  void release();  // frees whatever is allocated (destructor, failed constructor)
  // Block l's forward. recompute: the backward's re-run under the block policy, which
  // recomputes what the block's backward reads and stops before the block output
  // (kept) and the next layernorm.
  void block_forward(int l, bool recompute);
  void attention_forward(int l);
  void recompute(int l);  // what the policy did not keep of block l, before its backward
  void head_chunk(int64_t row0, int64_t row1, float dloss);

  ModelConfig cfg_;
  Ops& ops_;
  DType dtype_;
  int B_, T_;
  ModelOptions opts_;
  bool unfused_gelu_;  // GELU by the elementwise kernel after the matmul (see ModelOptions)

  std::vector<ParamInfo> param_list_;
  std::vector<size_t> layer_start_;  // arena offset where layer l starts, at [l + 1]; end last
  GradReadyHook grads_ready_;
  void* param_mem_ = nullptr;
  void* grad_mem_ = nullptr;
  void* act_mem_ = nullptr;
  size_t act_bytes_ = 0;
  std::vector<std::pair<std::string, size_t>> act_kinds_;
  Tensor params_, grads_;
  std::vector<Layer> layers_;
  struct Ends;                   // embeddings and final layernorm
  std::unique_ptr<Ends> ends_;
  struct Acts;
  std::unique_ptr<Acts> acts_;
  std::vector<int32_t> host_targets_;
  int32_t* staging_ = nullptr;  // (2·B·T) page-locked: inputs then targets
  double last_loss_ = 0;
};

}  // namespace flashgpt
