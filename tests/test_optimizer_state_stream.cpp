// The optimizer state streamed chunk by chunk (optimizer.state = host | disk): the chunk
// plan covers every AdamW value once and respects the slot size, and the streamed steps
// equal the steps on the state in place, bit for bit, for AdamW and for Muon (whose
// matrices keep their momentum in place on the CPU), with slots small enough to cut the
// model into many chunks and its tensors across chunks.
#include <gtest/gtest.h>

#include <algorithm>

#include "policy_trainer_support.h"
#include "train/muon.h"
#include "train/optimizer_state_chunks.h"

namespace tandem {
namespace {

TEST(OptimizerStateChunks, CoverEveryAdamWValueOnceWithinTheSlot) {
  const ParameterLayout layout(testing::trainer_config());
  for (const OptimizerKind optimizer : {OptimizerKind::AdamW, OptimizerKind::Muon}) {
    for (const size_t slot : {size_t{2}, size_t{777}, size_t{1} << 20}) {
      SCOPED_TRACE(std::to_string(slot) + (optimizer == OptimizerKind::Muon ? " muon" : " adamw"));
      std::vector<int> covered(static_cast<size_t>(layout.slab_elements()), 0);
      const std::vector<StateChunk> chunks = plan_state_chunks(adamw_pieces(layout, optimizer, SlabShards::whole(layout)), slot);
      for (const StateChunk& chunk : chunks) {
        ASSERT_LE(chunk.elements, slot / 2);
        std::vector<int> used(slot, 0);
        for (const AdamWPiece& piece : chunk.pieces) {
          const ParameterInfo& info = layout.tensors()[piece.tensor];
          ASSERT_GE(piece.offset, static_cast<size_t>(info.offset));
          ASSERT_LE(piece.offset + piece.count, static_cast<size_t>(info.offset + info.numel()));
          for (size_t i = 0; i < piece.count; ++i) {
            ++covered[piece.offset + i];
            ++used[piece.exp_avg + i];
            ++used[piece.exp_avg_sq + i];
          }
        }
        const size_t half = slot / 2;
        for (size_t i = 0; i < slot; ++i)  // the pieces fill each half from its start, without overlap
          ASSERT_EQ(used[i], i < 2 * half && i % half < chunk.elements ? 1 : 0) << i;
      }
      for (const ParameterInfo& info : layout.tensors()) {
        const int want = optimizer == OptimizerKind::Muon && takes_muon(info) ? 0 : 1;
        for (int64_t i = 0; i < info.numel(); ++i) ASSERT_EQ(covered[info.offset + i], want) << info.name;
      }
      if (slot == 777 && optimizer == OptimizerKind::AdamW) EXPECT_GT(chunks.size(), 10u);
      if (slot == (size_t{1} << 20)) EXPECT_EQ(chunks.size(), 1u);
    }
  }
  EXPECT_THROW(plan_state_chunks(adamw_pieces(layout, OptimizerKind::AdamW, SlabShards::whole(layout)), 1), std::invalid_argument);
}

TEST(OptimizerStateChunks, MuonChunksHoldRunsOfWholeMatricesOfOneGroup) {
  const std::vector<MuonGroup> groups = muon_groups(ParameterLayout(testing::trainer_config()));
  size_t largest = 0;
  for (const MuonGroup& group : groups) largest = std::max(largest, static_cast<size_t>(group.m * group.n));
  const size_t slot = 2 * largest + 1;
  std::vector<size_t> next(groups.size(), 0);  // each group's matrices in order, each once
  for (const MuonChunk& chunk : plan_muon_chunks(groups, slot)) {
    const size_t elements = static_cast<size_t>(groups[chunk.group].m * groups[chunk.group].n);
    ASSERT_EQ(chunk.first, next[chunk.group]);
    ASSERT_GT(chunk.last, chunk.first);
    ASSERT_LE(chunk.elements, slot);
    ASSERT_EQ(chunk.elements, (chunk.last - chunk.first) * elements);
    for (size_t j = 0; j < chunk.momentum.size(); ++j) ASSERT_EQ(chunk.momentum[j], static_cast<int64_t>(j * elements));
    next[chunk.group] = chunk.last;
  }
  for (size_t g = 0; g < groups.size(); ++g) EXPECT_EQ(next[g], groups[g].matrices.size());
  EXPECT_THROW(plan_muon_chunks(groups, largest - 1), std::invalid_argument);
}

void expect_streamed_equals_in_place(OptimizerKind optimizer) {
  const ModelConfig config = testing::trainer_config();
  const std::vector<float> weights = testing::trainer_weights(ParameterLayout(config), 11);
  std::vector<std::vector<TrainSequence>> batches;
  for (uint32_t seed = 21; seed < 24; ++seed) batches.push_back(testing::random_batch(config, 8, seed));
  int64_t tokens = 0;
  for (const auto& batch : batches) tokens = std::max(tokens, testing::batch_tokens(batch));
  const ActivationCapacity capacity{tokens, 8};
  testing::CpuTrainer in_place(config, capacity, weights, 0, optimizer);
  // 101 values: an odd size, so pieces of a tensor end mid-slot and the next one follows.
  // Under Muon a slot holds whole matrices: the largest one and 101 values more, so the
  // groups are cut into several chunks.
  const ParameterLayout layout(config);
  const std::vector<MuonGroup> groups = muon_groups(layout);
  size_t slot = 101;
  if (optimizer == OptimizerKind::Muon) {
    for (const MuonGroup& group : groups) slot = std::max(slot, static_cast<size_t>(101 + group.m * group.n));
    EXPECT_GT(plan_muon_chunks(groups, slot).size(), groups.size() + 2);
  }
  EXPECT_GT(plan_state_chunks(adamw_pieces(layout, optimizer, SlabShards::whole(layout)), slot).size(), 2u);
  testing::CpuTrainer streamed(config, capacity, weights, slot, optimizer);
  PolicyTrainerSettings settings = testing::trainer_settings(0);
  settings.optimizer.kind = optimizer;
  const PolicyLossSettings loss = testing::grpo_loss(LossAggregation::TokenMean);
  for (int64_t step = 1; step <= 3; ++step) {
    const TrainStepResult a = in_place.trainer.grpo_step(batches[step - 1], loss, 1e-2, step, settings);
    const TrainStepResult b = streamed.trainer.grpo_step(batches[step - 1], loss, 1e-2, step, settings);
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
  }
  EXPECT_EQ(in_place.master, streamed.master);
  EXPECT_EQ(in_place.exp_avg, streamed.exp_avg);
  EXPECT_EQ(in_place.exp_avg_sq, streamed.exp_avg_sq);
  EXPECT_NE(in_place.master, weights);
}

TEST(OptimizerStateStream, StreamedAdamWEqualsTheStateInPlaceBitForBit) {
  expect_streamed_equals_in_place(OptimizerKind::AdamW);
}

TEST(OptimizerStateStream, StreamedMuonEqualsTheStateInPlaceBitForBit) {
  expect_streamed_equals_in_place(OptimizerKind::Muon);
}

}  // namespace
}  // namespace tandem
