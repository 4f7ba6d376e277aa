#include "rollout/kv_cache.h"

#include <stdexcept>

namespace tandem {

size_t KvCacheGeometry::block_bytes() const {
  return size_t{2} * layers * block_size * static_cast<size_t>(kv_dim) * dtype_size(dtype);
}

KvCacheGeometry KvCacheGeometry::for_bytes(const ModelConfig& config, size_t bytes, int block_size, DType dtype) {
  if (block_size < 1)
    throw std::invalid_argument("KV cache: block size must be >= 1, got " + std::to_string(block_size));
  KvCacheGeometry geometry{config.layers, config.kv_dim(), block_size, 0, dtype};
  const size_t blocks = bytes / geometry.block_bytes();
  if (blocks < 1)
    throw std::invalid_argument("KV cache: " + std::to_string(bytes) + " bytes do not hold one block of " +
                                std::to_string(block_size) + " tokens (" + std::to_string(geometry.block_bytes()) +
                                " bytes for this model)");
  if (blocks > static_cast<size_t>(INT32_MAX)) throw std::invalid_argument("KV cache: more than 2^31 blocks");
  geometry.blocks = static_cast<int32_t>(blocks);
  return geometry;
}

KvCache::KvCache(MemoryPool& pool, const KvCacheGeometry& geometry, const std::string& name)
    : pool_(pool),
      geometry_(geometry),
      allocation_(pool.allocate(tags::kv_cache, geometry.bytes() + geometry.block_bytes(), name)),
      blocks_(geometry.blocks) {
  const int64_t rows = geometry.token_capacity() + geometry.block_size;
  const size_t region = static_cast<size_t>(rows * geometry.kv_dim) * dtype_size(geometry.dtype);
  char* base = static_cast<char*>(allocation_->ptr);
  for (int l = 0; l < geometry.layers; ++l) {
    keys_.push_back(Tensor::view(base + (2 * l) * region, geometry.dtype, pool.device(), {rows, geometry.kv_dim}));
    values_.push_back(
        Tensor::view(base + (2 * l + 1) * region, geometry.dtype, pool.device(), {rows, geometry.kv_dim}));
  }
}

KvCache::~KvCache() { pool_.release(allocation_); }

}  // namespace tandem
