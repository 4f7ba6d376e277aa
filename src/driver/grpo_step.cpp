#include "driver/grpo_step.h"

#include <algorithm>
#include <cmath>

#include "driver/colocated_memory.h"
#include "tasks/arithmetic_task.h"
#include "tasks/countdown_task.h"
#include "tensor/device_copy.h"
#include "world/gpu.h"
#include "world/host_memory.h"

namespace tandem {

namespace {

std::unique_ptr<Task> make_task(const Deck& deck) {
  if (deck.get<std::string>("task.name") == "countdown") {
    CountdownSettings settings;
    settings.seed = static_cast<uint64_t>(deck.get<int64_t>("run.seed"));
    settings.numbers = static_cast<int>(deck.get<int64_t>("task.numbers"));
    settings.max_number = deck.get<int64_t>("task.max-number");
    settings.max_target = deck.get<int64_t>("task.max-target");
    settings.style = PromptStyle::Compact;
    return std::make_unique<CountdownTask>(settings);
  }
  ArithmeticSettings settings;
  settings.seed = static_cast<uint64_t>(deck.get<int64_t>("run.seed"));
  settings.digits = static_cast<int>(deck.get<int64_t>("task.digits"));
  settings.operations = deck.get<std::string>("task.operations");
  settings.style = PromptStyle::Compact;
  return std::make_unique<ArithmeticTask>(settings);
}

int64_t longest_prompt(const Task& task, const CharTokenizer& tokenizer) {
  size_t longest = 0;
  for (uint64_t i = 0; i < 64; ++i) longest = std::max(longest, tokenizer.encode(task.sample(i).text).size());
  return static_cast<int64_t>(longest) + 8;  // BOS, and room for longer draws
}

}  // namespace

size_t kv_cache_bytes(const Deck& deck, Device device) {
  const double fraction = deck.get<double>("rollout.kv-cache-fraction");
  if (fraction <= 0) return deck.get<Bytes>("rollout.kv-cache").value;
  const size_t free = device == Device::CUDA ? gpu_free_memory() : available_host_memory();
  return static_cast<size_t>(fraction * static_cast<double>(free));
}

GrpoStep::GrpoStep(const Deck& deck, const ModelConfig& model, const ParameterLayout& layout, ColocatedMemory& memory,
                   MemoryPool& pool, Communicator& communicator, int rank, int world_size)
    : pool_(pool),
      task_(make_task(deck)),
      tokenizer_(std::make_unique<CharTokenizer>(task_->alphabet())),
      prompts_per_step_(deck.get<int64_t>("task.prompts-per-step")),
      group_size_(deck.get<int64_t>("grpo.group-size")),
      sft_steps_(deck.get<int64_t>("sft.steps")),
      rl_steps_(std::max<int64_t>(1, deck.get<int64_t>("run.steps") - deck.get<int64_t>("sft.steps"))),
      rank_(rank),
      world_size_(world_size),
      seed_(static_cast<uint64_t>(deck.get<int64_t>("run.seed"))),
      sft_lr_(deck.get<double>("sft.lr")),
      rl_schedule_(deck.get<double>("grpo.lr"), deck.get<double>("grpo.lr") * 0.1,
                   std::min(deck.get<int64_t>("grpo.warmup-steps"), rl_steps_), rl_steps_) {
  if (tokenizer_->vocab_size() > model.vocab)
    throw std::invalid_argument("model.vocab = " + std::to_string(model.vocab) + " is smaller than the task's " +
                                std::to_string(tokenizer_->vocab_size()) + " tokens");
  bos_ = tokenizer_->id_of("<bos>");
  eos_ = tokenizer_->id_of("<eos>");
  sampling_.temperature = static_cast<float>(deck.get<double>("grpo.temperature"));
  sampling_.max_new_tokens = static_cast<int>(deck.get<int64_t>("grpo.max-new-tokens"));
  sampling_.stop_token_ids = {eos_};
  advantages_.scale_by_std = deck.get<bool>("grpo.std-normalisation");
  loss_.eps_low = deck.get<double>("grpo.eps-low");
  loss_.eps_high = deck.get<double>("grpo.eps-high");
  loss_.aggregation = loss_aggregation_from_name(deck.get<std::string>("grpo.loss-aggregation"));
  loss_.kl_coef = deck.get<double>("grpo.kl-coef");
  loss_.kl_estimator = kl_estimator_from_name(deck.get<std::string>("grpo.kl-estimator"));
  loss_.entropy_coef = deck.get<double>("grpo.entropy-coef");
  trainer_settings_.temperature = sampling_.temperature;
  trainer_settings_.max_grad_norm = deck.get<double>("grpo.max-grad-norm");
  trainer_settings_.adamw = AdamWSettings{.lr = 0, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.0};
  trainer_settings_.micro_batch_tokens = deck.get<int64_t>("train.micro-batch-tokens");

  const int64_t sequence_tokens = longest_prompt(*task_, *tokenizer_) + sampling_.max_new_tokens;
  const int64_t sequences = prompts_per_step_ * group_size_;
  // The engine and the trainer's forward run in the working dtype (FP32 on the CPU).
  const DType dtype = memory.working().dtype;
  EngineOptions options;
  options.kv_cache_bytes = kv_cache_bytes(deck, pool.device());
  options.max_running = static_cast<int>(sequences);
  options.max_step_tokens = std::max<int64_t>(deck.get<int64_t>("rollout.max-step-tokens"), sequences);
  options.max_sequence_length = sequence_tokens;
  options.dtype = dtype;
  const Tensor engine_weights = memory.engine_weights();
  engine_ = std::make_unique<Engine>(model, ParameterSet::bind(layout, engine_weights.data, dtype, pool.device()), pool,
                                     options, tokenizer_.get());
  // Transient: the handoffs drop them between train phases instead of copying them.
  const int64_t micro_batch = trainer_settings_.micro_batch_tokens;
  const ActivationCapacity capacity{micro_batch > 0 ? std::max(micro_batch, sequence_tokens) : sequences * sequence_tokens,
                                    sequences};
  activations_ = pool.allocate(tags::activations, PolicyTrainer::activation_bytes(model, capacity, dtype),
                               "trainer.activations");
  // The CPU backend trains the FP32 master weights themselves.
  const Tensor working = pool.device() == Device::CPU ? memory.master() : memory.working();
  const PolicyTrainerMemory trainer_memory{memory.master(), memory.grads(), memory.exp_avg(),
                                           memory.exp_avg_sq(), working, activations_->ptr};
  trainer_ = std::make_unique<PolicyTrainer>(model, layout, trainer_memory, capacity, communicator, world_size);
  if (loss_.kl_coef != 0) {
    // The frozen reference is the initial policy, rebuilt from the seed (so a restart gets
    // the same one), under its own tag: it is trainer memory that never changes.
    reference_ = pool.allocate(tag_named("reference"), layout.slab_bytes(dtype), "trainer.reference_weights");
    const Tensor reference = Tensor::view(reference_->ptr, dtype, pool.device(), {layout.slab_elements()});
    copy_floats_to_tensor(reference, ColocatedMemory::initial_weights(layout, seed_));
    trainer_->set_reference(reference);
  }
}

GrpoStep::~GrpoStep() {
  engine_.reset();  // its KV cache is pool memory too
  trainer_.reset();
  pool_.release(activations_);
  if (reference_) pool_.release(reference_);
}

RolloutSummary GrpoStep::rollout(int64_t step) {
  RolloutSummary summary;
  std::vector<Prompt> prompts;
  std::vector<GenerationRequest> requests;
  for (int64_t i = 0; i < prompts_per_step_; ++i) {
    const uint64_t index = static_cast<uint64_t>(((step - 1) * world_size_ + rank_) * prompts_per_step_ + i);
    prompts.push_back(task_->sample(index));
    std::vector<int32_t> prompt = {bos_};
    const auto text = tokenizer_->encode(prompts.back().text);
    prompt.insert(prompt.end(), text.begin(), text.end());
    for (int64_t g = 0; g < group_size_; ++g) {
      GenerationRequest request;
      // Ids and seeds follow the global prompt index, not the rank: the same prompts get
      // the same samples whatever the number of ranks they are spread over.
      request.id = index * static_cast<uint64_t>(group_size_) + static_cast<uint64_t>(g);
      request.prompt = prompt;
      request.sampling = sampling_;
      request.sampling.seed = seed_ * 1000003u + static_cast<uint64_t>(step) * 7919u;
      requests.push_back(std::move(request));
    }
    TrainSequence reference;
    reference.prompt = prompt;
    reference.completion = tokenizer_->encode(prompts.back().answer);
    reference.completion.push_back(eos_);
    summary.references.push_back(std::move(reference));
  }
  const std::vector<Completion> completions = engine_->generate(requests);
  std::vector<double>& rewards = summary.rewards;
  for (size_t r = 0; r < completions.size(); ++r) {
    const Completion& completion = completions[r];
    const Prompt& prompt = prompts[r / group_size_];
    std::vector<int32_t> answer = completion.tokens;
    if (!answer.empty() && answer.back() == eos_) answer.pop_back();
    // The model's vocabulary may be larger than the task's: such a token is a malformed answer.
    const bool in_vocab = std::all_of(answer.begin(), answer.end(), [&](int32_t id) { return id < tokenizer_->vocab_size(); });
    const std::string text = in_vocab ? tokenizer_->decode(answer) : std::string("<unknown token>");
    const RewardBreakdown judged = task_->judge(prompt, text);
    rewards.push_back(judged.total);
    summary.accuracy += judged.correct;
    summary.format_rate += judged.format;
    summary.response_length += static_cast<double>(completion.tokens.size());
    summary.generated_tokens += static_cast<int64_t>(completion.tokens.size());
    if (r == 0) summary.example = prompt.text + text + (judged.correct ? "  (right)" : "  (wrong)");
    summary.prompt_texts.push_back(prompt.text);
    summary.completion_texts.push_back(text);
    TrainSequence sequence;
    sequence.prompt = requests[r].prompt;
    sequence.completion = completion.tokens;
    sequence.old_logprobs = completion.logprobs;
    summary.sequences.push_back(std::move(sequence));
  }
  const std::vector<float> advantages = group_advantages(rewards, group_size_, advantages_);
  for (size_t r = 0; r < summary.sequences.size(); ++r) summary.sequences[r].advantage = advantages[r];
  const double n = static_cast<double>(completions.size());
  for (double reward : rewards) summary.reward_mean += reward / n, summary.reward_square_mean += reward * reward / n;
  summary.reward_std = reward_std(rewards);
  summary.accuracy /= n;
  summary.format_rate /= n;
  summary.response_length /= n;
  return summary;
}

TrainStepResult GrpoStep::train(int64_t step, const RolloutSummary& rollout) {
  if (is_sft(step)) return trainer_->sft_step(rollout.references, sft_lr_, step, trainer_settings_);
  // Every completion has at least one token (the engine generates one before any stop).
  return trainer_->grpo_step(rollout.sequences, loss_, rl_schedule_.at(step - sft_steps_), step, trainer_settings_);
}

std::vector<SampleRecord> GrpoStep::samples(const RolloutSummary& rollout, const TrainStepResult& trained) {
  std::vector<SampleRecord> records;
  for (size_t i = 0; i < rollout.sequences.size(); ++i) {
    const TrainSequence& sequence = rollout.sequences[i];
    SampleRecord record;
    record.prompt_text = rollout.prompt_texts[i];
    record.completion_text = rollout.completion_texts[i];
    record.prompt_tokens = sequence.prompt;
    record.completion_tokens = sequence.completion;
    record.rollout_logp = sequence.old_logprobs;
    record.train_logp = i < trained.sequence_logp.size() ? trained.sequence_logp[i]
                                                         : std::vector<float>(sequence.completion.size(), NAN);
    record.advantage = sequence.advantage;
    record.reward = rollout.rewards[i];
    records.push_back(std::move(record));
  }
  return records;
}

}  // namespace tandem
