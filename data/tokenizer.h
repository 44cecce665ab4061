// GPT-2's byte-level BPE tokenizer, exactly GPT-2's (checked against js-tiktoken's
// gpt2 encoding on tests/golden/).
//
//   text --pre-tokenise (data/pretokenize.h)--> pieces --BPE on the piece's bytes--> ids
//
// Vocabulary files (encoder.json, vocab.bpe) come from scripts/fetch_vocab.sh. Encoding
// is thread-safe on a const Tokenizer; each thread passes its own BpeCache.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace flashgpt {

// Recently seen pieces and their ids: words repeat, so most pieces skip BPE.
class BpeCache {
 public:
  const std::vector<int32_t>* find(std::string_view piece) const;
  void insert(std::string_view piece, const std::vector<int32_t>& ids);

 private:
  static constexpr size_t kMaxEntries = 1 << 18;  // then start over (bounds memory)
  std::unordered_map<std::string, std::vector<int32_t>> map_;
};

class Tokenizer {
 public:
  static constexpr int32_t kEndOfText = 50256;  // <|endoftext|>
  static constexpr std::string_view kEndOfTextText = "<|endoftext|>";

  // Loads <dir>/encoder.json and <dir>/vocab.bpe; InputError naming the file and
  // `scripts/fetch_vocab.sh` if one is missing or not GPT-2's.
  explicit Tokenizer(const std::string& dir);
  // $FLASHGPT_VOCAB_DIR if set, else cache/gpt2 (relative to the working directory).
  static std::string default_dir();

  int vocab_size() const { return int(token_bytes_.size()); }

  // Ordinary text: "<|endoftext|>" inside it is encoded as the 13 characters it is
  // (tiktoken's encode_ordinary). Appends to out.
  void encode(std::string_view text, std::vector<int32_t>& out, BpeCache& cache) const;
  std::vector<int32_t> encode(std::string_view text) const;
  // Every "<|endoftext|>" in text becomes kEndOfText; the rest is ordinary text.
  std::vector<int32_t> encode_with_special(std::string_view text) const;

  // The bytes of the ids (not necessarily valid UTF-8 when cut mid-character).
  // InputError for an id outside the vocabulary.
  std::string decode(const int32_t* ids, size_t count) const;
  std::string decode(const std::vector<int32_t>& ids) const { return decode(ids.data(), ids.size()); }
  const std::string& token_bytes(int32_t id) const { return token_bytes_[size_t(id)]; }

  // BPE work done by the calling thread so far: candidate pairs pushed and popped. Lets
  // a test check that encoding stays O(n log n) in a piece's length by counting work,
  // not seconds.
  static uint64_t bpe_work();

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  struct Merge {
    int32_t rank;    // line of vocab.bpe: lower merges first
    int32_t result;  // id of the merged token
  };
  std::vector<std::string> token_bytes_;                // id -> bytes
  std::unordered_map<std::string, int32_t> token_id_;  // bytes -> id (ordinary tokens)
  int32_t byte_id_[256] = {};                           // single byte -> id
  std::unordered_map<uint64_t, Merge> merges_;          // (left id, right id) -> merge
};

}  // namespace flashgpt
