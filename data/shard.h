// Token shard files, llm.c's format, so data prepared here works with llm.c-style tools
// and back:
//   header: 256 x int32 (little-endian) = [magic 20240520, version 1, token count, 0...]
//   body:   token count x uint16 token ids
// Readers memory-map the file instead of reading it whole: a training run touches a
// few windows at a time of shards that may be gigabytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace flashgpt {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr size_t kShardHeaderInts = 256;
constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);
// uint16 ids: the largest vocabulary a shard can hold.
constexpr int kShardMaxVocab = 65536;

// Writes a whole shard. It goes to "<path>.tmp" first and is renamed when complete,
// so a crash never leaves a half-written shard under the real name.
void write_shard(const std::string& path, const uint16_t* tokens, size_t count);
inline void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  write_shard(path, tokens.data(), tokens.size());
}

// A read-only memory map of one shard. Opening checks the header (magic, version) and
// that the file size is exactly header + count * 2; any mismatch is an InputError that
// names the file. Move-only.
class ShardView {
 public:
  explicit ShardView(const std::string& path);
  ~ShardView();
  ShardView(ShardView&& other) noexcept;
  ShardView& operator=(ShardView&& other) noexcept;
  ShardView(const ShardView&) = delete;
  ShardView& operator=(const ShardView&) = delete;

  const std::string& path() const { return path_; }
  size_t size() const { return count_; }  // tokens
  const uint16_t* tokens() const { return tokens_; }

  // InputError naming the file and the position of the first id >= vocab_size in
  // tokens [begin, end).
  void check_ids(size_t begin, size_t end, int vocab_size) const;

 private:
  void unmap();
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  size_t count_ = 0;
};

// Paths matching a glob pattern, sorted; InputError if none match.
std::vector<std::string> glob_sorted(const std::string& pattern);

}  // namespace flashgpt
