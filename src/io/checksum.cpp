#include "io/checksum.h"

#include <xxhash.h>

#include <cstdio>

namespace tandem {

uint64_t xxh3_64(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

std::string checksum_hex(uint64_t checksum) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(checksum));
  return text;
}

std::string xxh3_64_hex(const void* data, size_t bytes) { return checksum_hex(xxh3_64(data, bytes)); }

}  // namespace tandem
