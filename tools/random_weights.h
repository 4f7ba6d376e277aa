// The Qwen3-0.6B shape the benchmarks measure (tied embeddings, q/k norm), and random
// weights for it: N(0, 0.02) matrices, ones for norm gains, made on the host once.
#pragma once
#include <random>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/parameters.h"

namespace tandem {

inline ModelConfig qwen3_0_6b_config(int layers = 28) {
  ModelConfig config;
  config.arch = Architecture::Qwen3;
  config.layers = layers;
  config.hidden = 1024;
  config.heads = 16;
  config.kv_heads = 8;
  config.head_dim = 128;
  config.intermediate = 3072;
  config.vocab = 151936;
  config.rope_theta = 1000000;
  config.rms_eps = 1e-6;
  config.qk_norm = true;
  config.tie_embeddings = true;
  config.max_position = 40960;
  return config;
}

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
