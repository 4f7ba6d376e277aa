#include "world/errors.h"

namespace tandem {

ExitCode exit_code_of(const std::exception& error) {
  if (const auto* agreed = dynamic_cast<const RanksFailedError*>(&error)) return agreed->code();
  if (dynamic_cast<const BadInputError*>(&error)) return kExitBadInput;
  if (dynamic_cast<const NumericalFailureError*>(&error)) return kExitNumericalFailure;
  return kExitFailure;
}

}  // namespace tandem
