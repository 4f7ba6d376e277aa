#include "world/pinned_memory.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#ifdef TANDEM_HAVE_CUDA
#include "tensor/pinned_host.h"
#endif

namespace tandem {

PinnedMemory::PinnedMemory(size_t bytes, Device device) : bytes_(bytes) {
#ifdef TANDEM_HAVE_CUDA
  if (device == Device::CUDA) {
    data_ = allocate_pinned_host(bytes, /*device_mapped=*/false);
    pinned_ = true;
    return;
  }
#endif
  (void)device;
  // Page-aligned as pinned memory is, so a checkpoint's direct writes read it in place
  // (disk_stream.h) instead of through their staging buffer.
  constexpr size_t kPage = 4096;
  data_ = std::aligned_alloc(kPage, (bytes + kPage - 1) / kPage * kPage);
  if (!data_ && bytes) throw std::runtime_error("cannot allocate " + std::to_string(bytes) + " bytes of host memory");
  // Touched now, as pinned memory is: resident from the start, so the memory plan's
  // baseline (the resident set when it is made) counts it.
  std::memset(data_, 0, bytes);
}

PinnedMemory::~PinnedMemory() {
#ifdef TANDEM_HAVE_CUDA
  if (pinned_) {
    free_pinned_host(data_, bytes_);
    return;
  }
#endif
  std::free(data_);
}

}  // namespace tandem
