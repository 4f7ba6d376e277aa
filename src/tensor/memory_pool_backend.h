// What the tagged memory pool needs from a device: virtual ranges whose physical pages
// can be mapped and unmapped in place, host staging buffers, and copies between them.
// The pool's bookkeeping (tags, residency, accounting, reports) is written once over
// this interface; memory_pool_cpu.cpp and memory_pool_cuda.cpp implement it.
// Private to src/tensor: nothing outside the pool includes it.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "tensor/tensor.h"

namespace tandem {

class MemoryPoolBackend {
 public:
  virtual ~MemoryPoolBackend() = default;

  virtual Device device() const = 0;
  virtual std::string device_label() const = 0;  // "cpu", "cuda:0": for messages
  // Every range and mapping is a multiple of this; ranges are aligned to it.
  virtual size_t granularity() const = 0;

  // Address space only, no pages behind it. bytes is a multiple of the granularity.
  virtual void* reserve(size_t bytes) = 0;
  virtual void free_range(void* base, size_t bytes) = 0;
  // Backs the whole range with physical pages, zero-filled when `zeroed` (otherwise the
  // contents are unspecified). Throws std::runtime_error saying why on failure, with no
  // pages left mapped.
  virtual void map(void* base, size_t bytes, bool zeroed) = 0;
  // Gives the physical pages back; the range stays reserved and touching it faults.
  virtual void unmap(void* base, size_t bytes) = 0;

  // Staging memory for offloaded data (pinned on CUDA, so copies run at DMA rate).
  virtual void* host_alloc(size_t bytes) = 0;
  virtual void host_free(void* host, size_t bytes) = 0;

  // Copies are complete when the call returns.
  virtual void copy_to_host(void* host, const void* device, size_t bytes) = 0;
  virtual void copy_to_device(void* device, const void* host, size_t bytes) = 0;

  // Waits for all work already queued on the device, so no kernel still reads or writes
  // pages that are about to be copied or unmapped.
  virtual void wait_for_device() = 0;
};

std::unique_ptr<MemoryPoolBackend> make_cpu_memory_backend();
#ifdef TANDEM_HAVE_CUDA
std::unique_ptr<MemoryPoolBackend> make_cuda_memory_backend(int device_index);
#endif

}  // namespace tandem
