#include "data/loader.h"

#include <algorithm>

#include "src/errors.h"
#include "src/json_fields.h"

namespace flashgpt {

namespace {
constexpr int kStateVersion = 2;  // 1: windows of B·T tokens split by world (not world-independent)
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
  if (opt_.rows_per_step == 0) opt_.rows_per_step = micro_rows();
  if (opt_.rows_per_step % micro_rows() != 0)
    fail_input("data loader: rows per step (", opt_.rows_per_step, ") is not a multiple of world·B = ", micro_rows());

  const uint64_t T = uint64_t(o.T);
  first_row_.push_back(0);
  for (const std::string& path : glob_sorted(o.pattern)) {
    shards_.emplace_back(path);
    size_t n = shards_.back().size();
    total_tokens_ += n;
    first_row_.push_back(first_row_.back() + (n > T ? (n - 1) / T : 0));
  }
  rows_ = first_row_.back();
  epoch_rows_ = rows_ / opt_.rows_per_step * opt_.rows_per_step;
  if (epoch_rows_ == 0) {
    size_t largest = 0;
    for (size_t i = 1; i < shards_.size(); ++i)
      if (shards_[i].size() > shards_[largest].size()) largest = i;
    fail_input("shards matching '", o.pattern, "' are too small for one step: ", shards_.size(),
               " file(s) with ", rows_, " row(s) of T+1 = ", o.T + 1, " tokens (the largest, ",
               shards_[largest].path(), ", has ", shards_[largest].size(), " tokens); one step needs ",
               opt_.rows_per_step, " rows (batch ", o.B, " x ", o.world, " rank(s) x accumulation)");
  }
  reset();
}

void DataLoader::reset() {
  epoch_ = 0;
  pos_ = 0;
  order_ = Permutation(rows_, epoch_seed(opt_.seed, epoch_));
}

DataLoader::Row DataLoader::row(uint64_t index) const {
  // The shard is the last one whose first row is <= index.
  auto it = std::upper_bound(first_row_.begin(), first_row_.end(), index);
  size_t shard = size_t(it - first_row_.begin()) - 1;
  return {shard, size_t((index - first_row_[shard]) * uint64_t(opt_.T))};
}

void DataLoader::next(int32_t* inputs, int32_t* targets) {
  if (pos_ + micro_rows() > epoch_rows_) {
    pos_ = 0;
    ++epoch_;
    order_ = Permutation(rows_, epoch_seed(opt_.seed, epoch_));
  }
  const size_t T = size_t(opt_.T);
  const uint64_t first = pos_ + uint64_t(opt_.rank) * uint64_t(opt_.B);
  for (int b = 0; b < opt_.B; ++b) {
    const uint64_t slot = first + uint64_t(b);
    const Row r = row(opt_.shuffle ? order_(slot) : slot);
    const ShardView& shard = shards_[r.shard];
    shard.check_ids(r.offset, r.offset + T + 1, opt_.vocab_size);
    const uint16_t* tok = shard.tokens() + r.offset;
    int32_t* in = inputs + size_t(b) * T;
    int32_t* tg = targets + size_t(b) * T;
    for (size_t i = 0; i < T; ++i) {
      in[i] = tok[i];
      tg[i] = tok[i + 1];
    }
  }
  pos_ += micro_rows();
}

nlohmann::json DataLoader::state() const {
  nlohmann::json files = nlohmann::json::array();
  for (const ShardView& s : shards_) files.push_back({{"path", s.path()}, {"tokens", s.size()}});
  return {{"version", kStateVersion}, {"epoch", epoch_},  {"rows", pos_},
          {"T", opt_.T},              {"seed", opt_.seed}, {"shuffle", opt_.shuffle},
          {"rows_per_step", opt_.rows_per_step},           {"shards", files}};
}

void DataLoader::restore(const nlohmann::json& s) {
  try {
    if (json_uint(s, "version", "loader state") != uint64_t(kStateVersion))
      fail_input("loader state has version ", s.at("version").dump(), ", expected ", kStateVersion,
                 " (checkpoints from before world-size independent loading cannot be resumed)");
    auto expect = [&](const char* key, const nlohmann::json& ours, const char* hint) {
      if (s.at(key) != ours)
        fail_input("loader state was saved with ", key, "=", s.at(key).dump(), " but this run has ", key, "=",
                   ours.dump(), hint);
    };
    expect("T", opt_.T, "");
    expect("seed", opt_.seed, "");
    expect("shuffle", opt_.shuffle, "");
    expect("rows_per_step", opt_.rows_per_step, " (train.total_batch / train.seq_len must not change on resume)");
    const nlohmann::json& files = s.at("shards");
    if (files.size() != shards_.size())
      fail_input("loader state was saved for ", files.size(), " shard(s), '", opt_.pattern, "' matches ",
                 shards_.size());
    // Shards may move (another directory), but their contents' sizes must not change.
    for (size_t i = 0; i < shards_.size(); ++i)
      if (json_uint(files[i], "tokens", "loader state: shard") != shards_[i].size())
        fail_input("loader state: shard ", i, " (", files[i].at("path").get<std::string>(), ") had ",
                   files[i].at("tokens").get<uint64_t>(), " tokens, ", shards_[i].path(), " has ",
                   shards_[i].size());
    const uint64_t pos = json_uint(s, "rows", "loader state");
    if (pos > epoch_rows_)
      fail_input("loader state: row ", pos, " is past the end of an epoch (", epoch_rows_, " rows)");
    epoch_ = json_uint(s, "epoch", "loader state");
    pos_ = pos;
    order_ = Permutation(rows_, epoch_seed(opt_.seed, epoch_));
  } catch (const nlohmann::json::exception& e) {
    fail_input("loader state is malformed: ", e.what());
  }
}

}  // namespace flashgpt
