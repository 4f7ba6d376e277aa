// The matmul family of the CUDA backend, on cuBLASLt. Same semantics as Ops::matmul_forward
// and Ops::matmul_backward (src/model/ops.h); CPU twin: CpuOps, compared in
// tests/gpu_ops_matmul.cpp.
//
// Precision: the data tensors (x, weight, bias, out, dout, dx) share one dtype, BF16 or
// F32; products accumulate in FP32 (CUBLAS_COMPUTE_32F, never TF32); the weight and bias
// gradients are always F32, so they add up accurately over micro-batches and feed FP32
// master weights directly. Every pointer must be 16-byte aligned.
#pragma once
#include <cstddef>
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "model/grad_write.h"
#include "tensor/tensor.h"

namespace tandem::cuda {

// cuBLASLt descriptors and heuristic results, one per GEMM shape (defined in matmul.cu).
struct MatmulPlans;

// One per stream and thread: the workspace and the plan cache are used without locks.
// Made by make_matmul_context, released once by destroy_matmul_context.
struct MatmulContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
  MatmulPlans* plans = nullptr;
};

// 32 MiB of workspace: Hopper's fastest kernels need it.
MatmulContext make_matmul_context(cudaStream_t stream);
void destroy_matmul_context(MatmulContext& context);

// out [N,O] = x [N,I] · weight [O,I]ᵀ + bias [O]; bias may be empty (data == nullptr).
void matmul_forward(const MatmulContext& context, const Tensor& out, const Tensor& x, const Tensor& weight,
                    const Tensor& bias);

// out [N,O] = (x [N,I] · weight [O,I]ᵀ) · weight_scale: x and weight FP8 E4M3 codes,
// weight_scale F32 [1] on the device, out BF16 or F32 (Ops::fp8_matmul_forward). I and O
// in multiples of 16.
void fp8_matmul_forward(const MatmulContext& context, const Tensor& out, const Tensor& x, const Tensor& weight,
                        const Tensor& weight_scale);

// dx = or += dout · weight as dx_write says (overwrite: a GEMM with beta 0, dx never read);
// accumulates dweight (F32) += doutᵀ · x and dbias (F32) += Σ_rows dout. Any of dx,
// dweight, dbias may be empty (data == nullptr) when that gradient is not wanted.
void matmul_backward(const MatmulContext& context, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                     const Tensor& dout, const Tensor& x, const Tensor& weight, GradWrite dx_write);

}  // namespace tandem::cuda
