// sync.transport = broadcast under mpirun (-np 2 and -np 4): the role split's groups and
// link, and engines that hold trainer rank 0's working copy bit for bit after each sync,
// with buckets that cut elements apart and a last bucket shorter than the others.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "model/config.h"
#include "model/parameters.h"
#include "sync/broadcast_transport.h"
#include "tensor/memory_pool.h"
#include "test_model_support.h"
#include "world/roles.h"
#include "world/stall_guard.h"
#include "world/world.h"

using namespace tandem;

namespace {

void fill_random(const Tensor& tensor, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* bytes = static_cast<unsigned char*>(tensor.data);
  for (size_t i = 0; i < tensor.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(rng());
}

}  // namespace

TEST(Roles, TheLastRanksRollOutAndTrainerZeroLinksThem) {
  auto world = World::create(MPI_COMM_WORLD, WorldOptions{"cpu", 1});
  set_stall_timeout(MPI_COMM_WORLD, 60);
  const int size = world->size(), rank = world->rank();
  for (int engines = 1; engines < size; ++engines) {
    Roles roles(*world, engines);
    const bool engine = rank >= size - engines;
    EXPECT_EQ(roles.role(), engine ? Role::Engine : Role::Trainer);
    EXPECT_EQ(roles.size(), engine ? engines : size - engines);
    EXPECT_EQ(roles.rank(), engine ? rank - (size - engines) : rank);
    EXPECT_EQ(roles.link() != MPI_COMM_NULL, engine || rank == 0);
    EXPECT_EQ(roles.role_of(size - 1), "rollout");
    EXPECT_EQ(roles.role_of(0), "trainer");
    // The trainers' communicator sums over the trainers alone.
    float one = 1;
    roles.communicator().all_reduce_sum(&one, 1);
    EXPECT_EQ(one, static_cast<float>(roles.size()));
  }
  Roles colocated(*world, 0);
  EXPECT_FALSE(colocated.split());
  EXPECT_EQ(colocated.comm(), world->comm());
  EXPECT_THROW(Roles(*world, size), std::invalid_argument);
}

TEST(BroadcastTransport, EnginesHoldTheTrainersWorkingCopyBitForBit) {
  auto world = World::create(MPI_COMM_WORLD, WorldOptions{"cpu", 1});
  set_stall_timeout(MPI_COMM_WORLD, 60);
  const ParameterLayout layout(tandem::testing::tiny_config(true, false, false));
  auto pool = MemoryPool::create(Device::CPU);
  for (const DType dtype : {DType::BF16, DType::F32}) {
    for (int engines : {1, world->size() - 1}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + ", " + std::to_string(engines) + " engine ranks");
      Roles roles(*world, engines);
      Allocation* working = pool->allocate(tags::derived, layout.slab_bytes(dtype), "trainer.working_weights");
      const Tensor source = Tensor::view(working->ptr, dtype, Device::CPU, {layout.slab_elements()});
      // 1000 bytes: buckets that split elements, and a short last one.
      const BroadcastSettings settings{1000, roles.link_communicator()};
      BroadcastTransport transport(*pool, layout, dtype, settings, roles.role() == Role::Trainer ? &source : nullptr);
      ASSERT_NE(layout.slab_bytes(dtype) % settings.bucket_bytes, 0u);
      for (uint64_t version = 0; version < 2; ++version) {
        fill_random(source, 1000 * version + static_cast<uint64_t>(world->rank()));  // differs on every rank
        const SyncReport report = transport.sync();
        EXPECT_EQ(report.bytes, roles.link() != MPI_COMM_NULL ? layout.slab_bytes(dtype) : 0u);
        // Trainer rank 0's bytes, to every rank.
        std::vector<unsigned char> expected(layout.slab_bytes(dtype));
        std::memcpy(expected.data(), source.data, expected.size());
        MPI_Bcast(expected.data(), static_cast<int>(expected.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
        if (roles.role() == Role::Engine) {
          const Tensor held = transport.engine_weights();
          EXPECT_NE(held.data, source.data);
          EXPECT_EQ(std::memcmp(held.data, expected.data(), expected.size()), 0) << "version " << version;
        }
      }
      pool->release(working);
    }
  }
}
