// The paged KV cache of one engine instance: ONE allocation from the memory pool under
// tags::kv_cache, cut into fixed-size blocks of `block_size` token rows. Per layer there is
// a key and a value region of [blocks * block_size, kv_heads * head_dim]; token row r of a
// block b is row b * block_size + r of each region. Keys are stored after q/k-norm and RoPE.
// An F8_E4M3 cache also has, per layer, a key and a value scale region [rows, kv_heads] of
// F32 (rollout/paged_attention.h says how codes and scales make the elements).
// One block more than the geometry's is laid out and never handed out: the padding rows
// of a step padded to a captured graph's batch size write their keys there.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "rollout/block_allocator.h"
#include "rollout/paged_attention.h"
#include "tensor/memory_pool.h"
#include "tensor/tensor.h"

namespace tandem {

struct KvCacheGeometry {
  int layers = 0;
  int kv_heads = 0;
  int64_t kv_dim = 0;  // kv_heads * head_dim
  int block_size = 16;
  int32_t blocks = 0;
  DType dtype = DType::F32;  // the working dtype's, or F8_E4M3 with scales

  bool scaled() const { return dtype == DType::F8_E4M3; }
  int64_t token_capacity() const { return static_cast<int64_t>(blocks) * block_size; }
  size_t block_bytes() const;  // every layer's keys and values (and scales) for one block
  size_t bytes() const { return block_bytes() * static_cast<size_t>(blocks); }

  static KvCacheGeometry for_blocks(const ModelConfig& config, int32_t blocks, int block_size, DType dtype);
  // As many blocks as `bytes` holds. Throws std::invalid_argument naming the bytes when
  // they do not hold a single block.
  static KvCacheGeometry for_bytes(const ModelConfig& config, size_t bytes, int block_size, DType dtype);
};

class KvCache {
 public:
  KvCache(MemoryPool& pool, const KvCacheGeometry& geometry, const std::string& name);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheGeometry& geometry() const { return geometry_; }
  const CacheLayer& layer(int layer) const { return layers_.at(layer); }
  int32_t padding_block() const { return geometry_.blocks; }
  BlockAllocator& blocks() { return blocks_; }
  const BlockAllocator& blocks() const { return blocks_; }

 private:
  MemoryPool& pool_;
  KvCacheGeometry geometry_;
  Allocation* allocation_;
  std::vector<CacheLayer> layers_;
  BlockAllocator blocks_;
};

}  // namespace tandem
