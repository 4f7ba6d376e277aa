// World setup and CPU collectives under mpirun (-np 2 and -np 4).
#include <gtest/gtest.h>

#include <numeric>

#include "world/phase_timers.h"
#include "world/table.h"
#include "world/gpu.h"
#include "world/world.h"

using namespace tandem;

namespace {
std::unique_ptr<World> cpu_world() { return World::create(MPI_COMM_WORLD, WorldOptions{"cpu", 1}); }
}  // namespace

TEST(World, RanksAndLocalRanksArePlaced) {
  auto world = cpu_world();
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_GE(size, 2) << "run this program under mpirun -np 2 or more";
  EXPECT_EQ(world->rank(), rank);
  EXPECT_EQ(world->size(), size);
  // All ranks of a test job share this one host: local rank == rank.
  EXPECT_EQ(world->local_size(), size);
  EXPECT_EQ(world->local_rank(), rank);
  EXPECT_EQ(world->device(), Device::CPU);
  EXPECT_EQ(world->gpu(), -1);
  ASSERT_EQ(world->placements().size(), static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(world->placements()[r].rank, r);
    EXPECT_EQ(world->placements()[r].local_rank, r);
    EXPECT_EQ(world->placements()[r].device, "cpu (1 threads)");
  }
}

TEST(World, AllReduceSumsOverRanks) {
  auto world = cpu_world();
  const int size = world->size(), rank = world->rank();
  std::vector<float> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(rank * 1000 + i);
  world->communicator().all_reduce_sum(data.data(), data.size());
  world->communicator().synchronize();
  for (size_t i = 0; i < data.size(); ++i) {
    const float expected = static_cast<float>(1000 * size * (size - 1) / 2 + size * static_cast<int>(i));
    ASSERT_EQ(data[i], expected) << "element " << i;
  }
}

TEST(World, BroadcastFromAnyRoot) {
  auto world = cpu_world();
  const int root = world->size() - 1;
  std::vector<int> data(64, world->rank());
  if (world->rank() == root) std::iota(data.begin(), data.end(), 7);
  world->communicator().broadcast(data.data(), data.size() * sizeof(int), root);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(data[i], 7 + i);
}

TEST(World, OneRanksErrorFailsEveryRankTogether) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string mine = rank == 1 ? "tensor 'w' missing" : "";
  try {
    fail_together(MPI_COMM_WORLD, mine, rank == 1 ? kExitBadInput : kExitFailure);
    FAIL() << "rank " << rank << " did not throw";
  } catch (const RanksFailedError& error) {
    EXPECT_EQ(error.code(), kExitBadInput) << "the failing rank's exit code, on every rank";
    const std::string text = error.what();
    EXPECT_NE(text.find("rank 1: tensor 'w' missing"), std::string::npos) << text;
    EXPECT_EQ(text.find("rank 0:"), std::string::npos) << text;
  }
  // And no error anywhere passes on every rank.
  EXPECT_NO_THROW(fail_together(MPI_COMM_WORLD, ""));
}

TEST(World, CudaRequestWithoutGpuIsAClearErrorOnEveryRank) {
  if (tandem::gpu_count() > 0) GTEST_SKIP() << "this host has GPUs";
  try {
    World::create(MPI_COMM_WORLD, WorldOptions{"cuda", 1});
    FAIL() << "no error";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("no usable GPU"), std::string::npos) << error.what();
  }
}

TEST(PhaseTimers, SummaryGathersMinAvgMaxOverRanks) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  PhaseTimers timers;
  timers.add("rollout", 1.0 + rank);  // ranks 0..n-1: 1..n seconds
  timers.add("train", 2.0);
  if (rank == 0) timers.add("checkpoint", 0.5);  // a phase only one rank saw
  const std::string table = timers.summary_table(MPI_COMM_WORLD, 10.0);
  const double avg = 1.0 + (size - 1) / 2.0;
  EXPECT_NE(table.find("Loop time of 10.000 s on " + std::to_string(size) + " ranks"), std::string::npos) << table;
  // The rollout row: min 1 s, avg (1+n)/2 s, max n s.
  const size_t row = table.find("rollout");
  ASSERT_NE(row, std::string::npos) << table;
  std::string line = table.substr(row, table.find('\n', row) - row);
  std::vector<std::string> cells;
  for (size_t start = 0, bar; start <= line.size(); start = bar + 1) {
    bar = line.find('|', start);
    if (bar == std::string::npos) bar = line.size();
    std::string cell = line.substr(start, bar - start);
    cell.erase(0, cell.find_first_not_of(' '));
    cell.erase(cell.find_last_not_of(' ') + 1);
    cells.push_back(cell);
  }
  ASSERT_EQ(cells.size(), 6u) << line;
  EXPECT_EQ(cells[1], "1.000");
  EXPECT_EQ(cells[2], format_fixed(avg, 3));
  EXPECT_EQ(cells[3], format_fixed(size, 3));
  EXPECT_NE(table.find("checkpoint"), std::string::npos) << table;
  EXPECT_NE(table.find("train"), std::string::npos) << table;
}
