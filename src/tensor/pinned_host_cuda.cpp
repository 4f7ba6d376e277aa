#include "tensor/pinned_host.h"

#include <sys/mman.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "world/host_memory.h"

namespace tandem {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kPage = 4096;
// Below this a range is faulted in by one thread: starting more costs more than it saves.
constexpr size_t kBytesPerThread = size_t{64} << 20;
constexpr int kMaxThreads = 16;

size_t mapped_bytes(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }

// The first write to each page faults it in, zero-filled, on the writing thread.
void fault_in(char* begin, char* end) {
  for (char* page = begin; page < end; page += kPage) *static_cast<volatile char*>(page) = 0;
}

void fault_in_parallel(char* data, size_t bytes, int threads) {
  if (threads <= 0) threads = static_cast<int>(std::min<unsigned>(kMaxThreads, std::max(1u, std::thread::hardware_concurrency())));
  const size_t useful = std::max<size_t>(1, bytes / kBytesPerThread);
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), useful));
  // Whole huge pages per thread, so no huge page is faulted by two threads.
  const size_t share = mapped_bytes((bytes + threads - 1) / threads);
  std::vector<std::jthread> workers;
  for (int t = 1; t < threads; ++t) {
    const size_t begin = std::min(bytes, t * share), end = std::min(bytes, begin + share);
    if (begin < end) workers.emplace_back(fault_in, data + begin, data + end);
  }
  fault_in(data, data + std::min(bytes, share));
}

std::string describe(size_t bytes) { return std::to_string(bytes) + " pinned bytes"; }

}  // namespace

void* allocate_pinned_host(size_t bytes, bool device_mapped, int threads) {
  if (bytes == 0) return nullptr;
  const size_t size = mapped_bytes(bytes);
  // The kernel would grant the mapping and kill the process when the pages run out:
  // refuse up front instead, as cudaHostAlloc fails, so the caller can free and retry.
  const size_t available = available_host_memory();
  if (size > available)
    throw std::runtime_error("allocating " + describe(bytes) + ": the host has " + std::to_string(available) +
                             " bytes available");
  // Aligned to a huge page: map one more and trim both ends.
  void* mapping = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) throw std::runtime_error("allocating " + describe(bytes) + ": mmap failed");
  const uintptr_t base = reinterpret_cast<uintptr_t>(mapping);
  const uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > base) munmap(mapping, aligned - base);
  munmap(reinterpret_cast<void*>(aligned + size), base + kHugePage - aligned);
  char* data = reinterpret_cast<char*>(aligned);
  madvise(data, size, MADV_HUGEPAGE);  // a hint: without huge pages the faults are 4 KiB ones
  madvise(data, size, MADV_DONTFORK);  // a child process (MPI may start some) shares no pinned page
  fault_in_parallel(data, size, threads);
  const unsigned flags = cudaHostRegisterPortable | (device_mapped ? cudaHostRegisterMapped : 0u);
  std::string failure;
  if (const cudaError_t status = cudaHostRegister(data, size, flags); status != cudaSuccess) {
    failure = std::string("cudaHostRegister: ") + cudaGetErrorString(status);
  } else if (device_mapped) {
    void* device = nullptr;
    if (const cudaError_t query = cudaHostGetDevicePointer(&device, data, 0); query != cudaSuccess)
      failure = std::string("cudaHostGetDevicePointer: ") + cudaGetErrorString(query);
    else if (device != data)
      failure = "the device reads registered host memory at another address than the host's";
    if (!failure.empty()) cudaHostUnregister(data);
  }
  if (!failure.empty()) {
    cudaGetLastError();  // the error is thrown here, not left for the next launch's check
    munmap(data, size);
    throw std::runtime_error("allocating " + describe(bytes) + ": " + failure);
  }
  return data;
}

void free_pinned_host(void* data, size_t bytes) {
  if (!data) return;
  cudaHostUnregister(data);
  munmap(data, mapped_bytes(bytes));
}

}  // namespace tandem
