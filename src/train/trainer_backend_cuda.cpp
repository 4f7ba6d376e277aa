#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "adamw.cuh"
#include "gradient_clipping.cuh"
#include "logprobs.cuh"
#include "muon.cuh"
#include "model/cuda_ops.h"
#include "train/trainer_backend.h"

namespace tandem {

namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("CUDA trainer backend: ") + what + ": " + cudaGetErrorString(status));
}

void require_f32(const Tensor& t, const char* op) {
  if (t.device != Device::CUDA || t.dtype != DType::F32 || !t.is_contiguous() || !t.data)
    throw std::invalid_argument(std::string("CUDA trainer backend: ") + op + " needs a contiguous F32 CUDA tensor, got " +
                                t.describe());
}

class CudaTrainerBackend final : public TrainerBackend {
 public:
  CudaTrainerBackend() {
    // The norm's result and the per-block partial sums: a few KB for the trainer's lifetime.
    check_cuda(cudaMalloc(&reduction_, (cuda::kSquareSumBlocks + 1) * sizeof(double)), "cudaMalloc (norm scratch)");
  }
  ~CudaTrainerBackend() override {
    cudaFree(reduction_);
    if (cublas_) cublasDestroy(cublas_);
  }
  CudaTrainerBackend(const CudaTrainerBackend&) = delete;
  CudaTrainerBackend& operator=(const CudaTrainerBackend&) = delete;

  Ops& ops() override { return ops_; }

  void copy_to_host(void* dst, const Tensor& src) override {
    if (src.device != Device::CUDA || !src.is_contiguous())
      throw std::invalid_argument("CUDA trainer backend: copy_to_host from " + src.describe());
    check_cuda(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, ops_.stream()), "copy to host");
    ops_.synchronize();
  }

  void synchronize() override { ops_.synchronize(); }

  void token_logprobs_forward(const Tensor& logp, const Tensor& entropy, const Tensor& lse, const Tensor& logits,
                              const Tensor& targets, const LogprobSettings& settings) override {
    cuda::token_logprobs_forward(logp, entropy, lse, logits, targets, settings.temperature, ops_.stream());
  }

  void token_logprobs_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& entropy,
                               const Tensor& dlogp, const Tensor& dentropy, const LogprobSettings& settings) override {
    cuda::token_logprobs_backward(logits, logits, targets, lse, entropy, dlogp, dentropy,
                                  settings.temperature, ops_.stream());
  }

  double square_sum(const Tensor& values) override {
    require_f32(values, "square_sum");
    cuda::square_sum(reduction_, reduction_ + 1, values.ptr<float>(), static_cast<size_t>(values.numel()),
                     ops_.stream());
    double sum = 0;
    check_cuda(cudaMemcpyAsync(&sum, reduction_, sizeof sum, cudaMemcpyDeviceToHost, ops_.stream()), "norm to host");
    ops_.synchronize();
    return sum;
  }

  void scale(const Tensor& values, float factor) override {
    require_f32(values, "scale");
    cuda::scale(values.ptr<float>(), static_cast<size_t>(values.numel()), factor, ops_.stream());
  }

  void adamw_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, size_t count,
                  const AdamWStepScalars& scalars, uint16_t* working) override {
    cuda::adamw_step(params, grads, exp_avg, exp_avg_sq, count, scalars, working, ops_.stream());
  }

  void muon_step(const MuonGroup& group, float* params, const float* grads, float* momentum, uint16_t* working,
                 const MuonStepScalars& scalars, void* scratch) override {
    if (!cublas_) {  // only a Muon trainer needs cuBLAS's own handle
      if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("CUDA trainer backend: cublasCreate failed");
      cublasSetStream(cublas_, ops_.stream());
    }
    cuda::muon_step(group, params, grads, momentum, working, scalars, scratch, cublas_, ops_.stream());
  }

 private:
  CudaOps ops_;
  double* reduction_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
};

}  // namespace

std::unique_ptr<TrainerBackend> make_cuda_trainer_backend() { return std::make_unique<CudaTrainerBackend>(); }

}  // namespace tandem
