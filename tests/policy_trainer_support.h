// A tiny Qwen3 model, its weights and random GRPO batches, shared by the trainer tests on
// the CPU (test_policy_trainer.cpp) and on the GPU (gpu_policy_trainer.cpp).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "test_model_support.h"
#include "train/policy_trainer.h"

namespace tandem::testing {

// A world of one rank: each sum is the value itself.
class OneRank final : public Communicator {
 public:
  Device device() const override { return Device::CPU; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, size_t) override {}
  void reduce_scatter_sum(float*, std::span<const size_t>) override {}
  void all_gather(void*, std::span<const size_t>, size_t) override {}
  void broadcast(void*, size_t, int) override {}
  void synchronize() override {}
};

inline Tensor flat(std::vector<float>& slab) {
  return Tensor::view(slab.data(), DType::F32, Device::CPU, {static_cast<int64_t>(slab.size())});
}

// A CPU trainer with its own slabs in one rank, starting from `weights`, which are also the
// KL reference. state_slot_elements > 0: the optimizer state is streamed through two
// staging slots of that many values (optimizer.state = host | disk).
struct CpuTrainer {
  CpuTrainer(const ModelConfig& config, ActivationCapacity capacity, const std::vector<float>& weights,
             size_t state_slot_elements = 0, OptimizerKind optimizer = OptimizerKind::AdamW)
      : layout(config),
        master(weights),
        reference(weights),
        grads(weights.size()),
        exp_avg(weights.size()),
        exp_avg_sq(weights.size()),
        staging(2 * state_slot_elements),
        activations(PolicyTrainer::activation_bytes(config, capacity, DType::F32, optimizer)),
        trainer(config, layout,
                PolicyTrainerMemory{flat(master), flat(grads), flat(exp_avg), flat(exp_avg_sq), flat(master),
                                    activations.data.get(), state_slot_elements ? staging.data() : nullptr,
                                    state_slot_elements},
                capacity, communicator, 1) {
    trainer.set_reference(flat(reference));
  }

  ParameterLayout layout;
  std::vector<float> master, reference, grads, exp_avg, exp_avg_sq, staging;
  AlignedBuffer activations;
  OneRank communicator;
  PolicyTrainer trainer;
};

inline ModelConfig trainer_config() { return tiny_config(/*qk_norm=*/true, /*qkv_bias=*/false, /*tied=*/true); }

inline std::vector<float> trainer_weights(const ParameterLayout& layout, uint32_t seed) {
  std::vector<float> weights(static_cast<size_t>(layout.slab_elements()), 0.0f);
  randomize(ParameterSet::bind(layout, weights.data(), DType::F32), seed);
  return weights;
}

// Sequences with prompts of 2-6 tokens and completions of 1-9, old log-probs
// around the model's (so some ratios are clipped on each side and some are not), and
// advantages of both signs.
inline std::vector<TrainSequence> random_batch(const ModelConfig& config, int sequences, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> prompt_length(2, 6), completion_length(1, 9);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab) - 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<TrainSequence> batch(static_cast<size_t>(sequences));
  for (TrainSequence& sequence : batch) {
    sequence.prompt.resize(static_cast<size_t>(prompt_length(rng)));
    sequence.completion.resize(static_cast<size_t>(completion_length(rng)));
    for (auto& id : sequence.prompt) id = token(rng);
    for (auto& id : sequence.completion) id = token(rng);
    for (size_t j = 0; j < sequence.completion.size(); ++j)
      sequence.old_logprobs.push_back(-std::log(static_cast<float>(config.vocab)) + 0.3f * normal(rng));
    sequence.advantage = normal(rng);
  }
  return batch;
}

inline int64_t batch_tokens(const std::vector<TrainSequence>& batch) {
  int64_t tokens = 0;
  for (const TrainSequence& sequence : batch)
    tokens += static_cast<int64_t>(sequence.prompt.size() + sequence.completion.size());
  return tokens;
}

inline int64_t longest_sequence(const std::vector<TrainSequence>& batch) {
  int64_t longest = 0;
  for (const TrainSequence& sequence : batch)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(sequence.prompt.size() + sequence.completion.size()));
  return longest;
}

// AdamW's eps at 1e-3 keeps the first steps linear in the gradient where it is small:
// with the default 1e-8 an element whose gradient is rounding noise moves by a whole
// lr either way, so two correct gradients that differ in the 7th digit could give weights
// apart by 2 lr.
inline PolicyTrainerSettings trainer_settings(int64_t micro_batch_tokens) {
  PolicyTrainerSettings settings;
  settings.optimizer.adamw = AdamWSettings{.lr = 0, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-3, .weight_decay = 0.01};
  settings.max_grad_norm = 1.0;
  settings.temperature = 0.9f;
  settings.logprob_chunk = 7;
  settings.micro_batch_tokens = micro_batch_tokens;
  return settings;
}

inline PolicyLossSettings grpo_loss(LossAggregation aggregation) {
  return PolicyLossSettings{.eps_low = 0.2, .eps_high = 0.28, .aggregation = aggregation, .kl_coef = 0.05,
                            .kl_estimator = KlEstimator::K3, .entropy_coef = 0.01};
}

}  // namespace tandem::testing
