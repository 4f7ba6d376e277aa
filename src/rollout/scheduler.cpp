#include "rollout/scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tandem {

Scheduler::Scheduler(SchedulerSettings settings, BlockAllocator& blocks, int block_size)
    : settings_(settings), blocks_(blocks), index_(blocks.total()), block_size_(block_size) {
  if (settings.max_running < 1 || settings.max_step_tokens < settings.max_running || block_size < 1)
    throw std::invalid_argument("Scheduler: needs max_running >= 1, max_step_tokens >= max_running (got " +
                                std::to_string(settings.max_running) + ", " +
                                std::to_string(settings.max_step_tokens) + ") and block_size >= 1");
}

void Scheduler::add(std::unique_ptr<Sequence> sequence) { waiting_.push_back(std::move(sequence)); }

void Scheduler::release_blocks(Sequence& sequence) {
  for (int32_t block : sequence.blocks)
    if (blocks_.release(block)) index_.forget(block);
  sequence.blocks.clear();
  sequence.computed = 0;
}

bool Scheduler::lacks_block(const Sequence& sequence) const {
  return static_cast<int64_t>(sequence.blocks.size()) * block_size_ <= sequence.computed;
}

void Scheduler::preempt_last() {
  std::unique_ptr<Sequence> victim = std::move(running_.back());
  running_.pop_back();
  release_blocks(*victim);
  waiting_.push_front(std::move(victim));
  ++preemptions_;
}

std::span<const int32_t> Scheduler::block_tokens(const Sequence& sequence, int64_t block) const {
  return std::span<const int32_t>(sequence.tokens).subspan(static_cast<size_t>(block * block_size_),
                                                           static_cast<size_t>(block_size_));
}

// The whole blocks of the sequence's prompt that running sequences hold, from its start,
// leaving at least its last token to compute: its logits sample the next one.
std::vector<int32_t> Scheduler::shared_prompt_blocks(const Sequence& sequence) const {
  std::vector<int32_t> found;
  if (!settings_.share_prompts) return found;
  const int64_t shareable =
      std::min<int64_t>(static_cast<int64_t>(sequence.request.prompt.size()), sequence.pending() - 1) / block_size_;
  int32_t previous = PromptBlockIndex::kNone;
  for (int64_t k = 0; k < shareable; ++k) {
    previous = index_.find(previous, block_tokens(sequence, k));
    if (previous == PromptBlockIndex::kNone) break;
    found.push_back(previous);
  }
  return found;
}

// Indexes the whole prompt blocks that the chunk completes.
void Scheduler::index_prompt_blocks(const ScheduledChunk& chunk) {
  if (!settings_.share_prompts) return;
  const Sequence& sequence = *chunk.sequence;
  const int64_t end =
      std::min<int64_t>(sequence.computed + chunk.tokens, static_cast<int64_t>(sequence.request.prompt.size()));
  for (int64_t k = sequence.computed / block_size_; (k + 1) * block_size_ <= end; ++k)
    index_.add(k > 0 ? sequence.blocks[k - 1] : PromptBlockIndex::kNone, block_tokens(sequence, k),
               sequence.blocks[k]);
}

std::vector<ScheduledChunk> Scheduler::schedule() {
  std::vector<ScheduledChunk> chunks;
  int64_t budget = settings_.max_step_tokens;

  // Decodes. A victim is always taken from the back, which is this sequence or one not
  // scheduled yet, so nothing already in `chunks` loses its blocks.
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& sequence = *running_[i];
    if (sequence.pending() != 1) continue;
    bool preempted_itself = false;
    while (!preempted_itself && lacks_block(sequence)) {
      if (blocks_.free_count() > 0) {
        sequence.blocks.push_back(blocks_.allocate());
      } else {
        preempted_itself = running_.back().get() == &sequence;
        preempt_last();
      }
    }
    if (preempted_itself) break;
    chunks.push_back({&sequence, 1});
    --budget;
  }

  // Prompts prefilled in chunks go on; their blocks were granted at admission.
  for (const auto& sequence : running_) {
    if (budget == 0) break;
    if (sequence->pending() < 2) continue;
    const int64_t tokens = std::min(sequence->pending(), budget);
    chunks.push_back({sequence.get(), tokens});
    if (tokens > 1) index_prompt_blocks(chunks.back());
    budget -= tokens;
  }

  while (!waiting_.empty() && budget > 0 && static_cast<int>(running_.size()) < settings_.max_running) {
    Sequence& sequence = *waiting_.front();
    const std::vector<int32_t> shared = shared_prompt_blocks(sequence);
    const int64_t needed = (static_cast<int64_t>(sequence.tokens.size()) + block_size_ - 1) / block_size_ -
                           static_cast<int64_t>(shared.size());
    if (needed > blocks_.free_count()) break;
    for (int32_t block : shared) {
      blocks_.share(block);
      sequence.blocks.push_back(block);
    }
    for (int64_t b = 0; b < needed; ++b) sequence.blocks.push_back(blocks_.allocate());
    sequence.computed = static_cast<int64_t>(shared.size()) * block_size_;
    shared_prompt_tokens_ += sequence.computed;
    const int64_t tokens = std::min(sequence.pending(), budget);
    chunks.push_back({&sequence, tokens});
    if (tokens > 1) index_prompt_blocks(chunks.back());
    budget -= tokens;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  // The blocks that single-token chunks complete (a chunked prompt's last token may end
  // one) are found from the next step on: were every chunk of this step a single token,
  // the engine's fused decode kernel would store such a row while a sequence admitted
  // here read it.
  for (const ScheduledChunk& chunk : chunks)
    if (chunk.tokens == 1) index_prompt_blocks(chunk);
  return chunks;
}

std::vector<ScheduledChunk> Scheduler::schedule_decodes() {
  std::vector<ScheduledChunk> chunks;
  int64_t new_blocks = 0;
  for (const auto& sequence : running_) {
    if (sequence->has_all_tokens()) continue;
    if (sequence->pending() != 1) return {};
    new_blocks += lacks_block(*sequence);
    chunks.push_back({sequence.get(), 1});
  }
  const bool admits = !waiting_.empty() && static_cast<int64_t>(chunks.size()) < settings_.max_running;
  if (admits || new_blocks > blocks_.free_count()) return {};
  for (const ScheduledChunk& chunk : chunks)
    if (lacks_block(*chunk.sequence)) chunk.sequence->blocks.push_back(blocks_.allocate());
  return chunks;
}

std::unique_ptr<Sequence> Scheduler::finish(Sequence* sequence) {
  const auto found = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == sequence; });
  if (found == running_.end()) throw std::logic_error("Scheduler::finish: the sequence is not running");
  std::unique_ptr<Sequence> finished = std::move(*found);
  running_.erase(found);
  release_blocks(*finished);
  return finished;
}

std::vector<std::unique_ptr<Sequence>> Scheduler::take_all() {
  std::vector<std::unique_ptr<Sequence>> all;
  for (auto& sequence : running_) {
    release_blocks(*sequence);
    all.push_back(std::move(sequence));
  }
  for (auto& sequence : waiting_) all.push_back(std::move(sequence));
  running_.clear();
  waiting_.clear();
  return all;
}

}  // namespace tandem
