#include "driver/handoff_plan.h"

#include <chrono>
#include <stdexcept>

namespace tandem {

const char* handoff_action_name(HandoffAction action) {
  switch (action) {
    case HandoffAction::OffloadKv: return "offload_kv";
    case HandoffAction::OnloadKv: return "onload_kv";
    case HandoffAction::OffloadWeights: return "offload_weights";
    case HandoffAction::OnloadWeights: return "onload_weights";
    case HandoffAction::OffloadTrain: return "offload_train";
    case HandoffAction::OnloadTrain: return "onload_train";
    case HandoffAction::ClearTrainMemory: return "clear_train_memory";
    case HandoffAction::SyncWeights: return "sync_weights";
  }
  return "?";
}

const char* handoff_point_name(HandoffPoint point) {
  switch (point) {
    case HandoffPoint::Startup: return "startup";
    case HandoffPoint::AfterGenerate: return "after_generate";
    case HandoffPoint::BeforeSync: return "before_sync";
  }
  return "?";
}

std::vector<HandoffAction> handoff_plan(PeakDevice mode, HandoffPoint point) {
  using A = HandoffAction;
  if (mode == PeakDevice::Cpu) {
    switch (point) {
      case HandoffPoint::Startup: return {A::OffloadKv, A::OffloadWeights};
      case HandoffPoint::AfterGenerate: return {A::OffloadKv, A::OffloadWeights, A::OnloadTrain};
      case HandoffPoint::BeforeSync: return {A::OffloadTrain, A::OnloadWeights, A::SyncWeights, A::OnloadKv};
    }
  }
  switch (point) {
    case HandoffPoint::Startup: return {A::OffloadKv};
    case HandoffPoint::AfterGenerate: return {A::OffloadKv, A::OnloadTrain, A::OffloadWeights};
    case HandoffPoint::BeforeSync:
      return {A::ClearTrainMemory, A::OnloadWeights, A::OffloadTrain, A::SyncWeights, A::OnloadKv};
  }
  return {};
}

HandoffExecutor::HandoffExecutor(MemoryPool& pool, HandoffConfig config, Callback sync_weights, RebuildCallback rebuild)
    : pool_(pool), config_(config), sync_weights_(std::move(sync_weights)), rebuild_(std::move(rebuild)) {
  if (config_.peak_device == PeakDevice::Gpu && !(config_.offload_train && config_.offload_rollout))
    throw std::invalid_argument("colocate-memory-peak-device = gpu requires offload-train and offload-rollout");
}

HandoffReport HandoffExecutor::run(HandoffPoint point) {
  HandoffReport report;
  report.point = point;
  const auto start = std::chrono::steady_clock::now();
  pool_.reset_peaks();
  for (HandoffAction action : handoff_plan(config_.peak_device, point))
    if (execute(action, report)) report.executed.push_back(handoff_action_name(action));
  const MemoryStats stats = pool_.stats();
  report.device_peak = stats.device_peak;
  report.host_peak = stats.host_peak;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

bool HandoffExecutor::execute(HandoffAction action, HandoffReport& report) {
  size_t touched = 0;
  auto apply = [&](const TransferReport& transfer) {
    report.bytes_moved += transfer.bytes;
    touched += transfer.allocations;
    if (!transfer.rebuild.empty() && rebuild_) rebuild_(transfer.rebuild);
  };
  const bool engine_kv = config_.offload_rollout && config_.level_kv_cache;
  const bool engine_weights = config_.offload_rollout && config_.level_weight;
  switch (action) {
    case HandoffAction::OffloadKv:
      if (!engine_kv) return false;
      apply(pool_.drop(tags::kv_cache));
      apply(pool_.drop(tags::cuda_graph));
      break;
    case HandoffAction::OnloadKv:
      if (!engine_kv) return false;
      apply(pool_.onload(tags::kv_cache));
      apply(pool_.onload(tags::cuda_graph));
      break;
    case HandoffAction::OffloadWeights:
      if (!engine_weights) return false;
      apply(pool_.offload(tags::weights));
      weights_ever_offloaded_ = true;
      break;
    case HandoffAction::OnloadWeights:
      if (!engine_weights) return false;
      apply(pool_.onload(tags::weights));
      break;
    case HandoffAction::OffloadTrain:
      if (!config_.offload_train) return execute(HandoffAction::ClearTrainMemory, report);
      // Derived copies go first: dropping them before the copy keeps them off the host.
      apply(pool_.drop(tags::derived));
      apply(pool_.drop(tags::activations));
      apply(pool_.drop(tags::grads));
      apply(pool_.offload(tags::master_weights));
      apply(pool_.offload(tags::optimizer));
      break;
    case HandoffAction::OnloadTrain:
      // Also after a plain clear_memory (offload-train off): grads and activations come back.
      apply(pool_.onload(tags::master_weights));
      apply(pool_.onload(tags::optimizer));
      apply(pool_.onload(tags::grads));
      apply(pool_.onload(tags::activations));
      apply(pool_.onload(tags::derived));
      break;
    case HandoffAction::ClearTrainMemory:
      apply(pool_.drop(tags::activations));
      apply(pool_.drop(tags::grads));
      break;
    case HandoffAction::SyncWeights:
      if (sync_weights_) sync_weights_();
      return true;
  }
  return touched > 0;
}

}  // namespace tandem
