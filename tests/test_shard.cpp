// Token shard files: round trip, and one clear InputError per kind of bad file.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>

#include "data/shard.h"
#include "src/errors.h"
#include "tests/testing.h"

namespace fs = std::filesystem;
using namespace flashgpt;

namespace {

struct TempDir : flashgpt::test::ScratchDir {
  TempDir() : ScratchDir("fg_shard_") {}
};

std::vector<uint16_t> random_tokens(size_t n, std::mt19937_64& rng) {
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

using test::expect_input_error;

}  // namespace

TEST(Shard, RoundTripIsExact) {
  TempDir dir;
  auto rng = flashgpt::test::test_rng();
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

// ---- flashgpt prepare: text files -> shards ------------------------------------------
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "tests/vocab.h"

namespace {

using test::vocab_dir;

std::vector<uint16_t> read_all(const std::string& pattern) {
  std::vector<uint16_t> all;
  for (const std::string& p : glob_sorted(pattern)) {
    ShardView v(p);
    all.insert(all.end(), v.tokens(), v.tokens() + v.size());
  }
  return all;
}

// Cuts a token stream at <|endoftext|> into documents (each starts with one).
std::vector<std::vector<int32_t>> documents_of(const std::vector<uint16_t>& tokens) {
  std::vector<std::vector<int32_t>> docs;
  for (uint16_t t : tokens) {
    if (t == Tokenizer::kEndOfText) docs.emplace_back();
    else if (!docs.empty()) docs.back().push_back(t);
    else ADD_FAILURE() << "the stream must start with <|endoftext|>";
  }
  return docs;
}

}  // namespace

TEST(ShardPrepare, SplitDocumentsOnSeparatorLines) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(split_documents("one\n<|endoftext|>\ntwo\n\n<|endoftext|>\nthree\n"), (V{"one", "two\n", "three"}));
  EXPECT_EQ(split_documents("<|endoftext|>\nonly\n<|endoftext|>"), (V{"only"}));
  EXPECT_EQ(split_documents("no separator <|endoftext|> inside a line"), (V{"no separator <|endoftext|> inside a line"}));
  EXPECT_EQ(split_documents(""), V{});
}

TEST(ShardPrepare, DeterministicSplitByDocumentForAnyThreadCount) {
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = std::make_unique<Tokenizer>(vocab_dir());
  } catch (const InputError& e) {
    FAIL() << e.what();
  }
  TempDir dir;
  auto rng = flashgpt::test::test_rng();
  const char* words[] = {"the", "State", "of", "Union", "is", "strong", "café", "1790", "\n\n", "!", "  ", "日本"};
  std::set<std::string> all_docs;
  for (int file = 0; file < 2; ++file) {
    std::string text;
    for (int d = 0; d < 150; ++d) {
      std::string doc = "doc " + std::to_string(file) + "." + std::to_string(d);
      for (int w = 0, n = int(rng() % 300); w < n; ++w) doc += std::string(" ") + words[rng() % 12];
      all_docs.insert(doc);
      text += doc + "\n<|endoftext|>\n";
    }
    std::ofstream(dir.file("part" + std::to_string(file) + ".txt")) << text;
  }
  PrepareOptions o;
  o.inputs = {dir.path.string()};
  o.val_fraction = 0.1;
  o.shard_tokens = 5000;  // several shards
  o.progress = false;
  std::vector<uint16_t> train[2], val[2];
  for (int run = 0; run < 2; ++run) {
    o.threads = run == 0 ? 1 : 3;
    o.out = dir.file("out" + std::to_string(run));
    PrepareStats s = prepare_shards(o, *tok);
    EXPECT_GT(s.train.shards, 1u);
    EXPECT_EQ(s.train.documents + s.val.documents, all_docs.size());
    train[run] = read_all(o.out + "/train_*.bin");
    val[run] = read_all(o.out + "/val_*.bin");
    EXPECT_EQ(train[run].size(), s.train.tokens);
  }
  EXPECT_EQ(train[0], train[1]) << "thread count changed the train shards";
  EXPECT_EQ(val[0], val[1]) << "thread count changed the val shards";

  std::multiset<std::string> seen;
  for (const auto& stream : {train[0], val[0]})
    for (const auto& ids : documents_of(stream)) {
      std::string doc = tok->decode(ids);
      EXPECT_EQ(ids, tok->encode(doc)) << "a document is encoded on its own";
      seen.insert(doc);
    }
  EXPECT_EQ(seen, std::multiset<std::string>(all_docs.begin(), all_docs.end())) << "each document exactly once";
  size_t val_docs = documents_of(val[0]).size();
  EXPECT_GT(val_docs, 5u);
  EXPECT_LT(val_docs, 60u);  // ~10% of 300
}

TEST(ShardPrepare, TinyCorpusStillGetsOneValidationDocument) {
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = std::make_unique<Tokenizer>(vocab_dir());
  } catch (const InputError& e) {
    FAIL() << e.what();
  }
  TempDir dir;
  std::ofstream(dir.file("a.txt")) << "first\n<|endoftext|>\nsecond\n<|endoftext|>\nthird";
  PrepareOptions o;
  o.inputs = {dir.file("a.txt")};
  o.out = dir.file("out");
  o.val_fraction = 1e-9;
  o.progress = false;
  PrepareStats s = prepare_shards(o, *tok);
  EXPECT_EQ(s.val.documents, 1u);
  EXPECT_EQ(s.train.documents, 2u);
  o.inputs = {dir.file("missing.txt")};
  EXPECT_THROW(prepare_shards(o, *tok), InputError);
}

// An output directory that cannot be created (under a file) is an InputError naming --out.
TEST(ShardPrepare, AnOutputThatCannotBeCreatedIsAnInputError) {
  Tokenizer tok(vocab_dir());
  TempDir dir;
  std::ofstream(dir.file("doc.txt")) << "one document\n<|endoftext|>\nanother one\n";
  std::ofstream(dir.file("a_file")) << "x";
  PrepareOptions o;
  o.out = dir.file("a_file") + "/shards";
  o.progress = false;
  o.inputs = {dir.file("doc.txt")};
  try {
    prepare_shards(o, tok);
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--out '"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot create the directory"), std::string::npos) << e.what();
  }
}

// Nothing to train on is an error, not empty shards: no text at all, or one document,
// which the split gives to validation (--val-fraction 0 keeps it for training). The
// previous output stays.
TEST(ShardPrepare, NoTrainingTokensIsAnError) {
  Tokenizer tok(vocab_dir());
  TempDir dir;
  std::ofstream(dir.file("empty.txt")) << "";
  std::ofstream(dir.file("one.txt")) << "just one document";
  std::ofstream(dir.file("only_separators.txt")) << "<|endoftext|>\n<|endoftext|>\n";
  PrepareOptions o;
  o.out = dir.file("out");
  o.progress = false;
  o.inputs = {dir.file("one.txt")};
  o.val_fraction = 0;
  EXPECT_EQ(prepare_shards(o, tok).train.documents, 1u);
  o.val_fraction = 0.05;
  for (const char* f : {"empty.txt", "one.txt", "only_separators.txt"}) {
    o.inputs = {dir.file(f)};
    try {
      prepare_shards(o, tok);
      ADD_FAILURE() << f << ": no InputError";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(f) == "one.txt" ? "--val-fraction 0" : "no text"),
                std::string::npos) << e.what();
    }
    EXPECT_TRUE(std::filesystem::exists(dir.file("out") + "/train_000000.bin")) << "the previous shards stay";
    EXPECT_FALSE(std::filesystem::exists(dir.file("out") + ".partial"));
  }
}
