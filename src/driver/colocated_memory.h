// The memory of one colocated rank, laid out by the model's parameter layout and tagged
// so the handoff plans can move it: the trainer's FP32 master weights, AdamW moments and
// gradients, its working copy in the compute dtype (derived: rebuilt from the master
// weights rather than copied), and the rollout engine's weight copy and KV cache.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/parameters.h"
#include "tensor/memory_pool.h"

namespace tandem {

class ColocatedMemory {
 public:
  // optimizer_state: when not null, 2 slabs of FP32 outside the pool (an optimizer state
  // file) that hold exp_avg and exp_avg_sq instead of pool allocations.
  ColocatedMemory(MemoryPool& pool, const ParameterLayout& layout, DType working_dtype, size_t kv_cache_bytes,
                  float* optimizer_state = nullptr);
  ~ColocatedMemory();
  ColocatedMemory(const ColocatedMemory&) = delete;
  ColocatedMemory& operator=(const ColocatedMemory&) = delete;

  // The random policy of a run from scratch, deterministic from the seed (the same on
  // every rank, as data-parallel replicas must be): N(0, 0.02) matrices and embeddings,
  // ones for norm gains, zeros for biases.
  static std::vector<float> initial_weights(const ParameterLayout& layout, uint64_t seed);
  // Rebuilds the derived allocations the pool names after an onload.
  void rebuild(const std::vector<std::string>& names);
  // Trainer -> engine, in process: the engine's copy is rewritten from the master weights.
  void sync_weights();

  // Flat views over the whole slabs.
  Tensor master() const { return flat(master_, DType::F32); }
  Tensor grads() const { return flat(grads_, DType::F32); }
  Tensor exp_avg() const { return optimizer_state_ ? state_slab(0) : flat(exp_avg_, DType::F32); }
  Tensor exp_avg_sq() const { return optimizer_state_ ? state_slab(1) : flat(exp_avg_sq_, DType::F32); }
  Tensor working() const { return flat(working_, working_dtype_); }
  Tensor engine_weights() const { return flat(engine_weights_, working_dtype_); }
  const ParameterLayout& layout() const { return layout_; }

 private:
  Tensor flat(const Allocation* allocation, DType dtype) const;
  Tensor state_slab(int index) const;

  MemoryPool& pool_;
  const ParameterLayout& layout_;
  DType working_dtype_;
  Allocation* master_ = nullptr;
  Allocation* grads_ = nullptr;
  Allocation* exp_avg_ = nullptr;
  Allocation* exp_avg_sq_ = nullptr;
  Allocation* working_ = nullptr;
  Allocation* engine_weights_ = nullptr;
  Allocation* kv_cache_ = nullptr;
  float* optimizer_state_ = nullptr;
};

}  // namespace tandem
