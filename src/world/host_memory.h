// What the kernel says about host memory: what a new allocation could still get, the
// limit this job runs under, and this process's resident set (now and its peak).
#pragma once
#include <cstddef>

namespace tandem {
// MemAvailable, in bytes; throws std::runtime_error when /proc/meminfo cannot be read.
size_t available_host_memory();
// The memory limit of this process's cgroup (cgroup v2 memory.max, or v1
// memory.limit_in_bytes) when it has one, otherwise MemTotal.
size_t host_memory_limit();
// VmRSS and VmHWM of this process; throw when /proc/self/status cannot be read.
size_t resident_bytes();
size_t peak_resident_bytes();
// Restarts VmHWM from the current resident set (/proc/self/clear_refs); false where the
// kernel does not allow it (then peak_resident_bytes() keeps the all-time peak).
bool reset_peak_resident();
}  // namespace tandem
