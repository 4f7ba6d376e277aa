// CudaOps: the op interface over the kernel families in this folder.
#include "model/cuda_ops.h"

#include <stdexcept>
#include <string>

#include "attention.cuh"
#include "elementwise.cuh"
#include "embedding.cuh"
#include "matmul.cuh"
#include "qk_norm_rope.cuh"
#include "quantize.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "swiglu.cuh"

namespace tandem {

namespace {
void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string("CudaOps: ") + what + ": " + cudaGetErrorString(status));
}
}  // namespace

CudaOps::CudaOps(cudaStream_t stream) : stream_(stream) {
  if (!stream_) {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    owns_stream_ = true;
  }
  matmul_ = std::make_unique<cuda::MatmulContext>(cuda::make_matmul_context(stream_));
}

CudaOps::~CudaOps() {
  cudaStreamSynchronize(stream_);
  cuda::destroy_matmul_context(*matmul_);
  if (owns_stream_) cudaStreamDestroy(stream_);
}

void CudaOps::synchronize() const {
  check_cuda(cudaStreamSynchronize(stream_), "kernel failure (cudaStreamSynchronize)");
}

void CudaOps::copy_from_host(const Tensor& dst, const void* src) {
  // The host buffer may be a temporary of the caller: the copy completes before returning.
  queue_copy_from_host(dst, src);
  synchronize();
}

void CudaOps::queue_copy_from_host(const Tensor& dst, const void* src) {
  if (!dst.data || dst.device != Device::CUDA || !dst.is_contiguous())
    throw std::invalid_argument("CudaOps::copy_from_host: destination " + dst.describe());
  check_cuda(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, stream_), "copy_from_host");
}

void CudaOps::zero(const Tensor& dst) { cuda::zero(dst, stream_); }
void CudaOps::copy(const Tensor& dst, const Tensor& src) { cuda::copy(dst, src, stream_); }

void CudaOps::embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) {
  cuda::embedding_forward(out, table, ids, stream_);
}
void CudaOps::embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  cuda::embedding_backward(dtable, dout, ids, stream_);
}
void CudaOps::rmsnorm_forward(const ScaledRows& out, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                              float eps) {
  cuda::rmsnorm_forward(out, rstd, x, weight, eps, stream_);
}
void CudaOps::rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                               const Tensor& weight, const Tensor& rstd, GradWrite dx_write) {
  cuda::rmsnorm_backward(dx, dweight, dout, x, weight, rstd, dx_write, stream_);
}
void CudaOps::add_rmsnorm_forward(const ScaledRows& out, const Tensor& rstd, const Tensor& hidden,
                                  const ScaledRows& branch, const Tensor& weight, float eps) {
  cuda::add_rmsnorm_forward(out, rstd, hidden, branch, weight, eps, stream_);
}
void CudaOps::matmul_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  cuda::matmul_forward(*matmul_, out, x, weight, bias);
}
void CudaOps::fp8_matmul_forward(const Tensor& out, const Tensor& x, const Tensor& weight,
                                 const Tensor& weight_scale) {
  cuda::fp8_matmul_forward(*matmul_, out, x, weight, weight_scale);
}
void CudaOps::quantize_fp8(const Tensor& codes, const Tensor& scale, const Tensor& x) {
  cuda::quantize_fp8(codes, scale, x, stream_);
}
void CudaOps::matmul_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                              const Tensor& x, const Tensor& weight, GradWrite dx_write) {
  cuda::matmul_backward(*matmul_, dx, dweight, dbias, dout, x, weight, dx_write);
}
void CudaOps::rope_backward(const Tensor& dx, const Tensor& positions, const Tensor& inv_freq, int heads) {
  cuda::rope_backward(dx, positions, inv_freq, heads, stream_);
}

void CudaOps::rmsnorm_rope_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                                    const Tensor& weight, const Tensor& rstd, const Tensor& positions,
                                    const Tensor& inv_freq, int heads) {
  cuda::rmsnorm_rope_backward(dx, dweight, dout, x, weight, rstd, positions, inv_freq, heads, stream_);
}
void CudaOps::qk_norm_rope_forward(const Tensor& q_out, const Tensor& k_out, const Tensor& q, const Tensor& k,
                                   const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions,
                                   const Tensor& inv_freq, int heads, int kv_heads, float eps, const Tensor& q_rstd,
                                   const Tensor& k_rstd) {
  cuda::qk_norm_rope_forward(q_out, k_out, q, k, q_norm, k_norm, positions, inv_freq, heads, kv_heads, eps, q_rstd,
                             k_rstd, stream_);
}
void CudaOps::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& cu_seqlens, int heads, int kv_heads) {
  cuda::attention_forward(out, lse, q, k, v, cu_seqlens, heads, kv_heads, stream_);
}
void CudaOps::attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                 const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& cu_seqlens, int heads, int kv_heads,
                                 const AttentionScratch& scratch) {
  cuda::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, cu_seqlens, heads, kv_heads, scratch, stream_);
}
void CudaOps::swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) {
  cuda::swiglu_forward(out, gate, up, stream_);
}
void CudaOps::swiglu_forward(const ScaledRows& out, const ScaledRows& gate_up) {
  cuda::swiglu_forward(out, gate_up, stream_);
}
void CudaOps::swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                              const Tensor& up) {
  cuda::swiglu_backward(dgate, dup, dout, gate, up, stream_);
}

}  // namespace tandem
