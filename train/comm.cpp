// The single-process and MPI communicators (see comm.h).
#include "train/comm.h"
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <unistd.h>
#include "src/errors.h"
#ifdef FLASHGPT_WITH_MPI
#include <mpi.h>
#endif

namespace flashgpt {

double Communicator::sum(double x) {
  double s = 0;
  for (double v : all_gather_host({x})) s += v;  // rank order: the same bits everywhere
  return s;
}

double Communicator::max(double x) {
  double m = x;
  for (double v : all_gather_host({x})) m = std::max(m, v);
  return m;
}

double comm_timeout_seconds() {
  const char* s = std::getenv("FLASHGPT_COMM_TIMEOUT");
  if (!s || !*s) return 600.0;
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (*end != '\0' || !(v > 0)) fail_input("FLASHGPT_COMM_TIMEOUT must be a positive number of seconds, got '", s, "'");
  return v;
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

namespace {

[[noreturn]] void flush_and_exit(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}

class SingleProcess final : public Communicator {
 public:
  const char* name() const override { return "single"; }
  void all_reduce_sum(Tensor) override {}
  void reduce_scatter_sum(Tensor) override {}
  void all_gather(Tensor) override {}
  void broadcast(Tensor, int) override {}
  void wait() override {}
  std::vector<double> all_gather_host(const std::vector<double>& x) override { return x; }
  std::string broadcast_string(const std::string& s, int) override { return s; }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { flush_and_exit(code); }
};

#ifdef FLASHGPT_WITH_MPI

#define MPI_CHECK(call)                                                                \
  do {                                                                                 \
    int rc_ = (call);                                                                  \
    if (rc_ != MPI_SUCCESS) {                                                          \
      char msg_[MPI_MAX_ERROR_STRING];                                                 \
      int len_ = 0;                                                                    \
      MPI_Error_string(rc_, msg_, &len_);                                              \
      ::flashgpt::fail(__FILE__, ":", __LINE__, ": ", #call, " failed: ", std::string(msg_, size_t(len_))); \
    }                                                                                  \
  } while (0)

// MPI's counts are int: collectives of more elements go in pieces where the operation
// allows it (all-reduce, broadcast) and are refused where it does not.
constexpr int64_t kMaxCount = int64_t(1) << 30;

class Mpi final : public Communicator {
 public:
  Mpi() {
    int initialized = 0;
    MPI_CHECK(MPI_Initialized(&initialized));
    if (!initialized) {
      int provided = 0;
      MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
      owns_init_ = true;
    }
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &world_));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
    MPI_CHECK(MPI_Comm_size(node, &local_world_));
    MPI_CHECK(MPI_Comm_free(&node));
  }
  ~Mpi() override {
    // While an exception unwinds, the other ranks may be inside a collective: only
    // abort() may end the job then, and MPI_Finalize would wait for them forever.
    if (std::uncaught_exceptions() > 0) return;
    MPI_Comm_free(&comm_);
    if (owns_init_) MPI_Finalize();
  }
  const char* name() const override { return "mpi"; }

  void all_reduce_sum(Tensor t) override {
    check(t, true);
    char* p = static_cast<char*>(t.data);
    for (int64_t i = 0; i < t.numel(); i += kMaxCount) {
      const int n = int(std::min(kMaxCount, t.numel() - i));
      MPI_Request r;
      MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, p + i * int64_t(dtype_size(t.dtype)), n, type(t), MPI_SUM, comm_, &r));
      pending_.push_back(r);
    }
  }
  void reduce_scatter_sum(Tensor t) override {
    check(t, true);
    const int64_t n = part(t);
    MPI_Request r;
    // In place, MPI leaves the result at the start of the buffer: wait() moves it to part r.
    MPI_CHECK(MPI_Ireduce_scatter_block(MPI_IN_PLACE, t.data, int(n), type(t), MPI_SUM, comm_, &r));
    pending_.push_back(r);
    const size_t bytes = size_t(n) * dtype_size(t.dtype);
    char* base = static_cast<char*>(t.data);
    const int rank = rank_;
    if (rank != 0) after_.push_back([=] { std::memmove(base + size_t(rank) * bytes, base, bytes); });
  }
  void all_gather(Tensor t) override {
    check(t, false);
    const int64_t n = part(t);
    MPI_Request r;
    MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, t.data, int(n), type(t), comm_, &r));
    pending_.push_back(r);
  }
  void broadcast(Tensor t, int root) override {
    check(t, false);
    char* p = static_cast<char*>(t.data);
    for (int64_t i = 0; i < t.numel(); i += kMaxCount) {
      const int n = int(std::min(kMaxCount, t.numel() - i));
      MPI_Request r;
      MPI_CHECK(MPI_Ibcast(p + i * int64_t(dtype_size(t.dtype)), n, type(t), root, comm_, &r));
      pending_.push_back(r);
    }
  }
  void wait() override {
    if (!pending_.empty())
      MPI_CHECK(MPI_Waitall(int(pending_.size()), pending_.data(), MPI_STATUSES_IGNORE));
    pending_.clear();
    for (auto& f : after_) f();
    after_.clear();
  }

  std::vector<double> all_gather_host(const std::vector<double>& x) override {
    std::vector<double> all(static_cast<size_t>(world_) * x.size(), 0.0);
    MPI_CHECK(MPI_Allgather(x.data(), int(x.size()), MPI_DOUBLE, all.data(), int(x.size()), MPI_DOUBLE, comm_));
    return all;
  }
  std::string broadcast_string(const std::string& s, int root) override {
    long long n = (long long)s.size();
    MPI_CHECK(MPI_Bcast(&n, 1, MPI_LONG_LONG, root, comm_));
    FG_ASSERT(n <= INT_MAX, "broadcast_string: ", n, " bytes is more than one MPI message");
    std::string out = rank_ == root ? s : std::string(size_t(n), '\0');
    MPI_CHECK(MPI_Bcast(out.data(), int(n), MPI_CHAR, root, comm_));
    return out;
  }
  void barrier() override { MPI_CHECK(MPI_Barrier(comm_)); }
  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    flush_and_exit(code);  // MPI_Abort does not return; in case it does
  }

 private:
  static MPI_Datatype type(const Tensor& t) {
    switch (t.dtype) {
      case DType::f32: return MPI_FLOAT;
      case DType::f64: return MPI_DOUBLE;
      case DType::bf16: return MPI_UINT16_T;  // moved, never added
      case DType::i32: return MPI_INT32_T;
    }
    fail("mpi communicator: unsupported dtype");
  }
  void check(const Tensor& t, bool reduce) const {
    FG_ASSERT(t.device == Device::cpu, "the MPI communicator takes host tensors");
    if (reduce) FG_ASSERT(t.dtype == DType::f32 || t.dtype == DType::f64, "MPI sums take fp32 or fp64 tensors");
  }
  int64_t part(const Tensor& t) const {
    FG_ASSERT(t.numel() % world_ == 0, "tensor of ", t.numel(), " elements does not split into ", world_, " parts");
    const int64_t n = t.numel() / world_;
    FG_ASSERT(n <= INT_MAX, "a part of ", n, " elements is more than one MPI message");
    return n;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owns_init_ = false;
  std::vector<MPI_Request> pending_;
  std::vector<std::function<void()>> after_;
};

#endif  // FLASHGPT_WITH_MPI

}  // namespace

std::unique_ptr<Communicator> make_host_communicator() {
  if (!launched_by_mpi()) return std::make_unique<SingleProcess>();
#ifdef FLASHGPT_WITH_MPI
  return std::make_unique<Mpi>();
#else
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* s = std::getenv(v); s && std::atoi(s) > 1)
      fail_input("started by an MPI launcher with ", s, " processes, but this flashgpt was built without MPI "
                 "(install libopenmpi-dev and rebuild, or run without mpirun)");
  return std::make_unique<SingleProcess>();
#endif
}

}  // namespace flashgpt
