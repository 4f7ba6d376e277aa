// Paged attention on the CPU against the packed causal attention of the trainer
// (CpuOps::attention_forward): keys and values of two sequences are stored into
// scattered, shuffled blocks; a prefill step over all their tokens and a decode-shaped
// step over the last token of each must give the trainer's rows exactly (the same
// arithmetic in the same order). A cache of FP8 codes must give the trainer's rows on the
// decoded keys and values exactly, after codes within half a step of each element. Also
// the KV cache geometry and its pool allocation.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <tuple>

#include "model/cpu_ops.h"
#include "rollout/cpu_paged_attention.h"
#include "rollout/kv_cache.h"
#include "tensor/fp8.h"
#include "tensor/memory_pool.h"
#include "test_model_support.h"

namespace tandem {
namespace {

constexpr int kHeads = 4, kKvHeads = 2, kHeadDim = 6, kBlock = 4;

Tensor f32(std::vector<float>& data, std::vector<int64_t> shape) {
  return Tensor::view(data.data(), DType::F32, Device::CPU, std::move(shape));
}
Tensor i32(std::vector<int32_t>& data, std::vector<int64_t> shape) {
  return Tensor::view(data.data(), DType::I32, Device::CPU, std::move(shape));
}

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

TEST(CpuPagedAttention, MatchesPackedCausalAttentionForPrefillAndDecode) {
  const std::vector<int32_t> lengths = {13, 7};
  const int64_t T = 20, QD = kHeads * kHeadDim, KD = kKvHeads * kHeadDim;
  std::vector<float> q = random_values(T * QD, 1), k = random_values(T * KD, 2), v = random_values(T * KD, 3);
  std::vector<int32_t> cu = {0, 13, 20};

  std::vector<float> expected(T * QD), lse(T * kHeads);
  CpuOps ops;
  ops.attention_forward(f32(expected, {T, QD}), f32(lse, {T, kHeads}), f32(q, {T, QD}), f32(k, {T, KD}),
                        f32(v, {T, KD}), i32(cu, {3}), kHeads, kKvHeads);

  // 12 blocks, handed to the two sequences in a shuffled order.
  const int64_t blocks = 12, rows = blocks * kBlock, max_blocks = 4;
  std::vector<int32_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(5));
  std::vector<int32_t> tables = {order[0], order[1], order[2], order[3], order[4], order[5], -1, -1};
  std::vector<int32_t> slots(T);
  for (int64_t t = 0; t < T; ++t) {
    const int b = t < 13 ? 0 : 1;
    const int64_t p = t - cu[b];
    slots[t] = tables[b * max_blocks + p / kBlock] * kBlock + p % kBlock;
  }
  std::vector<float> key_cache(rows * KD, NAN), value_cache(rows * KD, NAN);  // unused rows must never be read
  CpuPagedAttention paged;
  paged.store({f32(key_cache, {rows, KD}), f32(value_cache, {rows, KD})}, f32(k, {T, KD}), f32(v, {T, KD}),
              i32(slots, {T}));

  std::vector<int32_t> context = {13, 7};
  std::vector<float> out(T * QD);
  paged.attend(f32(out, {T, QD}), f32(q, {T, QD}), {f32(key_cache, {rows, KD}), f32(value_cache, {rows, KD})},
               {i32(slots, {T}), i32(cu, {3}), i32(context, {2}), i32(tables, {2, max_blocks}), kBlock}, kHeads,
               kKvHeads);
  EXPECT_EQ(out, expected);

  // Decode shape: one query per sequence, its last token, against the cached context.
  std::vector<float> last_q(2 * QD), last_out(2 * QD);
  std::copy_n(q.begin() + 12 * QD, QD, last_q.begin());
  std::copy_n(q.begin() + 19 * QD, QD, last_q.begin() + QD);
  std::vector<int32_t> decode_cu = {0, 1, 2}, decode_slots = {slots[12], slots[19]};
  paged.attend(f32(last_out, {2, QD}), f32(last_q, {2, QD}), {f32(key_cache, {rows, KD}), f32(value_cache, {rows, KD})},
               {i32(decode_slots, {2}), i32(decode_cu, {3}), i32(context, {2}), i32(tables, {2, max_blocks}), kBlock},
               kHeads, kKvHeads);
  EXPECT_TRUE(std::equal(last_out.begin(), last_out.begin() + QD, expected.begin() + 12 * QD));
  EXPECT_TRUE(std::equal(last_out.begin() + QD, last_out.end(), expected.begin() + 19 * QD));
}

// Codes of one scale per (row, kv head): the head's largest magnitude becomes 448, and
// every element's code is the nearest to its value over the scale (tensor/fp8.h). Then
// attention over the coded cache is the trainer's attention over the decoded rows.
TEST(CpuPagedAttention, Fp8CacheHoldsEachHeadAsCodesOfOneScale) {
  const int64_t T = 9, QD = kHeads * kHeadDim, KD = kKvHeads * kHeadDim, rows = 3 * kBlock;
  std::vector<float> q = random_values(T * QD, 4), k = random_values(T * KD, 5), v = random_values(T * KD, 6);
  for (int64_t d = 0; d < kHeadDim; ++d) k[KD + kHeadDim + d] = 0;  // a head of zeros: scale 0, codes 0
  std::vector<int32_t> slots(T), tables = {2, 0, 1}, cu = {0, static_cast<int32_t>(T)}, context = {static_cast<int32_t>(T)};
  for (int64_t t = 0; t < T; ++t) slots[t] = tables[t / kBlock] * kBlock + t % kBlock;
  std::vector<uint8_t> key_codes(rows * KD), value_codes(rows * KD);
  std::vector<float> key_scales(rows * kKvHeads, NAN), value_scales(rows * kKvHeads, NAN);
  const auto codes = [](std::vector<uint8_t>& x) {
    return Tensor::view(x.data(), DType::F8_E4M3, Device::CPU, {rows, KD});
  };
  const CacheLayer cache{codes(key_codes), codes(value_codes), f32(key_scales, {rows, kKvHeads}),
                         f32(value_scales, {rows, kKvHeads})};
  CpuPagedAttention paged;
  paged.store(cache, f32(k, {T, KD}), f32(v, {T, KD}), i32(slots, {T}));

  std::vector<float> decoded_k(T * KD), decoded_v(T * KD);
  for (auto [x, coded, scales, decoded] : {std::tuple{&k, &key_codes, &key_scales, &decoded_k},
                                           std::tuple{&v, &value_codes, &value_scales, &decoded_v}})
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < kKvHeads; ++h) {
        const float* head = x->data() + t * KD + h * kHeadDim;
        float amax = 0;
        for (int64_t d = 0; d < kHeadDim; ++d) amax = std::max(amax, std::abs(head[d]));
        const float scale = (*scales)[slots[t] * kKvHeads + h];
        ASSERT_EQ(scale, amax / 448.f) << "token " << t << " head " << h;
        for (int64_t d = 0; d < kHeadDim; ++d) {
          const uint8_t code = (*coded)[slots[t] * KD + h * kHeadDim + d];
          const float value = e4m3_to_float(code) * scale;
          (*decoded)[t * KD + h * kHeadDim + d] = value;
          // Half a step of E4M3 (3 mantissa bits) at the element's size, or of the
          // subnormal steps of 2^-9 below 2^-6.
          const float scaled = scale > 0 ? std::abs(head[d]) / scale : 0.f;
          const float step = (scaled >= 0x1p-6f ? std::ldexp(1.f, std::ilogb(scaled) - 3) : 0x1p-9f) * scale;
          EXPECT_LE(std::abs(value - head[d]), step / 2 + 1e-7f * std::abs(head[d]))
              << "token " << t << " head " << h << " dim " << d;
          if (std::abs(head[d]) == amax && amax > 0) EXPECT_EQ(code & 0x7f, 0x7e);
        }
      }

  std::vector<float> expected(T * QD), lse(T * kHeads), out(T * QD);
  CpuOps().attention_forward(f32(expected, {T, QD}), f32(lse, {T, kHeads}), f32(q, {T, QD}), f32(decoded_k, {T, KD}),
                             f32(decoded_v, {T, KD}), i32(cu, {2}), kHeads, kKvHeads);
  paged.attend(f32(out, {T, QD}), f32(q, {T, QD}), cache,
               {i32(slots, {T}), i32(cu, {2}), i32(context, {1}), i32(tables, {1, 3}), kBlock}, kHeads, kKvHeads);
  EXPECT_EQ(out, expected);

  std::vector<float> wrong_scales(rows * (kKvHeads + 1));
  const CacheLayer misshapen{cache.keys, cache.values, f32(wrong_scales, {rows, kKvHeads + 1}), cache.value_scales};
  EXPECT_THROW(paged.store(misshapen, f32(k, {T, KD}), f32(v, {T, KD}), i32(slots, {T})), std::invalid_argument);
}

TEST(CpuPagedAttention, RefusesIndicesOutsideTheCache) {
  const int64_t KD = kKvHeads * kHeadDim, QD = kHeads * kHeadDim, rows = 8;
  std::vector<float> cache(rows * KD), values(rows * KD), k(KD), q(QD), out(QD);
  CpuPagedAttention paged;
  std::vector<int32_t> slot = {8};
  EXPECT_THROW(
      paged.store({f32(cache, {rows, KD}), f32(values, {rows, KD})}, f32(k, {1, KD}), f32(k, {1, KD}), i32(slot, {1})),
      std::invalid_argument);
  std::vector<int32_t> cu = {0, 1}, context = {5}, tables = {0, 2};  // block 2 is rows 8..11: outside
  EXPECT_THROW(
      paged.attend(f32(out, {1, QD}), f32(q, {1, QD}), {f32(cache, {rows, KD}), f32(values, {rows, KD})},
                   {i32(slot, {1}), i32(cu, {2}), i32(context, {1}), i32(tables, {1, 2}), kBlock}, kHeads, kKvHeads),
      std::invalid_argument);
  context = {9};  // more than the table's 2 blocks hold
  EXPECT_THROW(
      paged.attend(f32(out, {1, QD}), f32(q, {1, QD}), {f32(cache, {rows, KD}), f32(values, {rows, KD})},
                   {i32(slot, {1}), i32(cu, {2}), i32(context, {1}), i32(tables, {1, 2}), kBlock}, kHeads, kKvHeads),
      std::invalid_argument);
}

TEST(KvCache, GeometryFromBytesAndOneTaggedAllocation) {
  const ModelConfig config = testing::tiny_config(true, false, true);  // 2 layers, kv_dim 12
  const KvCacheGeometry geometry = KvCacheGeometry::for_bytes(config, 100000, 16, DType::F32);
  EXPECT_EQ(geometry.block_bytes(), 2u * 2 * 16 * 12 * 4);
  EXPECT_EQ(geometry.blocks, static_cast<int32_t>(100000 / geometry.block_bytes()));
  EXPECT_EQ(geometry.token_capacity(), geometry.blocks * 16);
  EXPECT_THROW(KvCacheGeometry::for_bytes(config, 100, 16, DType::F32), std::invalid_argument);
  EXPECT_EQ(KvCacheGeometry::for_bytes(config, 100000, 16, DType::BF16).blocks,
            static_cast<int32_t>(100000 / (geometry.block_bytes() / 2)));

  auto pool = MemoryPool::create(Device::CPU);
  {
    KvCache cache(*pool, geometry, "test.kv_cache");
    ASSERT_EQ(pool->allocations().size(), 1u);
    EXPECT_EQ(pool->allocations()[0]->tag, tags::kv_cache);
    // The blocks handed out, and the padding block after them.
    const size_t bytes = geometry.bytes() + geometry.block_bytes();
    EXPECT_EQ(pool->allocations()[0]->bytes, bytes);
    EXPECT_EQ(cache.padding_block(), geometry.blocks);
    // The per-layer regions tile the allocation without overlap.
    for (int l = 0; l < 2; ++l) {
      const CacheLayer& layer = cache.layer(l);
      EXPECT_EQ(layer.keys.shape, (std::vector<int64_t>{geometry.token_capacity() + 16, 12}));
      EXPECT_EQ(static_cast<char*>(layer.values.data) - static_cast<char*>(layer.keys.data),
                static_cast<ptrdiff_t>(layer.keys.nbytes()));
      EXPECT_EQ(layer.key_scales.data, nullptr);
    }
    EXPECT_EQ(static_cast<char*>(cache.layer(1).values.data) + cache.layer(1).values.nbytes(),
              static_cast<char*>(pool->allocations()[0]->ptr) + bytes);
    EXPECT_EQ(cache.blocks().free_count(), geometry.blocks);
  }
  EXPECT_TRUE(pool->allocations().empty());
}

// An FP8 cache: a byte a key or value element and an F32 scale a (row, kv head), in four
// regions per layer that tile the one allocation.
TEST(KvCache, Fp8GeometryHoldsCodesAndScales) {
  const ModelConfig config = testing::tiny_config(true, false, true);  // 2 layers, 2 kv heads, kv_dim 12
  const KvCacheGeometry geometry = KvCacheGeometry::for_bytes(config, 100000, 16, DType::F8_E4M3);
  EXPECT_TRUE(geometry.scaled());
  EXPECT_EQ(geometry.block_bytes(), 2u * 2 * 16 * (12 + 2 * 4));
  EXPECT_EQ(geometry.blocks, static_cast<int32_t>(100000 / geometry.block_bytes()));
  auto pool = MemoryPool::create(Device::CPU);
  KvCache cache(*pool, geometry, "test.kv_cache");
  const int64_t rows = geometry.token_capacity() + 16;
  char* at = static_cast<char*>(pool->allocations()[0]->ptr);
  for (int l = 0; l < 2; ++l) {
    const CacheLayer& layer = cache.layer(l);
    for (const auto& [region, dtype, width] : {std::tuple{&layer.keys, DType::F8_E4M3, int64_t{12}},
                                               {&layer.values, DType::F8_E4M3, int64_t{12}},
                                               {&layer.key_scales, DType::F32, int64_t{2}},
                                               {&layer.value_scales, DType::F32, int64_t{2}}}) {
      EXPECT_EQ(region->dtype, dtype);
      EXPECT_EQ(region->shape, (std::vector<int64_t>{rows, width}));
      EXPECT_EQ(static_cast<char*>(region->data), at);
      at += region->nbytes();
    }
  }
  EXPECT_EQ(at, static_cast<char*>(pool->allocations()[0]->ptr) + pool->allocations()[0]->bytes);
}

}  // namespace
}  // namespace tandem
