// The tagged memory pool on the CUDA backend: the scenarios the CPU tests run, plus
// what only a GPU shows: device memory really freed on offload, a captured CUDA graph
// still valid after its buffers went to the host and came back, and a real device OOM.
#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>

#include "memory_pool_scenarios.h"
#include "gpu_support.h"
#include "tensor/memory_pool.h"

using namespace tandem;
using namespace tandem::testing;

namespace {

const PoolMemoryAccess device_access{
    [](void* device, const void* host, size_t bytes) {
      check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to pool memory");
    },
    [](void* host, const void* device, size_t bytes) {
      check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy from pool memory");
    }};

size_t free_device_bytes() {
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

}  // namespace

TEST(MemoryPoolGpu, DataSurvivesOffloadAtTheSameAddress) {
  REQUIRE_GPU();
  expect_round_trip_at_same_address(Device::CUDA, device_access);
}
TEST(MemoryPoolGpu, DropZeroesAndNamesWhatToRebuild) {
  REQUIRE_GPU();
  expect_drop_zeroes_and_names_rebuild(Device::CUDA, device_access);
}
TEST(MemoryPoolGpu, ScriptedAccountingPerTagAndPeakOfSums) {
  REQUIRE_GPU();
  expect_scripted_accounting(Device::CUDA);
}
TEST(MemoryPoolGpu, PinnedCacheReusesHostBuffersAndIsAccounted) {
  REQUIRE_GPU();
  expect_pinned_cache_accounting(Device::CUDA);
}
TEST(MemoryPoolGpu, FilledHostCacheServesOffloads) {
  REQUIRE_GPU();
  expect_filled_host_cache_serves_offloads(Device::CUDA);
}
TEST(MemoryPoolGpu, DeferredTagsAndPeakWindows) {
  REQUIRE_GPU();
  expect_deferred_tags_and_peak_windows(Device::CUDA);
}
TEST(MemoryPoolGpu, ErrorsNameTagAllocationAndBytes) {
  REQUIRE_GPU();
  expect_errors_name_tag_allocation_and_bytes(Device::CUDA);
}
TEST(MemoryPoolGpu, TagsAreExtensibleByName) {
  REQUIRE_GPU();
  expect_extensible_tags(Device::CUDA, device_access);
}

TEST(MemoryPoolGpu, GranularityIsAPowerOfTwoOfAtLeast64KiB) {
  REQUIRE_GPU();
  auto pool = MemoryPool::create(Device::CUDA);
  const size_t g = pool->granularity();
  EXPECT_EQ(pool->device(), Device::CUDA);
  EXPECT_GE(g, size_t{64} << 10);
  EXPECT_EQ(g & (g - 1), 0u) << g;
  Allocation* allocation = pool->allocate(tags::weights, g + 1, "w");
  EXPECT_EQ(allocation->mapped_bytes, 2 * g);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(allocation->ptr) % g, 0u);
  std::printf("granularity on cuda:0: %zu bytes\n", g);
}

TEST(MemoryPoolGpu, OffloadAndDropGiveDeviceMemoryBack) {
  REQUIRE_GPU();
  constexpr size_t kBytes = size_t{1} << 30;
  constexpr size_t kSlack = kBytes / 10;  // other allocations of the driver come and go
  auto pool = MemoryPool::create(Device::CUDA);
  const size_t before = free_device_bytes();
  Allocation* kv = pool->allocate(tags::kv_cache, kBytes, "kv");
  EXPECT_LE(free_device_bytes(), before - kBytes + kSlack);
  check(cudaMemset(kv->ptr, 0x3c, kBytes), "cudaMemset");
  check(cudaDeviceSynchronize(), "sync");

  pool->offload(tags::kv_cache);
  EXPECT_GE(free_device_bytes() + kSlack, before) << "offload kept the device memory";
  pool->onload(tags::kv_cache);
  EXPECT_LE(free_device_bytes(), before - kBytes + kSlack);
  unsigned char last = 0;
  device_access.read(&last, static_cast<char*>(kv->ptr) + kBytes - 1, 1);
  EXPECT_EQ(last, 0x3c);

  pool->drop(tags::kv_cache);
  EXPECT_GE(free_device_bytes() + kSlack, before) << "drop kept the device memory";
}

// A graph bakes the addresses of its nodes in; the pool keeps addresses across offload,
// so the graph launched after onload must read the onloaded data and write where the
// program reads.
TEST(MemoryPoolGpu, CapturedCudaGraphSurvivesOffloadOnload) {
  REQUIRE_GPU();
  auto pool = MemoryPool::create(Device::CUDA);
  const size_t bytes = 3 * pool->granularity();
  Allocation* source = pool->allocate(tags::kv_cache, bytes, "kv");
  Allocation* target = pool->allocate(tags::activations, bytes, "out");

  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  check(cudaMemsetAsync(source->ptr, 0x5a, bytes / 2, stream), "captured memset");
  check(cudaMemcpyAsync(target->ptr, source->ptr, bytes, cudaMemcpyDeviceToDevice, stream), "captured copy");
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");

  const auto data = pattern(bytes, 11);
  device_access.write(source->ptr, data.data(), bytes);
  pool->offload(tags::kv_cache);
  pool->drop(tags::activations);
  pool->onload(tags::kv_cache);
  pool->onload(tags::activations);

  check(cudaGraphLaunch(exec, stream), "launch");
  check(cudaStreamSynchronize(stream), "graph run");
  auto expected = data;
  std::memset(expected.data(), 0x5a, bytes / 2);
  EXPECT_EQ(read_back(device_access, *source), expected) << "the graph's memset missed the onloaded pages";
  EXPECT_EQ(read_back(device_access, *target), expected) << "the graph's copy missed the onloaded pages";

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(MemoryPoolGpu, DeviceOutOfMemoryIsAClearError) {
  REQUIRE_GPU();
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  auto pool = MemoryPool::create(Device::CUDA);
  pool->allocate(tags::weights, pool->granularity(), "small");
  try {
    pool->allocate(tags::kv_cache, 2 * total, "huge");
    FAIL() << "allocated twice the device memory";
  } catch (const std::runtime_error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'huge' (tag kv_cache, " + std::to_string(2 * total) + " bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("cuMemCreate"), std::string::npos) << message;
  }
  EXPECT_EQ(pool->allocations().size(), 1u);
  EXPECT_EQ(pool->stats().device_bytes, pool->granularity());
  Allocation* after = pool->allocate(tags::kv_cache, pool->granularity(), "after");  // the pool still works
  EXPECT_EQ(after->residency, Residency::Resident);
}

#endif  // TANDEM_HAVE_CUDA
