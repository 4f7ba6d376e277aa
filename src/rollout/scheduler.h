// Continuous batching: which sequences run in the next engine step and how many of their
// tokens, with KV cache blocks granted as they grow.
//
// Each step first gives every running sequence that waits for one token (decode) its
// token, growing its block table by a block when the last one is full. When no block is
// free, the most recently admitted sequence is preempted: its blocks are released and it
// goes back to the FRONT of the waiting queue, to be recomputed (prompt and generated
// tokens alike) when readmitted. Then partly prefilled sequences continue, and waiting
// sequences are admitted in order while the step's token budget, the running limit and
// the free blocks allow; an admitted sequence gets the blocks for all its tokens at once,
// so a prompt is never stopped halfway for lack of memory. Prompts longer than the
// budget are prefilled in chunks over several steps.
//
// With share_prompts, an admitted sequence first takes the whole blocks of its prompt
// that running sequences hold (rollout/prompt_block_index.h) and computes only the rest:
// a GRPO group's samples prefill their prompt once and read one copy of its keys and
// values. A block is indexed once the step that completes it is scheduled: the forward
// stores every token's keys and values of a layer before any of them attends, so a
// sequence admitted in the same step may already read it. Not so in a step of single
// tokens, which the GPU engine runs on its fused decode kernel (each sequence stores its
// own new row as the others read the cache): a block that a single-token chunk completes
// (a chunked prompt's last token) is indexed after the step's admissions.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "rollout/block_allocator.h"
#include "rollout/prompt_block_index.h"
#include "rollout/request.h"

namespace tandem {

struct Sequence {
  // A generated token that a queued engine step is still sampling.
  static constexpr int32_t kUnsampled = -1;

  GenerationRequest request;
  std::vector<int32_t> tokens;  // the prompt, then the generated tokens (the last may be kUnsampled)
  int64_t computed = 0;         // leading tokens whose keys and values are in the cache (or queued to be)
  std::vector<int32_t> blocks;  // block table: token position p lives in blocks[p / block_size]
  std::mt19937_64 rng;
  std::vector<float> logprobs;  // one per sampled generated token
  int32_t sampling_row = -1;    // while tokens.back() is kUnsampled: its row in the step sampling it

  int64_t generated() const { return static_cast<int64_t>(tokens.size() - request.prompt.size()); }
  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - computed; }
  // Whether it holds (or a queued step samples) its last token, max_new_tokens: no further
  // step computes it.
  bool has_all_tokens() const { return generated() >= request.sampling.max_new_tokens; }
};

struct SchedulerSettings {
  int max_running = 64;            // sequences in one step
  int64_t max_step_tokens = 2048;  // new tokens in one step; at least max_running
  bool share_prompts = true;       // the deck's rollout.share-prompts
};

// The next `tokens` uncached tokens of a sequence, computed in this step.
struct ScheduledChunk {
  Sequence* sequence = nullptr;
  int64_t tokens = 0;
};

class Scheduler {
 public:
  Scheduler(SchedulerSettings settings, BlockAllocator& blocks, int block_size);

  void add(std::unique_ptr<Sequence> sequence);  // to the back of the waiting queue

  // The chunks of the next step, in the order decode, prefill continuation, admission.
  // Empty only when there is nothing to run.
  std::vector<ScheduledChunk> schedule();
  // The next step planned while the step before it still runs (its sampled tokens are
  // placeholders): one token for each running sequence that has not all its tokens, in
  // running order, with blocks granted. Each such token is one the step before samples,
  // never a prompt's, so no prompt block is completed (and indexed) here. Empty, changing
  // nothing, when that step would need more than decodes: a prompt chunk to go on with, a
  // waiting sequence to admit into a free place, or more blocks than are free (a preemption).
  std::vector<ScheduledChunk> schedule_decodes();

  // Takes a running sequence out and releases its blocks.
  std::unique_ptr<Sequence> finish(Sequence* sequence);
  // Takes every sequence out (running ones first, in admission order) and releases every block.
  std::vector<std::unique_ptr<Sequence>> take_all();

  size_t running() const { return running_.size(); }
  size_t waiting() const { return waiting_.size(); }
  int64_t preemptions() const { return preemptions_; }
  // Prompt tokens whose keys and values an admitted sequence took from another's blocks.
  int64_t shared_prompt_tokens() const { return shared_prompt_tokens_; }

 private:
  void release_blocks(Sequence& sequence);
  void preempt_last();
  // Whether the sequence's next token (at position `computed`) lies past its blocks.
  bool lacks_block(const Sequence& sequence) const;
  std::span<const int32_t> block_tokens(const Sequence& sequence, int64_t block) const;
  std::vector<int32_t> shared_prompt_blocks(const Sequence& sequence) const;
  void index_prompt_blocks(const ScheduledChunk& chunk);

  SchedulerSettings settings_;
  BlockAllocator& blocks_;
  PromptBlockIndex index_;
  int block_size_;
  std::vector<std::unique_ptr<Sequence>> running_;  // in admission order
  std::deque<std::unique_ptr<Sequence>> waiting_;
  int64_t preemptions_ = 0;
  int64_t shared_prompt_tokens_ = 0;
};

}  // namespace tandem
