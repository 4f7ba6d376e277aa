// The model a deck asks for: a Hugging Face folder's config.json when [model] path is
// set (a folder without config.json, tokenizer.json or weights is a DeckError naming the
// missing file), otherwise the tiny Qwen3-style decoder the [model] keys describe.
#pragma once
#include <vector>

#include "deck/deck.h"
#include "model/config.h"
#include "model/parameters.h"
#include "tensor/tensor.h"

namespace tandem {
ModelConfig model_config_from_deck(const Deck& deck);
DType working_dtype_from_deck(const Deck& deck, Device device);
// The policy a run starts from, as an FP32 host slab of `layout` (model/initial_weights.h):
// model.path's safetensors, or tandem's random initialisation from run.seed. It is also
// the frozen KL reference and disk-delta's baseline.
std::vector<float> initial_weights_from_deck(const Deck& deck, const ParameterLayout& layout);
}
