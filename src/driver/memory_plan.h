// The memory plan of a colocated rank: the device and host peak of every phase of the
// step for the chosen mode, predicted before the first handoff by replaying the handoff
// plans (the executor's own handoff_operations) over the pool's allocations, as laid out
// from the model and the deck. The start-up table prints it, the end-of-run table sets it
// beside the measured peaks (PhaseMemory), and a host peak above memory.host-limit stops
// the job before the first pinned host buffer is allocated.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "deck/deck_error.h"
#include "driver/handoff_plan.h"
#include "driver/phase_memory.h"
#include "tensor/memory_pool.h"

namespace tandem {

// Memory outside the pool when the plan is made: on the device, the CUDA context and
// libraries; on the host, the process's own resident set. Added to the pool's bytes to
// predict cudaMemGetInfo and the resident set.
struct MemoryBaseline {
  size_t device_other = 0, host_other = 0;
  size_t startup_staging = 0;  // host bytes start-up holds for a moment: the weights being loaded
  size_t checkpoint_snapshot = 0;  // host bytes every step may hold: the background checkpoint's snapshot
};
MemoryBaseline measure_baseline(const MemoryPool& pool);

struct PhasePrediction {
  std::string phase;  // startup, rollout, after_generate, train, before_sync
  PhasePeak peak;     // device_used = 0 on the CPU backend
};

// The pinned host buffers (capacities, in the order the handoffs would allocate them) that
// start-up fills into the pool's cache (MemoryPool::fill_host_cache), so that no handoff
// allocates one: those that fit beside the start-up staging without raising start-up's
// host peak, then the rest, once the staging is gone. Empty without the cache.
struct HostCacheFill {
  std::vector<size_t> beside_staging, after_staging;
};

class MemoryPlan {
 public:
  // Replays start-up (the start-up and first before-sync plans), then steps until the
  // pinned host cache is steady; the last step's phases are the prediction. With the
  // cache, the prediction is of a job that fills it as host_cache_fill() says.
  MemoryPlan(const std::vector<const Allocation*>& allocations, const HandoffConfig& config, Device device,
             bool pinned_host_cache, MemoryBaseline baseline);

  const std::vector<PhasePrediction>& phases() const { return phases_; }
  // The phase with the largest predicted resident set.
  const PhasePrediction& host_peak() const;
  // Bytes the copy transport's derived copies would cost each offload if they were copied.
  size_t derived_bytes() const { return derived_bytes_; }
  const HostCacheFill& host_cache_fill() const { return fill_; }

  std::string table() const;
  // Predicted beside the largest measured peak of each phase, a ratio per figure, and the
  // derived bytes an offload did not copy (measured: the pages the pool unmapped).
  std::string comparison(const std::map<std::string, PhasePeak>& measured, size_t derived_not_copied) const;

 private:
  std::vector<PhasePrediction> phases_;
  Device device_;
  size_t derived_bytes_ = 0;
  HostCacheFill fill_;
};

// Throws DeckError (exit 2) on every rank alike when the ranks of a node together are
// predicted to need more host memory than `limit` (memory.host-limit; 0: the cgroup's
// limit, else MemTotal). Collective.
void check_host_limit(const MemoryPlan& plan, size_t limit, const Source& limit_source, MPI_Comm comm);

}  // namespace tandem
