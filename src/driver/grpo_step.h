// The work of one RL step on one rank between the handoffs: rollout of G completions per
// prompt with the engine, rewards from the task, group advantages; then the trainer's
// update (the supervised warm-up while the [sft] steps last, GRPO after). The step loop
// in run_job wraps it with the handoffs, checkpoints and metrics.
//
// Prompts come from one sequence of global indices shared by all ranks, consumed from the
// run's prompt cursor: a round of a step draws prompts-per-step prompts per rank, rank r
// taking the r-th slice, so N ranks draw the same prompts as one rank with N times the
// prompts. Dynamic sampling draws rounds until the step has a full batch of groups with
// a reward spread, and deals the kept groups out to the ranks in prompt order.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deck/deck.h"
#include "io/run_file.h"
#include "rollout/engine.h"
#include "driver/group_sampler.h"
#include "driver/sampled_group.h"
#include "tasks/prompt_format.h"
#include "tasks/task.h"
#include "train/advantages.h"
#include "train/lr_schedule.h"
#include "train/policy_trainer.h"

namespace tandem {

class ColocatedMemory;

// The engine's KV cache: rollout.kv-cache bytes, or rollout.kv-cache-fraction of the free
// memory of the device (the GPU's, or the host's MemAvailable on the CPU backend).
size_t kv_cache_bytes(const Deck& deck, Device device);

struct RolloutSummary {
  // The batch this rank trains on: prompts-per-step groups.
  std::vector<TrainSequence> sequences;   // prompt, completion, rollout log-probs, advantage
  std::vector<TrainSequence> references;  // each prompt with the task's own answer (for SFT)
  std::vector<std::string> prompt_texts, completion_texts;  // per sequence
  std::vector<double> rewards;                              // per sequence
  // Over the samples of the groups this rank drew that count (all, or those that decided
  // the batch): sums, which the step adds up over the ranks for how the policy does.
  double reward_sum = 0, reward_square_sum = 0, correct_sum = 0, format_sum = 0;
  int64_t generated_tokens = 0, drawn_samples = 0;
  std::string example;  // one prompt and its first completion, for the log
  // The same on every rank: prompts the step drew over all ranks (the cursor's advance),
  // the requests the rollout ranks aborted, and the dynamic-sampling figures.
  int64_t prompts_drawn = 0;
  int64_t aborted_requests = 0;
  MetricValues sampling_metrics;
  // RoundGroups::graph_setup_seconds over the rollout's rounds: the rank's own engine's
  // when colocated, the rollout ranks' (the same on every trainer) otherwise.
  double graph_setup_seconds = 0;
  // Not empty: a stop signal or the time limit cut the rollout (why), and the step is void.
  std::string stopped;
  // The mean policy age of the groups the step trains on, in optimizer steps: how many
  // updates older the weights that sampled them are than the ones the step trains.
  double staleness = 0;
};

class GrpoStep {
 public:
  // rollout_ranks: where the groups come from when this rank trains only (the rollout
  // ranks' client); null: a colocated rank, which builds its own engine.
  GrpoStep(const Deck& deck, const ModelConfig& model, const ParameterLayout& layout, ColocatedMemory& memory,
           MemoryPool& pool, Communicator& communicator, int rank, int world_size, MPI_Comm comm,
           GroupSource* rollout_ranks = nullptr);
  ~GrpoStep();

  // With a KL term (grpo.kl-coef != 0), the frozen reference becomes the run's initial
  // policy (initial_weights_from_deck): on a restart too, so it is the same one.
  bool has_reference() const { return reference_ != nullptr; }
  void load_reference(const std::vector<float>& initial_weights);

  // The step's prompts from global index `cursor` on (the prompts the run has consumed),
  // G sampled completions each, their rewards and advantages. Collective. The first round
  // was sampled by a policy `first_round_age` steps old (a round ordered ahead under
  // rollout.max-staleness); any further round by the current one.
  RolloutSummary rollout(int64_t step, int64_t cursor, int first_round_age);
  TrainStepResult train(int64_t step, const RolloutSummary& rollout);
  bool is_sft(int64_t step) const { return step <= sft_steps_; }
  // The step's samples for the run file; train log-probs, entropies and reference
  // log-probs come from a GRPO update (NaN after a supervised step).
  std::vector<SampleRecord> samples(const RolloutSummary& rollout, const TrainStepResult& trained) const;

 private:
  // The statistics of `summary` take the samples of `groups`.
  void count_samples(const std::vector<SampledGroup>& groups, RolloutSummary& summary) const;
  // Every rank's rewards of a round (each rank's slice, in rank order), in prompt order.
  std::vector<double> all_gather_rewards(const std::vector<SampledGroup>& round) const;

  MemoryPool& pool_;
  Allocation* reference_ = nullptr;  // the frozen initial policy, when the loss has a KL term
  Tensor reference_weights_;         // its view
  Allocation* activations_ = nullptr;
  std::unique_ptr<Task> task_;
  PromptFormat format_;
  int64_t prompts_per_step_, group_size_, sft_steps_, rl_steps_;
  bool dynamic_sampling_;
  int64_t dynamic_sampling_rounds_;
  int64_t over_sampling_groups_;  // per rank and round; 0: rounds of prompts-per-step, drawn whole
  int rank_, world_size_;
  MPI_Comm comm_;
  AdvantageSettings advantages_;
  PolicyLossSettings loss_;
  PolicyTrainerSettings trainer_settings_;
  double sft_lr_;
  LrSchedule rl_schedule_;
  std::unique_ptr<Engine> engine_;  // colocated: the rank's own, sampled by local_sampler_
  std::unique_ptr<LocalGroupSampler> local_sampler_;
  GroupSource* source_ = nullptr;  // local_sampler_, or the rollout ranks
  std::unique_ptr<PolicyTrainer> trainer_;
};

}  // namespace tandem
