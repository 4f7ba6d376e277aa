#include "rope.cuh"

#include "model/op_args.h"
#include "pointwise.cuh"

namespace tandem::cuda {

namespace {

// A thread's angles serve this many heads of its token: an accurate sincosf per rotated
// pair would cost about as much time as moving the pair through memory. Unless tokens
// are too few (decode) to occupy the GPU that way: then one head per thread.
constexpr int kHeadsPerThread = 4;
constexpr int64_t kBusyThreads = int64_t{1} << 17;

// Thread (token t, pack of N frequencies starting at i, blockIdx.y's group of
// heads_per_thread heads).
template <class T, int N>
__global__ void rope_backward_kernel(T* dx, const int32_t* positions, const float* inv_freq, int64_t tokens, int heads,
                                     int half, int heads_per_thread) {
  const int packs = half / N;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= tokens * packs) return;
  const int64_t t = item / packs;
  const int i = static_cast<int>(item % packs) * N;
  // The angle is rounded to FP32 before sin/cos, as transformers (and CpuOps) compute it.
  const float position = static_cast<float>(positions[t]);
  float cosines[N], sines[N];
#pragma unroll
  for (int k = 0; k < N; ++k) sincosf(position * inv_freq[i + k], &sines[k], &cosines[k]);
  const int first_head = blockIdx.y * heads_per_thread;
  const int last_head = min(heads, first_head + heads_per_thread);
  for (int h = first_head; h < last_head; ++h) {
    T* head = dx + (t * heads + h) * (2 * half);
    float x1[N], x2[N], y1[N], y2[N];
    load<N>(head + i, x1);
    load<N>(head + i + half, x2);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      y1[k] = x1[k] * cosines[k] + x2[k] * sines[k];
      y2[k] = x2[k] * cosines[k] - x1[k] * sines[k];
    }
    store<N>(head + i, y1);
    store<N>(head + i + half, y2);
  }
}

}  // namespace

void rope_backward(const Tensor& dx, const Tensor& positions, const Tensor& inv_freq, int heads,
                   cudaStream_t stream) {
  constexpr const char* op = "cuda::rope_backward";
  check_op_arg(dx, op, "dx", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  if (heads <= 0 || dx.shape[1] % heads != 0 || (dx.shape[1] / heads) % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": " + dx.describe() + " does not split into " +
                                std::to_string(heads) + " heads of even size");
  const int64_t T = dx.shape[0];
  const int half = static_cast<int>(dx.shape[1] / heads / 2);
  check_op_arg(positions, op, "positions", Device::CUDA, {DType::I32}, {T});
  check_op_arg(inv_freq, op, "inv_freq", Device::CUDA, {DType::F32}, {half});
  if (T == 0) return;
  dispatch_data(dx.dtype, [&](auto tag) {
    using E = decltype(tag);
    constexpr int kThreads = 128;
    auto launch = [&](auto kernel, int per_thread) {
      const int64_t items = T * (half / per_thread);
      const int group = items * ((heads + kHeadsPerThread - 1) / kHeadsPerThread) >= kBusyThreads ? kHeadsPerThread : 1;
      const dim3 grid(static_cast<unsigned>((items + kThreads - 1) / kThreads),
                      static_cast<unsigned>((heads + group - 1) / group));
      kernel<<<grid, kThreads, 0, stream>>>(dx.ptr<E>(), positions.ptr<int32_t>(), inv_freq.ptr<float>(), T, heads,
                                            half, group);
    };
    // Every head starts a multiple of head_dim = 2·half elements in, so packs of N line
    // up with 16 bytes whenever half is a multiple of N and dx itself is aligned.
    if (half % kPack<E> == 0 && aligned16(dx.data))
      launch(rope_backward_kernel<E, kPack<E>>, kPack<E>);
    else
      launch(rope_backward_kernel<E, 1>, 1);
    check_launch(op);
  });
}

}  // namespace tandem::cuda
