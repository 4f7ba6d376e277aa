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

ResidentMemory resident_memory() {
  std::ifstream status("/proc/self/status");
  ResidentMemory resident;
  std::string line;
  while (std::getline(status, line)) {
    size_t* field = line.rfind("RssAnon:", 0) == 0 ? &resident.anonymous
                    : line.rfind("RssFile:", 0) == 0 ? &resident.file_backed
                                                     : nullptr;
    if (field) *field = std::stoull(line.substr(line.find(':') + 1)) * 1024;  // "  1234 kB"
  }
  return resident;
}

}  // namespace tandem
