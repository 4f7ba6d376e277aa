// What the engines on rollout ranks report of a round besides its groups, under mpirun
// (-np 2 and -np 4; rank 0 plays trainer rank 0, the others engines): each engine's
// aborted requests and the largest engine's graph setup seconds reach trainer rank 0,
// through a streamed round's close (round_stream.h) and a kept round's gather
// (engine_orders.h). The CPU engines of the CLI tests always report 0 seconds, so their
// way to the run file is tested here with other values.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "driver/engine_orders.h"
#include "driver/round_stream.h"

using namespace tandem;

namespace {

// Engine 1's is the largest, so that the largest is not the last engine's.
double graph_setup_seconds_of(int rank) { return rank == 1 ? 3.5 : 0.25 * rank; }

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

}  // namespace

TEST(RoundFigures, AStreamedRoundsCloseBringsEachEnginesAbortsAndTheLargestGraphSetup) {
  const int rank = world_rank();
  if (rank != 0) {
    EngineRound round(MPI_COMM_WORLD);
    round.close(rank, 0, graph_setup_seconds_of(rank));
    return;
  }
  const EngineCommand order{EngineOrder::StreamedRound, 1, 0, 0};
  const CollectedRound collected = collect_round(MPI_COMM_WORLD, order, BatchDecision{}, [] { return std::string(); }, 1);
  std::vector<int64_t> aborted;
  for (int engine = 1; engine < world_size(); ++engine) aborted.push_back(engine);
  EXPECT_EQ(collected.aborted, aborted);
  EXPECT_EQ(collected.graph_setup_seconds, 3.5);
}

TEST(RoundFigures, AKeptRoundsGatherBringsTheLargestGraphSetup) {
  const int rank = world_rank();
  const GatheredRound gathered =
      rank == 0 ? gather_round(MPI_COMM_WORLD, "", 0) : gather_round(MPI_COMM_WORLD, groups_reply({}), graph_setup_seconds_of(rank));
  EXPECT_TRUE(gathered.groups.empty());
  EXPECT_EQ(gathered.graph_setup_seconds, rank == 0 ? 3.5 : 0.0);
}
