#include "model/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "model/cpu_ops.h"
#include "model/transformer.h"

namespace tandem {

std::vector<int32_t> next_token_targets(std::span<const int32_t> token_ids, std::span<const int32_t> cu_seqlens) {
  packed_positions(cu_seqlens, static_cast<int64_t>(token_ids.size()));
  std::vector<int32_t> targets(token_ids.size(), -1);
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s)
    for (int32_t t = cu_seqlens[s]; t + 1 < cu_seqlens[s + 1]; ++t) targets[t] = token_ids[t + 1];
  return targets;
}

double cross_entropy(const Tensor& logits, std::span<const int32_t> targets, const Tensor& dlogits, float scale) {
  if (logits.dtype != DType::F32 || logits.device != Device::CPU || logits.rank() != 2 || !logits.is_contiguous() ||
      logits.shape[0] != static_cast<int64_t>(targets.size()))
    throw std::invalid_argument("cross_entropy: logits must be contiguous F32 host [" +
                                std::to_string(targets.size()) + ", vocab], got " + logits.describe());
  if (dlogits.data && (dlogits.dtype != DType::F32 || dlogits.device != Device::CPU || dlogits.shape != logits.shape))
    throw std::invalid_argument("cross_entropy: dlogits must match logits " + logits.describe() + ", got " +
                                dlogits.describe());
  const int64_t T = logits.shape[0], V = logits.shape[1];
  for (int64_t t = 0; t < T; ++t)
    if (targets[t] >= V)
      throw std::out_of_range("cross_entropy: target " + std::to_string(targets[t]) + " at token " +
                              std::to_string(t) + " is outside the vocabulary of " + std::to_string(V));
  double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static) if (T * V >= kCpuParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits.ptr<float>() + t * V;
    float* grad = dlogits.data ? dlogits.ptr<float>() + t * V : nullptr;
    const int32_t target = targets[t];
    if (target < 0) {
      if (grad) std::memset(grad, 0, V * sizeof(float));
      continue;
    }
    const float max = *std::max_element(row, row + V);
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(row[i]) - max);
    const double log_sum = max + std::log(sum);
    total += log_sum - row[target];
    if (grad) {
      for (int64_t i = 0; i < V; ++i) grad[i] = scale * static_cast<float>(std::exp(row[i] - log_sum));
      grad[target] -= scale;
    }
  }
  return total;
}

}  // namespace tandem
