// bench_allreduce: the gradient all-reduce of data-parallel training (FP32 sums through
// the job's Communicator: NCCL between GPUs, MPI on the CPU backend), against the link it
// runs over, and ZeRO-1's reduce-scatter of the gradients and all-gather of the BF16 weights.
//
//   mpirun -np 2 bench_allreduce [--device cuda|cpu] [--max-mib 2400] [--repeat 10]
//
// Prints, per collective and message size (the whole buffer), the time per call, the
// algorithm bandwidth (bytes / time) and the bus bandwidth (what nccl-tests reports: the
// bytes each link carries, comparable across rank counts: algorithm bandwidth x 2(n-1)/n
// for the all-reduce, x (n-1)/n for the others). ZeRO-1's ranges are rarely equal (the
// layout's alignment, Muon's whole matrices): "reduce-scatter-v" and "all-gather-v" move
// one element between two ranks' ranges, so NCCL runs them as grouped reduces and
// broadcasts instead of its own reduce-scatter and all-gather. The ceiling is the
// unidirectional GPU 0 -> GPU 1 copy bandwidth, measured by rank 0 when it sees both GPUs
// (a ring all-reduce cannot move data faster than its links). 2400 MiB is the FP32
// gradient of Qwen3-0.6B.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_args.h"
#include "world/stall_guard.h"
#include "world/world.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

using namespace tandem;

namespace {

#ifdef TANDEM_HAVE_CUDA

// GPU 0 -> GPU 1 over peer access, GB/s; 0 when this process does not see two GPUs.
double peer_copy_gb_per_s(size_t bytes) {
  int count = 0;
  cudaGetDeviceCount(&count);
  int can_access = 0;
  if (count < 2 || cudaDeviceCanAccessPeer(&can_access, 0, 1) != cudaSuccess || !can_access) return 0;
  void *src = nullptr, *dst = nullptr;
  cudaSetDevice(1);
  cudaMalloc(&dst, bytes);
  cudaSetDevice(0);
  cudaDeviceEnablePeerAccess(1, 0);
  cudaMalloc(&src, bytes);
  cudaMemcpyPeer(dst, 1, src, 0, bytes);  // warm-up
  cudaDeviceSynchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) cudaMemcpyPeer(dst, 1, src, 0, bytes);
  cudaDeviceSynchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 5;
  cudaFree(src);
  cudaSetDevice(1);
  cudaFree(dst);
  cudaSetDevice(0);
  return static_cast<double>(bytes) / seconds / 1e9;
}

// The benchmark's buffer, on the device the communicator reduces on.
float* allocate(Device device, size_t bytes) {
  if (device == Device::CPU) return static_cast<float*>(std::calloc(bytes, 1));
  float* data = nullptr;
  cudaMalloc(&data, bytes);
  cudaMemset(data, 0, bytes);
  return data;
}
void release(Device device, float* data) { device == Device::CPU ? std::free(data) : void(cudaFree(data)); }
#else
double peer_copy_gb_per_s(size_t) { return 0; }
float* allocate(Device, size_t bytes) { return static_cast<float*>(std::calloc(bytes, 1)); }
void release(Device, float* data) { std::free(data); }
#endif

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const size_t max_bytes = static_cast<size_t>(arg_int(argc, argv, "--max-mib", 2400)) << 20;
  const int repeat = arg_int(argc, argv, "--repeat", 10);
  const std::string device = arg_text(argc, argv, "--device", "cuda");
  const double ceiling = rank == 0 && device == "cuda" ? peer_copy_gb_per_s(size_t{1} << 30) : 0;
  {
    auto world = World::create(MPI_COMM_WORLD, WorldOptions{device, 1});
    set_stall_timeout(MPI_COMM_WORLD, 0);  // the MPI collectives wait as a job's do
    const int n = world->size();
    if (rank == 0) {
      for (const RankPlacement& p : world->placements())
        std::printf("rank %d: %s local %d %s\n", p.rank, p.host.c_str(), p.local_rank, p.device.c_str());
      if (ceiling > 0)
        std::printf("GPU 0 -> GPU 1 copy: %.1f GB/s (the link ceiling)\n", ceiling);
      std::printf("%16s %12s %12s %12s %12s\n", "collective", "bytes", "ms", "algbw GB/s", "busbw GB/s");
    }
    float* data = allocate(world->device(), max_bytes);
    Communicator& comm = world->communicator();
    std::vector<size_t> sizes;
    for (size_t bytes = size_t{1} << 20; bytes < max_bytes; bytes *= 4) sizes.push_back(bytes);
    sizes.push_back(max_bytes);
    const char* collectives[] = {"all-reduce", "reduce-scatter", "reduce-scatter-v", "all-gather", "all-gather-v"};
    for (const char* collective : collectives)
      for (const size_t bytes : sizes) {
        const std::string name = collective;
        const bool gather = name.rfind("all-gather", 0) == 0;
        const size_t element = gather ? 2 : sizeof(float);  // the BF16 working copy, the FP32 gradients
        std::vector<size_t> counts(static_cast<size_t>(n), bytes / element / n);
        if (name.back() == 'v' && n > 1) ++counts[0], --counts[1];
        auto run = [&] {
          if (name == "all-reduce")
            comm.all_reduce_sum(data, bytes / sizeof(float));
          else if (gather)
            comm.all_gather(data, counts, element);
          else
            comm.reduce_scatter_sum(data, counts);
        };
        run();  // warm-up
        comm.synchronize();
        MPI_Barrier(MPI_COMM_WORLD);
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < repeat; ++i) run();
        comm.synchronize();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeat;
        const double algbw = static_cast<double>(bytes) / seconds / 1e9;
        const double bus = name == "all-reduce" ? 2.0 * (n - 1) / n : (n - 1.0) / n;
        if (rank == 0)
          std::printf("%16s %12zu %12.3f %12.1f %12.1f\n", collective, bytes, seconds * 1e3, algbw, algbw * bus);
      }
    release(world->device(), data);
  }
  MPI_Finalize();
  return 0;
}
