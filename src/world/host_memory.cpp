#include "world/host_memory.h"

#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

namespace tandem {

namespace {

// The value of `key` (in kB) of a /proc file of "Key: value kB" lines, in bytes.
size_t proc_kib(const char* path, const std::string& key) {
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    std::istringstream fields(line);
    std::string name;
    size_t kib = 0;
    if (fields >> name >> kib && name == key) return kib * 1024;
  }
  throw std::runtime_error("cannot read " + key + " from " + path);
}

// The cgroup a line of /proc/self/cgroup names ("0::/path" for v2, "N:memory:/path" for v1).
size_t cgroup_limit() {
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroups, line)) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    const bool v2 = controllers.empty();
    if (!v2 && controllers.find("memory") == std::string::npos) continue;
    // Inside a container the cgroup's own files are usually mounted at the root.
    for (const std::string& base : {"/sys/fs/cgroup" + std::string(v2 ? "" : "/memory") + path,
                                    "/sys/fs/cgroup" + std::string(v2 ? "" : "/memory")}) {
      std::ifstream limit(base + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
      std::string text;
      if (!(limit >> text)) continue;
      if (text == "max") return 0;
      const unsigned long long bytes = std::stoull(text);
      // cgroup v1 writes a huge page-aligned number for "no limit".
      return bytes >= (std::numeric_limits<unsigned long long>::max() >> 2) ? 0 : static_cast<size_t>(bytes);
    }
  }
  return 0;
}

}  // namespace

size_t available_host_memory() { return proc_kib("/proc/meminfo", "MemAvailable:"); }

size_t host_memory_limit() {
  const size_t total = proc_kib("/proc/meminfo", "MemTotal:");
  const size_t limit = cgroup_limit();
  return limit > 0 && limit < total ? limit : total;
}

size_t resident_bytes() { return proc_kib("/proc/self/status", "VmRSS:"); }
size_t peak_resident_bytes() { return proc_kib("/proc/self/status", "VmHWM:"); }

bool reset_peak_resident() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

}  // namespace tandem
