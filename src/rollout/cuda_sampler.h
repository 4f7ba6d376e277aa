// The rollout engine's sampler on the GPU: per-row sampling parameters and uniform draws
// staged from the host, tokens and log-probs sampled on device logits by
// cuda::sample_tokens (kernels/sampling.cuh), read back through pinned memory. The draws
// stay on the host, one per non-greedy row from the request's own stream
// (draw_uniform in rollout/sampler.h), so the CPU Sampler given the same draws is the twin.
//
// Per step: stage() (host), launch() (capturable in a CUDA graph: fixed buffers, no
// allocation, no sync), send() (outside a graph: queues the results' copy to the host),
// then results() once the step has run. Two steps may be in flight: the pinned buffers
// come in two slots, taken in turn, and a step's stage() must come after the results()
// of the step two before it, whose slot it takes (it throws otherwise).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "rollout/request.h"
#include "rollout/sampler.h"
#include "tensor/tensor.h"

namespace tandem {

class CudaSampler {
 public:
  // For up to max_rows rows of up to `vocab` logits.
  CudaSampler(int64_t max_rows, int64_t vocab);
  ~CudaSampler();
  CudaSampler(const CudaSampler&) = delete;
  CudaSampler& operator=(const CudaSampler&) = delete;

  // Row b samples with params[b] and the draw u[b] (unused when greedy); one async copy.
  void stage(std::span<const SamplingParams> params, std::span<const double> u, cudaStream_t stream);
  // Samples every row of logits [rows, V] (BF16 or F32, rows <= max_rows, V <= vocab) with the
  // parameters last staged.
  void launch(const Tensor& logits, cudaStream_t stream);
  // Queues the copy of the last launch's results to the host, behind it on `stream`.
  void send(cudaStream_t stream);
  // The first `rows` results of the oldest send not yet read; waits for them. A row whose
  // logits held a NaN or +inf, or only -inf, has id -1.
  std::vector<SampledToken> results(int64_t rows);
  // The ids of the last launch on the device, I32 [max_rows]: the next step's token feed
  // reads them there (kernels/token_feed.cuh).
  Tensor sampled_ids() const { return device(kIds, DType::I32, max_rows_); }

 private:
  static constexpr int kSlots = 2;
  // One layout on both sides, max_rows entries per field: the inputs are copied up in one
  // piece, the outputs down in another. The host has it once per slot.
  enum Field { kTemperature, kTopK, kTopP, kUniform, kIds, kLogprobs, kFields };
  static constexpr int kInputs = kIds;
  template <class T>
  T* host(int64_t step, Field field) const {
    return reinterpret_cast<T*>(static_cast<char*>(host_) + ((step % kSlots) * kFields + field) * max_rows_ * 4);
  }
  Tensor device(Field field, DType dtype, int64_t rows) const;
  void release();  // frees what the constructor got
  size_t workspace_bytes() const;  // of cuda::sample_tokens' tile statistics; its tile counts follow

  int64_t max_rows_;
  int64_t vocab_;
  void* host_ = nullptr;    // pinned, kSlots * kFields * max_rows 4-byte entries
  void* device_ = nullptr;  // kFields * max_rows entries
  void* workspace_ = nullptr;  // cuda::sample_tokens' tile statistics and tile counts for max_rows rows
  cudaEvent_t copied_[kSlots] = {};  // recorded after each slot's results copy
  int64_t staged_ = 0, sent_ = 0, read_ = 0;  // steps staged, sent and read so far
};

}  // namespace tandem
