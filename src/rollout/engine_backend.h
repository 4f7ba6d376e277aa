// What one engine instance runs on: the model's ops, paged attention and the row sampler
// of its backend, and on CUDA the replay of captured step graphs.
//
// Decode steps are hundreds of small kernels; on CUDA their launch cost alone would
// exceed the work, so each decode batch size (a "bucket": the engine pads a step to the
// next one) is captured once into a CUDA graph and replayed. The graphs hold raw device
// addresses of the weights, the KV cache and the step scratch: they stay valid across
// offload/onload because the memory pool maps pages back at the same addresses, so they
// are never re-captured (tests/gpu_engine.cpp checks it).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "model/config.h"
#include "model/ops.h"
#include "rollout/engine_forward.h"
#include "rollout/paged_attention.h"
#include "rollout/row_sampler.h"
#include "tensor/memory_pool.h"

namespace tandem {

class EngineBackend {
 public:
  virtual ~EngineBackend() = default;
  virtual Ops& ops() = 0;
  virtual PagedAttention& attention() = 0;
  virtual RowSampler& sampler() = 0;

  // Whether run() replays graphs (then the engine pads decode steps to buckets).
  virtual bool replays_graphs() const = 0;
  // Runs one step's device work. With a key, the first call captures `work` into a graph
  // and later calls with that key replay it: `work` must then touch the same addresses
  // with the same shapes every time, only the memory's contents may change.
  virtual void run(std::optional<int64_t> graph_key, const std::function<void()>& work) = 0;
  virtual int64_t graphs_captured() const = 0;
  // Seconds the first steps of the captured sizes took on the host: the eager run (and the
  // lazy set-up it does), the capture and the instantiation. What a size's first use
  // costs a rollout beyond a replay.
  virtual double graph_setup_seconds() const = 0;
};

// The backend of `pool`'s device. Scratch that the step's kernels need (split-K partials,
// sampler staging) is allocated from the pool under tags::kv_cache for `capacity`.
std::unique_ptr<EngineBackend> make_engine_backend(MemoryPool& pool, const ModelConfig& config,
                                                   const StepCapacity& capacity, const std::string& name);

}  // namespace tandem
