// Checkpoints: one directory per step, written under a temporary name, fsynced, and
// renamed when complete (then `latest` likewise), so neither a crash, a kill nor a power
// loss damages the last good checkpoint. Temporary leftovers are removed by the next
// save and never loaded.
//   <out_dir>/ckpt_000100/
//     model.bin       weights (enough for eval/sample): header + params packed in
//                     ParamInfo order (name, offset, shape of each in the header)
//     optimizer.bin   AdamW m, v, master weights (packed the same way) and step
// Nothing in them depends on the arena's padding or on how ranks sharded the optimizer,
// so a checkpoint written by N ranks resumes on any number of ranks.
//     state.json      step, loader state, RNG seed
//     config.yaml     the resolved config
//     checksums.json  CRC-32C of every file above (src/checksum.h); the checkpoints of
//                     earlier versions, with their older sum, still load
//   <out_dir>/latest  name of the newest complete checkpoint (replaced atomically)
#pragma once
#include <functional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "layers/gpt2.h"
#include "src/config.h"

namespace flashgpt {

struct CheckpointState {
  int step = 0;
  nlohmann::json loader;  // DataLoader::state()
  nlohmann::json extra;   // anything else the trainer wants back
  int optimizer_step = 0;  // load_checkpoint: the AdamW step in optimizer.bin
};

// The AdamW state a save writes: `count` tensors (m, v, then the fp32 master if the run
// keeps one), each asked for in turn, k = 0, 1, ..., as a host buffer laid out like the
// model's arena (DataParallel::gather_state), so a save holds one of them at a time.
struct OptimizerSource {
  int step = 0;  // AdamW steps done
  DType dtype = DType::f32;
  int count = 2;
  std::function<void(int k, std::string& bytes)> fetch;
};
// What a load expects of optimizer.bin, and where its tensors go, one at a time, in the
// same order and layout (DataParallel::scatter_state).
struct OptimizerSink {
  DType dtype = DType::f32;
  int count = 2;
  std::function<void(int k, const std::string& bytes)> store;
};

// Returns the directory written. opt: nullptr writes no optimizer state (weights only).
// keep > 0: afterwards only the newest `keep` checkpoints remain (0: all).
std::string save_checkpoint(const std::string& out_dir, const GPT2& model, const OptimizerSource* opt,
                            const CheckpointState& st, const std::string& config_yaml, int keep = 0);
// Model weights only (eval, sample, export, --init-from): checks the checksums of the
// files it reads (model.bin, config.yaml, state.json) and the shapes; InputError when
// corrupt. Each tensor goes straight into the model's parameters.
void load_model_weights(const std::string& ckpt_dir, GPT2& model);
// Every file checksums.json lists, and at least the ones eval needs, matches its checksum
// (InputError otherwise): the whole checkpoint is intact.
void verify_checkpoint(const std::string& ckpt_dir);
// Resume, in two parts, so that a multi-rank trainer can broadcast the weights and the
// state between them. load_checkpoint checks every file's checksum, loads the weights
// into `model`, checks that optimizer.bin holds what `opt` expects (its dtype and count:
// 2, m and v, or 3, with the fp32 master; otherwise an InputError) and returns state.json
// with the optimizer's step. load_optimizer_state then hands its tensors to opt.store.
CheckpointState load_checkpoint(const std::string& ckpt_dir, GPT2& model, const OptimizerSink& opt);
void load_optimizer_state(const std::string& ckpt_dir, const GPT2& model, const OptimizerSink& opt);
// The complete checkpoints of a run directory (ckpt_NNNNNN, oldest first; none when the
// directory does not exist).
std::vector<std::string> checkpoints_in(const std::string& run_dir);
// Removes what runs write into a run directory: its checkpoints (complete or not),
// `latest`, `metrics.jsonl` and `config.yaml`; anything else stays (train --overwrite).
void clear_run_dir(const std::string& run_dir);
// "latest" resolution: a checkpoint dir, or a run dir containing `latest`.
std::string resolve_checkpoint(const std::string& path);
// The config saved in a checkpoint directory, its checksum verified first: it sizes the
// model that the weights are then loaded into, so a damaged one must not be used.
Config load_checkpoint_config(const std::string& ckpt_dir);

}  // namespace flashgpt
