// Offload/onload rate of the tagged memory pool, against the plain pinned-copy ceiling.
//
//   bench_offload [--device cpu|cuda] [--gib N] [--repeat R] [--no-cache]
//
// Allocates N GiB (default 8 on CUDA, 1 on the CPU) in four allocations under one tag,
// then offloads and onloads the tag R+1 times. The first cycle pays for the host buffers
// (cudaHostAlloc of GBs is slow); later cycles reuse them from the pinned host cache,
// unless --no-cache. The ceiling is a plain cudaMemcpy between cudaMalloc memory and a
// pinned buffer of one allocation's size (memcpy on the CPU).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/memory_pool.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

using namespace tandem;

namespace {

constexpr int kAllocations = 4;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct Options {
  Device device = Device::CPU;
  double gib = 0;
  int repeat = 5;
  bool cache = true;
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr, "bench_offload: %s\nusage: bench_offload [--device cpu|cuda] [--gib N] [--repeat R] [--no-cache]\n",
               problem.c_str());
  std::exit(2);
}

bool cuda_usable() {
#ifdef TANDEM_HAVE_CUDA
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
#else
  return false;
#endif
}

Options parse(int argc, char** argv) {
  Options options;
  options.device = cuda_usable() ? Device::CUDA : Device::CPU;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--device") {
      const std::string name = value();
      if (name != "cpu" && name != "cuda") usage("unknown device '" + name + "'");
      options.device = name == "cuda" ? Device::CUDA : Device::CPU;
    } else if (flag == "--gib") {
      options.gib = std::atof(value().c_str());
      if (!(options.gib > 0)) usage("--gib must be positive");
    } else if (flag == "--repeat") {
      options.repeat = std::atoi(value().c_str());
      if (options.repeat < 1) usage("--repeat must be at least 1");
    } else if (flag == "--no-cache") {
      options.cache = false;
    } else {
      usage("unknown option '" + flag + "'");
    }
  }
  if (options.gib == 0) options.gib = options.device == Device::CUDA ? 8 : 1;
  return options;
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

#ifdef TANDEM_HAVE_CUDA
void check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(status));
}
#endif

void fill(Device device, void* data, unsigned char value, size_t bytes) {
#ifdef TANDEM_HAVE_CUDA
  if (device == Device::CUDA) {
    check(cudaMemset(data, value, bytes), "cudaMemset");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return;
  }
#endif
  (void)device;
  std::memset(data, value, bytes);
}

unsigned char byte_at(Device device, const void* data, size_t offset) {
  unsigned char value = 0;
#ifdef TANDEM_HAVE_CUDA
  if (device == Device::CUDA) {
    check(cudaMemcpy(&value, static_cast<const char*>(data) + offset, 1, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return value;
  }
#endif
  (void)device;
  return static_cast<const unsigned char*>(data)[offset];
}

struct CopyRates {
  double to_host = 0, to_device = 0;  // GB/s
};

// Best of a few plain copies of `bytes` each way: the rate the pool should approach.
CopyRates plain_copy_rates(Device device, size_t bytes) {
  constexpr int kTries = 3;
  CopyRates best;
  const auto time = [](auto&& copy) {
    const auto start = std::chrono::steady_clock::now();
    copy();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
#ifdef TANDEM_HAVE_CUDA
  if (device == Device::CUDA) {
    void *device_buffer = nullptr, *host_buffer = nullptr;
    check(cudaMalloc(&device_buffer, bytes), "cudaMalloc for the ceiling");
    check(cudaHostAlloc(&host_buffer, bytes, cudaHostAllocDefault), "cudaHostAlloc for the ceiling");
    check(cudaMemset(device_buffer, 1, bytes), "cudaMemset");
    std::memset(host_buffer, 1, bytes);
    for (int i = 0; i < kTries; ++i) {
      const double down = time([&] { check(cudaMemcpy(host_buffer, device_buffer, bytes, cudaMemcpyDeviceToHost), "D2H"); });
      const double up = time([&] { check(cudaMemcpy(device_buffer, host_buffer, bytes, cudaMemcpyHostToDevice), "H2D"); });
      best.to_host = std::max(best.to_host, bytes / down / 1e9);
      best.to_device = std::max(best.to_device, bytes / up / 1e9);
    }
    cudaFree(device_buffer);
    cudaFreeHost(host_buffer);
    return best;
  }
#endif
  (void)device;
  std::vector<char> source(bytes, 1), target(bytes, 0);
  for (int i = 0; i < kTries; ++i) {
    const double seconds = time([&] { std::memcpy(target.data(), source.data(), bytes); });
    best.to_host = best.to_device = std::max(best.to_host, bytes / seconds / 1e9);
  }
  return best;
}

void print_cycle(const char* label, const TransferReport& off, const TransferReport& on) {
  std::printf("%-8s %10.2f %10.2f %10.4f %10.4f\n", label, off.gb_per_s(), on.gb_per_s(), off.seconds, on.seconds);
}

int run(const Options& options) {
  auto pool = MemoryPool::create(options.device, 0, {.pinned_host_cache = options.cache});
  const size_t granularity = pool->granularity();
  const size_t each = static_cast<size_t>(std::llround(options.gib * kGiB / kAllocations));
  const Tag tag = tag_named("bench");
  std::vector<Allocation*> allocations;
  for (int i = 0; i < kAllocations; ++i) {
    allocations.push_back(pool->allocate(tag, each, "bench." + std::to_string(i)));
    fill(options.device, allocations.back()->ptr, static_cast<unsigned char>(i + 1), each);
  }
  std::printf("bench_offload: %s, %.2f GiB in %d allocations of %.3f GiB, granularity %zu bytes, pinned host cache %s\n",
              device_name(options.device), kAllocations * each / kGiB, kAllocations, each / kGiB, granularity,
              options.cache ? "on" : "off");
  std::printf("%-8s %10s %10s %10s %10s\n", "cycle", "off GB/s", "on GB/s", "off s", "on s");

  double warm_off = 0, warm_on = 0;
  for (int cycle = 0; cycle <= options.repeat; ++cycle) {
    const TransferReport off = pool->offload(tag);
    const TransferReport on = pool->onload(tag);
    check(off.bytes == kAllocations * each && on.bytes == off.bytes, "offload/onload moved the wrong number of bytes");
    const std::string label = cycle == 0 ? "cold" : "warm" + std::to_string(cycle);
    print_cycle(label.c_str(), off, on);
    if (cycle > 0) warm_off += off.seconds, warm_on += on.seconds;
  }
  const double bytes = static_cast<double>(kAllocations * each);
  std::printf("warm mean: offload %.2f GB/s, onload %.2f GB/s\n", bytes * options.repeat / warm_off / 1e9,
              bytes * options.repeat / warm_on / 1e9);

  for (int i = 0; i < kAllocations; ++i)
    for (size_t offset : {size_t{0}, each / 2, each - 1})
      check(byte_at(options.device, allocations[i]->ptr, offset) == i + 1,
            "data of " + allocations[i]->name + " did not survive the cycles");

  const MemoryStats stats = pool->stats();
  std::printf("peaks: device %.2f GiB, host %.2f GiB (data checked after the cycles)\n", stats.device_peak / kGiB,
              stats.host_peak / kGiB);
  for (auto* allocation : allocations) pool->release(allocation);
  pool.reset();

  const CopyRates ceiling = plain_copy_rates(options.device, each);
  std::printf("ceiling (%s of %.3f GiB, best of 3): to host %.2f GB/s, to device %.2f GB/s\n",
              options.device == Device::CUDA ? "cudaMemcpy, pinned" : "memcpy", each / kGiB, ceiling.to_host,
              ceiling.to_device);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    return run(options);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_offload: %s\n", error.what());
    return 1;
  }
}
