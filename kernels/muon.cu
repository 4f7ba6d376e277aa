#include <cuda_bf16.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "block_sum.cuh"
#include "muon.cuh"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kNormBlocks = MuonWorkspace::kNormBlocks;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string("cuda::muon: ") + what + ": " + cudaGetErrorString(status));
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuda::muon: ") + what + " failed: " + cublasGetStatusString(status));
}

// A table entry: the matrix's slab offset times 2, plus 1 when it is stored tall.
__device__ int64_t entry_offset(int64_t entry) { return entry >> 1; }
__device__ bool entry_transposed(int64_t entry) { return entry & 1; }

// Index in the oriented [m, n] iterate of element i of a matrix stored [rows, cols].
__device__ size_t oriented_index(size_t i, bool transposed, int64_t m, int64_t n) {
  if (!transposed) return i;
  const size_t rows = static_cast<size_t>(n), cols = static_cast<size_t>(m);
  return (i % cols) * rows + i / cols;
}

// The Nesterov update, in the CPU twin's rounding order.
__device__ float nesterov(float g, float buf, float momentum) {
  return __fadd_rn(__fmul_rn(__fsub_rn(1.0f, momentum), g), __fmul_rn(momentum, buf));
}

// grid (kNormBlocks, count): momentum update, and per block the sum of squares of u.
// momentum_table: where each matrix's momentum starts in `momentum`.
__global__ void momentum_kernel(const int64_t* table, const int64_t* momentum_table, const float* __restrict__ grads,
                                float* __restrict__ momentum, size_t elements, float beta, double* partials) {
  const float* g = grads + entry_offset(table[blockIdx.y]);
  float* buf = momentum + momentum_table[blockIdx.y];
  double sum = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(kThreads) + threadIdx.x; i < elements;
       i += static_cast<size_t>(kNormBlocks) * kThreads) {
    const float b = __fadd_rn(__fmul_rn(beta, buf[i]), __fmul_rn(__fsub_rn(1.0f, beta), g[i]));
    buf[i] = b;
    const double u = nesterov(g[i], b, beta);
    sum += u * u;
  }
  const double total = block_sum<kThreads>(sum);
  if (threadIdx.x == 0) partials[blockIdx.y * kNormBlocks + blockIdx.x] = total;
}

// grid (blocks, count): x = bf16(u / (|u| + eps)) in the oriented layout.
__global__ void pack_kernel(const int64_t* table, const int64_t* momentum_table, const float* __restrict__ grads,
                            const float* __restrict__ momentum, const double* partials, int64_t m, int64_t n, float beta,
                            __nv_bfloat16* x) {
  __shared__ float inverse;
  if (threadIdx.x == 0) {
    double sum = 0;
    for (int b = 0; b < kNormBlocks; ++b) sum += partials[blockIdx.y * kNormBlocks + b];
    inverse = 1.0f / (static_cast<float>(sqrt(sum)) + kMuonNormEps);
  }
  __syncthreads();
  const int64_t entry = table[blockIdx.y];
  const float* g = grads + entry_offset(entry);
  const float* buf = momentum + momentum_table[blockIdx.y];
  const size_t elements = static_cast<size_t>(m * n);
  __nv_bfloat16* out = x + blockIdx.y * elements;
  for (size_t i = blockIdx.x * static_cast<size_t>(kThreads) + threadIdx.x; i < elements;
       i += static_cast<size_t>(gridDim.x) * kThreads)
    out[oriented_index(i, entry_transposed(entry), m, n)] = __float2bfloat16_rn(nesterov(g[i], buf[i], beta) * inverse);
}

// b = coefficient_b a + coefficient_a I, over [count, m, m].
__global__ void diagonal_kernel(__nv_bfloat16* b, const __nv_bfloat16* a, int64_t m, size_t total) {
  for (size_t i = blockIdx.x * static_cast<size_t>(kThreads) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * kThreads) {
    const size_t within = i % static_cast<size_t>(m * m);
    const bool diagonal = within / m == within % m;
    b[i] = __float2bfloat16_rn(kNewtonSchulzB * __bfloat162float(a[i]) + (diagonal ? kNewtonSchulzA : 0.0f));
  }
}

// grid (blocks, count): p = p decay - scale x, and the working copy.
__global__ void apply_kernel(const int64_t* table, float* __restrict__ params, const __nv_bfloat16* x, int64_t m,
                             int64_t n, MuonStepScalars k, __nv_bfloat16* working) {
  const int64_t entry = table[blockIdx.y];
  const int64_t offset = entry_offset(entry);
  const size_t elements = static_cast<size_t>(m * n);
  const __nv_bfloat16* update = x + blockIdx.y * elements;
  for (size_t i = blockIdx.x * static_cast<size_t>(kThreads) + threadIdx.x; i < elements;
       i += static_cast<size_t>(gridDim.x) * kThreads) {
    const float o = __bfloat162float(update[oriented_index(i, entry_transposed(entry), m, n)]);
    const float p = __fsub_rn(__fmul_rn(params[offset + i], k.decay), __fmul_rn(k.update_scale, o));
    params[offset + i] = p;
    if (working) working[offset + i] = __float2bfloat16_rn(p);
  }
}

// C [count] = alpha op(A) op(B) + beta C, column-major, BF16 in and out, FP32 accumulation.
void batched_gemm(cublasHandle_t cublas, cublasOperation_t op_a, cublasOperation_t op_b, int64_t rows, int64_t cols,
                  int64_t inner, float alpha, const __nv_bfloat16* a, int64_t lda, int64_t stride_a,
                  const __nv_bfloat16* b, int64_t ldb, int64_t stride_b, float beta, __nv_bfloat16* c, int64_t ldc,
                  int64_t stride_c, int count) {
  check(cublasGemmStridedBatchedEx(cublas, op_a, op_b, static_cast<int>(rows), static_cast<int>(cols),
                                   static_cast<int>(inner), &alpha, a, CUDA_R_16BF, static_cast<int>(lda), stride_a, b,
                                   CUDA_R_16BF, static_cast<int>(ldb), stride_b, &beta, c, CUDA_R_16BF,
                                   static_cast<int>(ldc), stride_c, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
}

struct WorkspaceParts {
  int64_t *table, *momentum_table;
  double* partials;
  __nv_bfloat16 *x, *x_next, *a, *b;
};

WorkspaceParts parts_of(const MuonGroup& group, void* workspace) {
  const MuonWorkspace layout = MuonWorkspace::for_group(group);
  auto* base = static_cast<char*>(workspace);
  return {reinterpret_cast<int64_t*>(base + layout.table), reinterpret_cast<int64_t*>(base + layout.momentum_table),
          reinterpret_cast<double*>(base + layout.partials), reinterpret_cast<__nv_bfloat16*>(base + layout.x),
          reinterpret_cast<__nv_bfloat16*>(base + layout.x_next), reinterpret_cast<__nv_bfloat16*>(base + layout.a),
          reinterpret_cast<__nv_bfloat16*>(base + layout.b)};
}

unsigned element_blocks(const MuonGroup& group) {
  const size_t elements = static_cast<size_t>(group.m * group.n);
  return static_cast<unsigned>(std::min<size_t>((elements + kThreads - 1) / kThreads, 64));
}

}  // namespace

void muon_momentum(const MuonGroup& group, size_t first, size_t last, const float* grads, float* momentum,
                   const int64_t* momentum_offsets, float beta, void* workspace, cudaStream_t stream) {
  if (first >= last) return;
  const int count = static_cast<int>(last - first);
  const int64_t m = group.m, n = group.n;
  const WorkspaceParts w = parts_of(group, workspace);
  // Pageable sources: cudaMemcpyAsync has read them by the time it returns.
  std::vector<int64_t> entries, momentum_entries;
  for (size_t j = first; j < last; ++j) {
    const MuonMatrix& matrix = group.matrices[j];
    entries.push_back(matrix.offset * 2 + (matrix.transposed ? 1 : 0));
    momentum_entries.push_back(momentum_offsets ? momentum_offsets[j - first] : matrix.offset);
  }
  check(cudaMemcpyAsync(w.table + first, entries.data(), entries.size() * sizeof(int64_t), cudaMemcpyHostToDevice,
                        stream),
        "matrix table upload");
  check(cudaMemcpyAsync(w.momentum_table + first, momentum_entries.data(), momentum_entries.size() * sizeof(int64_t),
                        cudaMemcpyHostToDevice, stream),
        "momentum table upload");
  const size_t elements = static_cast<size_t>(m * n);
  double* partials = w.partials + first * kNormBlocks;
  momentum_kernel<<<dim3(kNormBlocks, count), kThreads, 0, stream>>>(w.table + first, w.momentum_table + first, grads,
                                                                      momentum, elements, beta, partials);
  pack_kernel<<<dim3(element_blocks(group), count), kThreads, 0, stream>>>(
      w.table + first, w.momentum_table + first, grads, momentum, partials, m, n, beta, w.x + first * elements);
  check(cudaGetLastError(), "momentum and pack kernels");
}

void muon_orthogonalize(const MuonGroup& group, float* params, uint16_t* working, const MuonStepScalars& scalars,
                        void* workspace, cublasHandle_t cublas, cudaStream_t stream) {
  const int count = static_cast<int>(group.matrices.size());
  if (count == 0) return;
  const int64_t m = group.m, n = group.n;
  const WorkspaceParts w = parts_of(group, workspace);
  __nv_bfloat16 *x = w.x, *x_next = w.x_next, *a = w.a, *b = w.b;
  // Row-major X [m, n] is column-major Y = Xᵀ [n, m] with leading dimension n.
  const size_t products = static_cast<size_t>(count) * static_cast<size_t>(m * m);
  const unsigned product_blocks = static_cast<unsigned>(std::min<size_t>((products + kThreads - 1) / kThreads, 4096));
  for (int step = 0; step < kNewtonSchulzSteps; ++step) {
    // A = X Xᵀ: column-major Yᵀ Y.
    batched_gemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, m, n, 1.0f, x, n, m * n, x, n, m * n, 0.0f, a, m, m * m, count);
    diagonal_kernel<<<product_blocks, kThreads, 0, stream>>>(b, a, m, products);
    check(cudaGetLastError(), "diagonal kernel");
    // B += c A A.
    batched_gemm(cublas, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, kNewtonSchulzC, a, m, m * m, a, m, m * m, 1.0f, b, m,
                 m * m, count);
    // X' = B X: column-major Y' = Y Bᵀ.
    batched_gemm(cublas, CUBLAS_OP_N, CUBLAS_OP_T, n, m, m, 1.0f, x, n, m * n, b, m, m * m, 0.0f, x_next, n, m * n,
                 count);
    std::swap(x, x_next);
  }
  apply_kernel<<<dim3(element_blocks(group), count), kThreads, 0, stream>>>(w.table, params, x, m, n, scalars,
                                                                            reinterpret_cast<__nv_bfloat16*>(working));
  check(cudaGetLastError(), "apply kernel");
}

}  // namespace tandem::cuda
