// Per-token log-probabilities of the sampled tokens straight from the logits in model
// precision (llm.c's fused classifier, generalised for RL), and optionally the entropy of
// each token's distribution: each row is upcast to FP32 in registers, divided by the
// temperature after the upcast, and reduced with an online max/sum, so no FP32
// [tokens, vocab] tensor ever exists. The backward pass writes d(logits) over the logits
// in place. CPU twin: the trainer's chunked log-probs (src/train/chunked_logprobs.h);
// compared in tests/gpu_logprobs.cpp.
#pragma once
#include <cuda_runtime.h>

#include "tensor/tensor.h"

namespace tandem::cuda {

// logits [T, V] BF16 or F32; targets I32 [T] (< 0: no target, logp = entropy = 0);
// logp and lse F32 [T]: log softmax(z)[target] and the log-sum-exp of z = logits/temperature,
// which the backward pass reuses; entropy F32 [T], or empty (data == nullptr) to skip it:
// -sum_v p_v log p_v of p = softmax(z).
void token_logprobs_forward(const Tensor& logp, const Tensor& entropy, const Tensor& lse, const Tensor& logits,
                            const Tensor& targets, float temperature, cudaStream_t stream);

// The gradient of a loss L(logp, entropy) with respect to the logits, in the logits' dtype:
//   dlogits[t, v] = (dlogp[t] (1[v == target] - p_v) - dentropy[t] p_v (log p_v + H_t)) / T
// Rows without a target get zeros. dentropy and entropy (the forward's output) are both
// given or both empty (no entropy term). dlogits may be the logits tensor itself.
void token_logprobs_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                             const Tensor& entropy, const Tensor& dlogp, const Tensor& dentropy, float temperature,
                             cudaStream_t stream);

}  // namespace tandem::cuda
