// Continuous batching without a model: a simulated engine computes each scheduled chunk,
// appends a token when a sequence's chunk reaches its end and finishes sequences at their
// length. After every step the block accounting must hold: free + held = total, no block
// held twice, every sequence holds the blocks its cached and scheduled tokens need;
// steps respect the token budget and the running limit; decodes come first.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "rollout/block_allocator.h"
#include "rollout/scheduler.h"

namespace tandem {
namespace {

std::unique_ptr<Sequence> make_sequence(uint64_t id, size_t prompt_length, int max_new) {
  auto sequence = std::make_unique<Sequence>();
  sequence->request.id = id;
  sequence->request.prompt.assign(prompt_length, 1);
  sequence->request.sampling.max_new_tokens = max_new;
  sequence->tokens = sequence->request.prompt;
  return sequence;
}

struct Simulation {
  Simulation(int32_t blocks, int block_size, SchedulerLimits limits)
      : allocator(blocks), block_size(block_size), limits(limits), scheduler(limits, allocator, block_size) {}

  // Runs to the end; checks the invariants after every schedule().
  void run() {
    while (!finished_ids_complete()) {
      const std::vector<ScheduledChunk> chunks = scheduler.schedule();
      ASSERT_FALSE(chunks.empty()) << "no progress with " << scheduler.running() << " running, " << scheduler.waiting()
                                   << " waiting";
      ++steps;
      int64_t tokens = 0;
      bool seen_prefill = false;
      std::set<int32_t> held;
      int64_t held_count = 0;
      for (const ScheduledChunk& chunk : chunks) {
        const Sequence& s = *chunk.sequence;
        tokens += chunk.tokens;
        ASSERT_GE(chunk.tokens, 1);
        ASSERT_LE(chunk.tokens, s.pending());
        const bool decode = s.pending() == 1 && s.computed > 0;
        if (decode) EXPECT_FALSE(seen_prefill) << "a decode was scheduled after a prefill chunk";
        seen_prefill = seen_prefill || !decode;
        ASSERT_GE(static_cast<int64_t>(s.blocks.size()) * block_size, s.computed + chunk.tokens)
            << "sequence " << s.request.id << " lacks blocks for its chunk";
        for (int32_t b : s.blocks) EXPECT_TRUE(held.insert(b).second) << "block " << b << " held twice";
        held_count += static_cast<int64_t>(s.blocks.size());
      }
      EXPECT_LE(tokens, limits.max_step_tokens);
      EXPECT_LE(static_cast<int>(chunks.size()), limits.max_running);
      EXPECT_LE(static_cast<int>(scheduler.running()), limits.max_running);
      EXPECT_LE(held_count + allocator.free_count(), allocator.total());
      for (const ScheduledChunk& chunk : chunks) {
        Sequence& s = *chunk.sequence;
        s.computed += chunk.tokens;
        if (s.pending() > 0) continue;
        s.tokens.push_back(static_cast<int32_t>(s.tokens.size()));
        if (s.generated() == s.request.sampling.max_new_tokens) {
          const uint64_t id = s.request.id;
          auto done = scheduler.finish(&s);
          EXPECT_TRUE(done->blocks.empty());
          lengths[id] = done->tokens.size();
        }
      }
    }
    EXPECT_EQ(allocator.free_count(), allocator.total());
  }

  bool finished_ids_complete() const { return lengths.size() == expected; }

  BlockAllocator allocator;
  int block_size;
  SchedulerLimits limits;
  Scheduler scheduler;
  std::map<uint64_t, size_t> lengths;
  size_t expected = 0;
  int steps = 0;
};

TEST(RolloutScheduler, MixedLengthsWithChunkedPrefillAndEnoughBlocks) {
  Simulation sim(64, 4, {3, 8});
  const int prompts[] = {1, 17, 5, 30, 2, 9, 12, 3};
  for (uint64_t r = 0; r < 8; ++r) sim.scheduler.add(make_sequence(r, prompts[r], 1 + (r * 7) % 13));
  sim.expected = 8;
  sim.run();
  for (uint64_t r = 0; r < 8; ++r) EXPECT_EQ(sim.lengths[r], prompts[r] + 1 + (r * 7) % 13);
  EXPECT_EQ(sim.scheduler.preemptions(), 0);
}

TEST(RolloutScheduler, PreemptsTheLatestAdmittedWhenBlocksRunOut) {
  // 10 blocks of 4 tokens; four sequences of 6 + 30 tokens each need 9 blocks at the end.
  Simulation sim(10, 4, {4, 64});
  for (uint64_t r = 0; r < 4; ++r) sim.scheduler.add(make_sequence(r, 6, 30));
  sim.expected = 4;
  sim.run();
  EXPECT_GT(sim.scheduler.preemptions(), 0);
  for (uint64_t r = 0; r < 4; ++r) EXPECT_EQ(sim.lengths[r], 36u);
}

TEST(RolloutScheduler, TakeAllReleasesEveryBlock) {
  BlockAllocator allocator(20);
  Scheduler scheduler({2, 16}, allocator, 4);
  for (uint64_t r = 0; r < 5; ++r) scheduler.add(make_sequence(r, 7, 4));
  const auto chunks = scheduler.schedule();
  EXPECT_EQ(chunks.size(), 2u);  // the running limit
  EXPECT_EQ(scheduler.running(), 2u);
  EXPECT_EQ(scheduler.waiting(), 3u);
  EXPECT_EQ(allocator.free_count(), 16);
  const auto all = scheduler.take_all();
  EXPECT_EQ(all.size(), 5u);
  EXPECT_EQ(all[0]->request.id, 0u);
  EXPECT_EQ(allocator.free_count(), 20);
  EXPECT_EQ(scheduler.running() + scheduler.waiting(), 0u);
  EXPECT_TRUE(scheduler.schedule().empty());
}

TEST(RolloutScheduler, RefusesABudgetBelowTheRunningLimit) {
  BlockAllocator allocator(4);
  EXPECT_THROW(Scheduler({8, 4}, allocator, 4), std::invalid_argument);
}

TEST(BlockAllocator, HandsOutEachBlockOnceAndRefusesDoubleFrees) {
  BlockAllocator allocator(3);
  EXPECT_EQ(allocator.allocate(), 0);
  EXPECT_EQ(allocator.allocate(), 1);
  EXPECT_EQ(allocator.allocate(), 2);
  EXPECT_EQ(allocator.free_count(), 0);
  EXPECT_THROW(allocator.allocate(), std::runtime_error);
  allocator.release(1);
  EXPECT_THROW(allocator.release(1), std::invalid_argument);
  EXPECT_THROW(allocator.release(7), std::invalid_argument);
  EXPECT_EQ(allocator.allocate(), 1);
  EXPECT_THROW(BlockAllocator(0), std::invalid_argument);
}

}  // namespace
}  // namespace tandem
