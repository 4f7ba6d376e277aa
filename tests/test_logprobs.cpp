// Chunked log-probs against the plain full-FP32 path (written here, not in src): log-probs,
// entropy and d(logits) for F32, BF16 and F16 logits and several chunk sizes; the
// temperature after the upcast; FP32-or-better sums for F16; finite differences; memory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "tensor/bf16.h"
#include "tensor/f16.h"
#include "train/chunked_logprobs.h"

namespace tandem {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Logits in one dtype, as raw storage, and the FP32 values their upcast gives.
struct Logits {
  DType dtype;
  int64_t T, V;
  std::vector<float> f32;
  std::vector<uint16_t> half;  // BF16 or F16 bits
  std::vector<float> upcast;

  Logits(DType dtype, int64_t T, int64_t V, float scale, uint32_t seed) : dtype(dtype), T(T), V(V) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, scale);
    for (int64_t i = 0; i < T * V; ++i) {
      const float x = normal(rng);
      if (dtype == DType::F32) {
        f32.push_back(x);
        upcast.push_back(x);
      } else {
        half.push_back(dtype == DType::BF16 ? float_to_bf16(x) : float_to_f16(x));
        upcast.push_back(dtype == DType::BF16 ? bf16_to_float(half.back()) : f16_to_float(half.back()));
      }
    }
  }
  Tensor tensor() {
    void* data = dtype == DType::F32 ? static_cast<void*>(f32.data()) : static_cast<void*>(half.data());
    return Tensor::view(data, dtype, Device::CPU, {T, V});
  }
};

// The values of a dlogits tensor in any of the three dtypes.
std::vector<float> values_of(const Tensor& t) {
  std::vector<float> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    out[i] = t.dtype == DType::F32    ? t.ptr<float>()[i]
             : t.dtype == DType::BF16 ? bf16_to_float(t.ptr<uint16_t>()[i])
                                      : f16_to_float(t.ptr<uint16_t>()[i]);
  }
  return out;
}

// The plain path: the whole [T, V] FP32 tensor of upcast logits divided by the temperature,
// then a log-softmax per row (sums in double), gathered; gradients by the textbook
// formulas. Its outputs are FP32 tensors, as the path's would be: a log-prob near -40 has
// an FP32 spacing of 4e-6, so only FP32 against FP32 can be held to 1e-6.
struct FullFp32 {
  std::vector<float> logp, entropy, dlogits;

  FullFp32(const std::vector<float>& upcast, int64_t T, int64_t V, float temperature,
           const std::vector<int32_t>& tokens, const std::vector<float>& dlogp, const std::vector<float>& dentropy)
      : logp(T, 0), entropy(T, 0), dlogits(T * V, 0) {
    std::vector<float> z(T * V);  // the [T x V] FP32 tensor the chunked path avoids
    for (int64_t i = 0; i < T * V; ++i) z[i] = upcast[i] / temperature;
    for (int64_t t = 0; t < T; ++t) {
      if (tokens[t] < 0) continue;
      const float* row = &z[t * V];
      double max = row[0], sum = 0, expected = 0;
      for (int64_t i = 0; i < V; ++i) max = std::max<double>(max, row[i]);
      for (int64_t i = 0; i < V; ++i) sum += std::exp(row[i] - max);
      const double lse = max + std::log(sum);
      for (int64_t i = 0; i < V; ++i) expected += std::exp(row[i] - lse) * row[i];
      const double h = lse - expected;
      logp[t] = static_cast<float>(row[tokens[t]] - lse);
      entropy[t] = static_cast<float>(h);
      for (int64_t i = 0; i < V; ++i) {
        const double log_p = row[i] - lse, p = std::exp(log_p);
        const double g = dlogp[t] * ((i == tokens[t]) - p) - dentropy[t] * p * (log_p + h);
        dlogits[t * V + i] = static_cast<float>(g / temperature);
      }
    }
  }
};

struct Case {
  DType dtype;
  int64_t chunk;
};
void PrintTo(const Case& c, std::ostream* out) { *out << dtype_name(c.dtype) << " logits, chunk " << c.chunk; }

class ChunkedLogprobs : public ::testing::TestWithParam<Case> {};

TEST_P(ChunkedLogprobs, EqualsTheFullFp32Path) {
  const auto [dtype, chunk] = GetParam();
  const int64_t T = 23, V = 1000;
  const float temperature = 0.8f;
  Logits logits(dtype, T, V, 3.0f, 42);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> token(0, V - 1);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<int32_t> tokens(T);
  std::vector<float> dlogp(T), dentropy(T);
  for (int64_t t = 0; t < T; ++t) tokens[t] = t % 9 == 4 ? -1 : token(rng), dlogp[t] = g(rng), dentropy[t] = g(rng);
  const LogprobSettings settings{.temperature = temperature, .chunk_tokens = chunk};
  std::vector<float> workspace(logprob_workspace_elements(T, V, chunk));
  std::vector<float> logp(T, -7), entropy(T, -7);
  chunked_logprobs_forward(logits.tensor(), tokens, settings, workspace, logp, entropy);
  const FullFp32 full(logits.upcast, T, V, temperature, tokens, dlogp, dentropy);
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_NEAR(logp[t], full.logp[t], 1e-6) << "token " << t;
    EXPECT_NEAR(entropy[t], full.entropy[t], 1e-6) << "token " << t;
  }

  // Out of place, and then over the logits themselves: the same bits.
  std::vector<uint8_t> out_storage(logits.tensor().nbytes());
  const Tensor out = Tensor::view(out_storage.data(), dtype, Device::CPU, {T, V});
  chunked_logprobs_backward(logits.tensor(), tokens, settings, workspace, dlogp, dentropy, out);
  const std::vector<float> dlogits = values_of(out);
  // F32 to 1e-6; a 16-bit dtype to its own rounding of the FP32 value (half an ulp).
  const double relative = dtype == DType::F32 ? 0 : dtype == DType::BF16 ? 0x1p-8 : 0x1p-11;
  for (int64_t i = 0; i < T * V; ++i) {
    ASSERT_NEAR(dlogits[i], full.dlogits[i], 1e-6 + relative * std::fabs(full.dlogits[i]))
        << "token " << i / V << " entry " << i % V;
  }
  for (int64_t t = 0; t < T; ++t) {
    if (tokens[t] >= 0) continue;
    EXPECT_EQ(logp[t], 0);
    EXPECT_EQ(entropy[t], 0);
    for (int64_t i = 0; i < V; ++i) ASSERT_EQ(dlogits[t * V + i], 0);
  }
  const Tensor in_place = logits.tensor();
  chunked_logprobs_backward(in_place, tokens, settings, workspace, dlogp, dentropy, in_place);
  EXPECT_EQ(std::memcmp(in_place.data, out_storage.data(), out_storage.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(ChunkedLogprobsCases, ChunkedLogprobs,
                         ::testing::Values(Case{DType::F32, 1}, Case{DType::F32, 7}, Case{DType::F32, 23},
                                           Case{DType::F32, 64}, Case{DType::BF16, 1}, Case{DType::BF16, 7},
                                           Case{DType::BF16, 23}, Case{DType::F16, 7}, Case{DType::F16, 23}),
                         [](const auto& info) {
                           return std::string(dtype_name(info.param.dtype)) + "_chunk" +
                                  std::to_string(info.param.chunk);
                         });

TEST(ChunkedLogprobsTemperature, IsAppliedAfterTheUpcast) {
  // Large bf16 logits: dividing in bf16 would round x / t to 8 bits and move the
  // log-probs far more than 1e-6.
  const int64_t T = 8, V = 512;
  const float temperature = 0.7f;
  Logits logits(DType::BF16, T, V, 8.0f, 3);
  std::vector<int32_t> tokens(T);
  for (int64_t t = 0; t < T; ++t) tokens[t] = static_cast<int32_t>(t * 61 % V);
  std::vector<float> workspace(logprob_workspace_elements(T, V, 3)), logp(T);
  const LogprobSettings settings{.temperature = temperature, .chunk_tokens = 3};
  chunked_logprobs_forward(logits.tensor(), tokens, settings, workspace, logp, {});
  const std::vector<float> zeros(T, 0);
  const FullFp32 after(logits.upcast, T, V, temperature, tokens, zeros, zeros);
  std::vector<float> divided_in_bf16(T * V);
  for (int64_t i = 0; i < T * V; ++i) divided_in_bf16[i] = bf16_to_float(float_to_bf16(logits.upcast[i] / temperature));
  const FullFp32 before(divided_in_bf16, T, V, 1.0f, tokens, zeros, zeros);
  double gap_before = 0;
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_NEAR(logp[t], after.logp[t], 1e-6);
    gap_before = std::max(gap_before, std::fabs(static_cast<double>(logp[t]) - before.logp[t]));
  }
  EXPECT_GT(gap_before, 1e-3);
}

TEST(ChunkedLogprobsAccumulation, F16RowsSumInAtLeastFp32) {
  // 4096 equal logits: an F16 running sum of exp(0) = 1 stops growing at 2048.
  const int64_t V = 4096;
  std::vector<uint16_t> zeros(V, float_to_f16(0.0f));
  const Tensor logits = Tensor::view(zeros.data(), DType::F16, Device::CPU, {1, V});
  std::vector<int32_t> tokens = {17};
  std::vector<float> workspace(V), logp(1), entropy(1);
  chunked_logprobs_forward(logits, tokens, {}, workspace, logp, entropy);
  EXPECT_NEAR(logp[0], -std::log(4096.0), 1e-6);
  EXPECT_NEAR(entropy[0], std::log(4096.0), 1e-6);
}

// L = sum_t a_t logp_t + b_t H_t, in double from the forward's outputs.
double objective(const Tensor& logits, const std::vector<int32_t>& tokens, const LogprobSettings& settings,
                 const std::vector<float>& a, const std::vector<float>& b) {
  const int64_t T = logits.shape[0];
  std::vector<float> workspace(logprob_workspace_elements(T, logits.shape[1], settings.chunk_tokens)), logp(T), h(T);
  chunked_logprobs_forward(logits, tokens, settings, workspace, logp, h);
  double sum = 0;
  for (int64_t t = 0; t < T; ++t) sum += static_cast<double>(a[t]) * logp[t] + static_cast<double>(b[t]) * h[t];
  return sum;
}

TEST(ChunkedLogprobsGradients, LogprobAndEntropyGradientsMatchFiniteDifferences) {
  const int64_t T = 5, V = 17;
  const LogprobSettings settings{.temperature = 0.7f, .chunk_tokens = 2};
  const std::vector<int32_t> tokens = {3, 0, 16, 8, 8};
  const std::vector<float> ones(T, 1), zeros(T, 0), mixed = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f};
  // logp alone, entropy alone, then both with other weights.
  for (const auto& [a, b] : {std::pair{ones, zeros}, std::pair{zeros, ones}, std::pair{mixed, ones}}) {
    Logits logits(DType::F32, T, V, 1.5f, 9);
    std::vector<float> workspace(logprob_workspace_elements(T, V, settings.chunk_tokens)), grad(T * V);
    chunked_logprobs_backward(logits.tensor(), tokens, settings, workspace, a, b,
                              Tensor::view(grad.data(), DType::F32, Device::CPU, {T, V}));
    for (int64_t i = 0; i < T * V; ++i) {
      const float saved = logits.f32[i];
      logits.f32[i] = saved + 1e-2f;
      const double up = objective(logits.tensor(), tokens, settings, a, b);
      const double step_up = static_cast<double>(logits.f32[i]) - saved;
      logits.f32[i] = saved - 1e-2f;
      const double down = objective(logits.tensor(), tokens, settings, a, b);
      const double step_down = saved - static_cast<double>(logits.f32[i]);
      logits.f32[i] = saved;
      ASSERT_NEAR(grad[i], (up - down) / (step_up + step_down), 2e-4) << "token " << i / V << " entry " << i % V;
    }
  }
}

TEST(ChunkedLogprobsEntropy, AUniformRowHasLogV) {
  const int64_t V = 10;
  std::vector<float> row(V, 2.5f), workspace(V), logp(1), entropy(1);
  chunked_logprobs_forward(Tensor::view(row.data(), DType::F32, Device::CPU, {1, V}), std::vector<int32_t>{4}, {},
                           workspace, logp, entropy);
  EXPECT_NEAR(entropy[0], std::log(10.0), 1e-6);
  EXPECT_NEAR(logp[0], -std::log(10.0), 1e-6);
}

TEST(ChunkedLogprobsArguments, RefusesWhatDoesNotFit) {
  const int64_t T = 4, V = 6;
  std::vector<float> data(T * V, 0), workspace(logprob_workspace_elements(T, V, 3)), logp(T);
  const Tensor logits = Tensor::view(data.data(), DType::F32, Device::CPU, {T, V});
  const std::vector<int32_t> tokens = {0, 1, 2, 5};
  const LogprobSettings settings{.chunk_tokens = 3};
  EXPECT_NO_THROW(chunked_logprobs_forward(logits, tokens, settings, workspace, logp, {}));
  // The workspace is exactly one chunk: one float less is refused.
  EXPECT_EQ(workspace.size(), 18u);
  EXPECT_THROW(chunked_logprobs_forward(logits, tokens, settings, std::span(workspace).first(17), logp, {}),
               std::invalid_argument);
  EXPECT_THROW(chunked_logprobs_forward(logits, std::vector<int32_t>{0, 1, 2, 6}, settings, workspace, logp, {}),
               std::out_of_range);
  EXPECT_THROW(chunked_logprobs_forward(logits, std::vector<int32_t>{0, 1}, settings, workspace, logp, {}),
               std::invalid_argument);
  EXPECT_THROW(chunked_logprobs_forward(logits, tokens, {.temperature = 0}, workspace, logp, {}),
               std::invalid_argument);
  EXPECT_THROW(chunked_logprobs_forward(logits, tokens, {.chunk_tokens = 0}, workspace, logp, {}),
               std::invalid_argument);
  const Tensor ints = Tensor::view(data.data(), DType::I32, Device::CPU, {T, V});
  EXPECT_THROW(chunked_logprobs_forward(ints, tokens, settings, workspace, logp, {}), std::invalid_argument);
  std::vector<uint16_t> half(T * V);
  const Tensor bf16 = Tensor::view(half.data(), DType::BF16, Device::CPU, {T, V});
  EXPECT_THROW(chunked_logprobs_backward(logits, tokens, settings, workspace, logp, {}, bf16), std::invalid_argument);
}

TEST(ChunkedLogprobsMemory, Qwen3VocabularyAt16kTokens) {
  const int64_t T = 16384, V = 151936, chunk = 1024;
  const LogprobMemory full = full_fp32_logprob_memory(T, V, DType::BF16);
  const LogprobMemory chunked = chunked_logprob_memory(T, V, chunk, DType::BF16, true);
  const LogprobMemory separate = chunked_logprob_memory(T, V, chunk, DType::BF16, false);
  std::printf("log-probs of %lld tokens x vocab %lld, bf16 logits %.2f GiB (held by both paths, not counted):\n"
              "  full FP32 path      forward %6.2f GiB   backward %6.2f GiB\n"
              "  chunked (%lld), in place   forward %6.2f GiB   backward %6.2f GiB\n"
              "  chunked, separate dlogits  forward %6.2f GiB   backward %6.2f GiB\n",
              static_cast<long long>(T), static_cast<long long>(V), full.logits_bytes / kGiB, full.forward_bytes / kGiB,
              full.backward_bytes / kGiB, static_cast<long long>(chunk), chunked.forward_bytes / kGiB,
              chunked.backward_bytes / kGiB, separate.forward_bytes / kGiB, separate.backward_bytes / kGiB);
  EXPECT_NEAR(full.logits_bytes / kGiB, 4.64, 0.01);
  // PyTorch's measured 18.5 GiB: the FP32 copy and the log-softmax output together.
  EXPECT_NEAR(full.forward_bytes / kGiB, 18.55, 0.01);
  EXPECT_NEAR(full.backward_bytes / kGiB, 27.82, 0.01);
  EXPECT_LE(chunked.forward_bytes / kGiB, 1.5);
  EXPECT_LE(chunked.backward_bytes / kGiB, 1.5);
  EXPECT_NEAR(chunked.backward_bytes / kGiB, 0.58, 0.01);  // one chunk of FP32 rows
  EXPECT_GT(separate.backward_bytes / kGiB, 1.5);           // a second [T, V] bf16 tensor
  // The accounting is the workspace the functions demand.
  EXPECT_EQ(chunked.backward_bytes, logprob_workspace_elements(T, V, chunk) * 4);
}

}  // namespace
}  // namespace tandem
