#include "driver/colocated_memory.h"

#include <random>

#include "tensor/device_copy.h"

namespace tandem {

ColocatedMemory::ColocatedMemory(MemoryPool& pool, const ParameterLayout& layout, DType working_dtype,
                                 size_t kv_cache_bytes, float* optimizer_state)
    : pool_(pool), layout_(layout), working_dtype_(working_dtype), optimizer_state_(optimizer_state) {
  master_ = pool.allocate(tags::master_weights, layout.slab_bytes(DType::F32), "trainer.master_weights");
  if (!optimizer_state) {  // state on disk is not the pool's: no handoff moves it
    exp_avg_ = pool.allocate(tags::optimizer, layout.slab_bytes(DType::F32), "trainer.adamw.exp_avg");
    exp_avg_sq_ = pool.allocate(tags::optimizer, layout.slab_bytes(DType::F32), "trainer.adamw.exp_avg_sq");
  }
  grads_ = pool.allocate(tags::grads, layout.slab_bytes(DType::F32), "trainer.grads");
  working_ = pool.allocate(tags::derived, layout.slab_bytes(working_dtype), "trainer.working_weights");
  engine_weights_ = pool.allocate(tags::weights, layout.slab_bytes(working_dtype), "engine.weights");
  if (kv_cache_bytes) kv_cache_ = pool.allocate(tags::kv_cache, kv_cache_bytes, "engine.kv_cache");
}

ColocatedMemory::~ColocatedMemory() {
  for (Allocation* allocation : {master_, exp_avg_, exp_avg_sq_, grads_, working_, engine_weights_, kv_cache_})
    if (allocation) pool_.release(allocation);
}

Tensor ColocatedMemory::flat(const Allocation* allocation, DType dtype) const {
  return Tensor::view(allocation->ptr, dtype, pool_.device(), {layout_.slab_elements()});
}

Tensor ColocatedMemory::state_slab(int index) const {
  return Tensor::view(optimizer_state_ + index * layout_.slab_elements(), DType::F32, Device::CPU,
                      {layout_.slab_elements()});
}

std::vector<float> ColocatedMemory::initial_weights(const ParameterLayout& layout, uint64_t seed) {
  std::vector<float> host(static_cast<size_t>(layout.slab_elements()), 0.0f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const ParameterInfo& info : layout.tensors()) {
    float* values = host.data() + info.offset;
    const bool is_norm = info.name.find("norm.weight") != std::string::npos;
    const bool is_bias = info.name.size() > 5 && info.name.compare(info.name.size() - 5, 5, ".bias") == 0;
    for (int64_t i = 0; i < info.numel(); ++i) values[i] = is_norm ? 1.0f : is_bias ? 0.0f : normal(rng);
  }
  return host;
}

void ColocatedMemory::rebuild(const std::vector<std::string>& names) {
  for (const std::string& name : names)
    if (name == working_->name) convert_f32(working(), master());
}

void ColocatedMemory::sync_weights() {
  // In cpu peak mode the trainer sleeps during the sync: read its offloaded host copy.
  const Tensor source = Tensor::view(const_cast<void*>(pool_.readable_data(master_)), DType::F32, pool_.device(),
                                     {layout_.slab_elements()});
  convert_f32(engine_weights(), source);
}

}  // namespace tandem
