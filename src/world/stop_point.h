// Where the ranks agree to stop a job early: once per step, after its work, every rank
// says whether it received a stop signal and whether the time left before the deadline
// still holds another step and a checkpoint; one MPI_Allreduce, so all ranks stop at the
// same step even when a signal reached only one of them.
#pragma once
#include <chrono>
#include <ctime>
#include <mpi.h>
#include <optional>
#include <string>

namespace tandem {

class StopPoint {
 public:
  // Collective. `deadline` (rank 0's is used) is when the job must have stopped: run.max-time
  // after the start, or the Slurm job's end time.
  StopPoint(MPI_Comm comm, std::optional<std::time_t> deadline);

  // Collective, at each step boundary: true when every rank stops after this step.
  bool agree();
  // Whether to cut the step in flight, on this rank alone (trainer rank 0 asks while the
  // rollout ranks generate): why, when this rank received a stop signal or the time left
  // before the deadline holds no more than a checkpoint; else "".
  std::string cut_reason() const;
  // The seconds the checkpoint of this step took, for the margin left before the deadline.
  void note_checkpoint_seconds(double seconds);
  // Why the ranks stopped ("SIGTERM", "the time limit ..."); empty until agree() says stop.
  const std::string& reason() const { return reason_; }
  std::optional<std::time_t> deadline() const { return deadline_; }

 private:
  // To the microsecond: std::time's whole seconds would overstate what is left by up to one.
  double seconds_left() const;

  MPI_Comm comm_;
  std::optional<std::time_t> deadline_;
  std::chrono::steady_clock::time_point last_boundary_;
  double longest_step_ = 0, longest_checkpoint_ = -1;  // -1: no checkpoint measured yet
  bool told_signal_ = false;
  std::string reason_;
};

}  // namespace tandem
