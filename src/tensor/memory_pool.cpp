// The tagged memory pool's bookkeeping, written once over MemoryPoolBackend: which
// allocation lives where, the host copies of offloaded ones, the pinned host cache (and
// the thread that fills it ahead of the offloads), and the per-tag accounting of current
// and peak bytes.
#include "tensor/memory_pool.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "tensor/memory_pool_backend.h"

namespace tandem {

namespace {

size_t round_up(size_t bytes, size_t granularity) { return (bytes + granularity - 1) / granularity * granularity; }

std::string bytes_text(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) value /= 1024, ++unit;
  char text[64];
  std::snprintf(text, sizeof text, unit ? "%zu bytes (%.2f %s)" : "%zu bytes", bytes, value, units[unit]);
  return text;
}

// Current bytes and their peak since creation or the last reset.
struct Counter {
  size_t bytes = 0, peak = 0;
  void add(size_t n) { peak = std::max(peak, bytes += n); }
  void remove(size_t n) { bytes -= n; }
  void reset_peak() { peak = bytes; }
};

struct Ledger {
  Counter device, host;
  TagUsage usage() const { return {device.bytes, device.peak, host.bytes, host.peak}; }
};

struct HostBuffer {
  void* data = nullptr;
  size_t capacity = 0;
};

struct Record {
  Allocation allocation;
  HostBuffer backup;  // holds the data while the allocation is Offloaded
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

class TaggedMemoryPool final : public MemoryPool {
 public:
  TaggedMemoryPool(std::unique_ptr<MemoryPoolBackend> backend, const PoolOptions& options)
      : backend_(std::move(backend)), options_(options) {}

  ~TaggedMemoryPool() override {
    filler_.request_stop();
    if (filler_.joinable()) filler_.join();
    try {
      backend_->wait_for_device();
      for (auto& record : records_) free_record(*record);
      free_host_cache();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "memory pool %s: freeing memory at shutdown failed: %s\n", label().c_str(), error.what());
    }
  }

  Device device() const override { return backend_->device(); }
  size_t granularity() const override { return backend_->granularity(); }

  Allocation* allocate(Tag tag, size_t bytes, const std::string& name) override {
    std::lock_guard lock(mutex_);
    auto record = std::make_unique<Record>();
    Allocation& allocation = record->allocation;
    allocation = Allocation{nullptr, bytes, round_up(bytes, granularity()), tag, name, Residency::Resident};
    const std::string what = describe(allocation);
    if (bytes == 0) throw std::invalid_argument("memory pool " + label() + ": allocation " + what + " is empty");
    if (tag_name(tag) == kPinnedCacheName)
      throw std::invalid_argument("memory pool " + label() + ": allocation " + what + ": the tag name " +
                                  kPinnedCacheName + " is reserved for the pinned host cache");
    const bool deferred = deferred_.count(tag.id) > 0;
    if (!deferred) require_capacity(allocation.mapped_bytes, "allocate " + what);
    try {
      allocation.ptr = backend_->reserve(allocation.mapped_bytes);
      if (!deferred) backend_->map(allocation.ptr, allocation.mapped_bytes, /*zeroed=*/true);
    } catch (const std::exception& error) {
      if (allocation.ptr) backend_->free_range(allocation.ptr, allocation.mapped_bytes);
      throw std::runtime_error("memory pool " + label() + ": cannot allocate " + what + ": " + error.what());
    }
    ledgers_[tag.id];  // a deferred tag is listed in the stats from its first allocation on
    if (deferred)
      allocation.residency = Residency::Dropped;
    else
      add_device(tag, allocation.mapped_bytes);
    records_.push_back(std::move(record));
    return &allocation;
  }

  const void* readable_data(const Allocation* allocation) const override {
    std::lock_guard lock(mutex_);
    const auto found = find_record(allocation);
    if (found == records_.end())
      throw std::invalid_argument("memory pool " + label() + ": readable_data of an unknown allocation");
    switch (allocation->residency) {
      case Residency::Resident: return allocation->ptr;
      case Residency::Offloaded: return (*found)->backup.data;
      case Residency::Dropped: break;
    }
    throw std::runtime_error("memory pool " + label() + ": allocation " + describe(*allocation) +
                             " was dropped; its contents must be rebuilt before they can be read");
  }

  void release(Allocation* allocation) override {
    std::lock_guard lock(mutex_);
    const auto found = find_record(allocation);
    if (found == records_.end()) {
      char address[32];
      std::snprintf(address, sizeof address, "%p", static_cast<void*>(allocation));
      throw std::invalid_argument("memory pool " + label() + ": release of an unknown allocation at " + address +
                                  " (not from this pool, or already released)");
    }
    if ((*found)->allocation.residency == Residency::Resident) backend_->wait_for_device();
    free_record(**found);
    records_.erase(found);
  }

  TransferReport offload(Tag tag) override {
    std::unique_lock lock(mutex_);
    const auto start = Clock::now();
    TransferReport report;
    report.tag = tag_name(tag);
    bool waited = false;
    // By index (records stay where they are): while an offload waits for the filler, the
    // pool is open to other callers, which may allocate.
    for (size_t i = 0; i < records_.size(); ++i) {
      Record* record = records_[i].get();
      Allocation& allocation = record->allocation;
      if (allocation.tag != tag || allocation.residency != Residency::Resident) continue;
      if (!std::exchange(waited, true)) backend_->wait_for_device();
      HostBuffer buffer = take_host_buffer(allocation.mapped_bytes, "offload " + describe(allocation), lock);
      add_host(tag, buffer.capacity);
      try {
        backend_->copy_to_host(buffer.data, allocation.ptr, allocation.bytes);
        backend_->unmap(allocation.ptr, allocation.mapped_bytes);
      } catch (const std::exception& error) {
        return_host_buffer(buffer, tag);
        throw std::runtime_error("memory pool " + label() + ": offload of " + describe(allocation) + ": " + error.what());
      }
      record->backup = buffer;
      allocation.residency = Residency::Offloaded;
      remove_device(tag, allocation.mapped_bytes);
      report.bytes += allocation.bytes;
      report.device_bytes += allocation.mapped_bytes;
      ++report.allocations;
    }
    report.seconds = seconds_since(start);
    return report;
  }

  TransferReport drop(Tag tag) override {
    std::lock_guard lock(mutex_);
    const auto start = Clock::now();
    TransferReport report;
    report.tag = tag_name(tag);
    bool waited = false;
    for (auto& record : records_) {
      Allocation& allocation = record->allocation;
      if (allocation.tag != tag || allocation.residency == Residency::Dropped) continue;
      if (allocation.residency == Residency::Resident) {
        if (!std::exchange(waited, true)) backend_->wait_for_device();
        try {
          backend_->unmap(allocation.ptr, allocation.mapped_bytes);
        } catch (const std::exception& error) {
          throw std::runtime_error("memory pool " + label() + ": drop of " + describe(allocation) + ": " + error.what());
        }
        remove_device(tag, allocation.mapped_bytes);
        report.device_bytes += allocation.mapped_bytes;
      } else {
        return_host_buffer(std::exchange(record->backup, {}), tag);
      }
      allocation.residency = Residency::Dropped;
      ++report.allocations;
    }
    report.seconds = seconds_since(start);
    return report;
  }

  TransferReport onload(Tag tag) override {
    std::lock_guard lock(mutex_);
    const auto start = Clock::now();
    TransferReport report;
    report.tag = tag_name(tag);
    for (auto& record : records_) {
      Allocation& allocation = record->allocation;
      if (allocation.tag != tag || allocation.residency == Residency::Resident) continue;
      const bool dropped = allocation.residency == Residency::Dropped;
      require_capacity(allocation.mapped_bytes, "onload " + describe(allocation));
      try {
        backend_->map(allocation.ptr, allocation.mapped_bytes, /*zeroed=*/dropped);
      } catch (const std::exception& error) {
        throw std::runtime_error("memory pool " + label() + ": onload of " + describe(allocation) + ": " + error.what());
      }
      add_device(tag, allocation.mapped_bytes);
      if (dropped) {
        report.rebuild.push_back(allocation.name);
      } else {
        try {
          backend_->copy_to_device(allocation.ptr, record->backup.data, allocation.bytes);
        } catch (const std::exception& error) {
          backend_->unmap(allocation.ptr, allocation.mapped_bytes);
          remove_device(tag, allocation.mapped_bytes);
          throw std::runtime_error("memory pool " + label() + ": onload of " + describe(allocation) + ": " + error.what());
        }
        return_host_buffer(std::exchange(record->backup, {}), tag);
        report.bytes += allocation.bytes;
      }
      allocation.residency = Residency::Resident;
      report.device_bytes += allocation.mapped_bytes;
      ++report.allocations;
    }
    report.seconds = seconds_since(start);
    return report;
  }

  MemoryStats stats() const override {
    std::lock_guard lock(mutex_);
    MemoryStats stats;
    for (const auto& [id, ledger] : ledgers_) stats.per_tag[tag_name(Tag{id})] = ledger.usage();
    if (cache_used_) stats.per_tag[kPinnedCacheName] = cache_ledger_.usage();
    stats.device_bytes = device_total_.bytes;
    stats.device_peak = device_total_.peak;
    stats.host_bytes = host_total_.bytes;
    stats.host_peak = host_total_.peak;
    stats.offload_host_allocations = offload_host_allocations_;
    return stats;
  }

  void set_deferred(Tag tag, bool deferred) override {
    std::lock_guard lock(mutex_);
    if (deferred)
      deferred_.insert(tag.id);
    else
      deferred_.erase(tag.id);
  }

  int open_peak_window() override {
    std::lock_guard lock(mutex_);
    windows_[next_window_] = PeakBytes{device_total_.bytes, host_total_.bytes};
    return next_window_++;
  }

  PeakBytes peak_window(int id) const override {
    std::lock_guard lock(mutex_);
    return window(id);
  }

  PeakBytes close_peak_window(int id) override {
    std::lock_guard lock(mutex_);
    const PeakBytes peaks = window(id);
    windows_.erase(id);
    return peaks;
  }

  void reset_peaks() override {
    std::lock_guard lock(mutex_);
    for (auto& [id, ledger] : ledgers_) ledger.device.reset_peak(), ledger.host.reset_peak();
    cache_ledger_.host.reset_peak();
    device_total_.reset_peak();
    host_total_.reset_peak();
  }

  void fill_host_cache(const std::vector<size_t>& capacities) override {
    std::lock_guard lock(mutex_);
    if (!options_.pinned_host_cache)
      throw std::invalid_argument("memory pool " + label() + ": fill_host_cache without a pinned host cache");
    for (size_t capacity : capacities) {
      fill_queue_.push_back(capacity);
      filling_.insert(capacity);
    }
    if (filler_running_ || fill_queue_.empty()) return;
    if (filler_.joinable()) filler_.join();  // done: it clears filler_running_ as its last step
    filler_running_ = true;
    filler_ = std::jthread([this](std::stop_token stop) { fill_from_queue(stop); });
  }

  void wait_for_host_cache_fill() override { lock_once_filled(); }

  size_t trim_host_cache() override {
    const std::unique_lock lock = lock_once_filled();
    return free_host_cache();
  }

  std::vector<const Allocation*> allocations() const override {
    std::lock_guard lock(mutex_);
    std::vector<const Allocation*> list;
    for (const auto& record : records_) list.push_back(&record->allocation);
    return list;
  }

 private:
  std::string label() const { return backend_->device_label(); }

  std::vector<std::unique_ptr<Record>>::const_iterator find_record(const Allocation* allocation) const {
    return std::find_if(records_.begin(), records_.end(),
                        [&](const auto& record) { return &record->allocation == allocation; });
  }

  static std::string describe(const Allocation& allocation) {
    return "'" + allocation.name + "' (tag " + tag_name(allocation.tag) + ", " + bytes_text(allocation.bytes) + ")";
  }

  void require_capacity(size_t mapped, const std::string& what) const {
    const size_t capacity = options_.device_capacity;
    if (capacity == 0 || device_total_.bytes + mapped <= capacity) return;
    std::string held;
    for (const auto& [id, ledger] : ledgers_)
      if (ledger.device.bytes) held += std::string(held.empty() ? "" : ", ") + tag_name(Tag{id}) + " " + bytes_text(ledger.device.bytes);
    throw std::runtime_error("memory pool " + label() + ": out of device memory: " + what + " needs " + bytes_text(mapped) +
                             " mapped but only " + bytes_text(capacity - device_total_.bytes) + " of the capacity of " +
                             bytes_text(capacity) + " are free (held: " + (held.empty() ? "nothing" : held) + ")");
  }

  const PeakBytes& window(int id) const {
    const auto found = windows_.find(id);
    if (found == windows_.end())
      throw std::invalid_argument("memory pool " + label() + ": no open peak window " + std::to_string(id));
    return found->second;
  }

  void add_device(Tag tag, size_t bytes) {
    ledgers_[tag.id].device.add(bytes);
    device_total_.add(bytes);
    for (auto& [id, peaks] : windows_) peaks.device = std::max(peaks.device, device_total_.bytes);
  }

  void add_host_total(size_t bytes) {
    host_total_.add(bytes);
    for (auto& [id, peaks] : windows_) peaks.host = std::max(peaks.host, host_total_.bytes);
  }

  void add_host(Tag tag, size_t bytes) {
    ledgers_[tag.id].host.add(bytes);
    add_host_total(bytes);
  }

  void remove_device(Tag tag, size_t bytes) {
    ledgers_[tag.id].device.remove(bytes);
    device_total_.remove(bytes);
  }

  // The pool's lock, taken once the filler has allocated (or failed) all it was given.
  std::unique_lock<std::mutex> lock_once_filled() {
    std::unique_lock lock(mutex_);
    cache_changed_.wait(lock, [&] { return !filler_running_; });
    return lock;
  }

  // The filler: allocates the queued capacities one by one, outside the pool's lock (an
  // allocation of GBs takes a good part of a second), each added to the cache as it is
  // ready. Stops early only when the pool goes away.
  void fill_from_queue(const std::stop_token& stop) {
    for (;;) {
      size_t capacity = 0;
      {
        std::lock_guard lock(mutex_);
        if (fill_queue_.empty() || stop.stop_requested()) {
          fill_queue_.clear();
          filling_.clear();
          filler_running_ = false;
          cache_changed_.notify_all();
          return;
        }
        capacity = fill_queue_.front();
        fill_queue_.pop_front();
      }
      void* data = nullptr;
      std::string failure;
      try {
        data = backend_->host_alloc(capacity);
      } catch (const std::exception& error) {
        failure = error.what();
      }
      std::lock_guard lock(mutex_);
      filling_.erase(filling_.find(capacity));
      if (data) {
        host_cache_.emplace(capacity, data);
        cache_used_ = true;
        cache_ledger_.host.add(capacity);
        add_host_total(capacity);
      } else if (fill_failure_.empty()) {
        fill_failure_ = failure;
      }
      cache_changed_.notify_all();
    }
  }

  // The smallest cached buffer that holds the data is reused, however much larger: the
  // handoff plans never hold both sides' copies on the host at once (in gpu peak mode),
  // so the trainer's buffers serve the engine's weights and host memory stays at the
  // larger side. When the best fit is still being filled in, it is waited for: taking
  // another would leave the buffer that was meant for it to the next offload, one the
  // plan did not allocate it for. Otherwise a new one is allocated, after giving the cache
  // back to the system if memory is short.
  HostBuffer take_host_buffer(size_t capacity, const std::string& what, std::unique_lock<std::mutex>& lock) {
    if (options_.pinned_host_cache) {
      cache_changed_.wait(lock, [&] {
        const auto ready = host_cache_.lower_bound(capacity);
        const auto coming = filling_.lower_bound(capacity);
        return coming == filling_.end() || (ready != host_cache_.end() && ready->first <= *coming);
      });
      if (!fill_failure_.empty())
        throw std::runtime_error("memory pool " + label() + ": " + what + ": filling the pinned host cache failed: " +
                                 std::exchange(fill_failure_, std::string()));
      const auto fit = host_cache_.lower_bound(capacity);
      if (fit != host_cache_.end()) {
        HostBuffer buffer{fit->second, fit->first};
        host_cache_.erase(fit);
        cache_ledger_.host.remove(buffer.capacity);
        host_total_.remove(buffer.capacity);
        return buffer;
      }
    }
    ++offload_host_allocations_;
    try {
      return HostBuffer{backend_->host_alloc(capacity), capacity};
    } catch (const std::exception& first_error) {
      if (host_cache_.empty())
        throw std::runtime_error("memory pool " + label() + ": " + what + ": " + first_error.what());
    }
    free_host_cache();
    try {
      return HostBuffer{backend_->host_alloc(capacity), capacity};
    } catch (const std::exception& error) {
      throw std::runtime_error("memory pool " + label() + ": " + what + " (after emptying the host cache): " + error.what());
    }
  }

  void return_host_buffer(HostBuffer buffer, Tag owner) {
    ledgers_[owner.id].host.remove(buffer.capacity);
    host_total_.remove(buffer.capacity);
    if (!options_.pinned_host_cache) {
      backend_->host_free(buffer.data, buffer.capacity);
      return;
    }
    host_cache_.emplace(buffer.capacity, buffer.data);
    cache_used_ = true;
    cache_ledger_.host.add(buffer.capacity);
    add_host_total(buffer.capacity);
  }

  size_t free_host_cache() {
    size_t freed = 0;
    for (const auto& [capacity, data] : host_cache_) {
      backend_->host_free(data, capacity);
      freed += capacity;
    }
    host_cache_.clear();
    cache_ledger_.host.remove(freed);
    host_total_.remove(freed);
    return freed;
  }

  // Gives back everything the record holds; the caller has waited for the device.
  void free_record(Record& record) {
    Allocation& allocation = record.allocation;
    if (allocation.residency == Residency::Resident) {
      backend_->unmap(allocation.ptr, allocation.mapped_bytes);
      remove_device(allocation.tag, allocation.mapped_bytes);
    } else if (allocation.residency == Residency::Offloaded) {
      return_host_buffer(std::exchange(record.backup, {}), allocation.tag);
    }
    backend_->free_range(allocation.ptr, allocation.mapped_bytes);
  }

  std::unique_ptr<MemoryPoolBackend> backend_;
  PoolOptions options_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Record>> records_;  // in allocation order
  std::map<int, Ledger> ledgers_;                 // by tag id: every tag ever used
  Ledger cache_ledger_;                           // host bytes held by the pinned cache
  bool cache_used_ = false;
  Counter device_total_, host_total_;
  std::set<int> deferred_;                        // tag ids whose new allocations start Dropped
  std::map<int, PeakBytes> windows_;              // open peak windows by id
  int next_window_ = 0;
  std::multimap<size_t, void*> host_cache_;       // capacity -> buffer
  size_t offload_host_allocations_ = 0;
  // fill_host_cache: the capacities still to allocate, those not yet in the cache (the
  // queue's and the one being allocated), whether the filler runs, and its first failure.
  std::deque<size_t> fill_queue_;
  std::multiset<size_t> filling_;
  bool filler_running_ = false;
  std::string fill_failure_;
  std::condition_variable cache_changed_;  // a buffer came into the cache, or the filler stopped
  std::jthread filler_;                   // last: joined before the rest goes
};

}  // namespace

std::unique_ptr<MemoryPool> MemoryPool::create(Device device, int device_index, const PoolOptions& options) {
  if (device == Device::CPU) return std::make_unique<TaggedMemoryPool>(make_cpu_memory_backend(), options);
#ifdef TANDEM_HAVE_CUDA
  return std::make_unique<TaggedMemoryPool>(make_cuda_memory_backend(device_index), options);
#else
  (void)device_index;
  throw std::invalid_argument("memory pool: this build has no CUDA backend (configure with -DTANDEM_CUDA=ON)");
#endif
}

}  // namespace tandem
