#include "train/muon.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "tensor/bf16.h"

namespace tandem {

bool takes_muon(const ParameterInfo& info) {
  return info.shape.size() == 2 && info.name.rfind("model.layers.", 0) == 0;
}

std::vector<MuonGroup> muon_groups(const ParameterLayout& layout) {
  std::map<std::pair<int64_t, int64_t>, MuonGroup> by_shape;
  for (const ParameterInfo& info : layout.tensors()) {
    if (!takes_muon(info)) continue;
    const int64_t rows = info.shape[0], cols = info.shape[1];
    MuonGroup& group = by_shape[{std::min(rows, cols), std::max(rows, cols)}];
    group.m = std::min(rows, cols);
    group.n = std::max(rows, cols);
    group.matrices.push_back({info.offset, rows > cols});
  }
  std::vector<MuonGroup> groups;
  for (auto& [shape, group] : by_shape) groups.push_back(std::move(group));
  return groups;
}

MuonStepScalars muon_scalars(const MuonSettings& s, int64_t /*m*/, int64_t n) {
  return {static_cast<float>(s.momentum), static_cast<float>(s.lr * 0.2 * std::sqrt(static_cast<double>(n))),
          static_cast<float>(1.0 - s.lr * s.weight_decay)};
}

namespace {

// c [r, q] = a [r, k] · b [k, q] (row-major), FP32 accumulation. Threads only for large
// products: a small model's matrices take less time than the threads' fork and join.
void matmul(float* c, const float* a, const float* b, int64_t r, int64_t k, int64_t q) {
#pragma omp parallel for schedule(static) if (r * k * q >= (1 << 24))
  for (int64_t i = 0; i < r; ++i) {
    float* row = c + i * q;
    std::fill(row, row + q, 0.0f);
    for (int64_t t = 0; t < k; ++t) {
      const float scale = a[i * k + t];
      const float* other = b + t * q;
      for (int64_t j = 0; j < q; ++j) row[j] += scale * other[j];
    }
  }
}

}  // namespace

void newton_schulz_cpu(float* x, int64_t m, int64_t n, std::vector<float>& scratch) {
  const size_t mn = static_cast<size_t>(m * n), mm = static_cast<size_t>(m * m);
  scratch.resize(mn + mn + 3 * mm);
  float* xt = scratch.data();  // xᵀ [n, m]
  float* next = xt + mn;
  float* a = next + mn;
  float* a2 = a + mm;
  float* b = a2 + mm;
  double square_sum = 0;
  for (size_t i = 0; i < mn; ++i) square_sum += static_cast<double>(x[i]) * x[i];
  const float inverse = 1.0f / (static_cast<float>(std::sqrt(square_sum)) + kMuonNormEps);
  for (size_t i = 0; i < mn; ++i) x[i] *= inverse;
  for (int step = 0; step < kNewtonSchulzSteps; ++step) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) xt[j * m + i] = x[i * n + j];
    matmul(a, x, xt, m, n, m);   // A = x xᵀ
    matmul(a2, a, a, m, m, m);   // A A
    for (size_t i = 0; i < mm; ++i) b[i] = kNewtonSchulzB * a[i] + kNewtonSchulzC * a2[i];
    matmul(next, b, x, m, m, n);  // B x
    for (size_t i = 0; i < mn; ++i) x[i] = kNewtonSchulzA * x[i] + next[i];
  }
}

void muon_momentum_cpu(const float* grads, float* momentum, int64_t rows, int64_t cols, float beta, float* oriented) {
  const bool transposed = rows > cols;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const float buf = beta * momentum[i] + (1.0f - beta) * grads[i];
      momentum[i] = buf;
      oriented[transposed ? c * rows + r : i] = (1.0f - beta) * grads[i] + beta * buf;
    }
}

void muon_apply_cpu(float* params, float* oriented, int64_t rows, int64_t cols, const MuonStepScalars& k,
                    uint16_t* working, std::vector<float>& scratch) {
  const bool transposed = rows > cols;
  newton_schulz_cpu(oriented, std::min(rows, cols), std::max(rows, cols), scratch);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const float p = params[i] * k.decay - k.update_scale * oriented[transposed ? c * rows + r : i];
      params[i] = p;
      if (working) working[i] = float_to_bf16(p);
    }
}

void muon_step_cpu(float* params, const float* grads, float* momentum, int64_t rows, int64_t cols,
                   const MuonStepScalars& k, uint16_t* working, std::vector<float>& scratch) {
  std::vector<float> oriented(static_cast<size_t>(rows * cols));
  muon_momentum_cpu(grads, momentum, rows, cols, k.momentum, oriented.data());
  muon_apply_cpu(params, oriented.data(), rows, cols, k, working, scratch);
}

namespace {
size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }
}  // namespace

MuonWorkspace MuonWorkspace::for_group(const MuonGroup& group) {
  const size_t count = group.matrices.size();
  const size_t iterate = count * static_cast<size_t>(group.m * group.n) * 2;
  const size_t product = count * static_cast<size_t>(group.m * group.m) * 2;
  MuonWorkspace w;
  size_t next = 0;
  auto take = [&](size_t bytes) {
    const size_t at = next;
    next += aligned(bytes);
    return at;
  };
  w.table = take(count * sizeof(int64_t));
  w.momentum_table = take(count * sizeof(int64_t));
  w.partials = take(count * kNormBlocks * sizeof(double));
  w.x = take(iterate);
  w.x_next = take(iterate);
  w.a = take(product);
  w.b = take(product);
  w.bytes = next;
  return w;
}

size_t MuonWorkspace::bytes_for(const std::vector<MuonGroup>& groups) {
  size_t bytes = 0;
  for (const MuonGroup& group : groups) bytes = std::max(bytes, for_group(group).bytes);
  return bytes;
}

}  // namespace tandem
