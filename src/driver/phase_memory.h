// The memory peak of one phase of the step (rollout, train, each handoff point), measured
// two ways: the pool's own bytes (exact, from a peak window of the pool) and what the
// system sees (the device's used memory from cudaMemGetInfo, sampled at every sample()
// and at the end; the process's resident set, whose kernel high-water mark is restarted
// when the phase begins). Phases run one after the other; none resets another's peak.
#pragma once
#include <cstddef>
#include <string>

#include "io/run_file.h"
#include "tensor/memory_pool.h"

namespace tandem {

struct PhasePeak {
  size_t device_pool = 0, device_used = 0;  // device_used: 0 on the CPU backend
  size_t host_pool = 0, host_rss = 0;
};

// Figure by figure, the larger of two peaks.
PhasePeak largest(const PhasePeak& a, const PhasePeak& b);

class PhaseMemory {
 public:
  explicit PhaseMemory(MemoryPool& pool);
  PhaseMemory(const PhaseMemory&) = delete;
  PhaseMemory& operator=(const PhaseMemory&) = delete;
  ~PhaseMemory();

  void begin();
  void sample();  // the device's used memory now (between the actions of a handoff)
  PhasePeak end();

 private:
  MemoryPool& pool_;
  int window_ = -1;
  bool rss_reset_ = false;
  PhasePeak peak_;
};

// The phase's peaks as run-file metrics: memory/phase/<phase>/{device_pool,device_used,host_pool,host_rss}_peak.
void add_phase_metrics(MetricValues& metrics, const std::string& phase, const PhasePeak& peak);

}  // namespace tandem
