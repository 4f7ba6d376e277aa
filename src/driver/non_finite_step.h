// A step whose gradients hold a NaN or an infinity (train.on-nonfinite): the trainer has
// already skipped its update, so the weights are still the last good ones; `stop` ends
// the job (exit 3) after that state's checkpoint and the step's metrics row, `skip` goes
// on with a warning and the step counted in the run file's `skipped` column.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>

namespace tandem {

enum class OnNonFinite { Stop, Skip };
OnNonFinite on_non_finite_from_name(const std::string& name);  // "stop" | "skip"

// Collective: "step 12: the gradients hold NaN or Inf (grad norm nan); rank 0: micro-batch
// 2 of 4, tensor ..." from each rank's TrainStepResult::non_finite.
std::string non_finite_report(MPI_Comm comm, int64_t step, double grad_norm, const std::string& local);

}  // namespace tandem
