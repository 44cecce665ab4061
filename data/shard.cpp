#include "data/shard.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "src/errors.h"

namespace flashgpt {

void write_shard(const std::string& path, const uint16_t* tokens, size_t count) {
  // The header stores the count as int32.
  if (count > size_t(INT32_MAX)) fail_input("shard ", path, ": ", count, " tokens exceed the int32 count of the header");
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = int32_t(count);
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail_input("cannot write shard ", tmp, ": ", std::strerror(errno));
  bool ok = std::fwrite(header, sizeof(header), 1, f) == 1;
  if (count) ok = ok && std::fwrite(tokens, sizeof(uint16_t), count, f) == count;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    fail_input("cannot write shard ", tmp, " (disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail_input("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno));
}

ShardView::ShardView(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail_input("cannot open shard ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail_input("cannot stat shard ", path, ": ", std::strerror(errno));
  }
  size_t bytes = size_t(st.st_size);
  if (bytes < kShardHeaderBytes) {
    ::close(fd);
    fail_input("shard ", path, " is truncated: ", bytes, " bytes, less than the ", kShardHeaderBytes,
               "-byte header");
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) fail_input("cannot mmap shard ", path, ": ", std::strerror(errno));
  map_ = map;
  map_bytes_ = bytes;

  // Copies: the messages below are built after unmapping.
  const int32_t magic = static_cast<const int32_t*>(map_)[0];
  const int32_t version = static_cast<const int32_t*>(map_)[1];
  const int32_t count = static_cast<const int32_t*>(map_)[2];
  if (magic != kShardMagic) {
    unmap();
    fail_input("shard ", path, " has bad magic ", magic, " (expected ", kShardMagic,
               "): not a token shard");
  }
  if (version != kShardVersion) {
    unmap();
    fail_input("shard ", path, " has version ", version, ", this build reads version ", kShardVersion);
  }
  if (count < 0) {
    unmap();
    fail_input("shard ", path, " has a negative token count ", count);
  }
  count_ = size_t(count);
  size_t expected = kShardHeaderBytes + count_ * sizeof(uint16_t);
  if (bytes != expected) {
    unmap();
    fail_input("shard ", path, " is truncated or corrupt: ", bytes, " bytes, but its header says ", count_,
               " tokens = ", expected, " bytes");
  }
  tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map_) + kShardHeaderBytes);
  // Training reads windows in a shuffled order; sequential read-ahead would be wasted.
  ::madvise(map_, map_bytes_, MADV_RANDOM);
}

ShardView::~ShardView() { unmap(); }

ShardView::ShardView(ShardView&& o) noexcept { *this = std::move(o); }

ShardView& ShardView::operator=(ShardView&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    tokens_ = o.tokens_;
    count_ = o.count_;
    o.map_ = nullptr;
    o.map_bytes_ = 0;
    o.tokens_ = nullptr;
    o.count_ = 0;
  }
  return *this;
}

void ShardView::unmap() {
  if (map_) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
}

void ShardView::check_ids(size_t begin, size_t end, int vocab_size) const {
  FG_ASSERT(begin <= end && end <= count_, "token range outside the shard");
  for (size_t i = begin; i < end; ++i)
    if (tokens_[i] >= vocab_size)
      fail_input("shard ", path_, ": token ", i, " has id ", tokens_[i], ", not below the vocab size ",
                 vocab_size);
}

std::vector<std::string> glob_sorted(const std::string& pattern) {
  glob_t g{};
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);  // glob() sorts unless GLOB_NOSORT
  std::vector<std::string> paths;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || paths.empty())
    fail_input("no file matches '", pattern, "' (run `flashgpt prepare` to make token shards)");
  if (rc != 0) fail_input("cannot list files matching '", pattern, "'");
  return paths;
}

}  // namespace flashgpt
