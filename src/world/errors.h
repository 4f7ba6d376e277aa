// The failures that main() maps to exit codes: 2 for bad input (deck, model folder, files),
// 3 for a numerical failure; any other exception exits 1.
#pragma once
#include <stdexcept>

namespace tandem {

struct BadInputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct NumericalFailureError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace tandem
