// The policy trainer on the CPU: a step taken in micro-batches equals the step on the
// whole batch (loss, gradient norm, metrics, log-probs and the weights after the update)
// for every loss aggregation and for the supervised warm-up, with activations sized for
// one micro-batch; and the memory it refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "policy_trainer_support.h"

namespace tandem {
namespace {

using testing::AlignedBuffer;
using testing::CpuTrainer;
using testing::flat;
using testing::OneRank;

// 1e-6 relative to 1 + |value|: the micro-batches' matmuls round each row differently
// (CpuOps handles rows four at a time, and a micro-batch's rows fall differently into
// those blocks), and the gradients add up in another order.
void expect_near(double got, double want, const char* what) {
  EXPECT_NEAR(got, want, 1e-6 * (1 + std::fabs(want))) << what;
}

void expect_same_step(const TrainStepResult& whole, const TrainStepResult& micro) {
  expect_near(micro.loss, whole.loss, "loss");
  expect_near(micro.grad_norm, whole.grad_norm, "grad_norm");
  EXPECT_EQ(micro.tokens, whole.tokens);
  expect_near(micro.mean_logp, whole.mean_logp, "mean_logp");
  const PolicyLossMetrics &a = whole.metrics, &b = micro.metrics;
  expect_near(b.pg_loss, a.pg_loss, "pg_loss");
  expect_near(b.kl_mean, a.kl_mean, "kl_mean");
  expect_near(b.entropy_mean, a.entropy_mean, "entropy_mean");
  EXPECT_EQ(b.clip_fraction_low, a.clip_fraction_low);
  EXPECT_EQ(b.clip_fraction_high, a.clip_fraction_high);
  expect_near(b.ratio_mean, a.ratio_mean, "ratio_mean");
  expect_near(b.ratio_max, a.ratio_max, "ratio_max");
  ASSERT_EQ(micro.sequence_logp.size(), whole.sequence_logp.size());
  for (size_t s = 0; s < whole.sequence_logp.size(); ++s)
    for (size_t j = 0; j < whole.sequence_logp[s].size(); ++j)
      expect_near(micro.sequence_logp[s][j], whole.sequence_logp[s][j], "sequence_logp");
}

void expect_same_weights(const CpuTrainer& whole, const CpuTrainer& micro) {
  double largest = 0, moved = 0;
  for (size_t i = 0; i < whole.master.size(); ++i) {
    largest = std::max(largest, static_cast<double>(std::fabs(micro.master[i] - whole.master[i])));
    moved = std::max(moved, static_cast<double>(std::fabs(whole.master[i] - whole.reference[i])));
  }
  EXPECT_LE(largest, 1e-6);
  EXPECT_GT(moved, 1e-3);  // the update did happen
}

constexpr int64_t kMicroBatchTokens = 12;
constexpr double kLr = 1e-2;

struct Case {
  ModelConfig config = testing::trainer_config();
  std::vector<float> weights = testing::trainer_weights(ParameterLayout(config), 11);
  std::vector<std::vector<TrainSequence>> batches = {testing::random_batch(config, 8, 21),
                                                     testing::random_batch(config, 8, 22)};
  ActivationCapacity whole_capacity() const {
    int64_t tokens = 0;
    for (const auto& batch : batches) tokens = std::max(tokens, testing::batch_tokens(batch));
    return {tokens, 8};
  }
  // One micro-batch: the budget, or a longer sequence alone.
  ActivationCapacity micro_capacity() const {
    int64_t tokens = kMicroBatchTokens;
    for (const auto& batch : batches) tokens = std::max(tokens, testing::longest_sequence(batch));
    return {tokens, 8};
  }
};

TEST(PolicyTrainer, MicroBatchedGrpoStepEqualsTheWholeBatchStep) {
  const Case setup;
  ASSERT_LT(setup.micro_capacity().max_tokens * 2, setup.whole_capacity().max_tokens);  // several micro-batches
  for (const LossAggregation aggregation :
       {LossAggregation::TokenMean, LossAggregation::SeqMeanTokenMean, LossAggregation::GlobalTokenSum}) {
    SCOPED_TRACE(static_cast<int>(aggregation));
    CpuTrainer whole(setup.config, setup.whole_capacity(), setup.weights);
    CpuTrainer micro(setup.config, setup.micro_capacity(), setup.weights);
    const PolicyLossSettings loss = testing::grpo_loss(aggregation);
    for (int64_t step = 1; step <= 2; ++step) {
      const auto& batch = setup.batches[step - 1];
      const TrainStepResult a = whole.trainer.grpo_step(batch, loss, kLr, step, testing::trainer_settings(0));
      const TrainStepResult b =
          micro.trainer.grpo_step(batch, loss, kLr, step, testing::trainer_settings(kMicroBatchTokens));
      expect_same_step(a, b);
      // Every part of the loss is at work: clipping on both sides, KL, entropy.
      EXPECT_GT(a.metrics.clip_fraction_low + a.metrics.clip_fraction_high, 0);
      EXPECT_LT(a.metrics.clip_fraction_low + a.metrics.clip_fraction_high, 1);
      EXPECT_GT(a.metrics.entropy_mean, 0);
      if (step == 2) EXPECT_GT(a.metrics.kl_mean, 0);
    }
    expect_same_weights(whole, micro);
  }
}

TEST(PolicyTrainer, MicroBatchedSftStepEqualsTheWholeBatchStep) {
  const Case setup;
  CpuTrainer whole(setup.config, setup.whole_capacity(), setup.weights);
  CpuTrainer micro(setup.config, setup.micro_capacity(), setup.weights);
  for (int64_t step = 1; step <= 2; ++step) {
    const auto& batch = setup.batches[step - 1];
    const TrainStepResult a = whole.trainer.sft_step(batch, kLr, step, testing::trainer_settings(0));
    const TrainStepResult b = micro.trainer.sft_step(batch, kLr, step, testing::trainer_settings(kMicroBatchTokens));
    expect_same_step(a, b);
    EXPECT_NEAR(a.loss, -a.mean_logp, 1e-12);
  }
  expect_same_weights(whole, micro);
}

TEST(PolicyTrainer, ABatchBeyondTheActivationCapacityIsRefused) {
  const Case setup;
  CpuTrainer micro(setup.config, setup.micro_capacity(), setup.weights);
  const auto& batch = setup.batches[0];
  try {
    micro.trainer.sft_step(batch, kLr, 1, testing::trainer_settings(0));  // the whole batch at once
    FAIL() << "no error";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("exceeds the trainer's capacity"), std::string::npos) << error.what();
  }
  // Nothing was updated by the refused step.
  EXPECT_EQ(micro.master, setup.weights);
}

TEST(PolicyTrainer, RefusesMemoryItCannotTrainOn) {
  const ModelConfig config = testing::trainer_config();
  const ParameterLayout layout(config);
  const ActivationCapacity capacity{16, 2};
  std::vector<float> master(static_cast<size_t>(layout.slab_elements())), grads(master), m(master), v(master);
  std::vector<uint16_t> working(master.size());
  AlignedBuffer activations(PolicyTrainer::activation_bytes(config, capacity, DType::F32));
  OneRank communicator;
  const PolicyTrainerMemory good{flat(master), flat(grads), flat(m), flat(v), flat(master), activations.data.get()};
  EXPECT_NO_THROW(PolicyTrainer(config, layout, good, capacity, communicator, 1));

  PolicyTrainerMemory bf16 = good;  // the CPU backend is FP32 only
  bf16.working = Tensor::view(working.data(), DType::BF16, Device::CPU, {layout.slab_elements()});
  EXPECT_THROW(PolicyTrainer(config, layout, bf16, capacity, communicator, 1), std::invalid_argument);
  PolicyTrainerMemory short_grads = good;
  short_grads.grads = Tensor::view(grads.data(), DType::F32, Device::CPU, {layout.slab_elements() - 1});
  EXPECT_THROW(PolicyTrainer(config, layout, short_grads, capacity, communicator, 1), std::invalid_argument);
  PolicyTrainerMemory no_activations = good;
  no_activations.activations = nullptr;
  EXPECT_THROW(PolicyTrainer(config, layout, no_activations, capacity, communicator, 1), std::invalid_argument);

  PolicyTrainer trainer(config, layout, good, capacity, communicator, 1);
  std::vector<float> half_reference(master.size() / 2);
  EXPECT_THROW(trainer.set_reference(flat(half_reference)), std::invalid_argument);
}

}  // namespace
}  // namespace tandem
