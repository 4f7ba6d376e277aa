// How the trainer's weights reach the rollout engine after an update. One transport per
// file in src/sync/; colocated ranks pick alias or copy (sync.transport), and transports
// between ranks or machines (broadcast, disk deltas) implement the same interface.
//
//   alias: the engine reads the trainer's working copy itself; a sync moves nothing.
//   copy:  the engine has its own copy, rewritten from the FP32 master weights.
//   disk-delta: compressed, checksummed deltas through a shared folder (disk_delta_transport.h).
//   broadcast: trainer rank 0 to the engines of rollout ranks, in buckets (broadcast_transport.h).
#pragma once
#include <cstddef>
#include <string>

#include "tensor/tensor.h"

namespace tandem {

enum class TransportKind { Alias, Copy, DiskDelta, Broadcast };
TransportKind transport_kind_from_name(const std::string& name);  // "alias" | "copy" | "disk-delta" | "broadcast"
const char* transport_kind_name(TransportKind kind);

// What one sync did.
struct SyncReport {
  size_t bytes = 0;  // bytes read or written to bring the engine up to date
  double seconds = 0;
  // Through files (disk-delta); zero for the in-process transports.
  size_t wire_bytes = 0;  // the published version's files, all source ranks together
  double density = 0;     // the fraction of the weights' bytes that changed against the baseline
  double source_seconds = 0, engine_seconds = 0;  // encode + compress + write; read + decode + verify + apply
};

class WeightTransport {
 public:
  virtual ~WeightTransport() = default;
  virtual TransportKind kind() const = 0;
  // The flat slab of weights the engine reads: its address is fixed for the transport's
  // lifetime (the engine binds its parameter views and CUDA graphs to it).
  virtual Tensor engine_weights() const = 0;
  // Brings engine_weights() up to the trainer's latest update; complete on return.
  virtual SyncReport sync() = 0;
};

}  // namespace tandem
