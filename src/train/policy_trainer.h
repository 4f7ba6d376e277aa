// One optimisation step of the policy on a packed batch of (prompt, completion)
// sequences: forward, per-token log-probs of the completion tokens through the chunked
// path, the loss (GRPO's clipped policy loss, or supervised cross-entropy for the SFT
// warm-up), backward, gradient all-reduce over ranks, norm clipping and AdamW on the
// FP32 master weights. CPU backend (FP32); the weights, gradients and optimizer state
// live in the caller's slabs (the colocated memory of the rank).
#pragma once
#include <cstdint>
#include <vector>

#include "model/activations.h"
#include "model/cpu_ops.h"
#include "model/parameters.h"
#include "model/transformer.h"
#include "train/adamw.h"
#include "train/policy_loss.h"
#include "world/communicator.h"

namespace tandem {

struct TrainSequence {
  std::vector<int32_t> prompt;
  std::vector<int32_t> completion;
  std::vector<float> old_logprobs;  // one per completion token (GRPO only)
  float advantage = 0;              // GRPO only
};

struct TrainStepResult {
  double loss = 0;  // of the whole step, over all ranks
  double grad_norm = 0;
  int64_t tokens = 0;  // completion tokens that counted
  PolicyLossMetrics metrics;
  double mean_logp = 0;  // over the counted tokens (SFT: minus the cross-entropy)
  std::vector<std::vector<float>> sequence_logp;  // per sequence, its completion tokens' log-probs
};

struct PolicyTrainerSettings {
  AdamWSettings adamw;
  double max_grad_norm = 1.0;  // 0: no clipping
  float temperature = 1;       // the rollout's: log-probs are taken of logits / temperature
  int64_t logprob_chunk = 1024;
};

class PolicyTrainer {
 public:
  // master, grads, exp_avg, exp_avg_sq: FP32 host slabs laid out by `layout`;
  // activations: Activations::slab_bytes(config, capacity, F32) bytes, 256-byte aligned.
  PolicyTrainer(const ModelConfig& config, const ParameterLayout& layout, float* master, float* grads, float* exp_avg,
                float* exp_avg_sq, void* activations, ActivationCapacity capacity, Communicator& communicator,
                int world_size);

  // The frozen reference policy for the KL term (FP32 slab of the same layout), or null.
  void set_reference(const float* reference);

  // GRPO: loss from policy_loss on the completion tokens.
  TrainStepResult grpo_step(const std::vector<TrainSequence>& batch, const PolicyLossSettings& loss, double lr,
                            int64_t step, const PolicyTrainerSettings& settings);
  // Supervised warm-up: mean cross-entropy of the completion tokens.
  TrainStepResult sft_step(const std::vector<TrainSequence>& batch, double lr, int64_t step,
                           const PolicyTrainerSettings& settings);

 private:
  struct Packed {
    std::vector<int32_t> ids, cu_seqlens, targets;  // targets[t]: the token position t predicts, or -1
    std::vector<uint8_t> mask;
    std::vector<float> old_logp, advantages;
  };
  Packed pack(const std::vector<TrainSequence>& batch) const;
  static std::vector<std::vector<float>> per_sequence(const std::vector<TrainSequence>& batch, const Packed& packed,
                                                      const std::vector<float>& logp);
  // Forward and log-probs of every target; returns the logits tensor (kept for backward).
  Tensor forward(const ParameterSet& params, const Packed& packed, std::vector<float>& logp, std::vector<float>* entropy,
                 const PolicyTrainerSettings& settings);
  // gradients_add_up: each rank's loss is already a share of the global loss (normalised by
  // the global token count), so the ranks' gradients add up; otherwise they are averaged.
  TrainStepResult backward_and_update(const Packed& packed, const Tensor& logits, const std::vector<float>& dlogp,
                                      const std::vector<float>& dentropy, double lr, int64_t step,
                                      const PolicyTrainerSettings& settings, bool gradients_add_up);
  double sum_over_ranks(double value);

  ModelConfig config_;
  const ParameterLayout& layout_;
  float* master_;
  float* grads_;
  float* exp_avg_;
  float* exp_avg_sq_;
  ParameterSet params_, grad_params_, reference_;
  ActivationCapacity capacity_;
  Activations acts_;
  CpuOps ops_;
  Transformer transformer_;
  Communicator& communicator_;
  int world_size_;
  std::vector<float> workspace_;
};

}  // namespace tandem
