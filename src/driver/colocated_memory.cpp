#include "driver/colocated_memory.h"

#include <random>

#include "sync/alias_transport.h"
#include "sync/copy_transport.h"
#include "tensor/device_copy.h"

namespace tandem {

ColocatedMemory::ColocatedMemory(MemoryPool& pool, const ParameterLayout& layout, DType working_dtype,
                                 TransportKind transport, float* optimizer_state, size_t state_slot_bytes,
                                 const DiskDeltaSettings& disk_delta, MPI_Comm comm, const BroadcastSettings& broadcast)
    : pool_(pool), layout_(layout), working_dtype_(working_dtype), optimizer_state_(optimizer_state) {
  const bool alias = transport == TransportKind::Alias;
  master_ = pool.allocate(tags::master_weights, layout.slab_bytes(DType::F32), "trainer.master_weights");
  if (!optimizer_state) {
    exp_avg_ = pool.allocate(tags::optimizer, layout.slab_bytes(DType::F32), "trainer.adamw.exp_avg");
    exp_avg_sq_ = pool.allocate(tags::optimizer, layout.slab_bytes(DType::F32), "trainer.adamw.exp_avg_sq");
  } else {  // state on host or disk is not the pool's: no handoff moves it
    state_slot_elements_ = state_slot_bytes / sizeof(float);
    staging_ = pool.allocate(tags::optimizer, 2 * state_slot_elements_ * sizeof(float), "trainer.optimizer.staging");
  }
  grads_ = pool.allocate(tags::grads, layout.slab_bytes(DType::F32), "trainer.grads");
  working_ = pool.allocate(alias ? tags::weights : tags::derived, layout.slab_bytes(working_dtype),
                           alias ? "shared.working_weights" : "trainer.working_weights");
  if (alias)
    transport_ = std::make_unique<AliasTransport>(working());
  else if (transport == TransportKind::Copy)
    transport_ = std::make_unique<CopyTransport>(pool, layout, master_, working_dtype);
  else if (transport == TransportKind::DiskDelta)
    transport_ = std::make_unique<DiskDeltaTransport>(pool, layout, master_, working_dtype, disk_delta, comm);
  else {
    const Tensor source = working();
    transport_ = std::make_unique<BroadcastTransport>(pool, layout, working_dtype, broadcast, &source);
  }
}

ColocatedMemory::~ColocatedMemory() {
  transport_.reset();
  for (Allocation* allocation : {master_, exp_avg_, exp_avg_sq_, grads_, working_, staging_})
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
    if (name == working_->name) rebuild_working();
}

void ColocatedMemory::rebuild_working() { convert_f32(working(), master()); }

}  // namespace tandem
