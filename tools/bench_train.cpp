// bench_train: training throughput of the decoder on one GPU, the figure to beat being
// PyTorch on the same H200 (Qwen3-0.6B shape, 8 x 1024 tokens, bf16 autocast + FP32
// AdamW: eager 41.9k tokens/s, torch.compile 81.4k).
//
//   bench_train [--layers 28] [--sequences 8] [--length 1024] [--steps 10] [--optimizer adamw|muon]
//               [--state device|host|disk] [--state-path /tmp] [--chunk-bytes 67108864]
//
// One step: zero grads, forward, token log-prob loss (fused, in place), backward, AdamW
// (or Muon for the layers' matrices and AdamW for the rest) on FP32 master weights
// writing the BF16 working copy. Timed with CUDA events; the optimizer step alone is
// timed apart (wall clock, the device idle before and after) on the last lines. With
// --state host | disk the optimizer state lives in pinned host memory or in a mapped
// state file under --state-path, and the trainer's OptimizerStep streams it through two
// device slots of --chunk-bytes; a last line gives the streaming rate.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>

#include "logprobs.cuh"
#include "model/cuda_ops.h"
#include "model/cross_entropy.h"
#include "model/transformer.h"
#include "bench_args.h"
#include "random_weights.h"
#include "tensor/memory_pool.h"
#include "train/optimizer_settings.h"
#include "train/optimizer_state_file.h"
#include "train/optimizer_step.h"
#include "train/trainer_backend.h"
#include "world/pinned_memory.h"
#include "world/table.h"

using namespace tandem;

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "bench_train: %s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const ModelConfig config = ModelConfig::qwen3_0_6b(arg_int(argc, argv, "--layers", 28));
  const int sequences = arg_int(argc, argv, "--sequences", 8);
  const int length = arg_int(argc, argv, "--length", 1024);
  const int steps = arg_int(argc, argv, "--steps", 10);
  const OptimizerKind optimizer = optimizer_kind_from_name(arg_text(argc, argv, "--optimizer", "adamw"));
  const int64_t T = static_cast<int64_t>(sequences) * length;

  const ParameterLayout layout(config);
  const int64_t P = layout.slab_elements();
  auto pool = MemoryPool::create(Device::CUDA, 0);
  Allocation* master = pool->allocate(tags::master_weights, layout.slab_bytes(DType::F32), "master");
  Allocation* working = pool->allocate(tags::derived, layout.slab_bytes(DType::BF16), "working");
  Allocation* grads_slab = pool->allocate(tags::grads, layout.slab_bytes(DType::F32), "grads");
  const std::string state = arg_text(argc, argv, "--state", "device");
  const size_t chunk_bytes = static_cast<size_t>(std::atoll(arg_text(argc, argv, "--chunk-bytes", "67108864")));
  const bool streamed = state != "device";
  const bool muon = optimizer == OptimizerKind::Muon;
  // The state: two device slabs, or host memory / a state file and two device slots.
  const size_t state_bytes = 2 * layout.slab_bytes(DType::F32);
  std::unique_ptr<PinnedMemory> host_state;
  std::unique_ptr<OptimizerStateFile> file_state;
  if (state == "host") host_state = std::make_unique<PinnedMemory>(state_bytes, Device::CUDA);
  if (state == "disk")
    file_state = std::make_unique<OptimizerStateFile>(
        std::string(arg_text(argc, argv, "--state-path", "/tmp")) + "/bench_train.optimizer-state", state_bytes);
  OptimizerSettings settings;
  settings.kind = optimizer;
  settings.chunk_bytes = chunk_bytes;
  size_t slot_bytes = chunk_bytes;
  if (muon)
    for (const MuonGroup& group : muon_groups(layout)) slot_bytes = std::max(slot_bytes, static_cast<size_t>(group.m * group.n) * 4);
  Allocation* exp_avg = streamed ? nullptr : pool->allocate(tags::optimizer, layout.slab_bytes(DType::F32), "exp_avg");
  Allocation* exp_avg_sq = streamed ? nullptr : pool->allocate(tags::optimizer, layout.slab_bytes(DType::F32), "exp_avg_sq");
  Allocation* staging = streamed ? pool->allocate(tags::optimizer, 2 * slot_bytes, "staging") : nullptr;
  const ActivationCapacity capacity{T, sequences};
  const std::vector<MuonGroup> muon_matrices = muon ? muon_groups(layout) : std::vector<MuonGroup>{};
  // As in the trainer, Muon's workspace is the activation slab once backward is done.
  Allocation* acts_slab = pool->allocate(
      tags::activations,
      std::max(Activations::slab_bytes(config, capacity, DType::BF16), MuonWorkspace::bytes_for(muon_matrices)),
      "activations");
  Allocation* loss_slab = pool->allocate(tags::activations, static_cast<size_t>(T) * 16, "loss");

  {
    const std::vector<float> host = random_weights(layout, 1);
    check(cudaMemcpy(master->ptr, host.data(), P * 4, cudaMemcpyHostToDevice), "upload weights");
  }
  // The step runs as the trainer runs it: the decoder's ops and the optimizer step
  // (OptimizerStep) on one trainer backend's stream.
  std::unique_ptr<TrainerBackend> backend = make_cuda_trainer_backend();
  CudaOps& ops = dynamic_cast<CudaOps&>(backend->ops());
  const AdamWSettings adamw{.lr = 1e-5, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  settings.adamw = adamw;
  auto flat = [&](void* data, DType dtype, Device device) { return Tensor::view(data, dtype, device, {P}); };
  float* store = streamed ? static_cast<float*>(host_state ? host_state->data() : file_state->data()) : nullptr;
  const PolicyTrainerMemory memory{
      flat(master->ptr, DType::F32, Device::CUDA),
      flat(grads_slab->ptr, DType::F32, Device::CUDA),
      streamed ? flat(store, DType::F32, Device::CPU) : flat(exp_avg->ptr, DType::F32, Device::CUDA),
      streamed ? flat(store + P, DType::F32, Device::CPU) : flat(exp_avg_sq->ptr, DType::F32, Device::CUDA),
      flat(working->ptr, DType::BF16, Device::CUDA),
      acts_slab->ptr,
      streamed ? static_cast<float*>(staging->ptr) : nullptr,
      streamed ? slot_bytes / 4 : 0};
  OptimizerStep step_optimizer(layout, SlabShards::whole(layout), memory, *backend);
  size_t streamed_bytes = 0;  // by the last streamed step
  auto optimizer_step = [&](int64_t step) { streamed_bytes = step_optimizer.run(settings, adamw.lr, step); };
  optimizer_step(1);  // also writes the first BF16 working copy

  const ParameterSet params = ParameterSet::bind(layout, working->ptr, DType::BF16, Device::CUDA);
  const ParameterSet grads = ParameterSet::bind(layout, grads_slab->ptr, DType::F32, Device::CUDA);
  Activations acts = Activations::bind(config, capacity, acts_slab->ptr, DType::BF16, Device::CUDA);
  Transformer transformer(config, ops);

  std::vector<int32_t> ids(T), cu_seqlens(sequences + 1);
  std::mt19937 rng(2);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % config.vocab);
  for (int s = 0; s <= sequences; ++s) cu_seqlens[s] = s * length;
  const std::vector<int32_t> targets = next_token_targets(ids, cu_seqlens);
  const auto counted = std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t >= 0; });
  auto* loss_base = static_cast<std::byte*>(loss_slab->ptr);
  const Tensor targets_t = Tensor::view(loss_base, DType::I32, Device::CUDA, {T});
  const Tensor logp = Tensor::view(loss_base + 4 * T, DType::F32, Device::CUDA, {T});
  const Tensor lse = Tensor::view(loss_base + 8 * T, DType::F32, Device::CUDA, {T});
  const Tensor dlogp = Tensor::view(loss_base + 12 * T, DType::F32, Device::CUDA, {T});
  ops.copy_from_host(targets_t, targets.data());
  const std::vector<float> mean_weight(T, -1.0f / static_cast<float>(counted));
  ops.copy_from_host(dlogp, mean_weight.data());

  auto train_step = [&](int64_t step) {
    ops.zero(Tensor::view(grads_slab->ptr, DType::F32, Device::CUDA, {P}));
    const Tensor logits = transformer.forward(params, acts, ids, cu_seqlens);
    cuda::token_logprobs_forward(logp, Tensor{}, lse, logits, targets_t, 1.0f, ops.stream());
    cuda::token_logprobs_backward(logits, logits, targets_t, lse, Tensor{}, dlogp, Tensor{}, 1.0f, ops.stream());
    transformer.backward(params, grads, acts, logits);
    optimizer_step(step);
  };
  auto mean_loss = [&] {
    std::vector<float> values(T);
    check(cudaMemcpy(values.data(), logp.data, T * 4, cudaMemcpyDeviceToHost), "read loss");
    double sum = 0;
    for (float v : values) sum -= v;
    return sum / static_cast<double>(counted);
  };

  train_step(2);
  train_step(3);
  ops.synchronize();
  std::printf("warm-up loss %.4f (uniform over the vocabulary: %.4f)\n", mean_loss(), std::log(double(config.vocab)));
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, ops.stream());
  for (int i = 0; i < steps; ++i) train_step(4 + i);
  cudaEventRecord(stop, ops.stream());
  check(cudaEventSynchronize(stop), "timed steps");
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  // The optimizer step alone, on the last step's gradients.
  ops.synchronize();
  const auto optimizer_start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) optimizer_step(4 + steps + i);
  ops.synchronize();
  const float optimizer_ms = static_cast<float>(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - optimizer_start).count());
  const double seconds_per_step = ms / 1e3 / steps;
  const double tokens_per_s = static_cast<double>(T) / seconds_per_step;
  const double n_params = static_cast<double>(layout.parameter_count());
  // 6N per token for the weights, plus causal attention: 6 * layers * length * heads*head_dim / ... (QKᵀ and PV,
  // forward 2*2*length/2*q_dim per token and layer, backward twice that).
  const double flops_per_token = 6.0 * n_params + 6.0 * config.layers * length * config.q_dim();
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  const MemoryStats stats = pool->stats();
  std::printf("bench_train: Qwen3-0.6B shape, %d layers, %.1fM parameters, %d x %d tokens, BF16 + FP32 %s\n",
              config.layers, n_params / 1e6, sequences, length, muon ? "Muon (matrices) + AdamW" : "AdamW");
  std::printf("  step %.1f ms | %.0f tokens/s | %.1f TFLOP/s (6N + attention) | loss %.4f\n", seconds_per_step * 1e3,
              tokens_per_s, tokens_per_s * flops_per_token / 1e12, mean_loss());
  std::printf("  pool device peak %s (", format_bytes(static_cast<double>(stats.device_peak)).c_str());
  for (const auto& [tag, usage] : stats.per_tag) std::printf(" %s %s", tag.c_str(), format_bytes(usage.device_peak).c_str());
  std::printf(" ) | GPU in use %s of %s\n", format_bytes(static_cast<double>(total_bytes - free_bytes)).c_str(),
              format_bytes(static_cast<double>(total_bytes)).c_str());
  std::printf("  optimizer step %.2f ms (%.1f%% of the step) | %s\n", optimizer_ms / steps,
              100.0 * optimizer_ms / steps / (seconds_per_step * 1e3), optimizer_kind_name(optimizer));
  if (streamed)
    std::printf("  state on %s: 2 slots of %s | %s read + written per step at %.2f GB/s\n", state.c_str(),
                format_bytes(static_cast<double>(slot_bytes)).c_str(), format_bytes(static_cast<double>(streamed_bytes)).c_str(),
                streamed_bytes / (optimizer_ms / steps * 1e-3) / 1e9);
  return 0;
}
#else
#include <cstdio>
int main() {
  std::fprintf(stderr, "bench_train: this build has no CUDA backend\n");
  return 1;
}
#endif
