#include "data/loader.h"

#include <algorithm>

#include "src/errors.h"

namespace flashgpt {

namespace {
constexpr int kStateVersion = 1;
// Each epoch gets its own order; mixing the epoch into the seed keeps orders of
// neighbouring epochs (and seeds) unrelated.
uint64_t epoch_seed(uint64_t seed, uint64_t epoch) { return mix64(seed ^ mix64(epoch)); }
}  // namespace

DataLoader::DataLoader(const LoaderOptions& o) : opt_(o) {
  if (o.B <= 0 || o.T <= 0) fail_input("data loader: B and T must be positive (got B=", o.B, ", T=", o.T, ")");
  if (o.world <= 0 || o.rank < 0 || o.rank >= o.world)
    fail_input("data loader: rank ", o.rank, " is not in [0, world=", o.world, ")");
  if (o.vocab_size <= 0 || o.vocab_size > kShardMaxVocab)
    fail_input("data loader: vocab_size ", o.vocab_size, " does not fit uint16 shards");

  const uint64_t row = uint64_t(o.B) * uint64_t(o.T);  // tokens per window, + 1 target
  first_window_.push_back(0);
  for (const std::string& path : glob_sorted(o.pattern)) {
    shards_.emplace_back(path);
    size_t n = shards_.back().size();
    total_tokens_ += n;
    uint64_t windows = n > row ? (n - 1) / row : 0;
    first_window_.push_back(first_window_.back() + windows);
  }
  windows_ = first_window_.back();
  batches_per_epoch_ = windows_ / uint64_t(o.world);
  if (batches_per_epoch_ == 0) {
    size_t largest = 0;
    for (size_t i = 1; i < shards_.size(); ++i)
      if (shards_[i].size() > shards_[largest].size()) largest = i;
    fail_input("shards matching '", o.pattern, "' are too small for one batch: ", shards_.size(),
               " file(s), the largest ", shards_[largest].path(), " has ", shards_[largest].size(),
               " tokens; one batch needs ", o.world, " window(s) of B*T+1 = ", o.B, "*", o.T, "+1 = ", row + 1,
               " tokens within one file (world=", o.world, ")");
  }
  reset();
}

void DataLoader::reset() {
  epoch_ = 0;
  batch_ = 0;
  order_ = Permutation(windows_, epoch_seed(opt_.seed, epoch_));
}

DataLoader::Window DataLoader::window(uint64_t index) const {
  // The shard is the last one whose first window is <= index.
  auto it = std::upper_bound(first_window_.begin(), first_window_.end(), index);
  size_t shard = size_t(it - first_window_.begin()) - 1;
  uint64_t row = uint64_t(opt_.B) * uint64_t(opt_.T);
  return {shard, size_t((index - first_window_[shard]) * row)};
}

void DataLoader::next(int32_t* inputs, int32_t* targets) {
  uint64_t slot = batch_ * uint64_t(opt_.world) + uint64_t(opt_.rank);
  uint64_t index = opt_.shuffle ? order_(slot) : slot;
  Window w = window(index);
  const ShardView& shard = shards_[w.shard];
  const size_t row = size_t(opt_.B) * size_t(opt_.T);
  shard.check_ids(w.offset, w.offset + row + 1, opt_.vocab_size);
  const uint16_t* tok = shard.tokens() + w.offset;
  for (size_t i = 0; i < row; ++i) {
    inputs[i] = tok[i];
    targets[i] = tok[i + 1];
  }
  if (++batch_ == batches_per_epoch_) {
    batch_ = 0;
    ++epoch_;
    order_ = Permutation(windows_, epoch_seed(opt_.seed, epoch_));
  }
}

nlohmann::json DataLoader::state() const {
  nlohmann::json files = nlohmann::json::array();
  for (const ShardView& s : shards_) files.push_back({{"path", s.path()}, {"tokens", s.size()}});
  return {{"version", kStateVersion}, {"epoch", epoch_},   {"batch", batch_},
          {"B", opt_.B},              {"T", opt_.T},       {"world", opt_.world},
          {"seed", opt_.seed},        {"shuffle", opt_.shuffle}, {"shards", files}};
}

void DataLoader::restore(const nlohmann::json& s) {
  try {
    if (s.at("version").get<int>() != kStateVersion)
      fail_input("loader state has version ", s.at("version").dump(), ", expected ", kStateVersion);
    auto expect = [&](const char* key, const nlohmann::json& ours) {
      if (s.at(key) != ours)
        fail_input("loader state was saved with ", key, "=", s.at(key).dump(), " but this run has ", key, "=",
                   ours.dump());
    };
    expect("B", opt_.B);
    expect("T", opt_.T);
    expect("world", opt_.world);
    expect("seed", opt_.seed);
    expect("shuffle", opt_.shuffle);
    const nlohmann::json& files = s.at("shards");
    if (files.size() != shards_.size())
      fail_input("loader state was saved for ", files.size(), " shard(s), '", opt_.pattern, "' matches ",
                 shards_.size());
    // Shards may move (another directory), but their contents' sizes must not change.
    for (size_t i = 0; i < shards_.size(); ++i)
      if (files[i].at("tokens").get<size_t>() != shards_[i].size())
        fail_input("loader state: shard ", i, " (", files[i].at("path").get<std::string>(), ") had ",
                   files[i].at("tokens").get<size_t>(), " tokens, ", shards_[i].path(), " has ",
                   shards_[i].size());
    uint64_t batch = s.at("batch").get<uint64_t>();
    if (batch >= batches_per_epoch_)
      fail_input("loader state: batch ", batch, " is past the end of an epoch (", batches_per_epoch_, ")");
    epoch_ = s.at("epoch").get<uint64_t>();
    batch_ = batch;
    order_ = Permutation(windows_, epoch_seed(opt_.seed, epoch_));
  } catch (const nlohmann::json::exception& e) {
    fail_input("loader state is malformed: ", e.what());
  }
}

}  // namespace flashgpt
