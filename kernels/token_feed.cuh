// The rollout engine's token feed on the GPU: a decode step queued while the step before
// it still runs takes its new tokens from that step's sampled ids on the device, where the
// host does not know them yet. CPU twin: CpuRowSampler::feed (src/rollout/cpu_row_sampler.cpp),
// compared in tests/gpu_sampling.cpp.
#pragma once
#include <cuda_runtime.h>

#include "tensor/tensor.h"

namespace tandem::cuda {

// token_ids[t] = sampled[from_rows[t]] where from_rows[t] >= 0; the other ids stay as they
// are. token_ids and from_rows I32 [T], sampled I32 [R]; from_rows entries must be < R
// (not checked: the rows are the host's own bookkeeping, and checking would need a read
// back). No allocation, no synchronisation: capturable in a CUDA graph.
void feed_tokens(const Tensor& token_ids, const Tensor& from_rows, const Tensor& sampled, cudaStream_t stream);

}  // namespace tandem::cuda
