// The CPU backend of the memory pool: the "device" is host memory, so the whole
// offload/onload logic runs (and is tested) without a GPU. Physical pages come and go
// under a fixed address with mmap(MAP_FIXED): mapping read-write anonymous memory gives
// fresh zero pages, mapping PROT_NONE over it returns the old pages to the kernel.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "tensor/memory_pool_backend.h"

namespace tandem {

namespace {

std::string errno_text() { return std::strerror(errno); }

// Big copies are split over the OpenMP threads: one core cannot saturate memory bandwidth.
void parallel_copy(void* destination, const void* source, size_t bytes) {
  constexpr size_t kChunk = size_t{8} << 20;
  if (bytes < 2 * kChunk) {
    std::memcpy(destination, source, bytes);
    return;
  }
  const long chunks = static_cast<long>((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (long i = 0; i < chunks; ++i) {
    const size_t offset = static_cast<size_t>(i) * kChunk;
    const size_t length = offset + kChunk <= bytes ? kChunk : bytes - offset;
    std::memcpy(static_cast<char*>(destination) + offset, static_cast<const char*>(source) + offset, length);
  }
}

class CpuMemoryBackend final : public MemoryPoolBackend {
 public:
  Device device() const override { return Device::CPU; }
  std::string device_label() const override { return "cpu"; }
  size_t granularity() const override { return page_size_; }

  void* reserve(size_t bytes) override {
    void* base = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) throw std::runtime_error("mmap reserve of " + std::to_string(bytes) + " bytes: " + errno_text());
    return base;
  }

  void free_range(void* base, size_t bytes) override {
    if (munmap(base, bytes) != 0) throw std::runtime_error("munmap: " + errno_text());
  }

  // Fresh anonymous pages are always zero, so `zeroed` costs nothing here and the pages
  // stay untouched until used. Otherwise the caller is about to copy over every page, so
  // they are populated now in one go, much faster than one fault per page during the copy.
  // Without MAP_NORESERVE the kernel charges the pages now, so an overcommitted host
  // fails here with ENOMEM rather than later in the OOM killer.
  void map(void* base, size_t bytes, bool zeroed) override {
    const int populate = zeroed ? 0 : MAP_POPULATE;
    if (mmap(base, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | populate, -1, 0) == MAP_FAILED)
      throw std::runtime_error("mmap of " + std::to_string(bytes) + " bytes: " + errno_text());
  }

  void unmap(void* base, size_t bytes) override {
    if (mmap(base, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED)
      throw std::runtime_error("mmap PROT_NONE over " + std::to_string(bytes) + " bytes: " + errno_text());
  }

  // Populated up front, like pinned memory: the buffer is really there when accounted,
  // and the copy into it does not fault page by page.
  void* host_alloc(size_t bytes) override {
    void* host = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (host == MAP_FAILED)
      throw std::runtime_error("out of host memory allocating " + std::to_string(bytes) + " bytes: " + errno_text());
    return host;
  }
  void host_free(void* host, size_t bytes) override { free_range(host, bytes); }

  void copy_to_host(void* host, const void* device, size_t bytes) override { parallel_copy(host, device, bytes); }
  void copy_to_device(void* device, const void* host, size_t bytes) override { parallel_copy(device, host, bytes); }

  void wait_for_device() override {}

 private:
  size_t page_size_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
};

}  // namespace

std::unique_ptr<MemoryPoolBackend> make_cpu_memory_backend() { return std::make_unique<CpuMemoryBackend>(); }

}  // namespace tandem
