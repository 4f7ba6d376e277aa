// The tagged memory pool. Every allocation carries a tag (weights, kv_cache, ...); a
// whole tag can be offloaded to pinned host memory and onloaded back, or dropped when it
// holds derived data that is cheaper to rebuild than to copy. Addresses are stable:
// each allocation reserves its virtual range once and only its physical pages come and
// go (CUDA virtual memory on the GPU, mmap on the CPU backend), so raw
// pointers, Tensor views and captured CUDA graphs survive an offload/onload cycle.
//
// Allocations are meant to be few and large (llm.c style: one slab per tag and owner,
// tensors carved out of it), since each is rounded up to the mapping granularity
// (2 MiB on the H200, the page size on the CPU).
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensor/memory_tag.h"
#include "tensor/tensor.h"

namespace tandem {

enum class Residency { Resident, Offloaded, Dropped };

struct Allocation {
  void* ptr = nullptr;       // stable for the allocation's lifetime
  size_t bytes = 0;          // as requested
  size_t mapped_bytes = 0;   // rounded up to the granularity: what the device really holds
  Tag tag{};
  std::string name;
  Residency residency = Residency::Resident;
};

struct TagUsage {
  size_t device_bytes = 0, device_peak = 0;
  size_t host_bytes = 0, host_peak = 0;
};

// The most bytes a peak window saw, device and host, totals over every tag.
struct PeakBytes {
  size_t device = 0, host = 0;
};

struct MemoryStats {
  std::map<std::string, TagUsage> per_tag;  // by tag name, every tag ever used
  size_t device_bytes = 0, device_peak = 0;  // sums over tags; peak of the sum
  size_t host_bytes = 0, host_peak = 0;
  // Host buffers an offload had to allocate itself (none in the pinned host cache fitted):
  // each costs the offload the allocation's time, which fill_host_cache moves off it.
  size_t offload_host_allocations = 0;
};

// What an offload, onload or drop did.
struct TransferReport {
  std::string tag;
  size_t bytes = 0;                  // bytes copied between device and host
  size_t device_bytes = 0;           // device bytes unmapped (offload, drop) or mapped (onload)
  size_t allocations = 0;            // allocations touched
  double seconds = 0;
  std::vector<std::string> rebuild;  // onload of dropped allocations: names to recompute
  double gb_per_s() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
};

// Host buffers that hold offloaded data are accounted under this name in
// MemoryStats::per_tag while the pinned host cache keeps them for reuse.
inline constexpr const char* kPinnedCacheName = "pinned_cache";

struct PoolOptions {
  // Keep the host buffers that onload frees and hand them to the next offload they can
  // hold (the smallest that fits, whatever its size): allocating GBs of pinned memory
  // costs far more than copying into it, and a buffer that held the trainer's state can
  // then hold the engine's weights, so the host never holds more than the larger side.
  bool pinned_host_cache = true;
  // Refuse to map more than this many device bytes (0: only the device's own limit).
  // Lets the CPU backend play a GPU of a given size, and caps the pool's share of one.
  size_t device_capacity = 0;
};

class MemoryPool {
 public:
  // device_index is ignored for Device::CPU.
  static std::unique_ptr<MemoryPool> create(Device device, int device_index = 0,
                                            const PoolOptions& options = {});
  virtual ~MemoryPool() = default;

  virtual Device device() const = 0;
  virtual size_t granularity() const = 0;

  // Contents start zeroed. Throws std::runtime_error (naming tag, name and bytes) on OOM.
  virtual Allocation* allocate(Tag tag, size_t bytes, const std::string& name) = 0;
  // Frees the allocation wherever it lives. Throws std::invalid_argument for a pointer
  // this pool did not hand out (or already released).
  virtual void release(Allocation* allocation) = 0;

  // Copy every resident allocation of the tag to pinned host memory, then unmap its
  // device pages. No-op for allocations already off the device.
  virtual TransferReport offload(Tag tag) = 0;
  // Unmap the device pages without copying (derived or discardable data). Offloaded
  // allocations of the tag lose their host copy too: the tag's contents are given up.
  virtual TransferReport drop(Tag tag) = 0;
  // Map pages back at the same addresses; offloaded data is copied back and its host
  // copy freed (or kept in the pinned host cache), dropped data comes back zeroed and is
  // listed in TransferReport::rebuild.
  // Nothing off the device: a no-op.
  virtual TransferReport onload(Tag tag) = 0;

  // Where the allocation's bytes can be read now without moving them: its device address
  // when resident, its pinned host copy when offloaded (on CUDA the copy is mapped into
  // the device's address space, so kernels read it over the bus). Lets the in-process
  // weight sync read a sleeping trainer's weights. Throws for dropped allocations.
  virtual const void* readable_data(const Allocation* allocation) const = 0;

  // New allocations of a deferred tag get their address range but no pages: they start
  // Dropped, and their first onload maps them (zeroed). Lets a job lay out every buffer
  // at start-up while mapping only what its first phase holds.
  virtual void set_deferred(Tag tag, bool deferred) = 0;

  virtual MemoryStats stats() const = 0;
  // Every peak (per tag and of the sums) restarts from the current bytes.
  virtual void reset_peaks() = 0;
  // A peak window follows the device and host totals from now on, on its own: neither
  // reset_peaks() nor another window touches it, so phases can each have their peak.
  virtual int open_peak_window() = 0;
  // The window's peaks so far; closing forgets it. Throws for an unknown id.
  virtual PeakBytes peak_window(int id) const = 0;
  virtual PeakBytes close_peak_window(int id) = 0;
  // Allocates host buffers of these capacities into the pinned host cache, in order, on a
  // thread of the pool's own, and returns at once (a later call queues behind an earlier
  // one). An offload whose best fit is still being allocated waits for it rather than
  // allocating its own, so a job can have the handoffs' buffers allocated beside its
  // start-up. A failed allocation is rethrown by the next offload. Throws
  // std::invalid_argument when the pool has no pinned host cache.
  virtual void fill_host_cache(const std::vector<size_t>& capacities) = 0;
  // Frees every cached host buffer (after a fill in progress); returns the bytes given
  // back to the system.
  virtual size_t trim_host_cache() = 0;
  virtual std::vector<const Allocation*> allocations() const = 0;
};

}  // namespace tandem
