// The NCCL communicator (see train/comm.h): collectives over GPU buffers on the
// context's communication stream, each ordered after the work already queued on the
// compute stream by an event, so communication overlaps with whatever the compute
// stream does next. Host operations (scalars, strings, abort) go to the MPI communicator
// that bootstrapped it.
#include <nccl.h>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>
#include "src/cuda/cuda_check.h"
#include "src/cuda/device_context.h"
#include "train/comm.h"

#define NCCL_CHECK(call)                                                               \
  do {                                                                                 \
    ncclResult_t fg_nr_ = (call);                                                      \
    if (fg_nr_ != ncclSuccess)                                                         \
      ::flashgpt::fail(__FILE__, ":", __LINE__, ": ", #call, " failed: ",              \
                       ncclGetErrorString(fg_nr_), " (", ncclGetLastError(nullptr), ")"); \
  } while (0)

namespace flashgpt {
namespace {

class Nccl final : public Communicator {
 public:
  Nccl(Communicator& host, DeviceContext& ctx) : host_(host), ctx_(ctx) {
    rank_ = host.rank();
    world_ = host.world();
    local_rank_ = host.local_rank();
    local_world_ = host.local_world();
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    const std::string s = host.broadcast_string(std::string(reinterpret_cast<const char*>(&id), sizeof id), 0);
    std::memcpy(&id, s.data(), sizeof id);
    CUDA_CHECK(cudaSetDevice(ctx.device()));
    NCCL_CHECK(ncclCommInitRank(&comm_, world_, id, rank_));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~Nccl() override {
    // Unwinding after a failure: peers may never join the queued collectives, so
    // abort them (never wait); abort() of the host communicator then ends the job.
    if (std::uncaught_exceptions() > 0) ncclCommAbort(comm_);
    else {
      ncclCommFinalize(comm_);
      ncclCommDestroy(comm_);
    }
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  const char* name() const override { return "nccl"; }

  void all_reduce_sum(Tensor t) override {
    check(t, true);
    Timed timed(*this, "all_reduce", t.nbytes());
    NCCL_CHECK(ncclAllReduce(t.data, t.data, size_t(t.numel()), type(t), ncclSum, comm_, ctx_.comm_stream()));
  }
  void reduce_scatter_sum(Tensor t) override {
    check(t, true);
    const size_t n = part(t);
    Timed timed(*this, "reduce_scatter", t.nbytes());
    NCCL_CHECK(ncclReduceScatter(t.data, at(t, n * size_t(rank_)), n, type(t), ncclSum, comm_, ctx_.comm_stream()));
  }
  void all_gather(Tensor t) override {
    check(t, false);
    const size_t n = part(t);
    Timed timed(*this, "all_gather", t.nbytes());
    NCCL_CHECK(ncclAllGather(at(t, n * size_t(rank_)), t.data, n, type(t), comm_, ctx_.comm_stream()));
  }
  void broadcast(Tensor t, int root) override {
    check(t, false);
    Timed timed(*this, "broadcast", t.nbytes());
    NCCL_CHECK(ncclBroadcast(t.data, t.data, size_t(t.numel()), type(t), root, comm_, ctx_.comm_stream()));
  }
  // The host polls (instead of blocking in the CUDA runtime) so that an NCCL error or a
  // peer that never arrives ends the job with a message instead of hanging it.
  void wait() override {
    cudaEvent_t reached = nullptr;
    if (profiling_) CUDA_CHECK(cudaEventRecord(reached = event(), ctx_.main_stream()));
    CUDA_CHECK(cudaEventRecord(done_, ctx_.comm_stream()));
    const auto start = std::chrono::steady_clock::now();
    const double timeout = comm_timeout_seconds();
    for (int spins = 0;; ++spins) {
      cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) CUDA_CHECK(q);
      ncclResult_t async = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress)
        fail("NCCL reported an asynchronous error on rank ", rank_, ": ", ncclGetErrorString(async), " (",
             ncclGetLastError(comm_), ")");
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout)
        fail("rank ", rank_, ": NCCL collectives did not finish within ", timeout,
             " s (FLASHGPT_COMM_TIMEOUT); a peer is stuck or gone");
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    CUDA_CHECK(cudaStreamWaitEvent(ctx_.main_stream(), done_, 0));
    if (profiling_) close_window(reached);
  }

  void set_profiling(bool on) override { profiling_ = on; }
  std::vector<Window> take_profile() override { return std::exchange(windows_, {}); }

  std::vector<double> all_gather_host(const std::vector<double>& x) override { return host_.all_gather_host(x); }
  std::string broadcast_string(const std::string& s, int root) override { return host_.broadcast_string(s, root); }
  void barrier() override { host_.barrier(); }
  [[noreturn]] void abort(int code) override {
    ncclCommAbort(comm_);
    host_.abort(code);
    std::_Exit(code);  // not reached: the host communicator's abort does not return
  }

 private:
  struct Pending {
    const char* op;
    size_t bytes;
    cudaEvent_t ready, start, end;
  };
  // Orders a collective after the compute stream's queued work; with profiling on, also
  // brackets it with events (ready on the compute stream, start/end on the comm stream).
  struct Timed {
    Nccl& c;
    Pending p;
    Timed(Nccl& comm, const char* op, size_t bytes) : c(comm) {
      cudaEvent_t ready = c.profiling_ ? c.event() : c.ready_;
      CUDA_CHECK(cudaEventRecord(ready, c.ctx_.main_stream()));
      CUDA_CHECK(cudaStreamWaitEvent(c.ctx_.comm_stream(), ready, 0));
      if (!c.profiling_) return;
      p = {op, bytes, ready, c.event(), c.event()};
      CUDA_CHECK(cudaEventRecord(p.start, c.ctx_.comm_stream()));
    }
    ~Timed() noexcept(false) {
      if (!c.profiling_ || std::uncaught_exceptions() > 0) return;
      CUDA_CHECK(cudaEventRecord(p.end, c.ctx_.comm_stream()));
      c.pending_.push_back(p);
    }
  };
  // Events for profiling come from a pool that is reused window after window.
  cudaEvent_t event() {
    if (next_event_ == events_.size()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    return events_[next_event_++];
  }
  void close_window(cudaEvent_t reached) {  // all events have completed (wait() polled done_)
    Window w;
    if (!pending_.empty()) {
      cudaEvent_t t0 = pending_.front().ready;
      auto ms = [&](cudaEvent_t e) { float v = 0; CUDA_CHECK(cudaEventElapsedTime(&v, t0, e)); return double(v); };
      for (const Pending& p : pending_) w.ops.push_back({p.op, p.bytes, ms(p.ready), ms(p.start), ms(p.end)});
      w.wait_ms = ms(reached);
      windows_.push_back(std::move(w));
    }
    pending_.clear();
    next_event_ = 0;
  }
  static ncclDataType_t type(const Tensor& t) {
    switch (t.dtype) {
      case DType::f32: return ncclFloat32;
      case DType::f64: return ncclFloat64;
      case DType::bf16: return ncclBfloat16;
      case DType::i32: return ncclInt32;
    }
    fail("nccl communicator: unsupported dtype");
  }
  static void check(const Tensor& t, bool reduce) {
    FG_ASSERT(t.device == Device::cuda, "the NCCL communicator takes GPU tensors");
    if (reduce) FG_ASSERT(t.dtype == DType::f32 || t.dtype == DType::f64, "NCCL sums here take fp32 or fp64 tensors");
  }
  size_t part(const Tensor& t) const {
    FG_ASSERT(t.numel() % world_ == 0, "tensor of ", t.numel(), " elements does not split into ", world_, " parts");
    return size_t(t.numel() / world_);
  }
  static void* at(const Tensor& t, size_t elems) { return static_cast<char*>(t.data) + elems * dtype_size(t.dtype); }

  Communicator& host_;
  DeviceContext& ctx_;
  ncclComm_t comm_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  bool profiling_ = false;
  std::vector<cudaEvent_t> events_;
  size_t next_event_ = 0;
  std::vector<Pending> pending_;
  std::vector<Window> windows_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, DeviceContext& ctx) {
  return std::make_unique<Nccl>(host, ctx);
}

}  // namespace flashgpt
