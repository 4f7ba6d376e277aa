// The checksum tandem shows for stored tensors: xxh3-64 of the raw bytes, as they lie
// in the file (little-endian), so h5py users get the same number with the xxhash module.
#pragma once
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace tandem {

inline uint64_t xxh3_64(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

}  // namespace tandem
