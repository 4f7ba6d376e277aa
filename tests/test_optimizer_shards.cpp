// ZeRO-1's shard layout: the ranks' ranges tile the slab, AdamW's pieces and Muon's whole
// matrices are each stepped by exactly one rank, and the split stays near even.
#include <gtest/gtest.h>

#include "policy_trainer_support.h"
#include "train/optimizer_shards.h"

namespace tandem {
namespace {

ModelConfig wider_config() {
  ModelConfig config = testing::trainer_config();
  config.layers = 3;
  config.hidden = 64;
  config.intermediate = 160;
  config.vocab = 96;
  return config;
}

TEST(SlabShards, TileTheSlabInAlignedNearEvenRanges) {
  const ParameterLayout layout(wider_config());
  for (const OptimizerKind optimizer : {OptimizerKind::AdamW, OptimizerKind::Muon})
    for (int ranks : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE(std::to_string(ranks) + (optimizer == OptimizerKind::Muon ? " ranks, muon" : " ranks, adamw"));
      const SlabShards shards = SlabShards::split(layout, optimizer, ranks, 0);
      ASSERT_EQ(shards.ranks(), ranks);
      EXPECT_EQ(shards.bounds.front(), 0);
      EXPECT_EQ(shards.bounds.back(), layout.slab_elements());
      const std::vector<size_t> counts = shards.counts();
      size_t total = 0;
      for (int r = 0; r < ranks; ++r) {
        EXPECT_LE(shards.bounds[r], shards.bounds[r + 1]);
        total += counts[static_cast<size_t>(r)];
        if (r > 0 && optimizer == OptimizerKind::AdamW) EXPECT_EQ(shards.bounds[r] % ParameterLayout::kAlignment, 0);
      }
      EXPECT_EQ(total, static_cast<size_t>(layout.slab_elements()));
      // Near even: AdamW within the alignment, Muon within one matrix of the even bound.
      int64_t largest_matrix = 0;
      for (const ParameterInfo& info : layout.tensors())
        if (takes_muon(info)) largest_matrix = std::max(largest_matrix, info.numel());
      const int64_t slack = optimizer == OptimizerKind::Muon ? largest_matrix : ParameterLayout::kAlignment;
      for (int r = 1; r < ranks; ++r)
        EXPECT_LE(std::abs(shards.bounds[r] - layout.slab_elements() * r / ranks), slack) << "bound " << r;
    }
  EXPECT_THROW(SlabShards::split(layout, OptimizerKind::AdamW, 2, 2), std::invalid_argument);
  EXPECT_THROW(SlabShards::split(layout, OptimizerKind::AdamW, 0, 0), std::invalid_argument);
}

TEST(SlabShards, EveryOptimizerValueBelongsToExactlyOneRank) {
  const ParameterLayout layout(wider_config());
  for (const OptimizerKind optimizer : {OptimizerKind::AdamW, OptimizerKind::Muon})
    for (int ranks : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE(std::to_string(ranks) + (optimizer == OptimizerKind::Muon ? " ranks, muon" : " ranks, adamw"));
      std::vector<int> owners(static_cast<size_t>(layout.slab_elements()), 0);
      size_t muon_matrices = 0;
      for (int rank = 0; rank < ranks; ++rank) {
        const SlabShards shard = SlabShards::split(layout, optimizer, ranks, rank);
        for (const SlabPiece& piece : adamw_pieces(layout, optimizer, shard)) {
          const ParameterInfo& info = layout.tensors()[piece.tensor];
          const int64_t at = shard.begin() + piece.offset;
          ASSERT_GE(piece.offset, 0);
          ASSERT_LE(piece.offset + piece.count, shard.elements());
          ASSERT_GE(at, info.offset);
          ASSERT_LE(at + piece.count, info.offset + info.numel());
          for (int64_t i = at; i < at + piece.count; ++i) ++owners[static_cast<size_t>(i)];
        }
        if (optimizer != OptimizerKind::Muon) continue;
        for (const MuonGroup& group : muon_groups_in(layout, shard))
          for (const MuonMatrix& matrix : group.matrices) {
            ASSERT_GE(matrix.offset, 0);
            ASSERT_LE(matrix.offset + group.m * group.n, shard.elements());  // whole, inside the shard
            for (int64_t i = 0; i < group.m * group.n; ++i) ++owners[static_cast<size_t>(shard.begin() + matrix.offset + i)];
            ++muon_matrices;
          }
      }
      for (const ParameterInfo& info : layout.tensors())
        for (int64_t i = info.offset; i < info.offset + info.numel(); ++i)
          ASSERT_EQ(owners[static_cast<size_t>(i)], 1) << info.name << " element " << i - info.offset;
      if (optimizer == OptimizerKind::Muon) {
        size_t all = 0;
        for (const MuonGroup& group : muon_groups(layout)) all += group.matrices.size();
        EXPECT_EQ(muon_matrices, all);
      }
    }
}

TEST(SlabShards, MuonRefusesAShardThatCutsAMatrix) {
  const ParameterLayout layout(wider_config());
  const ParameterInfo* matrix = layout.find("model.layers.1.mlp.up_proj.weight");
  ASSERT_NE(matrix, nullptr);
  const SlabShards cut{{0, matrix->offset + 64, layout.slab_elements()}, 0};
  try {
    muon_groups_in(layout, cut);
    FAIL() << "no error";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("cuts the Muon matrix at slab offset " + std::to_string(matrix->offset)),
              std::string::npos)
        << error.what();
  }
  EXPECT_NO_THROW(adamw_pieces(layout, OptimizerKind::AdamW, cut));  // AdamW may be cut anywhere
}

}  // namespace
}  // namespace tandem
