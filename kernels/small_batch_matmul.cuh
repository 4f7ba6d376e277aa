// out [T,O] = x [T,I] · weight [O,I]ᵀ for the few rows of a decode step (T <= 256), in BF16
// with FP32 accumulation: the forward of matmul.cu's family where cuBLASLt's tiles leave
// most multiprocessors idle (at T = 256 its o_proj and down_proj GEMMs of the Qwen3-0.6B
// shape run 16-32 blocks, each over the whole of I). CPU twin: CpuOps::matmul_forward,
// compared in tests/gpu_ops_matmul.cpp.
//
// A block owns 64 or 128 weight rows (one or two warpgroups, wgmma with the weights as A
// and the tokens as B) and all of T, over a slice of I: the slices of one row block form a
// thread block cluster, whose blocks add their FP32 partial products through distributed
// shared memory in a fixed order (deterministic, no extra kernel, nothing through global
// memory). A plan picks the rows a block owns and the slices so that one wave of blocks
// covers the multiprocessors.
//
// The launch is a programmatic dependent one: a block loads its first stages of weights
// (which no kernel of the step writes) before it waits for the kernel before it, so at
// decode sizes the weight stream starts during that kernel's tail.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>

#include "tensor/tensor.h"

namespace tandem::cuda {

struct SmallBatchPlan {
  int warpgroups = 1;  // 64 weight rows each
  int splits = 1;      // slices of I, the blocks of a cluster
};

// The plan for out [tokens, out_features] = x · weightᵀ, or nothing where the kernel does
// not apply: more than 256 tokens, extents off its tiles (O a multiple of 64, I of 64), or
// more row blocks than one wave of `multiprocessors`.
std::optional<SmallBatchPlan> plan_small_batch_matmul(int64_t tokens, int64_t out_features, int64_t in_features,
                                                      int multiprocessors);

// Whether `plan` can run this product: its row blocks divide O and its splits divide I's
// 64-wide chunks (at most 8, a portable cluster).
bool small_batch_plan_fits(const SmallBatchPlan& plan, int64_t tokens, int64_t out_features, int64_t in_features);

// BF16 tensors, contiguous, 16-byte aligned; the caller has checked shapes and `plan` fits.
void small_batch_matmul(const Tensor& out, const Tensor& x, const Tensor& weight, const SmallBatchPlan& plan,
                        cudaStream_t stream);

}  // namespace tandem::cuda
