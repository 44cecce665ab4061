// The distributed data loader: rows are slices of the shards, the ranks of a step
// share one stream of rows (so the split never changes the data), state round-trips
// exactly and across world sizes, epochs wrap, bad inputs are clear.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "data/loader.h"
#include "src/errors.h"
#include "tests/testing.h"

using namespace flashgpt;

namespace {

// Shards of random tokens (seeded by the test's name, see test_rng) with awkward sizes
// (not multiples of T).
struct Corpus {
  test::ScratchDir dir{"fg_loader_"};
  std::vector<std::vector<uint16_t>> shards;
  explicit Corpus(std::initializer_list<size_t> sizes, int vocab = 50257) {
    std::mt19937_64 rng = test::test_rng(sizes.size());
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

using Place = std::pair<size_t, size_t>;  // (shard, offset of the row)
using Places = std::set<Place>;

struct Batch {
  int B = 0, T = 0;
  std::vector<int32_t> x, y;
  bool operator==(const Batch& o) const { return x == o.x && y == o.y; }
};

Batch next(DataLoader& dl, const LoaderOptions& o) {
  Batch b{o.B, o.T, std::vector<int32_t>(size_t(o.B) * o.T), std::vector<int32_t>(size_t(o.B) * o.T)};
  dl.next(b.x.data(), b.y.data());
  return b;
}

// Where in the corpus each row of the batch starts: (shard, offset); fails unless the
// row is an exact slice of T+1 tokens at a multiple of T.
std::vector<Place> locate(const Corpus& c, const Batch& b) {
  std::vector<Place> out;
  const size_t T = size_t(b.T);
  for (int r = 0; r < b.B; ++r) {
    const int32_t* x = b.x.data() + size_t(r) * T;
    const int32_t* y = b.y.data() + size_t(r) * T;
    Place found{SIZE_MAX, SIZE_MAX};
    for (size_t s = 0; s < c.shards.size() && found.first == SIZE_MAX; ++s)
      for (size_t off = 0; off + T + 1 <= c.shards[s].size(); off += T) {
        bool match = true;
        for (size_t i = 0; i < T && match; ++i) match = x[i] == c.shards[s][off + i] && y[i] == c.shards[s][off + i + 1];
        if (match) { found = {s, off}; break; }
      }
    if (found.first == SIZE_MAX) ADD_FAILURE() << "row " << r << " is not a row of the shards";
    out.push_back(found);
  }
  return out;
}

using test::expect_input_error;

LoaderOptions options(const Corpus& c, int B, int T, bool shuffle, uint64_t seed = 0) {
  LoaderOptions o;
  o.pattern = c.pattern();
  o.B = B;
  o.T = T;
  o.shuffle = shuffle;
  o.seed = seed;
  return o;
}

LoaderOptions as_rank(LoaderOptions o, int rank, int world) {
  o.rank = rank;
  o.world = world;
  return o;
}

uint64_t random_seed() { return test::test_rng(7)(); }

}  // namespace

TEST(Loader, SequentialRowsAreShiftedSlicesInFileOrder) {
  Corpus c({1000, 333, 777});
  LoaderOptions o = options(c, 4, 16, /*shuffle=*/false);
  DataLoader dl(o);
  EXPECT_EQ(dl.total_tokens(), 2110u);
  // rows per shard: (n-1)/16 = 62, 20, 48 → 130; an epoch is 32 batches of 4 (2 left over)
  ASSERT_EQ(dl.batches_per_epoch(), 32u);
  std::vector<Place> expected;
  for (size_t s = 0; s < 3; ++s)
    for (size_t off = 0; off + 17 <= c.shards[s].size(); off += 16) expected.emplace_back(s, off);
  for (size_t i = 0; i < 32; ++i) {
    std::vector<Place> got = locate(c, next(dl, o));
    for (size_t r = 0; r < 4; ++r) EXPECT_EQ(got[r], expected[4 * i + r]) << "batch " << i << " row " << r;
  }
  EXPECT_EQ(dl.epoch(), 0u);
  EXPECT_EQ(locate(c, next(dl, o))[0], expected[0]) << "wraps to the start, skipping the 2 left-over rows";
  EXPECT_EQ(dl.epoch(), 1u);
}

TEST(Loader, ShuffledEpochVisitsEveryRowOnceInADifferentOrder) {
  Corpus c({5000, 4097});
  LoaderOptions o = options(c, 2, 32, /*shuffle=*/true, random_seed());
  DataLoader dl(o);
  const uint64_t n = dl.batches_per_epoch();
  ASSERT_EQ(n, (156u + 128u) / 2);
  std::vector<Place> epoch0, epoch1;
  for (uint64_t i = 0; i < n; ++i) for (Place p : locate(c, next(dl, o))) epoch0.push_back(p);
  for (uint64_t i = 0; i < n; ++i) for (Place p : locate(c, next(dl, o))) epoch1.push_back(p);
  EXPECT_EQ(Places(epoch0.begin(), epoch0.end()).size(), 2 * n);
  EXPECT_EQ(Places(epoch1.begin(), epoch1.end()).size(), 2 * n);
  EXPECT_NE(epoch0, epoch1) << "each epoch has its own order";
  auto sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(epoch0, sorted) << "shuffled";

  DataLoader again(o);
  for (uint64_t i = 0; i < n; ++i) {
    std::vector<Place> got = locate(c, next(again, o));
    ASSERT_EQ(got[0], epoch0[2 * i]) << "deterministic";
    ASSERT_EQ(got[1], epoch0[2 * i + 1]) << "deterministic";
  }
  LoaderOptions other = o;
  other.seed = o.seed + 1;
  DataLoader other_dl(other);
  std::vector<Place> other_order;
  for (uint64_t i = 0; i < n; ++i) for (Place p : locate(c, next(other_dl, other))) other_order.push_back(p);
  EXPECT_NE(other_order, epoch0) << "the seed matters";
}

// The data-parallel contract: per step, 2 ranks × B rows = 1 rank × 2B rows = 1 rank ×
// B rows with 2 accumulation steps (same rows; for 1 × 2B also the same order).
TEST(Loader, RanksAndAccumulationSplitOneStream) {
  Corpus c({3001, 2500, 1999});
  for (bool shuffle : {false, true}) {
    const int B = 3, T = 24;
    LoaderOptions whole = options(c, 2 * B, T, shuffle, 42);
    LoaderOptions accum = options(c, B, T, shuffle, 42);
    accum.rows_per_step = 2 * B;
    DataLoader one(whole), acc(accum);
    std::vector<LoaderOptions> ro = {as_rank(options(c, B, T, shuffle, 42), 0, 2),
                                     as_rank(options(c, B, T, shuffle, 42), 1, 2)};
    std::vector<DataLoader> ranks;
    for (const auto& o : ro) ranks.emplace_back(o);
    EXPECT_EQ(ranks[0].batches_per_epoch(), one.batches_per_epoch());
    EXPECT_EQ(acc.batches_per_epoch(), 2 * one.batches_per_epoch());
    for (uint64_t step = 0; step < one.batches_per_epoch() + 5; ++step) {  // into the next epoch
      std::vector<Place> ref = locate(c, next(one, whole)), split, accumulated;
      for (int r = 0; r < 2; ++r) for (Place p : locate(c, next(ranks[size_t(r)], ro[size_t(r)]))) split.push_back(p);
      for (int a = 0; a < 2; ++a) for (Place p : locate(c, next(acc, accum))) accumulated.push_back(p);
      ASSERT_EQ(split, ref) << "step " << step << " shuffle " << shuffle;
      ASSERT_EQ(accumulated, ref) << "step " << step << " shuffle " << shuffle;
    }
  }
}

TEST(Loader, RestoredStateContinuesExactly) {
  Corpus c({4000, 2345});
  LoaderOptions o = as_rank(options(c, 3, 20, /*shuffle=*/true, random_seed()), 1, 2);
  DataLoader a(o);
  const uint64_t steps = a.batches_per_epoch() + a.batches_per_epoch() / 2;  // mid second epoch
  for (uint64_t i = 0; i < steps; ++i) next(a, o);
  nlohmann::json saved = nlohmann::json::parse(a.state().dump());  // through text, like a checkpoint
  DataLoader b(o);
  b.restore(saved);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(next(a, o), next(b, o)) << "batch " << i << " after restore";
}

// A state saved by 2 ranks resumes on 1 rank (with accumulation making up the step) or
// on 3 ranks, and the stream continues where it was.
TEST(Loader, StateResumesAtAnotherWorldSize) {
  Corpus c({4000, 2345});
  const int B = 2, T = 20;
  const uint64_t per_step = 6 * B;  // rows of one optimizer step
  auto make = [&](int rank, int world) {
    LoaderOptions o = as_rank(options(c, B, T, true, random_seed()), rank, world);
    o.rows_per_step = per_step;
    return o;
  };
  LoaderOptions ref_o = make(0, 1);
  DataLoader ref(ref_o);
  std::vector<std::vector<Place>> steps;  // the reference stream, one step at a time
  for (int s = 0; s < 40; ++s) {
    std::vector<Place> rows;
    for (int m = 0; m < 6; ++m) for (Place p : locate(c, next(ref, ref_o))) rows.push_back(p);
    steps.push_back(rows);
  }
  // 2 ranks (accumulation 3) for 25 steps, then save.
  std::vector<LoaderOptions> two = {make(0, 2), make(1, 2)};
  std::vector<DataLoader> l2;
  for (const auto& o : two) l2.emplace_back(o);
  for (int s = 0; s < 25; ++s) for (int m = 0; m < 3; ++m) for (int r = 0; r < 2; ++r) next(l2[size_t(r)], two[size_t(r)]);
  const nlohmann::json saved = nlohmann::json::parse(l2[0].state().dump());
  EXPECT_EQ(saved, l2[1].state()) << "every rank holds the same state";
  for (int world : {1, 3}) {
    std::vector<LoaderOptions> os;
    std::vector<DataLoader> ls;
    for (int r = 0; r < world; ++r) os.push_back(make(r, world));
    for (const auto& o : os) { ls.emplace_back(o); ls.back().restore(saved); }
    for (int s = 25; s < 40; ++s) {
      std::multiset<Place> got;
      for (int m = 0; m < 6 / world; ++m)
        for (int r = 0; r < world; ++r) for (Place p : locate(c, next(ls[size_t(r)], os[size_t(r)]))) got.insert(p);
      ASSERT_EQ(got, std::multiset<Place>(steps[size_t(s)].begin(), steps[size_t(s)].end()))
          << "world " << world << " step " << s;
    }
  }
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
  LoaderOptions longer = o;
  longer.T = 32;
  DataLoader other(longer);
  expect_input_error([&] { other.restore(s); }, {"T=16", "T=32"});
  LoaderOptions bigger_step = o;
  bigger_step.rows_per_step = 8;
  DataLoader other_step(bigger_step);
  expect_input_error([&] { other_step.restore(s); }, {"rows_per_step=2", "rows_per_step=8", "total_batch"});
  nlohmann::json wrong = s;
  wrong["shards"][0]["tokens"] = 2999;
  expect_input_error([&] { dl.restore(wrong); }, {"2999", "3000"});
  nlohmann::json old = s;
  old["version"] = 1;
  expect_input_error([&] { dl.restore(old); }, {"version 1"});
  expect_input_error([&] { dl.restore(nlohmann::json{{"version", 2}}); }, {"malformed"});
}

TEST(Loader, BadInputs) {
  Corpus c({100});
  LoaderOptions o = options(c, 4, 32, true);
  expect_input_error([&] { DataLoader dl(o); }, {c.pattern(), "too small", "100 tokens", "3 row(s)", "needs 4 rows"});
  LoaderOptions none = o;
  none.pattern = c.dir.file("val_*.bin");
  expect_input_error([&] { DataLoader dl(none); }, {none.pattern});
  LoaderOptions bad_rank = as_rank(options(c, 1, 8, true), 2, 2);
  expect_input_error([&] { DataLoader dl(bad_rank); }, {"rank 2"});
  LoaderOptions ragged = options(c, 2, 8, true);
  ragged.rows_per_step = 3;
  expect_input_error([&] { DataLoader dl(ragged); }, {"not a multiple"});
}

TEST(Loader, TokenIdAboveVocabIsAnInputError) {
  Corpus c({200});
  LoaderOptions o = options(c, 1, 100, false);
  o.vocab_size = 10;  // the random ids are up to 50256
  DataLoader dl(o);
  expect_input_error([&] { next(dl, o); }, {"train_000000.bin", "vocab size 10"});
}
