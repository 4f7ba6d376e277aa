// The optimizer step on the trainer's slabs (PolicyTrainerMemory): AdamW on every tensor,
// or Muon on the layers' matrices and AdamW on the rest, with the state beside the
// weights or, with state_staging, streamed chunk by chunk through the two staging slots
// (optimizer_state_chunks.h): AdamW's tensors, then Muon's groups, the load of a chunk
// and the write-back of the one before overlapping the update of the next on CUDA.
// Private to src/train and its benchmark (tools/bench_train.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "train/muon.h"
#include "train/optimizer_settings.h"
#include "train/optimizer_state_chunks.h"
#include "train/policy_trainer.h"

namespace tandem {

class TrainerBackend;

class OptimizerStep {
 public:
  // memory.activations serves Muon as its workspace: nothing else may use it during run.
  OptimizerStep(const ParameterLayout& layout, const PolicyTrainerMemory& memory, TrainerBackend& backend);

  // Queues step `step` (counting from 1) at learning rate lr on the backend, and the BF16
  // working copy when the working slab is BF16. Returns the state bytes streamed (read
  // plus written back): 0 with the state on the device.
  size_t run(const OptimizerSettings& settings, double lr, int64_t step);

 private:
  size_t streamed(const AdamWSettings& adamw, const MuonSettings& muon, int64_t step, uint16_t* working,
                  OptimizerKind optimizer);

  const ParameterLayout& layout_;
  std::vector<MuonGroup> muon_groups_;
  PolicyTrainerMemory memory_;
  TrainerBackend& backend_;
  // With the state streamed: the chunks of the optimizer last planned for.
  std::vector<StateChunk> state_chunks_;
  std::vector<MuonChunk> muon_chunks_;
  OptimizerKind state_chunks_optimizer_ = OptimizerKind::AdamW;
};

}  // namespace tandem
