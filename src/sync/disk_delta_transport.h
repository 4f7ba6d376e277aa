// The transport through a shared folder (sync.path) that every rank sees: each sync,
// the source ranks write their share of the model as compressed, checksummed deltas of
// the working-dtype bytes against a fixed baseline, rank 0 publishes the version with its
// index once every file is complete, and the engines read, verify and apply every file.
// The format is in sync/delta_format.h.
//
// The baseline is the bytes the engines hold at the first sync, which publishes nothing;
// or, with sync.baseline, the HF safetensors folder the engines start from. Each source
// rank first checks its share of the baseline against the trainer's tensors; the ranks
// gather their errors and fail together, so none is left waiting in a collective.
//
// Colocated today: every rank is a source (its trainer) and an engine, so the files and
// collectives are the real ones; the engine side moves to rollout ranks later.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "model/parameters.h"
#include "sync/delta_format.h"
#include "sync/weight_transport.h"
#include "tensor/memory_pool.h"

namespace tandem {

struct DiskDeltaSettings {
  std::filesystem::path path;      // the shared folder of the versions
  std::filesystem::path baseline;  // an HF folder the engines start from; empty = their first weights
  DeltaEncoding encoding = DeltaEncoding::Xor;
  int compression_level = 1;
  int keep_versions = 2;
};

class DiskDeltaTransport final : public WeightTransport {
 public:
  // Collective over comm: every rank constructs it and joins every sync.
  DiskDeltaTransport(MemoryPool& pool, const ParameterLayout& layout, const Allocation* master, DType dtype,
                     DiskDeltaSettings settings, MPI_Comm comm);
  ~DiskDeltaTransport() override;
  DiskDeltaTransport(const DiskDeltaTransport&) = delete;
  DiskDeltaTransport& operator=(const DiskDeltaTransport&) = delete;

  TransportKind kind() const override { return TransportKind::DiskDelta; }
  Tensor engine_weights() const override;
  SyncReport sync() override;

  // The tensors this rank writes: the layout's tensors dealt round-robin over the ranks.
  bool owns(size_t tensor_index) const { return static_cast<int>(tensor_index % static_cast<size_t>(size_)) == rank_; }

 private:
  void take_baseline();
  SyncReport publish_and_apply();
  std::span<std::byte> baseline_of(const ParameterInfo& info);
  Tensor engine_view(const ParameterInfo& info) const;

  MemoryPool& pool_;
  const ParameterLayout& layout_;
  const Allocation* master_;
  DType dtype_;
  DiskDeltaSettings settings_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  Allocation* weights_ = nullptr;
  std::vector<std::byte> baseline_;  // the whole slab in the working dtype, on the host
  int64_t version_ = -1;             // -1 until the baseline is taken; then the last published
};

}  // namespace tandem
