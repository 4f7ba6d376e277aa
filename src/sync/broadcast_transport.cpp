#include "sync/broadcast_transport.h"

#include <algorithm>
#include <chrono>

namespace tandem {

BroadcastTransport::BroadcastTransport(MemoryPool& pool, const ParameterLayout& layout, DType dtype,
                                       const BroadcastSettings& settings, const Tensor* source)
    : pool_(pool), layout_(layout), dtype_(dtype), settings_(settings) {
  if (source)
    source_ = *source;
  else
    weights_ = pool.allocate(tags::weights, layout.slab_bytes(dtype), "engine.weights");
}

BroadcastTransport::~BroadcastTransport() {
  if (weights_) pool_.release(weights_);
}

Tensor BroadcastTransport::engine_weights() const {
  if (!weights_) return source_;
  return Tensor::view(weights_->ptr, dtype_, pool_.device(), {layout_.slab_elements()});
}

SyncReport BroadcastTransport::sync() {
  SyncReport report;
  if (!settings_.link) return report;
  const auto start = std::chrono::steady_clock::now();
  const Tensor slab = engine_weights();
  auto* bytes = static_cast<char*>(slab.data);
  const size_t total = layout_.slab_bytes(dtype_);
  for (size_t offset = 0; offset < total; offset += settings_.bucket_bytes)
    settings_.link->broadcast(bytes + offset, std::min(settings_.bucket_bytes, total - offset), 0);
  settings_.link->synchronize();
  report.bytes = total;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace tandem
