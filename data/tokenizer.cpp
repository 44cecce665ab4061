#include "data/tokenizer.h"

#include <cstdlib>
#include <fstream>
#include <queue>
#include <sstream>

#include <nlohmann/json.hpp>

#include "data/pretokenize.h"
#include "src/errors.h"

namespace flashgpt {

namespace {

constexpr size_t kGpt2VocabSize = 50257;
constexpr size_t kGpt2Merges = 50000;
constexpr size_t kMaxCachedPiece = 64;  // bytes; longer pieces (rare) are not cached
constexpr const char* kFetchHint = "run scripts/fetch_vocab.sh to download GPT-2's vocabulary";

// GPT-2 stores token bytes as printable characters: bytes that are printable Latin-1
// stand for themselves, the other 68 map to U+0100.. in byte order. Returns the
// inverse: code point -> byte, -1 where no byte maps.
std::vector<int> unicode_to_byte() {
  std::vector<int> inverse(512, -1);
  int next_extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    inverse[printable ? b : 256 + next_extra++] = b;
  }
  return inverse;
}

// A vocabulary string (UTF-8 of GPT-2's byte stand-ins) -> the bytes it stands for.
bool stand_ins_to_bytes(const std::string& s, const std::vector<int>& inverse, std::string& out) {
  out.clear();
  for (size_t pos = 0; pos < s.size();) {
    Utf8Char c = decode_utf8(s, pos);
    if (c.code_point >= inverse.size() || inverse[c.code_point] < 0) return false;
    out.push_back(char(inverse[c.code_point]));
    pos += c.length;
  }
  return true;
}

thread_local uint64_t t_bpe_work = 0;  // see Tokenizer::bpe_work

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_input("vocabulary file ", path, " is missing: ", kFetchHint);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

const std::vector<int32_t>* BpeCache::find(std::string_view piece) const {
  auto it = map_.find(std::string(piece));
  return it == map_.end() ? nullptr : &it->second;
}

void BpeCache::insert(std::string_view piece, const std::vector<int32_t>& ids) {
  if (map_.size() >= kMaxEntries) map_.clear();
  map_.emplace(std::string(piece), ids);
}

std::string Tokenizer::default_dir() {
  const char* env = std::getenv("FLASHGPT_VOCAB_DIR");
  return env && *env ? env : "cache/gpt2";
}

Tokenizer::Tokenizer(const std::string& dir) {
  const std::vector<int> inverse = unicode_to_byte();
  const std::string encoder_path = dir + "/encoder.json";
  const std::string merges_path = dir + "/vocab.bpe";

  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read_file(encoder_path));
  } catch (const nlohmann::json::exception& e) {
    fail_input(encoder_path, " is not valid JSON (", e.what(), "): ", kFetchHint);
  }
  if (!encoder.is_object() || encoder.size() != kGpt2VocabSize)
    fail_input(encoder_path, " is not GPT-2's encoder.json (expected an object of ", kGpt2VocabSize,
               " tokens): ", kFetchHint);
  token_bytes_.assign(kGpt2VocabSize, std::string());
  std::vector<bool> seen(kGpt2VocabSize, false);
  std::string bytes;
  for (auto it = encoder.begin(); it != encoder.end(); ++it) {
    if (!it->is_number_integer()) fail_input(encoder_path, ": token '", it.key(), "' has no integer id: ", kFetchHint);
    int64_t id = it->get<int64_t>();
    if (id < 0 || id >= int64_t(kGpt2VocabSize) || seen[size_t(id)])
      fail_input(encoder_path, ": token '", it.key(), "' has a bad or repeated id ", id, ": ", kFetchHint);
    seen[size_t(id)] = true;
    if (id == kEndOfText) {
      if (it.key() != kEndOfTextText)
        fail_input(encoder_path, ": id ", kEndOfText, " is '", it.key(), "', not <|endoftext|>: ", kFetchHint);
      token_bytes_[size_t(id)] = std::string(kEndOfTextText);
      continue;  // special: never produced by ordinary text
    }
    if (!stand_ins_to_bytes(it.key(), inverse, bytes))
      fail_input(encoder_path, ": token '", it.key(), "' is not in GPT-2's byte encoding: ", kFetchHint);
    token_bytes_[size_t(id)] = bytes;
    token_id_.emplace(bytes, int32_t(id));
  }
  for (int b = 0; b < 256; ++b) {
    auto it = token_id_.find(std::string(1, char(b)));
    if (it == token_id_.end()) fail_input(encoder_path, " has no token for byte ", b, ": ", kFetchHint);
    byte_id_[b] = it->second;
  }

  std::istringstream lines(read_file(merges_path));
  std::string line, left, right;
  if (!std::getline(lines, line) || line.rfind("#version", 0) != 0)
    fail_input(merges_path, " does not start with '#version': not GPT-2's vocab.bpe: ", kFetchHint);
  merges_.reserve(kGpt2Merges);
  int32_t rank = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    size_t space = line.find(' ');
    std::string a_bytes, b_bytes;
    if (space == std::string::npos || !stand_ins_to_bytes(line.substr(0, space), inverse, a_bytes) ||
        !stand_ins_to_bytes(line.substr(space + 1), inverse, b_bytes))
      fail_input(merges_path, " line ", rank + 2, " is not a merge 'A B': ", kFetchHint);
    auto a = token_id_.find(a_bytes), b = token_id_.find(b_bytes), ab = token_id_.find(a_bytes + b_bytes);
    if (a == token_id_.end() || b == token_id_.end() || ab == token_id_.end())
      fail_input(merges_path, " line ", rank + 2, " merges tokens that ", encoder_path, " lacks: ", kFetchHint);
    merges_.emplace(pair_key(a->second, b->second), Merge{rank++, ab->second});
  }
  if (size_t(rank) != kGpt2Merges)
    fail_input(merges_path, " has ", rank, " merges, GPT-2's has ", kGpt2Merges, ": ", kFetchHint);
}

// BPE on one piece's bytes: repeatedly merge the adjacent pair of lowest rank (the
// leftmost one on ties). A heap of candidate pairs over a linked list of parts keeps
// long pieces (e.g. 10k spaces) O(n log n) instead of O(n^2).
void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  auto whole = token_id_.find(std::string(piece));
  if (whole != token_id_.end()) {  // tiktoken's shortcut; also saves most of the work
    out.push_back(whole->second);
    return;
  }
  const int n = int(piece.size());
  struct Part {
    int32_t id, prev, next;
  };
  constexpr int32_t kDeadPart = -1;
  std::vector<Part> parts(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) parts[size_t(i)] = {byte_id_[uint8_t(piece[size_t(i)])], i - 1, i + 1 < n ? i + 1 : -1};

  struct Candidate {
    int32_t rank, left, left_id, right_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int32_t left) {
    if (left < 0 || parts[size_t(left)].next < 0) return;
    int32_t a = parts[size_t(left)].id, b = parts[size_t(parts[size_t(left)].next)].id;
    auto it = merges_.find(pair_key(a, b));
    if (it != merges_.end()) heap.push({it->second.rank, left, a, b}), ++t_bpe_work;
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);

  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    ++t_bpe_work;
    Part& left = parts[size_t(c.left)];
    // Stale if either side has changed since: a merge gives the left part a new id
    // and marks the right part dead (id -1), which a candidate can also start at.
    if (left.id != c.left_id || left.next < 0 || parts[size_t(left.next)].id != c.right_id) continue;
    Part& right = parts[size_t(left.next)];
    left.id = merges_.at(pair_key(c.left_id, c.right_id)).result;
    left.next = right.next;
    right.id = kDeadPart;
    if (left.next >= 0) parts[size_t(left.next)].prev = c.left;
    consider(left.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = parts[size_t(i)].next) out.push_back(parts[size_t(i)].id);
}

uint64_t Tokenizer::bpe_work() { return t_bpe_work; }

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out, BpeCache& cache) const {
  std::vector<int32_t> ids;
  for_each_pretoken(text, [&](std::string_view piece) {
    if (piece.size() > kMaxCachedPiece) return encode_piece(piece, out);
    if (const std::vector<int32_t>* hit = cache.find(piece)) {
      out.insert(out.end(), hit->begin(), hit->end());
      return;
    }
    ids.clear();
    encode_piece(piece, ids);
    cache.insert(piece, ids);
    out.insert(out.end(), ids.begin(), ids.end());
  });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  BpeCache cache;
  std::vector<int32_t> out;
  encode(text, out, cache);
  return out;
}

std::vector<int32_t> Tokenizer::encode_with_special(std::string_view text) const {
  BpeCache cache;
  std::vector<int32_t> out;
  for (size_t pos = 0;;) {
    size_t special = text.find(kEndOfTextText, pos);
    encode(text.substr(pos, special == std::string_view::npos ? std::string_view::npos : special - pos), out,
           cache);
    if (special == std::string_view::npos) break;
    out.push_back(kEndOfText);
    pos = special + kEndOfTextText.size();
  }
  return out;
}

std::string Tokenizer::decode(const int32_t* ids, size_t count) const {
  std::string text;
  for (size_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size())
      fail_input("token id ", ids[i], " (at position ", i, ") is outside GPT-2's vocabulary [0, ", vocab_size(), ")");
    text += token_bytes_[size_t(ids[i])];
  }
  return text;
}

}  // namespace flashgpt
