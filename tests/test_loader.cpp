// The distributed data loader: windows are slices of the shards, ranks split every
// global batch disjointly, state round-trips exactly, epochs wrap, bad inputs are clear.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "data/loader.h"
#include "src/errors.h"
#include "tests/testing.h"

namespace fs = std::filesystem;
using namespace flashgpt;

namespace {

struct TempDir : flashgpt::test::ScratchDir {
  TempDir() : ScratchDir("fg_loader_") {}
};

// Shards of random tokens with awkward sizes (not multiples of B*T).
struct Corpus {
  TempDir dir;
  std::vector<std::vector<uint16_t>> shards;
  explicit Corpus(std::initializer_list<size_t> sizes, int vocab = 50257) {
    std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int> id(0, vocab - 1);
    int i = 0;
    for (size_t n : sizes) {
      std::vector<uint16_t> t(n);
      for (auto& x : t) x = uint16_t(id(rng));
      char name[32];
      std::snprintf(name, sizeof(name), "train_%06d.bin", i++);
      write_shard(dir.file(name), t);
      shards.push_back(std::move(t));
    }
  }
  std::string pattern() const { return dir.file("train_*.bin"); }
};

using Place = std::pair<size_t, size_t>;  // (shard, offset of the window)
using Places = std::set<Place>;

struct Batch {
  std::vector<int32_t> x, y;
  bool operator==(const Batch& o) const { return x == o.x && y == o.y; }
};

Batch next(DataLoader& dl, const LoaderOptions& o) {
  Batch b{std::vector<int32_t>(size_t(o.B) * o.T), std::vector<int32_t>(size_t(o.B) * o.T)};
  dl.next(b.x.data(), b.y.data());
  return b;
}

// Where in the corpus the batch's window starts: (shard, offset); fails if the batch is
// not an exact window of B*T+1 tokens at a multiple of B*T.
Place locate(const Corpus& c, const Batch& b) {
  const size_t row = b.x.size();
  for (size_t s = 0; s < c.shards.size(); ++s)
    for (size_t off = 0; off + row + 1 <= c.shards[s].size(); off += row) {
      bool match = true;
      for (size_t i = 0; i < row && match; ++i)
        match = b.x[i] == c.shards[s][off + i] && b.y[i] == c.shards[s][off + i + 1];
      if (match) return {s, off};
    }
  ADD_FAILURE() << "batch is not a window of the shards";
  return {SIZE_MAX, SIZE_MAX};
}

template <class F>
void expect_input_error(F f, std::initializer_list<std::string> needles) {
  try {
    f();
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

LoaderOptions options(const Corpus& c, int B, int T, bool shuffle, uint64_t seed = 0) {
  LoaderOptions o;
  o.pattern = c.pattern();
  o.B = B;
  o.T = T;
  o.shuffle = shuffle;
  o.seed = seed;
  return o;
}

}  // namespace

TEST(Loader, SequentialWindowsAreShiftedSlicesInFileOrder) {
  Corpus c({1000, 333, 777});
  LoaderOptions o = options(c, 4, 16, /*shuffle=*/false);  // 64 tokens per window
  DataLoader dl(o);
  EXPECT_EQ(dl.total_tokens(), 2110u);
  // windows per shard: (n-1)/64 = 15, 5, 12
  ASSERT_EQ(dl.batches_per_epoch(), 32u);
  std::vector<Place> expected;
  for (size_t s = 0; s < 3; ++s)
    for (size_t off = 0; off + 65 <= c.shards[s].size(); off += 64) expected.emplace_back(s, off);
  for (size_t i = 0; i < expected.size(); ++i) {
    Batch b = next(dl, o);
    for (size_t k = 0; k + 1 < b.x.size(); ++k) ASSERT_EQ(b.y[k], b.x[k + 1]);
    EXPECT_EQ(locate(c, b), expected[i]) << "batch " << i;
  }
  EXPECT_EQ(dl.epoch(), 1u);
  EXPECT_EQ(locate(c, next(dl, o)), expected[0]) << "wraps to the start";
}

TEST(Loader, ShuffledEpochVisitsEveryWindowOnceInADifferentOrder) {
  Corpus c({5000, 4097});
  LoaderOptions o = options(c, 2, 32, /*shuffle=*/true, /*seed=*/std::random_device{}());
  DataLoader dl(o);
  const uint64_t n = dl.batches_per_epoch();
  ASSERT_EQ(n, 78u + 64u);
  std::vector<Place> epoch0, epoch1;
  for (uint64_t i = 0; i < n; ++i) epoch0.push_back(locate(c, next(dl, o)));
  for (uint64_t i = 0; i < n; ++i) epoch1.push_back(locate(c, next(dl, o)));
  EXPECT_EQ(Places(epoch0.begin(), epoch0.end()).size(), n);
  EXPECT_EQ(Places(epoch1.begin(), epoch1.end()).size(), n);
  EXPECT_NE(epoch0, epoch1) << "each epoch has its own order";
  auto sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(epoch0, sorted) << "shuffled";

  DataLoader again(o);
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(locate(c, next(again, o)), epoch0[i]) << "deterministic";
  LoaderOptions other = o;
  other.seed = o.seed + 1;
  DataLoader other_dl(other);
  std::vector<Place> other_order;
  for (uint64_t i = 0; i < n; ++i) other_order.push_back(locate(c, next(other_dl, other)));
  EXPECT_NE(other_order, epoch0) << "the seed matters";
}

TEST(Loader, RanksSplitTheGlobalBatchDisjointly) {
  Corpus c({3001, 2500, 1999});
  for (bool shuffle : {false, true}) {
    const int world = 2;
    LoaderOptions one = options(c, 2, 24, shuffle, 42);  // world 1, the reference
    DataLoader single(one);
    std::vector<DataLoader> ranks;
    std::vector<LoaderOptions> ro;
    for (int r = 0; r < world; ++r) {
      LoaderOptions o = one;
      o.rank = r;
      o.world = world;
      ro.push_back(o);
      ranks.emplace_back(o);
    }
    EXPECT_EQ(ranks[0].batches_per_epoch(), single.batches_per_epoch() / world);
    for (uint64_t step = 0; step < ranks[0].batches_per_epoch(); ++step) {
      Places global, parts;
      for (int r = 0; r < world; ++r) global.insert(locate(c, next(single, one)));
      for (int r = 0; r < world; ++r) parts.insert(locate(c, next(ranks[r], ro[r])));
      ASSERT_EQ(parts.size(), size_t(world)) << "ranks overlap at step " << step;
      ASSERT_EQ(parts, global) << "step " << step << " shuffle " << shuffle;
    }
  }
}

TEST(Loader, RestoredStateContinuesExactly) {
  Corpus c({4000, 2345});
  LoaderOptions o = options(c, 3, 20, /*shuffle=*/true, std::random_device{}());
  o.rank = 1;
  o.world = 2;
  DataLoader a(o);
  const uint64_t steps = a.batches_per_epoch() + a.batches_per_epoch() / 2;  // mid second epoch
  for (uint64_t i = 0; i < steps; ++i) next(a, o);
  nlohmann::json saved = nlohmann::json::parse(a.state().dump());  // through text, like a checkpoint
  DataLoader b(o);
  b.restore(saved);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(next(a, o), next(b, o)) << "batch " << i << " after restore";
}

TEST(Loader, ResetStartsOver) {
  Corpus c({2000});
  LoaderOptions o = options(c, 1, 50, /*shuffle=*/false);
  DataLoader dl(o);
  Batch first = next(dl, o);
  next(dl, o);
  dl.reset();
  EXPECT_EQ(next(dl, o), first);
}

TEST(Loader, RestoreRejectsOtherOptionsOrShards) {
  Corpus c({3000});
  LoaderOptions o = options(c, 2, 16, true, 1);
  DataLoader dl(o);
  nlohmann::json s = dl.state();
  LoaderOptions bigger = o;
  bigger.T = 32;
  DataLoader other(bigger);
  expect_input_error([&] { other.restore(s); }, {"T=16", "T=32"});
  nlohmann::json wrong = s;
  wrong["shards"][0]["tokens"] = 2999;
  expect_input_error([&] { dl.restore(wrong); }, {"2999", "3000"});
  expect_input_error([&] { dl.restore(nlohmann::json{{"version", 1}}); }, {"malformed"});
}

TEST(Loader, BadInputs) {
  Corpus c({100});
  LoaderOptions o = options(c, 4, 32, true);
  expect_input_error([&] { DataLoader dl(o); }, {c.pattern(), "too small", "100 tokens", "129"});
  LoaderOptions none = o;
  none.pattern = c.dir.file("val_*.bin");
  expect_input_error([&] { DataLoader dl(none); }, {none.pattern});
  LoaderOptions bad_rank = options(c, 1, 8, true);
  bad_rank.rank = 2;
  bad_rank.world = 2;
  expect_input_error([&] { DataLoader dl(bad_rank); }, {"rank 2"});
}

TEST(Loader, TokenIdAboveVocabIsAnInputError) {
  Corpus c({200});
  LoaderOptions o = options(c, 1, 100, false);
  o.vocab_size = 10;  // the random ids are up to 50256
  DataLoader dl(o);
  expect_input_error([&] { next(dl, o); }, {"train_000000.bin", "vocab size 10"});
}
