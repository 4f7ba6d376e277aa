#include "driver/non_finite_step.h"

#include <stdexcept>

#include "world/world.h"

namespace tandem {

OnNonFinite on_non_finite_from_name(const std::string& name) {
  if (name == "stop") return OnNonFinite::Stop;
  if (name == "skip") return OnNonFinite::Skip;
  throw std::invalid_argument("train.on-nonfinite: expected stop or skip, got '" + name + "'");
}

std::string non_finite_report(MPI_Comm comm, int64_t step, double grad_norm, const std::string& local) {
  const std::vector<std::string> places = all_gather_strings(comm, local);
  std::string report = "step " + std::to_string(step) + ": the gradients hold NaN or Inf (grad norm " +
                       std::to_string(grad_norm) + ")";
  for (size_t rank = 0; rank < places.size(); ++rank)
    if (!places[rank].empty()) report += "; rank " + std::to_string(rank) + ": " + places[rank];
  return report;
}

}  // namespace tandem
