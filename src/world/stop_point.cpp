#include "world/stop_point.h"

#include "world/log.h"
#include "world/stall_guard.h"
#include "world/stop_signals.h"
#include "world/table.h"

namespace tandem {

StopPoint::StopPoint(MPI_Comm comm, std::optional<std::time_t> deadline)
    : comm_(comm), last_boundary_(std::chrono::steady_clock::now()) {
  long long seconds = deadline ? static_cast<long long>(*deadline) : -1;
  MPI_Bcast(&seconds, 1, MPI_LONG_LONG, 0, comm);
  if (seconds >= 0) deadline_ = static_cast<std::time_t>(seconds);
}

void StopPoint::note_checkpoint_seconds(double seconds) { longest_checkpoint_ = std::max(longest_checkpoint_, seconds); }

double StopPoint::seconds_left() const {
  return std::chrono::duration<double>(std::chrono::system_clock::from_time_t(*deadline_) - std::chrono::system_clock::now()).count();
}

std::string StopPoint::cut_reason() const {
  if (const int signal = stop_signal_received()) return signal_name(signal) + " received";
  if (!deadline_) return "";
  // Until a checkpoint was measured, count one as long as the longest step, as agree() does.
  const double checkpoint = longest_checkpoint_ >= 0 ? longest_checkpoint_ : longest_step_;
  const double left = seconds_left();
  if (left > checkpoint) return "";
  return "the time limit is near (" + format_fixed(std::max(0.0, left), 0) + " s left, a checkpoint takes up to " +
         format_fixed(checkpoint, 1) + " s)";
}

bool StopPoint::agree() {
  const auto now = std::chrono::steady_clock::now();
  longest_step_ = std::max(longest_step_, std::chrono::duration<double>(now - last_boundary_).count());
  last_boundary_ = now;
  // [0] the first stop signal of any rank, [1] a rank with no time for a step and a checkpoint.
  int wishes[2] = {stop_signal_received(), 0};
  double margin = 0, left = 0;
  if (deadline_) {
    // Until a checkpoint was measured, count one as long as the longest step.
    margin = longest_step_ + (longest_checkpoint_ >= 0 ? longest_checkpoint_ : longest_step_);
    left = seconds_left();
    wishes[1] = left < margin;
  }
  if (wishes[0] && !told_signal_) {
    TLOG(warning) << "received " << signal_name(wishes[0]) << ": stopping after this step, with a checkpoint";
    told_signal_ = true;
  }
  all_reduce(MPI_IN_PLACE, wishes, 2, MPI_INT, MPI_MAX, comm_, "the step boundary");
  if (wishes[0])
    reason_ = signal_name(wishes[0]) + " received";
  else if (wishes[1])
    reason_ = "the time limit is near (" + format_fixed(std::max(0.0, left), 0) + " s left, a step and a checkpoint take up to " +
              format_fixed(margin, 1) + " s)";
  return wishes[0] || wishes[1];
}

}  // namespace tandem
