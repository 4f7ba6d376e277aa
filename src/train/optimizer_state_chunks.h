// How the optimizer state is streamed through the device when it lives in host memory
// or in a state file (optimizer.state = host | disk): the AdamW tensors' two moments,
// cut into chunks that each fit one staging slot of `slot_elements` FP32 values. AdamW
// is elementwise, so a tensor may be cut anywhere and a chunk may hold the ends of
// several tensors; each piece keeps its tensor (its weight decay is per tensor). A slot's
// first half holds the chunk's exp_avg values, its second half their exp_avg_sq, each in
// slab order, so pieces adjacent in the slab are adjacent in the slot and copy as one.
#pragma once
#include <cstddef>
#include <span>
#include <vector>

#include "train/muon.h"
#include "train/optimizer_shards.h"

namespace tandem {

struct AdamWPiece {
  size_t tensor = 0;     // in layout.tensors()
  size_t offset = 0;     // in the slabs (from the shard's start), elements
  size_t count = 0;
  size_t exp_avg = 0;    // where its exp_avg and exp_avg_sq values sit in the slot, elements
  size_t exp_avg_sq = 0;
};

struct StateChunk {
  std::vector<AdamWPiece> pieces;
  size_t elements = 0;  // per moment: the values of each half of the slot it uses
};

// AdamW's pieces of the rank's shard (adamw_pieces), in chunks of at most slot_elements
// (>= 2) values. Throws std::invalid_argument for a smaller slot.
std::vector<StateChunk> plan_state_chunks(std::span<const SlabPiece> pieces, size_t slot_elements);

// Muon's momentum (one FP32 value per element) in chunks of whole matrices, group by
// group, so the Newton-Schulz products still batch a whole group: a chunk is the run
// [first, last) of one group's matrices, packed from the slot's start. Throws
// std::invalid_argument when a matrix does not fit in a slot.
struct MuonChunk {
  size_t group = 0;  // in the groups given
  size_t first = 0, last = 0;
  std::vector<int64_t> momentum;  // where each matrix's momentum sits in the slot, elements
  size_t elements = 0;
};
std::vector<MuonChunk> plan_muon_chunks(const std::vector<MuonGroup>& groups, size_t slot_elements);

}  // namespace tandem
