#include "model/cpu_ops.h"

#include "model/activations.h"
#include "model/cpu_vector.h"
#include "model/op_args.h"
#include "tensor/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <vector>

namespace tandem {

namespace {

using cpu_vector::axpy;
using cpu_vector::dot;

constexpr int64_t kAny = kAnyExtent;

void expect(const Tensor& t, const char* op, const char* arg, DType dtype, std::initializer_list<int64_t> shape) {
  check_op_arg(t, (std::string("CpuOps::") + op).c_str(), arg, Device::CPU, {dtype}, shape);
}

void expect_f32(const Tensor& t, const char* op, const char* arg, std::initializer_list<int64_t> shape) {
  expect(t, op, arg, DType::F32, shape);
}

int64_t head_dim_of(const Tensor& x, int heads, const char* op) {
  if (heads <= 0 || x.rank() != 2 || x.shape[1] % heads != 0 || (x.shape[1] / heads) % 2 != 0)
    throw std::invalid_argument(std::string("CpuOps::") + op + ": " + x.describe() + " does not split into " +
                                std::to_string(heads) + " heads of even size");
  return x.shape[1] / heads;
}

// The first token of the sequence each token belongs to, from validated cu_seqlens.
std::vector<int32_t> sequence_starts(const Tensor& cu_seqlens, int64_t tokens, const char* op) {
  expect(cu_seqlens, op, "cu_seqlens", DType::I32, {kAny});
  const int32_t* cu = cu_seqlens.ptr<int32_t>();
  const int64_t count = cu_seqlens.shape[0] - 1;
  if (count < 1 || cu[0] != 0 || cu[count] != tokens)
    throw std::invalid_argument(std::string("CpuOps::") + op + ": cu_seqlens must run from 0 to " +
                                std::to_string(tokens) + " tokens");
  std::vector<int32_t> starts(tokens);
  for (int64_t s = 0; s < count; ++s) {
    if (cu[s + 1] < cu[s]) throw std::invalid_argument(std::string("CpuOps::") + op + ": cu_seqlens must not decrease");
    for (int32_t t = cu[s]; t < cu[s + 1]; ++t) starts[t] = cu[s];
  }
  return starts;
}

// An op's output rows [N, D]: F32 values, or FP8 E4M3 codes with a scale per row.
void expect_out_rows(const ScaledRows& out, const char* op, int64_t N, int64_t D) {
  check_out_rows(out, (std::string("CpuOps::") + op).c_str(), Device::CPU, DType::F32, N, D);
}

// An op's input rows [N, D] of F32 values, with or without a scale per row; returns the
// scales, or nullptr.
const float* expect_in_rows(const ScaledRows& in, const char* op, const char* arg, int64_t N, int64_t D) {
  check_in_rows(in, (std::string("CpuOps::") + op).c_str(), arg, Device::CPU, {DType::F32}, N, D);
  return in.scales.ptr<float>();
}

// Where an op computes row n of `out` [N, D] in FP32: the row itself, or for FP8 codes
// `coded` (D floats, else empty), which encode_row then turns into the row's codes.
float* out_row(const ScaledRows& out, int64_t n, int64_t D, std::vector<float>& coded) {
  return coded.empty() ? out.values.ptr<float>() + n * D : coded.data();
}
std::vector<float> coded_row(const ScaledRows& out, int64_t D) {
  return std::vector<float>(out.values.dtype == DType::F8_E4M3 ? D : 0);
}

// Row n of FP8 `out` from its FP32 values y [D]: the codes of the row's scale.
void encode_row(const ScaledRows& out, int64_t n, const float* y, int64_t D) {
  float amax = 0.f;
  for (int64_t i = 0; i < D; ++i) amax = std::max(amax, std::fabs(y[i]));
  const float inverse = e4m3_inverse_scale(amax);
  uint8_t* codes = out.values.ptr<uint8_t>() + n * D;
  for (int64_t i = 0; i < D; ++i) codes[i] = float_to_e4m3(y[i] * inverse);
  out.scales.ptr<float>()[n] = e4m3_scale(amax);
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Rotates every head of one token: (x[i], x[i+half]) by +angle (forward) or -angle.
void rope_rotate(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, int heads, float direction,
                 const char* op) {
  expect_f32(x, op, "x", {kAny, kAny});
  const int64_t T = x.shape[0], D = head_dim_of(x, heads, op), half = D / 2;
  expect(positions, op, "positions", DType::I32, {T});
  expect_f32(inv_freq, op, "inv_freq", {half});
  float* data = x.ptr<float>();
  const int32_t* pos = positions.ptr<int32_t>();
  const float* freq = inv_freq.ptr<float>();
#pragma omp parallel if (T * heads * D >= kCpuParallelWork)
  {
    std::vector<float> cos(half), sin(half);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        // The angle is rounded to FP32 before cos/sin, as transformers computes it.
        const float angle = static_cast<float>(pos[t]) * freq[i];
        cos[i] = std::cos(angle);
        sin[i] = direction * std::sin(angle);
      }
      for (int h = 0; h < heads; ++h) {
        float* head = data + t * heads * D + h * D;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = head[i], x2 = head[i + half];
          head[i] = x1 * cos[i] - x2 * sin[i];
          head[i + half] = x2 * cos[i] + x1 * sin[i];
        }
      }
    }
  }
}

}  // namespace

void CpuOps::copy_from_host(const Tensor& dst, const void* src) {
  if (dst.device != Device::CPU) throw std::invalid_argument("CpuOps::copy_from_host: destination " + dst.describe());
  std::memcpy(dst.data, src, dst.nbytes());
}

void CpuOps::queue_copy_from_host(const Tensor& dst, const void* src) { copy_from_host(dst, src); }

void CpuOps::zero(const Tensor& dst) {
  if (dst.device != Device::CPU) throw std::invalid_argument("CpuOps::zero: destination " + dst.describe());
  std::memset(dst.data, 0, dst.nbytes());
}

void CpuOps::copy(const Tensor& dst, const Tensor& src) {
  if (!dst.data || !src.data || dst.device != Device::CPU || src.device != Device::CPU || dst.shape != src.shape ||
      dst.dtype != src.dtype || !dst.is_contiguous() || !src.is_contiguous())
    throw std::invalid_argument("CpuOps::copy: cannot copy " + src.describe() + " into " + dst.describe());
  std::memcpy(dst.data, src.data, src.nbytes());
}

void CpuOps::embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) {
  expect_f32(table, "embedding_forward", "table", {kAny, kAny});
  const int64_t V = table.shape[0], C = table.shape[1];
  expect(ids, "embedding_forward", "ids", DType::I32, {kAny});
  const int64_t T = ids.shape[0];
  expect_f32(out, "embedding_forward", "out", {T, C});
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t)
    if (id[t] < 0 || id[t] >= V)
      throw std::out_of_range("CpuOps::embedding_forward: token id " + std::to_string(id[t]) + " at position " +
                              std::to_string(t) + " is outside the vocabulary of " + std::to_string(V));
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(out.ptr<float>() + t * C, table.ptr<float>() + id[t] * C, C * sizeof(float));
}

void CpuOps::embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  expect_f32(dtable, "embedding_backward", "dtable", {kAny, kAny});
  const int64_t V = dtable.shape[0], C = dtable.shape[1];
  expect(ids, "embedding_backward", "ids", DType::I32, {kAny});
  const int64_t T = ids.shape[0];
  expect_f32(dout, "embedding_backward", "dout", {T, C});
  const int32_t* id = ids.ptr<int32_t>();
  // Serial over tokens: a repeated id would race, and T*C adds are cheap.
  for (int64_t t = 0; t < T; ++t) {
    if (id[t] < 0 || id[t] >= V)
      throw std::out_of_range("CpuOps::embedding_backward: token id " + std::to_string(id[t]) + " out of range");
    axpy(dtable.ptr<float>() + id[t] * C, 1.0f, dout.ptr<float>() + t * C, C);
  }
}

void CpuOps::rmsnorm_forward(const ScaledRows& out, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                             float eps) {
  expect_f32(x, "rmsnorm_forward", "x", {kAny, kAny});
  const int64_t N = x.shape[0], D = x.shape[1];
  expect_out_rows(out, "rmsnorm_forward", N, D);
  expect_f32(rstd, "rmsnorm_forward", "rstd", {N});
  expect_f32(weight, "rmsnorm_forward", "weight", {D});
  const float* w = weight.ptr<float>();
#pragma omp parallel for schedule(static) if (N * D >= kCpuParallelWork)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = x.ptr<float>() + n * D;
    std::vector<float> coded = coded_row(out, D);
    float* y = out_row(out, n, D, coded);
    const float r = 1.0f / std::sqrt(dot(row, row, D) / static_cast<float>(D) + eps);
    rstd.ptr<float>()[n] = r;
    for (int64_t i = 0; i < D; ++i) y[i] = w[i] * (row[i] * r);
    if (!coded.empty()) encode_row(out, n, y, D);
  }
}

void CpuOps::rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                              const Tensor& weight, const Tensor& rstd, GradWrite dx_write) {
  expect_f32(x, "rmsnorm_backward", "x", {kAny, kAny});
  const int64_t N = x.shape[0], D = x.shape[1];
  expect_f32(dx, "rmsnorm_backward", "dx", {N, D});
  expect_f32(dweight, "rmsnorm_backward", "dweight", {D});
  expect_f32(dout, "rmsnorm_backward", "dout", {N, D});
  expect_f32(weight, "rmsnorm_backward", "weight", {D});
  expect_f32(rstd, "rmsnorm_backward", "rstd", {N});
  const float* w = weight.ptr<float>();
  const float* r = rstd.ptr<float>();
  if (dx_write == GradWrite::overwrite) zero(dx);
  // With n = x * rstd and dn = dout * weight: dx = rstd * (dn - n * mean(dn * n)).
#pragma omp parallel for schedule(static) if (N * D >= kCpuParallelWork)
  for (int64_t row = 0; row < N; ++row) {
    const float* xr = x.ptr<float>() + row * D;
    const float* dy = dout.ptr<float>() + row * D;
    float* dxr = dx.ptr<float>() + row * D;
    float mean = 0;
    for (int64_t i = 0; i < D; ++i) mean += dy[i] * w[i] * xr[i] * r[row];
    mean /= static_cast<float>(D);
    for (int64_t i = 0; i < D; ++i) dxr[i] += r[row] * (dy[i] * w[i] - xr[i] * r[row] * mean);
  }
  // Columns in parallel, so no two threads add into the same weight.
#pragma omp parallel for schedule(static) if (N * D >= kCpuParallelWork)
  for (int64_t i = 0; i < D; ++i) {
    float sum = 0;
    for (int64_t row = 0; row < N; ++row) sum += dout.ptr<float>()[row * D + i] * x.ptr<float>()[row * D + i] * r[row];
    dweight.ptr<float>()[i] += sum;
  }
}

// The add, then rmsnorm_forward of its result: the same bits as the two passes apart.
void CpuOps::add_rmsnorm_forward(const ScaledRows& out, const Tensor& rstd, const Tensor& hidden,
                                 const ScaledRows& branch, const Tensor& weight, float eps) {
  expect_f32(hidden, "add_rmsnorm_forward", "hidden", {kAny, kAny});
  const int64_t N = hidden.shape[0], D = hidden.shape[1];
  const float* scales = expect_in_rows(branch, "add_rmsnorm_forward", "branch", N, D);
  float* h = hidden.ptr<float>();
  const float* b = branch.values.ptr<float>();
#pragma omp parallel for schedule(static) if (N * D >= kCpuParallelWork)
  for (int64_t n = 0; n < N; ++n) {
    const float scale = scales ? scales[n] : 1.f;  // exact without scales
    for (int64_t i = 0; i < D; ++i) h[n * D + i] += b[n * D + i] * scale;
  }
  rmsnorm_forward(out, rstd, hidden, weight, eps);
}

void CpuOps::matmul_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  expect_f32(x, "matmul_forward", "x", {kAny, kAny});
  expect_f32(weight, "matmul_forward", "weight", {kAny, x.shape[1]});
  const int64_t N = x.shape[0], I = x.shape[1], O = weight.shape[0];
  expect_f32(out, "matmul_forward", "out", {N, O});
  if (bias.data) expect_f32(bias, "matmul_forward", "bias", {O});
  const float* b = bias.data ? bias.ptr<float>() : nullptr;
  // Four rows share each weight row read: the weights stream from memory N/4 times.
  constexpr int64_t kRows = 4;
  const int64_t blocks = (N + kRows - 1) / kRows;
#pragma omp parallel for collapse(2) schedule(static) if (N * O * I >= kCpuParallelWork)
  for (int64_t block = 0; block < blocks; ++block) {
    for (int64_t o = 0; o < O; ++o) {
      const float* w = weight.ptr<float>() + o * I;
      const int64_t n0 = block * kRows;
      if (n0 + kRows <= N) {
        const float *x0 = x.ptr<float>() + n0 * I, *x1 = x0 + I, *x2 = x1 + I, *x3 = x2 + I;
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t i = 0; i < I; ++i) {
          s0 += x0[i] * w[i];
          s1 += x1[i] * w[i];
          s2 += x2[i] * w[i];
          s3 += x3[i] * w[i];
        }
        const float sums[kRows] = {s0, s1, s2, s3};
        for (int64_t r = 0; r < kRows; ++r) out.ptr<float>()[(n0 + r) * O + o] = sums[r] + (b ? b[o] : 0.0f);
      } else {
        for (int64_t n = n0; n < N; ++n)
          out.ptr<float>()[n * O + o] = dot(x.ptr<float>() + n * I, w, I) + (b ? b[o] : 0.0f);
      }
    }
  }
}

// The codes as FP32 values, then the product of those: the products of E4M3 values are
// exact in FP32, as on the tensor cores; only the order of the sums differs.
void CpuOps::fp8_matmul_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& weight_scale) {
  expect(x, "fp8_matmul_forward", "x", DType::F8_E4M3, {kAny, kAny});
  expect(weight, "fp8_matmul_forward", "weight", DType::F8_E4M3, {kAny, x.shape[1]});
  expect_f32(out, "fp8_matmul_forward", "out", {x.shape[0], weight.shape[0]});
  expect_f32(weight_scale, "fp8_matmul_forward", "weight_scale", {1});
  const auto decoded = [](const Tensor& codes) {
    std::vector<float> values(codes.numel());
    const uint8_t* c = codes.ptr<uint8_t>();
    for (size_t i = 0; i < values.size(); ++i) values[i] = e4m3_to_float(c[i]);
    return values;
  };
  std::vector<float> x_values = decoded(x), weight_values = decoded(weight);
  matmul_forward(out, Tensor::view(x_values.data(), DType::F32, Device::CPU, x.shape),
                 Tensor::view(weight_values.data(), DType::F32, Device::CPU, weight.shape), Tensor{});
  const float scale = weight_scale.ptr<float>()[0];
  float* y = out.ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) y[i] *= scale;
}

void CpuOps::quantize_fp8(const Tensor& codes, const Tensor& scale, const Tensor& x) {
  expect_f32(x, "quantize_fp8", "x", {kAny, kAny});
  expect(codes, "quantize_fp8", "codes", DType::F8_E4M3, {x.shape[0], x.shape[1]});
  expect_f32(scale, "quantize_fp8", "scale", {1});
  const float* v = x.ptr<float>();
  float amax = 0.f;
  for (int64_t i = 0; i < x.numel(); ++i) amax = std::max(amax, std::fabs(v[i]));
  const float inverse = e4m3_inverse_scale(amax);
  uint8_t* c = codes.ptr<uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i) c[i] = float_to_e4m3(v[i] * inverse);
  scale.ptr<float>()[0] = e4m3_scale(amax);
}

void CpuOps::matmul_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                             const Tensor& x, const Tensor& weight, GradWrite dx_write) {
  expect_f32(x, "matmul_backward", "x", {kAny, kAny});
  expect_f32(weight, "matmul_backward", "weight", {kAny, x.shape[1]});
  const int64_t N = x.shape[0], I = x.shape[1], O = weight.shape[0];
  expect_f32(dx, "matmul_backward", "dx", {N, I});
  expect_f32(dweight, "matmul_backward", "dweight", {O, I});
  expect_f32(dout, "matmul_backward", "dout", {N, O});
  if (dbias.data) expect_f32(dbias, "matmul_backward", "dbias", {O});
  const float* g = dout.ptr<float>();
  if (dx_write == GradWrite::overwrite) zero(dx);
  // Both products walk one operand row by row and reuse each row for kRows rows of the
  // result while it is in L1, so the streamed operand is read N/kRows (or O/kRows) times.
  constexpr int64_t kRows = 4;
  // dx = dout · W: blocks of dx rows are independent.
#pragma omp parallel for schedule(static) if (N * O * I >= kCpuParallelWork)
  for (int64_t n0 = 0; n0 < N; n0 += kRows)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t n = n0; n < std::min(n0 + kRows, N); ++n)
        axpy(dx.ptr<float>() + n * I, g[n * O + o], weight.ptr<float>() + o * I, I);
  // dW = doutᵀ · x and dbias = Σ dout: blocks of dW rows are independent.
#pragma omp parallel for schedule(static) if (N * O * I >= kCpuParallelWork)
  for (int64_t o0 = 0; o0 < O; o0 += kRows)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = o0; o < std::min(o0 + kRows, O); ++o) {
        axpy(dweight.ptr<float>() + o * I, g[n * O + o], x.ptr<float>() + n * I, I);
        if (dbias.data) dbias.ptr<float>()[o] += g[n * O + o];
      }
}

void CpuOps::rope_forward(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, int heads) {
  rope_rotate(x, positions, inv_freq, heads, +1.0f, "rope_forward");
}

void CpuOps::rope_backward(const Tensor& dx, const Tensor& positions, const Tensor& inv_freq, int heads) {
  rope_rotate(dx, positions, inv_freq, heads, -1.0f, "rope_backward");
}

// The unfused pieces: RoPE's backward on a copy of dout, then the per-head norm's.
void CpuOps::rmsnorm_rope_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                                   const Tensor& weight, const Tensor& rstd, const Tensor& positions,
                                   const Tensor& inv_freq, int heads) {
  constexpr const char* op = "rmsnorm_rope_backward";
  expect_f32(x, op, "x", {kAny, kAny});
  const int64_t T = x.shape[0], D = head_dim_of(x, heads, op);
  expect_f32(dout, op, "dout", {T, heads * D});
  std::vector<float> rotated(dout.ptr<float>(), dout.ptr<float>() + dout.numel());
  const Tensor d_rotated = Tensor::view(rotated.data(), DType::F32, Device::CPU, {T, heads * D});
  rope_backward(d_rotated, positions, inv_freq, heads);
  const auto per_head = [&](const Tensor& t) { return Tensor::view(t.data, t.dtype, t.device, {T * heads, D}); };
  rmsnorm_backward(per_head(dx), dweight, per_head(d_rotated), per_head(x), weight, rstd, GradWrite::overwrite);
}

// Per head: rmsnorm_forward then rope_forward, the unfused pieces in their order.
void CpuOps::qk_norm_rope_forward(const Tensor& q_out, const Tensor& k_out, const Tensor& q, const Tensor& k,
                                  const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions,
                                  const Tensor& inv_freq, int heads, int kv_heads, float eps, const Tensor& q_rstd,
                                  const Tensor& k_rstd) {
  constexpr const char* op = "qk_norm_rope_forward";
  expect_f32(q, op, "q", {kAny, kAny});
  const int64_t T = q.shape[0], D = head_dim_of(q, heads, op);
  if (kv_heads <= 0)
    throw std::invalid_argument("CpuOps::qk_norm_rope_forward: " + std::to_string(kv_heads) + " key heads");
  expect_f32(k, op, "k", {T, kv_heads * D});
  expect_f32(q_out, op, "q_out", {T, heads * D});
  expect_f32(k_out, op, "k_out", {T, kv_heads * D});
  const bool norm = q_norm.data || k_norm.data;
  if (norm) {
    expect_f32(q_norm, op, "q_norm", {D});
    expect_f32(k_norm, op, "k_norm", {D});
  }
  const bool keep_rstd = q_rstd.data || k_rstd.data;
  if (keep_rstd) {
    if (!norm)
      throw std::invalid_argument("CpuOps::qk_norm_rope_forward: rstd outputs given without q/k norm weights");
    expect_f32(q_rstd, op, "q_rstd", {T * heads});
    expect_f32(k_rstd, op, "k_rstd", {T * kv_heads});
  }
  auto one = [&](const Tensor& out, const Tensor& in, const Tensor& weight, const Tensor& kept_rstd, int n_heads) {
    if (norm) {
      std::vector<float> scratch(keep_rstd ? 0 : T * n_heads);
      const Tensor rstd =
          keep_rstd ? kept_rstd : Tensor::view(scratch.data(), DType::F32, Device::CPU, {T * n_heads});
      rmsnorm_forward(per_head_rows(out, n_heads), rstd, per_head_rows(in, n_heads), weight, eps);
    } else if (out.data != in.data) {
      copy(out, in);
    }
    rope_forward(out, positions, inv_freq, n_heads);
  };
  one(q_out, q, q_norm, q_rstd, heads);
  one(k_out, k, k_norm, k_rstd, kv_heads);
}

void CpuOps::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& cu_seqlens, int heads, int kv_heads) {
  expect_f32(q, "attention_forward", "q", {kAny, kAny});
  const int64_t T = q.shape[0], D = head_dim_of(q, heads, "attention_forward");
  if (kv_heads <= 0 || heads % kv_heads != 0)
    throw std::invalid_argument("CpuOps::attention_forward: " + std::to_string(heads) + " query heads do not group over " +
                                std::to_string(kv_heads) + " key/value heads");
  expect_f32(k, "attention_forward", "k", {T, kv_heads * D});
  expect_f32(v, "attention_forward", "v", {T, kv_heads * D});
  expect_f32(out, "attention_forward", "out", {T, heads * D});
  expect_f32(lse, "attention_forward", "lse", {T, heads});
  const std::vector<int32_t> starts = sequence_starts(cu_seqlens, T, "attention_forward");
  const int group = heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t q_stride = heads * D, kv_stride = kv_heads * D;
  // Each query reads its keys once: about T²/2 · heads · D multiply-adds for one sequence.
#pragma omp parallel if (T * T * heads * D / 2 >= kCpuParallelWork)
  {
    std::vector<float> p;
#pragma omp for schedule(dynamic, 4)
    for (int64_t item = 0; item < T * heads; ++item) {
      const int64_t t = item / heads;
      const int h = static_cast<int>(item % heads), g = h / group;
      const float* qi = q.ptr<float>() + t * q_stride + h * D;
      const int64_t first = starts[t], count = t - first + 1;
      p.resize(count);
      float max = -INFINITY;
      for (int64_t j = 0; j < count; ++j) {
        p[j] = dot(qi, k.ptr<float>() + (first + j) * kv_stride + g * D, D) * scale;
        max = std::max(max, p[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j < count; ++j) sum += (p[j] = std::exp(p[j] - max));
      float* oi = out.ptr<float>() + t * q_stride + h * D;
      std::memset(oi, 0, D * sizeof(float));
      for (int64_t j = 0; j < count; ++j) axpy(oi, p[j] / sum, v.ptr<float>() + (first + j) * kv_stride + g * D, D);
      lse.ptr<float>()[t * heads + h] = max + std::log(sum);
    }
  }
}

void CpuOps::attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& cu_seqlens, int heads, int kv_heads,
                                const AttentionScratch&) {
  expect_f32(q, "attention_backward", "q", {kAny, kAny});
  const int64_t T = q.shape[0], D = head_dim_of(q, heads, "attention_backward");
  if (kv_heads <= 0 || heads % kv_heads != 0)
    throw std::invalid_argument("CpuOps::attention_backward: " + std::to_string(heads) +
                                " query heads do not group over " + std::to_string(kv_heads) + " key/value heads");
  for (const auto& [tensor, name] : {std::pair{&k, "k"}, {&v, "v"}, {&dk, "dk"}, {&dv, "dv"}})
    expect_f32(*tensor, "attention_backward", name, {T, kv_heads * D});
  for (const auto& [tensor, name] : {std::pair{&dq, "dq"}, {&dout, "dout"}, {&out, "out"}})
    expect_f32(*tensor, "attention_backward", name, {T, heads * D});
  expect_f32(lse, "attention_backward", "lse", {T, heads});
  sequence_starts(cu_seqlens, T, "attention_backward");
  const int32_t* cu = cu_seqlens.ptr<int32_t>();
  const int64_t sequences = cu_seqlens.shape[0] - 1;
  const int group = heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t q_stride = heads * D, kv_stride = kv_heads * D;
  // The sums below add into the gradients, which this op overwrites.
  for (const Tensor* gradient : {&dq, &dk, &dv}) zero(*gradient);
  // One work item per (sequence, kv head): it owns that head's dk/dv rows and the dq rows
  // of its query group, so no two threads ever add into the same gradient.
#pragma omp parallel for schedule(dynamic, 1) if (T * T * heads * D >= kCpuParallelWork)
  for (int64_t item = 0; item < sequences * kv_heads; ++item) {
    const int64_t s = item / kv_heads;
    const int g = static_cast<int>(item % kv_heads);
    for (int h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
        const float* qi = q.ptr<float>() + t * q_stride + h * D;
        const float* doi = dout.ptr<float>() + t * q_stride + h * D;
        float* dqi = dq.ptr<float>() + t * q_stride + h * D;
        const float row_lse = lse.ptr<float>()[t * heads + h];
        const float dot_out = dot(doi, out.ptr<float>() + t * q_stride + h * D, D);
        for (int64_t j = cu[s]; j <= t; ++j) {
          const float* kj = k.ptr<float>() + j * kv_stride + g * D;
          const float* vj = v.ptr<float>() + j * kv_stride + g * D;
          const float p = std::exp(dot(qi, kj, D) * scale - row_lse);
          const float dscore = p * (dot(doi, vj, D) - dot_out) * scale;
          axpy(dv.ptr<float>() + j * kv_stride + g * D, p, doi, D);
          axpy(dqi, dscore, kj, D);
          axpy(dk.ptr<float>() + j * kv_stride + g * D, dscore, qi, D);
        }
      }
    }
  }
}

void CpuOps::swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) {
  expect_f32(gate, "swiglu_forward", "gate", {kAny, kAny});
  expect_f32(up, "swiglu_forward", "up", {gate.shape[0], gate.shape[1]});
  expect_f32(out, "swiglu_forward", "out", {gate.shape[0], gate.shape[1]});
  const int64_t n = gate.numel();
  const float *g = gate.ptr<float>(), *u = up.ptr<float>();
  float* y = out.ptr<float>();
#pragma omp parallel for schedule(static) if (n >= kCpuParallelWork)
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] * sigmoid(g[i]) * u[i];
}

void CpuOps::swiglu_forward(const ScaledRows& out, const ScaledRows& gate_up) {
  const Tensor& values = gate_up.values;
  expect_f32(values, "swiglu_forward", "gate_up", {kAny, kAny});
  const int64_t N = values.shape[0], I = values.shape[1] / 2;
  if (values.shape[1] % 2 != 0)
    throw std::invalid_argument("CpuOps::swiglu_forward: argument 'gate_up' " + values.describe() +
                                " has an odd number of columns: no gate and up halves");
  const float* scales = expect_in_rows(gate_up, "swiglu_forward", "gate_up", N, 2 * I);
  expect_out_rows(out, "swiglu_forward", N, I);
#pragma omp parallel for schedule(static) if (N * I >= kCpuParallelWork)
  for (int64_t n = 0; n < N; ++n) {
    const float *g = values.ptr<float>() + n * 2 * I, *u = g + I;
    const float scale = scales ? scales[n] : 1.f;
    std::vector<float> coded = coded_row(out, I);
    float* y = out_row(out, n, I, coded);
    for (int64_t i = 0; i < I; ++i) {
      const float gate = g[i] * scale, up = u[i] * scale;  // exact without scales
      y[i] = gate * sigmoid(gate) * up;
    }
    if (!coded.empty()) encode_row(out, n, y, I);
  }
}

void CpuOps::swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                             const Tensor& up) {
  expect_f32(gate, "swiglu_backward", "gate", {kAny, kAny});
  for (const auto& [tensor, name] : {std::pair{&up, "up"}, {&dout, "dout"}, {&dgate, "dgate"}, {&dup, "dup"}})
    expect_f32(*tensor, "swiglu_backward", name, {gate.shape[0], gate.shape[1]});
  const int64_t n = gate.numel();
  const float *g = gate.ptr<float>(), *u = up.ptr<float>(), *dy = dout.ptr<float>();
#pragma omp parallel for schedule(static) if (n >= kCpuParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(g[i]);
    dgate.ptr<float>()[i] = dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    dup.ptr<float>()[i] = dy[i] * g[i] * s;
  }
}

}  // namespace tandem
