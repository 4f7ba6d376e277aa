// Muon on the GPU; CPU twin muon_step_cpu (src/train/muon.h), compared in tests/gpu_muon.cpp.
//
// A step takes every matrix of a MuonGroup (one oriented shape, every layer) at once:
// a kernel updates the momentum and sums the squares of the Nesterov update per matrix
// (in double, fixed order), a kernel writes the normalised updates as BF16 [count, m, n]
// (transposing the tall ones), then each Newton-Schulz iteration is three strided-batched
// BF16 GEMMs with FP32 accumulation over the whole group (A = X Xᵀ; B = c A A + b A + a I;
// X' = B X, the a X term folded into B's diagonal), and a last kernel applies the scaled
// update with decoupled weight decay and writes the BF16 working copy. No launch is per
// matrix. The momentum buffer is the CPU twin's bit for bit; the update differs by the
// BF16 iteration.
#pragma once
#include <cstdint>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "train/muon.h"

namespace tandem::cuda {

// Muon's step on one group in two halves, so the momentum can be streamed through the
// device in chunks of whole matrices (optimizer.state = host | disk) while the
// Newton-Schulz products still batch the whole group. muon_momentum: matrices
// [first, last) of the group, their momentum at momentum + momentum_offsets[j - first]
// (null: at the group's slab offsets), updated and packed into the workspace as the
// normalised BF16 update. muon_orthogonalize, once every matrix has been through
// muon_momentum: the iterations and the update of params and working. params, grads,
// momentum: FP32 slab bases (the group's offsets index them); working: BF16 slab base or
// null; workspace: MuonWorkspace::for_group(group).bytes of device memory, 256-byte
// aligned. The cuBLAS handle must be set to `stream`.
void muon_momentum(const MuonGroup& group, size_t first, size_t last, const float* grads, float* momentum,
                   const int64_t* momentum_offsets, float beta, void* workspace, cudaStream_t stream);
void muon_orthogonalize(const MuonGroup& group, float* params, uint16_t* working, const MuonStepScalars& scalars,
                        void* workspace, cublasHandle_t cublas, cudaStream_t stream);

}  // namespace tandem::cuda
