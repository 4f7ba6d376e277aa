// The deck `tandem` runs when given none (`make run`): inputs/default.deck, compiled in.
#pragma once

namespace tandem {
const char* embedded_default_deck();
}
