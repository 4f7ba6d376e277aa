// The policy trainer on CUDA against the FP32 CPU trainer on the same tiny Qwen3 model and
// batches: two GRPO steps with the KL (k3) and entropy terms, then the loss, gradient
// norm, per-token log-probs and the master weights after the updates. F32 working copy:
// FP32 rounding only; BF16 working copy: looser bounds, and the working copy must be the
// master weights rounded. And micro-batched == whole batch on CUDA. The CUDA trainer
// reduces through NCCL, the CPU one through MPI, each over this rank alone.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <mpi.h>
#include <tuple>

#include "policy_trainer_support.h"
#include "gpu_support.h"
#include "support.h"
#include "tensor/bf16.h"
#include "tensor/device_copy.h"
#include "train/optimizer_state_chunks.h"
#include "train/optimizer_state_file.h"
#include "world/pinned_memory.h"

using namespace tandem;
using tandem::testing::DeviceBuffer;
using tandem::testing::CpuTrainer;

namespace {

// The trainer tests' model with GPU-sized heads (32 dims: the tensor-core attention path
// in BF16) and a vocabulary of more than one block of threads.
ModelConfig gpu_config() { return tandem::testing::gpu_sized(tandem::testing::trainer_config()); }

// The CUDA trainer with its own device slabs: FP32 master, gradients and moments, the
// working copy and the KL reference in `dtype`, as the colocated memory holds them. With
// host_state (two FP32 slabs in host memory: pinned, or a mapped state file) the moments
// live there instead, streamed through two device slots of slot_elements values.
struct GpuTrainer {
  GpuTrainer(const ModelConfig& config, ActivationCapacity capacity, const std::vector<float>& weights, DType dtype,
             OptimizerKind optimizer = OptimizerKind::AdamW, float* host_state = nullptr, size_t slot_elements = 0)
      : layout(config),
        elements(layout.slab_elements()),
        master(layout.slab_bytes(DType::F32)),
        grads(layout.slab_bytes(DType::F32)),
        exp_avg(layout.slab_bytes(DType::F32)),
        exp_avg_sq(layout.slab_bytes(DType::F32)),
        working(layout.slab_bytes(dtype)),
        reference(layout.slab_bytes(dtype)),
        activations(PolicyTrainer::activation_bytes(config, capacity, dtype, optimizer)),
        staging(2 * slot_elements * sizeof(float)),
        communicator(make_nccl_communicator(MPI_COMM_SELF)),
        trainer(config, layout,
                PolicyTrainerMemory{view(master, DType::F32), view(grads, DType::F32),
                                    host_state ? host_view(host_state, 0) : view(exp_avg, DType::F32),
                                    host_state ? host_view(host_state, 1) : view(exp_avg_sq, DType::F32),
                                    view(working, dtype), activations.data,
                                    host_state ? static_cast<float*>(staging.data) : nullptr, slot_elements},
                capacity, *communicator, 1) {
    copy_host_to_tensor(view(master, DType::F32), weights.data());
    convert_f32(view(working, dtype), view(master, DType::F32));
    convert_f32(view(reference, dtype), view(master, DType::F32));
    trainer.set_reference(view(reference, dtype));
  }

  Tensor host_view(float* state, int moment) const {
    return Tensor::view(state + moment * elements, DType::F32, Device::CPU, {elements});
  }
  Tensor view(const DeviceBuffer& buffer, DType dtype) const {
    return Tensor::view(buffer.data, dtype, Device::CUDA, {elements});
  }
  std::vector<float> host(const DeviceBuffer& buffer, DType dtype) const {
    std::vector<float> values(static_cast<size_t>(elements));
    if (dtype == DType::F32) {
      copy_tensor_to_host(values.data(), view(buffer, dtype));
    } else {
      std::vector<uint16_t> bits(values.size());
      copy_tensor_to_host(bits.data(), view(buffer, dtype));
      for (size_t i = 0; i < bits.size(); ++i) values[i] = bf16_to_float(bits[i]);
    }
    return values;
  }

  ParameterLayout layout;
  int64_t elements;
  DeviceBuffer master, grads, exp_avg, exp_avg_sq, working, reference, activations, staging;
  std::unique_ptr<Communicator> communicator;
  PolicyTrainer trainer;
};

// How far `a` is from `b`, relative to how far the updates moved b from `initial`: the
// update is what the step computes (the weights themselves hardly move).
double update_error(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& initial) {
  double diff = 0, moved = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    moved += (static_cast<double>(b[i]) - initial[i]) * (static_cast<double>(b[i]) - initial[i]);
  }
  return std::sqrt(diff / moved);
}

struct Tolerances {
  double logp;       // per token, times (1 + |logp|)
  double loss;       // times (1 + |loss|)
  double grad_norm;  // relative
  double update;     // update_error
};

const std::vector<TrainSequence>& batch(int step) {
  static const std::vector<std::vector<TrainSequence>> batches = {
      tandem::testing::random_batch(gpu_config(), 8, 31),
      tandem::testing::random_batch(gpu_config(), 8, 32)};
  return batches[step - 1];
}

ActivationCapacity whole_capacity() {
  return {std::max(tandem::testing::batch_tokens(batch(1)), tandem::testing::batch_tokens(batch(2))), 8};
}

void expect_close(const TrainStepResult& got, const TrainStepResult& want, const Tolerances& tolerance) {
  EXPECT_NEAR(got.loss, want.loss, tolerance.loss * (1 + std::fabs(want.loss)));
  EXPECT_NEAR(got.grad_norm, want.grad_norm, tolerance.grad_norm * want.grad_norm);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_NEAR(got.metrics.kl_mean, want.metrics.kl_mean, tolerance.loss * (1 + want.metrics.kl_mean));
  EXPECT_NEAR(got.metrics.entropy_mean, want.metrics.entropy_mean, tolerance.loss * (1 + want.metrics.entropy_mean));
  ASSERT_EQ(got.sequence_logp.size(), want.sequence_logp.size());
  for (size_t s = 0; s < want.sequence_logp.size(); ++s)
    for (size_t j = 0; j < want.sequence_logp[s].size(); ++j)
      EXPECT_NEAR(got.sequence_logp[s][j], want.sequence_logp[s][j],
                  tolerance.logp * (1 + std::fabs(want.sequence_logp[s][j])))
          << "sequence " << s << " token " << j;
}

// Two GRPO steps on CUDA and on the CPU from the same weights (rounded to the working
// dtype, so both start from the same model).
void compare_with_cpu(DType dtype, LossAggregation aggregation, const Tolerances& tolerance,
                      OptimizerKind optimizer = OptimizerKind::AdamW, int steps = 2) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " aggregation " + std::to_string(static_cast<int>(aggregation)));
  const ModelConfig config = gpu_config();
  std::vector<float> weights = tandem::testing::trainer_weights(ParameterLayout(config), 41);
  if (dtype == DType::BF16)
    for (auto& w : weights) w = bf16_to_float(float_to_bf16(w));
  CpuTrainer cpu(config, whole_capacity(), weights);
  GpuTrainer gpu(config, whole_capacity(), weights, dtype, optimizer);
  const PolicyLossSettings loss = tandem::testing::grpo_loss(aggregation);
  PolicyTrainerSettings settings = tandem::testing::trainer_settings(0);
  settings.optimizer.kind = optimizer;
  for (int step = 1; step <= steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const TrainStepResult want = cpu.trainer.grpo_step(batch(step), loss, 1e-2, step, settings);
    const TrainStepResult got = gpu.trainer.grpo_step(batch(step), loss, 1e-2, step, settings);
    expect_close(got, want, tolerance);
  }
  const std::vector<float> master = gpu.host(gpu.master, DType::F32);
  EXPECT_LT(update_error(master, cpu.master, weights), tolerance.update);
  // The working copy is the master weights in its dtype, bit for bit.
  const std::vector<float> working = gpu.host(gpu.working, dtype);
  for (size_t i = 0; i < master.size(); ++i)
    ASSERT_EQ(working[i], dtype == DType::BF16 ? bf16_to_float(float_to_bf16(master[i])) : master[i]) << i;
}

}  // namespace

// F32: the kernels and the CPU reference differ in summation order only.
TEST(GpuPolicyTrainer, MatchesTheCpuTrainerInF32) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  for (const LossAggregation aggregation : {LossAggregation::TokenMean, LossAggregation::SeqMeanTokenMean})
    compare_with_cpu(DType::F32, aggregation, Tolerances{1e-4, 1e-4, 1e-4, 2e-3});
}

// BF16 activations and weights in forward and backward (2% on logits, 5% per gradient
// tensor in tests/gpu_model.cpp), against the FP32 reference from the same rounded weights.
TEST(GpuPolicyTrainer, MatchesTheCpuTrainerInBf16) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  compare_with_cpu(DType::BF16, LossAggregation::TokenMean, Tolerances{5e-2, 5e-2, 1e-1, 2.5e-1});
}

// Muon, its workspace in the activation slab: one step (log-probs, loss and gradient to
// FP32 rounding, as for AdamW), then the update of the GPU's BF16 Newton-Schulz against
// the FP32 twin's. A small batch's gradients have weak directions whose BF16 rounding the
// iteration lifts towards singular value 1 (random matrices agree to 5%,
// tests/gpu_muon.cpp): the H200 measured 0.089 after two steps, held here to 0.2. A
// second step's log-probs see that difference, so it is not compared.
TEST(GpuPolicyTrainer, MatchesTheCpuTrainerUnderMuon) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  compare_with_cpu(DType::F32, LossAggregation::TokenMean, Tolerances{1e-4, 1e-4, 1e-4, 2e-1}, OptimizerKind::Muon, 1);
}

// Micro-batches of at most 12 tokens (a longer sequence alone) on activations sized for
// one, against the whole batch at once: GRPO with global-token-sum (the token count goes
// through NCCL), then the supervised step.
TEST(GpuPolicyTrainer, MicroBatchedEqualsTheWholeBatch) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  const ModelConfig config = gpu_config();
  const std::vector<float> weights = tandem::testing::trainer_weights(ParameterLayout(config), 43);
  const int64_t budget = 12;
  const ActivationCapacity micro_capacity{
      std::max({budget, tandem::testing::longest_sequence(batch(1)), tandem::testing::longest_sequence(batch(2))}), 8};
  GpuTrainer whole(config, whole_capacity(), weights, DType::F32);
  GpuTrainer micro(config, micro_capacity, weights, DType::F32);
  const PolicyLossSettings loss = tandem::testing::grpo_loss(LossAggregation::GlobalTokenSum);
  const Tolerances tolerance{1e-5, 1e-5, 1e-5, 1e-3};
  for (int step = 1; step <= 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const TrainStepResult want =
        whole.trainer.grpo_step(batch(step), loss, 1e-2, step, tandem::testing::trainer_settings(0));
    const TrainStepResult got =
        micro.trainer.grpo_step(batch(step), loss, 1e-2, step, tandem::testing::trainer_settings(budget));
    expect_close(got, want, tolerance);
  }
  const TrainStepResult want = whole.trainer.sft_step(batch(1), 1e-2, 3, tandem::testing::trainer_settings(0));
  const TrainStepResult got = micro.trainer.sft_step(batch(1), 1e-2, 3, tandem::testing::trainer_settings(budget));
  expect_close(got, want, tolerance);
  EXPECT_LT(update_error(micro.host(micro.master, DType::F32), whole.host(whole.master, DType::F32), weights),
            tolerance.update);
}

// The state streamed chunk by chunk from pinned host memory (state = host) and from a
// mapped state file through the pinned bounce buffers (state = disk), in slots of 5000
// values (under Muon: its largest matrix and 777 values, so groups span several chunks):
// the same kernels on the same values in the same order as with the state on the device,
// so three steps agree bit for bit (weights, working copy, state), AdamW and Muon.
void expect_streamed_equals_device_state(OptimizerKind optimizer) {
  const ModelConfig config = gpu_config();
  const ParameterLayout layout(config);
  const std::vector<float> weights = tandem::testing::trainer_weights(layout, 47);
  size_t slot = 5000;
  if (optimizer == OptimizerKind::Muon) {
    for (const MuonGroup& group : muon_groups(layout)) slot = std::max(slot, static_cast<size_t>(777 + group.m * group.n));
    ASSERT_GT(plan_muon_chunks(muon_groups(layout), slot).size(), muon_groups(layout).size());
  }
  ASSERT_GT(plan_state_chunks(adamw_pieces(layout, optimizer, SlabShards::whole(layout)), slot).size(), 2u);
  const size_t state_bytes = 2 * layout.slab_bytes(DType::F32);
  PinnedMemory pinned(state_bytes, Device::CUDA);
  tandem::testing::TempDir dir;
  OptimizerStateFile file(dir.path() / "state", state_bytes);
  GpuTrainer device(config, whole_capacity(), weights, DType::BF16, optimizer);
  GpuTrainer host(config, whole_capacity(), weights, DType::BF16, optimizer, static_cast<float*>(pinned.data()), slot);
  GpuTrainer disk(config, whole_capacity(), weights, DType::BF16, optimizer, static_cast<float*>(file.data()), slot);
  const PolicyLossSettings loss = tandem::testing::grpo_loss(LossAggregation::TokenMean);
  PolicyTrainerSettings settings = tandem::testing::trainer_settings(0);
  settings.optimizer.kind = optimizer;
  for (int step = 1; step <= 3; ++step) {
    const auto& sequences = batch(step == 3 ? 1 : step);
    const TrainStepResult want = device.trainer.grpo_step(sequences, loss, 1e-2, step, settings);
    for (GpuTrainer* streamed : {&host, &disk}) {
      const TrainStepResult got = streamed->trainer.grpo_step(sequences, loss, 1e-2, step, settings);
      EXPECT_EQ(got.loss, want.loss) << "step " << step;
      EXPECT_EQ(got.grad_norm, want.grad_norm) << "step " << step;
      EXPECT_GT(got.state_bytes_streamed, 0u);
    }
  }
  const std::vector<float> master = device.host(device.master, DType::F32);
  const std::vector<float> working = device.host(device.working, DType::BF16);
  std::vector<float> state = device.host(device.exp_avg, DType::F32);
  const std::vector<float> second = device.host(device.exp_avg_sq, DType::F32);
  state.insert(state.end(), second.begin(), second.end());
  EXPECT_NE(master, weights);
  for (const auto& [name, streamed, values] : {std::tuple{"host", &host, static_cast<const float*>(pinned.data())},
                                               std::tuple{"disk", &disk, static_cast<const float*>(file.data())}}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(streamed->host(streamed->master, DType::F32), master);
    EXPECT_EQ(streamed->host(streamed->working, DType::BF16), working);
    // Muon's matrices leave their part of exp_avg_sq untouched (zero) in both.
    EXPECT_EQ(std::vector<float>(values, values + state.size()), state);
  }
}

TEST(GpuPolicyTrainer, StreamedAdamWStateEqualsTheDeviceStateBitForBit) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  expect_streamed_equals_device_state(OptimizerKind::AdamW);
}

TEST(GpuPolicyTrainer, StreamedMuonStateEqualsTheDeviceStateBitForBit) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  expect_streamed_equals_device_state(OptimizerKind::Muon);
}
