#include "train/load_model.h"
#include <cstdio>
#include "src/errors.h"
#include "train/checkpoint.h"

namespace flashgpt {

LoadedModel load_for_inference(const std::string& ckpt, const std::string& device,
                               const std::string& precision, int B, int T) {
  LoadedModel m;
  m.dir = resolve_checkpoint(ckpt);
  m.config = load_checkpoint_config(m.dir);
  std::string p = precision.empty() ? m.config.train.precision : precision;
  if (precision.empty() && p == "fp64" && device != "cpu") p = "auto";  // fp64 runs exist on the CPU only
  m.backend = make_backend(device, p);
  ModelOptions opts;
  opts.gradients = false;  // inference only: the weights are held once
  m.model = std::make_unique<GPT2>(model_config(m.config), *m.backend.ops, m.backend.dtype, B, T, opts);
  load_model_weights(m.dir, *m.model);
  return m;
}

void check_checkpoint_model(const std::string& dir, const GPT2& model, const char* option) {
  const Config ck = load_checkpoint_config(dir);
  const ModelConfig a = model_config(ck), b = model.config();
  if (a.n_layer != b.n_layer || a.n_head != b.n_head || a.n_embd != b.n_embd ||
      a.vocab_size != b.vocab_size || a.padded_vocab != b.padded_vocab || a.max_seq_len != b.max_seq_len ||
      a.position != b.position) {
    auto keys = [](const ModelConfig& m) {
      return cat("(n_layer ", m.n_layer, ", n_head ", m.n_head, ", n_embd ", m.n_embd, ", vocab_size ", m.vocab_size,
                 ", padded_vocab ", m.padded_vocab, ", max_seq_len ", m.max_seq_len, ", position ",
                 position_name(m.position), ")");
    };
    fail_input(option, " ", dir, ": the checkpoint's model ", keys(a), " differs from the config's ", keys(b));
  }
}

void init_from_checkpoint(const std::string& path, GPT2& model) {
  const std::string dir = resolve_checkpoint(path);
  check_checkpoint_model(dir, model, "--init-from");
  load_model_weights(dir, model);
  std::printf("initialised the weights from %s (fresh optimizer state)\n", dir.c_str());
}

}  // namespace flashgpt
