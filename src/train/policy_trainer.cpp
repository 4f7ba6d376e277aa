#include "train/policy_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

#include "train/gradient_clipping.h"
#include "train/nonfinite_gradients.h"
#include "train/optimizer_step.h"
#include "train/trainer_backend.h"

namespace tandem {

namespace {

constexpr size_t kAlignment = 256;  // the activation slab's
constexpr int kTokenBuffers = 7;    // TokenBuffers' tensors, scalar included

size_t align_up(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

std::unique_ptr<TrainerBackend> make_backend(Device device) {
  if (device == Device::CPU) return make_cpu_trainer_backend();
#ifdef TANDEM_HAVE_CUDA
  return make_cuda_trainer_backend();
#else
  throw std::invalid_argument("PolicyTrainer: the slabs are CUDA memory, and this build has no CUDA backend");
#endif
}

SlabShards shard_of(const PolicyTrainerMemory& memory, const ParameterLayout& layout, const Communicator& communicator,
                    int world_size) {
  if (memory.shard.bounds.empty()) return SlabShards::whole(layout);
  const SlabShards& shard = memory.shard;
  if (shard.bounds.front() != 0 || shard.bounds.back() != layout.slab_elements() ||
      (shard.ranks() > 1 && (shard.ranks() != world_size || shard.rank != communicator.rank())))
    throw std::invalid_argument("PolicyTrainer: a shard of rank " + std::to_string(shard.rank) + " of " +
                                std::to_string(shard.ranks()) + " over a slab of " +
                                std::to_string(shard.bounds.back()) + " elements does not fit rank " +
                                std::to_string(communicator.rank()) + " of " + std::to_string(world_size) +
                                " and a slab of " + std::to_string(layout.slab_elements()));
  return shard;
}

// The checks on the caller's memory; returns it.
const PolicyTrainerMemory& checked(const PolicyTrainerMemory& memory, const ParameterLayout& layout,
                                   const SlabShards& shard, const Communicator& communicator) {
  const Device device = memory.master.device;
  const std::pair<const char*, const Tensor*> slabs[] = {{"master", &memory.master},
                                                         {"grads", &memory.grads},
                                                         {"exp_avg", &memory.exp_avg},
                                                         {"exp_avg_sq", &memory.exp_avg_sq},
                                                         {"working", &memory.working}};
  const bool streamed = memory.state_staging != nullptr;
  for (const auto& [name, slab] : slabs) {
    const bool state = slab == &memory.exp_avg || slab == &memory.exp_avg_sq;
    const Device wanted = streamed && state ? Device::CPU : device;
    const int64_t elements = state || slab == &memory.master ? shard.elements() : layout.slab_elements();
    const bool dtype_ok = slab == &memory.working ? slab->dtype == DType::F32 || slab->dtype == DType::BF16
                                                  : slab->dtype == DType::F32;
    if (!slab->data || !dtype_ok || slab->device != wanted || slab->numel() != elements || !slab->is_contiguous())
      throw std::invalid_argument(std::string("PolicyTrainer: the ") + name + " slab must be a flat " +
                                  (slab == &memory.working ? "F32 or BF16" : "F32") + " tensor of " +
                                  std::to_string(elements) + " elements on " + device_name(wanted) +
                                  ", got " + slab->describe());
  }
  if (streamed && memory.state_slot_elements < 2)
    throw std::invalid_argument("PolicyTrainer: state staging slots of " + std::to_string(memory.state_slot_elements) +
                                " values cannot hold one element's two moments");
  if (!memory.activations)
    throw std::invalid_argument("PolicyTrainer: no activation slab (activations is null)");
  if (device == Device::CPU && memory.working.dtype != DType::F32)
    throw std::invalid_argument("PolicyTrainer: the CPU backend trains in FP32, got a working copy " +
                                memory.working.describe());
  if (communicator.device() != device)
    throw std::invalid_argument(std::string("PolicyTrainer: the communicator reduces on ") +
                                device_name(communicator.device()) + " memory, the slabs are on " +
                                device_name(device));
  return memory;
}

}  // namespace

size_t PolicyTrainer::activation_bytes(const ModelConfig& config, ActivationCapacity capacity, DType dtype,
                                       OptimizerKind optimizer) {
  size_t bytes = Activations::slab_bytes(config, capacity, dtype);
  if (optimizer == OptimizerKind::Muon) bytes = std::max(bytes, MuonWorkspace::bytes_for(muon_groups(ParameterLayout(config))));
  return align_up(bytes) +
         kTokenBuffers * align_up(static_cast<size_t>(capacity.max_tokens) * 4);
}

PolicyTrainer::TokenBuffers PolicyTrainer::bind_token_buffers(void* base, Device device, int64_t max_tokens) {
  auto* next = static_cast<char*>(base);
  const size_t stride = align_up(static_cast<size_t>(max_tokens) * 4);
  auto take = [&](DType dtype, int64_t elements) {
    const Tensor tensor = Tensor::view(next, dtype, device, {elements});
    next += stride;
    return tensor;
  };
  TokenBuffers buffers;
  buffers.targets = take(DType::I32, max_tokens);
  buffers.logp = take(DType::F32, max_tokens);
  buffers.entropy = take(DType::F32, max_tokens);
  buffers.lse = take(DType::F32, max_tokens);
  buffers.dlogp = take(DType::F32, max_tokens);
  buffers.dentropy = take(DType::F32, max_tokens);
  buffers.scalar = take(DType::F32, 1);
  return buffers;
}

PolicyTrainer::PolicyTrainer(const ModelConfig& config, const ParameterLayout& layout,
                             const PolicyTrainerMemory& memory, ActivationCapacity capacity,
                             Communicator& communicator, int world_size)
    : config_(config),
      layout_(layout),
      shard_(shard_of(memory, layout, communicator, world_size)),
      memory_(checked(memory, layout, shard_, communicator)),
      params_(ParameterSet::bind(layout, memory.working.data, memory.working.dtype, memory.working.device)),
      grad_params_(ParameterSet::bind(layout, memory.grads.data, DType::F32, memory.grads.device)),
      capacity_(capacity),
      backend_(make_backend(memory.master.device)),
      acts_(Activations::bind(config, capacity, memory.activations, memory.working.dtype, memory.working.device)),
      tokens_(bind_token_buffers(static_cast<char*>(memory.activations) + align_up(acts_.bytes),
                                 memory.working.device, capacity.max_tokens)),
      transformer_(config_, backend_->ops()),
      optimizer_(std::make_unique<OptimizerStep>(layout, shard_, memory_, *backend_)),
      communicator_(communicator),
      world_size_(world_size) {}

PolicyTrainer::~PolicyTrainer() = default;

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
  return packed;
}

std::vector<PolicyTrainer::MicroBatch> PolicyTrainer::split(const Packed& packed, int64_t micro_batch_tokens) const {
  std::vector<MicroBatch> micros;
  const std::vector<int32_t>& cu = packed.cu_seqlens;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t length = cu[s + 1] - cu[s];
    if (micros.empty() || (micro_batch_tokens > 0 && micros.back().tokens() + length > micro_batch_tokens))
      micros.push_back(MicroBatch{s, s, cu[s], cu[s], {0}});
    MicroBatch& micro = micros.back();
    micro.last = s + 1;
    micro.end = cu[s + 1];
    micro.cu_seqlens.push_back(static_cast<int32_t>(micro.tokens()));
  }
  for (const MicroBatch& micro : micros)
    if (micro.tokens() > capacity_.max_tokens || static_cast<int64_t>(micro.last - micro.first) > capacity_.max_sequences)
      throw std::invalid_argument(
          "PolicyTrainer: a micro-batch of " + std::to_string(micro.tokens()) + " tokens in " +
          std::to_string(micro.last - micro.first) + " sequences exceeds the trainer's capacity (" +
          std::to_string(capacity_.max_tokens) + " tokens, " + std::to_string(capacity_.max_sequences) +
          " sequences; micro_batch_tokens = " + std::to_string(micro_batch_tokens) + ")");
  return micros;
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

PolicyLossBatch PolicyTrainer::loss_inputs(const Packed& packed, const TokenValues& values, int64_t begin,
                                           int64_t end, std::span<const int32_t> cu_seqlens) {
  const auto n = static_cast<size_t>(end - begin);
  const auto b = static_cast<size_t>(begin);
  auto part = [&](const auto& vector) {
    return vector.empty() ? std::span<const typename std::decay_t<decltype(vector)>::value_type>()
                          : std::span(vector).subspan(b, n);
  };
  PolicyLossBatch inputs;
  inputs.logp = part(values.logp);
  inputs.ref_logp = part(values.ref_logp);
  inputs.entropy = part(values.entropy);
  inputs.old_logp = part(packed.old_logp);
  inputs.advantages = part(packed.advantages);
  inputs.mask = part(packed.mask);
  inputs.cu_seqlens = cu_seqlens;
  return inputs;
}

void PolicyTrainer::set_reference(const Tensor& reference) {
  if (!reference.data) {
    reference_ = ParameterSet{};
    return;
  }
  if (reference.dtype != memory_.working.dtype || reference.device != memory_.working.device ||
      reference.numel() != layout_.slab_elements())
    throw std::invalid_argument("PolicyTrainer: the reference policy must be a slab of " +
                                std::to_string(layout_.slab_elements()) + " " + dtype_name(memory_.working.dtype) +
                                " elements on " + device_name(memory_.working.device) + " (the working copy's), got " +
                                reference.describe());
  reference_ = ParameterSet::bind(layout_, reference.data, reference.dtype, reference.device);
}

Tensor PolicyTrainer::forward(const ParameterSet& params, const Packed& packed, const MicroBatch& micro,
                              std::span<float> logp, std::span<float> entropy, const PolicyTrainerSettings& settings) {
  const int64_t T = micro.tokens();
  const Tensor logits = transformer_.forward(
      params, acts_, std::span(packed.ids).subspan(static_cast<size_t>(micro.begin), static_cast<size_t>(T)),
      micro.cu_seqlens);
  const Tensor targets = first_rows(tokens_.targets, T);
  backend_->ops().copy_from_host(targets, packed.targets.data() + micro.begin);
  const Tensor logp_t = first_rows(tokens_.logp, T);
  const Tensor entropy_t = entropy.empty() ? Tensor{} : first_rows(tokens_.entropy, T);
  backend_->token_logprobs_forward(logp_t, entropy_t, first_rows(tokens_.lse, T), logits, targets,
                                   LogprobSettings{settings.temperature, settings.logprob_chunk});
  backend_->copy_to_host(logp.data(), logp_t);
  if (!entropy.empty()) backend_->copy_to_host(entropy.data(), entropy_t);
  return logits;
}

void PolicyTrainer::backward(const MicroBatch& micro, const Tensor& logits, const PolicyLoss& gradient,
                             const PolicyTrainerSettings& settings) {
  const int64_t T = micro.tokens();
  Ops& ops = backend_->ops();
  const Tensor dlogp = first_rows(tokens_.dlogp, T);
  ops.copy_from_host(dlogp, gradient.dlogp.data());
  // With an entropy term, the forward's entropy is still in its buffer (the policy's
  // forward of this micro-batch was the last one).
  Tensor dentropy, entropy;
  if (!gradient.dentropy.empty()) {
    dentropy = first_rows(tokens_.dentropy, T);
    entropy = first_rows(tokens_.entropy, T);
    ops.copy_from_host(dentropy, gradient.dentropy.data());
  }
  backend_->token_logprobs_backward(logits, first_rows(tokens_.targets, T), first_rows(tokens_.lse, T), entropy, dlogp,
                                    dentropy, LogprobSettings{settings.temperature, settings.logprob_chunk});
  transformer_.backward(params_, grad_params_, acts_, logits);
}

void PolicyTrainer::accumulate_gradients(const Packed& packed, TokenValues& values,
                                         const PolicyTrainerSettings& settings, const LossGradient& loss_gradient) {
  const std::vector<MicroBatch> micros = split(packed, settings.micro_batch_tokens);
  backend_->ops().zero(memory_.grads);
  auto part = [](std::vector<float>& vector, const MicroBatch& micro) {
    return vector.empty() ? std::span<float>()
                          : std::span(vector).subspan(static_cast<size_t>(micro.begin),
                                                      static_cast<size_t>(micro.tokens()));
  };
  non_finite_.clear();
  for (size_t index = 0; index < micros.size(); ++index) {
    const MicroBatch& micro = micros[index];
    // The reference runs first: the policy's forward must be the last one on the activations.
    if (!values.ref_logp.empty()) forward(reference_, packed, micro, part(values.ref_logp, micro), {}, settings);
    const Tensor logits = forward(params_, packed, micro, part(values.logp, micro), part(values.entropy, micro), settings);
    backward(micro, logits, loss_gradient(micro), settings);
    // One micro-batch on one rank: the step's norm below tells it at no extra cost.
    if (micros.size() > 1 || world_size_ > 1) check_micro_batch_gradients(index, micros.size());
  }
}

void PolicyTrainer::check_micro_batch_gradients(size_t index, size_t count) {
  // NaN and infinity stay in a sum, so the first micro-batch that leaves the slab
  // non-finite is the one that brought them; one reduction per micro-batch finds it.
  if (!non_finite_.empty() || std::isfinite(backend_->square_sum(memory_.grads))) return;
  non_finite_ = "micro-batch " + std::to_string(index + 1) + " of " + std::to_string(count) + ", tensor " +
                first_non_finite_gradient(*backend_, memory_.grads, layout_);
}

double PolicyTrainer::sum_over_ranks(double value) {
  float total = static_cast<float>(value);  // token counts: exact in FP32 below 2^24
  backend_->ops().copy_from_host(tokens_.scalar, &total);
  communicator_.all_reduce_sum(tokens_.scalar.ptr<float>(), 1);
  communicator_.synchronize();
  backend_->copy_to_host(&total, tokens_.scalar);
  return total;
}

Tensor PolicyTrainer::shard_part(const Tensor& slab) const {
  return Tensor::view(slab.ptr<float>() + shard_.begin(), DType::F32, slab.device, {shard_.elements()});
}

Tensor PolicyTrainer::reduce_gradients(bool gradients_add_up) {
  const Tensor& grads = memory_.grads;
  const bool sharded = shard_.ranks() > 1;
  backend_->synchronize();  // the collective runs on the communicator's own stream
  if (sharded)
    communicator_.reduce_scatter_sum(grads.ptr<float>(), shard_.counts());
  else
    communicator_.all_reduce_sum(grads.ptr<float>(), static_cast<size_t>(grads.numel()));
  communicator_.synchronize();
  const Tensor owned = shard_part(grads);
  if (world_size_ > 1 && !gradients_add_up) backend_->scale(owned, 1.0f / static_cast<float>(world_size_));
  return owned;
}

TrainStepResult PolicyTrainer::update(double lr, int64_t step, const PolicyTrainerSettings& settings,
                                      bool gradients_add_up) {
  const bool sharded = shard_.ranks() > 1;
  const Tensor owned = reduce_gradients(gradients_add_up);
  TrainStepResult result;
  // Sharded, the norm is the global one: the shards' square sums added over the ranks, the
  // same on every rank (a NaN or infinity in any shard makes it non-finite on all of them).
  const double square_sum = backend_->square_sum(owned);
  result.grad_norm = std::sqrt(sharded ? sum_over_ranks(square_sum) : square_sum);
  if (settings.max_grad_norm > 0) {
    const double factor = clip_scale(result.grad_norm, settings.max_grad_norm);
    if (factor != 1) backend_->scale(owned, static_cast<float>(factor));
  }
  if (!std::isfinite(result.grad_norm)) {  // skip the update, keep the weights
    // Unseen so far: one micro-batch on one rank, or another rank's gradients brought it.
    if (non_finite_.empty()) {
      const std::string local =
          first_non_finite_gradient(*backend_, memory_.grads, layout_, shard_.begin(), shard_.end());
      if (sharded)
        non_finite_ = local.empty() ? "after the reduce-scatter, in another rank's shard"
                                    : "after the reduce-scatter, tensor " + local;
      else
        non_finite_ = (world_size_ > 1 ? "after the all-reduce, tensor " : "micro-batch 1 of 1, tensor ") + local;
    }
    result.non_finite = non_finite_;
    return result;
  }
  const auto start = std::chrono::steady_clock::now();
  result.state_bytes_streamed = optimizer_->run(settings.optimizer, lr, step);
  // An F32 working copy apart from the master weights (a BF16 one is written by the optimizer).
  const Tensor& working = memory_.working;
  if (working.dtype != DType::BF16 && working.data != memory_.master.data)
    backend_->ops().copy(shard_part(working), memory_.master);
  if (sharded) {  // every rank's updated shard of the working copy reaches every rank
    backend_->synchronize();
    communicator_.all_gather(working.data, shard_.counts(), dtype_size(working.dtype));
    communicator_.synchronize();
  }
  backend_->synchronize();
  result.optimizer_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

TrainStepResult PolicyTrainer::grpo_step(const std::vector<TrainSequence>& batch, const PolicyLossSettings& loss,
                                         double lr, int64_t step, const PolicyTrainerSettings& settings) {
  const Packed packed = pack(batch);
  if (loss.kl_coef != 0 && !reference_.layout)
    throw std::invalid_argument("PolicyTrainer: a KL term needs a reference policy");
  // The whole batch's denominators, which every micro-batch's loss is normalised by.
  const int64_t tokens = std::count(packed.mask.begin(), packed.mask.end(), uint8_t{1});
  int64_t sequences = 0;
  for (size_t s = 0; s < batch.size(); ++s)
    sequences += std::any_of(packed.mask.begin() + packed.cu_seqlens[s], packed.mask.begin() + packed.cu_seqlens[s + 1],
                             [](uint8_t m) { return m != 0; });
  const bool global = loss.aggregation == LossAggregation::GlobalTokenSum;
  const double global_tokens = global ? sum_over_ranks(static_cast<double>(tokens)) : 0.0;
  auto with_denominators = [&](PolicyLossBatch inputs) {
    inputs.global_tokens = global_tokens;
    inputs.batch_tokens = tokens;
    inputs.batch_sequences = sequences;
    return inputs;
  };

  const size_t T = packed.ids.size();
  TokenValues values{std::vector<float>(T), std::vector<float>(T),
                     loss.kl_coef != 0 ? std::vector<float>(T) : std::vector<float>()};
  accumulate_gradients(packed, values, settings, [&](const MicroBatch& micro) {
    return policy_loss(with_denominators(loss_inputs(packed, values, micro.begin, micro.end, micro.cu_seqlens)), loss);
  });
  // The loss and its metrics over the whole batch.
  const PolicyLoss policy = policy_loss(
      with_denominators(loss_inputs(packed, values, 0, static_cast<int64_t>(T), packed.cu_seqlens)), loss);
  TrainStepResult result = update(lr, step, settings, global);
  // The step's loss: a sum of the ranks' shares, or the mean of the ranks' means.
  result.loss = global ? sum_over_ranks(policy.loss) : sum_over_ranks(policy.loss) / world_size_;
  result.metrics = policy.metrics;
  result.sequence_logp = per_sequence(batch, packed, values.logp);
  result.sequence_entropy = per_sequence(batch, packed, values.entropy);
  if (!values.ref_logp.empty()) result.sequence_reference_logp = per_sequence(batch, packed, values.ref_logp);
  result.tokens = policy.metrics.tokens;
  double sum = 0;
  for (size_t t = 0; t < T; ++t) sum += packed.mask[t] ? values.logp[t] : 0.0;
  result.mean_logp = result.tokens ? sum / static_cast<double>(result.tokens) : 0.0;
  return result;
}

TrainStepResult PolicyTrainer::sft_step(const std::vector<TrainSequence>& batch, double lr, int64_t step,
                                        const PolicyTrainerSettings& settings) {
  const Packed packed = pack(batch);
  const int64_t tokens = std::count(packed.mask.begin(), packed.mask.end(), uint8_t{1});
  // The mean over every rank's tokens, so the update does not depend on how the batch is split.
  const double global_tokens = sum_over_ranks(static_cast<double>(tokens));
  TokenValues values{std::vector<float>(packed.ids.size()), {}, {}};
  accumulate_gradients(packed, values, settings, [&](const MicroBatch& micro) {
    PolicyLoss gradient;
    gradient.dlogp.assign(static_cast<size_t>(micro.tokens()), 0.0f);
    for (int64_t t = micro.begin; t < micro.end; ++t)
      if (packed.mask[t]) gradient.dlogp[t - micro.begin] = static_cast<float>(-1.0 / global_tokens);
    return gradient;
  });
  double sum = 0;
  for (size_t t = 0; t < values.logp.size(); ++t)
    if (packed.mask[t]) sum += values.logp[t];
  TrainStepResult result = update(lr, step, settings, true);
  result.tokens = tokens;
  result.mean_logp = global_tokens > 0 ? sum_over_ranks(sum) / global_tokens : 0.0;
  result.loss = -result.mean_logp;
  return result;
}

}  // namespace tandem
