// The optimizer step on the trainer's slabs (PolicyTrainerMemory): AdamW on every tensor,
// or Muon on the layers' matrices and AdamW on the rest, with the state beside the
// weights or, with state_staging, streamed chunk by chunk through the two staging slots
// (optimizer_state_chunks.h): AdamW's tensors, then Muon's groups, the load of a chunk
// and the write-back of the one before overlapping the update of the next on CUDA.
// Under ZeRO-1 it steps this rank's shard only (optimizer_shards.h): the master weights
// and state are the shard's, the gradients and the working copy whole-slab.
// Private to src/train and its benchmark (tools/bench_train.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "train/muon.h"
#include "train/optimizer_settings.h"
#include "train/optimizer_shards.h"
#include "train/optimizer_state_chunks.h"
#include "train/policy_trainer.h"

namespace tandem {

class TrainerBackend;

class OptimizerStep {
 public:
  // memory.activations serves Muon as its workspace: nothing else may use it during run.
  OptimizerStep(const ParameterLayout& layout, const SlabShards& shard, const PolicyTrainerMemory& memory,
                TrainerBackend& backend);

  // Queues step `step` (counting from 1) at learning rate lr on the backend, and the BF16
  // working copy when the working slab is BF16. Returns the state bytes streamed (read
  // plus written back): 0 with the state on the device.
  size_t run(const OptimizerSettings& settings, double lr, int64_t step);

 private:
  // The shard's AdamW pieces and Muon groups (and, with the state streamed, its chunks)
  // for `optimizer`, unless already planned for it.
  void plan(OptimizerKind optimizer);
  size_t streamed(const AdamWSettings& adamw, const MuonSettings& muon, int64_t step, uint16_t* working);

  const ParameterLayout& layout_;
  SlabShards shard_;
  PolicyTrainerMemory memory_;
  TrainerBackend& backend_;
  // Whole-slab buffers from the shard's start, so that one offset indexes them and the shard's.
  const float* grads_ = nullptr;
  uint16_t* working_ = nullptr;  // BF16 only
  // Of the optimizer last planned for.
  bool planned_ = false;
  OptimizerKind planned_optimizer_ = OptimizerKind::AdamW;
  std::vector<SlabPiece> adamw_pieces_;
  std::vector<AdamWRun> adamw_runs_;  // the pieces, neighbours alike merged (state on the device)
  std::vector<MuonGroup> muon_groups_;
  std::vector<StateChunk> state_chunks_;
  std::vector<MuonChunk> muon_chunks_;
};

}  // namespace tandem
