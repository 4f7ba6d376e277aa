#include "rollout/engine_backend.h"

#include <stdexcept>

#include "model/cpu_ops.h"
#include "rollout/cpu_paged_attention.h"
#include "rollout/cpu_row_sampler.h"

namespace tandem {

#ifdef TANDEM_HAVE_CUDA
std::unique_ptr<EngineBackend> make_cuda_engine_backend(MemoryPool& pool, const ModelConfig& config,
                                                        const StepCapacity& capacity, const std::string& name);
#endif

namespace {

class CpuEngineBackend final : public EngineBackend {
 public:
  Ops& ops() override { return ops_; }
  PagedAttention& attention() override { return attention_; }
  RowSampler& sampler() override { return sampler_; }
  bool replays_graphs() const override { return false; }
  void run(std::optional<int64_t>, const std::function<void()>& work) override { work(); }
  int64_t graphs_captured() const override { return 0; }
  double graph_setup_seconds() const override { return 0; }

 private:
  CpuOps ops_;
  CpuPagedAttention attention_;
  CpuRowSampler sampler_;
};

}  // namespace

std::unique_ptr<EngineBackend> make_engine_backend(MemoryPool& pool, const ModelConfig& config,
                                                   const StepCapacity& capacity, const std::string& name) {
  if (pool.device() == Device::CPU) return std::make_unique<CpuEngineBackend>();
#ifdef TANDEM_HAVE_CUDA
  return make_cuda_engine_backend(pool, config, capacity, name);
#else
  (void)config, (void)capacity;
  throw std::invalid_argument(name + ": this build has no CUDA backend (configure with -DTANDEM_CUDA=ON)");
#endif
}

}  // namespace tandem
