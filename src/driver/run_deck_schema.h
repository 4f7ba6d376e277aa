// The schema a run's deck is loaded with: the deck's options and its own rules, and the
// rules that need what the driver builds from the deck (the model, the engine). main()
// loads every run and --check deck with it, so --check refuses what they can tell.
#pragma once
#include <cstdint>

#include "deck/deck.h"

namespace tandem {

const DeckSchema& run_deck_schema();

// A micro-batch holds whole sequences: train.micro-batch-tokens (when set) must hold the
// longest one, `sequence_tokens` (prompt + grpo.max-new-tokens), or it is a DeckError
// naming that minimum. The schema checks it for a model from scratch; a pretrained model's
// prompts are only known at start-up, which calls this.
void require_micro_batch_holds_a_sequence(const Deck& deck, int64_t sequence_tokens);

}  // namespace tandem
