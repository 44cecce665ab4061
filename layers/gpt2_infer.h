// GPT-2 inference with a KV cache, on a GPT2's weights and op set (no gradients, no
// saved activations). B sequences advance in lock-step:
//
//   GPT2Decoder dec(model, B, max_len);
//   dec.step(prompt_tokens, n);  // prefill: positions [0, n), causal flash attention,
//                                // keys and values written to the cache
//   dec.step(next_tokens, 1);    // decode: one token per sequence against the cache
//                                // (attention_decode: FlashDecoding on CUDA)
//
// Each step returns the logits of every sequence's last new token. The cache holds
// K and V per layer as (B, H, max_len, D) in the model's dtype (bf16 on CUDA, fp32/fp64
// on the CPU). Activations are sized for B·max_len rows (a prompt may fill the cache)
// and reused by every layer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "layers/gpt2.h"

namespace flashgpt {

class GPT2Decoder {
 public:
  // model: weights (only params() and param_list() are read; must outlive this).
  // max_len <= model.config().max_seq_len: the longest sequence (prompt + generated).
  GPT2Decoder(GPT2& model, int B, int max_len);
  ~GPT2Decoder();
  GPT2Decoder(const GPT2Decoder&) = delete;
  GPT2Decoder& operator=(const GPT2Decoder&) = delete;

  // Appends tokens (B, n) (host, row-major) at positions [length(), length() + n) and
  // returns their last position's logits: (B, vocab_size) in `logits` (padding columns
  // dropped). The first step (length() == 0) may be any n (the prompt); later steps
  // take n == 1, or run n one-token steps.
  void step(const int32_t* tokens, int n, std::vector<double>& logits);
  int length() const { return pos_; }
  int max_len() const { return max_len_; }
  int B() const { return B_; }
  void reset() { pos_ = 0; }
  size_t cache_bytes() const;

 private:
  struct Weights;  // views of the model's parameters, by name
  struct Buffers;  // KV cache and activations, one arena
  void forward(const int32_t* tokens, int n, std::vector<double>& logits);

  GPT2& model_;
  Ops& ops_;
  int B_, max_len_, pos_ = 0;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Buffers> buf_;
  void* mem_ = nullptr;
  std::vector<int32_t> staging_;
};

}  // namespace flashgpt
