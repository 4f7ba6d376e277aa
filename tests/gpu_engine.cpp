// The rollout engine on CUDA (paged attention kernels, GPU sampling, decode graphs)
// against the CPU engine and the trainer's full forward, on tiny random models:
//   F32: the same tokens as the CPU engine for greedy and full-vocabulary sampling (the
//        draws come from the same host streams), log-probs within 1e-4 (5e-3 with both
//        KV caches in FP8 codes);
//   BF16: greedy is the argmax of the trainer's BF16 full forward at every step, up to
//        near-ties (a gap below 2e-2 of the logit scale), log-probs within 5e-2 + 3% (two
//        BF16 forwards through different attention kernels, rounded at every op);
//   FP8 projections: log-probs as near the trainer's full forward (on the engine's own
//        tokens) as the CPU engine's, within twice its gap + 0.05;
//   graphs: captured once per decode batch size and still right after the weights and
//        the KV cache went off the device and came back (stable addresses), none re-captured;
//        with FP8 projections, their codes made again after the drop.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "model/cuda_ops.h"
#include "rollout/engine.h"
#include "support.h"
#include "tensor/bf16.h"
#include "tensor/device_copy.h"
#include "test_rollout_support.h"

using namespace tandem;
using tandem::testing::largest_logprob_gap;
using tandem::testing::random_prompt;
using tandem::testing::TinyModel;

namespace {

ModelConfig engine_config() {
  ModelConfig config = tandem::testing::gpu_sized(tandem::testing::tiny_config(true, false, true));
  config.max_position = 256;  // room for the longest prompt and its completion
  return config;
}

EngineOptions engine_options(DType dtype) {
  EngineOptions options;
  options.kv_cache_bytes = size_t{4} << 20;
  options.block_size = 16;
  options.max_running = 8;
  options.max_step_tokens = 64;  // prompts longer than this are prefilled in chunks
  options.dtype = dtype;
  return options;
}

// Twelve prompts of 3 to 90 tokens with different lengths to generate, so the decode
// batch shrinks through several graph sizes; odd ones greedy, even ones sampled.
std::vector<GenerationRequest> mixed_requests(int vocab) {
  std::vector<GenerationRequest> requests;
  for (uint64_t i = 0; i < 12; ++i) {
    GenerationRequest request{i, random_prompt(3 + 8 * i, vocab, static_cast<uint32_t>(100 + i)), {}};
    request.sampling.temperature = i % 2 ? 0.0f : 1.0f;
    request.sampling.max_new_tokens = static_cast<int>(6 + 3 * i);
    request.sampling.seed = 11;
    requests.push_back(std::move(request));
  }
  return requests;
}

// The tiny model's weights in `dtype` in a CUDA pool allocation.
struct DeviceWeights {
  DeviceWeights(MemoryPool& pool, const TinyModel& model, DType dtype) : pool(pool) {
    allocation = pool.allocate(tags::weights, model.layout.slab_bytes(dtype), "test.engine_weights");
    if (dtype == DType::BF16) {
      std::vector<uint16_t> bits(model.weights.size());
      for (size_t i = 0; i < bits.size(); ++i) bits[i] = float_to_bf16(model.weights[i]);
      copy_host_to_tensor(Tensor::view(allocation->ptr, dtype, Device::CUDA, {static_cast<int64_t>(bits.size())}), bits.data());
    } else {
      copy_host_to_tensor(Tensor::view(allocation->ptr, dtype, Device::CUDA, {static_cast<int64_t>(model.weights.size())}),
                          model.weights.data());
    }
    params = ParameterSet::bind(model.layout, allocation->ptr, dtype, Device::CUDA);
  }
  ~DeviceWeights() { pool.release(allocation); }
  MemoryPool& pool;
  Allocation* allocation = nullptr;
  ParameterSet params;
};

// One tiny model in F32 on both sides, and an engine with `options` on each.
struct CpuAndGpuEngines {
  CpuAndGpuEngines(const EngineOptions& options, ActivationCapacity capacity)
      : model(engine_config(), capacity),
        cpu_pool(MemoryPool::create(Device::CPU)),
        gpu_pool(MemoryPool::create(Device::CUDA, 0)),
        weights(*gpu_pool, model, DType::F32),
        cpu(model.config, model.params, *cpu_pool, options),
        gpu(model.config, weights.params, *gpu_pool, options) {}
  TinyModel model;
  std::unique_ptr<MemoryPool> cpu_pool, gpu_pool;
  DeviceWeights weights;
  Engine cpu, gpu;
};

// Also with an FP8 KV cache on both sides: the GPU codes the same FP32 keys and values as
// the CPU, but a key that differs in its last bit (another order of the norm's sum) can
// land on the other side of a rounding point, a code step (1/16 of one element) apart:
// log-probs within 5e-3 there.
class GpuEngineF32 : public ::testing::TestWithParam<bool> {};

TEST_P(GpuEngineF32, MatchesTheCpuEngineTokenForToken) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  const bool fp8 = GetParam();
  EngineOptions options = engine_options(DType::F32);
  options.fp8_kv_cache = fp8;
  CpuAndGpuEngines engines(options, {512, 32});
  Engine& gpu = engines.gpu;
  const std::vector<Completion> expected = engines.cpu.generate(mixed_requests(engines.model.config.vocab));
  const std::vector<Completion> got = gpu.generate(mixed_requests(engines.model.config.vocab));
  ASSERT_EQ(got.size(), expected.size());
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_EQ(got[r].tokens, expected[r].tokens) << "request " << r;
    ASSERT_EQ(got[r].logprobs.size(), expected[r].logprobs.size());
    for (size_t t = 0; t < got[r].logprobs.size(); ++t)
      EXPECT_NEAR(got[r].logprobs[t], expected[r].logprobs[t], fp8 ? 5e-3 : 1e-4) << "request " << r << " token " << t;
  }
  EXPECT_GE(gpu.stats().graphs_captured, 3) << "the shrinking decode batch should have used several graph sizes";
  EXPECT_GT(gpu.stats().steps_planned_ahead, 0);
  EXPECT_EQ(gpu.free_blocks(), gpu.total_blocks());
  EXPECT_EQ(gpu.cache_geometry().dtype, fp8 ? DType::F8_E4M3 : DType::F32);
}

INSTANTIATE_TEST_SUITE_P(KvCache, GpuEngineF32, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Fp8Cache" : "F32Cache");
                         });

// FP8 projections cannot match the CPU engine token for token: the FP8 tensor cores add
// their products with fewer bits than FP32 (tests/gpu_ops_fp8.cpp), so a token's input
// codes can land a step apart, and a sample near a boundary of the draw goes another way.
// What must hold: the GPU engine's log-probs stay as near the trainer's on its own tokens
// as the CPU engine's (the same FP8 arithmetic in FP32) stay on its tokens.
TEST(GpuEngine, Fp8ProjectionsStayAsNearTheTrainerAsTheCpuEngines) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  EngineOptions options = engine_options(DType::F32);
  options.fp8_weights = true;
  CpuAndGpuEngines engines(options, {1024, 32});
  const std::vector<GenerationRequest> requests = mixed_requests(engines.model.config.vocab);
  const double cpu_gap = largest_logprob_gap(engines.model, requests, engines.cpu.generate(requests));
  const double gpu_gap = largest_logprob_gap(engines.model, requests, engines.gpu.generate(requests));
  std::printf("largest log-prob difference to the trainer's: CPU engine %.3g, GPU engine %.3g\n", cpu_gap, gpu_gap);
  EXPECT_GT(gpu_gap, 1e-3) << "the projections should round";
  EXPECT_LT(gpu_gap, 2 * cpu_gap + 0.05);
}

// With FP8 projections too, whose codes (in the step scratch) are dropped with the cache
// and made again when the engine takes up work.
class GpuEngineGraphs : public ::testing::TestWithParam<bool> {};

TEST_P(GpuEngineGraphs, SurviveOffloadAndOnloadWithoutRecapture) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  TinyModel model(engine_config(), {512, 32});
  auto pool = MemoryPool::create(Device::CUDA, 0);
  DeviceWeights weights(*pool, model, DType::BF16);
  EngineOptions options = engine_options(DType::BF16);
  options.fp8_weights = GetParam();
  Engine engine(model.config, weights.params, *pool, options);
  const std::vector<Completion> before = engine.generate(mixed_requests(model.config.vocab));
  const int64_t graphs = engine.stats().graphs_captured;
  ASSERT_GT(graphs, 0);

  // As between two rollouts of a colocated run: weights to the host, the KV cache (and the
  // step scratch under its tag) dropped, both back.
  pool->offload(tags::weights);
  pool->drop(tags::kv_cache);
  EXPECT_EQ(pool->stats().per_tag.at("kv_cache").device_bytes, 0u);
  pool->onload(tags::kv_cache);
  pool->onload(tags::weights);

  const std::vector<Completion> after = engine.generate(mixed_requests(model.config.vocab));
  EXPECT_EQ(engine.stats().graphs_captured, graphs);
  for (size_t r = 0; r < before.size(); ++r) EXPECT_EQ(after[r].tokens, before[r].tokens) << "request " << r;
}

INSTANTIATE_TEST_SUITE_P(Weights, GpuEngineGraphs, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Fp8Projections" : "WorkingDtype");
                         });

TEST(GpuEngine, Bf16GreedyIsTheArgmaxOfTheFullForward) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  TinyModel model(engine_config(), {512, 32});
  auto pool = MemoryPool::create(Device::CUDA, 0);
  DeviceWeights weights(*pool, model, DType::BF16);
  Engine engine(model.config, weights.params, *pool, engine_options(DType::BF16));
  std::vector<GenerationRequest> requests = mixed_requests(model.config.vocab);
  for (GenerationRequest& request : requests) request.sampling.temperature = 0;
  const std::vector<Completion> completions = engine.generate(requests);

  const int V = model.config.vocab;
  const ActivationCapacity capacity{512, 1};
  Allocation* acts_slab = pool->allocate(tags::activations, Activations::slab_bytes(model.config, capacity, DType::BF16), "test.acts");
  Activations acts = Activations::bind(model.config, capacity, acts_slab->ptr, DType::BF16, Device::CUDA);
  CudaOps ops;
  Transformer transformer(model.config, ops);
  int near_ties = 0, tokens = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    std::vector<int32_t> sequence = requests[r].prompt;
    sequence.insert(sequence.end(), completions[r].tokens.begin(), completions[r].tokens.end());
    const std::vector<int32_t> cu_seqlens = {0, static_cast<int32_t>(sequence.size())};
    const Tensor logits = transformer.forward(weights.params, acts, sequence, cu_seqlens);
    ops.synchronize();
    std::vector<uint16_t> bits(logits.numel());
    copy_tensor_to_host(bits.data(), logits);
    std::vector<float> row(V);
    for (size_t i = 0; i < completions[r].tokens.size(); ++i, ++tokens) {
      const size_t position = requests[r].prompt.size() - 1 + i;
      float max = -INFINITY, scale = 0;
      for (int v = 0; v < V; ++v) {
        row[v] = bf16_to_float(bits[position * V + v]);
        max = std::max(max, row[v]);
        scale = std::max(scale, std::fabs(row[v]));
      }
      const int32_t token = completions[r].tokens[i];
      if (row[token] != max) {
        ++near_ties;
        EXPECT_LT(max - row[token], 2e-2 * scale) << "request " << r << " step " << i;
      }
      const double reference = tandem::testing::reference_logprob(row.data(), V, token, 1.0);
      EXPECT_NEAR(completions[r].logprobs[i], reference, 5e-2 + 3e-2 * std::fabs(reference))
          << "request " << r << " step " << i;
    }
  }
  EXPECT_LE(near_ties, tokens / 10) << "greedy should mostly pick the full forward's argmax exactly";
  pool->release(acts_slab);
}

}  // namespace
