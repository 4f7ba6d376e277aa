// The trained policy inside a checkpoint, as a model: the deck it stores names the model
// (model.path, the Hugging Face folder the run started from, or the tiny built-in model's
// keys) and /tensors/master.<name> hold its FP32 weights.
#pragma once
#include <filesystem>
#include <vector>

#include "model/config.h"

namespace tandem {

struct CheckpointPolicy {
  ModelConfig config;
  std::vector<float> weights;    // an FP32 slab of ParameterLayout(config)
  std::filesystem::path origin;  // model.path: where the tokenizer lives; empty for the tiny model
};

// Throws std::runtime_error naming the file and the tensor when a weight is missing or
// does not fit the deck's model, and a DeckError when model.path no longer holds the model.
CheckpointPolicy load_checkpoint_policy(const std::filesystem::path& checkpoint);

}  // namespace tandem
