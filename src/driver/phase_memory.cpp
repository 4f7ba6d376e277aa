#include "driver/phase_memory.h"

#include <algorithm>

#include "world/gpu.h"
#include "world/host_memory.h"

namespace tandem {

PhasePeak largest(const PhasePeak& a, const PhasePeak& b) {
  return {std::max(a.device_pool, b.device_pool), std::max(a.device_used, b.device_used),
          std::max(a.host_pool, b.host_pool), std::max(a.host_rss, b.host_rss)};
}

PhaseMemory::PhaseMemory(MemoryPool& pool) : pool_(pool) {}

PhaseMemory::~PhaseMemory() {
  if (window_ >= 0) pool_.close_peak_window(window_);
}

void PhaseMemory::begin() {
  if (window_ >= 0) pool_.close_peak_window(window_);
  window_ = pool_.open_peak_window();
  peak_ = {};
  rss_reset_ = reset_peak_resident();
  sample();
}

void PhaseMemory::sample() {
  if (pool_.device() == Device::CUDA) peak_.device_used = std::max(peak_.device_used, gpu_used_memory());
  peak_.host_rss = std::max(peak_.host_rss, resident_bytes());
}

PhasePeak PhaseMemory::end() {
  sample();
  const PeakBytes pool_peaks = pool_.close_peak_window(window_);
  window_ = -1;
  peak_.device_pool = pool_peaks.device;
  peak_.host_pool = pool_peaks.host;
  // The kernel's high-water mark also sees what happened between samples.
  if (rss_reset_) peak_.host_rss = std::max(peak_.host_rss, peak_resident_bytes());
  return peak_;
}

void add_phase_metrics(MetricValues& metrics, const std::string& phase, const PhasePeak& peak) {
  const std::string prefix = "memory/phase/" + phase + "/";
  metrics.push_back({prefix + "device_pool_peak", static_cast<double>(peak.device_pool)});
  if (peak.device_used) metrics.push_back({prefix + "device_used_peak", static_cast<double>(peak.device_used)});
  metrics.push_back({prefix + "host_pool_peak", static_cast<double>(peak.host_pool)});
  metrics.push_back({prefix + "host_rss_peak", static_cast<double>(peak.host_rss)});
}

}  // namespace tandem
