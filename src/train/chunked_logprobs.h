// Log-probs of the sampled tokens from logits kept in model precision, a chunk of tokens
// at a time (miles' --upcast-logits-after-chunking), so the [tokens x vocab] FP32 tensor of
// the plain path never exists.
//
// Per chunk: upcast the rows to FP32 into the workspace, divide by the temperature (after
// the upcast, in FP32), then per row a log-softmax with the sums accumulated in double,
// gathered at the sampled token, and optionally the entropy. The backward recomputes the
// chunk's softmax the same way and writes d(loss)/d(logits) in the logits' dtype; it may
// write over the logits themselves (like llm.c's fused classifier), since each chunk is
// copied into the workspace before its rows are written.
//
// CPU twin of the GPU kernel; the sums in double make it at least as accurate as an FP32
// accumulation, whatever the logits' dtype (an F16 row of 4096 equal logits sums to 4096,
// where F16 accumulation would stop at 2048).
#pragma once
#include <cstdint>
#include <span>

#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace tandem {

struct LogprobSettings {
  float temperature = 1;
  int64_t chunk_tokens = 1024;
};

// FP32 elements of the workspace a call needs: one chunk of upcast rows.
int64_t logprob_workspace_elements(int64_t tokens, int64_t vocab, int64_t chunk_tokens);

// logits: contiguous CPU [T, V] in F32, BF16 or F16; tokens[t] in [0, V), or negative for a
// row that takes no part (its logp and entropy are 0, its dlogits row 0). Writes logp[T]
// and, when entropy is not empty, entropy[T]. Throws std::invalid_argument naming the
// argument that does not fit, std::out_of_range for a token id past the vocabulary.
void chunked_logprobs_forward(const Tensor& logits, std::span<const int32_t> tokens, const LogprobSettings& settings,
                              std::span<float> workspace, std::span<float> logp, std::span<float> entropy);

// dlogp[T] and dentropy[T] (empty: no entropy term) are the loss's gradients with respect
// to the forward's outputs; dlogits has the logits' shape and dtype and may be the logits.
void chunked_logprobs_backward(const Tensor& logits, std::span<const int32_t> tokens, const LogprobSettings& settings,
                               std::span<float> workspace, std::span<const float> dlogp,
                               std::span<const float> dentropy, const Tensor& dlogits);

// Bytes each path holds besides the logits themselves (the model's output, there in both).
struct LogprobMemory {
  int64_t logits_bytes = 0;    // [T, V] in the model dtype, for reference
  int64_t forward_bytes = 0;   // peak extra bytes while the log-probs are computed
  int64_t backward_bytes = 0;  // peak extra bytes while d(logits) is computed
};

// The chunked path: the workspace, logp and entropy (FP32, [T] each), and in the backward
// a separate dlogits tensor unless it is written over the logits.
LogprobMemory chunked_logprob_memory(int64_t tokens, int64_t vocab, int64_t chunk_tokens, DType dtype,
                                     bool dlogits_in_place);

// PyTorch's plain path, logits.float().div_(t).log_softmax(-1).gather(...) and its
// backward: the FP32 copy and the log-softmax output live together in the forward; the
// backward holds the saved output, the scattered gradient and the input gradient in FP32,
// then the gradient cast back to the model dtype.
LogprobMemory full_fp32_logprob_memory(int64_t tokens, int64_t vocab, DType dtype);

}  // namespace tandem
