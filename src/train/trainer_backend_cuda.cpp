#include <cuda_runtime.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

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
    for (int slot = 0; slot < 2; ++slot) {
      if (slots_[slot].bounce) cudaFreeHost(slots_[slot].bounce);
      for (cudaEvent_t event : {slots_[slot].loaded, slots_[slot].updated, slots_[slot].written})
        if (event) cudaEventDestroy(event);
    }
    for (cudaStream_t stream : {load_stream_, write_stream_})
      if (stream) cudaStreamDestroy(stream);
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

  void adamw_step_runs(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                       std::span<const AdamWRun> runs, const AdamWStepScalars& decayed,
                       const AdamWStepScalars& undecayed, uint16_t* working) override {
    cuda::adamw_step_runs(params, grads, exp_avg, exp_avg_sq, runs, decayed, undecayed, working, ops_.stream());
  }

  void muon_momentum(const MuonGroup& group, size_t first, size_t last, const float* grads, float* momentum,
                     std::span<const int64_t> momentum_offsets, float beta, void* scratch) override {
    cuda::muon_momentum(group, first, last, grads, momentum, momentum_offsets.empty() ? nullptr : momentum_offsets.data(),
                        beta, scratch, ops_.stream());
  }

  void muon_orthogonalize(const MuonGroup& group, float* params, uint16_t* working, const MuonStepScalars& scalars,
                          void* scratch) override {
    if (!cublas_) {  // only a Muon trainer needs cuBLAS's own handle
      if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("CUDA trainer backend: cublasCreate failed");
      cublasSetStream(cublas_, ops_.stream());
    }
    cuda::muon_orthogonalize(group, params, working, scalars, scratch, cublas_, ops_.stream());
  }

  void load_state(int slot, float* staging, std::span<const StateTransfer> copies) override {
    start_streaming();
    Slot& s = slots_[slot];
    check_cuda(cudaEventSynchronize(s.written), "waiting for a state write-back");
    flush(s);  // the slot's bounce buffer is about to be refilled
    const bool bounce = needs_bounce(copies);
    size_t elements = 0;
    for (const StateTransfer& copy : copies) elements = std::max(elements, copy.staging_offset + copy.count);
    if (bounce) {
      reserve_bounce(s, elements);
      // On the host thread: the page faults of the mapped file are paid here, while the
      // device updates the previous chunk.
      for (const StateTransfer& copy : copies)
        std::memcpy(s.bounce + copy.staging_offset, copy.store, copy.count * sizeof(float));
      check_cuda(cudaMemcpyAsync(staging, s.bounce, elements * sizeof(float), cudaMemcpyHostToDevice, load_stream_),
                 "state chunk to the device");
    } else {
      for (const StateTransfer& copy : copies)
        check_cuda(cudaMemcpyAsync(staging + copy.staging_offset, copy.store, copy.count * sizeof(float),
                                   cudaMemcpyHostToDevice, load_stream_),
                   "state chunk to the device");
    }
    check_cuda(cudaEventRecord(s.loaded, load_stream_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(ops_.stream(), s.loaded, 0), "cudaStreamWaitEvent");
  }

  void write_back_state(int slot, const float* staging, std::span<const StateTransfer> copies) override {
    Slot& s = slots_[slot];
    check_cuda(cudaEventRecord(s.updated, ops_.stream()), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(write_stream_, s.updated, 0), "cudaStreamWaitEvent");
    if (needs_bounce(copies)) {
      size_t elements = 0;
      for (const StateTransfer& copy : copies) elements = std::max(elements, copy.staging_offset + copy.count);
      reserve_bounce(s, elements);
      check_cuda(cudaMemcpyAsync(s.bounce, staging, elements * sizeof(float), cudaMemcpyDeviceToHost, write_stream_),
                 "state chunk to the host");
      s.pending.assign(copies.begin(), copies.end());  // copied on to the store by flush()
    } else {
      for (const StateTransfer& copy : copies)
        check_cuda(cudaMemcpyAsync(copy.store, staging + copy.staging_offset, copy.count * sizeof(float),
                                   cudaMemcpyDeviceToHost, write_stream_),
                   "state chunk to the host");
    }
    check_cuda(cudaEventRecord(s.written, write_stream_), "cudaEventRecord");
  }

  void finish_state() override {
    if (!load_stream_) return;
    for (Slot& s : slots_) {
      check_cuda(cudaEventSynchronize(s.written), "waiting for a state write-back");
      flush(s);
    }
  }

 private:
  // A staging slot's events and, for a store the device cannot read, its pinned bounce
  // buffer and the copies still to be made from it to the store.
  struct Slot {
    cudaEvent_t loaded = nullptr, updated = nullptr, written = nullptr;
    float* bounce = nullptr;
    size_t bounce_elements = 0;
    std::vector<StateTransfer> pending;
  };

  void start_streaming() {
    if (load_stream_) return;
    check_cuda(cudaStreamCreateWithFlags(&load_stream_, cudaStreamNonBlocking), "cudaStreamCreate (state loads)");
    check_cuda(cudaStreamCreateWithFlags(&write_stream_, cudaStreamNonBlocking), "cudaStreamCreate (state write-backs)");
    for (Slot& s : slots_)
      for (cudaEvent_t* event : {&s.loaded, &s.updated, &s.written})
        check_cuda(cudaEventCreateWithFlags(event, cudaEventDisableTiming), "cudaEventCreate");
  }

  // Pinned or device-mapped host memory is copied directly; pageable memory (the state
  // file's mapping) through the bounce buffers: registering the mapping instead would pin
  // its pages, and the kernel could no longer write them back and reclaim them.
  static bool needs_bounce(std::span<const StateTransfer> copies) {
    if (copies.empty()) return false;
    cudaPointerAttributes attributes{};
    check_cuda(cudaPointerGetAttributes(&attributes, copies.front().store), "cudaPointerGetAttributes");
    return attributes.type == cudaMemoryTypeUnregistered;
  }

  static void reserve_bounce(Slot& s, size_t elements) {
    if (s.bounce_elements >= elements) return;
    if (s.bounce) check_cuda(cudaFreeHost(s.bounce), "cudaFreeHost");
    s.bounce = nullptr;
    check_cuda(cudaMallocHost(&s.bounce, elements * sizeof(float)), "cudaMallocHost (state bounce buffer)");
    s.bounce_elements = elements;
  }

  // The slot's finished write-back from its bounce buffer into the store.
  static void flush(Slot& s) {
    for (const StateTransfer& copy : s.pending)
      std::memcpy(copy.store, s.bounce + copy.staging_offset, copy.count * sizeof(float));
    s.pending.clear();
  }

  CudaOps ops_;
  double* reduction_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudaStream_t load_stream_ = nullptr, write_stream_ = nullptr;
  Slot slots_[2];
};

}  // namespace

std::unique_ptr<TrainerBackend> make_cuda_trainer_backend() { return std::make_unique<CudaTrainerBackend>(); }

}  // namespace tandem
