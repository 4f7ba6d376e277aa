// The model a deck asks for: a Hugging Face folder's config.json when [model] path is
// set, otherwise the tiny Qwen3-style decoder the [model] keys describe.
#pragma once
#include "deck/deck.h"
#include "model/config.h"
#include "tensor/tensor.h"

namespace tandem {
ModelConfig model_config_from_deck(const Deck& deck);
DType working_dtype_from_deck(const Deck& deck, Device device);
}
