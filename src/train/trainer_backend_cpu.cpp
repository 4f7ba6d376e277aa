#include <cstring>
#include <span>
#include <vector>

#include "model/cpu_ops.h"
#include "tensor/device_copy.h"
#include "train/gradient_clipping.h"
#include "train/trainer_backend.h"

namespace tandem {

namespace {

template <class T>
std::span<T> values_of(const Tensor& t) {
  return t.data ? std::span<T>(t.ptr<T>(), static_cast<size_t>(t.numel())) : std::span<T>();
}

class CpuTrainerBackend final : public TrainerBackend {
 public:
  Ops& ops() override { return ops_; }
  void copy_to_host(void* dst, const Tensor& src) override { copy_tensor_to_host(dst, src); }
  void synchronize() override {}

  void token_logprobs_forward(const Tensor& logp, const Tensor& entropy, const Tensor& /*lse*/, const Tensor& logits,
                              const Tensor& targets, const LogprobSettings& settings) override {
    workspace_.resize(logprob_workspace_elements(logits.shape[0], logits.shape[1], settings.chunk_tokens));
    chunked_logprobs_forward(logits, values_of<const int32_t>(targets), settings, workspace_, values_of<float>(logp),
                             values_of<float>(entropy));
  }

  void token_logprobs_backward(const Tensor& logits, const Tensor& targets, const Tensor& /*lse*/,
                               const Tensor& /*entropy*/, const Tensor& dlogp, const Tensor& dentropy,
                               const LogprobSettings& settings) override {
    workspace_.resize(logprob_workspace_elements(logits.shape[0], logits.shape[1], settings.chunk_tokens));
    chunked_logprobs_backward(logits, values_of<const int32_t>(targets), settings, workspace_,
                              values_of<const float>(dlogp), values_of<const float>(dentropy), logits);
  }

  double square_sum(const Tensor& values) override {
    const std::span<float> slabs[] = {values_of<float>(values)};
    return gradient_square_sum(slabs);
  }

  void scale(const Tensor& values, float factor) override {
    const std::span<float> slabs[] = {values_of<float>(values)};
    scale_gradients(slabs, factor);
  }

  void adamw_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, size_t count,
                  const AdamWStepScalars& scalars, uint16_t* working) override {
    adamw_step_cpu(params, grads, exp_avg, exp_avg_sq, count, scalars, working);
  }

  void adamw_step_runs(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                       std::span<const AdamWRun> runs, const AdamWStepScalars& decayed,
                       const AdamWStepScalars& undecayed, uint16_t* working) override {
    for (const AdamWRun& run : runs)
      adamw_step_cpu(params + run.offset, grads + run.offset, exp_avg + run.offset, exp_avg_sq + run.offset,
                     static_cast<size_t>(run.count), run.decayed ? decayed : undecayed,
                     working ? working + run.offset : nullptr);
  }

  void muon_momentum(const MuonGroup& group, size_t first, size_t last, const float* grads, float* momentum,
                     std::span<const int64_t> momentum_offsets, float beta, void* /*scratch*/) override {
    const size_t elements = static_cast<size_t>(group.m * group.n);
    muon_updates_.resize(group.matrices.size() * elements);
    for (size_t j = first; j < last; ++j) {
      const MuonMatrix& matrix = group.matrices[j];
      const int64_t at = momentum_offsets.empty() ? matrix.offset : momentum_offsets[j - first];
      muon_momentum_cpu(grads + matrix.offset, momentum + at, matrix.transposed ? group.n : group.m,
                        matrix.transposed ? group.m : group.n, beta, muon_updates_.data() + j * elements);
    }
  }

  void muon_orthogonalize(const MuonGroup& group, float* params, uint16_t* working, const MuonStepScalars& scalars,
                          void* /*scratch*/) override {
    const size_t elements = static_cast<size_t>(group.m * group.n);
    for (size_t j = 0; j < group.matrices.size(); ++j) {
      const MuonMatrix& matrix = group.matrices[j];
      const size_t at = static_cast<size_t>(matrix.offset);
      muon_apply_cpu(params + at, muon_updates_.data() + j * elements, matrix.transposed ? group.n : group.m,
                     matrix.transposed ? group.m : group.n, scalars, working ? working + at : nullptr, muon_scratch_);
    }
  }

  // Memory to memory, complete on return: the same chunks as on CUDA, in the same order.
  void load_state(int /*slot*/, float* staging, std::span<const StateTransfer> copies) override {
    for (const StateTransfer& copy : copies)
      std::memcpy(staging + copy.staging_offset, copy.store, copy.count * sizeof(float));
  }
  void write_back_state(int /*slot*/, const float* staging, std::span<const StateTransfer> copies) override {
    for (const StateTransfer& copy : copies)
      std::memcpy(copy.store, staging + copy.staging_offset, copy.count * sizeof(float));
  }
  void finish_state() override {}

 private:
  CpuOps ops_;
  std::vector<float> workspace_;  // one chunk of upcast logits
  std::vector<float> muon_scratch_;  // one matrix's Newton-Schulz products
  std::vector<float> muon_updates_;  // the group's oriented updates, from muon_momentum to muon_orthogonalize
};

}  // namespace

std::unique_ptr<TrainerBackend> make_cpu_trainer_backend() { return std::make_unique<CpuTrainerBackend>(); }

}  // namespace tandem
