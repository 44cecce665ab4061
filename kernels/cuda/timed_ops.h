// TimedOps: an Ops decorator that times every call of the wrapped CUDA op set with CUDA
// events on the context's main stream, aggregated per op kind (matmuls also per shape),
// for the per-op breakdown of the training-step benchmark. The model needs no hook: it
// runs on a TimedOps exactly as on the plain op set. Events come from a pool created up
// front (nothing is allocated per call); collect() waits for the stream once per step.
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
};

class TimedOps;
// `inner` must outlive the returned object. max_calls: calls per collect() period.
std::unique_ptr<TimedOps> make_timed_ops(Ops& inner, DeviceContext& ctx, int max_calls = 8192);

class TimedOps : public Ops {
 public:
  // Waits for the recorded calls, adds their times into totals(); starts a new period.
  virtual void collect() = 0;
  virtual void reset() = 0;  // forgets the totals
  virtual void set_enabled(bool on) = 0;  // off: calls are forwarded untimed
  virtual const std::map<std::string, OpTime>& totals() const = 0;
  // A table: one line per op kind, sorted by time, with ms per step and share.
  std::string report(int steps) const;
};

}  // namespace flashgpt
