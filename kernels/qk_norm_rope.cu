#include "qk_norm_rope.cuh"

#include <string>
#include <type_traits>

#include "model/op_args.h"
#include "pointwise.cuh"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 128;
// Blocks that keep every SM of a large GPU (132 on an H200) busy.
constexpr int64_t kBusyBlocks = 256;

// Packs of N elements a lane holds in each half of a head: 8 elements, 16 in all.
template <int N>
inline constexpr int kPairsPerLane = 8 / N;

// One head of one token per team of S lanes (a power of two up to a warp): row r of the
// tokens·(heads + kv_heads) rows is token r / (heads + kv_heads), q's heads first, then
// k's. Lane i holds packs i, i + S, ... of the first half and the same packs of the
// second half: the dims that rotate together, so only the norm's sum crosses lanes.
// Every thread computes its own angles: a head's sincosf are cheap next to a launch.
// q_rstd and k_rstd are null unless the caller keeps each head's 1/rms (training).
template <class T, int N, int S, bool Norm>
__global__ void __launch_bounds__(kThreads)
    qk_norm_rope_kernel(T* q_out, T* k_out, const T* q, const T* k, const T* q_norm, const T* k_norm,
                        float* q_rstd, float* k_rstd, const int32_t* positions, const float* inv_freq,
                        int64_t tokens, int heads, int kv_heads, int half, float eps) {
  constexpr int L = kPairsPerLane<N>;
  const int heads_per_token = heads + kv_heads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / S) + threadIdx.x / S;
  if (row >= tokens * heads_per_token) return;  // the whole team, so no lane waits in its sum
  const int lane = threadIdx.x % S;
  const int64_t t = row / heads_per_token;
  const int h = static_cast<int>(row % heads_per_token);
  const bool is_q = h < heads;
  const int64_t offset = (is_q ? t * heads + h : t * kv_heads + (h - heads)) * 2 * half;
  const T* in = (is_q ? q : k) + offset;
  T* out = (is_q ? q_out : k_out) + offset;
  const int packs = half / N;
  float x1[L][N], x2[L][N];
#pragma unroll
  for (int j = 0; j < L; ++j) {
    const int p = lane + j * S;
    if (p >= packs) continue;
    load<N>(in + p * N, x1[j]);
    load<N>(in + half + p * N, x2[j]);
  }
  if constexpr (Norm) {
    const T* weight = is_q ? q_norm : k_norm;
    float sum = 0;
#pragma unroll
    for (int j = 0; j < L; ++j) {
      if (lane + j * S >= packs) continue;
#pragma unroll
      for (int e = 0; e < N; ++e) sum += x1[j][e] * x1[j][e] + x2[j][e] * x2[j][e];
    }
    const float r = 1.0f / sqrtf(group_sum<S>(sum, group_mask<S>()) / static_cast<float>(2 * half) + eps);
    float* rstd = is_q ? q_rstd : k_rstd;
    if (rstd && lane == 0) rstd[is_q ? t * heads + h : t * kv_heads + (h - heads)] = r;
#pragma unroll
    for (int j = 0; j < L; ++j) {
      const int p = lane + j * S;
      if (p >= packs) continue;
      float w1[N], w2[N];
      load<N>(weight + p * N, w1);
      load<N>(weight + half + p * N, w2);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        x1[j][e] = w1[e] * (x1[j][e] * r);
        x2[j][e] = w2[e] * (x2[j][e] * r);
      }
    }
  }
  // The angle is rounded to FP32 before sin/cos, as transformers (and CpuOps) compute it.
  const float position = static_cast<float>(positions[t]);
#pragma unroll
  for (int j = 0; j < L; ++j) {
    const int p = lane + j * S;
    if (p >= packs) continue;
    float y1[N], y2[N];
#pragma unroll
    for (int e = 0; e < N; ++e) {
      float sine, cosine;
      sincosf(position * inv_freq[p * N + e], &sine, &cosine);
      y1[e] = x1[j][e] * cosine - x2[j][e] * sine;
      y2[e] = x2[j][e] * cosine + x1[j][e] * sine;
    }
    store<N>(out + p * N, y1);
    store<N>(out + half + p * N, y2);
  }
}

}  // namespace

void qk_norm_rope_forward(const Tensor& q_out, const Tensor& k_out, const Tensor& q, const Tensor& k,
                          const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions, const Tensor& inv_freq,
                          int heads, int kv_heads, float eps, const Tensor& q_rstd, const Tensor& k_rstd,
                          cudaStream_t stream) {
  constexpr const char* op = "cuda::qk_norm_rope_forward";
  check_op_arg(q, op, "q", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  if (heads <= 0 || kv_heads <= 0 || q.shape[1] % heads != 0 || (q.shape[1] / heads) % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": " + q.describe() + " does not split into " +
                                std::to_string(heads) + " heads of even size (with " + std::to_string(kv_heads) +
                                " key heads)");
  const int64_t T = q.shape[0], D = q.shape[1] / heads;
  if (D > kQkNormRopeMaxHeadDim)
    throw std::invalid_argument(std::string(op) + ": heads of " + std::to_string(D) + " exceed the " +
                                std::to_string(kQkNormRopeMaxHeadDim) + " supported");
  check_op_arg(k, op, "k", Device::CUDA, {q.dtype}, {T, kv_heads * D});
  check_op_arg(q_out, op, "q_out", Device::CUDA, {q.dtype}, {T, heads * D});
  check_op_arg(k_out, op, "k_out", Device::CUDA, {q.dtype}, {T, kv_heads * D});
  check_op_arg(positions, op, "positions", Device::CUDA, {DType::I32}, {T});
  check_op_arg(inv_freq, op, "inv_freq", Device::CUDA, {DType::F32}, {D / 2});
  const bool norm = q_norm.data || k_norm.data;
  if (norm) {
    check_op_arg(q_norm, op, "q_norm", Device::CUDA, {q.dtype}, {D});
    check_op_arg(k_norm, op, "k_norm", Device::CUDA, {q.dtype}, {D});
  }
  const bool keep_rstd = q_rstd.data || k_rstd.data;
  if (keep_rstd) {
    if (!norm) throw std::invalid_argument(std::string(op) + ": rstd outputs given without q/k norm weights");
    check_op_arg(q_rstd, op, "q_rstd", Device::CUDA, {DType::F32}, {T * heads});
    check_op_arg(k_rstd, op, "k_rstd", Device::CUDA, {DType::F32}, {T * kv_heads});
  }
  if (T == 0) return;
  const int half = static_cast<int>(D / 2);
  const int64_t rows = T * (heads + kv_heads);
  dispatch_data(q.dtype, [&](auto tag) {
    using E = decltype(tag);
    auto launch = [&](auto pack, auto with_norm) {
      constexpr int P = decltype(pack)::value, L = kPairsPerLane<P>;
      with_team_size<1, 32>((half / P + L - 1) / L, [&](auto team) {
        constexpr int S = decltype(team)::value;
        // Few rows (a decode step's 64 to 256 tokens): smaller blocks, down to a warp,
        // until there are enough to occupy every SM.
        int threads = kThreads;
        while ((rows * S + threads - 1) / threads < kBusyBlocks && threads / 2 >= 32) threads /= 2;
        qk_norm_rope_kernel<E, P, S, decltype(with_norm)::value>
            <<<static_cast<unsigned>((rows * S + threads - 1) / threads), threads, 0, stream>>>(
                q_out.ptr<E>(), k_out.ptr<E>(), q.ptr<E>(), k.ptr<E>(),
                q_norm.ptr<E>(), k_norm.ptr<E>(), q_rstd.ptr<float>(), k_rstd.ptr<float>(),
                positions.ptr<int32_t>(), inv_freq.ptr<float>(), T, heads, kv_heads, half, eps);
      });
    };
    // Every head starts a multiple of head_dim = 2·half elements in, so packs of N line
    // up with 16 bytes whenever half is a multiple of N and the tensors are aligned.
    auto with_pack = [&](auto with_norm) {
      if (half % kPack<E> == 0 && aligned16(q_out.data, k_out.data, q.data, k.data) &&
          (!norm || aligned16(q_norm.data, k_norm.data)))
        launch(std::integral_constant<int, kPack<E>>{}, with_norm);
      else
        launch(std::integral_constant<int, 1>{}, with_norm);
    };
    if (norm)
      with_pack(std::true_type{});
    else
      with_pack(std::false_type{});
    check_launch(op);
  });
}

}  // namespace tandem::cuda
