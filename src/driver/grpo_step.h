// The work of one RL step on one rank between the handoffs: rollout of G completions per
// prompt with the engine, rewards from the task, group advantages; then the trainer's
// update (the supervised warm-up while the [sft] steps last, GRPO after). The step loop
// in run_job wraps it with the handoffs, checkpoints and metrics.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deck/deck.h"
#include "model/cpu_ops.h"
#include "io/run_file.h"
#include "rollout/engine.h"
#include "tasks/char_tokenizer.h"
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
  std::vector<TrainSequence> sequences;   // prompt, completion, rollout log-probs, advantage
  std::vector<TrainSequence> references;  // each prompt with the task's own answer (for SFT)
  double reward_mean = 0, reward_std = 0, accuracy = 0, format_rate = 0, response_length = 0;
  double reward_square_mean = 0;  // with reward_mean, gives the std over all ranks' samples
  int64_t generated_tokens = 0;
  std::string example;  // one prompt and its first completion, for the log
  std::vector<std::string> prompt_texts, completion_texts;  // per sample
  std::vector<double> rewards;                              // per sample
};

class GrpoStep {
 public:
  GrpoStep(const Deck& deck, const ModelConfig& model, const ParameterLayout& layout, ColocatedMemory& memory,
           MemoryPool& pool, Communicator& communicator, int rank, int world_size);
  ~GrpoStep();

  // The task's prompts for this step (the same on every run: indices follow the step and
  // the rank), G sampled completions each, their rewards and advantages.
  RolloutSummary rollout(int64_t step);
  TrainStepResult train(int64_t step, const RolloutSummary& rollout);
  bool is_sft(int64_t step) const { return step <= sft_steps_; }
  // The step's samples for the run file; train log-probs come from a GRPO update.
  static std::vector<SampleRecord> samples(const RolloutSummary& rollout, const TrainStepResult& trained);
  int32_t vocab_needed() const { return tokenizer_->vocab_size(); }

 private:
  MemoryPool& pool_;
  Allocation* reference_ = nullptr;  // the frozen initial policy, when the loss has a KL term
  Allocation* activations_ = nullptr;
  std::unique_ptr<Task> task_;
  std::unique_ptr<CharTokenizer> tokenizer_;
  int32_t bos_ = 0, eos_ = 0;
  int64_t prompts_per_step_, group_size_, sft_steps_, rl_steps_;
  int rank_, world_size_;
  uint64_t seed_;
  SamplingParams sampling_;
  AdvantageSettings advantages_;
  PolicyLossSettings loss_;
  PolicyTrainerSettings trainer_settings_;
  double sft_lr_;
  LrSchedule rl_schedule_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<PolicyTrainer> trainer_;
};

}  // namespace tandem
