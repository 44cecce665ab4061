// Starting from a checkpoint's weights: for inference (sample, eval --text, export) and
// for fine-tuning (train --init-from).
#pragma once
#include <memory>
#include <string>
#include "layers/gpt2.h"
#include "src/config.h"
#include "train/backend.h"

namespace flashgpt {

// A checkpoint's model, loaded on a backend. Members are destroyed model first.
struct LoadedModel {
  std::string dir;  // the resolved checkpoint directory
  Config config;    // its config.yaml
  Backend backend;
  std::unique_ptr<GPT2> model;
};

// ckpt: a checkpoint dir or a run dir (its latest). device: auto | cpu | cuda.
// precision: "" = the checkpoint's train.precision (fp64 becomes auto off the CPU),
// else auto | bf16 | fp32 | fp64. The model is sized for micro-batches of B×T
// (B = T = 1 when only its weights are needed), without gradients (ModelOptions).
LoadedModel load_for_inference(const std::string& ckpt, const std::string& device,
                               const std::string& precision, int B, int T);

// The model keys of the checkpoint in `dir` (its config.yaml) and model's must agree;
// else InputError naming both (option: "--init-from" or "--resume").
void check_checkpoint_model(const std::string& dir, const GPT2& model, const char* option);

// train --init-from: replaces model's weights with those of the checkpoint at `path`
// (checkpoint or run dir), converting precision if needed. The model shapes must agree;
// InputError (naming both) if not. Optimizer state is not read: fine-tuning starts fresh.
void init_from_checkpoint(const std::string& path, GPT2& model);

}  // namespace flashgpt
