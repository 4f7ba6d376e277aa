// Zeroed host memory for a buffer the GPU copies to and from at DMA rate: page-locked
// (allocate_pinned_host) when the job runs on CUDA, plain memory on the CPU backend;
// page-aligned either way.
#pragma once
#include <cstddef>

#include "tensor/tensor.h"

namespace tandem {

class PinnedMemory {
 public:
  // Throws std::runtime_error naming the bytes when the memory cannot be had.
  PinnedMemory(size_t bytes, Device device);
  ~PinnedMemory();
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
};

}  // namespace tandem
