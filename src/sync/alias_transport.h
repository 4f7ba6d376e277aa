// The zero-copy transport of a colocated rank: the engine reads the trainer's working
// copy (the slab the optimizer step rewrites), so there is one copy of the weights in the
// compute dtype and a sync has nothing to move. The handoff treats that slab as the
// engine's weights (tag weights) that the trainer also reads: it stays on the device
// while either side runs.
#pragma once
#include "sync/weight_transport.h"

namespace tandem {

class AliasTransport final : public WeightTransport {
 public:
  explicit AliasTransport(const Tensor& working) : working_(working) {}
  TransportKind kind() const override { return TransportKind::Alias; }
  Tensor engine_weights() const override { return working_; }
  SyncReport sync() override { return {}; }

 private:
  Tensor working_;
};

}  // namespace tandem
