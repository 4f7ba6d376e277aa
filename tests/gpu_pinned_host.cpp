// allocate_pinned_host (src/tensor/pinned_host.h), the pinned memory of the pool's host
// buffers and of PinnedMemory: zero-filled, page-locked (the runtime sees host memory it
// registered), copied both ways at the bus's rate through the copy engines, readable and
// writable by the device at the host's address when mapped; and a clear error, not a
// killed process, when the host has not the memory.
#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "gpu_support.h"
#include "tensor/pinned_host.h"

using namespace tandem;
using namespace tandem::testing;

namespace {

// Not a whole number of pages or huge pages, and enough for several faulting threads.
constexpr size_t kBytes = (size_t{200} << 20) + 12345;

bool all_bytes_are(const void* data, size_t bytes, unsigned char value) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i)
    if (p[i] != value) return false;
  return true;
}

}  // namespace

TEST(PinnedHostGpu, MemoryIsZeroedPageLockedAndCopiedBothWays) {
  REQUIRE_GPU();
  for (const int threads : {1, 4, 0}) {
    auto* source = static_cast<unsigned char*>(allocate_pinned_host(kBytes, false, threads));
    auto* back = static_cast<unsigned char*>(allocate_pinned_host(kBytes, false, threads));
    EXPECT_TRUE(all_bytes_are(source, kBytes, 0)) << threads << " threads";
    cudaPointerAttributes attributes{};
    check(cudaPointerGetAttributes(&attributes, source + kBytes - 1), "cudaPointerGetAttributes");
    EXPECT_EQ(attributes.type, cudaMemoryTypeHost) << "the last byte is not in registered memory";
    for (size_t i = 0; i < kBytes; ++i) source[i] = static_cast<unsigned char>(i * 131 + 7);
    void* device = nullptr;
    check(cudaMalloc(&device, kBytes), "cudaMalloc");
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaMemcpyAsync(device, source, kBytes, cudaMemcpyHostToDevice, stream), "host-to-device copy");
    check(cudaMemcpyAsync(back, device, kBytes, cudaMemcpyDeviceToHost, stream), "device-to-host copy");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    EXPECT_EQ(std::memcmp(source, back, kBytes), 0) << threads << " threads";
    check(cudaStreamDestroy(stream), "cudaStreamDestroy");
    check(cudaFree(device), "cudaFree");
    free_pinned_host(source, kBytes);
    free_pinned_host(back, kBytes);
  }
}

TEST(PinnedHostGpu, MappedMemoryIsTheDevicesAtTheHostsAddress) {
  REQUIRE_GPU();
  auto* data = static_cast<unsigned char*>(allocate_pinned_host(kBytes, true));
  cudaPointerAttributes attributes{};
  check(cudaPointerGetAttributes(&attributes, data), "cudaPointerGetAttributes");
  EXPECT_EQ(attributes.devicePointer, static_cast<void*>(data));
  // A memset kernel writes through the mapping; the host reads what it wrote.
  check(cudaMemset(data, 0x5a, kBytes), "cudaMemset of mapped host memory");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  EXPECT_TRUE(all_bytes_are(data, kBytes, 0x5a));
  free_pinned_host(data, kBytes);
}

TEST(PinnedHostGpu, NothingAndTooMuch) {
  REQUIRE_GPU();
  EXPECT_EQ(allocate_pinned_host(0, true), nullptr);
  free_pinned_host(nullptr, 0);
  const size_t too_much = size_t{1} << 50;
  try {
    allocate_pinned_host(too_much, false);
    FAIL() << "a petabyte of pinned memory was granted";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find(std::to_string(too_much) + " pinned bytes"), std::string::npos) << error.what();
  }
  check(cudaGetLastError(), "the error state after the refusal");
}

#endif
