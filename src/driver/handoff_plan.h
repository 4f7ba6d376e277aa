// Colocation handoff as data: at each point of the RL step, the ordered list of memory
// actions that hands the GPU from the rollout engine to the trainer and back. One
// executor runs any plan on the tagged pool, so the plans are testable on the CPU with
// memory accounting alone.
//
//   mode cpu: each side offloads before the other onloads (host RAM briefly holds the
//             engine's weight copy and the trainer's state; the GPU never holds both).
//   mode gpu: the overlap moves onto the GPU (after generate: offload_kv -> trainer
//             onload -> offload_weights; before sync: clear_memory -> onload_weights ->
//             offload trainer); at start-up only the KV cache is offloaded.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "tensor/memory_pool.h"

namespace tandem {

enum class HandoffAction {
  OffloadKv,         // engine: drop KV cache and graph memory (contents are per rollout)
  OnloadKv,          // engine: map them back
  OffloadWeights,    // engine: weight copy to pinned host (only if `weight` is in the level)
  OnloadWeights,     // engine: weight copy back (only if `weight` is in the level)
  OffloadTrain,      // trainer: master weights + optimizer to host; grads, activations and
                     // derived copies dropped (rebuilt, never copied)
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
};

// The plan for one point of the step, as written in the design; actions that the
// config turns off are kept in the list and skipped by the executor, so the plan reads
// the same for every config.
std::vector<HandoffAction> handoff_plan(PeakDevice mode, HandoffPoint point);

// Peak bytes seen while one point's plan ran.
struct HandoffReport {
  HandoffPoint point{};
  std::vector<std::string> executed;  // actions that did something
  size_t device_peak = 0, host_peak = 0;
  size_t bytes_moved = 0;
  double seconds = 0;
};

class HandoffExecutor {
 public:
  using Callback = std::function<void()>;
  using RebuildCallback = std::function<void(const std::vector<std::string>& names)>;

  // Throws std::invalid_argument for configs the design forbids (gpu mode needs both
  // offload flags).
  HandoffExecutor(MemoryPool& pool, HandoffConfig config, Callback sync_weights, RebuildCallback rebuild);

  HandoffReport run(HandoffPoint point);
  // True once the engine's weights have been offloaded at least once.
  bool weights_ever_offloaded() const { return weights_ever_offloaded_; }

 private:
  bool execute(HandoffAction action, HandoffReport& report);

  MemoryPool& pool_;
  HandoffConfig config_;
  Callback sync_weights_;
  RebuildCallback rebuild_;
  bool weights_ever_offloaded_ = false;
};

}  // namespace tandem
