// The schema a run's deck is loaded with: the deck's options and its own rules, and the
// rules that need what the driver builds from the deck (the model, the engine). main()
// loads every run and --check deck with it, so --check refuses what they can tell.
#pragma once
#include "deck/deck.h"

namespace tandem {

const DeckSchema& run_deck_schema();

}  // namespace tandem
