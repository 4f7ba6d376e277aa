// The buffers one forward/backward pass of a packed batch needs, carved out of ONE slab
// the caller provides (llm.c's fill_in_activation_sizes, without a second copy of the
// list: the same walk over the buffers sizes the slab and binds it).
//
// Sized for a capacity of `max_tokens` tokens in at most `max_sequences` sequences; a
// batch may use fewer, and every [T, ...] buffer is then used through its first T rows.
// Memory is linear in tokens. Per layer and token the pass STORES, in the activation dtype:
//   the residual stream entering the layer and after attention  2·hidden
//   the q, k, v projections (q and k after RoPE)                 (heads + 2·kv_heads)·head_dim
//   with q/k norm, also q and k before their norm                (heads + kv_heads)·head_dim
//   the attention output                                        heads·head_dim
//   the MLP gate and up projections and their SwiGLU product    3·intermediate
// plus FP32 statistics (RMSNorm 1/rms per row, attention log-sum-exp per head), and the
// logits [T, vocab]. Backward RECOMPUTES, per layer, into shared scratch: the two RMSNorm
// outputs and the attention probabilities (from q, k and the log-sum-exp, flash-attention
// style: no T² buffer of its own; the GPU's dS tiles borrow the logits, dead by then, for
// one layer at a time). The SwiGLU product is kept rather than recomputed: one more
// intermediate-wide row per layer (at the 0.6B shape 6 KiB a token in BF16, a fifth more
// than the rest of a layer: 1.3 GiB at 8192 tokens) saves a kernel reading gate and up and
// writing the product in every layer's backward. So are the attention's q and k: without
// q/k norm RoPE rotates the projections in place, at no cost (the backward needs them
// only rotated); with it the norm's backward needs them unrotated too, and keeping both
// (at the 0.6B shape 3 KiB a token and layer, 1.3 GiB at 8192 tokens) saves rerunning
// the norm and RoPE in every layer's backward. Gradient scratch is shared by all layers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace tandem {

struct LayerActivations {
  Tensor input;       // [T, hidden] residual stream entering the layer
  Tensor input_rstd;  // F32 [T]
  Tensor q;           // [T, heads*head_dim] q_proj output (rotated in place without q/k norm)
  Tensor k, v;        // [T, kv_heads*head_dim]
  Tensor q_rstd;      // F32 [T, heads] (q/k norm only)
  Tensor k_rstd;      // F32 [T, kv_heads]
  Tensor q_rope;      // the attention's q and k: normed and rotated copies with q/k norm,
  Tensor k_rope;      //   views of q and k without
  Tensor attention;   // [T, heads*head_dim] o_proj input
  Tensor lse;         // F32 [T, heads]
  Tensor mid;         // [T, hidden] residual stream after attention
  Tensor mid_rstd;    // F32 [T]
  Tensor gate, up;    // [T, intermediate]
  Tensor mlp_hidden;  // [T, intermediate] silu(gate) * up, the down_proj input
};

struct ActivationCapacity {
  int64_t max_tokens = 0;
  int64_t max_sequences = 0;
};

struct Activations {
  // Inputs staged in the backend's memory.
  Tensor token_ids;   // I32 [T]
  Tensor positions;   // I32 [T]
  Tensor cu_seqlens;  // I32 [sequences + 1]
  Tensor inv_freq;    // F32 [head_dim / 2]

  std::vector<LayerActivations> layers;
  Tensor output;       // [T, hidden] residual stream after the last layer
  Tensor output_rstd;  // F32 [T]
  Tensor logits;       // [T, vocab]

  // Scratch shared by all layers: recomputed values, then gradients.
  Tensor normed;                  // [T, hidden]
  Tensor d_residual, d_normed;    // [T, hidden]
  Tensor d_q_rope, d_q;           // [T, heads*head_dim]
  Tensor d_k_rope, d_k, d_v;      // [T, kv_heads*head_dim]
  Tensor d_attention;             // [T, heads*head_dim]
  Tensor attention_row_dots;      // F32 [T, heads], the attention backward's rowsum(dO∘O)
  Tensor d_mlp_hidden, d_gate, d_up;  // [T, intermediate]

  ActivationCapacity capacity;
  size_t bytes = 0;     // the slab size this binding uses
  int64_t tokens = 0;     // the batch the last forward ran, which backward reuses
  int64_t sequences = 0;

  // Slab bytes for this config, capacity and activation dtype (FP32 on the CPU backend).
  static size_t slab_bytes(const ModelConfig& config, ActivationCapacity capacity, DType dtype);
  // Views into `base`, which must hold slab_bytes(...) bytes, 256-byte aligned.
  static Activations bind(const ModelConfig& config, ActivationCapacity capacity, void* base, DType dtype,
                          Device device = Device::CPU);
};

// The first `rows` rows of a [N, ...] buffer (a batch smaller than the capacity).
Tensor first_rows(const Tensor& buffer, int64_t rows);
// [T, heads*head_dim] seen as [T*heads, head_dim]: per-head RMSNorm runs on rows.
Tensor per_head_rows(const Tensor& x, int heads);

}  // namespace tandem
