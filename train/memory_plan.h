// The memory plan of a training run: every block of device memory the run allocates,
// computed from the config alone (no GPU needed). The model's arenas come from the
// model's own allocation code (GPT2::memory), the rest from the sizes that AdamW and
// the op sets allocate. `flashgpt memory` prints it; `train`, `bench train` and
// `memory --measure` compare it with the free device memory before allocating anything
// (check_memory_fits) and stop with a clear message instead of a failed cudaMalloc.
#pragma once
#include <string>
#include <vector>
#include "src/config.h"
#include "src/tensor.h"

namespace flashgpt {

struct Backend;

struct MemoryLine {
  std::string group;  // parameters | gradients | optimizer | activations | op scratch | workspace
  std::string name;   // e.g. "QKV", "AdamW m, v (fp32)"
  size_t bytes = 0;
};

struct MemoryPlan {
  // The run the plan is for.
  int B = 0, T = 0;
  std::string attention, recompute, position;
  Device device = Device::cuda;
  DType dtype = DType::bf16;
  int world = 1, zero = 0;
  size_t num_params = 0;         // parameter arena elements (what AdamW updates)
  std::vector<MemoryLine> lines;
  size_t activation_bytes = 0;   // the model's activation arena
  size_t total = 0;              // sum of the lines

  size_t group_bytes(const std::string& group) const;
  double activation_bytes_per_token() const { return double(activation_bytes) / (double(B) * T); }
};

struct PlanTarget {
  Device device = Device::cuda;
  DType dtype = DType::bf16;
  int world = 1;  // data-parallel ranks
  int zero = 0;   // 1: ZeRO-1, the fp32 master weights and AdamW m, v sharded over the ranks
};

// The plan for c's model at c.train.batch_size × c.train.seq_len, with c.model.attention,
// c.model.position and c.train.recompute.
MemoryPlan plan_memory(const Config& c, const PlanTarget& target);

// What a GPU run keeps free beyond the plan: the allocator's 2 MiB rounding of each
// allocation, and cuBLASLt's and CUB's own small buffers.
constexpr size_t kPreflightMarginBytes = size_t(512) << 20;

// Pre-flight, before anything is allocated: throws InputError (exit 2) when plan + margin
// exceeds the free device memory, naming the cheapest setting that fits:
//   "needs 142.3 GiB, the GPU has 139.8 GiB free; train.recompute=block would need 61.2 GiB"
// On the CPU the room is the host's available memory (MemAvailable) shared by the
// local_world ranks on this host ("this process may use 11.2 GiB of the host's available
// memory"): without it a run too large for the host died by the kernel's OOM killer or a
// std::bad_alloc part-way through allocating.
void check_memory_fits(const Config& c, const Backend& be, int world, int zero, int local_world);
// The sentence above, or "" when plan + margin fits in free_bytes (testable without a GPU).
std::string memory_shortfall(const Config& c, const PlanTarget& target, size_t free_bytes);
// The host memory a new allocation can take without swapping (/proc/meminfo's
// MemAvailable), or 0 where the kernel does not say.
size_t host_memory_available();

std::string gib(double bytes);  // "142.3 GiB"

}  // namespace flashgpt
