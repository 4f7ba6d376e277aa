// The operations the decoder is made of, behind one interface with one implementation
// per backend: CpuOps (FP32 reference, plain C++) and later a CUDA backend (BF16 data,
// FP32 accumulation). Tensors carry their dtype and device; a backend refuses those it
// cannot handle with an error naming the op and the argument.
//
// Conventions, the same in every backend:
// - Row-major tensors; a "row" is one token. Linear weights are [out, in] as in PyTorch,
//   so matmul_forward computes out = in · Wᵀ (+ bias).
// - Gradients of weights ACCUMULATE (+=): they add up over micro-batches; the caller zeroes
//   them once per step. Input gradients are written as each op says: matmul_backward and
//   rmsnorm_backward take a GradWrite for dx (a buffer that several branches feed, such as
//   the residual stream's or q|k|v's shared d_normed, is overwritten by its first writer
//   and added into by the others); attention_backward and swiglu_backward, the only writers
//   of their input gradients, overwrite them. No input gradient needs zeroing first.
// - Statistics kept for backward (RMSNorm reciprocal std, attention log-sum-exp) are FP32.
// - Packed batches: sequences are laid end to end, with no padding; cu_seqlens (I32,
//   sequences+1 offsets starting at 0) marks where each begins, and attention never
//   crosses a boundary. positions (I32) restart at 0 in each sequence.
#pragma once

#include "model/grad_write.h"
#include "tensor/tensor.h"

namespace tandem {

// Working memory of the GPU attention backward, contents lost: row_dots F32 [T, heads]
// (rowsum(dO∘O), always needed) and score_grads, flat BF16, where the dS tiles go when it
// holds those of any packing of the call's T tokens (about heads·T² bytes; less or none
// only makes dq recompute them). A buffer dead during the backward serves: the trainer
// lends the logits, spent once the LM head's backward has run.
struct AttentionScratch {
  Tensor row_dots;
  Tensor score_grads;
};

// Rows that stand for their values times a factor each: row r for values[r] · scales[r],
// scales F32 [N]; with scales empty, for the values themselves. FP8 E4M3 values always
// carry scales. The engine's FP8 projections (Ops::fp8_matmul_forward) take their inputs
// so, one scale per token, and hand the same scales on to whoever reads their outputs.
// Implicit from a Tensor: rows without scales.
struct ScaledRows {
  ScaledRows(const Tensor& values, const Tensor& scales = {}) : values(values), scales(scales) {}  // NOLINT
  Tensor values;
  Tensor scales;
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;

  // Host -> this backend's memory, dst.nbytes() bytes.
  virtual void copy_from_host(const Tensor& dst, const void* src) = 0;
  // The same copy queued behind the backend's work without waiting for it: `src` must stay
  // unchanged until the work queued after the copy has run (pinned memory on CUDA, which
  // the copy engine reads when the copy's turn comes).
  virtual void queue_copy_from_host(const Tensor& dst, const void* src) = 0;
  virtual void zero(const Tensor& dst) = 0;
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;

  // out[t] = table[ids[t]]: out [T, C], table [V, C], ids I32 [T].
  virtual void embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) = 0;
  virtual void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) = 0;

  // out = x / sqrt(mean(x²) + eps) * weight over the last dim: x, out [N, D], weight [D],
  // rstd F32 [N]. Works per token ([T, hidden]) and per head ([T*heads, head_dim]).
  // out may be FP8 E4M3 codes with scales (ScaledRows): each row's scale is then its
  // largest magnitude / 448 and its codes e4m3(element / scale) (tensor/fp8.h), from the
  // FP32 result (not rounded to x's dtype first).
  virtual void rmsnorm_forward(const ScaledRows& out, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                               float eps) = 0;
  virtual void rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                                const Tensor& weight, const Tensor& rstd, GradWrite dx_write) = 0;
  // The residual add and the norm after it in one pass (inference: the engine's decode
  // step, where each small kernel's start and drain cost more than its work):
  // hidden += branch, then out and rstd as rmsnorm_forward of the updated hidden [N, D].
  // branch may carry row scales (an FP8 projection's output): hidden += values · scale.
  virtual void add_rmsnorm_forward(const ScaledRows& out, const Tensor& rstd, const Tensor& hidden,
                                   const ScaledRows& branch, const Tensor& weight, float eps) = 0;

  // out [N, O] = x [N, I] · weight [O, I]ᵀ + bias [O]; bias and dbias may be empty
  // (data == nullptr) when the layer has none.
  virtual void matmul_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias) = 0;
  virtual void matmul_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                               const Tensor& x, const Tensor& weight, GradWrite dx_write) = 0;
  // The rollout's FP8 projection: out [N, O] = (x [N, I] · weight [O, I]ᵀ) · weight_scale,
  // x and weight FP8 E4M3 codes, weight_scale F32 [1], FP32 accumulation, out in the
  // working dtype. x's row scales are not applied: out's rows stand in their units, so out
  // with x's scales (ScaledRows) is the product.
  virtual void fp8_matmul_forward(const Tensor& out, const Tensor& x, const Tensor& weight,
                                  const Tensor& weight_scale) = 0;
  // codes (FP8 E4M3, shaped as x [R, C]) and scale F32 [1] of all of x: scale = x's largest
  // magnitude / 448, codes e4m3(element / scale); all zero for an all-zero x.
  virtual void quantize_fp8(const Tensor& codes, const Tensor& scale, const Tensor& x) = 0;

  // RoPE, Hugging Face's rotate_half pairing: dims i and i + head_dim/2 of every head
  // rotate together by position * inv_freq[i], inv_freq F32 [head_dim/2]. The forward
  // rotation is part of qk_norm_rope_forward; the backward pass rotates the gradient dx
  // [T, heads*head_dim] back by the same angles, in place.
  virtual void rope_backward(const Tensor& dx, const Tensor& positions, const Tensor& inv_freq, int heads) = 0;
  // The backward of qk_norm_rope_forward's per-head norm and RoPE, for q or for k: dout is
  // the gradient of the normed, rotated heads, x the projection before its norm (x, dout,
  // dx [T, heads*head_dim]); dx is overwritten with x's gradient and dweight F32
  // [head_dim] += as rmsnorm_backward's. rstd F32 [T*heads] is the forward's. dout is
  // left as it is.
  virtual void rmsnorm_rope_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                                     const Tensor& weight, const Tensor& rstd, const Tensor& positions,
                                     const Tensor& inv_freq, int heads) = 0;
  // Attention's inputs in one pass: every head of q [T, heads*head_dim] and of k [T,
  // kv_heads*head_dim] goes through per-head RMSNorm with weight q_norm / k_norm [head_dim]
  // (Qwen3's qk_norm), then RoPE, into q_out and k_out (shaped as q and k; they may alias
  // them). Without qk_norm both weights are empty (data == nullptr) and the op is RoPE
  // alone of q and of k. q_rstd F32 [T*heads] and k_rstd [T*kv_heads] receive
  // each head's 1/rms as rmsnorm_forward's rstd when given (training keeps them for
  // rmsnorm_backward); inference passes both empty, and they must be empty without norms.
  virtual void qk_norm_rope_forward(const Tensor& q_out, const Tensor& k_out, const Tensor& q, const Tensor& k,
                                    const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions,
                                    const Tensor& inv_freq, int heads, int kv_heads, float eps,
                                    const Tensor& q_rstd, const Tensor& k_rstd) = 0;

  // Causal grouped-query attention within each packed sequence, scale 1/sqrt(head_dim).
  // q, out [T, heads*head_dim]; k, v [T, kv_heads*head_dim]; lse F32 [T, heads] keeps the
  // softmax normaliser so backward recomputes the probabilities instead of storing T².
  virtual void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& cu_seqlens, int heads, int kv_heads) = 0;
  // `scratch` is the GPU backend's working memory (the CPU backend needs none).
  virtual void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                  const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& cu_seqlens, int heads, int kv_heads,
                                  const AttentionScratch& scratch) = 0;

  // out = silu(gate) * up, all [N, I].
  virtual void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) = 0;
  // The same on the output of one GEMM against gate_proj and up_proj stacked: each row of
  // gate_up [N, 2I] is a row of gate then a row of up; out [N, I]. gate_up may carry row
  // scales, and out be FP8 codes with scales (as rmsnorm_forward's).
  virtual void swiglu_forward(const ScaledRows& out, const ScaledRows& gate_up) = 0;
  virtual void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                               const Tensor& up) = 0;
};

}  // namespace tandem
