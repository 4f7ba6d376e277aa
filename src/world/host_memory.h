// How much host memory the kernel says a new allocation could still get (MemAvailable),
// and how much of it this process holds resident.
#pragma once
#include <cstddef>

namespace tandem {
// Bytes; throws std::runtime_error when /proc/meminfo cannot be read.
size_t available_host_memory();

// This process's resident memory from /proc/self/status: anonymous pages (heap, pinned
// buffers) and file-backed pages (mapped files, which the kernel can write back and
// reclaim). Bytes; zeros where the kernel does not report them.
struct ResidentMemory {
  size_t anonymous = 0;    // RssAnon
  size_t file_backed = 0;  // RssFile
};
ResidentMemory resident_memory();
}
