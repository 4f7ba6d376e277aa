#include "driver/colocated_memory.h"

#include <stdexcept>

#include "sync/alias_transport.h"
#include "sync/copy_transport.h"
#include "tensor/device_copy.h"

namespace tandem {

ColocatedMemory::ColocatedMemory(MemoryPool& pool, const ParameterLayout& layout,
                                 const ColocatedMemorySettings& settings)
    : pool_(pool),
      layout_(layout),
      shard_(settings.shard.bounds.empty() ? SlabShards::whole(layout) : settings.shard),
      working_dtype_(settings.working_dtype),
      optimizer_state_(settings.optimizer_state) {
  const bool alias = settings.transport == TransportKind::Alias;
  if (shard_.ranks() > 1 && !alias)
    throw std::invalid_argument("ColocatedMemory: a sharded optimizer needs the alias transport");
  const size_t shard_bytes = static_cast<size_t>(shard_.elements()) * sizeof(float);
  master_ = pool.allocate(tags::master_weights, shard_bytes, "trainer.master_weights");
  if (!optimizer_state_) {
    exp_avg_ = pool.allocate(tags::optimizer, shard_bytes, "trainer.adamw.exp_avg");
    exp_avg_sq_ = pool.allocate(tags::optimizer, shard_bytes, "trainer.adamw.exp_avg_sq");
  } else {  // state on host or disk is not the pool's: no handoff moves it
    state_slot_elements_ = settings.state_slot_bytes / sizeof(float);
    staging_ = pool.allocate(tags::optimizer, 2 * state_slot_elements_ * sizeof(float), "trainer.optimizer.staging");
  }
  grads_ = pool.allocate(tags::grads, layout.slab_bytes(DType::F32), "trainer.grads");
  working_ = pool.allocate(alias ? tags::weights : tags::derived, layout.slab_bytes(working_dtype_),
                           alias ? "shared.working_weights" : "trainer.working_weights");
  if (alias)
    transport_ = std::make_unique<AliasTransport>(working());
  else if (settings.transport == TransportKind::Copy)
    transport_ = std::make_unique<CopyTransport>(pool, layout, master_, working_dtype_);
  else if (settings.transport == TransportKind::DiskDelta)
    transport_ = std::make_unique<DiskDeltaTransport>(pool, layout, master_, working_dtype_, settings.disk_delta);
  else {
    const Tensor source = working();
    transport_ = std::make_unique<BroadcastTransport>(pool, layout, working_dtype_, settings.broadcast, &source);
  }
}

ColocatedMemory::~ColocatedMemory() {
  transport_.reset();
  for (Allocation* allocation : {master_, exp_avg_, exp_avg_sq_, grads_, working_, staging_})
    if (allocation) pool_.release(allocation);
}

Tensor ColocatedMemory::flat(const Allocation* allocation, DType dtype, int64_t elements) const {
  return Tensor::view(allocation->ptr, dtype, pool_.device(), {elements});
}

Tensor ColocatedMemory::state_slab(int index) const {
  return Tensor::view(optimizer_state_ + index * shard_.elements(), DType::F32, Device::CPU, {shard_.elements()});
}

void ColocatedMemory::rebuild(const std::vector<std::string>& names) {
  for (const std::string& name : names)
    if (name == working_->name) rebuild_working();
}

void ColocatedMemory::rebuild_working() { convert_f32(working(), master()); }

void ColocatedMemory::load_weights(const std::vector<float>& weights) {
  copy_host_to_tensor(master(), weights.data() + shard_.begin());
  // Sharded, the master weights are a part only: the working copy is rounded from the host values.
  if (shard_.ranks() > 1)
    copy_floats_to_tensor(working(), weights);
  else
    rebuild_working();
}

}  // namespace tandem
