// `flashgpt sample`: text generation from a checkpoint with a KV cache
// (layers/gpt2_infer.h), and the token sampler it uses.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace flashgpt {

struct SamplerSettings {
  double temperature = 1.0;  // 0: greedy (argmax, lowest id on ties)
  int top_k = 0;             // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // then the smallest set whose probability reaches p; 1: all
};

// A small, fully specified generator (splitmix64): the same stream on every platform
// and standard library, so a seed gives the same samples everywhere.
class SampleRng {
 public:
  explicit SampleRng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform();  // [0, 1) with 53 random bits
 private:
  uint64_t state_;
};

// Draws a token id from logits[0, V) (unnormalised log-probabilities).
int sample_token(const double* logits, int V, const SamplerSettings& s, SampleRng& rng);

struct SampleOptions {
  std::string checkpoint;     // checkpoint dir or run dir
  std::string prompt;         // text; "-" reads stdin; empty: start from <|endoftext|>
  int max_new_tokens = 256;
  int num_samples = 1;        // decoded together as one batch
  uint64_t seed = 1337;
  SamplerSettings sampler;
  std::string device = "auto";    // auto | cpu | cuda
  std::string precision;          // "": the checkpoint's; auto | bf16 | fp32 | fp64
  std::string vocab;              // tokenizer dir ("" = default)
};

// Generates and writes the text to stdout (one sample: streamed token by token; several:
// each one when complete, after a "--- sample i ---" line); statistics go to stderr.
// Returns the generated token ids of every sample (without the prompt).
std::vector<std::vector<int32_t>> run_sample(const SampleOptions& o);

}  // namespace flashgpt
