// The tagged memory pool on the CPU backend: the shared scenarios (data, accounting,
// cache, errors) plus what only the host can observe directly: that offloaded pages
// really go back to the kernel and that touching them faults.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <sys/mman.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "memory_pool_scenarios.h"
#include "support.h"
#include "tensor/memory_pool.h"

using namespace tandem;
using namespace tandem::testing;

namespace {

const PoolMemoryAccess host_access{
    [](void* device, const void* host, size_t bytes) { std::memcpy(device, host, bytes); },
    [](void* host, const void* device, size_t bytes) { std::memcpy(host, device, bytes); }};

size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// Pages of the range that are in RAM right now.
size_t resident_pages(const Allocation& allocation) {
  std::vector<unsigned char> in_core(allocation.mapped_bytes / page_size());
  if (mincore(allocation.ptr, allocation.mapped_bytes, in_core.data()) != 0) throw std::runtime_error("mincore failed");
  size_t resident = 0;
  for (unsigned char page : in_core) resident += page & 1;
  return resident;
}

size_t resident_set_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t total = 0, resident = 0;
  statm >> total >> resident;
  return resident * page_size();
}

}  // namespace

TEST(MemoryPoolCpu, DataSurvivesOffloadAtTheSameAddress) { expect_round_trip_at_same_address(Device::CPU, host_access); }
TEST(MemoryPoolCpu, DropZeroesAndNamesWhatToRebuild) { expect_drop_zeroes_and_names_rebuild(Device::CPU, host_access); }
TEST(MemoryPoolCpu, ScriptedAccountingPerTagAndPeakOfSums) { expect_scripted_accounting(Device::CPU); }
TEST(MemoryPoolCpu, PinnedCacheReusesHostBuffersAndIsAccounted) { expect_pinned_cache_accounting(Device::CPU); }
TEST(MemoryPoolCpu, FilledHostCacheServesOffloads) { expect_filled_host_cache_serves_offloads(Device::CPU); }
TEST(MemoryPoolCpu, DeferredTagsAndPeakWindows) { expect_deferred_tags_and_peak_windows(Device::CPU); }
TEST(MemoryPoolCpu, ErrorsNameTagAllocationAndBytes) { expect_errors_name_tag_allocation_and_bytes(Device::CPU); }
TEST(MemoryPoolCpu, TagsAreExtensibleByName) { expect_extensible_tags(Device::CPU, host_access); }

TEST(MemoryPoolCpu, GranularityIsThePageSize) {
  auto pool = MemoryPool::create(Device::CPU);
  EXPECT_EQ(pool->device(), Device::CPU);
  EXPECT_EQ(pool->granularity(), page_size());
  Allocation* allocation = pool->allocate(tags::activations, page_size() + 1, "act");
  EXPECT_EQ(allocation->mapped_bytes, 2 * page_size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(allocation->ptr) % page_size(), 0u);
  EXPECT_EQ(pool->stats().per_tag.at("activations").device_bytes, 2 * page_size());
}

TEST(MemoryPoolCpu, OffloadedAndDroppedPagesGoBackToTheSystem) {
  constexpr size_t kBytes = size_t{48} << 20;
  auto pool = MemoryPool::create(Device::CPU, 0, {.pinned_host_cache = false});
  Allocation* kv = pool->allocate(tags::kv_cache, kBytes, "kv");
  Allocation* weights = pool->allocate(tags::weights, kBytes, "weights");
  EXPECT_EQ(resident_pages(*kv), 0u) << "allocate must not touch the pages";
  std::memset(kv->ptr, 0x5a, kBytes);
  const auto data = pattern(kBytes, 4);  // big enough for the threaded copy
  std::memcpy(weights->ptr, data.data(), kBytes);
  EXPECT_EQ(resident_pages(*kv), kBytes / page_size());

  const size_t before_drop = resident_set_bytes();
  pool->drop(tags::kv_cache);
  EXPECT_EQ(resident_pages(*kv), 0u);
  EXPECT_GE(before_drop - resident_set_bytes(), kBytes * 9 / 10) << "dropped pages are still in RAM";

  pool->offload(tags::weights);
  EXPECT_EQ(resident_pages(*weights), 0u);
  pool->onload(tags::weights);
  EXPECT_EQ(std::memcmp(weights->ptr, data.data(), kBytes), 0);
}

// A forked child touches the memory. Not a gtest death test: libonig (the tokenizer's
// regex engine) exports POSIX regcomp/regexec, which interpose glibc's and break the
// regex matching that death tests do on the child's output.
template <class Touch>
bool touching_segfaults(Touch touch) {
  const pid_t child = fork();
  if (child == 0) {
    touch();
    std::_Exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

TEST(MemoryPoolCpu, TouchingOffloadedOrDroppedMemoryFaults) {
  auto pool = MemoryPool::create(Device::CPU);
  Allocation* offloaded = pool->allocate(tags::optimizer, 4096, "adam.m");
  Allocation* dropped = pool->allocate(tags::derived, 4096, "cache");
  pool->offload(tags::optimizer);
  pool->drop(tags::derived);
  EXPECT_TRUE(touching_segfaults([&] { static_cast<volatile char*>(offloaded->ptr)[0] = 1; }));
  EXPECT_TRUE(touching_segfaults([&] { (void)static_cast<volatile char*>(dropped->ptr)[100]; }));
  pool->onload(tags::optimizer);
  static_cast<volatile char*>(offloaded->ptr)[0] = 1;  // mapped again
}

TEST(MemoryPoolCpu, CudaPoolWithoutAGpuFailsClearly) {
  if (cuda_device_available()) GTEST_SKIP() << "a GPU is present; gpu_memory_pool covers it";
  try {
    MemoryPool::create(Device::CUDA);
    FAIL() << "created a CUDA pool without a GPU";
  } catch (const std::exception& error) {
    EXPECT_NE(std::string(error.what()).find("memory pool"), std::string::npos) << error.what();
  }
}
