// sync.transport = broadcast over NCCL: under mpirun -np N on N GPUs (N >= 2), trainer
// rank 0 sends a BF16 working copy in buckets that cut elements apart, and every rollout
// rank's engine slab on its GPU holds the same bytes. One rank alone skips.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "gpu_support.h"
#include "model/parameters.h"
#include "sync/broadcast_transport.h"
#include "tensor/device_copy.h"
#include "tensor/memory_pool.h"
#include "test_model_support.h"
#include "world/roles.h"
#include "world/stall_guard.h"
#include "world/world.h"

using namespace tandem;

TEST(GpuBroadcastTransport, EnginesHoldTheTrainersWorkingCopyBitForBit) {
  REQUIRE_GPU();
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) GTEST_SKIP() << "needs mpirun -np 2 (or more) on as many GPUs";
  auto world = World::create(MPI_COMM_WORLD, WorldOptions{"cuda", 0});
  set_stall_timeout(MPI_COMM_WORLD, 60);
  Roles roles(*world, size - 1);
  const ParameterLayout layout(tandem::testing::tiny_config(true, false, false));
  auto pool = MemoryPool::create(Device::CUDA, world->gpu());
  const size_t bytes = layout.slab_bytes(DType::BF16);
  Allocation* working = pool->allocate(tags::derived, bytes, "trainer.working_weights");
  const Tensor source = Tensor::view(working->ptr, DType::BF16, Device::CUDA, {layout.slab_elements()});
  std::vector<unsigned char> host(bytes);
  std::mt19937_64 rng(static_cast<uint64_t>(world->rank()));
  for (unsigned char& byte : host) byte = static_cast<unsigned char>(rng());
  copy_host_to_tensor(source, host.data());
  {
    BroadcastTransport transport(*pool, layout, DType::BF16, BroadcastSettings{1000, roles.link_communicator()},
                                 roles.role() == Role::Trainer ? &source : nullptr);
    EXPECT_EQ(transport.sync().bytes, bytes);
    MPI_Bcast(host.data(), static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD);  // trainer rank 0's bytes
    std::vector<unsigned char> held(bytes);
    copy_tensor_to_host(held.data(), transport.engine_weights());
    EXPECT_EQ(std::memcmp(held.data(), host.data(), bytes), 0);
  }
  pool->release(working);
}
