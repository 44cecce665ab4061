// `flashgpt bench comm`: bus bandwidth of the communicator's collectives (under mpirun:
// NCCL between GPUs, or MPI between CPU processes), like nccl-tests: for each size the
// median time of N in-place operations after warm-up, the algorithm bandwidth
// (bytes / time) and the bus bandwidth (what each link carries: ×2(N−1)/N for an
// all-reduce, ×(N−1)/N for reduce-scatter and all-gather).
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <vector>
#include "src/commands.h"
#include "train/backend.h"
#include "train/comm.h"

namespace flashgpt {
namespace {

struct BenchCommOptions {
  std::vector<double> mib = {1, 4, 16, 64, 256, 1024};
  int warmup = 5, iters = 20;
  std::string device = "auto";
};

void run_bench_comm(const BenchCommOptions& o, Communicator& host) {
  Backend be = make_backend(o.device, "fp32", host.local_rank(), host.local_world());
  std::unique_ptr<Communicator> device_comm = make_device_communicator(be, host);
  Communicator& comm = device_comm ? *device_comm : host;
  const int n = comm.world();
  // One rank moves nothing: its "bandwidths" would be the cost of an empty call.
  if (n < 2) fail_input("bench comm needs 2 or more ranks: launch it with mpirun -np N (N >= 2)");
  if (comm.rank() == 0)
    std::printf("bench comm: %d rank(s), %s communicator, fp32, in place, median of %d after %d warm-up\n"
                "%-15s %10s %10s %12s %12s\n", n, comm.name(), o.iters, o.warmup, "collective", "MiB", "time ms",
                "algbw GB/s", "busbw GB/s");
  for (double mib : o.mib) {
    const int64_t elems = std::max<int64_t>(n, int64_t(mib * double(1 << 20) / 4) / n * n);
    void* mem = be.ops->alloc(size_t(elems) * 4);
    Tensor t(mem, DType::f32, be.ops->device(), {elems});
    be.ops->memset_zero(t);
    struct Op { const char* name; double bus_factor; void (*run)(Communicator&, Tensor); };
    const Op ops[] = {
        {"all_reduce", 2.0 * (n - 1) / n, [](Communicator& c, Tensor x) { c.all_reduce_sum(x); }},
        {"reduce_scatter", double(n - 1) / n, [](Communicator& c, Tensor x) { c.reduce_scatter_sum(x); }},
        {"all_gather", double(n - 1) / n, [](Communicator& c, Tensor x) { c.all_gather(x); }},
    };
    for (const Op& op : ops) {
      std::vector<double> ms;
      for (int i = 0; i < o.warmup + o.iters; ++i) {
        comm.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        op.run(comm, t);
        comm.wait();
        be.ops->synchronize();
        if (i >= o.warmup) ms.push_back(1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(ms.begin(), ms.end());
      const double med = comm.max(ms[ms.size() / 2]);
      const double algbw = double(t.nbytes()) / (med * 1e-3) / 1e9;
      if (comm.rank() == 0)
        std::printf("%-15s %10.1f %10.3f %12.1f %12.1f\n", op.name, double(t.nbytes()) / double(1 << 20), med, algbw,
                    algbw * op.bus_factor);
    }
    be.ops->free(mem);
  }
}

}  // namespace

void add_bench_comm_command(CLI::App& bench) {
  auto o = std::make_shared<BenchCommOptions>();
  auto* cmd = bench.add_subcommand("comm", "Bus bandwidth of all-reduce, reduce-scatter, all-gather (run under mpirun)");
  cmd->add_option("--mib", o->mib, "Tensor sizes in MiB")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Untimed runs per size")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--iters", o->iters, "Timed runs per size (median)")->capture_default_str()->check(CLI::Range(1, INT_MAX));
  cmd->add_option("--device", o->device, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->callback([o] {
    auto comm = make_host_communicator();
    on_every_rank(*comm, [&] { run_bench_comm(*o, *comm); });
  });
}

}  // namespace flashgpt
