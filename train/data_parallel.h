// Data parallelism for one model (the trainer owns it; the model knows nothing of it).
//
// Every rank holds the whole model and computes gradients on its own rows of each
// global batch. Gradients are summed over ranks one *bucket* at a time — a bucket is
// one layer's contiguous range of the gradient arena — as soon as backward() reports
// the layer final (GPT2::on_grads_ready), on the communication stream, while backward
// goes on with the layers below. The loss is scaled by 1/(ranks·accumulation) before
// backward, so these sums are the gradient of the global mean loss.
//
//   zero 0: all-reduce each bucket; every rank updates the whole model.
//   zero 1: reduce-scatter each bucket; rank r owns the r-th 1/N of every bucket, keeps
//           AdamW state (fp32 master, m, v) for that shard only (optimizer memory / N),
//           updates it, and the updated weights are all-gathered bucket by bucket.
// A plain process (no mpirun) runs the single-GPU step without any of it.
#pragma once
#include <string>
#include <vector>
#include "layers/gpt2.h"
#include "optim/adamw.h"
#include "train/comm.h"

namespace flashgpt {

class DataParallel {
 public:
  // The arena alignment the model must be built with (GPT2's layer_align), so that each
  // bucket splits into `world` equal, 256-byte aligned shards.
  static size_t layer_align(int world) { return size_t(64) * size_t(world); }

  // Registers the gradient hook on `model`; zero: 0 or 1.
  DataParallel(GPT2& model, Communicator& comm, int zero);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // The arena ranges this rank's optimizer owns (pass to AdamW); empty: all of it.
  std::vector<Range> owned() const;
  int zero() const { return zero_; }
  bool active() const { return active_; }  // launched by mpirun: the collectives run
  Communicator& comm() { return comm_; }

  // Call before each micro-batch's backward(): on the last micro-batch of a step the
  // buckets are reduced as backward finishes them; earlier ones only accumulate.
  void set_last_micro_batch(bool last) { reducing_ = last; }
  // After the last backward(): waits for every bucket (the compute stream, not the host).
  void finish_gradients();
  // Global L2 norm of the summed gradients (the same value on every rank).
  double grad_norm(AdamW& opt);
  // After the optimizer step: every rank gets the updated weights (ZeRO-1 all-gather).
  void sync_weights();
  // Every rank gets rank 0's weights (at the start of a run and after a resume).
  void broadcast_weights();

  // Checkpoints: the AdamW state as the files hold it, tensor k of state_count(opt) (m,
  // v, then the fp32 master if the run keeps one) in host memory, laid out like the
  // model's arena whatever the sharding, one tensor at a time. Both are collective (every
  // rank calls them, for k = 0, 1, ... in turn) and use the gradient arena as scratch
  // (left zero), so they belong between steps (after the update, before zero_grad()).
  // gather_state fills `host` on rank 0 (nullptr elsewhere); scatter_state reads it on
  // rank 0 (nullptr elsewhere).
  static int state_count(const AdamW& opt);
  void gather_state(AdamW& opt, int k, std::string* host);
  void scatter_state(AdamW& opt, int k, const std::string* host);

  // Bytes summed per step, and the buckets (for logs and benchmarks).
  size_t bucket_count() const { return buckets_.size(); }

 private:
  void on_layer_ready(int layer);
  static Tensor state_tensor(AdamW& opt, int k);

  GPT2& model_;
  Communicator& comm_;
  int zero_;
  bool active_;                  // a real communicator (under mpirun), even with one rank
  bool sharded_;                 // zero 1 and active
  bool reducing_ = false;
  std::vector<Range> buckets_;   // layer l's arena range at [l + 1]
};

}  // namespace flashgpt
