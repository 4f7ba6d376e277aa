// One stored tensor reduced to what a person can compare at a glance: its L2 norm, whether
// every value is finite, and the xxh3-64 checksum of its bytes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"

namespace tandem {

struct TensorSummary {
  double norm = 0;
  bool finite = true;
  uint64_t xxh3 = 0;
  uint64_t bytes = 0;
};

// Reads the tensor `info` of `checkpoint` into `buffer` (reused between calls, so one
// allocation serves a whole checkpoint) and summarises it.
TensorSummary summarize_checkpoint_tensor(const Checkpoint& checkpoint, const hdf5::TensorInfo& info,
                                          std::vector<unsigned char>& buffer);


}  // namespace tandem
