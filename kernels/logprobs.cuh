// Per-token log-probabilities of the sampled tokens straight from the logits in model
// precision (llm.c's fused classifier, generalised for RL): each row is upcast to FP32
// in registers, divided by the temperature after the upcast, and reduced with an online
// max/sum, so no FP32 [tokens, vocab] tensor ever exists. The backward pass writes
// d(logits) over the logits in place. CPU twin: cross_entropy (src/model/cross_entropy.h)
// and the trainer's chunked log-probs; compared in tests/gpu_logprobs.cpp.
#pragma once
#include <cuda_runtime.h>

#include "tensor/tensor.h"

namespace tandem::cuda {

// logits [T, V] BF16 or F32; targets I32 [T] (< 0: no target, logp = 0);
// logp and lse F32 [T]: log softmax(logits/temperature)[target] and the log-sum-exp of
// logits/temperature, which the backward pass reuses.
void token_logprobs_forward(const Tensor& logp, const Tensor& lse, const Tensor& logits, const Tensor& targets,
                            float temperature, cudaStream_t stream);

// dlogits[t, v] = dlogp[t] * (1[v == target] - softmax(logits/T)[v]) / T, in the logits'
// dtype; rows without a target get zeros. dlogits may be the logits tensor itself.
void token_logprobs_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                             const Tensor& dlogp, float temperature, cudaStream_t stream);

}  // namespace tandem::cuda
