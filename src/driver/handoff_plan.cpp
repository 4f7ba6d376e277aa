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

namespace {
bool engine_kv_moves(const HandoffConfig& config) { return config.offload_rollout && config.level_kv_cache; }
bool engine_weights_move(const HandoffConfig& config) {
  return config.offload_rollout && config.level_weight && !config.weights_shared;
}
}  // namespace

std::vector<Tag> deferred_at_startup(const HandoffConfig& config, bool fresh_start) {
  std::vector<Tag> deferred = {tags::grads, tags::activations};
  if (engine_kv_moves(config)) deferred.push_back(tags::kv_cache);
  if (config.peak_device == PeakDevice::Cpu && engine_weights_move(config)) deferred.push_back(tags::weights);
  if (fresh_start && config.offload_train) deferred.push_back(tags::optimizer);
  return deferred;
}

std::vector<TagOperation> handoff_operations(HandoffAction action, const HandoffConfig& config) {
  using M = TagMove;
  switch (action) {
    case HandoffAction::OffloadKv:
      if (!engine_kv_moves(config)) return {};
      return {{M::Drop, tags::kv_cache}};
    case HandoffAction::OnloadKv:
      if (!engine_kv_moves(config)) return {};
      return {{M::Onload, tags::kv_cache}};
    case HandoffAction::OffloadWeights:
      if (!engine_weights_move(config)) return {};
      return {{M::Offload, tags::weights}};
    case HandoffAction::OnloadWeights:
      if (!engine_weights_move(config)) return {};
      return {{M::Onload, tags::weights}};
    case HandoffAction::OffloadTrain:
      if (!config.offload_train) return handoff_operations(HandoffAction::ClearTrainMemory, config);
      // Derived copies go first: dropping them before the copy keeps them off the host.
      return {{M::Drop, tags::derived},
              {M::Drop, tags::activations},
              {M::Drop, tags::grads},
              {M::Offload, tags::master_weights},
              {config.optimizer_off_device ? M::Drop : M::Offload, tags::optimizer},
              {M::Offload, tags::reference}};
    case HandoffAction::OnloadTrain:
      // Also after a plain clear_memory (offload-train off): grads and activations come back.
      return {{M::Onload, tags::master_weights}, {M::Onload, tags::optimizer}, {M::Onload, tags::reference},
              {M::Onload, tags::grads},          {M::Onload, tags::activations}, {M::Onload, tags::derived}};
    case HandoffAction::ClearTrainMemory:
      return {{M::Drop, tags::activations}, {M::Drop, tags::grads}};
    case HandoffAction::SyncWeights: return {};
  }
  return {};
}

HandoffExecutor::HandoffExecutor(MemoryPool& pool, HandoffConfig config, SyncCallback sync_weights,
                                 RebuildCallback rebuild)
    : pool_(pool), config_(config), sync_weights_(std::move(sync_weights)), rebuild_(std::move(rebuild)) {
  if (config_.peak_device == PeakDevice::Gpu && !(config_.offload_train && config_.offload_rollout))
    throw std::invalid_argument("colocate-memory-peak-device = gpu requires offload-train and offload-rollout");
}

HandoffReport HandoffExecutor::run(HandoffPoint point) {
  HandoffReport report;
  report.point = point;
  const auto start = std::chrono::steady_clock::now();
  PhaseMemory memory(pool_);
  memory.begin();
  for (HandoffAction action : handoff_plan(config_.peak_device, point)) {
    if (execute(action, report)) report.executed.push_back(handoff_action_name(action));
    memory.sample();
  }
  report.peak = memory.end();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

bool HandoffExecutor::execute(HandoffAction action, HandoffReport& report) {
  if (action == HandoffAction::SyncWeights) {
    if (sync_weights_) report.sync = sync_weights_();
    return true;
  }
  size_t touched = 0;
  for (const TagOperation& operation : handoff_operations(action, config_)) {
    TransferReport transfer;
    switch (operation.move) {
      case TagMove::Drop: transfer = pool_.drop(operation.tag); break;
      case TagMove::Offload: transfer = pool_.offload(operation.tag); break;
      case TagMove::Onload: transfer = pool_.onload(operation.tag); break;
    }
    report.bytes_moved += transfer.bytes;
    if (operation.move == TagMove::Drop && operation.tag == tags::derived) report.derived_not_copied += transfer.device_bytes;
    touched += transfer.allocations;
    if (action == HandoffAction::OffloadWeights && transfer.allocations) weights_ever_offloaded_ = true;
    if (!transfer.rebuild.empty() && rebuild_) rebuild_(transfer.rebuild);
  }
  return touched > 0;
}

}  // namespace tandem
