// ZeRO-1: the FP32 master weights and the optimizer state split over the trainer ranks.
// Rank r holds the contiguous slab range [bounds[r], bounds[r + 1]) of them (the
// gradients and the working copy stay whole-slab: the gradients are reduce-scattered onto
// these ranges, and the working copy is all-gathered from them after the update).
//
// The bounds are the even split of the slab, rounded to the layout's alignment, except
// that under Muon a bound never cuts one of Muon's matrices: it moves to the nearer end of
// the matrix, so each matrix has one owner rank that holds its whole momentum and runs its
// Newton-Schulz (distributed Muon). AdamW is elementwise and may be cut anywhere.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/parameters.h"
#include "train/muon.h"
#include "train/optimizer_settings.h"

namespace tandem {

struct SlabShards {
  std::vector<int64_t> bounds;  // ranks + 1 slab offsets, from 0 to the slab's elements
  int rank = 0;                 // whose shard the master weights and state hold

  // One rank holds the whole slab (no sharding).
  static SlabShards whole(const ParameterLayout& layout);
  // The split over `ranks` ranks (ranks >= 1), as seen by `rank`.
  static SlabShards split(const ParameterLayout& layout, OptimizerKind optimizer, int ranks, int rank);

  int ranks() const { return static_cast<int>(bounds.size()) - 1; }
  int64_t begin() const { return bounds[static_cast<size_t>(rank)]; }
  int64_t end() const { return bounds[static_cast<size_t>(rank) + 1]; }
  int64_t elements() const { return end() - begin(); }
  // The elements of each rank's shard, in rank order (the collectives' counts).
  std::vector<size_t> counts() const;
};

// A tensor's part inside this rank's shard; offset counts from the shard's start.
struct SlabPiece {
  size_t tensor = 0;  // in layout.tensors()
  int64_t offset = 0;
  int64_t count = 0;
};

// The tensors AdamW steps (under Muon, those Muon does not take), cut to the shard, in
// layout order.
std::vector<SlabPiece> adamw_pieces(const ParameterLayout& layout, OptimizerKind optimizer, const SlabShards& shards);
// Muon's groups (muon_groups) restricted to the matrices inside the shard, with offsets
// counting from the shard's start; groups with none are left out. Throws
// std::invalid_argument when a bound cuts a matrix (shards not split for Muon).
std::vector<MuonGroup> muon_groups_in(const ParameterLayout& layout, const SlabShards& shards);

}  // namespace tandem
