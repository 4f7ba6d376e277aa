#include "train/optimizer_shards.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tandem {

SlabShards SlabShards::whole(const ParameterLayout& layout) { return SlabShards{{0, layout.slab_elements()}, 0}; }

SlabShards SlabShards::split(const ParameterLayout& layout, OptimizerKind optimizer, int ranks, int rank) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw std::invalid_argument("SlabShards: rank " + std::to_string(rank) + " of " + std::to_string(ranks) + " ranks");
  const int64_t elements = layout.slab_elements();
  const int64_t align = ParameterLayout::kAlignment;
  SlabShards shards{{0}, rank};
  for (int r = 1; r < ranks; ++r) {
    int64_t bound = elements * r / ranks / align * align;
    if (optimizer == OptimizerKind::Muon)
      for (const ParameterInfo& info : layout.tensors())
        if (takes_muon(info) && info.offset < bound && bound < info.offset + info.numel())
          bound = bound - info.offset <= info.offset + info.numel() - bound ? info.offset : info.offset + info.numel();
    shards.bounds.push_back(std::max(bound, shards.bounds.back()));
  }
  shards.bounds.push_back(elements);
  return shards;
}

std::vector<size_t> SlabShards::counts() const {
  std::vector<size_t> counts;
  for (size_t r = 0; r + 1 < bounds.size(); ++r) counts.push_back(static_cast<size_t>(bounds[r + 1] - bounds[r]));
  return counts;
}

std::vector<SlabPiece> adamw_pieces(const ParameterLayout& layout, OptimizerKind optimizer, const SlabShards& shards) {
  std::vector<SlabPiece> pieces;
  const std::vector<ParameterInfo>& tensors = layout.tensors();
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (optimizer == OptimizerKind::Muon && takes_muon(tensors[t])) continue;
    const int64_t first = std::max(tensors[t].offset, shards.begin());
    const int64_t last = std::min(tensors[t].offset + tensors[t].numel(), shards.end());
    if (first < last) pieces.push_back({t, first - shards.begin(), last - first});
  }
  return pieces;
}

std::vector<MuonGroup> muon_groups_in(const ParameterLayout& layout, const SlabShards& shards) {
  std::vector<MuonGroup> groups;
  for (MuonGroup& group : muon_groups(layout)) {
    MuonGroup mine{group.m, group.n, {}};
    for (const MuonMatrix& matrix : group.matrices) {
      const int64_t end = matrix.offset + group.m * group.n;
      if (end <= shards.begin() || matrix.offset >= shards.end()) continue;
      if (matrix.offset < shards.begin() || end > shards.end())
        throw std::invalid_argument("SlabShards: rank " + std::to_string(shards.rank) + "'s shard [" +
                                    std::to_string(shards.begin()) + ", " + std::to_string(shards.end()) +
                                    ") cuts the Muon matrix at slab offset " + std::to_string(matrix.offset));
      mine.matrices.push_back({matrix.offset - shards.begin(), matrix.transposed});
    }
    if (!mine.matrices.empty()) groups.push_back(std::move(mine));
  }
  return groups;
}

}  // namespace tandem
