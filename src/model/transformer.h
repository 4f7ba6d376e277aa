// The decoder's forward and backward passes over a packed batch, written once against
// the Ops interface so every backend runs the same sequence of ops.
//
//   h = embed(ids)
//   per layer:  a = rmsnorm(h);  q,k,v = a·Wqᵀ(+b), a·Wkᵀ(+b), a·Wvᵀ(+b)
//               q,k = rope(qk_norm ? rmsnorm_per_head(q,k) : q,k)
//               h = h + o_proj(causal_gqa_attention(q, k, v))
//               h = h + down(silu(gate(rmsnorm(h))) * up(rmsnorm(h)))
//   logits = rmsnorm(h) · lm_headᵀ
//
// What is stored and what is recomputed for backward: see model/activations.h.
#pragma once
#include <span>
#include <vector>

#include "model/activations.h"
#include "model/config.h"
#include "model/ops.h"
#include "model/parameters.h"

namespace tandem {

class Transformer {
 public:
  Transformer(const ModelConfig& config, Ops& ops);

  const ModelConfig& config() const { return config_; }

  // Runs the batch and returns the logits [T, vocab] (the first T rows of acts.logits).
  // token_ids holds T tokens of several sequences end to end; cu_seqlens their offsets
  // (0, len0, len0+len1, ..., T). Each sequence's positions start at 0. Throws
  // std::invalid_argument when the packing is malformed or exceeds the capacity.
  Tensor forward(const ParameterSet& params, Activations& acts, std::span<const int32_t> token_ids,
                 std::span<const int32_t> cu_seqlens);

  // Backpropagates dlogits [T, vocab] of the last forward on `acts`, ADDING into grads
  // (a ParameterSet bound to a gradient slab of the same layout; zero it first unless
  // accumulating micro-batches). dlogits may be acts.logits overwritten in place; once the
  // LM head's backward has read it, acts.logits is the attention backward's scratch, so
  // its contents are lost either way.
  void backward(const ParameterSet& params, const ParameterSet& grads, Activations& acts, const Tensor& dlogits);

 private:
  // q/k norm and RoPE of one layer's projections into its q_rope/k_rope (one op).
  void attention_inputs(const LayerParameters& params, const LayerActivations& layer, const Activations& acts);

  ModelConfig config_;
  Ops& ops_;
  std::vector<float> inv_freq_;
};

// Checks a packing: cu_seqlens starts at 0, grows strictly (no empty sequence) and ends
// at `tokens`. Returns each token's position within its sequence.
std::vector<int32_t> packed_positions(std::span<const int32_t> cu_seqlens, int64_t tokens);

}  // namespace tandem
