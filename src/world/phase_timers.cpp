#include "world/phase_timers.h"

#include <algorithm>

#include "world/table.h"
#include "world/world.h"

namespace tandem {

void PhaseTimers::add(const std::string& phase, double seconds) {
  auto [it, inserted] = entries_.try_emplace(phase);
  if (inserted) order_.push_back(phase);
  it->second.seconds += seconds;
  it->second.step_seconds += seconds;
  ++it->second.calls;
}

double PhaseTimers::total(const std::string& phase) const {
  auto it = entries_.find(phase);
  return it == entries_.end() ? 0.0 : it->second.seconds;
}

std::map<std::string, double> PhaseTimers::take_step_times() {
  std::map<std::string, double> times;
  for (auto& [phase, entry] : entries_) {
    times[phase] = entry.step_seconds;
    entry.step_seconds = 0;
  }
  return times;
}

std::string PhaseTimers::summary_table(MPI_Comm comm, double loop_seconds) const {
  int size = 1;
  MPI_Comm_size(comm, &size);
  // Ranks may have seen different phases: agree on the union, in rank 0's order first.
  std::string names;
  for (const auto& phase : order_) names += phase + "\n";
  std::vector<std::string> phases;
  for (const auto& list : all_gather_strings(comm, names)) {
    size_t start = 0;
    for (size_t end; (end = list.find('\n', start)) != std::string::npos; start = end + 1) {
      const std::string phase = list.substr(start, end - start);
      if (std::find(phases.begin(), phases.end(), phase) == phases.end()) phases.push_back(phase);
    }
  }
  std::vector<double> mine(phases.size() + 1);
  for (size_t i = 0; i < phases.size(); ++i) mine[i] = total(phases[i]);
  mine.back() = loop_seconds;
  std::vector<double> low(mine.size()), high(mine.size()), sum(mine.size());
  MPI_Allreduce(mine.data(), low.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_MIN, comm);
  MPI_Allreduce(mine.data(), high.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_MAX, comm);
  MPI_Allreduce(mine.data(), sum.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_SUM, comm);

  const double loop_avg = sum.back() / size;
  std::vector<std::vector<std::string>> rows;
  double accounted = 0;
  for (size_t i = 0; i < phases.size(); ++i) {
    const double avg = sum[i] / size;
    accounted += avg;
    const double imbalance = avg > 0 ? 100.0 * (high[i] - avg) / avg : 0.0;
    rows.push_back({phases[i], format_fixed(low[i], 3), format_fixed(avg, 3), format_fixed(high[i], 3),
                    format_fixed(imbalance, 1), format_fixed(loop_avg > 0 ? 100.0 * avg / loop_avg : 0.0, 1)});
  }
  const double other = std::max(0.0, loop_avg - accounted);
  rows.push_back({"other", "", format_fixed(other, 3), "", "", format_fixed(loop_avg > 0 ? 100.0 * other / loop_avg : 0.0, 1)});
  return "Loop time of " + format_fixed(loop_avg, 3) + " s on " + std::to_string(size) + " ranks\n" +
         format_table({"Phase", "min (s)", "avg (s)", "max (s)", "%varavg", "%total"}, rows);
}

}  // namespace tandem
