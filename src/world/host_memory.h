// How much host memory the kernel says a new allocation could still get (MemAvailable).
#pragma once
#include <cstddef>

namespace tandem {
// Bytes; throws std::runtime_error when /proc/meminfo cannot be read.
size_t available_host_memory();
}
