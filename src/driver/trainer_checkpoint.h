// The trainer's part of a checkpoint: the FP32 master weights and the optimizer's state,
// one HDF5 tensor per parameter tensor and state, named
//   master.<name>                                  every tensor
//   adamw.exp_avg.<name>, adamw.exp_avg_sq.<name>  the tensors AdamW steps
//   muon.momentum.<name>                           the matrices Muon steps (held in exp_avg)
// so a checkpoint says which optimizer wrote it, and resuming under another one fails on
// the first missing tensor, by name.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "driver/colocated_memory.h"
#include "io/checkpoint.h"
#include "train/optimizer_settings.h"

namespace tandem {

class TrainerCheckpoint {
 public:
  TrainerCheckpoint(const ColocatedMemory& memory, OptimizerKind optimizer);

  // Every slab from the checkpoint (parts no tensor covers become zero). Throws
  // BadInputError naming the file and tensor for a NaN or infinity.
  void read(const Checkpoint& checkpoint) const;
  // The floats add_to copies: every slab, end to end.
  size_t host_floats() const;
  // Copies the slabs into `host` (host_floats() floats) and lists views of it in
  // `contents`: the caller keeps `host` until the checkpoint is written.
  void add_to(CheckpointContents& contents, float* host) const;

 private:
  struct Slab {
    Tensor memory;                                                    // flat F32 slab
    std::vector<std::pair<std::string, const ParameterInfo*>> tensors;  // checkpoint name, where
  };
  std::vector<Slab> slabs_;
};

}  // namespace tandem
