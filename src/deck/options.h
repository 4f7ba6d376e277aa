// tandem's deck options, in the order help and the resolved deck list them.
#pragma once
#include <vector>

#include "deck/option_spec.h"

namespace tandem {

const std::vector<OptionSpec>& tandem_options();

}  // namespace tandem
