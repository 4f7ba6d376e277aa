// The checksum of raw bytes that tandem's files carry (checkpoint tensors, and what other
// files want verified): XXH3-64, written as 16 lowercase hex digits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem {

uint64_t xxh3_64(const void* data, size_t bytes);
std::string checksum_hex(uint64_t checksum);           // "00ff...": 16 digits
std::string xxh3_64_hex(const void* data, size_t bytes);  // both

}  // namespace tandem
