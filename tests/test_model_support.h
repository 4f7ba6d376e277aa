// A tiny decoder with random weights on the CPU backend, shared by the model tests.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "model/activations.h"
#include "model/config.h"
#include "model/cpu_ops.h"
#include "model/parameters.h"
#include "model/transformer.h"

namespace tandem::testing {

// head_dim 6 differs from hidden / heads = 4, GQA 4/2, every switch settable.
inline ModelConfig tiny_config(bool qk_norm, bool qkv_bias, bool tied) {
  ModelConfig config;
  config.arch = Architecture::Qwen3;
  config.layers = 2;
  config.hidden = 16;
  config.heads = 4;
  config.kv_heads = 2;
  config.head_dim = 6;
  config.intermediate = 24;
  config.vocab = 32;
  config.rope_theta = 10000;
  config.rms_eps = 1e-6;
  config.qk_norm = qk_norm;
  config.qkv_bias = qkv_bias;
  config.tie_embeddings = tied;
  config.max_position = 64;
  return config;
}

// Weights that give O(1) logits: norms near 1, matrices ~ 1/sqrt(fan_in), small biases.
inline void randomize(const ParameterSet& params, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < params.all.size(); ++i) {
    const ParameterInfo& info = params.layout->tensors()[i];
    float* data = params.all[i].ptr<float>();
    const bool norm = info.name.find("norm") != std::string::npos;
    const bool bias = info.name.ends_with(".bias");
    const float scale = info.shape.size() == 2 ? 1.0f / std::sqrt(static_cast<float>(info.shape[1])) : 0.2f;
    for (int64_t e = 0; e < info.numel(); ++e) {
      const float sample = normal(rng);
      data[e] = norm ? 1.0f + 0.2f * sample : bias ? 0.2f * sample : scale * sample;
    }
    if (info.name == "model.embed_tokens.weight")
      for (int64_t e = 0; e < info.numel(); ++e) data[e] *= 2.0f;
  }
}

// Heap memory aligned for the activation slab.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes)
      : data(static_cast<std::byte*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256))) {}
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte[], Free> data;
};

// The same tiny model at sizes the GPU kernels work with: head_dim 32 (their tiles) and a
// vocabulary wider than one block of threads.
inline ModelConfig gpu_sized(ModelConfig config) {
  config.hidden = 64;
  config.heads = 4;
  config.kv_heads = 2;
  config.head_dim = 32;
  config.intermediate = 96;
  config.vocab = 384;
  config.max_position = 128;
  return config;
}

struct TinyModel {
  TinyModel(const ModelConfig& model_config, ActivationCapacity capacity, uint32_t seed = 7)
      : config(model_config),
        layout(config),
        weights(layout.slab_elements()),
        gradients(layout.slab_elements()),
        params(ParameterSet::bind(layout, weights.data(), DType::F32)),
        grads(ParameterSet::bind(layout, gradients.data(), DType::F32)),
        slab(Activations::slab_bytes(config, capacity, DType::F32)),
        acts(Activations::bind(config, capacity, slab.data.get(), DType::F32)),
        transformer(config, ops) {
    randomize(params, seed);
  }

  TinyModel(const TinyModel&) = delete;  // the parameter sets point into this object
  TinyModel& operator=(const TinyModel&) = delete;

  void zero_grads() { std::fill(gradients.begin(), gradients.end(), 0.0f); }

  ModelConfig config;
  ParameterLayout layout;
  std::vector<float> weights, gradients;
  ParameterSet params, grads;
  AlignedBuffer slab;
  Activations acts;
  CpuOps ops;
  Transformer transformer;
};

}  // namespace tandem::testing
