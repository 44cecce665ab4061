// TimedOps: an Ops decorator that times every call of the wrapped CUDA op set with CUDA
// events on the context's main stream, aggregated per op kind (matmuls also per shape),
// for the per-op breakdown of the training-step benchmark, with each call's work
// (kernels/op_work.h) so that the table can say how close each op comes to its ceiling.
// The model needs no hook: it runs on a TimedOps exactly as on the plain op set. Events
// come from a pool created up front (nothing is allocated per call); collect() waits for
// the stream once per step.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>
#include "kernels/ops.h"

namespace flashgpt {
class DeviceContext;

struct OpTime {
  double ms = 0;      // total over the collected steps
  int64_t calls = 0;
  double flops = 0, bytes = 0;  // total work of those calls (kernels/op_work.h)
};

// The ceilings an op's speed is compared with, measured in the same run: the dense bf16
// GEMM rate and the device-to-device copy bandwidth ((read + written) / time). An op
// whose FLOPs per byte reach the ridge point (gemm / copy) is held to the GEMM rate, any
// other to the copy bandwidth (the roofline model).
struct Roofline {
  double gemm_tflops = 0, copy_tbs = 0;
};

class TimedOps;
// Measures the two ceilings on the context's GPU (a 2 GiB device copy and an 8192³ bf16
// matmul through `ops`, CUDA events, median of 5 after 2 warm-ups); needs ~2.4 GiB free.
Roofline measure_roofline(Ops& ops, DeviceContext& ctx);

// `inner` must outlive the returned object. max_calls: calls per collect() period.
std::unique_ptr<TimedOps> make_timed_ops(Ops& inner, DeviceContext& ctx, int max_calls = 8192);

class TimedOps : public Ops {
 public:
  // Waits for the recorded calls, adds their times into totals(); starts a new period.
  virtual void collect() = 0;
  virtual void reset() = 0;  // forgets the totals
  virtual void set_enabled(bool on) = 0;  // off: calls are forwarded untimed
  virtual const std::map<std::string, OpTime>& totals() const = 0;
  // A table: one line per op kind, sorted by time, with ms per step, share, achieved
  // TFLOP/s and TB/s and the share of its roofline ceiling (when roof is measured); then
  // the sum of op times against step_ms (the rest is launch gaps and host work).
  std::string report(int steps, const Roofline& roof = {}, double step_ms = 0) const;
};

}  // namespace flashgpt
