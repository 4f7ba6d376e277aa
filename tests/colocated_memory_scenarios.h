// The colocated rank's memory through whole steps, with the pinned host cache on (as a
// job runs) and a model big enough that the copies dominate (~11 M parameters, so the
// host and device figures are the slabs'): every peak mode x rollout level with the copy
// transport, and both modes with alias (whose weights never move). Checks what each mode
// promises, at every handoff point and at start-up: where the peaks land, that the
// engine reads the trainer's weights after every sync, and that the alias transport
// moves nothing. Shared by the CPU test (test_colocated_memory.cpp) and the GPU test
// (gpu_colocated_memory.cpp); the working copy is FP32 on both, so weights compare exactly.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "driver/colocated_memory.h"
#include "driver/handoff_plan.h"
#include "driver/memory_plan.h"
#include "driver/phase_memory.h"
#include "tensor/device_copy.h"

namespace tandem::testing {

// One Qwen3-0.6B layer with a 2048-token vocabulary: 11.5 M parameters, 46 MB a FP32 slab.
inline ModelConfig eleven_million_parameters() {
  ModelConfig config = ModelConfig::qwen3_0_6b(1);
  config.vocab = 2048;
  config.intermediate = 1024;
  return config;
}

struct Case {
  PeakDevice mode;
  bool level_kv, level_weight;
  TransportKind transport;
};

inline std::string describe(const Case& c) {
  return std::string(c.mode == PeakDevice::Cpu ? "cpu" : "gpu") + " peak, level" + (c.level_kv ? " kv_cache" : "") +
         (c.level_weight ? " weight" : "") + ", " + transport_kind_name(c.transport);
}

// Start-up, then steps of rollout / after-generate / train / before-sync, as run_job does.
struct ColocatedRun {
  const ModelConfig config = eleven_million_parameters();
  const ParameterLayout layout{config};
  std::unique_ptr<MemoryPool> pool;
  HandoffConfig handoff;
  std::unique_ptr<ColocatedMemory> memory;
  Allocation *kv = nullptr, *activations = nullptr, *reference = nullptr;
  std::unique_ptr<HandoffExecutor> executor;
  std::vector<SyncReport> syncs;
  std::vector<float> weights;  // what the trainer's master weights hold
  PhasePeak startup;
  std::unique_ptr<MemoryPlan> plan;  // made once every buffer is laid out, as run_job does
  std::vector<HandoffReport> handoffs;  // every point after start-up
  bool moments_started_zero = false;    // the AdamW moments the first train phase finds

  ColocatedRun(const Case& c, Device device) : pool(MemoryPool::create(device)) {
    handoff.peak_device = c.mode;
    handoff.level_kv_cache = c.level_kv;
    handoff.level_weight = c.level_weight;
    handoff.weights_shared = c.transport == TransportKind::Alias;
    PhaseMemory startup_memory(*pool);
    startup_memory.begin();
    const std::vector<Tag> deferred = deferred_at_startup(handoff, /*fresh_start=*/true);
    for (Tag tag : deferred) pool->set_deferred(tag, true);
    memory = std::make_unique<ColocatedMemory>(
        *pool, layout, ColocatedMemorySettings{.working_dtype = DType::F32, .transport = c.transport});
    kv = pool->allocate(tags::kv_cache, 48 << 20, "engine.kv_cache");
    activations = pool->allocate(tags::activations, 32 << 20, "trainer.activations");
    reference = pool->allocate(tags::reference, layout.slab_bytes(DType::F32), "trainer.reference_weights");
    for (Tag tag : deferred) pool->set_deferred(tag, false);
    // As run_job does: plan, fill the cache beside the staged weights, the rest after.
    MemoryBaseline baseline;
    baseline.startup_staging = layout.slab_bytes(DType::F32);
    plan = std::make_unique<MemoryPlan>(pool->allocations(), handoff, device, true, baseline);
    pool->fill_host_cache(plan->host_cache_fill().beside_staging);
    weights.resize(static_cast<size_t>(layout.slab_elements()));
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<float>(i % 977) * 1e-3f;
    memory->load_weights(weights);
    copy_host_to_tensor(slab(reference), weights.data());
    pool->fill_host_cache(plan->host_cache_fill().after_staging);
    executor = std::make_unique<HandoffExecutor>(
        *pool, handoff, [this] { return syncs.emplace_back(memory->sync_weights()); },
        [this](const std::vector<std::string>& names) { memory->rebuild(names); });
    executor->run(HandoffPoint::Startup);
    executor->run(HandoffPoint::BeforeSync);
    startup = startup_memory.end();
  }

  ~ColocatedRun() {
    for (Allocation* allocation : {kv, activations, reference}) pool->release(allocation);
  }

  // The trainer's update as the optimizer writes it: master weights and the working copy.
  void train(float delta) {
    for (size_t i = 0; i < weights.size(); i += 4099) weights[i] += delta;
    copy_host_to_tensor(memory->master(), weights.data());
    copy_host_to_tensor(memory->working(), weights.data());
  }

  void step(float delta) {
    handoffs.push_back(executor->run(HandoffPoint::AfterGenerate));
    if (handoffs.size() == 1) moments_started_zero = all_zero(memory->exp_avg()) && all_zero(memory->exp_avg_sq());
    train(delta);
    handoffs.push_back(executor->run(HandoffPoint::BeforeSync));
  }

  bool all_zero(const Tensor& tensor) const {
    std::vector<float> host(static_cast<size_t>(tensor.numel()));
    copy_tensor_to_host(host.data(), tensor);
    return std::all_of(host.begin(), host.end(), [](float value) { return value == 0.0f; });
  }
  Tensor slab(const Allocation* allocation) const {
    return Tensor::view(allocation->ptr, DType::F32, pool->device(), {layout.slab_elements()});
  }
  std::vector<float> engine_weights() const {
    std::vector<float> host(weights.size());
    copy_tensor_to_host(host.data(), memory->engine_weights());
    return host;
  }

  // One FP32 slab as the pool maps it.
  size_t slab() const {
    const size_t g = pool->granularity();
    return (layout.slab_bytes(DType::F32) + g - 1) / g * g;
  }
};

inline std::vector<Case> every_case() {
  std::vector<Case> cases;
  for (PeakDevice mode : {PeakDevice::Cpu, PeakDevice::Gpu})
  {
    for (int level = 1; level < 4; ++level) cases.push_back({mode, (level & 1) != 0, (level & 2) != 0, TransportKind::Copy});
    cases.push_back({mode, true, true, TransportKind::Alias});
  }
  return cases;
}

inline void expect_every_mode_level_and_transport_keeps_its_promise(Device device) {
  for (const Case& c : every_case()) {
    SCOPED_TRACE(describe(c));
    ColocatedRun run(c, device);
    for (int s = 0; s < 2; ++s) run.step(0.5f + static_cast<float>(s));
    const size_t P = run.slab();
    // The trainer's offloaded state: master weights, two AdamW moments, the KL reference.
    const size_t trainer_state = 4 * P;
    const bool engine_copy_moves = c.transport == TransportKind::Copy && c.level_weight;

    size_t host_peak = run.startup.host_pool, device_peak_after_generate = 0;
    for (const HandoffReport& report : run.handoffs) {
      host_peak = std::max(host_peak, report.peak.host_pool);
      if (report.point == HandoffPoint::AfterGenerate)
        device_peak_after_generate = std::max(device_peak_after_generate, report.peak.device_pool);
    }
    if (c.mode == PeakDevice::Gpu || !engine_copy_moves) {
      // gpu mode: one side on the host at a time, the engine's copy in the trainer's buffers.
      EXPECT_EQ(host_peak, trainer_state);
    } else {
      EXPECT_EQ(host_peak, trainer_state + P) << "cpu mode holds the trainer's state and the engine's copy at once";
    }
    // Start-up filled in every host buffer: no handoff allocated one, start-up's included,
    // and start-up held no more beside the staged weights than it holds once they are gone.
    EXPECT_EQ(run.pool->stats().offload_host_allocations, 0u);
    const HostCacheFill& fill = run.plan->host_cache_fill();
    size_t filled = 0, beside = 0;
    for (size_t capacity : fill.beside_staging) filled += capacity, beside += capacity;
    for (size_t capacity : fill.after_staging) filled += capacity;
    EXPECT_EQ(filled, host_peak);
    EXPECT_LE(beside + run.layout.slab_bytes(DType::F32), filled);
    EXPECT_FALSE(fill.after_staging.empty()) << "the staged weights leave one slab's buffer for after";

    // Start-up holds no more than the step does, and in cpu mode never both sides.
    EXPECT_LE(run.startup.device_pool, device_peak_after_generate);
    if (c.mode == PeakDevice::Cpu && engine_copy_moves)
      EXPECT_EQ(run.startup.device_pool, 3 * P + (c.level_kv ? 0 : run.kv->mapped_bytes))
          << "master, working copy, reference: no AdamW moments (zeros, mapped at the first onload), no engine "
             "copy, and no KV cache the plan would drop";
    // A fresh start's moments: the start-up handoff moved none of them, the first onload
    // mapped them zeroed.
    EXPECT_TRUE(run.moments_started_zero);
    const size_t S = run.layout.slab_bytes(DType::F32);
    EXPECT_EQ(run.handoffs[0].bytes_moved, 2 * S + (engine_copy_moves ? S : 0))
        << "after generate: master weights and reference on, the engine's copy off";

    // Every sync leaves the engine reading the trainer's latest weights.
    EXPECT_TRUE(run.engine_weights() == run.weights);
    ASSERT_EQ(run.syncs.size(), 3u);
    for (const SyncReport& sync : run.syncs) {
      if (c.transport == TransportKind::Alias)
        EXPECT_EQ(sync.bytes, 0u);
      else
        EXPECT_EQ(sync.bytes, 2 * run.layout.slab_bytes(DType::F32));
    }
    if (c.transport == TransportKind::Alias) EXPECT_EQ(run.memory->engine_weights().data, run.memory->working().data);

    // The plan predicts the pool's peaks of every phase exactly (the second step's).
    const auto predicted = [&](const std::string& phase) {
      for (const PhasePrediction& p : run.plan->phases())
        if (p.phase == phase) return p.peak;
      ADD_FAILURE() << "no phase " << phase;
      return PhasePeak{};
    };
    const std::pair<std::string, PhasePeak> measured[] = {
        {"startup", run.startup}, {"after_generate", run.handoffs[2].peak}, {"before_sync", run.handoffs[3].peak}};
    for (const auto& [phase, peak] : measured) {
      EXPECT_EQ(predicted(phase).device_pool, peak.device_pool) << phase;
      EXPECT_EQ(predicted(phase).host_pool, peak.host_pool) << phase;
    }

    // Derived copies are dropped, never copied; only the copy transport has one.
    for (const HandoffReport& report : run.handoffs)
      if (report.point == HandoffPoint::BeforeSync)
        EXPECT_EQ(report.derived_not_copied, c.transport == TransportKind::Copy ? P : 0u);
  }
}

}  // namespace tandem::testing
