// The CUDA engine backend: CudaOps, CudaPagedAttention and CudaRowSampler on one stream
// of the instance's own, and one graph per decode batch size.
#include <cuda_runtime.h>

#include <chrono>
#include <map>
#include <stdexcept>

#include "model/cuda_ops.h"
#include "rollout/cuda_paged_attention.h"
#include "rollout/cuda_row_sampler.h"
#include "rollout/engine_backend.h"

namespace tandem {

namespace {

void check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(status));
}

class CudaEngineBackend final : public EngineBackend {
 public:
  CudaEngineBackend(MemoryPool& pool, const ModelConfig& config, const StepCapacity& capacity, const std::string& name)
      : name_(name),
        attention_(ops_.stream(), pool, config, capacity.max_tokens, capacity.max_sequences, name + ".attention"),
        sampler_(ops_.stream(), capacity.max_sequences, config.vocab) {}

  ~CudaEngineBackend() override {
    for (auto& [key, graph] : graphs_) cudaGraphExecDestroy(graph);
  }

  Ops& ops() override { return ops_; }
  PagedAttention& attention() override { return attention_; }
  RowSampler& sampler() override { return sampler_; }
  bool replays_graphs() const override { return true; }
  int64_t graphs_captured() const override { return static_cast<int64_t>(graphs_.size()); }
  double graph_setup_seconds() const override { return graph_setup_seconds_; }

  void run(std::optional<int64_t> graph_key, const std::function<void()>& work) override {
    if (!graph_key) return work();
    if (auto found = graphs_.find(*graph_key); found != graphs_.end()) {
      check(cudaGraphLaunch(found->second, ops_.stream()), name_ + ": graph launch");
      return;
    }
    // The first step of a size runs eagerly (lazy set-up such as GEMM plans happens here,
    // outside any capture) and is then captured without running for the next ones.
    const auto start = std::chrono::steady_clock::now();
    work();
    cudaStream_t stream = ops_.stream();
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), name_ + ": begin capture");
    cudaGraph_t graph = nullptr;
    try {
      work();
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    check(cudaStreamEndCapture(stream, &graph), name_ + ": end capture of decode step for " +
                                                    std::to_string(*graph_key) + " sequences");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check(status, name_ + ": graph instantiation");
    graphs_.emplace(*graph_key, exec);
    graph_setup_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  std::string name_;
  CudaOps ops_;
  CudaPagedAttention attention_;
  CudaRowSampler sampler_;
  std::map<int64_t, cudaGraphExec_t> graphs_;
  double graph_setup_seconds_ = 0;
};

}  // namespace

std::unique_ptr<EngineBackend> make_cuda_engine_backend(MemoryPool& pool, const ModelConfig& config,
                                                        const StepCapacity& capacity, const std::string& name) {
  return std::make_unique<CudaEngineBackend>(pool, config, capacity, name);
}

}  // namespace tandem
