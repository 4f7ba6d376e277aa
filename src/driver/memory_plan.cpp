#include "driver/memory_plan.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "world/gpu.h"
#include "world/host_memory.h"
#include "world/table.h"

namespace tandem {

namespace {

// The pool's accounting, replayed: residency per allocation, device and host bytes, and
// the pinned host cache buffer by buffer (which one serves which offload), starting with
// the buffers `filled` into it.
class Ledger {
 public:
  Ledger(const std::vector<const Allocation*>& allocations, bool pinned_host_cache, const std::vector<size_t>& filled)
      : cache_(pinned_host_cache), free_(filled.begin(), filled.end()) {
    host_ = std::accumulate(filled.begin(), filled.end(), size_t{0});
    for (const Allocation* allocation : allocations) {
      const bool offloaded = allocation->residency == Residency::Offloaded;
      entries_.push_back({allocation->tag, allocation->mapped_bytes, allocation->residency,
                          offloaded ? allocation->mapped_bytes : 0});
      if (allocation->residency == Residency::Resident) device_ += allocation->mapped_bytes;
      if (offloaded) host_ += allocation->mapped_bytes;
    }
    begin_phase();
  }

  void begin_phase() { peak_ = {device_, host_}; }
  PeakBytes phase_peak() const { return peak_; }

  // Per allocation in pool order, as the pool moves them: the host buffer is taken before
  // the device pages go, the device pages come before the host buffer is given back.
  void apply(const TagOperation& operation) {
    for (Entry& entry : entries_) {
      if (entry.tag != operation.tag) continue;
      switch (operation.move) {
        case TagMove::Drop:
          if (entry.residency == Residency::Resident) device_ -= entry.bytes;
          if (entry.residency == Residency::Offloaded) release_host(entry);
          entry.residency = Residency::Dropped;
          break;
        case TagMove::Offload:
          if (entry.residency != Residency::Resident) break;
          take_host(entry);
          device_ -= entry.bytes;
          entry.residency = Residency::Offloaded;
          break;
        case TagMove::Onload:
          if (entry.residency == Residency::Resident) break;
          device_ += entry.bytes;
          peak_.device = std::max(peak_.device, device_);
          if (entry.residency == Residency::Offloaded) release_host(entry);
          entry.residency = Residency::Resident;
          break;
      }
    }
  }

  // The host buffers offloads allocated because none in the cache fitted, in order.
  const std::vector<size_t>& allocated() const { return allocated_; }

 private:
  struct Entry {
    Tag tag;
    size_t bytes;
    Residency residency;
    size_t host_buffer;  // the capacity of the host buffer holding it while Offloaded
  };
  // As the pool does: the smallest cached buffer that fits, else a new one of the size.
  void take_host(Entry& entry) {
    const auto fit = cache_ ? free_.lower_bound(entry.bytes) : free_.end();
    if (fit != free_.end()) {
      entry.host_buffer = *fit;
      free_.erase(fit);
    } else {
      entry.host_buffer = entry.bytes;
      allocated_.push_back(entry.bytes);
      host_ += entry.bytes;
      peak_.host = std::max(peak_.host, host_);
    }
  }
  // With the cache the buffer stays for a later offload; without, it goes.
  void release_host(Entry& entry) {
    if (cache_)
      free_.insert(entry.host_buffer);
    else
      host_ -= entry.host_buffer;
  }

  bool cache_;
  std::multiset<size_t> free_;  // the cache's buffers by capacity
  std::vector<Entry> entries_;
  std::vector<size_t> allocated_;
  size_t device_ = 0, host_ = 0;
  PeakBytes peak_;
};

size_t device_bytes(const std::vector<const Allocation*>& allocations) {
  size_t bytes = 0;
  for (const Allocation* allocation : allocations)
    if (allocation->residency == Residency::Resident) bytes += allocation->mapped_bytes;
  return bytes;
}

// Start-up (the start-up and first before-sync plans), then two steps: the second one
// starts with the host buffers the first one left, and its phases are the prediction.
std::vector<PhasePrediction> replay(Ledger& ledger, const HandoffConfig& config, Device device,
                                    const MemoryBaseline& baseline) {
  const auto predicted = [&](const std::string& phase) {
    const PeakBytes pool = ledger.phase_peak();
    PhasePeak peak;
    peak.device_pool = pool.device;
    peak.host_pool = pool.host;
    if (device == Device::CUDA) peak.device_used = pool.device + baseline.device_other;
    // The CPU backend's device memory is host memory too.
    peak.host_rss = baseline.host_other + pool.host + (device == Device::CPU ? pool.device : 0);
    return PhasePrediction{phase, peak};
  };
  const auto run = [&](HandoffPoint point) {
    for (HandoffAction action : handoff_plan(config.peak_device, point))
      for (const TagOperation& operation : handoff_operations(action, config)) ledger.apply(operation);
  };
  ledger.begin_phase();
  run(HandoffPoint::Startup);
  run(HandoffPoint::BeforeSync);
  std::vector<PhasePrediction> phases = {predicted("startup")};
  std::vector<PhasePrediction> step;
  for (int s = 0; s < 2; ++s) {
    step.clear();
    ledger.begin_phase();
    step.push_back(predicted("rollout"));
    ledger.begin_phase();
    run(HandoffPoint::AfterGenerate);
    step.push_back(predicted("after_generate"));
    ledger.begin_phase();
    step.push_back(predicted("train"));
    ledger.begin_phase();
    run(HandoffPoint::BeforeSync);
    step.push_back(predicted("before_sync"));
  }
  for (PhasePrediction& phase : step) phase.peak.host_rss += baseline.checkpoint_snapshot;
  phases.insert(phases.end(), step.begin(), step.end());
  return phases;
}

std::string ratio_text(size_t measured, size_t predicted) {
  if (predicted == 0) return measured == 0 ? "-" : "?";
  return format_fixed(static_cast<double>(measured) / static_cast<double>(predicted), 3);
}

}  // namespace

MemoryPlan::MemoryPlan(const std::vector<const Allocation*>& allocations, const HandoffConfig& config, Device device,
                       bool pinned_host_cache, MemoryBaseline baseline)
    : device_(device) {
  for (const Allocation* allocation : allocations)
    if (allocation->tag == tags::derived) derived_bytes_ += allocation->bytes;
  // With the cache, every host buffer the handoffs would allocate is filled in at start-up:
  // replayed until the handoffs, with those buffers in the cache, allocate none (a buffer
  // taken for one offload may leave another without a fit, so once may not be enough).
  std::vector<size_t> filled;
  for (;;) {
    Ledger ledger(allocations, pinned_host_cache, filled);
    phases_ = replay(ledger, config, device, baseline);
    if (!pinned_host_cache || ledger.allocated().empty()) break;
    filled.insert(filled.end(), ledger.allocated().begin(), ledger.allocated().end());
  }
  // Beside the start-up staging, as many of them (in order) as keep the host within what
  // start-up holds anyway once they are all there; the rest once the staging is gone.
  const size_t total = std::accumulate(filled.begin(), filled.end(), size_t{0});
  size_t beside = 0;
  for (size_t capacity : filled) {
    const bool fits = fill_.after_staging.empty() && baseline.startup_staging + beside + capacity <= total;
    (fits ? fill_.beside_staging : fill_.after_staging).push_back(capacity);
    if (fits) beside += capacity;
  }
  // Start-up holds the staged weights (and, on the CPU backend, the laid-out device
  // memory) and the buffers filled beside them for a moment.
  const size_t laid_out = device == Device::CPU ? device_bytes(allocations) : 0;
  size_t& startup_rss = phases_.front().peak.host_rss;
  startup_rss = std::max(startup_rss, baseline.host_other + baseline.startup_staging + beside + laid_out);
}

const PhasePrediction& MemoryPlan::host_peak() const {
  return *std::max_element(phases_.begin(), phases_.end(), [](const PhasePrediction& a, const PhasePrediction& b) {
    return a.peak.host_rss < b.peak.host_rss;
  });
}

std::string MemoryPlan::table() const {
  std::vector<std::vector<std::string>> rows;
  for (const PhasePrediction& p : phases_)
    rows.push_back({p.phase, format_bytes(static_cast<double>(p.peak.device_pool)),
                    device_ == Device::CUDA ? format_bytes(static_cast<double>(p.peak.device_used)) : "-",
                    format_bytes(static_cast<double>(p.peak.host_pool)), format_bytes(static_cast<double>(p.peak.host_rss))});
  return "memory plan (predicted peaks per phase)\n" +
         format_table({"phase", "device pool", "device used", "host pool", "host resident"}, rows) +
         "derived copies dropped instead of offloaded: " + format_bytes(static_cast<double>(derived_bytes_)) +
         " per offload (with them the handoff would move " + format_bytes(2.0 * static_cast<double>(derived_bytes_)) +
         " more per step)\n";
}

std::string MemoryPlan::comparison(const std::map<std::string, PhasePeak>& measured, size_t derived_not_copied) const {
  std::vector<std::vector<std::string>> rows;
  for (const PhasePrediction& p : phases_) {
    const auto found = measured.find(p.phase);
    if (found == measured.end()) continue;
    const PhasePeak& m = found->second;
    const auto pair = [](size_t predicted, size_t measured_bytes) {
      return format_bytes(static_cast<double>(predicted)) + " / " + format_bytes(static_cast<double>(measured_bytes)) +
             " (" + ratio_text(measured_bytes, predicted) + ")";
    };
    rows.push_back({p.phase, pair(p.peak.device_pool, m.device_pool),
                    device_ == Device::CUDA ? pair(p.peak.device_used, m.device_used) : "-",
                    pair(p.peak.host_pool, m.host_pool), pair(p.peak.host_rss, m.host_rss)});
  }
  return "memory: predicted / measured peak (measured / predicted)\n" +
         format_table({"phase", "device pool", "device used", "host pool", "host resident"}, rows) +
         "derived copies not copied per offload: predicted " + format_bytes(static_cast<double>(derived_bytes_)) +
         ", measured " + format_bytes(static_cast<double>(derived_not_copied)) + "\n";
}

MemoryBaseline measure_baseline(const MemoryPool& pool) {
  const MemoryStats stats = pool.stats();
  const bool cuda = pool.device() == Device::CUDA;
  const size_t pool_resident = stats.host_bytes + (cuda ? 0 : stats.device_bytes);
  const size_t resident = resident_bytes();
  MemoryBaseline baseline;
  baseline.host_other = resident > pool_resident ? resident - pool_resident : 0;
  if (cuda) baseline.device_other = gpu_used_memory() - std::min(gpu_used_memory(), stats.device_bytes);
  return baseline;
}

void check_host_limit(const MemoryPlan& plan, size_t limit, const Source& limit_source, MPI_Comm comm) {
  if (limit == 0) limit = host_memory_limit();
  const PhasePrediction& top = plan.host_peak();
  // The ranks of a node share its host memory: their peaks add up.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  unsigned long long on_node = top.peak.host_rss;
  int ranks_on_node = 1;
  MPI_Allreduce(MPI_IN_PLACE, &on_node, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, node);
  MPI_Comm_size(node, &ranks_on_node);
  MPI_Comm_free(&node);
  unsigned long long over = on_node > limit ? on_node : 0;
  MPI_Allreduce(MPI_IN_PLACE, &over, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm);
  if (over == 0) return;
  throw DeckError(limit_source, "memory.host-limit",
                  "the memory plan's host peak is " + std::to_string(over) + " bytes (" +
                      format_bytes(static_cast<double>(over)) + ", phase " + top.phase + ", resident sets of the " +
                      std::to_string(ranks_on_node) + " ranks of a node), above the limit of " + std::to_string(limit) +
                      " bytes (" + format_bytes(static_cast<double>(limit)) +
                      "); raise memory.host-limit, or lower the host peak (colocate-memory-peak-device = gpu, "
                      "sync.transport = alias, offload-train = false)");
}

}  // namespace tandem
