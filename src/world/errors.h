// The exit codes of tandem and the errors that choose them. src/main.cpp maps an error to
// its code: a BadInputError (or a DeckError) to 2, a NumericalFailureError to 3, any other
// exception to 1. A stopped run (signal, run.max-time, run.steps-per-job) is a clean exit.
#pragma once
#include <stdexcept>
#include <string>

namespace tandem {

enum ExitCode : int {
  kExitDone = 0,              // the run completed, or stopped cleanly with a checkpoint
  kExitFailure = 1,           // anything else: a bug, a crash of a dependency, a lost rank
  kExitBadInput = 2,          // the deck, the model folder or a file it names is wrong
  kExitNumericalFailure = 3,  // the numbers went bad: NaN or Inf where the run needs finite values
};

// The input is wrong: the user must change the deck or a file it names.
struct BadInputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The training produced values it cannot go on from (non-finite gradients, weights).
struct NumericalFailureError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Thrown on every rank at once, after the ranks agreed that the job fails: each rank
// leaves through MPI_Finalize with code(), none aborts the others.
class RanksFailedError : public std::runtime_error {
 public:
  RanksFailedError(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// The exit code an error calls for.
ExitCode exit_code_of(const std::exception& error);

}  // namespace tandem
