// The trainer's part of a checkpoint: the FP32 master weights and the optimizer's state,
// one HDF5 tensor per parameter tensor and state, named
//   master.<name>                                  every tensor
//   adamw.exp_avg.<name>, adamw.exp_avg_sq.<name>  the tensors AdamW steps
//   muon.momentum.<name>                           the matrices Muon steps (held in exp_avg)
// so a checkpoint says which optimizer wrote it, and resuming under another one fails on
// the first missing tensor, by name. Under ZeRO-1 each rank holds a shard of the slabs:
// they are gathered onto rank 0 over MPI (host memory, as rank 0 copies them unsharded)
// and written whole, so the file is the same as an unsharded run's and each rank reads
// its shard back from it.
#pragma once
#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "driver/colocated_memory.h"
#include "io/checkpoint.h"
#include "train/optimizer_settings.h"

namespace tandem {

class TrainerCheckpoint {
 public:
  // comm: the trainer ranks the shards are spread over (rank 0 writes the checkpoint).
  TrainerCheckpoint(ColocatedMemory& memory, OptimizerKind optimizer, MPI_Comm comm);

  // Every slab from the checkpoint (parts no tensor covers become zero): this rank's shard
  // of the master weights and state, and the whole working copy. Throws BadInputError
  // naming the file and tensor for a NaN or infinity.
  void read(const Checkpoint& checkpoint) const;
  // The floats of the whole slabs, end to end: what gather_into writes on rank 0.
  size_t host_floats() const;
  // Collective over comm: rank 0 receives the whole slabs into `host` (host_floats()
  // floats), the others send their shards (`host` is unused there).
  void gather_into(float* host) const;
  // Rank 0: lists views of the gathered `host` in `contents`; the caller keeps it until
  // the checkpoint is written.
  void add_to(CheckpointContents& contents, const float* host) const;

 private:
  struct Slab {
    Tensor memory;                                                    // flat F32 shard
    std::vector<std::pair<std::string, const ParameterInfo*>> tensors;  // checkpoint name, where
  };
  ColocatedMemory& memory_;
  MPI_Comm comm_;
  std::vector<Slab> slabs_;  // master, exp_avg, exp_avg_sq
};

}  // namespace tandem
