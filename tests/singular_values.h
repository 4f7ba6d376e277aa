// Singular values of a small row-major matrix, for the Muon tests: the square roots of the
// eigenvalues of X Xᵀ by cyclic Jacobi rotations in double.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace tandem::testing {

inline std::vector<double> singular_values(const float* x, int64_t rows, int64_t cols) {
  const int64_t m = std::min(rows, cols);
  const bool wide = rows <= cols;
  auto at = [&](int64_t i, int64_t k) {  // of the wide orientation [m, max]
    return static_cast<double>(wide ? x[i * cols + k] : x[k * cols + i]);
  };
  const int64_t inner = std::max(rows, cols);
  std::vector<double> a(static_cast<size_t>(m * m), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t k = 0; k < inner; ++k) a[i * m + j] += at(i, k) * at(j, k);
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t p = 0; p < m; ++p)
      for (int64_t q = p + 1; q < m; ++q) off += a[p * m + q] * a[p * m + q];
    if (off < 1e-24) break;
    for (int64_t p = 0; p < m; ++p)
      for (int64_t q = p + 1; q < m; ++q) {
        const double apq = a[p * m + q];
        if (std::fabs(apq) < 1e-300) continue;
        const double theta = (a[q * m + q] - a[p * m + p]) / (2 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int64_t k = 0; k < m; ++k) {  // columns p, q
          const double akp = a[k * m + p], akq = a[k * m + q];
          a[k * m + p] = c * akp - s * akq;
          a[k * m + q] = s * akp + c * akq;
        }
        for (int64_t k = 0; k < m; ++k) {  // rows p, q
          const double apk = a[p * m + k], aqk = a[q * m + k];
          a[p * m + k] = c * apk - s * aqk;
          a[q * m + k] = s * apk + c * aqk;
        }
      }
  }
  std::vector<double> values;
  for (int64_t i = 0; i < m; ++i) values.push_back(std::sqrt(std::max(0.0, a[i * m + i])));
  std::sort(values.begin(), values.end());
  return values;
}

}  // namespace tandem::testing
