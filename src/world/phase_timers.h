// Wall-clock time per named phase of the step (rollout, reward, train, sync, ...).
// At the end of the run every rank's totals are gathered and rank 0 prints one table:
// min/avg/max over ranks, the load imbalance and the share of the total (LAMMPS style).
#pragma once
#include <chrono>
#include <map>
#include <mpi.h>
#include <string>
#include <vector>

namespace tandem {

class PhaseTimers {
 public:
  void add(const std::string& phase, double seconds);
  double total(const std::string& phase) const;
  // Seconds spent in each phase since the last call (for per-step metrics).
  std::map<std::string, double> take_step_times();

  // Collective over comm. `loop_seconds` is the wall time of the whole loop on this rank.
  std::string summary_table(MPI_Comm comm, double loop_seconds) const;

 private:
  struct Entry {
    double seconds = 0;
    double step_seconds = 0;
    long calls = 0;
  };
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;  // first-seen order, the order of the table
};

// Adds the time between construction and destruction to one phase.
class ScopedPhase {
 public:
  ScopedPhase(PhaseTimers& timers, std::string phase)
      : timers_(timers), phase_(std::move(phase)), start_(std::chrono::steady_clock::now()) {}
  ~ScopedPhase() {
    timers_.add(phase_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  PhaseTimers& timers_;
  std::string phase_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tandem
