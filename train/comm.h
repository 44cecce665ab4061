// The communicator: what data-parallel training needs from "the other ranks".
// Three implementations behind one interface:
//   single  world 1, every operation is the identity; no MPI at run time.
//   mpi     host (CPU) buffers through MPI: the CPU backend's distributed path, and the
//           host side (scalars, strings, barrier, abort) of the NCCL communicator.
//   nccl    GPU buffers through NCCL on the context's communication stream; bootstrapped
//           by the MPI communicator (rank 0's ncclUniqueId is broadcast over MPI).
// Under mpirun (or any launcher that sets OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK)
// make_host_communicator() initialises MPI; otherwise the process is world 1.
#pragma once
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>
#include "src/errors.h"
#include "src/tensor.h"

namespace flashgpt {

class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int world() const { return world_; }
  int local_rank() const { return local_rank_; }  // rank among the processes of this node
  int local_world() const { return local_world_; }
  virtual const char* name() const = 0;

  // ---- tensors on this communicator's device; in place; sums are over all ranks ----
  // Queued: each starts after everything the caller has already issued on the compute
  // stream (on the CPU: at once) and may still run when the call returns. The tensors
  // must not be touched until wait().
  virtual void all_reduce_sum(Tensor t) = 0;
  // t has world·n elements; afterwards part r = t[r·n, (r+1)·n) on rank r holds the sum
  // of part r over all ranks (the other parts are undefined).
  virtual void reduce_scatter_sum(Tensor t) = 0;
  // t has world·n elements; afterwards every rank holds every rank's own part r.
  virtual void all_gather(Tensor t) = 0;
  virtual void broadcast(Tensor t, int root) = 0;
  // Everything queued is complete and visible to the compute stream's next work. NCCL:
  // the host polls until the collectives are done (so that NCCL errors and a stuck peer
  // are detected here, with FLASHGPT_COMM_TIMEOUT), then orders the compute stream after
  // them; the trainer calls it where the host waits for the GPU anyway. MPI: waits.
  virtual void wait() = 0;

  // ---- host values; blocking, every rank must call ----
  // x (n values, the same n on every rank) of every rank, rank after rank: world·n values
  // in rank order, so a sum over them is the same on every rank.
  virtual std::vector<double> all_gather_host(const std::vector<double>& x) = 0;
  virtual std::string broadcast_string(const std::string& s, int root) = 0;
  virtual void barrier() = 0;
  // Ends every process of the job now with exit status `code`, without waiting for
  // anything (used when one rank fails: the others may be blocked in a collective).
  [[noreturn]] virtual void abort(int code) = 0;

  // ---- timing (NCCL only; others return nothing) ----
  // While on, every collective records when the compute stream released it (ready),
  // when it ran on the communication stream (start, end), and each wait() records when
  // the compute stream reached it: the end of backward, for the gradient buckets.
  // Times are ms since the window's first `ready`; a window ends at each wait().
  struct OpTime {
    std::string op;    // all_reduce, reduce_scatter, all_gather, broadcast
    size_t bytes = 0;  // of the whole tensor
    double ready_ms = 0, start_ms = 0, end_ms = 0;
  };
  struct Window {
    std::vector<OpTime> ops;
    double wait_ms = 0;  // the compute stream reached wait()
  };
  virtual void set_profiling(bool on) {}
  virtual std::vector<Window> take_profile() { return {}; }

  // Helpers over all_gather_host: the same bits on every rank.
  double sum(double x);
  double mean(double x) { return sum(x) / world_; }
  double max(double x);
  double min(double x) { return -max(-x); }

 protected:
  int rank_ = 0, world_ = 1, local_rank_ = 0, local_world_ = 1;
};

// True when a launcher (mpirun, mpiexec, srun with PMI) started this process.
bool launched_by_mpi();
// single (world 1), or mpi under a launcher. InputError when launched by a launcher but
// built without MPI.
std::unique_ptr<Communicator> make_host_communicator();

#ifdef FLASHGPT_WITH_CUDA
class DeviceContext;
// NCCL over GPU buffers of `ctx` (collectives on ctx.comm_stream(), ordered after
// ctx.main_stream()), host operations through `host`, which must outlive it.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, DeviceContext& ctx);
#endif

// Runs `body` on this rank. With several ranks a failure must end the whole job: the
// other ranks may be blocked in a collective that this rank will never join. So the
// failing rank prints its message (naming itself) and aborts every process, with exit
// status 2 for bad input and 1 otherwise. With one rank, exceptions propagate.
template <class F>
void on_every_rank(Communicator& comm, F body) {
  if (comm.world() == 1) return body();
  try {
    body();
  } catch (const InputError& e) {
    std::fprintf(stderr, "error: [rank %d of %d] %s\n", comm.rank(), comm.world(), e.what());
    comm.abort(2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fatal: [rank %d of %d] %s\n", comm.rank(), comm.world(), e.what());
    comm.abort(1);
  }
}

// Seconds a wait() may take before the job is declared stuck (FLASHGPT_COMM_TIMEOUT, default 600).
double comm_timeout_seconds();

}  // namespace flashgpt
