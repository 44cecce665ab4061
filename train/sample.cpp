// `flashgpt sample CKPT --prompt TEXT`: prefill the prompt, then decode one token at a
// time against the KV cache, sampling each token on the host from the logits.
#include "train/sample.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <numeric>
#include "data/tokenizer.h"
#include "layers/gpt2_infer.h"
#include "src/commands.h"
#include "src/errors.h"
#include "train/load_model.h"

namespace flashgpt {

uint64_t SampleRng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double SampleRng::uniform() { return double(next() >> 11) * 0x1.0p-53; }

int sample_token(const double* logits, int V, const SamplerSettings& s, SampleRng& rng) {
  if (s.temperature <= 0) return int(std::max_element(logits, logits + V) - logits);  // first max
  // Candidates by decreasing logit (ties: lower id first), cut to the top k; without
  // top-k or top-p, all tokens in id order (no sort needed).
  std::vector<int> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  const size_t k = s.top_k > 0 ? std::min<size_t>(size_t(s.top_k), ids.size()) : ids.size();
  if (k < ids.size() || s.top_p < 1) {
    auto before = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(), before);
    ids.resize(k);
  }
  // Softmax of logits / temperature over the candidates.
  double mx = -INFINITY;
  for (int id : ids) mx = std::max(mx, logits[id]);
  std::vector<double> p(k);
  double sum = 0;
  for (size_t i = 0; i < k; ++i) sum += (p[i] = std::exp((logits[ids[i]] - mx) / s.temperature));
  // Nucleus: the shortest prefix whose probability reaches top_p.
  size_t n = k;
  if (s.top_p < 1) {
    double cum = 0;
    for (n = 0; n < k;) {
      cum += p[n++] / sum;
      if (cum >= s.top_p) break;
    }
    sum = std::accumulate(p.begin(), p.begin() + std::ptrdiff_t(n), 0.0);
  }
  double u = rng.uniform() * sum;
  for (size_t i = 0; i < n; ++i) {
    if (u < p[i]) return ids[i];
    u -= p[i];
  }
  return ids[n - 1];  // u landed on the rounding slack at the end
}

namespace {

std::string read_stdin() {
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

void write_out(const std::string& s) {
  if (!s.empty() && std::fwrite(s.data(), 1, s.size(), stdout) != s.size()) fail("cannot write to stdout");
}

}  // namespace

std::vector<std::vector<int32_t>> run_sample(const SampleOptions& o) {
  if (o.max_new_tokens < 0) fail_input("--max-new-tokens must be >= 0");
  if (o.num_samples < 1) fail_input("--num-samples must be >= 1");
  if (!(o.sampler.temperature >= 0)) fail_input("--temperature must be >= 0");
  if (o.sampler.top_k < 0) fail_input("--top-k must be >= 0");
  if (!(o.sampler.top_p > 0 && o.sampler.top_p <= 1)) fail_input("--top-p must be in (0, 1]");
  Tokenizer tok(o.vocab.empty() ? Tokenizer::default_dir() : o.vocab);
  const std::string prompt = o.prompt == "-" ? read_stdin() : o.prompt;

  LoadedModel lm = load_for_inference(o.checkpoint, o.device, o.precision, 1, 1);
  const ModelConfig& mc = lm.model->config();
  if (mc.vocab_size > tok.vocab_size())
    fail_input("the model's vocabulary (", mc.vocab_size, ") is larger than GPT-2's (", tok.vocab_size(), ")");
  const int32_t eot = Tokenizer::kEndOfText < mc.vocab_size ? Tokenizer::kEndOfText : -1;

  std::vector<int32_t> ids = tok.encode_with_special(prompt);
  const bool echo_prompt = !ids.empty();
  if (ids.empty()) {  // unconditional: start a document, as in training
    if (eot < 0) fail_input("an empty prompt starts from <|endoftext|>, which this model's vocabulary lacks");
    ids.push_back(eot);
  }
  for (int32_t id : ids)
    if (id >= mc.vocab_size) fail_input("the prompt has token ", id, ", outside the model's vocabulary of ", mc.vocab_size);
  const int P = int(ids.size());
  if (P >= mc.max_seq_len)
    fail_input("the prompt is ", P, " tokens; the model's context is ", mc.max_seq_len, " (leave room for one new token)");
  int new_tokens = o.max_new_tokens;
  if (P + new_tokens > mc.max_seq_len) {
    new_tokens = mc.max_seq_len - P;
    std::fprintf(stderr, "sample: the context (%d) allows %d new tokens after the %d-token prompt\n",
                 mc.max_seq_len, new_tokens, P);
  }

  const int N = o.num_samples;
  GPT2Decoder dec(*lm.model, N, std::max(1, P + new_tokens));
  std::vector<SampleRng> rngs;
  for (int i = 0; i < N; ++i) rngs.emplace_back(o.seed * 0x100000001B3ull + uint64_t(i));  // one stream per sample
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(N));
  std::vector<bool> done(static_cast<size_t>(N), false);
  const bool stream = N == 1;
  if (stream && echo_prompt) write_out(prompt);
  std::fflush(stdout);

  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  std::vector<int32_t> batch;
  for (int i = 0; i < N; ++i) batch.insert(batch.end(), ids.begin(), ids.end());
  std::vector<double> logits;
  dec.step(batch.data(), P, logits);
  const double prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
  auto t1 = Clock::now();
  int steps = 0;
  for (int t = 0; t < new_tokens; ++t) {
    bool any = false;
    for (int i = 0; i < N; ++i) {
      // Every sequence draws from its own stream at every step (also once it is done),
      // so a sample does not depend on the others.
      const int32_t next = sample_token(logits.data() + size_t(i) * size_t(mc.vocab_size), mc.vocab_size,
                                        o.sampler, rngs[size_t(i)]);
      batch[size_t(i)] = next;
      if (done[size_t(i)]) continue;
      if (next == eot) { done[size_t(i)] = true; continue; }
      out[size_t(i)].push_back(next);
      any = true;
      if (stream) {
        write_out(tok.token_bytes(next));
        std::fflush(stdout);
      }
    }
    if (!any || t + 1 == new_tokens) break;
    dec.step(batch.data(), 1, logits);
    ++steps;
  }
  lm.backend.ops->synchronize();
  const double decode_s = std::chrono::duration<double>(Clock::now() - t1).count();
  if (stream) {
    write_out("\n");
  } else {
    for (int i = 0; i < N; ++i) {
      std::printf("--- sample %d ---\n", i + 1);
      if (echo_prompt) write_out(prompt);
      write_out(tok.decode(out[size_t(i)]) + "\n");
    }
  }
  std::fflush(stdout);
  size_t generated = 0;
  for (const auto& s : out) generated += s.size();
  std::fprintf(stderr,
               "sample: %s on %s (%s), prompt %d tokens, prefill %.1f ms; %zu tokens in %d decode steps, "
               "%.1f ms/step, %.0f tokens/s; KV cache %.2f MB\n",
               lm.dir.c_str(), lm.backend.ops->name().c_str(), dtype_name(lm.backend.dtype), P, prefill_s * 1e3,
               generated, steps, steps ? decode_s * 1e3 / steps : 0.0, decode_s > 0 ? generated / decode_s : 0.0,
               double(dec.cache_bytes()) / 1e6);
  return out;
}

void add_sample_command(CLI::App& app) {
  auto o = std::make_shared<SampleOptions>();
  auto* cmd = app.add_subcommand("sample", "Generate text from a checkpoint (KV cache; streams to stdout)");
  cmd->add_option("checkpoint", o->checkpoint, "Checkpoint directory, or a run directory (uses its latest)")->required();
  cmd->add_option("--prompt", o->prompt, "Text to continue; '-' reads stdin; empty: start a new document");
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate per sample (stops early at <|endoftext|>)")
      ->capture_default_str();
  cmd->add_option("--temperature", o->sampler.temperature, "Softmax temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", o->sampler.top_k, "Sample among the k most likely tokens; 0 = all")->capture_default_str();
  cmd->add_option("--top-p", o->sampler.top_p, "Nucleus sampling: the smallest set of tokens with probability >= p")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed (the same seed gives the same text)")->capture_default_str();
  cmd->add_option("--num-samples", o->num_samples, "Samples, generated together as one batch")->capture_default_str();
  cmd->add_option("--device", o->device, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--precision", o->precision, "auto | bf16 | fp32 | fp64 (default: the checkpoint's)")
      ->check(CLI::IsMember({"auto", "bf16", "fp32", "fp64"}));
  cmd->add_option("--vocab", o->vocab, "Directory with encoder.json and vocab.bpe (default: cache/gpt2)");
  cmd->callback([o] { run_sample(*o); });
}

}  // namespace flashgpt
