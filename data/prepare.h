// `flashgpt prepare`: text files -> token shards for the loader.
//
// Input files hold documents separated by lines that contain only "<|endoftext|>"
// (what scripts/corpus/build.py writes; a file without such lines is one document).
// Every document becomes [<|endoftext|>, its tokens...] and goes wholly to either the
// train or the validation split, chosen by a hash of its text (so the split does not
// depend on file order, and duplicated documents land on the same side). Documents are
// encoded in parallel and written in input order: the shards are byte-identical for
// any thread count.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace flashgpt {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files, or directories (their *.txt, recursively)
  std::string out;                  // directory for train_NNNNNN.bin, val_NNNNNN.bin, meta.json
  double val_fraction = 0.01;       // expected share of documents in validation
  int threads = 0;                  // 0: all hardware threads
  size_t shard_tokens = 100'000'000;  // tokens per shard file (the last one holds the rest)
  bool progress = true;             // progress bar on stderr
};

struct SplitStats {
  size_t documents = 0, tokens = 0, shards = 0;
};
struct PrepareStats {
  SplitStats train, val;
  size_t bytes = 0;
  double seconds = 0;
  int threads = 0;
};

// The documents of one file's text, in order (empty ones dropped).
std::vector<std::string_view> split_documents(std::string_view text);

// Writes the shards to `<out>.partial` and renames it to `out` when complete (an old
// `out` is replaced only then). InputError for missing inputs or bad options.
PrepareStats prepare_shards(const PrepareOptions& options, const Tokenizer& tokenizer);

}  // namespace flashgpt
