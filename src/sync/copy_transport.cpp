#include "sync/copy_transport.h"

#include <chrono>

#include "tensor/device_copy.h"

namespace tandem {

CopyTransport::CopyTransport(MemoryPool& pool, const ParameterLayout& layout, const Allocation* master, DType dtype)
    : pool_(pool), layout_(layout), master_(master), dtype_(dtype) {
  weights_ = pool.allocate(tags::weights, layout.slab_bytes(dtype), "engine.weights");
}

CopyTransport::~CopyTransport() { pool_.release(weights_); }

Tensor CopyTransport::engine_weights() const {
  return Tensor::view(weights_->ptr, dtype_, pool_.device(), {layout_.slab_elements()});
}

SyncReport CopyTransport::sync() {
  const auto start = std::chrono::steady_clock::now();
  const Tensor source = Tensor::view(const_cast<void*>(pool_.readable_data(master_)), DType::F32, pool_.device(),
                                     {layout_.slab_elements()});
  convert_f32(engine_weights(), source);
  SyncReport report;
  report.bytes = layout_.slab_bytes(DType::F32) + layout_.slab_bytes(dtype_);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace tandem
