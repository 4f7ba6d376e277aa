// The colocation handoff plans, run on the CPU pool with memory accounting alone.
#include <gtest/gtest.h>

#include <algorithm>

#include "driver/handoff_plan.h"

using namespace tandem;

namespace {

constexpr size_t MiB = size_t{1} << 20;
// Sizes in the ratio of a bf16 engine copy W to the trainer's FP32 state.
constexpr size_t W = 8 * MiB, KV = 6 * MiB, M = 2 * W, O = 2 * M, G = M, A = 4 * MiB, D = W;

struct Colocated {
  // No pinned cache: host bytes must fall when a copy comes back, to see the real peaks.
  std::unique_ptr<MemoryPool> pool = MemoryPool::create(Device::CPU, 0, PoolOptions{.pinned_host_cache = false});
  int syncs = 0;
  std::vector<std::string> rebuilt;
  Colocated() {
    pool->allocate(tags::weights, W, "engine.weights");
    pool->allocate(tags::kv_cache, KV, "engine.kv");
    pool->allocate(tags::master_weights, M, "trainer.master");
    pool->allocate(tags::optimizer, O, "trainer.adam");
    pool->allocate(tags::grads, G, "trainer.grads");
    pool->allocate(tags::activations, A, "trainer.activations");
    pool->allocate(tags::derived, D, "trainer.bf16_copy");
  }
  HandoffExecutor executor(HandoffConfig config) {
    return HandoffExecutor(*pool, config, [this] { return SyncReport{static_cast<size_t>(++syncs), 0}; },
                           [this](const std::vector<std::string>& names) {
                             rebuilt.insert(rebuilt.end(), names.begin(), names.end());
                           });
  }
};

HandoffConfig config_for(PeakDevice mode, bool level_weight = true) {
  HandoffConfig config;
  config.peak_device = mode;
  config.level_weight = level_weight;
  return config;
}

}  // namespace

TEST(HandoffPlan, PlansReadAsTheDesignSays) {
  using A = HandoffAction;
  EXPECT_EQ(handoff_plan(PeakDevice::Gpu, HandoffPoint::Startup), std::vector<A>{A::OffloadKv});
  EXPECT_EQ(handoff_plan(PeakDevice::Gpu, HandoffPoint::AfterGenerate),
            (std::vector<A>{A::OffloadKv, A::OnloadTrain, A::OffloadWeights}));
  EXPECT_EQ(handoff_plan(PeakDevice::Gpu, HandoffPoint::BeforeSync),
            (std::vector<A>{A::ClearTrainMemory, A::OnloadWeights, A::OffloadTrain, A::SyncWeights, A::OnloadKv}));
  EXPECT_EQ(handoff_plan(PeakDevice::Cpu, HandoffPoint::AfterGenerate),
            (std::vector<A>{A::OffloadKv, A::OffloadWeights, A::OnloadTrain}));
}

TEST(HandoffPlan, GpuModeRequiresBothOffloadFlags) {
  Colocated job;
  HandoffConfig config = config_for(PeakDevice::Gpu);
  config.offload_train = false;
  EXPECT_THROW(job.executor(config), std::invalid_argument);
}

// One full step in each mode: the peaks land on the side the mode names.
TEST(HandoffPlan, CpuModePeaksOnHostGpuModePeaksOnDevice) {
  for (PeakDevice mode : {PeakDevice::Cpu, PeakDevice::Gpu}) {
    SCOPED_TRACE(mode == PeakDevice::Cpu ? "cpu" : "gpu");
    Colocated job;
    auto executor = job.executor(config_for(mode));
    executor.run(HandoffPoint::Startup);
    executor.run(HandoffPoint::BeforeSync);  // the first sync always comes before generating
    EXPECT_EQ(job.syncs, 1);
    // Engine generating: its weights and KV cache on the device, the trainer's state on the host.
    MemoryStats ready = job.pool->stats();
    EXPECT_EQ(ready.device_bytes, W + KV);
    EXPECT_EQ(ready.host_bytes, M + O);

    const HandoffReport after = executor.run(HandoffPoint::AfterGenerate);
    const HandoffReport before = executor.run(HandoffPoint::BeforeSync);
    EXPECT_EQ(job.syncs, 2);
    if (mode == PeakDevice::Cpu) {
      // Host briefly holds the engine's copy and the trainer's state; the device never both.
      EXPECT_EQ(after.peak.host_pool, M + O + W);
      EXPECT_EQ(after.peak.device_pool, M + O + G + A + D);
      EXPECT_EQ(before.peak.host_pool, M + O + W);
    } else {
      EXPECT_EQ(after.peak.device_pool, W + M + O + G + A + D);
      EXPECT_EQ(after.peak.host_pool, std::max(M + O, W));
      EXPECT_EQ(before.peak.host_pool, std::max(M + O, W));
    }
    // Derived copies are rebuilt, never copied: only master, optimizer and engine weights move.
    EXPECT_EQ(after.bytes_moved, M + O + W);
    EXPECT_NE(std::find(job.rebuilt.begin(), job.rebuilt.end(), "trainer.bf16_copy"), job.rebuilt.end());
    // Back where the step started.
    MemoryStats end = job.pool->stats();
    EXPECT_EQ(end.device_bytes, W + KV);
    EXPECT_EQ(end.host_bytes, M + O);
  }
}

TEST(HandoffPlan, WeightLevelOffGatesWeightMovesInBothModes) {
  for (bool level_weight : {false, true}) {
    bool offloaded[2];
    for (PeakDevice mode : {PeakDevice::Cpu, PeakDevice::Gpu}) {
      Colocated job;
      auto executor = job.executor(config_for(mode, level_weight));
      for (HandoffPoint point : {HandoffPoint::Startup, HandoffPoint::BeforeSync, HandoffPoint::AfterGenerate,
                                 HandoffPoint::BeforeSync}) {
        const HandoffReport report = executor.run(point);
        for (const auto& action : report.executed) {
          if (!level_weight) EXPECT_TRUE(action != "offload_weights" && action != "onload_weights") << action;
        }
      }
      offloaded[mode == PeakDevice::Gpu] = executor.weights_ever_offloaded();
    }
    // The two modes agree on whether weights were ever offloaded.
    EXPECT_EQ(offloaded[0], offloaded[1]);
    EXPECT_EQ(offloaded[0], level_weight);
  }
}

TEST(HandoffPlan, NoTrainOffloadOnlyClearsTransientMemory) {
  Colocated job;
  HandoffConfig config = config_for(PeakDevice::Cpu);
  config.offload_train = false;
  auto executor = job.executor(config);
  executor.run(HandoffPoint::Startup);
  executor.run(HandoffPoint::BeforeSync);
  // Master weights and optimizer never leave the device; grads and activations were dropped.
  EXPECT_EQ(job.pool->stats().device_bytes, M + O + D + W + KV);
  executor.run(HandoffPoint::AfterGenerate);
  EXPECT_EQ(job.pool->stats().device_bytes, M + O + D + G + A);
  EXPECT_EQ(job.pool->stats().host_bytes, W);
}

// optimizer.state = host | disk: the optimizer tag holds only the staging the state
// streams through, so offloading the trainer drops it (no bytes to the host) and
// onloading maps it back empty; the memory plan's ledger replays the same operations.
TEST(HandoffPlan, StateOffTheDeviceIsDroppedNotOffloaded) {
  for (const PeakDevice mode : {PeakDevice::Cpu, PeakDevice::Gpu}) {
    Colocated job;
    HandoffConfig config = config_for(mode);
    config.optimizer_off_device = true;
    const std::vector<TagOperation> offload = handoff_operations(HandoffAction::OffloadTrain, config);
    EXPECT_NE(std::find_if(offload.begin(), offload.end(),
                           [](const TagOperation& op) { return op.tag == tags::optimizer && op.move == TagMove::Drop; }),
              offload.end());
    auto executor = job.executor(config);
    executor.run(HandoffPoint::Startup);
    const HandoffReport to_rollout = executor.run(HandoffPoint::BeforeSync);
    // The trainer's offload copies its master weights only (and, in cpu mode, nothing of the engine's).
    EXPECT_EQ(to_rollout.bytes_moved, M + (mode == PeakDevice::Cpu ? W : 0)) << static_cast<int>(mode);
    EXPECT_EQ(job.pool->stats().host_bytes, M);
    executor.run(HandoffPoint::AfterGenerate);
    EXPECT_NE(std::find(job.rebuilt.begin(), job.rebuilt.end(), "trainer.adam"), job.rebuilt.end());
  }
}

// A fresh start's optimizer state is zeros, so with offload-train it starts unmapped (the
// first onload maps it zeroed); a job that may resume reads a checkpoint into it, and a
// trainer that never offloads keeps it mapped.
TEST(HandoffPlan, OptimizerStateStartsUnmappedOnlyOnAFreshStartThatOffloadsTheTrainer) {
  const auto defers_optimizer = [](bool offload_train, bool fresh_start) {
    HandoffConfig config = config_for(PeakDevice::Cpu);
    config.offload_train = offload_train;
    const std::vector<Tag> deferred = deferred_at_startup(config, fresh_start);
    return std::find(deferred.begin(), deferred.end(), tags::optimizer) != deferred.end();
  };
  EXPECT_TRUE(defers_optimizer(true, true));
  EXPECT_FALSE(defers_optimizer(true, false));
  EXPECT_FALSE(defers_optimizer(false, true));
}
