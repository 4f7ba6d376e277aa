// ZeRO-1 under mpirun (-np 2 and -np 4): the MPI reduce-scatter and all-gather on unequal
// ranges, and a trainer whose master weights and optimizer state are sharded over the
// ranks taking the same steps as one holding them whole.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "policy_trainer_support.h"
#include "train/optimizer_shards.h"
#include "world/communicator.h"

namespace tandem {
namespace {

using testing::AlignedBuffer;
using testing::flat;

// Unequal ranges, one of them empty.
std::vector<size_t> uneven_counts(int size) {
  std::vector<size_t> counts;
  for (int r = 0; r < size; ++r) counts.push_back(r == 1 ? 0 : static_cast<size_t>(5 + 3 * r));
  return counts;
}

TEST(Zero1Collectives, ReduceScatterLeavesEachRankTheSumOfItsRange) {
  const auto communicator = make_mpi_communicator(MPI_COMM_WORLD);
  const int size = communicator->size(), rank = communicator->rank();
  ASSERT_GE(size, 2) << "run this program under mpirun -np 2 or more";
  const std::vector<size_t> counts = uneven_counts(size);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  std::vector<float> data(total);
  for (size_t i = 0; i < total; ++i) data[i] = static_cast<float>((rank + 1) * (i + 1));
  communicator->reduce_scatter_sum(data.data(), counts);
  const size_t begin = std::accumulate(counts.begin(), counts.begin() + rank, size_t{0});
  const float ranks_sum = static_cast<float>(size * (size + 1) / 2);
  for (size_t i = begin; i < begin + counts[rank]; ++i) EXPECT_EQ(data[i], ranks_sum * static_cast<float>(i + 1)) << i;
}

TEST(Zero1Collectives, AllGatherBringsEveryRanksRangeToEveryRank) {
  const auto communicator = make_mpi_communicator(MPI_COMM_WORLD);
  const int size = communicator->size(), rank = communicator->rank();
  const std::vector<size_t> counts = uneven_counts(size);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  // 2-byte elements, as a BF16 working copy: each rank fills only its own range.
  std::vector<uint16_t> data(total, 0xffff);
  size_t begin = 0;
  std::vector<uint16_t> want(total);
  for (int r = 0; r < size; ++r) {
    for (size_t i = begin; i < begin + counts[r]; ++i) {
      want[i] = static_cast<uint16_t>(1000 * r + i);
      if (r == rank) data[i] = want[i];
    }
    begin += counts[r];
  }
  communicator->all_gather(data.data(), counts, sizeof(uint16_t));
  EXPECT_EQ(data, want);
}

// A CPU trainer of one rank of the world: its shard (or all) of the master weights and
// state, the whole gradients and working copy.
struct RankTrainer {
  RankTrainer(const ModelConfig& config, ActivationCapacity capacity, const std::vector<float>& weights,
              const SlabShards& shard, size_t state_slot_elements, OptimizerKind optimizer, Communicator& communicator)
      : layout(config),
        master(weights.begin() + shard.begin(), weights.begin() + shard.end()),
        exp_avg(master.size()),
        exp_avg_sq(master.size()),
        grads(weights.size()),
        working(weights),
        reference(weights),
        staging(2 * state_slot_elements),
        activations(PolicyTrainer::activation_bytes(config, capacity, DType::F32, optimizer)),
        trainer(config, layout,
                PolicyTrainerMemory{flat(master), flat(grads), flat(exp_avg), flat(exp_avg_sq), flat(working),
                                    activations.data.get(), state_slot_elements ? staging.data() : nullptr,
                                    state_slot_elements, shard},
                capacity, communicator, communicator.size()) {
    trainer.set_reference(flat(reference));
  }

  ParameterLayout layout;
  std::vector<float> master, exp_avg, exp_avg_sq, grads, working, reference, staging;
  AlignedBuffer activations;
  PolicyTrainer trainer;
};

struct Case {
  OptimizerKind optimizer;
  bool streamed;  // optimizer.state = host | disk: the state through two staging slots
};

void expect_sharded_equals_whole(const Case& c) {
  const auto communicator = make_mpi_communicator(MPI_COMM_WORLD);
  const int size = communicator->size(), rank = communicator->rank();
  const ModelConfig config = testing::trainer_config();
  const ParameterLayout layout(config);
  const std::vector<float> weights = testing::trainer_weights(layout, 5);
  std::vector<std::vector<TrainSequence>> batches;  // each rank its own part of the batch
  for (uint32_t step = 0; step < 3; ++step)
    batches.push_back(testing::random_batch(config, 4, 100 * step + static_cast<uint32_t>(rank)));
  int64_t tokens = 0;
  for (const auto& batch : batches) tokens = std::max(tokens, testing::batch_tokens(batch));
  const ActivationCapacity capacity{tokens, 4};
  size_t slot = 0;
  if (c.streamed) {
    slot = 301;
    for (const MuonGroup& group : muon_groups(layout)) slot = std::max(slot, static_cast<size_t>(101 + group.m * group.n));
  }
  const SlabShards shard = SlabShards::split(layout, c.optimizer, size, rank);
  RankTrainer whole(config, capacity, weights, SlabShards::whole(layout), slot, c.optimizer, *communicator);
  RankTrainer sharded(config, capacity, weights, shard, slot, c.optimizer, *communicator);
  PolicyTrainerSettings settings = testing::trainer_settings(0);
  settings.optimizer.kind = c.optimizer;
  settings.max_grad_norm = 0.05;  // small enough that every step clips: the global norm must be right
  const PolicyLossSettings loss = testing::grpo_loss(LossAggregation::GlobalTokenSum);
  for (int64_t step = 1; step <= 3; ++step) {
    const auto& batch = batches[static_cast<size_t>(step - 1)];
    const TrainStepResult a = whole.trainer.grpo_step(batch, loss, 1e-2, step, settings);
    const TrainStepResult b = sharded.trainer.grpo_step(batch, loss, 1e-2, step, settings);
    EXPECT_GT(a.grad_norm, settings.max_grad_norm);
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-5 * a.grad_norm) << "step " << step;
    EXPECT_NEAR(b.loss, a.loss, 1e-4 * (1 + std::fabs(a.loss))) << "step " << step;
  }
  // The working copies (all-gathered from the shards) agree everywhere, and the shard of
  // the master weights is the whole one's part, after updates far larger than the tolerance.
  double moved = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    moved = std::max(moved, std::fabs(static_cast<double>(whole.working[i]) - weights[i]));
    ASSERT_NEAR(sharded.working[i], whole.working[i], 2e-6) << "slab element " << i;
  }
  EXPECT_GT(moved, 1e-3);
  for (size_t i = 0; i < sharded.master.size(); ++i)
    ASSERT_EQ(sharded.master[i], sharded.working[static_cast<size_t>(shard.begin()) + i]) << i;
}

TEST(Zero1Trainer, AdamWShardedTakesTheStepsOfTheWholeOptimizer) { expect_sharded_equals_whole({OptimizerKind::AdamW, false}); }
TEST(Zero1Trainer, MuonShardedTakesTheStepsOfTheWholeOptimizer) { expect_sharded_equals_whole({OptimizerKind::Muon, false}); }
TEST(Zero1Trainer, StreamedStateShardedTakesTheStepsOfTheWholeOptimizer) {
  expect_sharded_equals_whole({OptimizerKind::AdamW, true});
  expect_sharded_equals_whole({OptimizerKind::Muon, true});
}

// A NaN in one rank's gradients reaches every shard through the reduce-scatter: every rank
// sees the non-finite global norm and skips the update.
TEST(Zero1Trainer, NonFiniteGradientsOnOneRankSkipTheStepOnEveryRank) {
  const auto communicator = make_mpi_communicator(MPI_COMM_WORLD);
  const int size = communicator->size(), rank = communicator->rank();
  const ModelConfig config = testing::trainer_config();
  const ParameterLayout layout(config);
  const std::vector<float> weights = testing::trainer_weights(layout, 9);
  std::vector<TrainSequence> batch = testing::random_batch(config, 4, 7 + static_cast<uint32_t>(rank));
  if (rank == size - 1) batch[0].advantage = std::numeric_limits<float>::quiet_NaN();
  const ActivationCapacity capacity{testing::batch_tokens(batch), 4};
  RankTrainer sharded(config, capacity, weights, SlabShards::split(layout, OptimizerKind::AdamW, size, rank), 0,
                      OptimizerKind::AdamW, *communicator);
  const TrainStepResult result = sharded.trainer.grpo_step(batch, testing::grpo_loss(LossAggregation::GlobalTokenSum),
                                                           1e-2, 1, testing::trainer_settings(0));
  EXPECT_FALSE(std::isfinite(result.grad_norm));
  EXPECT_NE(result.non_finite.find(rank == size - 1 ? "micro-batch 1 of 1" : "after the reduce-scatter"),
            std::string::npos)
      << result.non_finite;
  EXPECT_EQ(sharded.working, weights);
}

}  // namespace
}  // namespace tandem
