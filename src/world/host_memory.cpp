#include "world/host_memory.h"

#include <fstream>
#include <stdexcept>
#include <string>

namespace tandem {

size_t available_host_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  size_t kib = 0;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  throw std::runtime_error("cannot read MemAvailable from /proc/meminfo");
}

}  // namespace tandem
