// Checkpoints: one directory per step, written under a temporary name and renamed
// when complete, so a crash or kill never damages the last good checkpoint.
//   <out_dir>/ckpt_000100/
//     model.bin       weights (enough for eval/sample): header + params in ParamInfo order
//     optimizer.bin   AdamW m, v, master weights and step (for resume)
//     state.json      step, loader state, RNG seed
//     config.yaml     the resolved config
//     checksums.json  FNV-1a 64 of every file above
//   <out_dir>/latest  name of the newest complete checkpoint (replaced atomically)
#pragma once
#include <string>
#include <nlohmann/json.hpp>
#include "layers/gpt2.h"
#include "optim/adamw.h"

namespace flashgpt {

struct CheckpointState {
  int step = 0;
  nlohmann::json loader;  // DataLoader::state()
  nlohmann::json extra;   // anything else the trainer wants back
};

// Returns the directory written.
std::string save_checkpoint(const std::string& out_dir, const GPT2& model, const AdamW* opt,
                            const CheckpointState& st, const std::string& config_yaml);
// Model weights only (eval). Validates checksums and shapes; InputError when corrupt.
void load_model_weights(const std::string& ckpt_dir, GPT2& model);
// Everything for resume.
CheckpointState load_checkpoint(const std::string& ckpt_dir, GPT2& model, AdamW& opt);
// "latest" resolution: a checkpoint dir, or a run dir containing `latest`.
std::string resolve_checkpoint(const std::string& path);
// The config saved in a checkpoint directory.
std::string checkpoint_config_path(const std::string& ckpt_dir);

}  // namespace flashgpt
