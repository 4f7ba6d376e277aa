// The memory of one colocated rank, laid out by the model's parameter layout and tagged
// so the handoff plans can move it: the trainer's FP32 master weights, AdamW moments and
// gradients, its working copy in the compute dtype, and the rollout engine's weights
// through the weight transport. With the alias transport the working copy is the
// engine's weights (tag weights: one copy, read by both sides); with copy it is derived
// (rebuilt from the master weights rather than copied) and the engine has its own.
// Under ZeRO-1 the master weights and the optimizer state are this rank's shard only.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/parameters.h"
#include "sync/broadcast_transport.h"
#include "sync/disk_delta_transport.h"
#include "sync/weight_transport.h"
#include "tensor/memory_pool.h"
#include "train/optimizer_shards.h"

namespace tandem {

struct ColocatedMemorySettings {
  DType working_dtype = DType::F32;
  TransportKind transport = TransportKind::Alias;
  // When not null, 2 slabs of FP32 (of the shard's elements each) in host memory outside
  // the pool (pinned memory or an optimizer state file) that hold exp_avg and exp_avg_sq
  // instead of pool allocations; the trainer streams them through two staging slots of
  // state_slot_bytes, the only state on the device (tag optimizer: transient, dropped
  // rather than offloaded).
  float* optimizer_state = nullptr;
  size_t state_slot_bytes = 0;
  // The disk-delta transport's only (collective over disk_delta.comm).
  DiskDeltaSettings disk_delta;
  // The broadcast transport of a trainer rank (the engines are on rollout ranks).
  BroadcastSettings broadcast;
  // ZeRO-1: the part of the master weights and optimizer state this rank holds (with the
  // alias transport only: the working copy is then the one whole-slab copy of the
  // weights). Empty bounds: the whole slab.
  SlabShards shard;
};

class ColocatedMemory {
 public:
  ColocatedMemory(MemoryPool& pool, const ParameterLayout& layout, const ColocatedMemorySettings& settings);
  ~ColocatedMemory();
  ColocatedMemory(const ColocatedMemory&) = delete;
  ColocatedMemory& operator=(const ColocatedMemory&) = delete;

  // Rebuilds the allocations the pool names (dropped, now onloaded) that derive from the
  // master weights: the working copy.
  void rebuild(const std::vector<std::string>& names);
  // The master weights (this rank's shard of `weights`, a whole slab of FP32 values) and
  // the working copy (all of them).
  void load_weights(const std::vector<float>& weights);
  // Trainer -> engine, in process.
  SyncReport sync_weights() { return transport_->sync(); }
  TransportKind transport() const { return transport_->kind(); }

  // Flat views over the whole slabs (master and state: over the rank's shard).
  Tensor master() const { return flat(master_, DType::F32, shard_.elements()); }
  Tensor grads() const { return flat(grads_, DType::F32, layout_.slab_elements()); }
  Tensor exp_avg() const { return optimizer_state_ ? state_slab(0) : flat(exp_avg_, DType::F32, shard_.elements()); }
  Tensor exp_avg_sq() const {
    return optimizer_state_ ? state_slab(1) : flat(exp_avg_sq_, DType::F32, shard_.elements());
  }
  Tensor working() const { return flat(working_, working_dtype_, layout_.slab_elements()); }
  // The staging slots of a state off the device (null otherwise), and each slot's values.
  float* state_staging() const { return staging_ ? static_cast<float*>(staging_->ptr) : nullptr; }
  size_t state_slot_elements() const { return state_slot_elements_; }
  Tensor engine_weights() const { return transport_->engine_weights(); }
  const ParameterLayout& layout() const { return layout_; }
  const SlabShards& shard() const { return shard_; }

 private:
  Tensor flat(const Allocation* allocation, DType dtype, int64_t elements) const;
  void rebuild_working();  // from the master weights (unsharded only)
  Tensor state_slab(int index) const;

  MemoryPool& pool_;
  const ParameterLayout& layout_;
  SlabShards shard_;
  DType working_dtype_;
  Allocation* master_ = nullptr;
  Allocation* grads_ = nullptr;
  Allocation* exp_avg_ = nullptr;
  Allocation* exp_avg_sq_ = nullptr;
  Allocation* working_ = nullptr;
  Allocation* staging_ = nullptr;
  size_t state_slot_elements_ = 0;
  std::unique_ptr<WeightTransport> transport_;
  float* optimizer_state_ = nullptr;
};

}  // namespace tandem
