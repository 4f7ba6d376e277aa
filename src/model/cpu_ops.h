// The FP32 CPU backend: the reference every other backend is checked against. Plain
// loops, OpenMP across rows/heads where the work is large enough to pay for it.
#pragma once
#include <cstdint>

#include "model/ops.h"

namespace tandem {

// Below this many multiply-adds a CPU loop runs on one thread: waking the team costs more
// than it saves, and far more on a loaded machine, where spinning threads wait for a core.
inline constexpr int64_t kCpuParallelWork = 1 << 16;

class CpuOps final : public Ops {
 public:
  Device device() const override { return Device::CPU; }

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

  // RoPE in place on x, the last piece of qk_norm_rope_forward here; not an Ops entry
  // point, as the other backends rotate inside their fused kernel alone.
  void rope_forward(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, int heads);
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
};

}  // namespace tandem
