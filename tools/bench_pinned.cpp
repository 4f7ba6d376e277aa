// Time to get page-locked host memory, and what it costs the rest of the process: the
// first step's handoff and the first checkpoint snapshot pay for GBs of it.
//
//   bench_pinned [--gib N] [--threads "1 4 8 16"]
//
// For N GiB (default 8): cudaHostAlloc (the peer: one thread faults and zeroes every
// page) against allocate_pinned_host (src/tensor/pinned_host.h: huge pages faulted in by
// T threads, then one cudaHostRegister) for each T, and cudaHostRegister of untouched
// pages (the register call faulting them itself); the release of each; device-to-host
// and host-to-device copy rates into both kinds of buffer; and how much a loop of small
// synchronised device operations on the main thread slows while another thread
// allocates (the snapshot is allocated beside the first rollout that way).
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>

#include "tensor/pinned_host.h"
#endif

#ifndef TANDEM_HAVE_CUDA
int main() {
  std::fprintf(stderr, "bench_pinned: this build has no CUDA backend (configure with -DTANDEM_CUDA=ON)\n");
  return 2;
}
#else

using namespace tandem;

namespace {

constexpr double kGB = 1e9;
using Clock = std::chrono::steady_clock;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

double seconds(const std::function<void()>& work) {
  const auto start = Clock::now();
  work();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Copies of the whole buffer each way, after one warm-up copy: GB/s each way.
std::pair<double, double> copy_rates(void* host, void* device, size_t bytes, cudaStream_t stream) {
  auto rate = [&](cudaMemcpyKind kind) {
    void* to = kind == cudaMemcpyDeviceToHost ? host : device;
    const void* from = kind == cudaMemcpyDeviceToHost ? device : host;
    check(cudaMemcpyAsync(to, from, bytes, kind, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const double s = seconds([&] {
      for (int i = 0; i < 3; ++i) check(cudaMemcpyAsync(to, from, bytes, kind, stream), "cudaMemcpyAsync");
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    });
    return 3 * bytes / s / kGB;
  };
  return {rate(cudaMemcpyDeviceToHost), rate(cudaMemcpyHostToDevice)};
}

// Rounds of a small device memset and a stream synchronisation, until `done` (or
// `rounds` of them): the rounds run, their mean and their longest, in seconds.
struct Rounds {
  int count = 0;
  double mean = 0, longest = 0;
};
Rounds small_operations(void* device, cudaStream_t stream, const std::atomic<bool>& done, int rounds) {
  Rounds result;
  double total = 0;
  while (!done && result.count < rounds) {
    const double s = seconds([&] {
      check(cudaMemsetAsync(device, result.count & 0xff, 1 << 20, stream), "cudaMemsetAsync");
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    });
    total += s, result.longest = std::max(result.longest, s), ++result.count;
  }
  result.mean = total / std::max(1, result.count);
  return result;
}

std::string first_line(const char* path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line.empty() ? "(unreadable)" : line;
}

}  // namespace

int main(int argc, char** argv) {
  const double gib = std::atof(arg_text(argc, argv, "--gib", "8"));
  const size_t bytes = static_cast<size_t>(gib * 1024 * 1024 * 1024);
  std::vector<int> thread_counts;
  {
    std::istringstream list(arg_text(argc, argv, "--threads", "1 4 8 16"));
    for (int t; list >> t;) thread_counts.push_back(t);
  }
  if (bytes == 0 || thread_counts.empty()) {
    std::fprintf(stderr, "bench_pinned: --gib must be > 0 and --threads a list of counts\n");
    return 2;
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  check(cudaFree(nullptr), "creating the CUDA context");
  int host_pointer = 0;
  check(cudaDeviceGetAttribute(&host_pointer, cudaDevAttrCanUseHostPointerForRegisteredMem, 0), "cudaDeviceGetAttribute");
  std::printf("%.2f GiB; %u CPUs; transparent huge pages: %s; device reads registered memory at the host's address: %s\n",
              gib, std::thread::hardware_concurrency(), first_line("/sys/kernel/mm/transparent_hugepage/enabled").c_str(),
              host_pointer ? "yes" : "no");
  void* device = nullptr;
  check(cudaMalloc(&device, bytes), "cudaMalloc");
  check(cudaMemset(device, 1, bytes), "cudaMemset");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  void* host = nullptr;
  const double alloc = seconds([&] { check(cudaHostAlloc(&host, bytes, cudaHostAllocPortable | cudaHostAllocMapped), "cudaHostAlloc"); });
  const auto [alloc_d2h, alloc_h2d] = copy_rates(host, device, bytes, stream);
  const double alloc_free = seconds([&] { check(cudaFreeHost(host), "cudaFreeHost"); });
  std::printf("  %-40s %7.3f s (%5.1f GB/s), free %.3f s; copies D2H %.1f / H2D %.1f GB/s\n", "cudaHostAlloc (peer)", alloc,
              bytes / alloc / kGB, alloc_free, alloc_d2h, alloc_h2d);

  for (int threads : thread_counts) {
    const double made = seconds([&] { host = allocate_pinned_host(bytes, true, threads); });
    const auto [d2h, h2d] = copy_rates(host, device, bytes, stream);
    const double freed = seconds([&] { free_pinned_host(host, bytes); });
    char name[64];
    std::snprintf(name, sizeof name, "allocate_pinned_host, %d threads", threads);
    std::printf("  %-40s %7.3f s (%5.1f GB/s), free %.3f s; copies D2H %.1f / H2D %.1f GB/s\n", name, made,
                bytes / made / kGB, freed, d2h, h2d);
  }

  void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) throw std::runtime_error("mmap");
  madvise(mapping, bytes, MADV_HUGEPAGE);
  const double registered = seconds([&] { check(cudaHostRegister(mapping, bytes, cudaHostRegisterPortable), "cudaHostRegister"); });
  const double unregistered = seconds([&] {
    check(cudaHostUnregister(mapping), "cudaHostUnregister");
    munmap(mapping, bytes);
  });
  std::printf("  %-40s %7.3f s (%5.1f GB/s), free %.3f s\n", "cudaHostRegister of untouched pages", registered,
              bytes / registered / kGB, unregistered);

  std::atomic<bool> done = false;
  const Rounds alone = small_operations(device, stream, done, 4000);
  Rounds beside;
  double allocated = 0;
  {
    std::jthread allocator([&] {
      allocated = seconds([&] { host = allocate_pinned_host(bytes, false); });
      done = true;
    });
    beside = small_operations(device, stream, done, 1 << 30);
  }
  free_pinned_host(host, bytes);
  std::printf("  small synchronised device operations: %.1f us each (longest %.1f us) alone; %.1f us each (longest %.1f us, "
              "%d of them) while another thread allocated in %.3f s\n",
              alone.mean * 1e6, alone.longest * 1e6, beside.mean * 1e6, beside.longest * 1e6, beside.count, allocated);
  check(cudaFree(device), "cudaFree");
  return 0;
}
#endif
