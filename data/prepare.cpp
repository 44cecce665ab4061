#include "data/prepare.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "data/ordered_pool.h"
#include "data/permutation.h"
#include "data/progress.h"
#include "data/shard.h"
#include "src/errors.h"

namespace fs = std::filesystem;

namespace flashgpt {

namespace {

constexpr std::string_view kSeparatorLine = "<|endoftext|>";
constexpr size_t kChunkBytes = size_t(1) << 20;  // documents are encoded in ~1 MB chunks
constexpr size_t kChunksAheadPerThread = 4;       // bounds the memory of finished chunks
constexpr double kUnitInterval = 0x1.0p-53;       // 2^-53: 53 random bits -> [0, 1)

// FNV-1a, then mixed: a stable hash of a document's bytes.
uint64_t document_hash(std::string_view doc) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : doc) h = (h ^ c) * 0x100000001b3ull;
  return mix64(h);
}

// A document's uniform draw in [0, 1): validation iff it is below the threshold.
double document_draw(std::string_view doc) { return double(document_hash(doc) >> 11) * kUnitInterval; }

std::vector<std::string> list_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(in))
        if (e.is_regular_file() && e.path().extension() == ".txt") found.push_back(e.path().string());
      if (found.empty()) fail_input("input directory ", in, " has no .txt files");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
    } else {
      fail_input("input ", in, " does not exist (build the corpus first: python3 scripts/corpus/build.py)");
    }
  }
  if (files.empty()) fail_input("prepare: no input files given");
  return files;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_input("cannot read ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Accumulates one split's tokens and writes a shard whenever shard_tokens are full.
class ShardSink {
 public:
  ShardSink(fs::path dir, std::string prefix, size_t shard_tokens)
      : dir_(std::move(dir)), prefix_(std::move(prefix)), shard_tokens_(shard_tokens) {}

  void append(const std::vector<uint16_t>& tokens) {
    for (size_t pos = 0; pos < tokens.size();) {
      size_t take = std::min(tokens.size() - pos, shard_tokens_ - buffer_.size());
      buffer_.insert(buffer_.end(), tokens.begin() + long(pos), tokens.begin() + long(pos + take));
      pos += take;
      if (buffer_.size() == shard_tokens_) flush();
    }
  }
  void finish() {
    if (!buffer_.empty()) flush();
  }
  size_t shards() const { return shards_; }

 private:
  void flush() {
    char name[64];
    std::snprintf(name, sizeof(name), "%s_%06zu.bin", prefix_.c_str(), shards_++);
    write_shard((dir_ / name).string(), buffer_);
    buffer_.clear();
  }
  fs::path dir_;
  std::string prefix_;
  size_t shard_tokens_;
  std::vector<uint16_t> buffer_;
  size_t shards_ = 0;
};

struct Chunk {
  std::vector<std::string_view> documents;
  size_t bytes = 0;
};

struct EncodedChunk {
  std::vector<uint16_t> train, val;
  size_t train_documents = 0, val_documents = 0, bytes = 0;
};

std::vector<Chunk> make_chunks(const std::vector<std::string_view>& documents) {
  std::vector<Chunk> chunks;
  for (std::string_view doc : documents) {
    if (chunks.empty() || chunks.back().bytes >= kChunkBytes) chunks.emplace_back();
    chunks.back().documents.push_back(doc);
    chunks.back().bytes += doc.size();
  }
  return chunks;
}

}  // namespace

std::vector<std::string_view> split_documents(std::string_view text) {
  std::vector<std::string_view> docs;
  size_t doc_start = 0, line_start = 0;
  auto add = [&](size_t end) {
    // The newline before a separator line belongs to the separator.
    if (end > doc_start && text[end - 1] == '\n') --end;
    if (end > doc_start) docs.push_back(text.substr(doc_start, end - doc_start));
  };
  while (line_start < text.size()) {
    size_t nl = text.find('\n', line_start);
    size_t line_end = nl == std::string_view::npos ? text.size() : nl;
    if (text.substr(line_start, line_end - line_start) == kSeparatorLine) {
      add(line_start);
      doc_start = nl == std::string_view::npos ? text.size() : nl + 1;
    }
    line_start = nl == std::string_view::npos ? text.size() : nl + 1;
  }
  add(text.size());
  return docs;
}

PrepareStats prepare_shards(const PrepareOptions& o, const Tokenizer& tokenizer) {
  if (!(o.val_fraction >= 0 && o.val_fraction <= 1)) fail_input("--val-fraction must be in [0, 1], got ", o.val_fraction);
  if (o.shard_tokens == 0 || o.shard_tokens > size_t(INT32_MAX))
    fail_input("--shard-tokens must be in [1, ", INT32_MAX, "], got ", o.shard_tokens);
  if (o.out.empty()) fail_input("prepare: --out is required");
  if (tokenizer.vocab_size() > kShardMaxVocab) fail_input("vocabulary of ", tokenizer.vocab_size(), " does not fit uint16 shards");
  const std::vector<std::string> files = list_inputs(o.inputs);

  PrepareStats stats;
  stats.threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  for (const std::string& f : files) stats.bytes += fs::file_size(f);

  // A small corpus may have no draw below val_fraction; then the document with the
  // lowest draw is the validation set, so that a val split always exists. (A pass that
  // only hashes: much cheaper than encoding.)
  double threshold = 0;
  if (o.val_fraction > 0) {
    double lowest = 1;
    for (const std::string& path : files) {
      const std::string text = read_text(path);
      for (std::string_view doc : split_documents(text)) lowest = std::min(lowest, document_draw(doc));
    }
    threshold = std::max(o.val_fraction, std::nextafter(lowest, 2.0));
  }

  const fs::path out = fs::path(o.out).lexically_normal();
  const fs::path partial = out.string() + ".partial";
  std::error_code removing, ignored;  // a parent that is a file is create_output_dir's to report
  fs::remove_all(partial, removing);
  if (removing && fs::exists(partial, ignored))
    fail_input("--out: cannot remove '", partial.string(), "', left by an earlier run (", removing.message(), ")");
  create_output_dir(partial.string(), "--out");
  ShardSink train(partial, "train", o.shard_tokens), val(partial, "val", o.shard_tokens);
  Progress progress("prepare", o.progress ? stats.bytes : 0);

  for (const std::string& path : files) {
    const std::string text = read_text(path);
    const std::vector<Chunk> chunks = make_chunks(split_documents(text));
    auto encode_chunk = [&](size_t i) {
      thread_local BpeCache cache;
      thread_local std::vector<int32_t> ids;
      EncodedChunk e;
      e.bytes = chunks[i].bytes;
      for (std::string_view doc : chunks[i].documents) {
        bool to_val = document_draw(doc) < threshold;
        std::vector<uint16_t>& dst = to_val ? e.val : e.train;
        ++(to_val ? e.val_documents : e.train_documents);
        ids.clear();
        tokenizer.encode(doc, ids, cache);
        dst.push_back(uint16_t(Tokenizer::kEndOfText));  // every document starts with <|endoftext|>
        for (int32_t id : ids) dst.push_back(uint16_t(id));
      }
      return e;
    };
    auto write_chunk = [&](size_t, EncodedChunk&& e) {
      train.append(e.train);
      val.append(e.val);
      stats.train.documents += e.train_documents;
      stats.val.documents += e.val_documents;
      stats.train.tokens += e.train.size();
      stats.val.tokens += e.val.size();
      if (o.progress) progress.add(e.bytes);
    };
    run_ordered<EncodedChunk>(chunks.size(), stats.threads, kChunksAheadPerThread * size_t(stats.threads),
                              encode_chunk, write_chunk);
    size_t document_bytes = 0;
    for (const Chunk& c : chunks) document_bytes += c.bytes;
    if (o.progress) progress.add(text.size() - document_bytes);  // the separators
  }
  train.finish();
  val.finish();
  if (stats.train.tokens == 0) {  // shards nobody can train on; the old output stays
    fs::remove_all(partial);
    if (stats.val.documents == 0) fail_input("prepare: the input has no text (", stats.bytes, " bytes)");
    fail_input("prepare: the input has ", stats.val.documents, " document(s), and all went to the validation split; "
               "add documents (separated by lines holding only <|endoftext|>) or use --val-fraction 0");
  }
  stats.train.shards = train.shards();
  stats.val.shards = val.shards();
  stats.seconds = progress.seconds();
  if (o.progress) progress.finish();

  nlohmann::json meta = {
      {"inputs", files},
      {"val_fraction", o.val_fraction},
      {"shard_tokens", o.shard_tokens},
      {"tokenizer", "gpt2"},
      {"bytes", stats.bytes},
      {"train", {{"documents", stats.train.documents}, {"tokens", stats.train.tokens}, {"shards", stats.train.shards}}},
      {"val", {{"documents", stats.val.documents}, {"tokens", stats.val.tokens}, {"shards", stats.val.shards}}},
  };
  std::ofstream(partial / "meta.json") << meta.dump(2) << "\n";

  // Replace the old output only now that the new one is complete.
  const fs::path old = out.string() + ".old";
  fs::remove_all(old);
  if (fs::exists(out)) fs::rename(out, old);
  fs::rename(partial, out);
  fs::remove_all(old);
  return stats;
}

}  // namespace flashgpt
