// The converting transport of a colocated rank: the engine owns a weight slab in the
// compute dtype (tag weights) that each sync rewrites from the trainer's FP32 master
// weights on the device. In cpu peak mode the trainer is asleep during the sync, so the
// master weights are read from their pinned host copy, over the bus.
#pragma once
#include "model/parameters.h"
#include "sync/weight_transport.h"
#include "tensor/memory_pool.h"

namespace tandem {

class CopyTransport final : public WeightTransport {
 public:
  CopyTransport(MemoryPool& pool, const ParameterLayout& layout, const Allocation* master, DType dtype);
  ~CopyTransport() override;
  CopyTransport(const CopyTransport&) = delete;
  CopyTransport& operator=(const CopyTransport&) = delete;

  TransportKind kind() const override { return TransportKind::Copy; }
  Tensor engine_weights() const override;
  SyncReport sync() override;

 private:
  MemoryPool& pool_;
  const ParameterLayout& layout_;
  const Allocation* master_;
  DType dtype_;
  Allocation* weights_ = nullptr;
};

}  // namespace tandem
