#include "train/data_parallel.h"
#include <cmath>
#include <string>
#include "src/errors.h"

namespace flashgpt {

namespace {
Tensor slice(const Tensor& flat, const Range& r) { return flat.rows(int64_t(r.begin), int64_t(r.end)); }
}  // namespace

DataParallel::DataParallel(GPT2& model, Communicator& comm, int zero)
    : model_(model),
      comm_(comm),
      zero_(zero),
      // Under mpirun the communicator runs even with one rank, so that path is testable
      // on one GPU; a plain process (the "single" communicator) skips it.
      active_(std::string(comm.name()) != "single"),
      sharded_(zero == 1 && active_) {
  FG_ASSERT(zero == 0 || zero == 1, "zero must be 0 or 1");
  for (int l = -1; l <= model.config().n_layer; ++l) {
    auto [b, e] = model.layer_range(l);
    FG_ASSERT((e - b) % layer_align(comm.world()) == 0, "layer ", l, "'s range [", b, ", ", e,
              ") does not split into ", comm.world(), " aligned shards: build the model with layer_align ",
              layer_align(comm.world()));
    buckets_.push_back({b, e});
  }
  model.on_grads_ready([this](int layer) { on_layer_ready(layer); });
}

DataParallel::~DataParallel() { model_.on_grads_ready(nullptr); }

std::vector<Range> DataParallel::owned() const {
  if (!sharded_) return {};
  std::vector<Range> out;
  const size_t r = size_t(comm_.rank()), n = size_t(comm_.world());
  for (const Range& b : buckets_) {
    const size_t part = b.size() / n;
    out.push_back({b.begin + r * part, b.begin + (r + 1) * part});
  }
  return out;
}

void DataParallel::on_layer_ready(int layer) {
  if (!reducing_ || !active_) return;
  Tensor g = slice(model_.grads(), buckets_[size_t(layer + 1)]);
  if (sharded_) comm_.reduce_scatter_sum(g);
  else comm_.all_reduce_sum(g);
}

void DataParallel::finish_gradients() {
  comm_.wait();
  reducing_ = false;
}

double DataParallel::grad_norm(AdamW& opt) {
  double ss = opt.grad_sum_squares();
  if (sharded_) ss = comm_.sum(ss);  // each rank holds its shard's sums; zero 0: every rank has all
  return std::sqrt(ss);
}

void DataParallel::sync_weights() {
  if (!sharded_) return;
  for (const Range& b : buckets_) comm_.all_gather(slice(model_.params(), b));
  comm_.wait();
}

void DataParallel::broadcast_weights() {
  if (!active_) return;
  comm_.broadcast(model_.params(), 0);
  comm_.wait();
}

int DataParallel::state_count(const AdamW& opt) { return opt.master().defined() ? 3 : 2; }

Tensor DataParallel::state_tensor(AdamW& opt, int k) {
  FG_ASSERT(k >= 0 && k < state_count(opt), "optimizer state tensor ", k, " of ", state_count(opt));
  return k == 0 ? opt.m() : k == 1 ? opt.v() : opt.master();
}

void DataParallel::gather_state(AdamW& opt, int k, std::string* host) {
  Ops& ops = model_.ops();
  const Tensor scratch = model_.grads();
  const Tensor state = state_tensor(opt, k);
  FG_ASSERT(scratch.dtype == state.dtype, "optimizer state and gradients differ in dtype");
  const std::vector<Range>& owned = opt.owned();
  for (size_t i = 0; i < owned.size(); ++i)
    ops.cast(slice(scratch, owned[i]),
             state.rows(int64_t(opt.state_offset(i)), int64_t(opt.state_offset(i) + owned[i].size())));
  if (sharded_) {
    for (const Range& b : buckets_) comm_.all_gather(slice(scratch, b));
    comm_.wait();
  }
  if (comm_.rank() == 0) {
    FG_ASSERT(host, "rank 0 receives the optimizer state");
    host->resize(scratch.nbytes());
    ops.to_host(host->data(), scratch);
  }
  ops.memset_zero(scratch);
}

void DataParallel::scatter_state(AdamW& opt, int k, const std::string* host) {
  Ops& ops = model_.ops();
  const Tensor scratch = model_.grads();
  const Tensor state = state_tensor(opt, k);
  if (comm_.rank() == 0) {
    FG_ASSERT(host && host->size() == scratch.nbytes(), "optimizer state tensor ", k, " has the wrong size");
    ops.from_host(scratch, host->data());
  }
  if (active_) {
    comm_.broadcast(scratch, 0);
    comm_.wait();
  }
  const std::vector<Range>& owned = opt.owned();
  for (size_t i = 0; i < owned.size(); ++i)
    ops.cast(state.rows(int64_t(opt.state_offset(i)), int64_t(opt.state_offset(i) + owned[i].size())),
             slice(scratch, owned[i]));
  ops.memset_zero(scratch);
}

}  // namespace flashgpt
