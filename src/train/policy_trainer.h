// One optimisation step of the policy on a packed batch of (prompt, completion)
// sequences: forward in micro-batches of whole sequences, the per-token log-probs (and
// entropy) of the completion tokens, the loss on the host (GRPO's clipped policy loss,
// or supervised cross-entropy for the SFT warm-up), backward with the gradients adding up
// over the micro-batches, gradient all-reduce over ranks, norm clipping and the optimizer
// (AdamW, or Muon for the layers' matrices and AdamW for the rest) on the FP32 master
// weights. Under ZeRO-1 (memory.shard split over the ranks) the gradients are
// reduce-scattered instead, each rank updates its shard of the master weights and state,
// and the working copy is all-gathered.
//
// Each micro-batch's loss gradient is normalised by the whole rank batch's denominators
// (and, for global-token-sum, the step's), so the update is the one of the batch taken
// whole, while the activations only need room for one micro-batch. The loss and its
// metrics are those of the whole batch.
//
// The memory is the rank's (its colocated slabs, on one device), and the backend follows
// it: CpuOps and the chunked log-probs in FP32 on the CPU; CudaOps and the kernels/ on
// CUDA, forward and backward reading the working copy (BF16 or F32) that the trainer
// rewrites from the master weights after each update. The per-token vectors go to the
// host for the loss and back (a few floats per token).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <span>
#include <vector>

#include "model/activations.h"
#include "model/parameters.h"
#include "model/transformer.h"
#include "train/muon.h"
#include "train/optimizer_settings.h"
#include "train/optimizer_shards.h"
#include "train/policy_loss.h"
#include "world/communicator.h"

namespace tandem {

class TrainerBackend;
class OptimizerStep;

struct TrainSequence {
  std::vector<int32_t> prompt;
  std::vector<int32_t> completion;
  std::vector<float> old_logprobs;  // one per completion token (GRPO only)
  float advantage = 0;              // GRPO only
};

struct TrainStepResult {
  double loss = 0;  // of the whole step, over all ranks
  double grad_norm = 0;  // not finite: the update was skipped and the weights are unchanged
  // With a non-finite grad_norm, where this rank first saw it: "micro-batch 2 of 4, tensor
  // model.layers.0.mlp.up_proj.weight", or "after the all-reduce, tensor ..." when this
  // rank's own gradients were finite.
  std::string non_finite;
  double optimizer_seconds = 0;  // the optimizer step (its streaming included), on this rank
  size_t state_bytes_streamed = 0;  // optimizer.state = host | disk: read plus written back
  int64_t tokens = 0;  // completion tokens that counted
  PolicyLossMetrics metrics;
  double mean_logp = 0;  // over the counted tokens (SFT: minus the cross-entropy)
  std::vector<std::vector<float>> sequence_logp;  // per sequence, its completion tokens' log-probs
  std::vector<std::vector<float>> sequence_entropy;  // GRPO: per sequence, the entropy at each completion token
  std::vector<std::vector<float>> sequence_reference_logp;  // GRPO with a KL term: the reference's log-probs
};

struct PolicyTrainerSettings {
  OptimizerSettings optimizer;  // its lr is the step's
  double max_grad_norm = 1.0;  // 0: no clipping
  float temperature = 1;       // the rollout's: log-probs are taken of logits / temperature
  int64_t logprob_chunk = 1024;  // CPU backend: rows of logits upcast at a time
  // Tokens per micro-batch: sequences are taken in order while they fit, and one longer
  // than this is a micro-batch of its own. 0: the whole batch at once.
  int64_t micro_batch_tokens = 0;
};

// Flat views [layout.slab_elements()] of the slabs, all on one device; under ZeRO-1,
// master, exp_avg and exp_avg_sq are [shard.elements()], the rank's shard of them.
struct PolicyTrainerMemory {
  // F32. The optimizer's state: AdamW's moments; under Muon, exp_avg holds the momentum
  // of Muon's matrices (and their part of exp_avg_sq stays unused). With state_staging,
  // exp_avg and exp_avg_sq are host memory (CPU tensors: pinned, or a mapped state file)
  // that the step streams through the staging chunk by chunk.
  Tensor master, grads, exp_avg, exp_avg_sq;
  // What forward and backward read, F32 or BF16 (BF16 on CUDA only): the master weights
  // themselves, or a copy the trainer rewrites after each update. Its dtype is the
  // activations'. The caller fills it before the first step (ColocatedMemory::rebuild).
  Tensor working;
  // PolicyTrainer::activation_bytes(config, capacity, working.dtype, optimizer) bytes,
  // 256-byte aligned, on the same device; transient: nothing in it outlives a step.
  void* activations = nullptr;
  // Null: the state is on the device. Otherwise two slots of state_slot_elements FP32
  // values each on the device (optimizer_state_chunks.h).
  float* state_staging = nullptr;
  size_t state_slot_elements = 0;
  // ZeRO-1: the split of the master weights and state over the communicator's ranks, seen
  // from this rank (its ranks() equal to world_size). Empty bounds: the whole slab.
  SlabShards shard;
};

class PolicyTrainer {
 public:
  // The backend is the memory's device; the communicator must reduce on that device
  // (NCCL on CUDA, MPI on the CPU). capacity: the largest micro-batch.
  PolicyTrainer(const ModelConfig& config, const ParameterLayout& layout, const PolicyTrainerMemory& memory,
                ActivationCapacity capacity, Communicator& communicator, int world_size);
  ~PolicyTrainer();

  // The activation slab: the model's activations and the per-token vectors of a
  // micro-batch. Muon's CUDA step reuses the activations' part as its workspace once
  // backward is done, so under Muon that part is at least the workspace.
  static size_t activation_bytes(const ModelConfig& config, ActivationCapacity capacity, DType dtype,
                                 OptimizerKind optimizer = OptimizerKind::AdamW);

  // The frozen reference policy for the KL term: a flat slab of the layout in the working
  // dtype on the trainer's device, or an empty tensor for none.
  void set_reference(const Tensor& reference);

  // GRPO: loss from policy_loss on the completion tokens.
  TrainStepResult grpo_step(const std::vector<TrainSequence>& batch, const PolicyLossSettings& loss, double lr,
                            int64_t step, const PolicyTrainerSettings& settings);
  // Supervised warm-up: mean cross-entropy of the completion tokens.
  TrainStepResult sft_step(const std::vector<TrainSequence>& batch, double lr, int64_t step,
                           const PolicyTrainerSettings& settings);

 private:
  struct Packed {
    std::vector<int32_t> ids, cu_seqlens, targets;  // targets[t]: the token position t predicts, or -1
    std::vector<uint8_t> mask;
    std::vector<float> old_logp, advantages;
  };
  // Whole sequences [first, last) of a Packed batch, tokens [begin, end).
  struct MicroBatch {
    size_t first = 0, last = 0;
    int64_t begin = 0, end = 0;
    std::vector<int32_t> cu_seqlens;  // from 0
    int64_t tokens() const { return end - begin; }
  };
  // Per-token values of the whole batch, filled micro-batch by micro-batch.
  struct TokenValues {
    std::vector<float> logp, entropy, ref_logp;  // entropy, ref_logp: empty when not wanted
  };
  // The per-token vectors of a micro-batch in the backend's memory, after the activations.
  struct TokenBuffers {
    Tensor targets, logp, entropy, lse, dlogp, dentropy;  // [max_tokens]
    Tensor scalar;                                        // F32 [1], for collectives on host values
  };
  // Given a micro-batch whose forward has filled its tokens' values, returns the loss's
  // gradients with respect to them (dlogp, and dentropy or empty).
  using LossGradient = std::function<PolicyLoss(const MicroBatch&)>;

  static TokenBuffers bind_token_buffers(void* base, Device device, int64_t max_tokens);
  Packed pack(const std::vector<TrainSequence>& batch) const;
  std::vector<MicroBatch> split(const Packed& packed, int64_t micro_batch_tokens) const;
  static std::vector<std::vector<float>> per_sequence(const std::vector<TrainSequence>& batch, const Packed& packed,
                                                      const std::vector<float>& logp);
  static PolicyLossBatch loss_inputs(const Packed& packed, const TokenValues& values, int64_t begin, int64_t end,
                                     std::span<const int32_t> cu_seqlens);
  // Zeroes the gradients, then forward, loss gradient and backward per micro-batch.
  void accumulate_gradients(const Packed& packed, TokenValues& values, const PolicyTrainerSettings& settings,
                            const LossGradient& loss_gradient);
  // Forward of one micro-batch and its targets' log-probs (and entropy when `entropy` is
  // not empty) into the host spans; returns the logits (kept for backward).
  Tensor forward(const ParameterSet& params, const Packed& packed, const MicroBatch& micro, std::span<float> logp,
                 std::span<float> entropy, const PolicyTrainerSettings& settings);
  void backward(const MicroBatch& micro, const Tensor& logits, const PolicyLoss& gradient,
                const PolicyTrainerSettings& settings);
  // This rank's shard of a whole F32 slab (all of it unsharded).
  Tensor shard_part(const Tensor& slab) const;
  // The gradients summed over ranks: all-reduced, or reduce-scattered onto this rank's
  // shard under ZeRO-1; then averaged unless they add up. Returns the shard's part of them.
  Tensor reduce_gradients(bool gradients_add_up);
  // gradients_add_up: each rank's loss is already a share of the global loss (normalised by
  // the global token count), so the ranks' gradients add up; otherwise they are averaged.
  TrainStepResult update(double lr, int64_t step, const PolicyTrainerSettings& settings, bool gradients_add_up);
  double sum_over_ranks(double value);
  // Whether this rank's gradients are still finite after a micro-batch, and if not, the
  // first micro-batch and tensor that are not, into non_finite_.
  void check_micro_batch_gradients(size_t index, size_t count);

  ModelConfig config_;
  const ParameterLayout& layout_;
  SlabShards shard_;  // memory.shard, or the whole slab
  PolicyTrainerMemory memory_;
  ParameterSet params_, grad_params_, reference_;
  ActivationCapacity capacity_;
  std::unique_ptr<TrainerBackend> backend_;
  Activations acts_;
  TokenBuffers tokens_;
  Transformer transformer_;
  std::unique_ptr<OptimizerStep> optimizer_;
  Communicator& communicator_;
  int world_size_;
  std::string non_finite_;  // of the step in progress, see TrainStepResult::non_finite
};

}  // namespace tandem
