// Token shard files: round trip, and one clear InputError per kind of bad file.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "data/shard.h"
#include "src/errors.h"

namespace fs = std::filesystem;
using namespace flashgpt;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("fg_shard_" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::vector<uint16_t> random_tokens(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> id(0, 50256);
  std::vector<uint16_t> t(n);
  for (auto& x : t) x = uint16_t(id(rng));
  return t;
}

// Writes raw bytes: a header with the given fields, then `tokens` uint16 values.
void write_raw(const std::string& path, int32_t magic, int32_t version, int32_t count, size_t tokens) {
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  std::vector<uint16_t> body(tokens, 7);
  f.write(reinterpret_cast<const char*>(body.data()), body.size() * 2);
}

// Runs f, expects an InputError whose message contains every needle.
template <class F>
void expect_input_error(F f, std::initializer_list<std::string> needles) {
  try {
    f();
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Shard, RoundTripIsExact) {
  TempDir dir;
  std::mt19937 rng(std::random_device{}());
  for (size_t n : {size_t(0), size_t(1), size_t(1023), size_t(100003)}) {
    auto tokens = random_tokens(n, rng);
    std::string path = dir.file("s.bin");
    write_shard(path, tokens);
    EXPECT_EQ(fs::file_size(path), kShardHeaderBytes + 2 * n);
    EXPECT_FALSE(fs::exists(path + ".tmp"));
    ShardView view(path);
    ASSERT_EQ(view.size(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(view.tokens()[i], tokens[i]) << "token " << i;
  }
}

TEST(Shard, HeaderIsLlmcCompatible) {
  TempDir dir;
  std::string path = dir.file("s.bin");
  write_shard(path, std::vector<uint16_t>{1, 2, 3});
  std::ifstream f(path, std::ios::binary);
  int32_t header[3];
  f.read(reinterpret_cast<char*>(header), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 3);
}

TEST(Shard, BadMagicNamesTheFile) {
  TempDir dir;
  std::string path = dir.file("bad_magic.bin");
  write_raw(path, 12345, kShardVersion, 10, 10);
  expect_input_error([&] { ShardView v(path); }, {path, "magic", "12345"});
}

TEST(Shard, BadVersionNamesTheFile) {
  TempDir dir;
  std::string path = dir.file("bad_version.bin");
  write_raw(path, kShardMagic, 7, 10, 10);
  expect_input_error([&] { ShardView v(path); }, {path, "version 7"});
}

TEST(Shard, TruncatedBodyNamesSizes) {
  TempDir dir;
  std::string path = dir.file("short.bin");
  write_raw(path, kShardMagic, kShardVersion, 100, 99);
  expect_input_error([&] { ShardView v(path); }, {path, "truncated", "100 tokens"});
}

TEST(Shard, TrailingBytesAreRejected) {
  TempDir dir;
  std::string path = dir.file("long.bin");
  write_raw(path, kShardMagic, kShardVersion, 100, 101);
  expect_input_error([&] { ShardView v(path); }, {path, "100 tokens"});
}

TEST(Shard, TruncatedHeader) {
  TempDir dir;
  std::string path = dir.file("tiny.bin");
  std::ofstream(path) << "hello";
  expect_input_error([&] { ShardView v(path); }, {path, "header"});
}

TEST(Shard, MissingFile) {
  TempDir dir;
  std::string path = dir.file("nope.bin");
  expect_input_error([&] { ShardView v(path); }, {path});
}

TEST(Shard, GlobSortsAndFailsOnNoMatch) {
  TempDir dir;
  for (const char* name : {"train_000002.bin", "train_000000.bin", "train_000001.bin", "val_000000.bin"})
    write_shard(dir.file(name), std::vector<uint16_t>{1});
  auto paths = glob_sorted(dir.file("train_*.bin"));
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_EQ(paths[0], dir.file("train_000000.bin"));
  EXPECT_EQ(paths[2], dir.file("train_000002.bin"));
  std::string pattern = dir.file("test_*.bin");
  expect_input_error([&] { glob_sorted(pattern); }, {pattern});
}

TEST(Shard, IdAboveVocabNamesPosition) {
  TempDir dir;
  std::string path = dir.file("ids.bin");
  std::vector<uint16_t> t(50, 5);
  t[37] = 50257;
  write_shard(path, t);
  ShardView v(path);
  EXPECT_NO_THROW(v.check_ids(0, 37, 50257));
  expect_input_error([&] { v.check_ids(0, 50, 50257); }, {path, "token 37", "50257"});
}
