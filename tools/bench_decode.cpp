// bench_decode: new tokens per second of the rollout engine on one GPU, the figure to
// beat being Hugging Face `generate` on the same H200 (Qwen3-0.6B shape, 128-token
// prompts, 256 new tokens, temperature 1, static cache: 12.2k tokens/s at batch 256;
// the HBM bandwidth ceiling is about 125k).
//
//   bench_decode [--batch 256] [--prompt 128] [--new 256] [--layers 28] [--runs 2]
//                [--group 1] [--share-prompts 1] [--fp8-kv 0] [--fp8-weights 0] [--plan-ahead 1]
//
// Random BF16 weights and prompts; no stop tokens, so every sequence generates --new
// tokens. --group G gives each prompt to G sequences in a row, as a GRPO step does; they
// share the prompt's KV cache blocks unless --share-prompts 0. --fp8-kv 1 keeps the KV
// cache in FP8 E4M3 codes with scales (rollout.kv-cache-dtype = fp8). --fp8-weights 1 runs
// the q|k|v, gate|up and down projections in FP8 (rollout.weight-dtype = fp8). --plan-ahead 0 plans
// each decode step after the results of the one before (EngineOptions::plan_ahead, on by
// default: the next step is queued while one runs). The first run captures the
// decode graphs and is not timed; the figure is the best of --runs timed runs of the
// whole generate() (prefill included), wall clock. The last line times the prefill alone
// the same way: generates of one new token each.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>

#include "bench_args.h"
#include "random_weights.h"
#include "rollout/engine.h"
#include "tensor/bf16.h"
#include "tensor/memory_pool.h"
#include "world/table.h"

using namespace tandem;

int main(int argc, char** argv) {
  const ModelConfig config = ModelConfig::qwen3_0_6b(arg_int(argc, argv, "--layers", 28));
  const int batch = arg_int(argc, argv, "--batch", 256);
  const int prompt_tokens = arg_int(argc, argv, "--prompt", 128);
  const int new_tokens = arg_int(argc, argv, "--new", 256);
  const int runs = arg_int(argc, argv, "--runs", 2);
  const int group = std::max(1, arg_int(argc, argv, "--group", 1));

  const ParameterLayout layout(config);
  auto pool = MemoryPool::create(Device::CUDA, 0);
  Allocation* weights = pool->allocate(tags::weights, layout.slab_bytes(DType::BF16), "engine.weights");
  {
    const std::vector<float> host = random_weights(layout, 1);
    std::vector<uint16_t> bf16(host.size());
    for (size_t i = 0; i < host.size(); ++i) bf16[i] = float_to_bf16(host[i]);
    if (cudaMemcpy(weights->ptr, bf16.data(), bf16.size() * 2, cudaMemcpyHostToDevice) != cudaSuccess) {
      std::fprintf(stderr, "bench_decode: weight upload failed\n");
      return 1;
    }
  }
  EngineOptions options;
  options.dtype = DType::BF16;
  options.max_running = batch;
  options.max_step_tokens = std::max(batch, 8192);
  options.max_sequence_length = prompt_tokens + new_tokens;
  options.share_prompts = arg_int(argc, argv, "--share-prompts", 1) != 0;
  options.fp8_kv_cache = arg_int(argc, argv, "--fp8-kv", 0) != 0;
  options.fp8_weights = arg_int(argc, argv, "--fp8-weights", 0) != 0;
  options.plan_ahead = arg_int(argc, argv, "--plan-ahead", 1) != 0;
  const KvCacheGeometry block = KvCacheGeometry::for_blocks(
      config, 1, options.block_size, options.fp8_kv_cache ? DType::F8_E4M3 : DType::BF16);
  const int64_t blocks_per_sequence = (options.max_sequence_length + options.block_size - 1) / options.block_size;
  options.kv_cache_bytes = static_cast<size_t>(batch * blocks_per_sequence) * block.block_bytes();
  Engine engine(config, ParameterSet::bind(layout, weights->ptr, DType::BF16, Device::CUDA), *pool, options);

  std::mt19937 rng(2);
  auto requests = [&](uint64_t seed, int max_new_tokens) {
    std::vector<GenerationRequest> list(batch);
    for (int b = 0; b < batch; ++b) {
      list[b].id = static_cast<uint64_t>(b);
      if (b % group == 0) {
        list[b].prompt.resize(prompt_tokens);
        for (int32_t& id : list[b].prompt) id = static_cast<int32_t>(rng() % config.vocab);
      } else {
        list[b].prompt = list[b - 1].prompt;
      }
      list[b].sampling.temperature = 1;
      list[b].sampling.max_new_tokens = max_new_tokens;
      list[b].sampling.seed = seed;
    }
    return list;
  };
  engine.generate(requests(0, new_tokens));  // captures the graphs
  // The best of `runs` timed generates of max_new_tokens each, and the new tokens of one.
  struct Timed {
    double seconds = 1e30;
    int64_t new_tokens = 0;
  };
  auto best_of_runs = [&](int max_new_tokens) {
    Timed best;
    for (int r = 0; r < runs; ++r) {
      const EngineStats before = engine.stats();
      const auto start = std::chrono::steady_clock::now();
      engine.generate(requests(static_cast<uint64_t>(r + 1), max_new_tokens));
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best.seconds = std::min(best.seconds, seconds);
      best.new_tokens = engine.stats().generated_tokens - before.generated_tokens;
    }
    return best;
  };
  const Timed whole = best_of_runs(new_tokens);
  const EngineStats stats = engine.stats();
  const MemoryStats memory = pool->stats();
  // The prefill's share: new prompts with one new token each, which the prefill's last
  // logits give without a decode step.
  const Timed prefill = best_of_runs(1);
  std::printf("bench_decode: Qwen3-0.6B shape, %d layers, batch %d, %d-token prompts, %d new tokens, BF16%s",
              config.layers, batch, prompt_tokens, new_tokens, options.fp8_kv_cache ? ", KV cache FP8 E4M3" : "");
  if (group > 1)
    std::printf(", groups of %d (%s, %lld prompt tokens shared over the runs)", group,
                options.share_prompts ? "prompt blocks shared" : "prompts apart",
                static_cast<long long>(engine.stats().shared_prompt_tokens));
  if (options.fp8_weights) std::printf(", FP8 E4M3 projections");
  if (!options.plan_ahead) std::printf(", each step planned after the results of the one before");
  std::printf("\n");
  std::printf("  %.3f s per generate | %.0f new tokens/s | %lld graphs | %lld steps (%lld planned ahead) | pool device peak %s\n",
              whole.seconds, static_cast<double>(whole.new_tokens) / whole.seconds,
              static_cast<long long>(stats.graphs_captured), static_cast<long long>(stats.steps),
              static_cast<long long>(stats.steps_planned_ahead), format_bytes(static_cast<double>(memory.device_peak)).c_str());
  std::printf("  prefill %.3f s (a generate of 1 new token) | %.0f prompt tokens/s | %.1f%% of the generate\n",
              prefill.seconds, static_cast<double>(batch) * prompt_tokens / prefill.seconds,
              100.0 * prefill.seconds / whole.seconds);
  return 0;
}
#else
int main() {
  std::fprintf(stderr, "bench_decode: this build has no CUDA backend\n");
  return 1;
}
#endif
