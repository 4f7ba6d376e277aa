// Muon (Keller Jordan's MomentUm Orthogonalized by Newton-Schulz) for the layers' 2-D
// matrices: Nesterov momentum on the gradient, then the update is replaced by an
// approximately orthogonal matrix of the same row and column spaces (five quintic
// Newton-Schulz iterations on it, normalised by its Frobenius norm, transposed to wide
// when tall), scaled by 0.2 sqrt(max(rows, cols)) (Moonlight) so that AdamW's learning
// rate and weight decay carry over, with decoupled weight decay:
//
//   buf = momentum buf + (1 - momentum) g            (torch's lerp)
//   u   = (1 - momentum) g + momentum buf            (Nesterov)
//   O   = NS5(u / (|u|_F + 1e-7))
//   p   = p (1 - lr wd) - lr 0.2 sqrt(max(rows, cols)) O
//
// The state is one FP32 buffer the size of the matrix (the momentum). This file holds
// the CPU twin in FP32 and the grouping the CUDA path batches by (kernels/muon.cuh):
// matrices of one oriented shape, across every layer, go through one strided-batched
// GEMM per Newton-Schulz product.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/parameters.h"

namespace tandem {

inline constexpr int kNewtonSchulzSteps = 5;
inline constexpr float kNewtonSchulzA = 3.4445f, kNewtonSchulzB = -4.7750f, kNewtonSchulzC = 2.0315f;
inline constexpr float kMuonNormEps = 1e-7f;

// The tensors Muon takes: the 2-D matrices inside the layers. Embeddings, the LM head,
// norms and biases stay with AdamW.
bool takes_muon(const ParameterInfo& info);

struct MuonMatrix {
  int64_t offset = 0;       // in the slab, elements
  bool transposed = false;  // stored [n, m] (tall): orthogonalised as its transpose
};
// Muon's matrices whose oriented shape is [m, n], m <= n, in layout order.
struct MuonGroup {
  int64_t m = 0, n = 0;
  std::vector<MuonMatrix> matrices;
};
std::vector<MuonGroup> muon_groups(const ParameterLayout& layout);

struct MuonSettings {
  double lr = 0.02;
  double momentum = 0.95;
  double weight_decay = 0.0;
};
// The scalars of one step on matrices of oriented shape [m, n], shared by the CPU and CUDA versions.
struct MuonStepScalars {
  float momentum;
  float update_scale;  // lr * 0.2 * sqrt(n)
  float decay;         // 1 - lr * weight_decay
};
MuonStepScalars muon_scalars(const MuonSettings& settings, int64_t m, int64_t n);

// In place on x [m, n] (m <= n), row-major: x / (|x|_F + 1e-7), then the five iterations
// A = x xᵀ, x = a x + (b A + c A A) x. scratch is resized as needed.
void newton_schulz_cpu(float* x, int64_t m, int64_t n, std::vector<float>& scratch);

// One Muon step on one matrix [rows, cols] in host memory; `working` (BF16 bits of the
// updated parameters) may be null.
void muon_step_cpu(float* params, const float* grads, float* momentum, int64_t rows, int64_t cols,
                   const MuonStepScalars& scalars, uint16_t* working, std::vector<float>& scratch);
// muon_step_cpu in two halves, as the CUDA step splits it (kernels/muon.cuh):
// the momentum update and the Nesterov update u written to `oriented` [m, n] (transposed
// when tall); then Newton-Schulz on `oriented` in place and the update of params.
void muon_momentum_cpu(const float* grads, float* momentum, int64_t rows, int64_t cols, float beta, float* oriented);
void muon_apply_cpu(float* params, float* oriented, int64_t rows, int64_t cols, const MuonStepScalars& scalars,
                    uint16_t* working, std::vector<float>& scratch);

// Where the CUDA step keeps its transient data for the largest group, in one block of
// scratch memory (256-byte aligned parts): the group's matrix table, where each matrix's
// momentum is (the slab offsets, or places in a staging slot), the per-block
// partial sums of the norms, two BF16 [count, m, n] iterates, and the BF16 [count, m, m]
// products A and B.
struct MuonWorkspace {
  static constexpr int kNormBlocks = 32;  // partial sums per matrix
  size_t table = 0, momentum_table = 0, partials = 0, x = 0, x_next = 0, a = 0, b = 0;  // byte offsets
  size_t bytes = 0;                                                  // in all
  static MuonWorkspace for_group(const MuonGroup& group);
  static size_t bytes_for(const std::vector<MuonGroup>& groups);  // the largest group's
};

}  // namespace tandem
