// The decoder's forward pass for one engine step, against the paged KV cache. The dense
// parts run through the same Ops as model/transformer.h; attention goes through
// PagedAttention. Per layer:
//   a = rmsnorm(h);  q,k,v = projections of a;  q,k = rope(qk_norm ? rmsnorm_per_head : id)
//   store k, v into the cache rows of the new tokens;  h += o_proj(paged_attention(q))
//   h += down(silu(gate(rmsnorm(h))) * up(rmsnorm(h)))
// Where the weights lie end to end (model/parameters.h: stacked_weights), q|k|v is ONE
// GEMM whose rows PagedAttention::attend_qkv reads (norm, rope and the cache store in one
// kernel on CUDA), and gate|up ONE GEMM that SwiGLU reads in halves: at decode batch
// sizes a GEMM takes about the same time whatever its width, and a kernel's launch and
// drain more than its work.
// and only each sequence's LAST new token goes through the final norm and the LM head:
// that is the only row a step samples from, and [T, vocab] logits of a long prompt chunk
// would be by far the largest buffer.
//
// With FP8 weights (the deck's rollout.weight-dtype = fp8), the q|k|v, gate|up and down
// projections run on FP8 E4M3 tensor cores: each stacked weight matrix as codes of one
// scale (Ops::quantize_fp8, derived by prepare_weights), each token's input as codes of
// its own scale, written by the kernel before the GEMM (the norms, SwiGLU), and the scale
// applied by the kernel after it (the q/k norm and cache store, SwiGLU, the residual
// add). Half the weight bytes and twice the tensor rate of BF16 for those GEMMs; o_proj
// (whose input comes from attention blocks of one head each, with no token-wide scale)
// and the LM head (whose logits the sampler reads) stay in the working dtype.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/config.h"
#include "model/ops.h"
#include "model/parameters.h"
#include "rollout/kv_cache.h"
#include "rollout/paged_attention.h"
#include "tensor/memory_pool.h"
#include "world/pinned_memory.h"

namespace tandem {

struct StepCapacity {
  int64_t max_tokens = 0;     // new tokens in one step, over all sequences
  int64_t max_sequences = 0;  // sequences in one step
  int64_t max_blocks = 0;     // block table width: blocks of the longest sequence
};

// One step's batch on the host: sequence b's new tokens are token_ids[cu_queries[b] ..
// cu_queries[b+1]), the first at position context_lens[b] - n_b. A token the host does
// not know yet (sampled by the step still running) has from_rows[t] >= 0, its row there:
// RowSampler::feed puts it in on the device; every other token has -1.
struct StepInputs {
  std::vector<int32_t> token_ids, from_rows, positions, slots;  // [T]
  std::vector<int32_t> cu_queries{0};                // [B + 1]
  std::vector<int32_t> context_lens;                 // [B]
  std::vector<int32_t> block_tables;                 // [B, max_blocks], row-major

  int64_t sequences() const { return static_cast<int64_t>(context_lens.size()); }
  int64_t tokens() const { return static_cast<int64_t>(token_ids.size()); }
};

class EngineForward {
 public:
  // Scratch for `capacity` comes from the pool under tags::kv_cache: like the cache, its
  // contents live for one step and it can be dropped whenever the cache is. It holds the
  // buffers of the q|k|v paths that `weights` take, so their layout is fixed from here
  // on (weights that move between offloads come back to the same addresses).
  // With fp8_weights the scratch also holds the FP8 copies of the projections, which
  // prepare_weights() derives: every layer's q|k|v and gate|up must stack
  // (model/parameters.h: stacked_weights, without biases).
  EngineForward(const ModelConfig& config, const ParameterSet& weights, Ops& ops, PagedAttention& attention,
                MemoryPool& pool, StepCapacity capacity, DType dtype, bool fp8_weights, const std::string& name);
  ~EngineForward();
  EngineForward(const EngineForward&) = delete;
  EngineForward& operator=(const EngineForward&) = delete;

  const StepCapacity& capacity() const { return capacity_; }
  // The FP8 projections' codes that the scratch holds with FP8 weights.
  static size_t fp8_weight_bytes(const ModelConfig& config);

  // Derives what run() reads from the weights besides the weights themselves (with FP8
  // weights, their codes and scales; nothing otherwise): after they changed, and after the
  // scratch was dropped with the cache. Queued on the backend like a step.
  void prepare_weights();

  // Checks the step and queues ONE copy of all its inputs (ids, positions, slots, block
  // tables, ...) into the scratch, so that run() reads them from fixed addresses. The
  // copy does not wait for the work queued before it: it reads one of two host images
  // (pinned on CUDA), taken in turn, so a step must be staged after the results of the
  // step two before it came back, when that step's copy has surely run.
  void stage(const StepInputs& step);
  // The staged step's token ids and their from_rows in the scratch, I32 [T]: the engine
  // feeds the tokens sampled by the step before into them (RowSampler::feed) before run().
  Tensor token_ids() const;
  Tensor from_rows() const;
  // The staged step's device work, kernels only (a CUDA graph can capture it): writes the
  // new tokens' keys and values into `cache` and returns the logits of each sequence's
  // last new token, [B, vocab] in the working dtype, in the backend's memory.
  Tensor run(const KvCache& cache);

 private:
  // A layer's FP8 projections: codes of the stacked q|k|v, gate|up and down matrices,
  // and each matrix's scale (F32 [1]).
  struct Fp8Layer {
    Tensor qkv_proj, gate_up_proj, down_proj;
    Tensor qkv_scale, gate_up_scale, down_scale;
  };
  struct Scratch {
    Tensor token_ids, from_rows, positions, slots, cu_queries, context_lens, block_tables, last_rows;  // I32
    Tensor inv_freq, rstd;                                                                  // F32
    Tensor hidden, normed, qkv, q, k, v, q_normed, k_normed, attention, branch, gate, up, gate_up, mlp;
    Tensor last_normed, logits;
    // FP8 weights only: each layer's projections, and their inputs as codes with a scale
    // per token.
    std::vector<Fp8Layer> fp8_layers;
    Tensor normed_codes, normed_scales, mlp_codes, mlp_scales;
  };
  // Lays the scratch out from `base` (nullptr: only measures). The step inputs come
  // first, so one copy of [0, inputs_bytes) stages them all.
  Scratch bind(void* base, Device device, size_t* bytes, size_t* inputs_bytes) const;

  // Each layer's weights that lie end to end (model/parameters.h: stacked_weights), seen
  // as one matrix; empty where the layer takes the separate GEMMs.
  struct StackedWeights {
    Tensor qkv_proj, gate_up_proj;
  };

  ModelConfig config_;
  ParameterSet params_;
  std::vector<StackedWeights> stacked_;
  Ops& ops_;
  PagedAttention& attention_;
  MemoryPool& pool_;
  StepCapacity capacity_;
  DType dtype_;
  bool fp8_weights_;
  Allocation* allocation_ = nullptr;
  Scratch scratch_;
  std::vector<float> inv_freq_;
  static constexpr int kStagingImages = 2;
  size_t inputs_bytes_ = 0;                    // the scratch's input region
  std::unique_ptr<PinnedMemory> staging_;      // kStagingImages host images of that region
  Scratch images_[kStagingImages];             // views of the inputs in each image
  int64_t staged_steps_ = 0, staged_tokens_ = 0, staged_sequences_ = 0;
};

}  // namespace tandem
