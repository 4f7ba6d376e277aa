#include "rollout/cpu_paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/cpu_ops.h"
#include "model/cpu_vector.h"
#include "model/op_args.h"
#include "tensor/fp8.h"

namespace tandem {

namespace {

using cpu_vector::axpy;
using cpu_vector::dot;

constexpr Device kCpu = Device::CPU;

[[noreturn]] void fail(const char* op, const std::string& why) {
  throw std::invalid_argument(std::string("CpuPagedAttention::") + op + ": " + why);
}

// The cache's tensors (F32, or F8_E4M3 with F32 scales of `kv_heads` a row); returns the
// rows.
int64_t check_cache(const char* op, const CacheLayer& cache, int64_t width) {
  check_op_arg(cache.keys, op, "keys", kCpu, {DType::F32, DType::F8_E4M3}, {kAnyExtent, width});
  const int64_t rows = cache.keys.shape[0];
  check_op_arg(cache.values, op, "values", kCpu, {cache.keys.dtype}, {rows, width});
  if (cache.keys.dtype == DType::F8_E4M3) {
    check_op_arg(cache.key_scales, op, "key_scales", kCpu, {DType::F32}, {rows, kAnyExtent});
    const int64_t kv_heads = cache.key_scales.shape[1];
    if (kv_heads < 1 || width % kv_heads != 0)
      fail(op, cache.key_scales.describe() + " does not give a scale to each head of " + cache.keys.describe());
    check_op_arg(cache.value_scales, op, "value_scales", kCpu, {DType::F32}, {rows, kv_heads});
  }
  return rows;
}

// Row `row` of a region from `x` [width]: copied, or as codes of one scale per head.
void put_row(const Tensor& region, const Tensor& scales, int64_t row, const float* x) {
  const int64_t width = region.shape[1];
  if (region.dtype == DType::F32) return (void)std::memcpy(region.ptr<float>() + row * width, x, width * sizeof(float));
  const int64_t heads = scales.shape[1], D = width / heads;
  for (int64_t h = 0; h < heads; ++h) {
    const float* head = x + h * D;
    float amax = 0;
    for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(head[d]));
    const float inverse = e4m3_inverse_scale(amax);
    uint8_t* codes = region.ptr<uint8_t>() + row * width + h * D;
    for (int64_t d = 0; d < D; ++d) codes[d] = float_to_e4m3(head[d] * inverse);
    scales.ptr<float>()[row * heads + h] = e4m3_scale(amax);
  }
}

// Head `head` [D] of row `row` of a region as FP32: a pointer into an F32 region, or the
// codes times their scale decoded into `decoded`.
const float* read_head(const Tensor& region, const Tensor& scales, int64_t row, int64_t head, int64_t D,
                       float* decoded) {
  const int64_t width = region.shape[1];
  if (region.dtype == DType::F32) return region.ptr<float>() + row * width + head * D;
  const uint8_t* codes = region.ptr<uint8_t>() + row * width + head * D;
  const float scale = scales.ptr<float>()[row * scales.shape[1] + head];
  for (int64_t d = 0; d < D; ++d) decoded[d] = e4m3_to_float(codes[d]) * scale;
  return decoded;
}

}  // namespace

void CpuPagedAttention::store(const CacheLayer& cache, const Tensor& k, const Tensor& v, const Tensor& slots) {
  const char* op = "CpuPagedAttention::store";
  check_op_arg(k, op, "k", kCpu, {DType::F32}, {kAnyExtent, kAnyExtent});
  const int64_t T = k.shape[0], width = k.shape[1];
  check_op_arg(v, op, "v", kCpu, {DType::F32}, {T, width});
  check_op_arg(slots, op, "slots", kCpu, {DType::I32}, {T});
  const int64_t rows = check_cache(op, cache, width);
  const int32_t* slot = slots.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    if (slot[t] < 0 || slot[t] >= rows)
      fail("store", "slot " + std::to_string(slot[t]) + " of token " + std::to_string(t) + " is outside the " +
                        std::to_string(rows) + " cache rows");
    put_row(cache.keys, cache.key_scales, slot[t], k.ptr<float>() + t * width);
    put_row(cache.values, cache.value_scales, slot[t], v.ptr<float>() + t * width);
  }
}

void CpuPagedAttention::attend_qkv(const Tensor& out, const Tensor& q_scratch, const CacheLayer& cache,
                                   const ScaledRows& qkv, const Tensor& q_norm, const Tensor& k_norm,
                                   const Tensor& positions, const Tensor& inv_freq, const PagedBatch& batch, int heads,
                                   int kv_heads, float eps) {
  store_qkv(q_scratch, cache, qkv, q_norm, k_norm, positions, inv_freq, batch.slots, heads, kv_heads, eps);
  attend(out, q_scratch, cache, batch, heads, kv_heads);
}

// The unfused pieces in their order: the column split, CpuOps::qk_norm_rope_forward, store.
void CpuPagedAttention::store_qkv(const Tensor& q_out, const CacheLayer& cache, const ScaledRows& qkv,
                                  const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions,
                                  const Tensor& inv_freq, const Tensor& slots, int heads, int kv_heads, float eps) {
  const char* op = "CpuPagedAttention::store_qkv";
  check_op_arg(q_out, op, "q_out", kCpu, {DType::F32}, {kAnyExtent, kAnyExtent});
  if (heads <= 0 || kv_heads <= 0 || q_out.shape[1] % heads != 0)
    fail("store_qkv", q_out.describe() + " does not split into " + std::to_string(heads) + " heads");
  const int64_t T = q_out.shape[0], QD = q_out.shape[1], KD = QD / heads * kv_heads, W = QD + 2 * KD;
  check_in_rows(qkv, op, "qkv", kCpu, {DType::F32}, T, W);
  std::vector<float> q(T * QD), k(T * KD), v(T * KD);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = qkv.values.ptr<float>() + t * W;
    const float scale = qkv.scales.data ? qkv.scales.ptr<float>()[t] : 1.f;  // exact without scales
    for (int64_t i = 0; i < QD; ++i) q[t * QD + i] = row[i] * scale;
    for (int64_t i = 0; i < KD; ++i) k[t * KD + i] = row[QD + i] * scale, v[t * KD + i] = row[QD + KD + i] * scale;
  }
  const Tensor k_rows = Tensor::view(k.data(), DType::F32, kCpu, {T, KD});
  CpuOps().qk_norm_rope_forward(q_out, k_rows, Tensor::view(q.data(), DType::F32, kCpu, {T, QD}), k_rows, q_norm,
                                k_norm, positions, inv_freq, heads, kv_heads, eps, Tensor{}, Tensor{});
  store(cache, k_rows, Tensor::view(v.data(), DType::F32, kCpu, {T, KD}), slots);
}

void CpuPagedAttention::attend(const Tensor& out, const Tensor& q, const CacheLayer& cache, const PagedBatch& batch,
                               int heads, int kv_heads) {
  const char* op = "CpuPagedAttention::attend";
  check_op_arg(q, op, "q", kCpu, {DType::F32}, {kAnyExtent, kAnyExtent});
  const int64_t T = q.shape[0];
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || q.shape[1] % heads != 0)
    fail("attend", std::to_string(heads) + " query heads over " + std::to_string(kv_heads) +
                       " key/value heads do not fit q " + q.describe());
  const int64_t D = q.shape[1] / heads;
  check_op_arg(out, op, "out", kCpu, {DType::F32}, {T, heads * D});
  const int64_t rows = check_cache(op, cache, kv_heads * D);
  if (cache.key_scales.data && cache.key_scales.shape[1] != kv_heads)
    fail("attend", cache.key_scales.describe() + " holds scales of " + std::to_string(cache.key_scales.shape[1]) +
                       " heads, not " + std::to_string(kv_heads));
  check_op_arg(batch.cu_queries, op, "cu_queries", kCpu, {DType::I32}, {kAnyExtent});
  const int64_t B = batch.cu_queries.shape[0] - 1;
  check_op_arg(batch.context_lens, op, "context_lens", kCpu, {DType::I32}, {B});
  check_op_arg(batch.block_tables, op, "block_tables", kCpu, {DType::I32}, {B, kAnyExtent});
  const int64_t max_blocks = batch.block_tables.shape[1], bs = batch.block_size;
  const int32_t* cu = batch.cu_queries.ptr<int32_t>();
  const int32_t* context = batch.context_lens.ptr<int32_t>();
  const int32_t* tables = batch.block_tables.ptr<int32_t>();
  if (B < 1 || cu[0] != 0 || cu[B] != T) fail("attend", "cu_queries must run from 0 to " + std::to_string(T));

  // Every index is checked before the parallel loop, which must not throw.
  std::vector<int32_t> sequence_of(T);
  int64_t work = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t queries = cu[b + 1] - cu[b], blocks = (context[b] + bs - 1) / bs;
    if (queries < 1 || context[b] < queries || blocks > max_blocks)
      fail("attend", "sequence " + std::to_string(b) + " has " + std::to_string(queries) + " new tokens and " +
                         std::to_string(context[b]) + " cached (at most " + std::to_string(max_blocks * bs) + ")");
    for (int64_t j = 0; j < blocks; ++j)
      if (tables[b * max_blocks + j] < 0 || (tables[b * max_blocks + j] + 1) * bs > rows)
        fail("attend", "sequence " + std::to_string(b) + " block " + std::to_string(j) + " is " +
                           std::to_string(tables[b * max_blocks + j]) + ", outside the cache");
    for (int32_t t = cu[b]; t < cu[b + 1]; ++t) sequence_of[t] = static_cast<int32_t>(b);
    work += queries * context[b] * heads * D;
  }

  const int group = heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t q_stride = heads * D;
#pragma omp parallel if (work >= kCpuParallelWork)
  {
    std::vector<float> p, decoded_keys, decoded_values;
    std::vector<const float*> key_rows, value_rows;
#pragma omp for schedule(dynamic, 4)
    for (int64_t item = 0; item < T * heads; ++item) {
      const int64_t t = item / heads;
      const int h = static_cast<int>(item % heads), g = h / group;
      const int64_t b = sequence_of[t];
      const int64_t count = context[b] - (cu[b + 1] - t) + 1;  // keys up to and including this position
      const int32_t* table = tables + b * max_blocks;
      key_rows.resize(count);
      value_rows.resize(count);
      const bool coded = cache.key_scales.data != nullptr;
      decoded_keys.resize(coded ? count * D : 0);
      decoded_values.resize(decoded_keys.size());
      for (int64_t j = 0; j < count; ++j) {
        const int64_t row = table[j / bs] * bs + j % bs;
        key_rows[j] = read_head(cache.keys, cache.key_scales, row, g, D, coded ? &decoded_keys[j * D] : nullptr);
        value_rows[j] = read_head(cache.values, cache.value_scales, row, g, D, coded ? &decoded_values[j * D] : nullptr);
      }
      const float* qi = q.ptr<float>() + t * q_stride + h * D;
      p.resize(count);
      float max = -INFINITY;
      for (int64_t j = 0; j < count; ++j) {
        p[j] = dot(qi, key_rows[j], D) * scale;
        max = std::max(max, p[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j < count; ++j) sum += (p[j] = std::exp(p[j] - max));
      float* oi = out.ptr<float>() + t * q_stride + h * D;
      std::memset(oi, 0, D * sizeof(float));
      for (int64_t j = 0; j < count; ++j) axpy(oi, p[j] / sum, value_rows[j], D);
    }
  }
}

}  // namespace tandem
