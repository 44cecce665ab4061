// The distributed data loader: batches of (inputs, targets) from token shards.
//
// The unit is a *window* of B*T+1 consecutive tokens of one shard; windows start at
// multiples of B*T (so neighbours share one token) and never cross a shard boundary.
// inputs = window[0, B*T), targets = window[1, B*T] (the next token at every position).
//
// A global batch is `world` consecutive windows of the epoch's window order; rank r
// takes the r-th, so ranks always see disjoint data and together see exactly what one
// rank would see with world x the batch. With shuffle, the window order of epoch e is a
// random permutation from (seed, e), the same on every rank; without shuffle it is the
// file order (sorted paths, then position), for validation. An epoch is
// floor(windows / world) global batches; the few windows left over are skipped.
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
  int B = 0, T = 0;     // batch rows and sequence length, per rank
  int rank = 0, world = 1;
  uint64_t seed = 0;
  bool shuffle = true;
  int vocab_size = 50257;  // ids >= this are an InputError when read
};

class DataLoader {
 public:
  // Globs the pattern (sorted) and validates every shard header; InputError if no file
  // matches, a header is bad, or the shards cannot fill one global batch.
  explicit DataLoader(const LoaderOptions& o);

  // Fills B*T inputs and B*T targets (host memory) for this rank, then advances by one
  // global batch (wrapping into the next epoch when this one is used up).
  void next(int32_t* inputs, int32_t* targets);

  // Back to the start of epoch 0 (used for validation passes).
  void reset();

  // The exact position (epoch, batch within the epoch) plus what it is only valid for
  // (shards, B, T, world, seed, shuffle). The shuffle needs no RNG state of its own:
  // the order is a pure function of (seed, epoch).
  nlohmann::json state() const;
  // InputError if the state was saved for other shards or options.
  void restore(const nlohmann::json& s);

  size_t total_tokens() const { return total_tokens_; }
  uint64_t batches_per_epoch() const { return batches_per_epoch_; }
  uint64_t epoch() const { return epoch_; }

 private:
  struct Window {
    size_t shard;
    size_t offset;  // first token
  };
  Window window(uint64_t index) const;  // index into the file order

  LoaderOptions opt_;
  std::vector<ShardView> shards_;
  std::vector<uint64_t> first_window_;  // per shard, prefix sum of window counts (+ total)
  size_t total_tokens_ = 0;
  uint64_t windows_ = 0;
  uint64_t batches_per_epoch_ = 0;
  uint64_t epoch_ = 0;
  uint64_t batch_ = 0;  // next global batch within the epoch
  Permutation order_{1, 0};
};

}  // namespace flashgpt
