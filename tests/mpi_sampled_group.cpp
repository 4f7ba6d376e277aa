// Sampled groups gathered from every rank under mpirun (-np 2 and -np 4): the exchange
// that deals dynamic sampling's kept groups out to the ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include "driver/sampled_group.h"

using namespace tandem;

namespace {

// Rank r holds r groups (rank 0 none), each with r-dependent tokens, texts and rewards.
std::vector<SampledGroup> groups_of(int rank) {
  std::vector<SampledGroup> groups;
  for (int i = 0; i < rank; ++i) {
    SampledGroup group;
    group.prompt_index = static_cast<uint64_t>(100 * rank + i);
    group.prompt = {rank, i, 7};
    group.prompt_text = "rank " + std::to_string(rank);
    group.samples.push_back({{rank, 1}, {-0.5f * static_cast<float>(rank), -1.0f}, "ans" + std::to_string(i), 0.9 * i});
    group.samples.push_back({{}, {}, "", -1.0});
    groups.push_back(group);
  }
  return groups;
}

}  // namespace

TEST(SampledGroups, AllGatherGivesEveryRankEveryGroupInRankOrder) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::vector<SampledGroup> all = all_gather_groups(MPI_COMM_WORLD, groups_of(rank));
  std::vector<SampledGroup> expected;
  for (int r = 0; r < size; ++r)
    for (const SampledGroup& group : groups_of(r)) expected.push_back(group);
  EXPECT_EQ(all, expected);
}
