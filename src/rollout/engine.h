// One rollout engine instance: prefill and decode with a paged KV cache, continuous
// batching of many sequences of different lengths, per-request seeded sampling, and stop
// on EOS ids, stop strings and max new tokens. Not thread-safe: one thread drives it
// (a colocated rank's, or a rollout rank's: driver/engine_rank.h).
//
// Planning ahead (EngineOptions::plan_ahead): while a decode step runs on the device, the
// host plans and queues the next one, so the device goes from step to step without
// waiting for the host to read results, check stops and schedule. Each sequence of the
// running step gets a placeholder for the token it is sampling there, and the next step
// takes that token on the device (RowSampler::feed). Only plain decodes are planned so:
// Scheduler::schedule_decodes declines when a prompt chunk, an admission or a preemption
// would be needed, and the step is then planned after the results as before. A sequence
// that stops in step N has already a row in N+1: that row's work is dropped. Every request
// gets the tokens and log-probs it gets without planning ahead; one waiting for a place
// that a stop frees is admitted a step later.
//
//   Engine engine(config, weights, pool, options);
//   engine.submit(request);  ...
//   while (engine.has_work()) for (Completion& c : engine.step()) ...
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/parameters.h"
#include "rollout/engine_backend.h"
#include "rollout/engine_forward.h"
#include "rollout/kv_cache.h"
#include "rollout/request.h"
#include "rollout/scheduler.h"
#include "tasks/tokenizer.h"
#include "tensor/memory_pool.h"

namespace tandem {

struct EngineOptions {
  size_t kv_cache_bytes = size_t{16} << 20;  // the deck's rollout.kv-cache
  int block_size = 16;                       // tokens per KV cache block
  int max_running = 64;                      // sequences decoded together
  int64_t max_step_tokens = 2048;            // new tokens per step (prompt chunks + decodes)
  int64_t max_sequence_length = 0;           // prompt + completion; 0: the model's max_position
  DType dtype = DType::F32;                  // activations and KV cache (the weights' dtype)
  bool fp8_kv_cache = false;                 // the deck's rollout.kv-cache-dtype = fp8 (rollout/paged_attention.h)
  bool fp8_weights = false;                  // the deck's rollout.weight-dtype = fp8 (rollout/engine_forward.h)
  bool share_prompts = true;                 // the deck's rollout.share-prompts (rollout/scheduler.h)
  bool plan_ahead = true;                    // queue a decode step while the one before runs (above)
  std::string name = "engine";               // prefix of the pool allocation names
};

struct EngineStats {
  int64_t steps = 0;
  int64_t steps_planned_ahead = 0;  // steps queued before the results of the step before came back
  int64_t forward_tokens = 0;  // tokens run through the model, recomputation included
  int64_t shared_prompt_tokens = 0;  // prompt tokens read from another sequence's KV blocks, not computed
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t graphs_captured = 0;  // decode batch sizes captured as CUDA graphs
  double graph_setup_seconds = 0;  // host time of those sizes' first steps (EngineBackend)
};

class Engine {
 public:
  // `weights` (in options.dtype, in the memory of `pool`'s device) and `tokenizer` must
  // outlive the engine; the tokenizer is needed only for stop strings. The weights may
  // change (a trainer's update) while the engine has no work: what it derives from them
  // (FP8 codes) is made again when it takes up work. The engine runs on
  // the pool's device; its KV cache and step scratch come from `pool` under tags::kv_cache.
  Engine(const ModelConfig& config, const ParameterSet& weights, MemoryPool& pool, const EngineOptions& options,
         const Tokenizer* tokenizer = nullptr);

  // Queues a request. Throws std::invalid_argument when it is malformed or could never
  // fit: empty prompt, id outside the vocabulary, prompt + max_new_tokens beyond the
  // sequence length or the whole KV cache, stop strings without a tokenizer, an id
  // already queued.
  void submit(GenerationRequest request);
  // The same checks without queuing (all but the duplicate id). Reads only what is fixed
  // at construction, so another thread may call it while the engine runs.
  void check(const GenerationRequest& request) const;

  // Runs one batched forward over the scheduled sequences, samples their next tokens and
  // returns the completions that finished in it (in the order they were scheduled). On
  // CUDA, a step of decodes only is padded to the next power of two sequences and
  // replayed from that size's graph. Planning ahead, the step returns the results of the
  // step queued before and leaves the next one queued.
  std::vector<Completion> step();

  // Ends every queued and running request as FinishReason::Abort, with the tokens of the
  // steps whose results came back (those of a step still queued are dropped), and frees
  // every KV block.
  std::vector<Completion> abort();

  // Submits the requests, steps until all are done, returns completions in request order.
  std::vector<Completion> generate(std::vector<GenerationRequest> requests);

  bool has_work() const { return scheduler_.running() + scheduler_.waiting() > 0 || !queued_.empty(); }
  size_t running() const { return scheduler_.running(); }
  size_t waiting() const { return scheduler_.waiting(); }
  int32_t free_blocks() const { return cache_.blocks().free_count(); }
  int32_t total_blocks() const { return cache_.blocks().total(); }
  const KvCacheGeometry& cache_geometry() const { return cache_.geometry(); }
  int64_t max_sequence_length() const { return max_sequence_length_; }
  EngineStats stats() const;

 private:
  // A step queued on the backend whose results have not been applied.
  struct QueuedStep {
    struct Row {
      Sequence* sequence;  // nullptr once the sequence ended before these results came
      int64_t token;       // the index in sequence->tokens its sampled token fills; -1: none
    };
    std::vector<Row> rows;  // one per scheduled chunk, in logits row order
    bool decodes_only = true;
  };

  // Stages and queues the step of `chunks`: each sequence's computed tokens advance now,
  // and one that samples gets a placeholder token until the results come.
  void queue_step(const std::vector<ScheduledChunk>& chunks);
  // Waits for the oldest queued step and applies its sampled tokens.
  std::vector<Completion> apply_results();
  Completion complete(std::unique_ptr<Sequence> sequence, FinishReason reason, std::string stop_string = {});
  // The finish reason once `sequence` has taken its token tokens[last], if it is done.
  bool finished(const Sequence& sequence, int64_t last, FinishReason& reason, std::string& stop_string) const;
  // The batch size whose graph runs a decode step of `sequences`.
  int64_t graph_bucket(int64_t sequences) const;

  ModelConfig config_;
  EngineOptions options_;
  const Tokenizer* tokenizer_;
  int64_t max_sequence_length_;
  KvCache cache_;
  std::unique_ptr<EngineBackend> backend_;
  EngineForward forward_;
  Scheduler scheduler_;
  std::set<uint64_t> active_ids_;
  std::deque<QueuedStep> queued_;  // at most two: the running step and the one planned ahead
  // Whether the forward's derived weights (EngineForward::prepare_weights) are those of
  // `weights`: made when the engine takes up work, dropped when it runs out of work, the
  // only time the weights (and the scratch, dropped with the cache) may change.
  bool weights_prepared_ = false;
  EngineStats stats_;
};

}  // namespace tandem
