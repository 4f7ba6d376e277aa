// The [optimizer] section of a deck as the trainer's typed settings, and the rank's
// state file when the state lives on disk.
#pragma once
#include <mpi.h>

#include <filesystem>
#include <memory>

#include "deck/deck.h"
#include "model/parameters.h"
#include "train/optimizer_settings.h"
#include "train/optimizer_shards.h"
#include "train/optimizer_state_file.h"
#include "world/pinned_memory.h"

namespace tandem {
OptimizerSettings optimizer_settings_from_deck(const Deck& deck);
// train.shard-optimizer: the split of the master weights and state over the trainer ranks
// (rank of ranks, the trainer communicator's), or the whole slab on every rank.
SlabShards optimizer_shard_from_deck(const Deck& deck, const ParameterLayout& layout, int ranks, int rank);

// The rank's optimizer state when it lives off the device: two FP32 slabs (exp_avg,
// exp_avg_sq) of the rank's shard in host memory or in the state file. Neither for state = device.
struct OptimizerStateStore {
  std::unique_ptr<PinnedMemory> host;       // state = host
  std::unique_ptr<OptimizerStateFile> file;  // state = disk
  float* data() const {
    return static_cast<float*>(host ? host->data() : file ? file->data() : nullptr);
  }
};
// Collective: a rank that cannot create, size or map its state file makes every rank
// throw a DeckError (exit code 2) at optimizer.state-path with each failing rank's path
// and bytes.
// Each of the two device staging slots of a state off the device: optimizer.chunk-bytes,
// or under Muon at least its largest matrix (its chunks hold whole matrices).
size_t optimizer_state_slot_bytes(const OptimizerSettings& settings, const ParameterLayout& layout);
OptimizerStateStore optimizer_state_store_from_deck(const Deck& deck, const SlabShards& shard,
                                                    const std::filesystem::path& run_folder, Device device, int rank,
                                                    MPI_Comm comm);
}
