// Paged attention on the CPU against the packed causal attention of the trainer
// (CpuOps::attention_forward): keys and values of two sequences are stored into
// scattered, shuffled blocks; a prefill step over all their tokens and a decode-shaped
// step over the last token of each must give the trainer's rows exactly (the same
// arithmetic in the same order). Also the KV cache geometry and its pool allocation.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "model/cpu_ops.h"
#include "rollout/cpu_paged_attention.h"
#include "rollout/kv_cache.h"
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
  paged.store(f32(key_cache, {rows, KD}), f32(value_cache, {rows, KD}), f32(k, {T, KD}), f32(v, {T, KD}),
              i32(slots, {T}));

  std::vector<int32_t> context = {13, 7};
  std::vector<float> out(T * QD);
  paged.attend(f32(out, {T, QD}), f32(q, {T, QD}), f32(key_cache, {rows, KD}), f32(value_cache, {rows, KD}),
               {i32(slots, {T}), i32(cu, {3}), i32(context, {2}), i32(tables, {2, max_blocks}), kBlock}, kHeads,
               kKvHeads);
  EXPECT_EQ(out, expected);

  // Decode shape: one query per sequence, its last token, against the cached context.
  std::vector<float> last_q(2 * QD), last_out(2 * QD);
  std::copy_n(q.begin() + 12 * QD, QD, last_q.begin());
  std::copy_n(q.begin() + 19 * QD, QD, last_q.begin() + QD);
  std::vector<int32_t> decode_cu = {0, 1, 2}, decode_slots = {slots[12], slots[19]};
  paged.attend(f32(last_out, {2, QD}), f32(last_q, {2, QD}), f32(key_cache, {rows, KD}), f32(value_cache, {rows, KD}),
               {i32(decode_slots, {2}), i32(decode_cu, {3}), i32(context, {2}), i32(tables, {2, max_blocks}), kBlock},
               kHeads, kKvHeads);
  EXPECT_TRUE(std::equal(last_out.begin(), last_out.begin() + QD, expected.begin() + 12 * QD));
  EXPECT_TRUE(std::equal(last_out.begin() + QD, last_out.end(), expected.begin() + 19 * QD));
}

TEST(CpuPagedAttention, RefusesIndicesOutsideTheCache) {
  const int64_t KD = kKvHeads * kHeadDim, QD = kHeads * kHeadDim, rows = 8;
  std::vector<float> cache(rows * KD), values(rows * KD), k(KD), q(QD), out(QD);
  CpuPagedAttention paged;
  std::vector<int32_t> slot = {8};
  EXPECT_THROW(
      paged.store(f32(cache, {rows, KD}), f32(values, {rows, KD}), f32(k, {1, KD}), f32(k, {1, KD}), i32(slot, {1})),
      std::invalid_argument);
  std::vector<int32_t> cu = {0, 1}, context = {5}, tables = {0, 2};  // block 2 is rows 8..11: outside
  EXPECT_THROW(
      paged.attend(f32(out, {1, QD}), f32(q, {1, QD}), f32(cache, {rows, KD}), f32(values, {rows, KD}),
                   {i32(slot, {1}), i32(cu, {2}), i32(context, {1}), i32(tables, {1, 2}), kBlock}, kHeads, kKvHeads),
      std::invalid_argument);
  context = {9};  // more than the table's 2 blocks hold
  EXPECT_THROW(
      paged.attend(f32(out, {1, QD}), f32(q, {1, QD}), f32(cache, {rows, KD}), f32(values, {rows, KD}),
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
      EXPECT_EQ(cache.keys(l).shape, (std::vector<int64_t>{geometry.token_capacity() + 16, 12}));
      EXPECT_EQ(static_cast<char*>(cache.values(l).data) - static_cast<char*>(cache.keys(l).data),
                static_cast<ptrdiff_t>(cache.keys(l).nbytes()));
    }
    EXPECT_EQ(static_cast<char*>(cache.values(1).data) + cache.values(1).nbytes(),
              static_cast<char*>(pool->allocations()[0]->ptr) + bytes);
    EXPECT_EQ(cache.blocks().free_count(), geometry.blocks);
  }
  EXPECT_TRUE(pool->allocations().empty());
}

}  // namespace
}  // namespace tandem
