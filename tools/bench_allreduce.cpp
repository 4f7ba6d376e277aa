// bench_allreduce: the gradient all-reduce of data-parallel training (FP32 sums through
// the job's Communicator: NCCL between GPUs), against the link it runs over.
//
//   mpirun -np 2 bench_allreduce [--max-mib 2400] [--repeat 10]
//
// Prints, per message size, the time per all-reduce, the algorithm bandwidth (bytes /
// time) and the bus bandwidth (algorithm bandwidth x 2(n-1)/n, what nccl-tests reports:
// the bytes each link carries, comparable across rank counts). The ceiling is the
// unidirectional GPU 0 -> GPU 1 copy bandwidth, measured by rank 0 when it sees both GPUs
// (a ring all-reduce cannot move data faster than its links). 2400 MiB is the FP32
// gradient of Qwen3-0.6B.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>

#include "bench_args.h"
#include "world/world.h"

using namespace tandem;

namespace {

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

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const size_t max_bytes = static_cast<size_t>(arg_int(argc, argv, "--max-mib", 2400)) << 20;
  const int repeat = arg_int(argc, argv, "--repeat", 10);
  const double ceiling = rank == 0 ? peer_copy_gb_per_s(size_t{1} << 30) : 0;
  {
    auto world = World::create(MPI_COMM_WORLD, WorldOptions{"cuda", 0});
    const int n = world->size();
    if (rank == 0) {
      for (const RankPlacement& p : world->placements())
        std::printf("rank %d: %s local %d %s\n", p.rank, p.host.c_str(), p.local_rank, p.device.c_str());
      if (ceiling > 0)
        std::printf("GPU 0 -> GPU 1 copy: %.1f GB/s (the link ceiling)\n", ceiling);
      std::printf("%12s %12s %12s %12s\n", "bytes", "ms", "algbw GB/s", "busbw GB/s");
    }
    float* data = nullptr;
    cudaMalloc(&data, max_bytes);
    cudaMemset(data, 0, max_bytes);
    Communicator& comm = world->communicator();
    std::vector<size_t> sizes;
    for (size_t bytes = size_t{1} << 20; bytes < max_bytes; bytes *= 4) sizes.push_back(bytes);
    sizes.push_back(max_bytes);
    for (const size_t bytes : sizes) {
      const size_t count = bytes / sizeof(float);
      comm.all_reduce_sum(data, count);  // warm-up
      comm.synchronize();
      MPI_Barrier(MPI_COMM_WORLD);
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < repeat; ++i) comm.all_reduce_sum(data, count);
      comm.synchronize();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeat;
      const double algbw = static_cast<double>(bytes) / seconds / 1e9;
      if (rank == 0)
        std::printf("%12zu %12.3f %12.1f %12.1f\n", bytes, seconds * 1e3, algbw, algbw * 2.0 * (n - 1) / n);
    }
    cudaFree(data);
  }
  MPI_Finalize();
  return 0;
}
#else
int main() {
  std::fprintf(stderr, "bench_allreduce: this build has no CUDA backend\n");
  return 1;
}
#endif
