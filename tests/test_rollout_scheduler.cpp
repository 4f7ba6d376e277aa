// Continuous batching without a model: a simulated engine computes each scheduled chunk,
// appends a token when a sequence's chunk reaches its end and finishes sequences at their
// length. After every step the block accounting must hold: free + held = total, every
// sequence holds the blocks its cached and scheduled tokens need; steps respect the token
// budget and the running limit; decodes come first. The simulation also keeps what each
// block's rows hold, as a row's keys and values depend on the tokens up to its own: a
// chunk writes its tokens' rows, then every scheduled sequence must find rows of its own
// tokens for its whole context, which is what sharing a prompt's blocks must keep true. A
// step of single tokens runs the fused decode kernel, where each sequence stores its new
// row while the others read the cache: there no sequence may read a row another writes.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "rollout/block_allocator.h"
#include "rollout/prompt_block_index.h"
#include "rollout/scheduler.h"

namespace tandem {
namespace {

// A prompt of `prompt_length` tokens, the same for every sequence of a group.
std::unique_ptr<Sequence> make_sequence(uint64_t id, size_t prompt_length, int max_new, int32_t group = 0) {
  auto sequence = std::make_unique<Sequence>();
  sequence->request.id = id;
  sequence->request.prompt.resize(prompt_length);
  for (size_t i = 0; i < prompt_length; ++i) sequence->request.prompt[i] = 100 * group + static_cast<int32_t>(i);
  sequence->request.sampling.max_new_tokens = max_new;
  sequence->tokens = sequence->request.prompt;
  return sequence;
}

struct Simulation {
  Simulation(int32_t blocks, int block_size, SchedulerSettings settings)
      : allocator(blocks), block_size(block_size), settings(settings), scheduler(settings, allocator, block_size) {}

  void add(std::unique_ptr<Sequence> sequence) {
    live.insert(sequence.get());
    scheduler.add(std::move(sequence));
    ++expected;
  }

  // Runs to the end; checks the invariants after every schedule().
  void run() {
    while (lengths.size() < expected) {
      const std::vector<ScheduledChunk> chunks = scheduler.schedule();
      ASSERT_FALSE(chunks.empty()) << "no progress with " << scheduler.running() << " running, " << scheduler.waiting()
                                   << " waiting";
      ++steps;
      std::map<int32_t, int> holders;
      for (const Sequence* s : live)
        for (int32_t b : s->blocks) ++holders[b];
      EXPECT_EQ(static_cast<int32_t>(holders.size()) + allocator.free_count(), allocator.total());
      for (const auto& [block, count] : holders) most_holders = std::max(most_holders, count);

      int64_t tokens = 0;
      bool seen_prefill = false;
      const bool single_tokens =
          std::all_of(chunks.begin(), chunks.end(), [](const ScheduledChunk& c) { return c.tokens == 1; });
      std::map<std::pair<int32_t, int64_t>, const Sequence*> writer;  // (block, row) -> its writer this step
      for (const ScheduledChunk& chunk : chunks) {
        const Sequence& s = *chunk.sequence;
        tokens += chunk.tokens;
        ASSERT_GE(chunk.tokens, 1);
        ASSERT_LE(chunk.tokens, s.pending());
        const bool decode = s.pending() == 1 && scheduled_before.count(&s);
        if (decode) EXPECT_FALSE(seen_prefill) << "a decode was scheduled after a prefill chunk";
        seen_prefill = seen_prefill || !decode;
        ASSERT_GE(static_cast<int64_t>(s.blocks.size()) * block_size, s.computed + chunk.tokens)
            << "sequence " << s.request.id << " lacks blocks for its chunk";
        for (int64_t p = s.computed; p < s.computed + chunk.tokens; ++p) {
          std::vector<std::vector<int32_t>>& written = rows[s.blocks[p / block_size]];
          written.resize(block_size);
          written[p % block_size].assign(s.tokens.begin(), s.tokens.begin() + p + 1);
          writer[{s.blocks[p / block_size], p % block_size}] = &s;
        }
      }
      // The forward stores every chunk's rows before any attends: now each reads its context.
      for (const ScheduledChunk& chunk : chunks) {
        const Sequence& s = *chunk.sequence;
        for (int64_t p = 0; p < s.computed + chunk.tokens; ++p) {
          const auto written_now = writer.find({s.blocks[p / block_size], p % block_size});
          EXPECT_FALSE(single_tokens && written_now != writer.end() && written_now->second != &s)
              << "sequence " << s.request.id << " reads row " << p << " while sequence "
              << (written_now != writer.end() ? written_now->second->request.id : 0) << " stores it in step " << steps;
          const auto found = rows.find(s.blocks[p / block_size]);
          ASSERT_TRUE(found != rows.end() &&
                      std::equal(s.tokens.begin(), s.tokens.begin() + p + 1, found->second[p % block_size].begin(),
                                 found->second[p % block_size].end()))
              << "sequence " << s.request.id << " finds a row " << p << " of other tokens in step " << steps;
        }
      }
      for (const ScheduledChunk& chunk : chunks) scheduled_before.insert(chunk.sequence);
      EXPECT_LE(tokens, settings.max_step_tokens);
      EXPECT_LE(static_cast<int>(chunks.size()), settings.max_running);
      EXPECT_LE(static_cast<int>(scheduler.running()), settings.max_running);
      for (const ScheduledChunk& chunk : chunks) {
        Sequence& s = *chunk.sequence;
        s.computed += chunk.tokens;
        if (s.pending() > 0) continue;
        s.tokens.push_back(static_cast<int32_t>(1000 + s.tokens.size()));
        if (s.generated() == s.request.sampling.max_new_tokens) {
          const uint64_t id = s.request.id;
          live.erase(&s);
          scheduled_before.erase(&s);
          auto done = scheduler.finish(&s);
          EXPECT_TRUE(done->blocks.empty());
          lengths[id] = done->tokens.size();
        }
      }
    }
    EXPECT_EQ(allocator.free_count(), allocator.total());
  }

  BlockAllocator allocator;
  int block_size;
  SchedulerSettings settings;
  Scheduler scheduler;
  std::set<const Sequence*> live, scheduled_before;
  std::map<int32_t, std::vector<std::vector<int32_t>>> rows;  // block -> the tokens up to each row's, when written
  std::map<uint64_t, size_t> lengths;
  size_t expected = 0;
  int steps = 0;
  int most_holders = 0;
};

TEST(RolloutScheduler, MixedLengthsWithChunkedPrefillAndEnoughBlocks) {
  Simulation sim(64, 4, {3, 8});
  const int prompts[] = {1, 17, 5, 30, 2, 9, 12, 3};
  for (uint64_t r = 0; r < 8; ++r) sim.add(make_sequence(r, prompts[r], 1 + (r * 7) % 13, static_cast<int32_t>(r)));
  sim.run();
  for (uint64_t r = 0; r < 8; ++r) EXPECT_EQ(sim.lengths[r], prompts[r] + 1 + (r * 7) % 13);
  EXPECT_EQ(sim.scheduler.preemptions(), 0);
}

TEST(RolloutScheduler, PreemptsTheLatestAdmittedWhenBlocksRunOut) {
  // 10 blocks of 4 tokens; four sequences of 6 + 30 tokens each need 9 blocks at the end.
  Simulation sim(10, 4, {4, 64});
  for (uint64_t r = 0; r < 4; ++r) sim.add(make_sequence(r, 6, 30, static_cast<int32_t>(r)));
  sim.run();
  EXPECT_GT(sim.scheduler.preemptions(), 0);
  for (uint64_t r = 0; r < 4; ++r) EXPECT_EQ(sim.lengths[r], 36u);
}

// Two groups of four samples, 10-token prompts in blocks of 4: each group's first sample
// computes its prompt, the other three take its first two blocks (8 tokens; the third
// block also holds their own generated tokens) and compute 2 tokens each.
TEST(RolloutScheduler, GroupsPrefillTheWholeBlocksOfTheirPromptOnce) {
  for (const bool share : {true, false}) {
    Simulation sim(64, 4, {8, 64, share});
    for (uint64_t r = 0; r < 8; ++r) sim.add(make_sequence(r, 10, 5, static_cast<int32_t>(r / 4)));
    sim.run();
    for (uint64_t r = 0; r < 8; ++r) EXPECT_EQ(sim.lengths[r], 15u);
    EXPECT_EQ(sim.scheduler.shared_prompt_tokens(), share ? 6 * 8 : 0);
    EXPECT_EQ(sim.most_holders, share ? 4 : 1);
    EXPECT_EQ(sim.scheduler.preemptions(), 0);
  }
}

// A prompt of two whole blocks: the others take only the first, since the second holds the
// prompt's last token, which each computes for its own logits.
TEST(RolloutScheduler, ThePromptsLastTokenIsComputedByEverySample) {
  Simulation sim(64, 4, {4, 64});
  for (uint64_t r = 0; r < 4; ++r) sim.add(make_sequence(r, 8, 3));
  sim.run();
  EXPECT_EQ(sim.scheduler.shared_prompt_tokens(), 3 * 4);
  for (uint64_t r = 0; r < 4; ++r) EXPECT_EQ(sim.lengths[r], 11u);
}

// Two sequences at a time, and between the two pairs of one group other prompts take the
// freed blocks: the second pair must not find the first pair's blocks, only its own.
TEST(RolloutScheduler, ABlockFreedWithItsLastHolderIsNotFoundAgain) {
  Simulation sim(64, 4, {2, 64});
  sim.add(make_sequence(0, 10, 4));
  sim.add(make_sequence(1, 10, 4));
  sim.add(make_sequence(2, 10, 4, 1));
  sim.add(make_sequence(3, 10, 4, 1));
  sim.add(make_sequence(4, 10, 4));
  sim.add(make_sequence(5, 10, 4));
  sim.run();
  EXPECT_EQ(sim.scheduler.shared_prompt_tokens(), 3 * 8);
}

// A budget of 8 tokens a step: the first sample's 13-token prompt is prefilled in chunks
// over two steps, the others join as the budget allows.
TEST(RolloutScheduler, ChunkedPrefillOfASharedPromptKeepsEveryRowRight) {
  Simulation sim(64, 4, {4, 8});
  for (uint64_t r = 0; r < 4; ++r) sim.add(make_sequence(r, 13, 6));
  sim.run();
  for (uint64_t r = 0; r < 4; ++r) EXPECT_EQ(sim.lengths[r], 19u);
  EXPECT_GT(sim.scheduler.shared_prompt_tokens(), 0);
  EXPECT_GT(sim.most_holders, 1);
}

// A's 8-token prompt in chunks of 7 and 1 (budget 7): its last token completes its second
// block in a step of single tokens, where B (A's prompt and one token more) is admitted.
// B must not take that block, whose row A stores while B would read it; it takes the first
// and computes the other 5 tokens. With blocks of one token, a one-token prompt admitted
// first is such a chunk too.
TEST(RolloutScheduler, ABlockCompletedInAStepOfSingleTokensIsSharedFromTheNext) {
  for (const auto& [block_size, prompt, shared] :
       {std::tuple{4, size_t{8}, int64_t{4}}, std::tuple{1, size_t{1}, int64_t{0}}}) {
    Simulation sim(64, block_size, {2, 7});
    sim.add(make_sequence(0, prompt, 3));
    sim.add(make_sequence(1, prompt + 1, 3));
    sim.run();
    EXPECT_EQ(sim.scheduler.shared_prompt_tokens(), shared) << "blocks of " << block_size;
    EXPECT_EQ(sim.lengths[0], prompt + 3);
    EXPECT_EQ(sim.lengths[1], prompt + 4);
  }
}

// 12 blocks for four samples of one prompt that grow to 10 blocks each: preemption frees
// a victim's own blocks, the shared ones stay with the other holders, and the readmitted
// victim takes them again.
TEST(RolloutScheduler, PreemptionKeepsSharedBlocksForTheOtherHolders) {
  Simulation sim(12, 4, {4, 64});
  for (uint64_t r = 0; r < 4; ++r) sim.add(make_sequence(r, 9, 30));
  sim.run();
  EXPECT_GT(sim.scheduler.preemptions(), 0);
  EXPECT_GE(sim.scheduler.shared_prompt_tokens(), 3 * 8);
  for (uint64_t r = 0; r < 4; ++r) EXPECT_EQ(sim.lengths[r], 39u);
}

TEST(RolloutScheduler, TakeAllReleasesEveryBlock) {
  BlockAllocator allocator(20);
  Scheduler scheduler({2, 16}, allocator, 4);
  for (uint64_t r = 0; r < 5; ++r) scheduler.add(make_sequence(r, 7, 4, static_cast<int32_t>(r)));
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

// As the engine queues a step: every chunk's tokens computed, and a placeholder token
// appended to each sequence whose chunk reaches its end.
void queue(const std::vector<ScheduledChunk>& chunks) {
  for (const ScheduledChunk& chunk : chunks) {
    Sequence& s = *chunk.sequence;
    const bool samples = chunk.tokens == s.pending();
    s.computed += chunk.tokens;
    if (samples) s.tokens.push_back(Sequence::kUnsampled);
  }
}

// Planning a step ahead: only the running sequences' decodes, with blocks granted at a
// boundary; nothing at all (and nothing changed) where the step would need more.
TEST(RolloutScheduler, DecodesPlannedAheadAreOnlyDecodes) {
  BlockAllocator allocator(6);
  Scheduler scheduler({2, 16}, allocator, 4);
  scheduler.add(make_sequence(0, 4, 3, 0));  // its first sample's token starts a second block
  scheduler.add(make_sequence(1, 6, 1, 1));  // has all its tokens after the first step
  queue(scheduler.schedule());
  EXPECT_EQ(allocator.free_count(), 3);

  std::vector<ScheduledChunk> next = scheduler.schedule_decodes();
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].sequence->request.id, 0u);
  EXPECT_EQ(next[0].sequence->blocks.size(), 2u);
  EXPECT_EQ(allocator.free_count(), 2);

  // A waiting sequence with a place free (the finished one's): planned after the results.
  scheduler.add(make_sequence(2, 3, 2, 2));
  queue(next);
  EXPECT_TRUE(scheduler.schedule_decodes().empty());
  EXPECT_EQ(allocator.free_count(), 2);
}

TEST(RolloutScheduler, DecodesPlannedAheadDeclineWhatNeedsMore) {
  {  // a prompt in chunks: its next chunk is no decode
    BlockAllocator allocator(8);
    Scheduler scheduler({2, 4}, allocator, 4);
    scheduler.add(make_sequence(0, 10, 3, 0));
    queue(scheduler.schedule());
    EXPECT_TRUE(scheduler.schedule_decodes().empty());
  }
  {  // two boundaries to cross and one block free: that step preempts, so not now
    BlockAllocator allocator(5);
    Scheduler scheduler({2, 16}, allocator, 4);
    scheduler.add(make_sequence(0, 8, 5, 0));
    scheduler.add(make_sequence(1, 8, 5, 1));
    queue(scheduler.schedule());
    EXPECT_EQ(allocator.free_count(), 1);
    EXPECT_TRUE(scheduler.schedule_decodes().empty());
    EXPECT_EQ(allocator.free_count(), 1);
  }
}

TEST(RolloutScheduler, RefusesABudgetBelowTheRunningLimit) {
  BlockAllocator allocator(4);
  EXPECT_THROW(Scheduler({8, 4}, allocator, 4), std::invalid_argument);
}

TEST(PromptBlockIndex, FindsABlockByTheOneBeforeItAndItsTokensUntilForgotten) {
  PromptBlockIndex index(8);
  const std::vector<int32_t> first = {1, 2, 3, 4}, second = {5, 6, 7, 8};
  index.add(PromptBlockIndex::kNone, first, 3);
  index.add(3, second, 5);
  EXPECT_EQ(index.find(PromptBlockIndex::kNone, first), 3);
  EXPECT_EQ(index.find(3, second), 5);
  EXPECT_EQ(index.find(PromptBlockIndex::kNone, second), PromptBlockIndex::kNone);  // not a first block
  EXPECT_EQ(index.find(4, second), PromptBlockIndex::kNone);                        // after another block
  index.add(PromptBlockIndex::kNone, first, 6);  // the name is taken: block 3 stays
  EXPECT_EQ(index.find(PromptBlockIndex::kNone, first), 3);
  index.add(PromptBlockIndex::kNone, second, 5);  // block 5 already has a name: unchanged
  EXPECT_EQ(index.find(PromptBlockIndex::kNone, second), PromptBlockIndex::kNone);
  index.forget(5);
  index.forget(5);  // a block not indexed (any more) is left alone
  index.forget(7);
  EXPECT_EQ(index.find(3, second), PromptBlockIndex::kNone);
  index.add(3, second, 7);  // a freed name is free for another block
  EXPECT_EQ(index.find(3, second), 7);
}

TEST(BlockAllocator, ASharedBlockIsFreeAfterItsLastHolder) {
  BlockAllocator allocator(2);
  const int32_t block = allocator.allocate();
  allocator.share(block);
  allocator.share(block);
  EXPECT_FALSE(allocator.release(block));
  EXPECT_FALSE(allocator.release(block));
  EXPECT_EQ(allocator.free_count(), 1);
  EXPECT_TRUE(allocator.release(block));
  EXPECT_EQ(allocator.free_count(), 2);
  EXPECT_THROW(allocator.share(block), std::invalid_argument);
  EXPECT_THROW(allocator.release(block), std::invalid_argument);
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
