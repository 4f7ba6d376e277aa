// ZeRO-1 on CUDA through NCCL: the reduce-scatter and all-gather on equal ranges (NCCL's
// own collectives) and unequal ones (grouped reduces and broadcasts), and under
// mpirun -np N on N GPUs a trainer whose FP32 master weights and state are sharded over
// the ranks against one holding them whole, with a BF16 working copy, AdamW and Muon.
// As one rank the collectives are checked over that rank alone and the trainer test skips.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <numeric>

#include "gpu_support.h"
#include "policy_trainer_support.h"
#include "tensor/device_copy.h"
#include "train/optimizer_shards.h"
#include "world/world.h"

using namespace tandem;
using tandem::testing::DeviceBuffer;

namespace {

void expect_reduce_scatter_and_all_gather(Communicator& communicator, const std::vector<size_t>& counts) {
  const int rank = communicator.rank(), size = communicator.size();
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t begin = std::accumulate(counts.begin(), counts.begin() + rank, size_t{0});
  std::vector<float> host(total);
  for (size_t i = 0; i < total; ++i) host[i] = static_cast<float>((rank + 1) * (i % 1000));
  DeviceBuffer device(total * sizeof(float));
  auto* values = static_cast<float*>(device.data);
  tandem::testing::check(cudaMemcpy(values, host.data(), total * sizeof(float), cudaMemcpyHostToDevice), "upload");
  communicator.reduce_scatter_sum(values, counts);
  communicator.synchronize();
  tandem::testing::check(cudaMemcpy(host.data(), values, total * sizeof(float), cudaMemcpyDeviceToHost), "download");
  const float factor = static_cast<float>(size * (size + 1) / 2);
  for (size_t i = begin; i < begin + counts[rank]; ++i) ASSERT_EQ(host[i], factor * static_cast<float>(i % 1000)) << i;

  // 2-byte elements (a BF16 working copy): each rank's range written by that rank only.
  std::vector<uint16_t> bits(total, 0xffff), want(total);
  size_t at = 0;
  for (int r = 0; r < size; ++r)
    for (size_t i = 0; i < counts[r]; ++i, ++at) {
      want[at] = static_cast<uint16_t>(r * 4096 + i % 4096);
      if (r == rank) bits[at] = want[at];
    }
  tandem::testing::check(cudaMemcpy(values, bits.data(), total * 2, cudaMemcpyHostToDevice), "upload");
  communicator.all_gather(values, counts, sizeof(uint16_t));
  communicator.synchronize();
  tandem::testing::check(cudaMemcpy(bits.data(), values, total * 2, cudaMemcpyDeviceToHost), "download");
  EXPECT_EQ(bits, want);
}

TEST(Zero1Gpu, NcclReduceScatterAndAllGatherOnEqualAndUnequalRanges) {
  REQUIRE_GPU();
  auto world = World::create(MPI_COMM_WORLD, WorldOptions{"cuda", 0});
  const int size = world->size();
  expect_reduce_scatter_and_all_gather(world->communicator(), std::vector<size_t>(size, (size_t{1} << 22) + 3));
  std::vector<size_t> unequal;
  for (int r = 0; r < size; ++r) unequal.push_back(r == 1 ? 0 : (size_t{1} << 20) + 7 * r);
  expect_reduce_scatter_and_all_gather(world->communicator(), unequal);
}

// The CUDA trainer of one rank with device slabs: its shard (or all) of the master
// weights and moments, the whole gradients and BF16 working copy.
struct ShardTrainer {
  ShardTrainer(const ModelConfig& config, ActivationCapacity capacity, const std::vector<float>& weights,
               const SlabShards& shard, OptimizerKind optimizer, Communicator& communicator)
      : layout(config),
        shard_elements(shard.elements()),
        master(static_cast<size_t>(shard.elements()) * 4),
        exp_avg(static_cast<size_t>(shard.elements()) * 4),
        exp_avg_sq(static_cast<size_t>(shard.elements()) * 4),
        grads(layout.slab_bytes(DType::F32)),
        working(layout.slab_bytes(DType::BF16)),
        reference(layout.slab_bytes(DType::BF16)),
        activations(PolicyTrainer::activation_bytes(config, capacity, DType::BF16, optimizer)),
        trainer(config, layout,
                PolicyTrainerMemory{view(master, DType::F32, shard_elements), view(grads, DType::F32),
                                    view(exp_avg, DType::F32, shard_elements),
                                    view(exp_avg_sq, DType::F32, shard_elements), view(working, DType::BF16),
                                    activations.data, nullptr, 0, shard},
                capacity, communicator, communicator.size()) {
    copy_host_to_tensor(view(master, DType::F32, shard_elements), weights.data() + shard.begin());
    copy_floats_to_tensor(view(working, DType::BF16), weights);
    copy_floats_to_tensor(view(reference, DType::BF16), weights);
    trainer.set_reference(view(reference, DType::BF16));
  }
  Tensor view(const DeviceBuffer& buffer, DType dtype, int64_t elements = -1) const {
    return Tensor::view(buffer.data, dtype, Device::CUDA, {elements < 0 ? layout.slab_elements() : elements});
  }
  std::vector<uint16_t> working_bits() const {
    std::vector<uint16_t> bits(static_cast<size_t>(layout.slab_elements()));
    copy_tensor_to_host(bits.data(), view(working, DType::BF16));
    return bits;
  }

  ParameterLayout layout;
  int64_t shard_elements;
  DeviceBuffer master, exp_avg, exp_avg_sq, grads, working, reference, activations;
  PolicyTrainer trainer;
};

// The sharded step differs from the whole one only in the order of the gradient sums and
// in the global norm's FP32 sum: the BF16 working copies agree but for a few roundings.
TEST(Zero1Gpu, ShardedTrainerTakesTheStepsOfTheWholeOne) {
  REQUIRE_GPU();
  auto world = World::create(MPI_COMM_WORLD, WorldOptions{"cuda", 0});
  if (world->size() < 2) GTEST_SKIP() << "run under mpirun -np 2 (or more), one GPU per rank";
  const ModelConfig config = tandem::testing::gpu_sized(tandem::testing::trainer_config());
  const ParameterLayout layout(config);
  const std::vector<float> weights = tandem::testing::trainer_weights(layout, 3);
  for (const OptimizerKind optimizer : {OptimizerKind::AdamW, OptimizerKind::Muon}) {
    SCOPED_TRACE(optimizer_kind_name(optimizer));
    std::vector<std::vector<TrainSequence>> batches;
    for (uint32_t step = 0; step < 2; ++step)
      batches.push_back(tandem::testing::random_batch(config, 8, 50 * step + static_cast<uint32_t>(world->rank())));
    const ActivationCapacity capacity{
        std::max(tandem::testing::batch_tokens(batches[0]), tandem::testing::batch_tokens(batches[1])), 8};
    ShardTrainer whole(config, capacity, weights, SlabShards::whole(layout), optimizer, world->communicator());
    ShardTrainer sharded(config, capacity, weights, SlabShards::split(layout, optimizer, world->size(), world->rank()),
                         optimizer, world->communicator());
    PolicyTrainerSettings settings = tandem::testing::trainer_settings(0);
    settings.optimizer.kind = optimizer;
    settings.max_grad_norm = 0.05;  // every step clips: the global norm must be right
    const PolicyLossSettings loss = tandem::testing::grpo_loss(LossAggregation::GlobalTokenSum);
    for (int64_t step = 1; step <= 2; ++step) {
      const TrainStepResult a = whole.trainer.grpo_step(batches[step - 1], loss, 1e-2, step, settings);
      const TrainStepResult b = sharded.trainer.grpo_step(batches[step - 1], loss, 1e-2, step, settings);
      EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-4 * a.grad_norm) << "step " << step;
      EXPECT_NEAR(b.loss, a.loss, 1e-4 * (1 + std::fabs(a.loss))) << "step " << step;
    }
    const std::vector<uint16_t> a = whole.working_bits(), b = sharded.working_bits();
    size_t differ = 0, moved = 0;
    std::vector<uint16_t> initial(a.size());
    copy_tensor_to_host(initial.data(), whole.view(whole.reference, DType::BF16));
    for (size_t i = 0; i < a.size(); ++i) {
      differ += a[i] != b[i];
      moved += a[i] != initial[i];
    }
    EXPECT_GT(moved, a.size() / 4);
    EXPECT_LT(differ, a.size() / 100) << differ << " of " << a.size() << " BF16 weights differ";
  }
}

}  // namespace
