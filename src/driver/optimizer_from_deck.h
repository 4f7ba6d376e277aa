// The [optimizer] section of a deck as the trainer's typed settings.
#pragma once
#include "deck/deck.h"
#include "train/optimizer_settings.h"

namespace tandem {
OptimizerSettings optimizer_settings_from_deck(const Deck& deck);
}
