// SwiGLU on the GPU: out = silu(gate) * up. CPU twin: CpuOps::swiglu_forward/backward
// (src/model/cpu_ops.cpp), compared in tests/gpu_ops_pointwise.cpp.
#pragma once
#include <cuda_runtime.h>

#include "model/ops.h"  // ScaledRows
#include "tensor/tensor.h"

namespace tandem::cuda {

// out, gate, up [N, I], one data dtype (F32 or BF16); FP32 math.
void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up, cudaStream_t stream);
// The same with gate and up the two halves of each row of gate_up [N, 2I] (times its row
// scales, if any); out [N, I], or FP8 codes with a scale per row (Ops::swiglu_forward).
void swiglu_forward(const ScaledRows& out, const ScaledRows& gate_up, cudaStream_t stream);
// dgate = dout * up * silu'(gate), dup = dout * silu(gate) (overwritten, never read); all
// [N, I] of gate's dtype.
void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up, cudaStream_t stream);

}  // namespace tandem::cuda
