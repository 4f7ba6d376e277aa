// Rules between options that each option's own range cannot express.
#pragma once
#include <vector>

#include "deck/deck.h"

namespace tandem {

const std::vector<DeckRule>& tandem_rules();

}  // namespace tandem
