// The transport through a shared folder (sync.path) that every rank sees: each sync,
// the source ranks (the trainers) write their share of the model as compressed,
// checksummed deltas of the working-dtype bytes against the bytes the engines hold, rank
// 0 publishes the version with its index once every file is complete, and the engines
// read, decode, verify and apply every file. The format is in sync/delta_format.h.
//
// Who is who, over comm (every rank of the job): ranks [0, source_ranks) are the trainers
// and write, each the tensors dealt to it round-robin; the engines are every rank when
// colocated (each rank is both), else the rollout ranks [source_ranks, size).
//
// A rolling baseline: version 0 is the bytes the engines start from, the same on both
// sides (the run's initial weights, the seeded random model or model.path, in the
// working dtype; or, with sync.baseline, the HF safetensors folder both sides load), and
// version v is a delta against version v - 1. After each sync the sources and the engines
// both take the new bytes as the base of the next, so a version holds one sync's change,
// not the sum since the start. The first sync publishes nothing when the trainer's
// weights are the baseline's (a fresh run), and version 1 when they differ (a resumed
// run), which brings the engines to the trainer's weights. An engine applies the versions
// in order, and refuses one whose base is not the version it holds. Before anything is
// written each source rank validates its share of an HF baseline (dtype, shape, layout,
// presence).
//
// No rank throws on its own: every failure (a baseline error, a write error, a full disk,
// an engine's checksum mismatch or wrong base) is gathered over comm and every rank fails
// together with every failing rank's message. A version that fails while written is
// removed: nothing is ever half-published.
//
// Speed: a source rank rounds the FP32 master weights to the working dtype on the device
// (a staging buffer) and copies them once into pinned host memory; the tensors are
// encoded, compressed (in 4 MiB frames) and checksummed on every core; an engine decodes
// the frames and verifies its tensors on every core in place in the pinned host copy of
// the version it holds, and copies the slab to the device once. The parts' times are
// logged at debug level.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/parameters.h"
#include "sync/delta_format.h"
#include "sync/weight_transport.h"
#include "tensor/memory_pool.h"
#include "world/pinned_memory.h"

namespace tandem {

struct DiskDeltaSettings {
  std::filesystem::path path;      // the shared folder of the versions
  std::filesystem::path baseline;  // an HF folder both sides load; empty = the run's initial weights
  DeltaEncoding encoding = DeltaEncoding::Xor;
  int compression_level = 1;
  int keep_versions = 2;
  // The run's initial weights: FP32, the whole slab. Called once, by the first sync,
  // when `baseline` is empty.
  std::function<std::vector<float>()> initial_weights;
  MPI_Comm comm = MPI_COMM_SELF;  // every rank of the job
  int source_ranks = 1;           // comm's ranks [0, source_ranks) are the trainers
  bool engine = true;             // this rank holds an engine (colocated, or a rollout rank)
};

class DiskDeltaTransport final : public WeightTransport {
 public:
  // Collective over settings.comm: every rank constructs it and joins every sync. `master`
  // is a trainer's FP32 master weights, null on a rollout rank.
  DiskDeltaTransport(MemoryPool& pool, const ParameterLayout& layout, const Allocation* master, DType dtype,
                     DiskDeltaSettings settings);
  ~DiskDeltaTransport() override;
  DiskDeltaTransport(const DiskDeltaTransport&) = delete;
  DiskDeltaTransport& operator=(const DiskDeltaTransport&) = delete;

  TransportKind kind() const override { return TransportKind::DiskDelta; }
  // The engine's slab; a trainer rank with rollout ranks holds none (std::logic_error).
  Tensor engine_weights() const override;
  SyncReport sync() override;

  // The tensors a source rank writes: the layout's tensors dealt round-robin over them.
  bool owns(size_t tensor_index) const {
    return master_ && static_cast<int>(tensor_index % static_cast<size_t>(settings_.source_ranks)) == rank_;
  }

 private:
  void take_baseline();
  void round_owned_tensors();
  bool any_source_differs_from_baseline();
  SyncReport publish_and_apply(double round_seconds);
  DeltaApplyStats apply_version(const std::filesystem::path& folder, int64_t version);
  std::span<std::byte> bytes_of(PinnedMemory& slab, const ParameterInfo& info) const;

  MemoryPool& pool_;
  const ParameterLayout& layout_;
  const Allocation* master_;
  DType dtype_;
  DiskDeltaSettings settings_;
  int rank_ = 0, size_ = 1;
  Allocation* weights_ = nullptr;  // the engine's slab
  Allocation* staging_ = nullptr;  // a source rank's: its weights rounded on the device, a part at a time
  // The version the engines hold, the base of the next, in the working dtype on the host:
  // the whole slab on an engine, a source rank's own tensors on a trainer.
  std::unique_ptr<PinnedMemory> held_;
  std::unique_ptr<PinnedMemory> state_;  // a source rank's: the new state of its own tensors
  int64_t version_ = -1;                 // the version held; -1 until the baseline is taken
};

}  // namespace tandem
