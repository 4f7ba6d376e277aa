// The transport to engines on rollout ranks: trainer rank 0 broadcasts its working copy
// (the weights in the working dtype, as the optimizer step left them) to every engine,
// in buckets of sync.bucket-bytes, over the link of roles.h: NCCL between GPUs, MPI on
// the CPU backend. The bytes arrive as they are, so the engines hold the trainer's
// working copy bit for bit. Trainer ranks other than 0 are not on the link: their sync
// does nothing.
#pragma once
#include <cstddef>

#include "model/parameters.h"
#include "sync/weight_transport.h"
#include "tensor/memory_pool.h"
#include "world/communicator.h"

namespace tandem {

struct BroadcastSettings {
  size_t bucket_bytes = size_t{512} << 20;
  Communicator* link = nullptr;  // trainer rank 0 (its root) and the engines; null elsewhere
};

class BroadcastTransport final : public WeightTransport {
 public:
  // On a trainer rank, `source` is its working copy (trainer rank 0 sends it); on a
  // rollout rank it is null, and the transport holds the engine's weights (tag weights).
  BroadcastTransport(MemoryPool& pool, const ParameterLayout& layout, DType dtype, const BroadcastSettings& settings,
                     const Tensor* source);
  ~BroadcastTransport() override;
  BroadcastTransport(const BroadcastTransport&) = delete;
  BroadcastTransport& operator=(const BroadcastTransport&) = delete;

  TransportKind kind() const override { return TransportKind::Broadcast; }
  // The engine's slab on a rollout rank; the working copy on a trainer rank.
  Tensor engine_weights() const override;
  // Collective over the link (trainer rank 0 and every engine).
  SyncReport sync() override;

 private:
  MemoryPool& pool_;
  const ParameterLayout& layout_;
  DType dtype_;
  BroadcastSettings settings_;
  Tensor source_;
  Allocation* weights_ = nullptr;  // a rollout rank's
};

}  // namespace tandem
