#include "rollout/kv_cache.h"

#include <stdexcept>

namespace tandem {

namespace {

// One row's bytes in a layer's key (or value) region, and in its scale region.
size_t row_bytes(const KvCacheGeometry& g) { return static_cast<size_t>(g.kv_dim) * dtype_size(g.dtype); }
size_t scale_row_bytes(const KvCacheGeometry& g) { return g.scaled() ? g.kv_heads * sizeof(float) : 0; }

}  // namespace

size_t KvCacheGeometry::block_bytes() const {
  return size_t{2} * layers * block_size * (row_bytes(*this) + scale_row_bytes(*this));
}

KvCacheGeometry KvCacheGeometry::for_blocks(const ModelConfig& config, int32_t blocks, int block_size, DType dtype) {
  return {config.layers, config.kv_heads, config.kv_dim(), block_size, blocks, dtype};
}

KvCacheGeometry KvCacheGeometry::for_bytes(const ModelConfig& config, size_t bytes, int block_size, DType dtype) {
  if (block_size < 1)
    throw std::invalid_argument("KV cache: block size must be >= 1, got " + std::to_string(block_size));
  KvCacheGeometry geometry = for_blocks(config, 0, block_size, dtype);
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
  const Device device = pool.device();
  char* at = static_cast<char*>(allocation_->ptr);
  auto take = [&](DType dtype, int64_t width, size_t bytes_per_row) {
    const Tensor region = Tensor::view(at, dtype, device, {rows, width});
    at += rows * bytes_per_row;
    return region;
  };
  for (int l = 0; l < geometry.layers; ++l) {
    CacheLayer layer;
    layer.keys = take(geometry.dtype, geometry.kv_dim, row_bytes(geometry));
    layer.values = take(geometry.dtype, geometry.kv_dim, row_bytes(geometry));
    if (geometry.scaled()) {
      layer.key_scales = take(DType::F32, geometry.kv_heads, scale_row_bytes(geometry));
      layer.value_scales = take(DType::F32, geometry.kv_heads, scale_row_bytes(geometry));
    }
    layers_.push_back(layer);
  }
}

KvCache::~KvCache() { pool_.release(allocation_); }

}  // namespace tandem
