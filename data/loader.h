// The distributed data loader: batches of (inputs, targets) from token shards.
//
// The unit is a *row* of T+1 consecutive tokens of one shard: inputs = row[0, T),
// targets = row[1, T] (the next token at every position). Rows start at multiples of
// T (neighbours share one token) and never cross a shard boundary.
//
// An epoch is an order over all rows: a random permutation from (seed, epoch), the same
// on every rank, or the file order (sorted paths, then position) without shuffle. The
// loader walks that order as one stream. Each next() takes the next world·B rows of the
// stream (a global micro-batch); rank r gets rows [r·B, (r+1)·B) of them. So the data
// depends only on the stream, never on how it is split: 2 ranks × B rows see exactly
// the rows of 1 rank × 2B rows, or of 1 rank × B rows with 2 accumulation steps.
//
// An epoch holds floor(rows / rows_per_step) optimizer steps of rows_per_step rows
// (train.total_batch / T over all ranks; default world·B); the few rows left over are
// skipped. Since rows_per_step does not depend on the world size or the micro-batch,
// neither do epochs, and the state (epoch, rows consumed) resumes at any world size.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/permutation.h"
#include "data/shard.h"

namespace flashgpt {

struct LoaderOptions {
  std::string pattern;  // glob of shard files, e.g. cache/shards/sotu/train_*.bin
  int B = 0, T = 0;     // rows per micro-batch on this rank, and tokens per row
  int rank = 0, world = 1;
  uint64_t seed = 0;
  bool shuffle = true;
  int vocab_size = 50257;     // ids >= this are an InputError when read
  uint64_t rows_per_step = 0; // rows of one optimizer step over all ranks; 0 = world·B
};

class DataLoader {
 public:
  // Globs the pattern (sorted) and validates every shard header; InputError if no file
  // matches, a header is bad, or the shards cannot fill one optimizer step.
  explicit DataLoader(const LoaderOptions& o);

  // Fills B*T inputs and B*T targets (host memory) for this rank, then advances the
  // stream by world·B rows (into the next epoch when this one is used up).
  void next(int32_t* inputs, int32_t* targets);

  // Back to the start of epoch 0 (used for validation passes).
  void reset();

  // The exact position (epoch, rows consumed in it) plus what it is only valid for
  // (shards, T, seed, shuffle, rows_per_step); not the world size or B, so a run can
  // resume on another number of ranks. The shuffle needs no RNG state of its own: the
  // order is a pure function of (seed, epoch).
  nlohmann::json state() const;
  // InputError if the state was saved for other shards or options.
  void restore(const nlohmann::json& s);

  size_t total_tokens() const { return total_tokens_; }
  // Full global micro-batches (world·B rows) in one epoch.
  uint64_t batches_per_epoch() const { return epoch_rows_ / micro_rows(); }
  uint64_t epoch() const { return epoch_; }

 private:
  struct Row {
    size_t shard;
    size_t offset;  // first token
  };
  Row row(uint64_t index) const;  // index into the file order
  uint64_t micro_rows() const { return uint64_t(opt_.world) * uint64_t(opt_.B); }

  LoaderOptions opt_;
  std::vector<ShardView> shards_;
  std::vector<uint64_t> first_row_;  // per shard, prefix sum of row counts (+ total)
  size_t total_tokens_ = 0;
  uint64_t rows_ = 0;        // rows in all shards
  uint64_t epoch_rows_ = 0;  // rows used per epoch: a multiple of rows_per_step
  uint64_t epoch_ = 0;
  uint64_t pos_ = 0;         // rows of this epoch's order already consumed
  Permutation order_{1, 0};
};

}  // namespace flashgpt
