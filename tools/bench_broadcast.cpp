// bench_broadcast: the weight sync of sync.transport = broadcast, trainer rank 0 to the
// engines of every other rank (world.rollout-ranks = ranks - 1), through the job's own
// BroadcastTransport: MPI on the CPU, NCCL between GPUs.
//
//   mpirun -np 2 bench_broadcast [--device cpu|cuda] [--layers 28] [--bucket-mib 512] [--repeat 5]
//
// The weights are the Qwen3-0.6B shape (--layers of it) in the working dtype (FP32 on the
// CPU, BF16 on CUDA). Prints the bytes of one sync, the time per sync and the rate
// (bytes / time: what each engine receives per second).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "bench_args.h"
#include "model/config.h"
#include "model/parameters.h"
#include "sync/broadcast_transport.h"
#include "tensor/memory_pool.h"
#include "world/roles.h"
#include "world/stall_guard.h"
#include "world/world.h"

using namespace tandem;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    const std::string device = arg_text(argc, argv, "--device", "cpu");
    auto world = World::create(MPI_COMM_WORLD, WorldOptions{device, 1});
    set_stall_timeout(MPI_COMM_WORLD, 0);
    Roles roles(*world, world->size() - 1);
    const ModelConfig config = ModelConfig::qwen3_0_6b(arg_int(argc, argv, "--layers", 28));
    const ParameterLayout layout(config);
    const DType dtype = world->device() == Device::CUDA ? DType::BF16 : DType::F32;
    const int repeat = arg_int(argc, argv, "--repeat", 5);
    const BroadcastSettings settings{static_cast<size_t>(arg_int(argc, argv, "--bucket-mib", 512)) << 20,
                                     roles.link_communicator()};
    auto pool = MemoryPool::create(world->device(), std::max(world->gpu(), 0));
    Allocation* working = nullptr;
    Tensor source;
    if (roles.role() == Role::Trainer) {
      working = pool->allocate(tags::derived, layout.slab_bytes(dtype), "trainer.working_weights");
      source = Tensor::view(working->ptr, dtype, pool->device(), {layout.slab_elements()});
    }
    {
      BroadcastTransport transport(*pool, layout, dtype, settings, working ? &source : nullptr);
      transport.sync();  // warm-up: first touch of the pages, NCCL's first connections
      double best = 1e30, total = 0;
      for (int i = 0; i < repeat; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double seconds = transport.sync().seconds;
        double slowest = 0;
        MPI_Allreduce(&seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        best = std::min(best, slowest);
        total += slowest;
      }
      if (world->rank() == 0) {
        const double bytes = static_cast<double>(layout.slab_bytes(dtype));
        std::printf("bench_broadcast: %s, %d engine rank(s), %.1fM parameters in %s = %.1f MB per sync, buckets of %zu MiB\n",
                    world->device() == Device::CUDA ? "NCCL" : "MPI", roles.engines(), layout.parameter_count() / 1e6,
                    dtype_name(dtype), bytes / 1e6, settings.bucket_bytes >> 20);
        std::printf("per sync: mean %.1f ms, best %.1f ms; rate %.2f GB/s (best %.2f GB/s)\n", total / repeat * 1e3,
                    best * 1e3, bytes / (total / repeat) / 1e9, bytes / best / 1e9);
      }
    }
    if (working) pool->release(working);
  }
  MPI_Finalize();
  return 0;
}
