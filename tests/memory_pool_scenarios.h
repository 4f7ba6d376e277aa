// Scripted memory pool scenarios shared by the CPU tests (test_memory_pool.cpp) and the
// GPU tests (gpu_memory_pool.cpp): the same sequences, with exact expected bytes, must
// hold on both backends. Sizes are counted in granules so they fit either granularity.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensor/memory_pool.h"

namespace tandem::testing {

// Reads and writes pool memory from the host (plain memcpy on the CPU, cudaMemcpy on a GPU).
struct PoolMemoryAccess {
  std::function<void(void* device, const void* host, size_t bytes)> write;
  std::function<void(void* host, const void* device, size_t bytes)> read;
};

inline std::vector<uint8_t> pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> data(bytes);
  uint32_t state = seed * 2654435761u + 1;
  for (auto& byte : data) byte = static_cast<uint8_t>((state = state * 1664525u + 1013904223u) >> 24);
  return data;
}

inline std::vector<uint8_t> read_back(const PoolMemoryAccess& access, const Allocation& allocation) {
  std::vector<uint8_t> data(allocation.bytes);
  access.read(data.data(), allocation.ptr, allocation.bytes);
  return data;
}

// "device 3/5 host 0/2" in granules: current/peak, so a failure shows the whole state.
inline std::string usage_text(const MemoryStats& stats, const std::string& tag, size_t granule) {
  const auto found = stats.per_tag.find(tag);
  if (found == stats.per_tag.end()) return "absent";
  const TagUsage& usage = found->second;
  return "device " + std::to_string(usage.device_bytes / granule) + "/" + std::to_string(usage.device_peak / granule) +
         " host " + std::to_string(usage.host_bytes / granule) + "/" + std::to_string(usage.host_peak / granule);
}

inline std::string totals_text(const MemoryStats& stats, size_t granule) {
  return "device " + std::to_string(stats.device_bytes / granule) + "/" + std::to_string(stats.device_peak / granule) +
         " host " + std::to_string(stats.host_bytes / granule) + "/" + std::to_string(stats.host_peak / granule);
}

inline void expect_round_trip_at_same_address(Device device, const PoolMemoryAccess& access) {
  auto pool = MemoryPool::create(device, 0, {.pinned_host_cache = false});
  const size_t g = pool->granularity();
  Allocation* weights = pool->allocate(tags::weights, 3 * g + 123, "layer0.qkv");
  Allocation* neighbour = pool->allocate(tags::kv_cache, g, "kv");
  EXPECT_EQ(weights->mapped_bytes, 4 * g);
  EXPECT_EQ(read_back(access, *weights), std::vector<uint8_t>(weights->bytes, 0)) << "fresh memory is not zeroed";
  const auto data = pattern(weights->bytes, 1);
  access.write(weights->ptr, data.data(), data.size());
  void* const address = weights->ptr;

  const TransferReport off = pool->offload(tags::weights);
  EXPECT_EQ(off.tag, "weights");
  EXPECT_EQ(off.allocations, 1u);
  EXPECT_EQ(off.bytes, 3 * g + 123);
  EXPECT_EQ(off.device_bytes, 4 * g);
  EXPECT_EQ(weights->residency, Residency::Offloaded);
  EXPECT_EQ(neighbour->residency, Residency::Resident);
  EXPECT_EQ(pool->offload(tags::weights).allocations, 0u) << "a second offload must be a no-op";

  const TransferReport on = pool->onload(tags::weights);
  EXPECT_EQ(on.allocations, 1u);
  EXPECT_EQ(on.bytes, 3 * g + 123);
  EXPECT_TRUE(on.rebuild.empty());
  EXPECT_EQ(weights->ptr, address);
  EXPECT_EQ(weights->residency, Residency::Resident);
  EXPECT_EQ(read_back(access, *weights), data);
  EXPECT_EQ(pool->stats().host_bytes, 0u) << "the host copy must be freed after onload";
  pool->release(weights);
  pool->release(neighbour);
  EXPECT_TRUE(pool->allocations().empty());
  EXPECT_EQ(pool->stats().device_bytes, 0u);
}

inline void expect_drop_zeroes_and_names_rebuild(Device device, const PoolMemoryAccess& access) {
  auto pool = MemoryPool::create(device);
  const size_t g = pool->granularity();
  Allocation* transposed = pool->allocate(tags::derived, 2 * g, "lm_head.transposed");
  Allocation* quantised = pool->allocate(tags::derived, g + 7, "mlp.fp8");
  Allocation* kept = pool->allocate(tags::weights, g, "embedding");
  for (Allocation* allocation : {transposed, quantised}) {
    const auto data = pattern(allocation->bytes, 2);
    access.write(allocation->ptr, data.data(), data.size());
  }
  const auto weights_data = pattern(g, 3);
  access.write(kept->ptr, weights_data.data(), weights_data.size());
  void* const address = transposed->ptr;

  const TransferReport dropped = pool->drop(tags::derived);
  EXPECT_EQ(dropped.allocations, 2u);
  EXPECT_EQ(dropped.bytes, 0u) << "drop copies nothing";
  EXPECT_EQ(dropped.device_bytes, 4 * g);
  EXPECT_EQ(pool->stats().host_bytes, 0u);
  EXPECT_EQ(pool->stats().device_bytes, g);

  const TransferReport back = pool->onload(tags::derived);
  EXPECT_EQ(back.rebuild, (std::vector<std::string>{"lm_head.transposed", "mlp.fp8"}));
  EXPECT_EQ(back.bytes, 0u);
  EXPECT_EQ(back.device_bytes, 4 * g);
  EXPECT_EQ(transposed->ptr, address);
  EXPECT_EQ(read_back(access, *transposed), std::vector<uint8_t>(transposed->bytes, 0));
  EXPECT_EQ(read_back(access, *quantised), std::vector<uint8_t>(quantised->bytes, 0));
  EXPECT_EQ(read_back(access, *kept), weights_data) << "another tag was disturbed";

  // Dropping an offloaded allocation gives up its host copy too.
  pool->offload(tags::weights);
  EXPECT_EQ(pool->stats().per_tag.at("weights").host_bytes, g);
  EXPECT_EQ(pool->drop(tags::weights).allocations, 1u);
  EXPECT_EQ(kept->residency, Residency::Dropped);
  EXPECT_EQ(pool->stats().per_tag.at("weights").host_bytes, 0u);
  EXPECT_EQ(pool->onload(tags::weights).rebuild, (std::vector<std::string>{"embedding"}));
  EXPECT_EQ(read_back(access, *kept), std::vector<uint8_t>(g, 0));
}

// weights + kv resident -> offload kv -> optimizer and grads arrive -> offload optimizer
// -> drop grads -> onload kv -> reset peaks -> offload weights -> onload grads, optimizer.
inline void expect_scripted_accounting(Device device) {
  auto pool = MemoryPool::create(device, 0, {.pinned_host_cache = false});
  const size_t g = pool->granularity();
  const auto state = [&](const std::string& tag) { return usage_text(pool->stats(), tag, g); };
  const auto totals = [&] { return totals_text(pool->stats(), g); };

  pool->allocate(tags::weights, 3 * g, "weights");
  pool->allocate(tags::kv_cache, 5 * g - 100, "kv");
  EXPECT_EQ(state("weights"), "device 3/3 host 0/0");
  EXPECT_EQ(state("kv_cache"), "device 5/5 host 0/0");
  EXPECT_EQ(totals(), "device 8/8 host 0/0");

  EXPECT_EQ(pool->offload(tags::kv_cache).bytes, 5 * g - 100);
  EXPECT_EQ(state("kv_cache"), "device 0/5 host 5/5");
  EXPECT_EQ(totals(), "device 3/8 host 5/5");

  pool->allocate(tags::optimizer, 5 * g + 1, "adam");
  pool->allocate(tags::grads, 2 * g, "grads");
  EXPECT_EQ(totals(), "device 11/11 host 5/5");

  pool->offload(tags::optimizer);
  EXPECT_EQ(state("optimizer"), "device 0/6 host 6/6");
  EXPECT_EQ(totals(), "device 5/11 host 11/11");

  const TransferReport dropped = pool->drop(tags::grads);
  EXPECT_EQ(dropped.device_bytes, 2 * g);
  EXPECT_EQ(state("grads"), "device 0/2 host 0/0");
  EXPECT_EQ(totals(), "device 3/11 host 11/11");

  EXPECT_EQ(pool->onload(tags::kv_cache).bytes, 5 * g - 100);
  EXPECT_EQ(state("kv_cache"), "device 5/5 host 0/5");
  EXPECT_EQ(totals(), "device 8/11 host 6/11");

  pool->reset_peaks();
  EXPECT_EQ(state("kv_cache"), "device 5/5 host 0/0");
  EXPECT_EQ(state("grads"), "device 0/0 host 0/0");
  EXPECT_EQ(totals(), "device 8/8 host 6/6");

  pool->offload(tags::weights);
  EXPECT_EQ(totals(), "device 5/8 host 9/9");
  EXPECT_EQ(pool->onload(tags::grads).rebuild, (std::vector<std::string>{"grads"}));
  pool->onload(tags::optimizer);
  EXPECT_EQ(state("weights"), "device 0/3 host 3/3");
  EXPECT_EQ(state("kv_cache"), "device 5/5 host 0/0");
  EXPECT_EQ(state("optimizer"), "device 6/6 host 0/6");
  EXPECT_EQ(state("grads"), "device 2/2 host 0/0");
  EXPECT_EQ(totals(), "device 13/13 host 3/9");
  EXPECT_EQ(pool->stats().per_tag.size(), 4u) << "only the tags used, and no pinned cache when it is off";
  EXPECT_EQ(state(kPinnedCacheName), "absent");
}

// With the pinned host cache, onload keeps host buffers under "pinned_cache" and the next
// offload of a fitting size reuses them, so host bytes do not grow cycle after cycle.
inline void expect_pinned_cache_accounting(Device device) {
  auto pool = MemoryPool::create(device);
  const size_t g = pool->granularity();
  const auto state = [&](const std::string& tag) { return usage_text(pool->stats(), tag, g); };
  const auto totals = [&] { return totals_text(pool->stats(), g); };
  pool->allocate(tags::kv_cache, 4 * g, "kv");
  pool->allocate(tags::weights, 2 * g, "weights");

  pool->offload(tags::kv_cache);
  EXPECT_EQ(state(kPinnedCacheName), "absent");
  pool->onload(tags::kv_cache);
  EXPECT_EQ(state(kPinnedCacheName), "device 0/0 host 4/4");
  EXPECT_EQ(totals(), "device 6/6 host 4/4");
  for (int cycle = 0; cycle < 3; ++cycle) {
    pool->offload(tags::kv_cache);
    EXPECT_EQ(state("kv_cache"), "device 0/4 host 4/4");
    EXPECT_EQ(state(kPinnedCacheName), "device 0/0 host 0/4");
    pool->onload(tags::kv_cache);
  }
  EXPECT_EQ(totals(), "device 6/6 host 4/4") << "the cached buffer was not reused";

  // Any cached buffer large enough serves a smaller offload: the host does not grow.
  pool->offload(tags::weights);
  EXPECT_EQ(state("weights"), "device 0/2 host 4/4");
  EXPECT_EQ(state(kPinnedCacheName), "device 0/0 host 0/4");
  EXPECT_EQ(totals(), "device 4/6 host 4/4");
  EXPECT_EQ(pool->trim_host_cache(), 0u);
  pool->onload(tags::weights);
  EXPECT_EQ(state(kPinnedCacheName), "device 0/0 host 4/4");

  // Too small a cached buffer is not used; of two that fit, the smaller one is.
  auto* big = pool->allocate(tags::activations, 9 * g, "big");
  pool->offload(tags::activations);
  EXPECT_EQ(totals(), "device 6/15 host 13/13");
  pool->onload(tags::activations);
  pool->release(big);
  pool->allocate(tags::optimizer, 8 * g, "adam");
  pool->offload(tags::optimizer);
  EXPECT_EQ(state("optimizer"), "device 0/8 host 9/9");
  EXPECT_EQ(state(kPinnedCacheName), "device 0/0 host 4/13");
  EXPECT_EQ(pool->trim_host_cache(), 4 * g);
}

// fill_host_cache allocates host buffers ahead of the offloads, on the pool's thread: an
// offload takes its best fit from them (waiting for it when it is still being allocated)
// and allocates nothing itself; one that nothing fits allocates its own, and counts it.
inline void expect_filled_host_cache_serves_offloads(Device device) {
  auto pool = MemoryPool::create(device);
  const size_t g = pool->granularity();
  const auto state = [&](const std::string& tag) { return usage_text(pool->stats(), tag, g); };
  pool->allocate(tags::kv_cache, 4 * g, "kv");
  pool->allocate(tags::weights, 2 * g, "weights");
  pool->allocate(tags::optimizer, 3 * g, "adam");

  // The 3-granule buffer comes after a larger one that would fit: the offload waits for it.
  pool->fill_host_cache({8 * g, 3 * g});
  pool->fill_host_cache({4 * g});  // queued behind the first
  pool->offload(tags::optimizer);
  EXPECT_EQ(state("optimizer"), "device 0/3 host 3/3") << "not the best fit of the buffers filled in";
  pool->offload(tags::kv_cache);
  EXPECT_EQ(state("kv_cache"), "device 0/4 host 4/4");
  EXPECT_EQ(pool->stats().offload_host_allocations, 0u);
  // The 8-granule buffer serves the weights; nothing is left for a second offload of them.
  pool->offload(tags::weights);
  EXPECT_EQ(state("weights"), "device 0/2 host 8/8");
  EXPECT_EQ(pool->stats().offload_host_allocations, 0u);
  EXPECT_EQ(totals_text(pool->stats(), g), "device 0/9 host 15/15");
  pool->onload(tags::weights);
  pool->allocate(tags::activations, 9 * g, "activations");
  pool->offload(tags::activations);
  EXPECT_EQ(pool->stats().offload_host_allocations, 1u) << "the cache held nothing of 9 granules";

  // A buffer the host cannot give: the next offload says so (trim waits for the filler).
  pool->fill_host_cache({size_t{1} << 52});
  pool->trim_host_cache();
  try {
    pool->offload(tags::weights);
    ADD_FAILURE() << "the failed fill went unnoticed";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("filling the pinned host cache"), std::string::npos) << error.what();
  }

  auto without_cache = MemoryPool::create(device, 0, {.pinned_host_cache = false});
  EXPECT_THROW(without_cache->fill_host_cache({g}), std::invalid_argument);
}

// Deferred tags start Dropped (no pages, no bytes) and come in with their first onload;
// peak windows keep their own peaks whatever reset_peaks() and other windows do.
inline void expect_deferred_tags_and_peak_windows(Device device) {
  auto pool = MemoryPool::create(device, 0, {.pinned_host_cache = false});
  const size_t g = pool->granularity();
  const auto totals = [&] { return totals_text(pool->stats(), g); };
  pool->set_deferred(tags::kv_cache, true);
  Allocation* kv = pool->allocate(tags::kv_cache, 3 * g, "kv");
  pool->set_deferred(tags::kv_cache, false);
  Allocation* weights = pool->allocate(tags::weights, 2 * g, "weights");
  EXPECT_EQ(kv->residency, Residency::Dropped);
  EXPECT_EQ(weights->residency, Residency::Resident);
  EXPECT_EQ(totals(), "device 2/2 host 0/0");
  EXPECT_EQ(usage_text(pool->stats(), "kv_cache", g), "device 0/0 host 0/0");

  const int whole = pool->open_peak_window();
  const int first = pool->open_peak_window();
  EXPECT_EQ(pool->onload(tags::kv_cache).rebuild, (std::vector<std::string>{"kv"}));
  EXPECT_EQ(kv->residency, Residency::Resident);
  pool->offload(tags::weights);  // device 3, host 2
  const PeakBytes first_peaks = pool->close_peak_window(first);
  EXPECT_EQ(first_peaks.device, 5 * g);
  EXPECT_EQ(first_peaks.host, 2 * g);
  pool->reset_peaks();
  const int second = pool->open_peak_window();
  pool->drop(tags::kv_cache);
  pool->onload(tags::weights);
  EXPECT_EQ(pool->close_peak_window(second).device, 3 * g) << "a window starts at the current bytes";
  EXPECT_EQ(pool->close_peak_window(whole).device, 5 * g) << "reset_peaks and other windows must not touch a window";
  EXPECT_THROW(pool->peak_window(whole), std::invalid_argument);
  pool->release(kv);
  pool->release(weights);
}

inline void expect_errors_name_tag_allocation_and_bytes(Device device) {
  const size_t g = MemoryPool::create(device)->granularity();
  auto pool = MemoryPool::create(device, 0, {.device_capacity = 8 * g});
  Allocation* kv = pool->allocate(tags::kv_cache, 6 * g, "kv");
  const auto message_of = [](const std::function<void()>& action) {
    try {
      action();
    } catch (const std::exception& error) {
      return std::string(error.what());
    }
    return std::string("no exception");
  };
  const auto contains = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };

  const std::string too_big = message_of([&] { pool->allocate(tags::weights, 3 * g, "layer7.mlp"); });
  EXPECT_TRUE(contains(too_big, "out of device memory")) << too_big;
  EXPECT_TRUE(contains(too_big, "'layer7.mlp'")) << too_big;
  EXPECT_TRUE(contains(too_big, "tag weights")) << too_big;
  EXPECT_TRUE(contains(too_big, std::to_string(3 * g) + " bytes")) << too_big;
  EXPECT_TRUE(contains(too_big, "kv_cache")) << "the message should say what holds the memory: " << too_big;
  EXPECT_EQ(pool->stats().device_bytes, 6 * g) << "a refused allocation must leave no trace";
  EXPECT_EQ(pool->allocations().size(), 1u);

  pool->offload(tags::kv_cache);
  Allocation* weights = pool->allocate(tags::weights, 3 * g, "layer7.mlp");
  const std::string onload = message_of([&] { pool->onload(tags::kv_cache); });
  EXPECT_TRUE(contains(onload, "onload 'kv' (tag kv_cache")) << onload;
  EXPECT_EQ(kv->residency, Residency::Offloaded) << "a refused onload must keep the host copy";
  pool->release(weights);
  EXPECT_EQ(pool->onload(tags::kv_cache).allocations, 1u);

  Allocation stranger;
  EXPECT_THROW(pool->release(&stranger), std::invalid_argument);
  pool->release(kv);
  const std::string twice = message_of([&] { pool->release(kv); });
  EXPECT_TRUE(contains(twice, "unknown allocation")) << twice;
  EXPECT_THROW(pool->allocate(tags::weights, 0, "empty"), std::invalid_argument);
  EXPECT_THROW(pool->allocate(tag_named(kPinnedCacheName), g, "sneaky"), std::invalid_argument);

  const TransferReport nothing = pool->onload(tags::optimizer);
  EXPECT_EQ(nothing.allocations, 0u);
  EXPECT_EQ(nothing.bytes, 0u);
  EXPECT_EQ(nothing.tag, "optimizer");
}

inline void expect_extensible_tags(Device device, const PoolMemoryAccess& access) {
  auto pool = MemoryPool::create(device);
  const Tag mine = tag_named("my_tag");
  EXPECT_EQ(tag_named("my_tag"), mine);
  EXPECT_GE(mine.id, tags::kBuiltinCount);
  Allocation* allocation = pool->allocate(mine, 1000, "scratch");
  const auto data = pattern(1000, 9);
  access.write(allocation->ptr, data.data(), data.size());
  EXPECT_EQ(pool->offload(mine).tag, "my_tag");
  EXPECT_EQ(pool->stats().per_tag.at("my_tag").host_bytes, pool->granularity());
  pool->onload(mine);
  EXPECT_EQ(read_back(access, *allocation), data);
  EXPECT_EQ(pool->stats().per_tag.at("my_tag").device_peak, pool->granularity());
}

}  // namespace tandem::testing
