// The training loop: micro-batches with gradient accumulation, clipping, AdamW,
// periodic validation and checkpoints, a progress line and JSON-lines metrics.
// Data parallel over the ranks of `comm` (train/data_parallel.h); rank 0 prints, writes
// metrics and checkpoints.
#pragma once
#include <string>
#include "src/config.h"
#include "train/comm.h"

namespace flashgpt {

struct TrainResult {
  int steps_done = 0;
  double last_train_loss = 0;
  double last_val_loss = -1;   // -1 if never evaluated
  std::string last_checkpoint;
};

// resume: "" (fresh run), a checkpoint dir, or a run dir (its `latest`). Every rank of
// `comm` calls it; the result is the same on every rank.
TrainResult train(const Config& cfg, const std::string& resume, Communicator& comm);
// One process (no MPI).
TrainResult train(const Config& cfg, const std::string& resume);

struct EvalResult { double loss = 0; double perplexity = 0; long tokens = 0; };
// Mean validation loss of a checkpoint over `steps` batches of `pattern` (0 = one epoch).
EvalResult evaluate_checkpoint(const std::string& ckpt, const std::string& pattern, int steps,
                               const std::string& device, int batch_size);

}  // namespace flashgpt
