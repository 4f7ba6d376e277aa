#include "train/policy_trainer.h"

#include <cmath>
#include <cstring>
#include <span>
#include <stdexcept>

#include "train/chunked_logprobs.h"
#include "train/gradient_clipping.h"

namespace tandem {


PolicyTrainer::PolicyTrainer(const ModelConfig& config, const ParameterLayout& layout, float* master, float* grads,
                             float* exp_avg, float* exp_avg_sq, void* activations, ActivationCapacity capacity,
                             Communicator& communicator, int world_size)
    : config_(config),
      layout_(layout),
      master_(master),
      grads_(grads),
      exp_avg_(exp_avg),
      exp_avg_sq_(exp_avg_sq),
      params_(ParameterSet::bind(layout, master, DType::F32)),
      grad_params_(ParameterSet::bind(layout, grads, DType::F32)),
      capacity_(capacity),
      acts_(Activations::bind(config, capacity, activations, DType::F32)),
      transformer_(config_, ops_),
      communicator_(communicator),
      world_size_(world_size) {}

PolicyTrainer::Packed PolicyTrainer::pack(const std::vector<TrainSequence>& batch) const {
  Packed packed;
  packed.cu_seqlens.push_back(0);
  for (const TrainSequence& sequence : batch) {
    if (sequence.prompt.empty() || sequence.completion.empty())
      throw std::invalid_argument("PolicyTrainer: a sequence needs a prompt and a completion");
    const int64_t start = static_cast<int64_t>(packed.ids.size());
    packed.ids.insert(packed.ids.end(), sequence.prompt.begin(), sequence.prompt.end());
    packed.ids.insert(packed.ids.end(), sequence.completion.begin(), sequence.completion.end());
    const int64_t end = static_cast<int64_t>(packed.ids.size());
    packed.cu_seqlens.push_back(static_cast<int32_t>(end));
    packed.targets.resize(end, -1);
    packed.mask.resize(end, 0);
    packed.old_logp.resize(end, 0);
    packed.advantages.resize(end, 0);
    // Position p predicts token p + 1: the completion's tokens are predicted from the
    // last prompt token onwards.
    const int64_t first = start + static_cast<int64_t>(sequence.prompt.size()) - 1;
    for (size_t j = 0; j < sequence.completion.size(); ++j) {
      packed.targets[first + j] = sequence.completion[j];
      packed.mask[first + j] = 1;
      packed.old_logp[first + j] = j < sequence.old_logprobs.size() ? sequence.old_logprobs[j] : 0.0f;
      packed.advantages[first + j] = sequence.advantage;
    }
  }
  if (static_cast<int64_t>(packed.ids.size()) > capacity_.max_tokens ||
      static_cast<int64_t>(batch.size()) > capacity_.max_sequences)
    throw std::invalid_argument("PolicyTrainer: a batch of " + std::to_string(packed.ids.size()) + " tokens in " +
                                std::to_string(batch.size()) + " sequences exceeds the trainer's capacity (" +
                                std::to_string(capacity_.max_tokens) + " tokens, " +
                                std::to_string(capacity_.max_sequences) + " sequences)");
  return packed;
}

std::vector<std::vector<float>> PolicyTrainer::per_sequence(const std::vector<TrainSequence>& batch,
                                                            const Packed& packed, const std::vector<float>& logp) {
  std::vector<std::vector<float>> result;
  for (size_t s = 0; s < batch.size(); ++s) {
    const auto first = logp.begin() + packed.cu_seqlens[s] + static_cast<int64_t>(batch[s].prompt.size()) - 1;
    result.emplace_back(first, first + static_cast<int64_t>(batch[s].completion.size()));
  }
  return result;
}

void PolicyTrainer::set_reference(const float* reference) {
  reference_ = reference ? ParameterSet::bind(layout_, const_cast<float*>(reference), DType::F32) : ParameterSet{};
}

Tensor PolicyTrainer::forward(const ParameterSet& params, const Packed& packed, std::vector<float>& logp,
                              std::vector<float>* entropy, const PolicyTrainerSettings& settings) {
  const Tensor logits = transformer_.forward(params, acts_, packed.ids, packed.cu_seqlens);
  const int64_t T = logits.shape[0];
  workspace_.resize(logprob_workspace_elements(T, config_.vocab, settings.logprob_chunk));
  logp.assign(T, 0.0f);
  if (entropy) entropy->assign(T, 0.0f);
  chunked_logprobs_forward(logits, packed.targets, LogprobSettings{settings.temperature, settings.logprob_chunk},
                           workspace_, logp, entropy ? std::span<float>(*entropy) : std::span<float>());
  return logits;
}

double PolicyTrainer::sum_over_ranks(double value) {
  float total = static_cast<float>(value);  // token counts: exact in FP32 below 2^24
  communicator_.all_reduce_sum(&total, 1);
  communicator_.synchronize();
  return total;
}

TrainStepResult PolicyTrainer::backward_and_update(const Packed& packed, const Tensor& logits,
                                                   const std::vector<float>& dlogp,
                                                   const std::vector<float>& dentropy, double lr, int64_t step,
                                                   const PolicyTrainerSettings& settings, bool gradients_add_up) {
  chunked_logprobs_backward(logits, packed.targets, LogprobSettings{settings.temperature, settings.logprob_chunk},
                            workspace_, dlogp, dentropy, logits);
  const size_t n = static_cast<size_t>(layout_.slab_elements());
  std::memset(grads_, 0, n * sizeof(float));
  transformer_.backward(params_, grad_params_, acts_, logits);
  communicator_.all_reduce_sum(grads_, n);
  communicator_.synchronize();
  if (world_size_ > 1 && !gradients_add_up) {
    const float scale = 1.0f / static_cast<float>(world_size_);
    for (size_t i = 0; i < n; ++i) grads_[i] *= scale;
  }
  TrainStepResult result;
  const std::span<float> slabs[] = {std::span<float>(grads_, n)};
  result.grad_norm = settings.max_grad_norm > 0 ? clip_gradient_norm(slabs, settings.max_grad_norm)
                                                : std::sqrt(gradient_square_sum(slabs));
  if (!std::isfinite(result.grad_norm)) return result;  // skip the update, keep the weights
  AdamWSettings adamw = settings.adamw;
  adamw.lr = lr;
  for (const ParameterInfo& info : layout_.tensors()) {
    const size_t offset = static_cast<size_t>(info.offset);
    adamw_step_cpu(master_ + offset, grads_ + offset, exp_avg_ + offset, exp_avg_sq_ + offset,
                   static_cast<size_t>(info.numel()), adamw_scalars(adamw, step, info.shape.size() == 2));
  }
  return result;
}

TrainStepResult PolicyTrainer::grpo_step(const std::vector<TrainSequence>& batch, const PolicyLossSettings& loss,
                                         double lr, int64_t step, const PolicyTrainerSettings& settings) {
  const Packed packed = pack(batch);
  // The reference runs first: the policy's forward must be the last one on the activations.
  std::vector<float> ref_logp;
  if (loss.kl_coef != 0) {
    if (!reference_.layout) throw std::invalid_argument("PolicyTrainer: a KL term needs a reference policy");
    forward(reference_, packed, ref_logp, nullptr, settings);
  }
  std::vector<float> logp, entropy;
  const Tensor logits = forward(params_, packed, logp, &entropy, settings);
  PolicyLossBatch inputs;
  inputs.logp = logp;
  inputs.ref_logp = ref_logp;
  inputs.entropy = entropy;
  inputs.old_logp = packed.old_logp;
  inputs.advantages = packed.advantages;
  inputs.mask = packed.mask;
  inputs.cu_seqlens = packed.cu_seqlens;
  const bool global = loss.aggregation == LossAggregation::GlobalTokenSum;
  if (global) {
    int64_t tokens = 0;
    for (uint8_t m : packed.mask) tokens += m;
    inputs.global_tokens = sum_over_ranks(static_cast<double>(tokens));
  }
  const PolicyLoss policy = policy_loss(inputs, loss);
  std::vector<std::vector<float>> sequence_logp = per_sequence(batch, packed, logp);
  TrainStepResult result = backward_and_update(packed, logits, policy.dlogp, policy.dentropy, lr, step, settings, global);
  // The step's loss: a sum of the ranks' shares, or the mean of the ranks' means.
  result.loss = global ? sum_over_ranks(policy.loss) : sum_over_ranks(policy.loss) / world_size_;
  result.metrics = policy.metrics;
  result.sequence_logp = std::move(sequence_logp);
  result.tokens = policy.metrics.tokens;
  double sum = 0;
  for (size_t t = 0; t < logp.size(); ++t) sum += packed.mask[t] ? logp[t] : 0.0;
  result.mean_logp = result.tokens ? sum / static_cast<double>(result.tokens) : 0.0;
  return result;
}

TrainStepResult PolicyTrainer::sft_step(const std::vector<TrainSequence>& batch, double lr, int64_t step,
                                        const PolicyTrainerSettings& settings) {
  const Packed packed = pack(batch);
  std::vector<float> logp;
  const Tensor logits = forward(params_, packed, logp, nullptr, settings);
  int64_t tokens = 0;
  double sum = 0;
  for (size_t t = 0; t < logp.size(); ++t)
    if (packed.mask[t]) ++tokens, sum += logp[t];
  // The mean over every rank's tokens, so the update does not depend on how the batch is split.
  const double global_tokens = sum_over_ranks(static_cast<double>(tokens));
  std::vector<float> dlogp(logp.size(), 0.0f);
  for (size_t t = 0; t < logp.size(); ++t)
    if (packed.mask[t]) dlogp[t] = static_cast<float>(-1.0 / global_tokens);
  TrainStepResult result = backward_and_update(packed, logits, dlogp, {}, lr, step, settings, true);
  result.tokens = tokens;
  result.mean_logp = global_tokens > 0 ? sum_over_ranks(sum) / global_tokens : 0.0;
  result.loss = -result.mean_logp;
  return result;
}

}  // namespace tandem
