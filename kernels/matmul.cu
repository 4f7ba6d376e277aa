#include "matmul.cuh"

#include <cuda_bf16.h>

#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "model/op_args.h"

namespace tandem::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Every pointer is checked for this alignment, so the heuristic may assume it too (its
// default, 256 bytes, would wrongly promise more than a pool sub-allocation gives).
constexpr uint32_t kAlignment = 16;

void check_cublas(cublasStatus_t status, const std::string& op, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(op + ": " + call + " failed: " + cublasLtGetStatusName(status) + " (" +
                             cublasLtGetStatusString(status) + ")");
}

void check_cuda(cudaError_t status, const std::string& op, const char* call) {
  if (status != cudaSuccess) throw std::runtime_error(op + ": " + call + " failed: " + cudaGetErrorString(status));
}

void check_aligned(const Tensor& t, const std::string& op, const char* arg) {
  if (reinterpret_cast<uintptr_t>(t.data) % kAlignment != 0)
    throw std::invalid_argument(op + ": argument '" + arg + "' must be " + std::to_string(kAlignment) +
                                "-byte aligned, got " + t.describe() + " at offset " +
                                std::to_string(reinterpret_cast<uintptr_t>(t.data) % kAlignment));
}

void check_context(const MatmulContext& context, const std::string& op) {
  if (!context.plans)
    throw std::invalid_argument(op + ": the MatmulContext was not made by make_matmul_context, or was destroyed");
}

cudaDataType_t cuda_type(DType dtype) {
  return dtype == DType::BF16 ? CUDA_R_16BF : dtype == DType::F8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_32F;
}

template <class T>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value,
                   const std::string& op) {
  check_cublas(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value), op,
               "cublasLtMatmulDescSetAttribute");
}

template <class T>
void set_preference(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
                    const T& value, const std::string& op) {
  check_cublas(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof value), op,
               "cublasLtMatmulPreferenceSetAttribute");
}

// dbias[o] += Σ_n dout[n, o] in FP32. A block owns kColumns columns and walks all rows, so
// each sum is added by one thread in a fixed order: deterministic, no atomics. cuBLASLt's
// BGRADB epilogue would overwrite dbias instead of adding, and only rides along with dW.
constexpr int kColumns = 32, kRowLanes = 16;

template <class T>
__global__ void add_column_sums_kernel(float* dbias, const T* dout, int64_t rows, int64_t cols) {
  __shared__ float partial[kRowLanes][kColumns];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  float sum = 0.0f;
  if (col < cols)
    for (int64_t row = threadIdx.y; row < rows; row += kRowLanes) sum += static_cast<float>(dout[row * cols + col]);
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || col >= cols) return;
  for (int lane = 1; lane < kRowLanes; ++lane) sum += partial[lane][threadIdx.x];
  dbias[col] += sum;
}

void add_column_sums(const Tensor& dbias, const Tensor& dout, cudaStream_t stream, const std::string& op) {
  const int64_t rows = dout.shape[0], cols = dout.shape[1];
  if (rows == 0 || cols == 0) return;
  const dim3 block(kColumns, kRowLanes);
  const auto blocks = static_cast<unsigned>((cols + kColumns - 1) / kColumns);
  if (dout.dtype == DType::BF16)
    add_column_sums_kernel<<<blocks, block, 0, stream>>>(dbias.ptr<float>(), dout.ptr<__nv_bfloat16>(), rows, cols);
  else
    add_column_sums_kernel<<<blocks, block, 0, stream>>>(dbias.ptr<float>(), dout.ptr<float>(), rows, cols);
  check_cuda(cudaGetLastError(), op, "add_column_sums_kernel launch");
}

// One GEMM in cuBLASLt's column-major terms: D [m,n] = op(A) · op(B) (+ bias [m]) + beta·C.
// A row-major [R,C] tensor is the column-major [C,R] matrix of its transpose, so the
// row-major products are computed transposed without moving data (see the callers).
struct GemmShape {
  cublasOperation_t trans_a, trans_b;
  uint64_t m, n, k;
  DType ab_type, c_type;
  bool bias;
  auto operator<=>(const GemmShape&) const = default;

  std::string describe() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " " + dtype_name(ab_type) + "->" +
           dtype_name(c_type) + (trans_a == CUBLAS_OP_T ? " A^T" : " A") + (trans_b == CUBLAS_OP_T ? " B^T" : " B") +
           (bias ? " +bias" : "");
  }
};

// The descriptors of one GEMM shape and the algorithm the heuristic chose for it.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    for (cublasLtMatrixLayout_t layout : {a, b, c})
      if (layout) cublasLtMatrixLayoutDestroy(layout);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }

  void build(const GemmShape& shape, const MatmulContext& context, const std::string& op) {
    // FP32 accumulation and FP32 alpha/beta; CUBLAS_COMPUTE_32F never uses TF32.
    check_cublas(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), op, "cublasLtMatmulDescCreate");
    set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, shape.trans_a, op);
    set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, shape.trans_b, op);
    if (shape.bias) {
      set_attribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS, op);
      set_attribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cuda_type(shape.c_type)), op);
    }
    // Stored extents (before op): op(A) is m×k, op(B) is k×n; every matrix is dense.
    const auto layout = [&](cublasLtMatrixLayout_t* made, DType type, uint64_t rows, uint64_t cols) {
      check_cublas(cublasLtMatrixLayoutCreate(made, cuda_type(type), rows, cols, static_cast<int64_t>(rows)), op,
                   "cublasLtMatrixLayoutCreate");
    };
    const bool ta = shape.trans_a == CUBLAS_OP_T, tb = shape.trans_b == CUBLAS_OP_T;
    layout(&a, shape.ab_type, ta ? shape.k : shape.m, ta ? shape.m : shape.k);
    layout(&b, shape.ab_type, tb ? shape.n : shape.k, tb ? shape.k : shape.n);
    layout(&c, shape.c_type, shape.m, shape.n);

    cublasLtMatmulPreference_t made_preference = nullptr;
    check_cublas(cublasLtMatmulPreferenceCreate(&made_preference), op, "cublasLtMatmulPreferenceCreate");
    const std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                          decltype(&cublasLtMatmulPreferenceDestroy)>
        preference(made_preference, &cublasLtMatmulPreferenceDestroy);
    set_preference(preference.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                   static_cast<uint64_t>(context.workspace_bytes), op);
    for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                           CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      set_preference(preference.get(), attribute, kAlignment, op);

    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(context.handle, desc, a, b, c, c, preference.get(), 1, &result, &found);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0)
      throw std::runtime_error(op + ": cuBLASLt has no algorithm for GEMM " + shape.describe() + ": " +
                               cublasLtGetStatusName(status) + " (" + cublasLtGetStatusString(status) + ")");
    algo = result.algo;
  }
};

}  // namespace

struct MatmulPlans {
  std::map<GemmShape, Plan> plans;

  const Plan& plan_for(const GemmShape& shape, const MatmulContext& context, const std::string& op) {
    const auto [it, made] = plans.try_emplace(shape);
    if (!made) return it->second;
    try {
      it->second.build(shape, context, op);
    } catch (...) {
      plans.erase(it);
      throw;
    }
    return it->second;
  }
};

namespace {

// D = op(A)·op(B) (+ bias) + beta·C with D and C the same buffer; FP8 operands with
// A's scale (a device FP32), where D = (op(A)·op(B))·a_scale.
void run_gemm(const MatmulContext& context, const std::string& op, const GemmShape& shape, const void* a,
              const void* b, void* c, float beta, const void* bias, const float* a_scale = nullptr) {
  // An empty product adds nothing (the callers keep k > 0 when beta is 0).
  if (shape.m == 0 || shape.n == 0 || shape.k == 0) return;
  const Plan& plan = context.plans->plan_for(shape, context, op);
  if (shape.bias) set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, op);
  if (a_scale) set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale, op);
  const float alpha = 1.0f;
  check_cublas(cublasLtMatmul(context.handle, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, c, plan.c, c, plan.c,
                              &plan.algo, context.workspace, context.workspace_bytes, context.stream),
               op, "cublasLtMatmul");
}

}  // namespace

MatmulContext make_matmul_context(cudaStream_t stream) {
  const std::string op = "cuda::make_matmul_context";
  MatmulContext context;
  context.stream = stream;
  check_cublas(cublasLtCreate(&context.handle), op, "cublasLtCreate");
  const cudaError_t status = cudaMalloc(&context.workspace, kWorkspaceBytes);
  if (status != cudaSuccess) {
    cublasLtDestroy(context.handle);
    check_cuda(status, op, "cudaMalloc of the 32 MiB workspace");
  }
  context.workspace_bytes = kWorkspaceBytes;
  context.plans = new MatmulPlans;
  return context;
}

void destroy_matmul_context(MatmulContext& context) {
  delete context.plans;
  if (context.workspace) cudaFree(context.workspace);  // waits for the GEMMs still using it
  if (context.handle) cublasLtDestroy(context.handle);
  context = MatmulContext{};
}

void matmul_forward(const MatmulContext& context, const Tensor& out, const Tensor& x, const Tensor& weight,
                    const Tensor& bias) {
  const std::string op = "cuda::matmul_forward";
  check_context(context, op);
  check_op_arg(x, op.c_str(), "x", Device::CUDA, {DType::BF16, DType::F32}, {kAnyExtent, kAnyExtent});
  const DType data = x.dtype;
  const int64_t N = x.shape[0], I = x.shape[1];
  check_op_arg(weight, op.c_str(), "weight", Device::CUDA, {data}, {kAnyExtent, I});
  const int64_t O = weight.shape[0];
  check_op_arg(out, op.c_str(), "out", Device::CUDA, {data}, {N, O});
  if (bias.data) check_op_arg(bias, op.c_str(), "bias", Device::CUDA, {data}, {O});
  check_aligned(x, op, "x");
  check_aligned(weight, op, "weight");
  check_aligned(out, op, "out");
  if (bias.data) check_aligned(bias, op, "bias");
  if (I == 0) throw std::invalid_argument(op + ": x " + x.describe() + " has no columns");
  // outᵀ [O,N] = (weight as col-major [I,O])ᵀ · (x as col-major [I,N]).
  const GemmShape shape{CUBLAS_OP_T, CUBLAS_OP_N, static_cast<uint64_t>(O), static_cast<uint64_t>(N),
                        static_cast<uint64_t>(I), data, data, bias.data != nullptr};
  run_gemm(context, op, shape, weight.data, x.data, out.data, 0.0f, bias.data);
}

void fp8_matmul_forward(const MatmulContext& context, const Tensor& out, const Tensor& x, const Tensor& weight,
                        const Tensor& weight_scale) {
  const std::string op = "cuda::fp8_matmul_forward";
  check_context(context, op);
  check_op_arg(x, op.c_str(), "x", Device::CUDA, {DType::F8_E4M3}, {kAnyExtent, kAnyExtent});
  const int64_t N = x.shape[0], I = x.shape[1];
  check_op_arg(weight, op.c_str(), "weight", Device::CUDA, {DType::F8_E4M3}, {kAnyExtent, I});
  const int64_t O = weight.shape[0];
  check_op_arg(out, op.c_str(), "out", Device::CUDA, {DType::BF16, DType::F32}, {N, O});
  check_op_arg(weight_scale, op.c_str(), "weight_scale", Device::CUDA, {DType::F32}, {1});
  check_aligned(x, op, "x");
  check_aligned(weight, op, "weight");
  check_aligned(out, op, "out");
  // cuBLASLt's FP8 products want the inner extent and every leading dimension in 16s.
  if (I % 16 != 0 || O % 16 != 0)
    throw std::invalid_argument(op + ": FP8 products need the in and out widths in multiples of 16, got weight " +
                                weight.describe());
  // outᵀ [O,N] = (weight as col-major [I,O])ᵀ · (x as col-major [I,N]): FP8's "TN" form.
  const GemmShape shape{CUBLAS_OP_T, CUBLAS_OP_N, static_cast<uint64_t>(O), static_cast<uint64_t>(N),
                        static_cast<uint64_t>(I), DType::F8_E4M3, out.dtype, false};
  run_gemm(context, op, shape, weight.data, x.data, out.data, 0.0f, nullptr, weight_scale.ptr<float>());
}

void matmul_backward(const MatmulContext& context, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                     const Tensor& dout, const Tensor& x, const Tensor& weight, GradWrite dx_write) {
  const std::string op = "cuda::matmul_backward";
  check_context(context, op);
  check_op_arg(x, op.c_str(), "x", Device::CUDA, {DType::BF16, DType::F32}, {kAnyExtent, kAnyExtent});
  const DType data = x.dtype;
  const int64_t N = x.shape[0], I = x.shape[1];
  check_op_arg(weight, op.c_str(), "weight", Device::CUDA, {data}, {kAnyExtent, I});
  const int64_t O = weight.shape[0];
  check_op_arg(dout, op.c_str(), "dout", Device::CUDA, {data}, {N, O});
  if (dx.data) check_op_arg(dx, op.c_str(), "dx", Device::CUDA, {data}, {N, I});
  if (dweight.data) check_op_arg(dweight, op.c_str(), "dweight", Device::CUDA, {DType::F32}, {O, I});
  if (dbias.data) check_op_arg(dbias, op.c_str(), "dbias", Device::CUDA, {DType::F32}, {O});
  check_aligned(x, op, "x");
  check_aligned(weight, op, "weight");
  check_aligned(dout, op, "dout");
  if (dx.data) check_aligned(dx, op, "dx");
  if (dweight.data) check_aligned(dweight, op, "dweight");
  if (dbias.data) check_aligned(dbias, op, "dbias");
  const auto n = static_cast<uint64_t>(N), i = static_cast<uint64_t>(I), o = static_cast<uint64_t>(O);
  // dxᵀ [I,N] (+)= (weight as col-major [I,O]) · (dout as col-major [O,N]).
  const bool overwrite = dx_write == GradWrite::overwrite;
  if (dx.data && o == 0 && overwrite)  // no GEMM runs for an empty product: dx is its zero
    check_cuda(cudaMemsetAsync(dx.data, 0, dx.nbytes(), context.stream), op, "cudaMemsetAsync of dx");
  if (dx.data)
    run_gemm(context, op, {CUBLAS_OP_N, CUBLAS_OP_N, i, n, o, data, data, false}, weight.data, dout.data, dx.data,
             overwrite ? 0.0f : 1.0f, nullptr);
  // dweightᵀ [I,O] += (x as col-major [I,N]) · (dout as col-major [O,N])ᵀ, into FP32.
  if (dweight.data)
    run_gemm(context, op, {CUBLAS_OP_N, CUBLAS_OP_T, i, o, n, data, DType::F32, false}, x.data, dout.data,
             dweight.data, 1.0f, nullptr);
  if (dbias.data) add_column_sums(dbias, dout, context.stream, op);
}

}  // namespace tandem::cuda
