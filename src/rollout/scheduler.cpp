#include "rollout/scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tandem {

Scheduler::Scheduler(SchedulerLimits limits, BlockAllocator& blocks, int block_size)
    : limits_(limits), blocks_(blocks), block_size_(block_size) {
  if (limits.max_running < 1 || limits.max_step_tokens < limits.max_running || block_size < 1)
    throw std::invalid_argument("Scheduler: needs max_running >= 1, max_step_tokens >= max_running (got " +
                                std::to_string(limits.max_running) + ", " + std::to_string(limits.max_step_tokens) +
                                ") and block_size >= 1");
}

void Scheduler::add(std::unique_ptr<Sequence> sequence) { waiting_.push_back(std::move(sequence)); }

void Scheduler::release_blocks(Sequence& sequence) {
  for (int32_t block : sequence.blocks) blocks_.release(block);
  sequence.blocks.clear();
  sequence.computed = 0;
}

void Scheduler::preempt_last() {
  std::unique_ptr<Sequence> victim = std::move(running_.back());
  running_.pop_back();
  release_blocks(*victim);
  waiting_.push_front(std::move(victim));
  ++preemptions_;
}

std::vector<ScheduledChunk> Scheduler::schedule() {
  std::vector<ScheduledChunk> chunks;
  int64_t budget = limits_.max_step_tokens;

  // Decodes. A victim is always taken from the back, which is this sequence or one not
  // scheduled yet, so nothing already in `chunks` loses its blocks.
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& sequence = *running_[i];
    if (sequence.pending() != 1) continue;
    bool preempted_itself = false;
    while (!preempted_itself && static_cast<int64_t>(sequence.blocks.size()) * block_size_ <= sequence.computed) {
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
    budget -= tokens;
  }

  while (!waiting_.empty() && budget > 0 && static_cast<int>(running_.size()) < limits_.max_running) {
    Sequence& sequence = *waiting_.front();
    const int64_t needed = (static_cast<int64_t>(sequence.tokens.size()) + block_size_ - 1) / block_size_;
    if (needed > blocks_.free_count()) break;
    for (int64_t b = 0; b < needed; ++b) sequence.blocks.push_back(blocks_.allocate());
    const int64_t tokens = std::min(sequence.pending(), budget);
    chunks.push_back({&sequence, tokens});
    budget -= tokens;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
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
