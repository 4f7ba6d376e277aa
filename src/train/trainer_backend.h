// What the policy trainer runs on a device besides the decoder's ops: the log-probs (and
// entropy) of the sampled tokens from the logits, the gradient's squared norm and
// scaling, AdamW and Muon, and the copies back to the host the loss needs. The trainer is written
// once over this interface; trainer_backend_cpu.cpp (the FP32 reference: CpuOps, the
// chunked log-probs) and trainer_backend_cuda.cpp (CudaOps and kernels/, all on one
// stream) implement it. Private to src/train.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "model/ops.h"
#include "tensor/tensor.h"
#include "train/adamw.h"
#include "train/chunked_logprobs.h"
#include "train/muon.h"

namespace tandem {

// One copy of a streamed chunk: `count` FP32 values between host memory (`store`: the
// pinned host state, or the mapped state file) and the staging slot.
struct StateTransfer {
  float* store = nullptr;
  size_t staging_offset = 0;  // elements
  size_t count = 0;
};

class TrainerBackend {
 public:
  virtual ~TrainerBackend() = default;

  // The decoder's ops on the same device (and, on CUDA, the same stream).
  virtual Ops& ops() = 0;
  // src -> host memory, complete when the call returns (after the work queued before it).
  virtual void copy_to_host(void* dst, const Tensor& src) = 0;
  // Waits for the queued work: before a collective on another stream reads its results,
  // and before the memory is handed back to the caller.
  virtual void synchronize() = 0;

  // logits [T, V] (the model's output); targets I32 [T], < 0 for rows without one;
  // logp, lse F32 [T]; entropy F32 [T] or empty (not computed). lse is scratch the
  // backward may reuse (the CPU path recomputes it chunk by chunk instead).
  virtual void token_logprobs_forward(const Tensor& logp, const Tensor& entropy, const Tensor& lse,
                                      const Tensor& logits, const Tensor& targets,
                                      const LogprobSettings& settings) = 0;
  // Writes d(loss)/d(logits) over the logits. dentropy empty: no entropy term; otherwise
  // entropy holds the forward's output.
  virtual void token_logprobs_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                       const Tensor& entropy, const Tensor& dlogp, const Tensor& dentropy,
                                       const LogprobSettings& settings) = 0;

  // The sum of squares of an F32 tensor, accumulated in double, the same on every run.
  virtual double square_sum(const Tensor& values) = 0;
  // values *= factor (F32).
  virtual void scale(const Tensor& values, float factor) = 0;
  // adamw_step_cpu's update of `count` parameters in this backend's memory; `working`
  // (BF16 bits, may be null) receives the updated parameters rounded.
  virtual void adamw_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, size_t count,
                          const AdamWStepScalars& scalars, uint16_t* working) = 0;
  // The same over runs of one slab (all five buffers indexed by the runs' offsets), the
  // decayed runs with `decayed`, the others with `undecayed`.
  virtual void adamw_step_runs(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                               std::span<const AdamWRun> runs, const AdamWStepScalars& decayed,
                               const AdamWStepScalars& undecayed, uint16_t* working) = 0;
  // Muon on the matrices of a group, in the two halves of kernels/muon.cuh. muon_momentum:
  // matrices [first, last), their momentum at momentum + momentum_offsets[j - first]
  // (empty: at the group's slab offsets). muon_orthogonalize, after every matrix's
  // momentum: the update of params and working (BF16 bits, may be null). grads and
  // params are slab bases the group's offsets index; scratch: at least
  // MuonWorkspace::for_group(group).bytes of this backend's memory, kept by the caller
  // from the first half to the second (the CPU twin keeps its own).
  virtual void muon_momentum(const MuonGroup& group, size_t first, size_t last, const float* grads, float* momentum,
                             std::span<const int64_t> momentum_offsets, float beta, void* scratch) = 0;
  virtual void muon_orthogonalize(const MuonGroup& group, float* params, uint16_t* working,
                                  const MuonStepScalars& scalars, void* scratch) = 0;

  // The optimizer state streamed through two staging slots in this backend's memory
  // (optimizer.state = host | disk). load_state queues the copies store -> slot once the
  // slot's previous write-back is done, and the work queued after it waits for them;
  // write_back_state queues slot -> store after the work queued so far. On CUDA the two
  // directions run on their own streams, so chunk i+1 loads and chunk i-1 writes back
  // while chunk i is updated; a store the device cannot read directly (the mapped file)
  // goes through pinned bounce buffers, one per slot. finish_state waits until every
  // write-back has reached the store.
  virtual void load_state(int slot, float* staging, std::span<const StateTransfer> copies) = 0;
  virtual void write_back_state(int slot, const float* staging, std::span<const StateTransfer> copies) = 0;
  virtual void finish_state() = 0;
};

std::unique_ptr<TrainerBackend> make_cpu_trainer_backend();
#ifdef TANDEM_HAVE_CUDA
std::unique_ptr<TrainerBackend> make_cuda_trainer_backend();
#endif

}  // namespace tandem
