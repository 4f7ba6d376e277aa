// The GPU sampler (kernels/sampling.cu through CudaSampler) against its CPU twin, the
// Sampler of src/rollout/sampler.h, given the same uniform draws:
// - greedy: the CPU's argmax (lowest index on ties), F32 and BF16, V = 151936 and small;
// - no truncation: the CPU's token for the same u, except when u * sum lands within
//   rounding of a boundary (libm and CUDA exp differ by an ulp): at most 1% of rows may
//   differ; log-probs within 1e-5 for F32 and BF16 alike, since the CPU is given the same
//   BF16-rounded values upcast;
// - top-k / top-p / both, ties cut included: never a token outside the CPU's kept set; the
//   token is the inverse CDF of u over the kept set in INDEX order (the GPU's order) for
//   all but 0.01% of rows; and a chi-square test of 200,000 draws in one launch against the
//   exact truncated distribution (p = 1e-4; seeds fixed, so the test is deterministic);
// - a CUDA graph of launch() replayed with new draws, rows of several tiles;
// - rows holding a NaN, a +inf or only -inf: id -1, with each kind of draw;
// - the token feed of a step queued ahead (kernels/token_feed.cu through CudaRowSampler)
//   against CpuRowSampler's, from the same greedy rows: the same ids.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "rollout/cpu_row_sampler.h"
#include "rollout/cuda_row_sampler.h"
#include "rollout/cuda_sampler.h"
#include "rollout/sampler.h"
#include "support.h"
#include "tensor/bf16.h"
#include "tensor/device_copy.h"

using namespace tandem;

namespace {

struct DeviceLogits {
  void* data = nullptr;
  Tensor tensor;
  // Uploads rows x V values in `dtype`; BF16 values must already be BF16-exact.
  DeviceLogits(const std::vector<float>& values, int64_t rows, int64_t V, DType dtype) {
    EXPECT_EQ(cudaMalloc(&data, values.size() * dtype_size(dtype)), cudaSuccess);
    tensor = Tensor::view(data, dtype, Device::CUDA, {rows, V});
    if (dtype == DType::BF16) {
      std::vector<uint16_t> bits(values.size());
      for (size_t i = 0; i < bits.size(); ++i) bits[i] = float_to_bf16(values[i]);
      copy_host_to_tensor(tensor, bits.data());
    } else {
      copy_host_to_tensor(tensor, values.data());
    }
  }
  ~DeviceLogits() { cudaFree(data); }
};

std::vector<float> random_logits(int64_t rows, int64_t V, DType dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> logits(rows * V);
  for (auto& x : logits) x = normal(rng);
  if (dtype == DType::BF16)
    for (auto& x : logits) x = bf16_to_float(float_to_bf16(x));  // both sides see the same values
  return logits;
}

// The draw as the GPU receives it (FP32), given to the CPU too.
double float_draw(std::mt19937_64& rng) {
  SamplingParams any;
  return std::min(static_cast<float>(draw_uniform(any, rng)), std::nextafter(1.0f, 0.0f));
}

std::vector<SampledToken> gpu_sample(const std::vector<float>& logits, int64_t rows, int64_t V, DType dtype,
                                     const std::vector<SamplingParams>& params, const std::vector<double>& u) {
  DeviceLogits device(logits, rows, V, dtype);
  CudaSampler sampler(rows, V);
  sampler.stage(params, u, nullptr);
  sampler.launch(device.tensor, nullptr);
  sampler.send(nullptr);
  return sampler.results(rows);
}

// log softmax(row / T)[id] over the full row, in double from the CPU's FP32 z.
double reference_logprob(std::span<const float> row, float temperature, int32_t id) {
  const float T = temperature == 0 ? 1.f : temperature;
  float max = -INFINITY;
  for (float x : row) max = std::max(max, x / T);
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x / T - max));
  return static_cast<double>(row[id] / T - max) - std::log(sum);
}

// The CPU's kept set (most likely first, ties to the lower index; top k, then the smallest
// prefix holding top_p of their mass) as weights: exp(z - max) where kept, 0 elsewhere.
std::vector<double> kept_weights(std::span<const float> row, const SamplingParams& params) {
  const int64_t V = static_cast<int64_t>(row.size());
  float max = -INFINITY;
  for (float x : row) max = std::max(max, x / params.temperature);
  std::vector<float> w(V);
  for (int64_t i = 0; i < V; ++i) w[i] = std::exp(row[i] / params.temperature - max);
  std::vector<int64_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return w[a] > w[b]; });
  const int64_t k = params.top_k > 0 ? std::min<int64_t>(params.top_k, V) : V;
  double mass = 0;
  for (int64_t j = 0; j < k; ++j) mass += w[order[j]];
  int64_t count = 0;
  double prefix = 0;
  while (count < k) {
    prefix += w[order[count++]];
    if (prefix >= params.top_p * mass) break;
  }
  std::vector<double> kept(V, 0.0);
  for (int64_t j = 0; j < count; ++j) kept[order[j]] = w[order[j]];
  return kept;
}

// The GPU's choice: the inverse CDF of u over the kept weights in index order.
int32_t index_order_pick(const std::vector<double>& kept, double u) {
  const double target = u * std::accumulate(kept.begin(), kept.end(), 0.0);
  double sum = 0;
  int32_t last = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    if (kept[i] <= 0) continue;
    last = static_cast<int32_t>(i);
    sum += kept[i];
    if (sum > target) return last;
  }
  return last;
}

// Chi-square quantile at p = 1e-4 (Wilson-Hilferty).
double chi_square_critical(int degrees_of_freedom) {
  const double d = degrees_of_freedom, z = 3.719;
  return d * std::pow(1 - 2 / (9 * d) + z * std::sqrt(2 / (9 * d)), 3);
}

void check_against_cpu(int64_t rows, int64_t V, DType dtype, bool greedy, uint64_t seed) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " V=" + std::to_string(V) + (greedy ? " greedy" : " sampled"));
  std::mt19937_64 rng(seed);
  std::vector<float> logits = random_logits(rows, V, dtype, rng);
  if (greedy)  // a second copy of the maximum, later in the row: the first one wins
    for (int64_t b = 0; b < rows; b += 2) {
      float* row = logits.data() + b * V;
      row[V - 1] = *std::max_element(row, row + V);
    }
  const float temperatures[] = {0.6f, 1.0f, 1.4f};
  std::vector<SamplingParams> params(rows);
  std::vector<double> u(rows);
  for (int64_t b = 0; b < rows; ++b) {
    params[b].temperature = greedy ? 0.f : temperatures[b % 3];
    u[b] = greedy ? 0 : float_draw(rng);
  }
  const std::vector<SampledToken> gpu = gpu_sample(logits, rows, V, dtype, params, u);
  Sampler cpu;
  int64_t differ = 0;
  for (int64_t b = 0; b < rows; ++b) {
    const std::span<const float> row(logits.data() + b * V, V);
    const SampledToken expected = cpu.sample(row, params[b], u[b]);
    if (greedy) ASSERT_EQ(gpu[b].id, expected.id) << "row " << b;
    differ += gpu[b].id != expected.id;
    ASSERT_GE(gpu[b].id, 0);
    ASSERT_LT(gpu[b].id, V);
    ASSERT_NEAR(gpu[b].logprob, reference_logprob(row, params[b].temperature, gpu[b].id), 1e-5) << "row " << b;
  }
  EXPECT_LE(differ, std::max<int64_t>(1, rows / 100)) << "tokens that differ from the CPU twin's";
}

}  // namespace

TEST(GpuSampling, GreedyIsTheCpuArgmax) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  for (DType dtype : {DType::F32, DType::BF16}) {
    check_against_cpu(16, 151936, dtype, true, 1);
    check_against_cpu(64, 1000, dtype, true, 2);
    check_against_cpu(8, 3, dtype, true, 3);
  }
}

TEST(GpuSampling, FullVocabularyDrawIsTheCpuTwinsForTheSameDraw) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  for (DType dtype : {DType::F32, DType::BF16}) {
    check_against_cpu(64, 151936, dtype, false, 4);
    check_against_cpu(256, 1000, dtype, false, 5);
    check_against_cpu(8, 3, dtype, false, 6);
  }
}

struct TruncationCase {
  const char* name;
  std::vector<float> logits;
  SamplingParams params;
  int support;  // tokens the CPU keeps
};

SamplingParams params_of(float temperature, int top_k, float top_p) {
  SamplingParams p;
  p.temperature = temperature, p.top_k = top_k, p.top_p = top_p;
  return p;
}

std::vector<float> small_logits() {
  std::vector<float> logits(32);
  for (int i = 0; i < 32; ++i) logits[i] = std::sin(1.7f * i) * 2.f + (i % 5) * 0.3f;
  return logits;
}

std::vector<float> tied_logits() {  // three tokens tie for the top, four for the next place
  std::vector<float> logits(32, -1.f);
  for (int i : {9, 3, 27}) logits[i] = 2.f;
  for (int i : {30, 1, 14, 22}) logits[i] = 1.f;
  return logits;
}

TEST(GpuSampling, TruncatedDrawsFollowTheTruncatedDistribution) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  const std::vector<TruncationCase> cases = {
      {"top_k", small_logits(), params_of(1.0f, 5, 1.0f), 5},
      {"top_p", small_logits(), params_of(0.7f, 0, 0.8f), -1},
      {"top_k_top_p", small_logits(), params_of(1.2f, 10, 0.7f), -1},
      {"top_k_cuts_a_tie", tied_logits(), params_of(1.0f, 2, 1.0f), 2},
      {"top_k_then_top_p_in_a_tie", tied_logits(), params_of(1.0f, 5, 0.9f), 4},
      {"top_p_cuts_equal_tokens", std::vector<float>(32, 0.5f), params_of(1.0f, 0, 0.4f), 13},
  };
  constexpr int64_t kRows = 200000, V = 32;
  for (const TruncationCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<double> kept = kept_weights(c.logits, c.params);
    const int support = static_cast<int>(std::count_if(kept.begin(), kept.end(), [](double w) { return w > 0; }));
    if (c.support > 0) ASSERT_EQ(support, c.support);
    if (c.name == std::string("top_k_cuts_a_tie")) ASSERT_TRUE(kept[3] > 0 && kept[9] > 0 && kept[27] == 0);
    ASSERT_GT(support, 1);
    ASSERT_LT(support, V);

    std::vector<float> logits;
    for (int64_t b = 0; b < kRows; ++b) logits.insert(logits.end(), c.logits.begin(), c.logits.end());
    std::mt19937_64 rng(20250601);
    std::vector<double> u(kRows);
    for (auto& x : u) x = float_draw(rng);
    const std::vector<SampledToken> gpu =
        gpu_sample(logits, kRows, V, DType::F32, std::vector<SamplingParams>(kRows, c.params), u);

    std::vector<int64_t> counts(V, 0);
    int64_t differ = 0;
    for (int64_t b = 0; b < kRows; ++b) {
      const int32_t id = gpu[b].id;
      ASSERT_TRUE(id >= 0 && id < V && kept[id] > 0) << "row " << b << " drew token " << id << ", which is not kept";
      ++counts[id];
      differ += id != index_order_pick(kept, u[b]);
    }
    EXPECT_LE(differ, kRows / 10000) << "tokens that differ from the inverse CDF in index order";
    EXPECT_NEAR(gpu[0].logprob, reference_logprob(c.logits, c.params.temperature, gpu[0].id), 1e-5);
    const double total = std::accumulate(kept.begin(), kept.end(), 0.0);
    double chi_square = 0;
    for (int v = 0; v < V; ++v) {
      if (kept[v] == 0) continue;
      const double expected = kRows * kept[v] / total;
      chi_square += (counts[v] - expected) * (counts[v] - expected) / expected;
    }
    EXPECT_LT(chi_square, chi_square_critical(support - 1));
  }
}

// Rows of three tiles, the last one partial, so each row's tiles are counted and combined
// by the last of its CTAs, and the counts must be back at zero for every replay.
TEST(GpuSampling, GraphReplayWithNewDraws) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  constexpr int64_t kRows = 48, V = 20000;
  std::mt19937_64 rng(9);
  const std::vector<float> logits = random_logits(kRows, V, DType::BF16, rng);
  DeviceLogits device(logits, kRows, V, DType::BF16);
  std::vector<SamplingParams> params(kRows);
  for (int64_t b = 0; b < kRows; ++b)
    params[b] = b % 3 == 0 ? params_of(0.f, 0, 1.f) : b % 3 == 1 ? params_of(1.f, 0, 1.f) : params_of(0.8f, 40, 0.9f);

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  CudaSampler sampler(64, V);
  std::vector<double> u(kRows, 0.5);
  sampler.stage(params, u, stream);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  sampler.launch(device.tensor, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  Sampler cpu;
  std::vector<int32_t> previous(kRows, -1);
  int64_t changed = 0, differ = 0;
  for (int replay = 0; replay < 3; ++replay) {
    for (int64_t b = 0; b < kRows; ++b) u[b] = params[b].temperature == 0 ? 0 : float_draw(rng);
    sampler.stage(params, u, stream);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    sampler.send(stream);
    const std::vector<SampledToken> gpu = sampler.results(kRows);
    for (int64_t b = 0; b < kRows; ++b) {
      const std::span<const float> row(logits.data() + b * V, V);
      const bool truncated = params[b].top_k > 0;
      const int32_t expected = truncated ? index_order_pick(kept_weights(row, params[b]), u[b])
                                         : cpu.sample(row, params[b], u[b]).id;
      differ += gpu[b].id != expected;
      changed += replay > 0 && gpu[b].id != previous[b];
      previous[b] = gpu[b].id;
      ASSERT_NEAR(gpu[b].logprob, reference_logprob(row, params[b].temperature, gpu[b].id), 1e-5);
    }
  }
  EXPECT_LE(differ, 1);
  EXPECT_GT(changed, kRows / 3) << "new draws should move most sampled rows";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// A NaN, a +inf or a row of -inf anywhere in a row of several tiles, with each kind of
// draw: that row gets id -1 and a NaN log-prob (the CPU twin throws), and the rows beside
// it are sampled as ever.
TEST(GpuSampling, RowsWithNanOrInfinityGetNoToken) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  constexpr int64_t kRows = 12, V = 20000;
  std::mt19937_64 rng(11);
  std::vector<float> logits = random_logits(kRows, V, DType::F32, rng);
  const SamplingParams kinds[] = {params_of(0.f, 0, 1.f), params_of(1.f, 0, 1.f), params_of(0.9f, 50, 0.9f)};
  std::vector<SamplingParams> params(kRows);
  std::vector<double> u(kRows);
  for (int64_t b = 0; b < kRows; ++b) params[b] = kinds[b % 3], u[b] = float_draw(rng);
  // Rows 0-2 hold a NaN in their second tile, 3-5 a +inf in their last, 6-8 only -inf.
  for (int64_t b = 0; b < 3; ++b) logits[b * V + 9000] = NAN;
  for (int64_t b = 3; b < 6; ++b) logits[b * V + V - 1] = INFINITY;
  for (int64_t b = 6; b < 9; ++b) std::fill_n(logits.begin() + b * V, V, -INFINITY);
  const std::vector<SampledToken> gpu = gpu_sample(logits, kRows, V, DType::F32, params, u);
  Sampler cpu;
  for (int64_t b = 0; b < kRows; ++b) {
    const std::span<const float> row(logits.data() + b * V, V);
    if (b < 9) {
      EXPECT_EQ(gpu[b].id, -1) << "row " << b;
      EXPECT_TRUE(std::isnan(gpu[b].logprob)) << "row " << b;
      EXPECT_THROW(cpu.sample(row, params[b], u[b]), std::runtime_error) << "row " << b << " on the CPU";
      continue;
    }
    const bool truncated = params[b].top_k > 0;
    const int32_t expected =
        truncated ? index_order_pick(kept_weights(row, params[b]), u[b]) : cpu.sample(row, params[b], u[b]).id;
    EXPECT_EQ(gpu[b].id, expected) << "row " << b;
  }
}

TEST(GpuSampling, TokenFeedTakesTheLastLaunchsTokensAsTheCpuDoes) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  constexpr int64_t kRows = 37, V = 1000, kTokens = 300;
  std::mt19937_64 rng(21);
  std::vector<float> logits = random_logits(kRows, V, DType::F32, rng);
  const std::vector<SampleRow> rows(kRows);  // greedy: both sides take the argmax
  std::vector<int32_t> from_rows(kTokens), token_ids(kTokens);
  for (int64_t t = 0; t < kTokens; ++t) {
    from_rows[t] = static_cast<int32_t>(rng() % (kRows + 1)) - 1;  // -1: the id stays
    token_ids[t] = static_cast<int32_t>(rng() % V);
  }

  CpuRowSampler cpu;
  cpu.stage(rows);
  cpu.launch(Tensor::view(logits.data(), DType::F32, Device::CPU, {kRows, V}));
  std::vector<int32_t> expected = token_ids;
  cpu.feed(Tensor::view(expected.data(), DType::I32, Device::CPU, {kTokens}),
           Tensor::view(from_rows.data(), DType::I32, Device::CPU, {kTokens}));

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  DeviceLogits device_logits(logits, kRows, V, DType::F32);
  void* ints = nullptr;
  ASSERT_EQ(cudaMalloc(&ints, 2 * kTokens * sizeof(int32_t)), cudaSuccess);
  const Tensor device_ids = Tensor::view(ints, DType::I32, Device::CUDA, {kTokens});
  const Tensor device_rows = Tensor::view(static_cast<int32_t*>(ints) + kTokens, DType::I32, Device::CUDA, {kTokens});
  copy_host_to_tensor(device_ids, token_ids.data());
  copy_host_to_tensor(device_rows, from_rows.data());
  {
    CudaRowSampler gpu(stream, 64, V);
    gpu.stage(rows);
    gpu.launch(device_logits.tensor);
    gpu.feed(device_ids, device_rows);
    gpu.send();
    const std::span<const SampledToken> sampled = gpu.results();
    const std::span<const SampledToken> cpu_sampled = cpu.results();
    for (int64_t b = 0; b < kRows; ++b) ASSERT_EQ(sampled[b].id, cpu_sampled[b].id) << "row " << b;
  }
  std::vector<int32_t> got(kTokens);
  copy_tensor_to_host(got.data(), device_ids);
  EXPECT_EQ(got, expected);
  EXPECT_NE(expected, token_ids) << "some ids should have been fed";
  cudaFree(ints);
  cudaStreamDestroy(stream);
}
