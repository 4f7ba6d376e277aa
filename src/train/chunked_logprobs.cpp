#include "train/chunked_logprobs.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "model/cpu_ops.h"
#include "tensor/bf16.h"
#include "tensor/f16.h"

namespace tandem {
namespace {

void check_logits(const Tensor& logits, const char* op, const char* name) {
  if (logits.device != Device::CPU || logits.rank() != 2 || !logits.is_contiguous() || !logits.data ||
      (logits.dtype != DType::F32 && logits.dtype != DType::BF16 && logits.dtype != DType::F16))
    throw std::invalid_argument(std::string(op) + ": " + name +
                                " must be contiguous CPU [tokens, vocab] in F32, BF16 or F16, got " +
                                logits.describe());
}

void check_length(size_t length, int64_t expected, const char* op, const char* name) {
  if (static_cast<int64_t>(length) != expected)
    throw std::invalid_argument(std::string(op) + ": " + name + " has " + std::to_string(length) +
                                " values, expected " + std::to_string(expected));
}

// The checks both directions share; returns the chunk length in tokens.
int64_t check_common(const Tensor& logits, std::span<const int32_t> tokens, const LogprobSettings& settings,
                     std::span<float> workspace, const char* op) {
  check_logits(logits, op, "logits");
  const int64_t T = logits.shape[0], V = logits.shape[1];
  check_length(tokens.size(), T, op, "tokens");
  if (!(settings.temperature > 0) || !std::isfinite(settings.temperature))
    throw std::invalid_argument(std::string(op) + ": temperature must be a positive number, got " +
                                std::to_string(settings.temperature));
  if (settings.chunk_tokens < 1)
    throw std::invalid_argument(std::string(op) + ": chunk_tokens must be at least 1, got " +
                                std::to_string(settings.chunk_tokens));
  const int64_t needed = logprob_workspace_elements(T, V, settings.chunk_tokens);
  if (static_cast<int64_t>(workspace.size()) < needed)
    throw std::invalid_argument(std::string(op) + ": the workspace has " + std::to_string(workspace.size()) +
                                " floats, a chunk of " + std::to_string(std::min(T, settings.chunk_tokens)) +
                                " tokens x " + std::to_string(V) + " needs " + std::to_string(needed));
  for (int64_t t = 0; t < T; ++t)
    if (tokens[t] >= V)
      throw std::out_of_range(std::string(op) + ": token " + std::to_string(tokens[t]) + " at position " +
                              std::to_string(t) + " is outside the vocabulary of " + std::to_string(V));
  return std::min(T, settings.chunk_tokens);
}

// Rows [first, first + rows) of the logits, upcast to FP32 and then divided by the
// temperature, into the workspace.
void upcast_chunk(const Tensor& logits, int64_t first, int64_t rows, float temperature, float* out) {
  const int64_t V = logits.shape[1];
#pragma omp parallel for schedule(static) if (rows * V >= kCpuParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t begin = (first + r) * V;
    float* row = out + r * V;
    switch (logits.dtype) {
      case DType::F32:
        for (int64_t i = 0; i < V; ++i) row[i] = logits.ptr<float>()[begin + i] / temperature;
        break;
      case DType::BF16:
        for (int64_t i = 0; i < V; ++i) row[i] = bf16_to_float(logits.ptr<uint16_t>()[begin + i]) / temperature;
        break;
      default:
        for (int64_t i = 0; i < V; ++i) row[i] = f16_to_float(logits.ptr<uint16_t>()[begin + i]) / temperature;
    }
  }
}

// log sum exp of a row of scaled logits, in double.
double log_sum_exp(const float* z, int64_t V) {
  const float max = *std::max_element(z, z + V);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(z[i]) - max);
  return max + std::log(sum);
}

// -sum p log p = lse - sum p z.
double entropy_of(const float* z, int64_t V, double lse) {
  double expected_z = 0;
  for (int64_t i = 0; i < V; ++i) expected_z += std::exp(z[i] - lse) * z[i];
  return lse - expected_z;
}

// Writes one row of the gradient into the dlogits tensor, in its dtype.
void store_row(const Tensor& dlogits, int64_t row, const float* values) {
  const int64_t V = dlogits.shape[1];
  switch (dlogits.dtype) {
    case DType::F32: std::copy(values, values + V, dlogits.ptr<float>() + row * V); break;
    case DType::BF16: {
      uint16_t* out = dlogits.ptr<uint16_t>() + row * V;
      for (int64_t i = 0; i < V; ++i) out[i] = float_to_bf16(values[i]);
      break;
    }
    default: {
      uint16_t* out = dlogits.ptr<uint16_t>() + row * V;
      for (int64_t i = 0; i < V; ++i) out[i] = float_to_f16(values[i]);
    }
  }
}

}  // namespace

int64_t logprob_workspace_elements(int64_t tokens, int64_t vocab, int64_t chunk_tokens) {
  return std::min(tokens, chunk_tokens) * vocab;
}

void chunked_logprobs_forward(const Tensor& logits, std::span<const int32_t> tokens, const LogprobSettings& settings,
                              std::span<float> workspace, std::span<float> logp, std::span<float> entropy) {
  constexpr const char* kOp = "chunked_logprobs_forward";
  const int64_t chunk = check_common(logits, tokens, settings, workspace, kOp);
  const int64_t T = logits.shape[0], V = logits.shape[1];
  check_length(logp.size(), T, kOp, "logp");
  if (!entropy.empty()) check_length(entropy.size(), T, kOp, "entropy");
  for (int64_t first = 0; first < T; first += chunk) {
    const int64_t rows = std::min(chunk, T - first);
    upcast_chunk(logits, first, rows, settings.temperature, workspace.data());
#pragma omp parallel for schedule(static) if (rows * V >= kCpuParallelWork)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = first + r;
      const float* z = workspace.data() + r * V;
      if (tokens[t] < 0) {
        logp[t] = 0;
        if (!entropy.empty()) entropy[t] = 0;
        continue;
      }
      const double lse = log_sum_exp(z, V);
      logp[t] = static_cast<float>(z[tokens[t]] - lse);
      if (!entropy.empty()) entropy[t] = static_cast<float>(entropy_of(z, V, lse));
    }
  }
}

void chunked_logprobs_backward(const Tensor& logits, std::span<const int32_t> tokens, const LogprobSettings& settings,
                               std::span<float> workspace, std::span<const float> dlogp,
                               std::span<const float> dentropy, const Tensor& dlogits) {
  constexpr const char* kOp = "chunked_logprobs_backward";
  const int64_t chunk = check_common(logits, tokens, settings, workspace, kOp);
  const int64_t T = logits.shape[0], V = logits.shape[1];
  check_length(dlogp.size(), T, kOp, "dlogp");
  if (!dentropy.empty()) check_length(dentropy.size(), T, kOp, "dentropy");
  check_logits(dlogits, kOp, "dlogits");
  if (dlogits.dtype != logits.dtype || dlogits.shape != logits.shape)
    throw std::invalid_argument(std::string(kOp) + ": dlogits must match logits " + logits.describe() + ", got " +
                                dlogits.describe());
  const double inverse_temperature = 1.0 / settings.temperature;
  for (int64_t first = 0; first < T; first += chunk) {
    const int64_t rows = std::min(chunk, T - first);
    // The whole chunk is read before any row is written, so dlogits may be the logits.
    upcast_chunk(logits, first, rows, settings.temperature, workspace.data());
#pragma omp parallel for schedule(static) if (rows * V >= kCpuParallelWork)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = first + r;
      float* z = workspace.data() + r * V;
      const double g_logp = tokens[t] < 0 ? 0 : dlogp[t];
      const double g_entropy = tokens[t] < 0 || dentropy.empty() ? 0 : dentropy[t];
      if (g_logp == 0 && g_entropy == 0) {
        std::fill(z, z + V, 0.0f);
      } else {
        // d logp / dz_i = [i = y] - p_i;  d H / dz_i = -p_i (log p_i + H);  dz/dx = 1/temperature.
        const double lse = log_sum_exp(z, V);
        const double h = g_entropy != 0 ? entropy_of(z, V, lse) : 0;
        for (int64_t i = 0; i < V; ++i) {
          const double log_p = z[i] - lse, p = std::exp(log_p);
          const double onehot = i == tokens[t] ? g_logp : 0;
          z[i] = static_cast<float>((onehot - g_logp * p - g_entropy * p * (log_p + h)) * inverse_temperature);
        }
      }
      store_row(dlogits, t, z);
    }
  }
}

LogprobMemory chunked_logprob_memory(int64_t tokens, int64_t vocab, int64_t chunk_tokens, DType dtype,
                                     bool dlogits_in_place) {
  const int64_t logits = tokens * vocab * static_cast<int64_t>(dtype_size(dtype));
  const int64_t workspace = logprob_workspace_elements(tokens, vocab, chunk_tokens) * 4;
  const int64_t outputs = 2 * tokens * 4;  // logp and entropy
  return LogprobMemory{logits, workspace + outputs, workspace + (dlogits_in_place ? 0 : logits)};
}

LogprobMemory full_fp32_logprob_memory(int64_t tokens, int64_t vocab, DType dtype) {
  const int64_t fp32 = tokens * vocab * 4;
  return LogprobMemory{tokens * vocab * static_cast<int64_t>(dtype_size(dtype)), 2 * fp32 + tokens * 4, 3 * fp32};
}

}  // namespace tandem
