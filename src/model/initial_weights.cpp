#include "model/initial_weights.h"

#include <algorithm>
#include <random>
#include <string>

#include "model/hf_import.h"

namespace tandem {

std::vector<float> random_initial_weights(const ParameterLayout& layout, uint64_t seed) {
  // Each chunk of a tensor draws from its own generator, seeded by (seed, tensor, chunk):
  // the same weights on any number of threads, drawn on all of them (one generator for
  // the whole 0.6B model took 23 s of a job's start-up).
  constexpr int64_t kChunk = int64_t{1} << 20;
  struct Chunk {
    uint32_t tensor, index;
    float* values;
    int64_t count;
    bool is_norm, is_bias;
  };
  std::vector<float> host(static_cast<size_t>(layout.slab_elements()), 0.0f);
  std::vector<Chunk> chunks;
  const auto& tensors = layout.tensors();
  for (size_t t = 0; t < tensors.size(); ++t) {
    const ParameterInfo& info = tensors[t];
    const bool is_norm = info.name.find("norm.weight") != std::string::npos;
    const bool is_bias = info.name.size() > 5 && info.name.compare(info.name.size() - 5, 5, ".bias") == 0;
    for (int64_t begin = 0; begin < info.numel(); begin += kChunk)
      chunks.push_back({static_cast<uint32_t>(t), static_cast<uint32_t>(begin / kChunk), host.data() + info.offset + begin,
                        std::min(kChunk, info.numel() - begin), is_norm, is_bias});
  }
#pragma omp parallel for schedule(dynamic)
  for (size_t c = 0; c < chunks.size(); ++c) {
    const Chunk& chunk = chunks[c];
    if (chunk.is_norm || chunk.is_bias) {
      std::fill(chunk.values, chunk.values + chunk.count, chunk.is_norm ? 1.0f : 0.0f);
      continue;
    }
    std::seed_seq seeds{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), chunk.tensor, chunk.index};
    std::mt19937_64 rng(seeds);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (int64_t i = 0; i < chunk.count; ++i) chunk.values[i] = normal(rng);
  }
  return host;
}

std::vector<float> initial_weights(const ParameterLayout& layout, const std::filesystem::path& hf_folder, uint64_t seed) {
  if (hf_folder.empty()) return random_initial_weights(layout, seed);
  std::vector<float> weights(static_cast<size_t>(layout.slab_elements()));
  load_hf_weights(hf_folder, ParameterSet::bind(layout, weights.data(), DType::F32));
  return weights;
}

}  // namespace tandem
