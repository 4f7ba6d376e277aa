// Device binding and NCCL collectives on the GPU. Runs as one rank (one H200); the same
// program under mpirun -np N on N GPUs checks the sums across ranks.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <numeric>

#include "support.h"
#include "world/world.h"

using namespace tandem;

TEST(GpuWorld, LocalRankBindsItsOwnGpu) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  auto world = World::create(MPI_COMM_WORLD, WorldOptions{"cuda", 0});
  EXPECT_EQ(world->device(), Device::CUDA);
  EXPECT_EQ(world->gpu(), world->local_rank());
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, world->gpu());
  EXPECT_EQ(world->placements()[world->rank()].device.rfind("cuda:" + std::to_string(world->gpu()), 0), 0u)
      << world->placements()[world->rank()].device;
}

TEST(GpuWorld, NcclAllReduceAndBroadcastOnDeviceMemory) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  auto world = World::create(MPI_COMM_WORLD, WorldOptions{"cuda", 0});
  const int size = world->size(), rank = world->rank();
  const size_t n = (size_t{1} << 24) + 5;  // 64 MiB and a ragged tail
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>((rank + 1) * (i % 1000));
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  world->communicator().all_reduce_sum(device, n);
  world->communicator().synchronize();
  ASSERT_EQ(cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  const float factor = static_cast<float>(size * (size + 1) / 2);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(host[i], factor * static_cast<float>(i % 1000)) << i;

  std::vector<int> values(256, rank);
  if (rank == 0) std::iota(values.begin(), values.end(), 11);
  ASSERT_EQ(cudaMemcpy(device, values.data(), values.size() * sizeof(int), cudaMemcpyHostToDevice), cudaSuccess);
  world->communicator().broadcast(device, values.size() * sizeof(int), 0);
  world->communicator().synchronize();
  ASSERT_EQ(cudaMemcpy(values.data(), device, values.size() * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(values[i], 11 + i);
  cudaFree(device);
}
