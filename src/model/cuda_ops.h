// The CUDA backend of the Ops interface: BF16 (or F32) weights and activations, FP32
// accumulation and statistics, FP32 weight gradients. Each op family is one file in
// kernels/ with its CPU twin in CpuOps and a test comparing the two on fresh random
// inputs (tests/gpu_ops_*.cpp). All work is queued on one stream; the backend waits only
// where the interface hands data back to the host.
#pragma once
#include <cuda_runtime.h>

#include <memory>

#include "model/ops.h"

namespace tandem {

namespace cuda {
struct MatmulContext;
}

class CudaOps final : public Ops {
 public:
  // The stream is borrowed; null means a new stream owned by this object.
  explicit CudaOps(cudaStream_t stream = nullptr);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  Device device() const override { return Device::CUDA; }
  cudaStream_t stream() const { return stream_; }
  // Waits for the queued work and turns a kernel fault into an exception.
  void synchronize() const;

  void copy_from_host(const Tensor& dst, const void* src) override;
  void queue_copy_from_host(const Tensor& dst, const void* src) override;
  void zero(const Tensor& dst) override;
  void copy(const Tensor& dst, const Tensor& src) override;

  void embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) override;
  void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) override;

  void rmsnorm_forward(const ScaledRows& out, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                       float eps) override;
  void rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                        const Tensor& weight, const Tensor& rstd, GradWrite dx_write) override;
  void add_rmsnorm_forward(const ScaledRows& out, const Tensor& rstd, const Tensor& hidden, const ScaledRows& branch,
                           const Tensor& weight, float eps) override;

  void matmul_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias) override;
  void fp8_matmul_forward(const Tensor& out, const Tensor& x, const Tensor& weight,
                          const Tensor& weight_scale) override;
  void quantize_fp8(const Tensor& codes, const Tensor& scale, const Tensor& x) override;
  void matmul_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                       const Tensor& x, const Tensor& weight, GradWrite dx_write) override;

  void rope_backward(const Tensor& dx, const Tensor& positions, const Tensor& inv_freq, int heads) override;
  void rmsnorm_rope_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                             const Tensor& weight, const Tensor& rstd, const Tensor& positions, const Tensor& inv_freq,
                             int heads) override;
  void qk_norm_rope_forward(const Tensor& q_out, const Tensor& k_out, const Tensor& q, const Tensor& k,
                            const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions, const Tensor& inv_freq,
                            int heads, int kv_heads, float eps, const Tensor& q_rstd,
                            const Tensor& k_rstd) override;

  void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& cu_seqlens, int heads, int kv_heads) override;
  void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                          const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& cu_seqlens, int heads, int kv_heads,
                          const AttentionScratch& scratch) override;

  void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) override;
  void swiglu_forward(const ScaledRows& out, const ScaledRows& gate_up) override;
  void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                       const Tensor& up) override;

 private:
  cudaStream_t stream_ = nullptr;
  bool owns_stream_ = false;
  std::unique_ptr<cuda::MatmulContext> matmul_;
};

}  // namespace tandem
