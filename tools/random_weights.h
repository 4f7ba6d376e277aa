// Random weights for the benchmarks' models: N(0, 0.02) matrices, ones for norm gains,
// made on the host once.
#pragma once
#include <random>
#include <string>
#include <vector>

#include "model/parameters.h"

namespace tandem {

inline std::vector<float> random_weights(const ParameterLayout& layout, uint32_t seed) {
  std::vector<float> host(layout.slab_elements(), 0.0f);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const ParameterInfo& info : layout.tensors()) {
    const bool norm = info.name.find("norm") != std::string::npos;
    for (int64_t i = 0; i < info.numel(); ++i) host[info.offset + i] = norm ? 1.0f : normal(rng);
  }
  return host;
}

}  // namespace tandem
