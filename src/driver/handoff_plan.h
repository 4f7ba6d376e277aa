// Colocation handoff as data: at each point of the RL step, the ordered list of memory
// actions that hands the GPU from the rollout engine to the trainer and back. One
// executor runs any plan on the tagged pool, so the plans are testable on the CPU with
// memory accounting alone.
//
//   mode cpu: each side offloads before the other onloads (host RAM briefly holds the
//             engine's weight copy and the trainer's state; the GPU never holds both,
//             start-up included: the engine's buffers start unmapped).
//   mode gpu: the overlap moves onto the GPU (after generate: offload_kv -> trainer
//             onload -> offload_weights; before sync: clear_memory -> onload_weights ->
//             offload trainer), so the host holds one side at a time and the pinned
//             buffers of one serve the other; at start-up only the KV cache is offloaded.
//
// With the alias weight transport the engine's weights are the trainer's working copy:
// both sides read them, so offload_weights and onload_weights leave them on the device
// (there is no second copy to move, in either mode).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "driver/phase_memory.h"
#include "sync/weight_transport.h"
#include "tensor/memory_pool.h"

namespace tandem {

enum class HandoffAction {
  OffloadKv,         // engine: drop the KV cache and step scratch (contents are per rollout)
  OnloadKv,          // engine: map them back
  OffloadWeights,    // engine: weight copy to pinned host (only if `weight` is in the level)
  OnloadWeights,     // engine: weight copy back (only if `weight` is in the level)
  OffloadTrain,      // trainer: master weights, optimizer and KL reference to host; grads,
                     // activations and derived copies dropped (rebuilt, never copied), and
                     // the optimizer's staging when its state lives on host or disk
  OnloadTrain,       // trainer: back on the device; derived copies rebuilt
  ClearTrainMemory,  // trainer: drop transient grads and activations, keep the state
  SyncWeights,       // trainer -> engine weight transfer
};
const char* handoff_action_name(HandoffAction action);

enum class HandoffPoint { Startup, AfterGenerate, BeforeSync };
const char* handoff_point_name(HandoffPoint point);

enum class PeakDevice { Cpu, Gpu };

struct HandoffConfig {
  bool offload_train = true;
  bool offload_rollout = true;
  bool level_kv_cache = true;
  bool level_weight = true;
  PeakDevice peak_device = PeakDevice::Cpu;
  bool weights_shared = false;  // the alias transport: the engine reads the trainer's working copy
  // optimizer.state = host | disk: the state lives off the device, and what the pool holds
  // under the optimizer tag is the staging it streams through (transient): offload_train
  // drops it instead of copying it.
  bool optimizer_off_device = false;
};

// The plan for one point of the step, as written in the design; actions that the
// config turns off are kept in the list and skipped by the executor, so the plan reads
// the same for every config.
std::vector<HandoffAction> handoff_plan(PeakDevice mode, HandoffPoint point);

// The tags whose buffers the job creates unmapped (MemoryPool::set_deferred), because the
// first handoffs (start-up, then before-sync) would give them up anyway: the device then
// never holds more at start-up than in the step. Transient trainer memory always; in cpu
// peak mode the engine's weight copy; the KV cache whenever the rollout offloads it; and
// on a fresh start with offload-train, the optimizer's state, which starts as zeros: the
// first onload maps it zeroed, so start-up does not copy those zeros to the host, nor the
// first step back.
std::vector<Tag> deferred_at_startup(const HandoffConfig& config, bool fresh_start);

// What an action does to the pool, in order, under the config: empty where the config
// turns the action off (and for SyncWeights, which is no pool operation). The executor
// runs these on the pool and the memory plan on its ledger, so both read the same.
enum class TagMove { Drop, Offload, Onload };
struct TagOperation {
  TagMove move;
  Tag tag;
};
std::vector<TagOperation> handoff_operations(HandoffAction action, const HandoffConfig& config);

// What one point's plan did.
struct HandoffReport {
  HandoffPoint point{};
  std::vector<std::string> executed;  // actions that did something
  PhasePeak peak;                     // while the plan ran
  size_t bytes_moved = 0;             // between device and host, the weight sync excluded
  size_t derived_not_copied = 0;      // bytes of derived copies dropped instead of offloaded
  SyncReport sync;                    // the weight sync, when the plan has one
  double seconds = 0;
};

class HandoffExecutor {
 public:
  using SyncCallback = std::function<SyncReport()>;
  using RebuildCallback = std::function<void(const std::vector<std::string>& names)>;

  // Throws std::invalid_argument for configs the design forbids (gpu mode needs both
  // offload flags).
  HandoffExecutor(MemoryPool& pool, HandoffConfig config, SyncCallback sync_weights, RebuildCallback rebuild);

  HandoffReport run(HandoffPoint point);
  // True once the engine's weights have been offloaded at least once.
  bool weights_ever_offloaded() const { return weights_ever_offloaded_; }

 private:
  bool execute(HandoffAction action, HandoffReport& report);

  MemoryPool& pool_;
  HandoffConfig config_;
  SyncCallback sync_weights_;
  RebuildCallback rebuild_;
  bool weights_ever_offloaded_ = false;
};

}  // namespace tandem
