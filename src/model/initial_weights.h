// The policy a run starts from, as an FP32 host slab of the model's layout: a Hugging
// Face folder's safetensors, or tandem's random initialisation from the seed.
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

#include "model/parameters.h"

namespace tandem {

// The random policy, deterministic from the seed (the same on every rank, as
// data-parallel replicas must be, and on any number of threads): N(0, 0.02) matrices and
// embeddings, ones for norm gains, zeros for biases.
std::vector<float> random_initial_weights(const ParameterLayout& layout, uint64_t seed);

// `hf_folder`'s weights, or the random policy of `seed` when it is empty.
std::vector<float> initial_weights(const ParameterLayout& layout, const std::filesystem::path& hf_folder, uint64_t seed);

}  // namespace tandem
