#include "rollout/engine.h"

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "rollout/stop_strings.h"

namespace tandem {

namespace {

KvCacheGeometry cache_geometry_for(const ModelConfig& config, const EngineOptions& options) {
  return KvCacheGeometry::for_bytes(config, options.kv_cache_bytes, options.block_size,
                                    options.fp8_kv_cache ? DType::F8_E4M3 : options.dtype);
}

int64_t sequence_length_limit(const ModelConfig& config, const EngineOptions& options) {
  if (options.max_sequence_length < 0)
    throw std::invalid_argument("engine: max_sequence_length must be >= 0, got " +
                                std::to_string(options.max_sequence_length));
  const int64_t wanted = options.max_sequence_length > 0 ? options.max_sequence_length : config.max_position;
  return std::min(wanted, cache_geometry_for(config, options).token_capacity());
}

StepCapacity step_capacity(const EngineOptions& options, int64_t max_sequence_length) {
  return {options.max_step_tokens, options.max_running,
          (max_sequence_length + options.block_size - 1) / options.block_size};
}

// Pads a decode step with sequences of one token at position 0 whose keys go to the
// padding block, so that it has `rows` sequences.
void pad_decode_step(StepInputs& inputs, int64_t rows, int32_t padding_block, int block_size, int64_t max_blocks) {
  while (inputs.sequences() < rows) {
    inputs.token_ids.push_back(0);
    inputs.from_rows.push_back(-1);
    inputs.positions.push_back(0);
    inputs.slots.push_back(padding_block * block_size);
    inputs.cu_queries.push_back(inputs.cu_queries.back() + 1);
    inputs.context_lens.push_back(1);
    inputs.block_tables.insert(inputs.block_tables.end(), max_blocks, padding_block);
  }
}

}  // namespace

Engine::Engine(const ModelConfig& config, const ParameterSet& weights, MemoryPool& pool, const EngineOptions& options,
               const Tokenizer* tokenizer)
    : config_(config),
      options_(options),
      tokenizer_(tokenizer),
      max_sequence_length_(sequence_length_limit(config, options)),
      cache_(pool, cache_geometry_for(config, options), options.name + ".kv_cache"),
      backend_(make_engine_backend(pool, config, step_capacity(options, max_sequence_length_), options.name)),
      forward_(config, weights, backend_->ops(), backend_->attention(), pool,
               step_capacity(options, max_sequence_length_), options.dtype, options.fp8_weights,
               options.name + ".step_scratch"),
      scheduler_({options.max_running, options.max_step_tokens, options.share_prompts}, cache_.blocks(),
                 options.block_size) {}

void Engine::check(const GenerationRequest& request) const {
  auto refuse = [&](const std::string& why) {
    throw std::invalid_argument(options_.name + ": request " + std::to_string(request.id) + ": " + why);
  };
  request.sampling.validate();
  if (request.prompt.empty()) refuse("the prompt is empty");
  for (int32_t id : request.prompt)
    if (id < 0 || id >= config_.vocab)
      refuse("prompt token " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(config_.vocab));
  const int64_t longest = static_cast<int64_t>(request.prompt.size()) + request.sampling.max_new_tokens;
  if (longest > max_sequence_length_)
    refuse("prompt (" + std::to_string(request.prompt.size()) + ") + max_new_tokens (" +
           std::to_string(request.sampling.max_new_tokens) + ") exceeds the longest sequence this engine holds (" +
           std::to_string(max_sequence_length_) + " tokens: the model's limit or the KV cache's " +
           std::to_string(cache_.geometry().token_capacity()) + ")");
  if (!request.sampling.stop_strings.empty() && !tokenizer_) refuse("stop strings need a tokenizer");
}

void Engine::submit(GenerationRequest request) {
  check(request);
  if (active_ids_.count(request.id))
    throw std::invalid_argument(options_.name + ": request " + std::to_string(request.id) + " is already queued");

  auto sequence = std::make_unique<Sequence>();
  sequence->tokens = request.prompt;
  sequence->rng = request_rng(request.sampling.seed, request.id);
  sequence->request = std::move(request);
  active_ids_.insert(sequence->request.id);
  scheduler_.add(std::move(sequence));
}

int64_t Engine::graph_bucket(int64_t sequences) const {
  int64_t bucket = 1;
  while (bucket < sequences) bucket *= 2;
  return std::min(bucket, forward_.capacity().max_sequences);
}

bool Engine::finished(const Sequence& sequence, int64_t last, FinishReason& reason, std::string& stop_string) const {
  const SamplingParams& sampling = sequence.request.sampling;
  const int64_t generated = last + 1 - static_cast<int64_t>(sequence.request.prompt.size());
  if (std::find(sampling.stop_token_ids.begin(), sampling.stop_token_ids.end(), sequence.tokens[last]) !=
      sampling.stop_token_ids.end()) {
    reason = FinishReason::Stop;
    return true;
  }
  if (!sampling.stop_strings.empty()) {
    const std::span<const int32_t> completion(sequence.tokens.data() + sequence.request.prompt.size(),
                                              static_cast<size_t>(generated));
    if (auto stop = find_stop_string(*tokenizer_, completion, sampling.stop_strings)) {
      reason = FinishReason::Stop;
      stop_string = std::move(*stop);
      return true;
    }
  }
  if (generated >= sampling.max_new_tokens) {
    reason = FinishReason::Length;
    return true;
  }
  return false;
}

Completion Engine::complete(std::unique_ptr<Sequence> sequence, FinishReason reason, std::string stop_string) {
  active_ids_.erase(sequence->request.id);
  Completion completion;
  completion.request_id = sequence->request.id;
  completion.tokens.assign(sequence->tokens.begin() + static_cast<int64_t>(sequence->request.prompt.size()),
                           sequence->tokens.end());
  completion.logprobs = std::move(sequence->logprobs);
  completion.finish = reason;
  completion.stop_string = std::move(stop_string);
  return completion;
}

std::vector<Completion> Engine::step() {
  if (queued_.empty()) {
    const std::vector<ScheduledChunk> chunks = scheduler_.schedule();
    if (chunks.empty()) {
      if (has_work()) throw std::logic_error(options_.name + ": the scheduler found no work for queued requests");
      return {};
    }
    if (!weights_prepared_) {
      forward_.prepare_weights();
      weights_prepared_ = true;
    }
    queue_step(chunks);
  }
  if (options_.plan_ahead && queued_.size() == 1 && queued_.back().decodes_only) {
    const std::vector<ScheduledChunk> next = scheduler_.schedule_decodes();
    if (!next.empty()) {
      queue_step(next);
      ++stats_.steps_planned_ahead;
    }
  }
  std::vector<Completion> completions = apply_results();
  if (!has_work()) weights_prepared_ = false;  // the weights may change until the next work
  return completions;
}

void Engine::queue_step(const std::vector<ScheduledChunk>& chunks) {
  const int64_t block_size = options_.block_size, max_blocks = forward_.capacity().max_blocks;
  StepInputs inputs;
  inputs.block_tables.assign(chunks.size() * max_blocks, 0);
  std::vector<SampleRow> rows(chunks.size());
  std::vector<bool> samples(chunks.size());
  bool decodes_only = true;
  for (size_t b = 0; b < chunks.size(); ++b) {
    Sequence& sequence = *chunks[b].sequence;
    for (int64_t p = sequence.computed; p < sequence.computed + chunks[b].tokens; ++p) {
      // A placeholder is the token that the step queued before samples: the device feeds it.
      const bool unsampled = sequence.tokens[p] == Sequence::kUnsampled;
      if (unsampled && (queued_.empty() || sequence.sampling_row < 0))
        throw std::logic_error(options_.name + ": request " + std::to_string(sequence.request.id) +
                               " has a token that no queued step samples");
      inputs.token_ids.push_back(unsampled ? 0 : sequence.tokens[p]);
      inputs.from_rows.push_back(unsampled ? sequence.sampling_row : -1);
      inputs.positions.push_back(static_cast<int32_t>(p));
      inputs.slots.push_back(static_cast<int32_t>(sequence.blocks[p / block_size] * block_size + p % block_size));
    }
    inputs.cu_queries.push_back(static_cast<int32_t>(inputs.token_ids.size()));
    inputs.context_lens.push_back(static_cast<int32_t>(sequence.computed + chunks[b].tokens));
    std::copy(sequence.blocks.begin(), sequence.blocks.end(), inputs.block_tables.begin() + b * max_blocks);
    decodes_only = decodes_only && chunks[b].tokens == 1;
    samples[b] = chunks[b].tokens == sequence.pending();  // the chunk ends the known tokens
    if (samples[b]) {
      const SamplingParams& sampling = sequence.request.sampling;
      rows[b] = {sampling.temperature, sampling.top_k, sampling.top_p, draw_uniform(sampling, sequence.rng)};
    }
  }
  const int64_t forward_tokens = inputs.tokens();
  std::optional<int64_t> graph;
  if (decodes_only && backend_->replays_graphs()) {
    graph = graph_bucket(inputs.sequences());
    pad_decode_step(inputs, *graph, cache_.padding_block(), options_.block_size, max_blocks);
  }
  forward_.stage(inputs);
  RowSampler& sampler = backend_->sampler();
  sampler.stage(rows);
  backend_->run(graph, [&] {
    sampler.feed(forward_.token_ids(), forward_.from_rows());
    sampler.launch(forward_.run(cache_));
  });
  sampler.send();
  ++stats_.steps;
  stats_.forward_tokens += forward_tokens;

  // The step is queued: its tokens count as computed, and each sampled one is a
  // placeholder until the results come.
  QueuedStep step;
  step.decodes_only = decodes_only;
  for (size_t b = 0; b < chunks.size(); ++b) {
    Sequence& sequence = *chunks[b].sequence;
    sequence.computed += chunks[b].tokens;
    if (samples[b]) {
      sequence.tokens.push_back(Sequence::kUnsampled);
      sequence.sampling_row = static_cast<int32_t>(b);
    }
    step.rows.push_back({&sequence, samples[b] ? static_cast<int64_t>(sequence.tokens.size()) - 1 : -1});
  }
  queued_.push_back(std::move(step));
}

std::vector<Completion> Engine::apply_results() {
  const std::span<const SampledToken> sampled = backend_->sampler().results();
  const QueuedStep step = std::move(queued_.front());
  queued_.pop_front();
  for (size_t b = 0; b < step.rows.size(); ++b)
    if (step.rows[b].sequence && step.rows[b].token >= 0 && sampled[b].id < 0)
      throw std::runtime_error(options_.name + ": request " + std::to_string(step.rows[b].sequence->request.id) +
                               ": the logits it samples from hold a NaN or +inf, or only -inf");
  std::vector<Completion> done;
  for (size_t b = 0; b < step.rows.size(); ++b) {
    const QueuedStep::Row& row = step.rows[b];
    if (!row.sequence || row.token < 0) continue;
    Sequence& sequence = *row.sequence;
    sequence.tokens[row.token] = sampled[b].id;
    sequence.logprobs.push_back(sampled[b].logprob);
    ++stats_.generated_tokens;
    const bool sampled_again = row.token + 1 < static_cast<int64_t>(sequence.tokens.size());  // by the step queued next
    if (!sampled_again) sequence.sampling_row = -1;
    FinishReason reason{};
    std::string stop_string;
    if (!finished(sequence, row.token, reason, stop_string)) continue;
    if (sampled_again) {  // the next step's row for it is dropped
      queued_.front().rows[sequence.sampling_row].sequence = nullptr;
      sequence.tokens.resize(row.token + 1);
    }
    done.push_back(complete(scheduler_.finish(&sequence), reason, std::move(stop_string)));
  }
  return done;
}

std::vector<Completion> Engine::abort() {
  // Queued steps run out; the tokens they sample are dropped with their placeholders.
  for (; !queued_.empty(); queued_.pop_front()) backend_->sampler().results();
  std::vector<Completion> aborted;
  for (std::unique_ptr<Sequence>& sequence : scheduler_.take_all()) {
    while (sequence->tokens.back() == Sequence::kUnsampled) sequence->tokens.pop_back();
    aborted.push_back(complete(std::move(sequence), FinishReason::Abort));
  }
  weights_prepared_ = false;
  return aborted;
}

std::vector<Completion> Engine::generate(std::vector<GenerationRequest> requests) {
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) index[requests[i].id] = i;
  try {
    for (GenerationRequest& request : requests) submit(std::move(request));
  } catch (...) {
    abort();  // nothing half-submitted stays queued
    throw;
  }
  std::vector<Completion> completions(index.size());
  while (has_work())
    for (Completion& completion : step()) completions[index.at(completion.request_id)] = std::move(completion);
  return completions;
}

EngineStats Engine::stats() const {
  EngineStats stats = stats_;
  stats.preemptions = scheduler_.preemptions();
  stats.shared_prompt_tokens = scheduler_.shared_prompt_tokens();
  stats.graphs_captured = backend_->graphs_captured();
  stats.graph_setup_seconds = backend_->graph_setup_seconds();
  return stats;
}

}  // namespace tandem
