// Page-locked host memory allocated at the rate of the machine's cores, not one thread's.
// cudaHostAlloc faults in and zeroes every page on the calling thread (8 GiB took ~3.3 s
// on the H200's host, the first step's handoff and first checkpoint paid it); here fresh
// anonymous pages (zero-filled by the kernel, in huge pages where the system allows) are
// faulted in by several threads at once, then registered with CUDA in one call, so the
// range is one pinned buffer to the copy engines, as cudaHostAlloc's is.
// CUDA builds only (pinned_host_cuda.cpp).
#pragma once
#include <cstddef>

namespace tandem {

// Zero-filled, page-locked for every device (portable). `device_mapped`: kernels may read
// it through the same pointer. `threads`: how many fault its pages in, 0 for the machine's
// cores (at most 16). Throws std::runtime_error naming the bytes when it cannot be had.
void* allocate_pinned_host(size_t bytes, bool device_mapped, int threads = 0);
// Unregisters and unmaps what allocate_pinned_host returned (nullptr: nothing).
void free_pinned_host(void* data, size_t bytes);

}  // namespace tandem
