#include "driver/grpo_step.h"

#include <algorithm>
#include <cmath>

#include "driver/colocated_memory.h"
#include "driver/model_from_deck.h"
#include "driver/optimizer_from_deck.h"
#include "driver/rollout_from_deck.h"
#include "driver/run_deck_schema.h"
#include "tensor/device_copy.h"
#include "train/dynamic_sampling.h"
#include "world/gpu.h"
#include "world/host_memory.h"
#include "world/log.h"
#include "world/stall_guard.h"
#include "world/world.h"

namespace tandem {

size_t kv_cache_bytes(const Deck& deck, Device device) {
  const double fraction = deck.get<double>("rollout.kv-cache-fraction");
  if (fraction <= 0) return deck.get<Bytes>("rollout.kv-cache").value;
  const size_t free = device == Device::CUDA ? gpu_free_memory() : available_host_memory();
  return static_cast<size_t>(fraction * static_cast<double>(free));
}

GrpoStep::GrpoStep(const Deck& deck, const ModelConfig& model, const ParameterLayout& layout, ColocatedMemory& memory,
                   MemoryPool& pool, Communicator& communicator, int rank, int world_size, MPI_Comm comm,
                   GroupSource* rollout_ranks)
    : pool_(pool),
      task_(task_from_deck(deck)),
      format_(prompt_format_from_deck(deck, *task_)),
      prompts_per_step_(deck.get<int64_t>("task.prompts-per-step")),
      group_size_(deck.get<int64_t>("grpo.group-size")),
      sft_steps_(deck.get<int64_t>("sft.steps")),
      rl_steps_(std::max<int64_t>(1, deck.get<int64_t>("run.steps") - deck.get<int64_t>("sft.steps"))),
      dynamic_sampling_(deck.get<bool>("grpo.dynamic-sampling")),
      dynamic_sampling_rounds_(deck.get<int64_t>("grpo.dynamic-sampling-rounds")),
      over_sampling_groups_(deck.get<int64_t>("grpo.over-sampling-groups")),
      rank_(rank),
      world_size_(world_size),
      comm_(comm),
      sft_lr_(deck.get<double>("sft.lr")),
      rl_schedule_(deck.get<double>("grpo.lr"), deck.get<double>("grpo.lr") * 0.1,
                   std::min(deck.get<int64_t>("grpo.warmup-steps"), rl_steps_), rl_steps_) {
  if (format_.tokenizer().vocab_size() > model.vocab)
    throw std::invalid_argument("model.vocab = " + std::to_string(model.vocab) + " is smaller than the tokenizer's " +
                                std::to_string(format_.tokenizer().vocab_size()) + " tokens");
  const GroupSamplingSettings sampling = group_sampling_from_deck(deck, format_);
  advantages_.scale_by_std = deck.get<bool>("grpo.std-normalisation");
  loss_.eps_low = deck.get<double>("grpo.eps-low");
  loss_.eps_high = deck.get<double>("grpo.eps-high");
  loss_.aggregation = loss_aggregation_from_name(deck.get<std::string>("grpo.loss-aggregation"));
  loss_.kl_coef = deck.get<double>("grpo.kl-coef");
  loss_.kl_estimator = kl_estimator_from_name(deck.get<std::string>("grpo.kl-estimator"));
  loss_.entropy_coef = deck.get<double>("grpo.entropy-coef");
  trainer_settings_.temperature = sampling.sampling.temperature;
  trainer_settings_.max_grad_norm = deck.get<double>("grpo.max-grad-norm");
  trainer_settings_.optimizer = optimizer_settings_from_deck(deck);
  trainer_settings_.micro_batch_tokens = deck.get<int64_t>("train.micro-batch-tokens");

  const int64_t sequence_tokens = sequence_tokens_from_deck(deck, *task_, format_);
  // A pretrained model's prompts are only known here: before the engine and the trainer
  // take their memory.
  fail_together_on_error(comm, [&] { require_micro_batch_holds_a_sequence(deck, sequence_tokens); });
  const int64_t sequences = prompts_per_step_ * group_size_;
  // The engine and the trainer's forward run in the working dtype (FP32 on the CPU).
  const DType dtype = memory.working().dtype;
  if (rollout_ranks) {
    source_ = rollout_ranks;  // this rank trains only
  } else {
    const Tensor engine_weights = memory.engine_weights();
    engine_ = std::make_unique<Engine>(model, ParameterSet::bind(layout, engine_weights.data, dtype, pool.device()), pool,
                                       engine_options_from_deck(deck, *task_, format_, sequences, dtype, pool.device()),
                                       &format_.tokenizer());
    local_sampler_ = std::make_unique<LocalGroupSampler>(*engine_, *task_, format_, sampling);
    source_ = local_sampler_.get();
  }
  // Transient: the handoffs drop them between train phases instead of copying them.
  const int64_t micro_batch = trainer_settings_.micro_batch_tokens;
  // A micro-batch holds whole sequences (checked above), of one token or more each.
  const int64_t capacity_tokens = micro_batch > 0 ? micro_batch : sequences * sequence_tokens;
  const ActivationCapacity capacity{capacity_tokens, std::min(sequences, capacity_tokens)};
  activations_ = pool.allocate(tags::activations,
                               PolicyTrainer::activation_bytes(model, capacity, dtype, trainer_settings_.optimizer.kind),
                               "trainer.activations");
  // The trainer reads its working copy (FP32 on the CPU backend), which the optimizer step
  // rewrites: with the alias transport it is the engine's weights too.
  const PolicyTrainerMemory trainer_memory{memory.master(),     memory.grads(),   memory.exp_avg(),
                                           memory.exp_avg_sq(), memory.working(), activations_->ptr,
                                           memory.state_staging(), memory.state_slot_elements(), memory.shard()};
  trainer_ = std::make_unique<PolicyTrainer>(model, layout, trainer_memory, capacity, communicator, world_size);
  if (loss_.kl_coef != 0) {
    // The frozen reference (load_reference), under its own tag: it is trainer memory that
    // never changes.
    reference_ = pool.allocate(tags::reference, layout.slab_bytes(dtype), "trainer.reference_weights");
    reference_weights_ = Tensor::view(reference_->ptr, dtype, pool.device(), {layout.slab_elements()});
    trainer_->set_reference(reference_weights_);
  }
}

void GrpoStep::load_reference(const std::vector<float>& initial_weights) {
  if (reference_) copy_floats_to_tensor(reference_weights_, initial_weights);
}

GrpoStep::~GrpoStep() {
  local_sampler_.reset();
  engine_.reset();  // its KV cache is pool memory too
  trainer_.reset();
  pool_.release(activations_);
  if (reference_) pool_.release(reference_);
}

void GrpoStep::count_samples(const std::vector<SampledGroup>& groups, RolloutSummary& summary) const {
  for (const SampledGroup& group : groups)
    for (const SampledGroup::Sample& sample : group.samples) {
      summary.reward_sum += sample.reward;
      summary.reward_square_sum += sample.reward * sample.reward;
      summary.correct_sum += sample.correct;
      summary.format_sum += sample.format;
      summary.generated_tokens += static_cast<int64_t>(sample.tokens.size());
      ++summary.drawn_samples;
      if (summary.example.empty())
        summary.example = task_->sample(group.prompt_index).text + sample.text + (sample.correct ? "  (right)" : "  (wrong)");
    }
}

std::vector<double> GrpoStep::all_gather_rewards(const std::vector<SampledGroup>& round) const {
  std::vector<double> mine;
  for (const SampledGroup& group : round) {
    const std::vector<double> rewards = group.rewards();
    mine.insert(mine.end(), rewards.begin(), rewards.end());
  }
  // A round that ended early leaves the ranks unequal counts.
  const int count = static_cast<int>(mine.size());
  std::vector<int> counts(world_size_), offsets(world_size_);
  all_gather(&count, 1, MPI_INT, counts.data(), comm_, "the gathering of rewards");
  int total = 0;
  for (int r = 0; r < world_size_; ++r) {
    offsets[r] = total;
    total += counts[r];
  }
  std::vector<double> all(total);
  MPI_Request request;
  MPI_Iallgatherv(mine.data(), count, MPI_DOUBLE, all.data(), counts.data(), offsets.data(), MPI_DOUBLE, comm_, &request);
  wait_for_ranks(request, "the gathering of rewards", comm_);
  return all;
}

RolloutSummary GrpoStep::rollout(int64_t step, int64_t cursor, int first_round_age) {
  RolloutSummary summary;
  const int64_t batch = world_size_ * prompts_per_step_;  // groups a step trains on, over all ranks
  const bool filter = dynamic_sampling_ && !is_sft(step);
  const int64_t slice = over_sampling_groups_ > 0 ? over_sampling_groups_ : prompts_per_step_;  // per rank and round
  const int64_t round_groups = world_size_ * slice;
  // Every round offers its groups, so the flat ones are counted with or without the filter.
  DynamicSampling sampling({.batch_groups = batch, .group_size = group_size_, .over_sampling_groups = round_groups,
                            .max_rounds = filter ? dynamic_sampling_rounds_ : 1});
  std::vector<SampledGroup> mine;      // every group this rank drew that counts, round after round
  std::vector<uint64_t> chosen, left;  // prompt indices of the groups kept and of the flat ones
  int64_t drawn = 0;
  uint64_t first_round_end = 0;  // the prompts of the first round (which may be older) come before it
  do {
    const uint64_t round_first = static_cast<uint64_t>(cursor + drawn);
    // With over-sampling, a round's groups after those that decide the batch do not count.
    const BatchDecision decision = over_sampling_groups_ > 0 ? sampling.next_decision(filter) : BatchDecision{};
    RoundGroups round = source_->sample(step, round_first + static_cast<uint64_t>(rank_ * slice), slice, decision);
    summary.aborted_requests += round.aborted_requests;
    summary.graph_setup_seconds += round.graph_setup_seconds;
    if (!round.stopped.empty()) {
      summary.stopped = round.stopped;
      return summary;
    }
    std::vector<double> rewards = all_gather_rewards(round.groups);
    const int64_t decided = decision.decided_by(rewards);
    const int64_t counted = decided > 0 ? decided : round_groups;
    rewards.resize(static_cast<size_t>(counted * group_size_));
    std::erase_if(round.groups, [&](const SampledGroup& group) { return group.prompt_index >= round_first + counted; });
    count_samples(round.groups, summary);
    const std::vector<int64_t> spread = sampling.offer(rewards);
    for (int64_t position = 0, next = 0; position < counted; ++position) {
      const bool has_spread = next < static_cast<int64_t>(spread.size()) && spread[next] == position;
      next += has_spread;
      (has_spread || !filter ? chosen : left).push_back(round_first + static_cast<uint64_t>(position));
    }
    mine.insert(mine.end(), std::make_move_iterator(round.groups.begin()), std::make_move_iterator(round.groups.end()));
    drawn += counted;
    if (first_round_end == 0) first_round_end = round_first + static_cast<uint64_t>(counted);
  } while (filter && sampling.groups_to_sample() > 0);
  if (static_cast<int64_t>(chosen.size()) < batch) {
    // The trainer's batch has a fixed size: groups without a spread fill it, with zero advantages.
    if (rank_ == 0)
      TLOG(warning) << "dynamic sampling: " << chosen.size() << " of " << batch << " groups have a reward spread after "
                    << sampling.rounds() << " rounds (grpo.dynamic-sampling-rounds); the batch is filled with "
                    << batch - static_cast<int64_t>(chosen.size()) << " groups of equal rewards";
    chosen.insert(chosen.end(), left.begin(), left.begin() + (batch - static_cast<int64_t>(chosen.size())));
    std::sort(chosen.begin(), chosen.end());
  }

  // When each rank's one round is its batch, it trains on the groups it drew; else the kept
  // groups, wherever they were drawn, are dealt out in prompt order, prompts-per-step to a rank.
  std::vector<SampledGroup> share;
  if (!filter && round_groups == batch) {
    share = std::move(mine);
  } else {
    std::vector<SampledGroup> kept_here;
    for (SampledGroup& group : mine)
      if (std::binary_search(chosen.begin(), chosen.end(), group.prompt_index)) kept_here.push_back(std::move(group));
    std::vector<SampledGroup> kept = all_gather_groups(comm_, kept_here);
    std::sort(kept.begin(), kept.end(), [](const SampledGroup& a, const SampledGroup& b) { return a.prompt_index < b.prompt_index; });
    const auto first = kept.begin() + rank_ * prompts_per_step_;
    share.assign(std::make_move_iterator(first), std::make_move_iterator(first + prompts_per_step_));
  }

  for (const SampledGroup& group : share) {
    TrainSequence reference;
    reference.prompt = group.prompt;
    reference.completion = format_.completion_ids(task_->reference_completion(task_->sample(group.prompt_index)));
    summary.references.push_back(std::move(reference));
    for (const SampledGroup::Sample& sample : group.samples) {
      TrainSequence sequence;
      sequence.prompt = group.prompt;
      sequence.completion = sample.tokens;
      sequence.old_logprobs = sample.logprobs;
      summary.sequences.push_back(std::move(sequence));
      summary.prompt_texts.push_back(group.prompt_text);
      summary.completion_texts.push_back(sample.text);
      summary.rewards.push_back(sample.reward);
    }
  }
  const std::vector<float> advantages = group_advantages(summary.rewards, group_size_, advantages_);
  for (size_t r = 0; r < summary.sequences.size(); ++r) summary.sequences[r].advantage = advantages[r];

  // The step trains on the first `batch` chosen groups (in prompt order, as dealt out).
  const auto first_round = std::count_if(chosen.begin(), chosen.begin() + batch, [&](uint64_t index) { return index < first_round_end; });
  summary.staleness = static_cast<double>(first_round_age * first_round) / static_cast<double>(batch);

  summary.prompts_drawn = drawn;
  summary.sampling_metrics = {
      {"sampling/drawn_groups", static_cast<double>(drawn)},
      {"sampling/kept_groups", static_cast<double>(sampling.kept())},
      {"sampling/zero_spread_fraction", static_cast<double>(sampling.dropped_flat()) / static_cast<double>(drawn)},
      {"sampling/rounds", static_cast<double>(sampling.rounds())},
      {"rollout/aborted_requests", static_cast<double>(summary.aborted_requests)},
      {"rollout/graph_setup_seconds", summary.graph_setup_seconds},
  };
  return summary;
}

TrainStepResult GrpoStep::train(int64_t step, const RolloutSummary& rollout) {
  if (is_sft(step)) return trainer_->sft_step(rollout.references, sft_lr_, step, trainer_settings_);
  // Every completion has at least one token (the engine generates one before any stop).
  return trainer_->grpo_step(rollout.sequences, loss_, rl_schedule_.at(step - sft_steps_), step, trainer_settings_);
}

namespace {

// Each token decoded alone, for a token-level view; an id the tokenizer cannot decode
// shows as "<unknown token>", as in completion_text.
std::vector<std::string> token_pieces(const PromptFormat& format, const std::vector<int32_t>& ids) {
  std::vector<std::string> pieces;
  pieces.reserve(ids.size());
  for (const int32_t id : ids) {
    try {
      pieces.push_back(id >= 0 && id < format.tokenizer().vocab_size() ? format.tokenizer().decode({&id, 1})
                                                                       : "<unknown token>");
    } catch (const std::out_of_range&) {
      pieces.push_back("<unknown token>");
    }
  }
  return pieces;
}

}  // namespace

std::vector<SampleRecord> GrpoStep::samples(const RolloutSummary& rollout, const TrainStepResult& trained) const {
  // A per-sequence value of the update when it has one, else NaN (a supervised step).
  auto per_token = [](const std::vector<std::vector<float>>& values, size_t i, size_t tokens) {
    return i < values.size() ? values[i] : std::vector<float>(tokens, NAN);
  };
  std::vector<SampleRecord> records;
  for (size_t i = 0; i < rollout.sequences.size(); ++i) {
    const TrainSequence& sequence = rollout.sequences[i];
    const size_t n = sequence.completion.size();
    SampleRecord record;
    record.prompt_text = rollout.prompt_texts[i];
    record.completion_text = rollout.completion_texts[i];
    record.prompt_tokens = sequence.prompt;
    record.completion_tokens = sequence.completion;
    record.prompt_pieces = token_pieces(format_, sequence.prompt);
    record.completion_pieces = token_pieces(format_, sequence.completion);
    record.rollout_logp = sequence.old_logprobs;
    record.train_logp = per_token(trained.sequence_logp, i, n);
    record.entropy = per_token(trained.sequence_entropy, i, n);
    if (!trained.sequence_reference_logp.empty()) record.reference_logp = per_token(trained.sequence_reference_logp, i, n);
    record.advantage = sequence.advantage;
    record.reward = rollout.rewards[i];
    records.push_back(std::move(record));
  }
  return records;
}

}  // namespace tandem
