#include "qk_norm_rope.cuh"

#include <algorithm>
#include <string>
#include <type_traits>

#include "e4m3.cuh"
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

// Where one of the three head groups (q, k, v) of a token row is read and written: row t's
// head j of the group starts at in + t * in_stride + j * head_dim and goes to out +
// r * out_stride + j * head_dim, r being t, or slots[t] for the groups stored into the KV
// cache (a row outside the cache's `rows` is skipped, as paged_store skips it).
template <class T>
struct HeadGroup {
  const T* in = nullptr;
  int64_t in_stride = 0;
  T* out = nullptr;
  int64_t out_stride = 0;
  const T* weight = nullptr;  // the per-head norm, or null (rope alone; v is copied as it is)
  bool to_slots = false;
  float* rstd = nullptr;  // each head's 1/rms, at t * (the group's heads) + j, or null (not kept)
  // An F8_E4M3 cache instead of `out`: codes at the same places, and each head's scale
  // at r * (the group's heads) + j.
  uint8_t* codes = nullptr;
  float* scales = nullptr;
};

// A team's head as codes of one scale (kernels/e4m3.cuh), from the values the working
// dtype T would have stored.
template <class T, int N, int S, int L>
__device__ inline void store_codes(uint8_t* codes, float* scale, float (&x1)[L][N], float (&x2)[L][N], int lane,
                                   int packs, int half) {
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < L; ++i) {
    if (lane + i * S >= packs) continue;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      x1[i][e] = to_float(from_float<T>(x1[i][e]));
      x2[i][e] = to_float(from_float<T>(x2[i][e]));
      amax = fmaxf(amax, fmaxf(fabsf(x1[i][e]), fabsf(x2[i][e])));
    }
  }
#pragma unroll
  for (int offset = S / 2; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(group_mask<S>(), amax, offset));
  const float inverse = e4m3_inverse_scale(amax);
#pragma unroll
  for (int i = 0; i < L; ++i) {
    const int p = lane + i * S;
    if (p >= packs) continue;
    store_e4m3<N>(codes + p * N, x1[i], inverse);
    store_e4m3<N>(codes + half + p * N, x2[i], inverse);
  }
  if (lane == 0) *scale = e4m3_scale(amax);
}

// The rotation's angles depend on the token and the dim alone: a block computes them
// once for its tokens into shared memory ([tokens][half] of (cos, sin), each token's in
// transposed_angle_slot's order), and every head of those tokens reads them there, where
// each head computing its own took one sincosf per element (the work of the whole kernel
// several times over at 24 heads a token).
constexpr int kMaxTokensPerBlock = 2;

// One head of one token per team of S lanes (a power of two up to a warp). Block x takes
// tokens_per_block tokens; their heads, q's then k's then v's (none when v_heads is 0),
// are rows (token, head) shared out among the teams of the blocks with that x (blockIdx.y
// picks the block's share). Lane i holds packs i, i + S, ... of the first half and the
// same packs of the second half: the dims that rotate together, so only the norm's sum
// crosses lanes.
template <class T, int N, int S, bool Norm>
__global__ void __launch_bounds__(kThreads)
    qk_norm_rope_kernel(HeadGroup<T> q, HeadGroup<T> k, HeadGroup<T> v, const float* row_scales,
                        const int32_t* slots, int64_t slot_rows, const int32_t* positions, const float* inv_freq,
                        int64_t tokens, int tokens_per_block, int heads, int kv_heads, int v_heads, int half,
                        float eps) {
  extern __shared__ float2 angles[];
  constexpr int L = kPairsPerLane<N>;
  const int64_t first_token = static_cast<int64_t>(blockIdx.x) * tokens_per_block;
  const int block_tokens = static_cast<int>(min(static_cast<int64_t>(tokens_per_block), tokens - first_token));
  // The angle is rounded to FP32 before sin/cos, as transformers (and CpuOps) compute it.
  const int packs = half / N;
  for (int i = threadIdx.x; i < block_tokens * half; i += blockDim.x) {
    const int dim = i % half;
    float sine, cosine;
    sincosf(static_cast<float>(positions[first_token + i / half]) * inv_freq[dim], &sine, &cosine);
    angles[i - dim + transposed_angle_slot<N>(dim, packs)] = make_float2(cosine, sine);
  }
  __syncthreads();

  const int heads_per_token = heads + kv_heads + v_heads;
  const int teams = blockDim.x / S, lane = threadIdx.x % S;
  // The group of head h and its fields, picked one by one: a reference to one of the three
  // parameter structs would copy them to the stack (200 bytes of local memory a thread).
  const auto head_group = [&](int group) {
    const auto pick = [group](auto a, auto b, auto c) { return group == 0 ? a : group == 1 ? b : c; };
    return HeadGroup<T>{pick(q.in, k.in, v.in),         pick(q.in_stride, k.in_stride, v.in_stride),
                        pick(q.out, k.out, v.out),      pick(q.out_stride, k.out_stride, v.out_stride),
                        pick(q.weight, k.weight, v.weight), pick(q.to_slots, k.to_slots, v.to_slots),
                        pick(q.rstd, k.rstd, v.rstd),   pick(q.codes, k.codes, v.codes),
                        pick(q.scales, k.scales, v.scales)};
  };
  // The whole team takes a row, so every lane of it reaches the norm's sum.
  for (int r = blockIdx.y * teams + threadIdx.x / S; r < block_tokens * heads_per_token; r += gridDim.y * teams) {
    const int token = r / heads_per_token, h = r % heads_per_token;
    const int64_t t = first_token + token;
    const int group = h < heads ? 0 : h < heads + kv_heads ? 1 : 2;
    const int head = h - (group == 0 ? 0 : group == 1 ? heads : heads + kv_heads);  // within its group
    const HeadGroup<T> g = head_group(group);
    int64_t out_row = t;
    if (g.to_slots) {
      out_row = slots[t];
      if (out_row < 0 || out_row >= slot_rows) continue;
    }
    const T* in = g.in + t * g.in_stride + head * 2 * half;
    const int64_t out_at = out_row * g.out_stride + head * 2 * half;  // in `out`, or in `codes`
    const int group_heads = group == 0 ? heads : group == 1 ? kv_heads : v_heads;
    float x1[L][N], x2[L][N];
    const float scale = row_scales ? row_scales[t] : 1.f;  // exact without scales
#pragma unroll
    for (int i = 0; i < L; ++i) {
      const int p = lane + i * S;
      if (p >= packs) continue;
      load<N>(in + p * N, x1[i]);
      load<N>(in + half + p * N, x2[i]);
#pragma unroll
      for (int e = 0; e < N; ++e) x1[i][e] *= scale, x2[i][e] *= scale;
    }
    if (group == 2 && g.codes) {
      store_codes<T, N, S>(g.codes + out_at, g.scales + out_row * group_heads + head, x1, x2, lane, packs, half);
      continue;
    }
    if (group == 2) {  // values: stored as they are
#pragma unroll
      for (int i = 0; i < L; ++i) {
        const int p = lane + i * S;
        if (p >= packs) continue;
        store<N>(g.out + out_at + p * N, x1[i]);
        store<N>(g.out + out_at + half + p * N, x2[i]);
      }
      continue;
    }
    if constexpr (Norm) {
      float sum = 0;
#pragma unroll
      for (int i = 0; i < L; ++i) {
        if (lane + i * S >= packs) continue;
#pragma unroll
        for (int e = 0; e < N; ++e) sum += x1[i][e] * x1[i][e] + x2[i][e] * x2[i][e];
      }
      const float rstd = 1.0f / sqrtf(group_sum<S>(sum, group_mask<S>()) / static_cast<float>(2 * half) + eps);
      if (g.rstd && lane == 0) g.rstd[t * (group == 0 ? heads : kv_heads) + head] = rstd;
#pragma unroll
      for (int i = 0; i < L; ++i) {
        const int p = lane + i * S;
        if (p >= packs) continue;
        float w1[N], w2[N];
        load<N>(g.weight + p * N, w1);
        load<N>(g.weight + half + p * N, w2);
#pragma unroll
        for (int e = 0; e < N; ++e) {
          x1[i][e] = w1[e] * (x1[i][e] * rstd);
          x2[i][e] = w2[e] * (x2[i][e] * rstd);
        }
      }
    }
    const float2* token_angles = angles + token * half;
#pragma unroll
    for (int i = 0; i < L; ++i) {
      const int p = lane + i * S;
      if (p >= packs) continue;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float2 cs = token_angles[e * packs + p];
        const float y1 = x1[i][e] * cs.x - x2[i][e] * cs.y, y2 = x2[i][e] * cs.x + x1[i][e] * cs.y;
        x1[i][e] = y1, x2[i][e] = y2;
      }
      if (g.codes) continue;
      store<N>(g.out + out_at + p * N, x1[i]);
      store<N>(g.out + out_at + half + p * N, x2[i]);
    }
    if (g.codes)
      store_codes<T, N, S>(g.codes + out_at, g.scales + out_row * group_heads + head, x1, x2, lane, packs, half);
  }
}

// The launch for both ops: T tokens of `heads` + `kv_heads` (+ `v_heads`) heads of
// 2·half elements. Packs of 16 bytes when every head start is 16-byte aligned: the bases
// and the row strides, with half a multiple of the pack.
template <class E>
void launch_heads(const HeadGroup<E>& q, const HeadGroup<E>& k, const HeadGroup<E>& v, const float* row_scales,
                  const int32_t* slots, int64_t slot_rows, const Tensor& positions, const Tensor& inv_freq, int64_t T, int heads,
                  int kv_heads, int v_heads, int half, float eps, cudaStream_t stream) {
  const bool norm = q.weight || k.weight;
  auto launch = [&](auto pack, auto with_norm) {
    constexpr int P = decltype(pack)::value, L = kPairsPerLane<P>;
    with_team_size<1, 32>((half / P + L - 1) / L, [&](auto team) {
      constexpr int S = decltype(team)::value;
      // Two tokens a block while that leaves blocks for every SM (a block's threads then
      // compute about one angle each); a decode step's 64 to 256 tokens take one token a
      // block and share each token's heads out among up to as many blocks as have rows.
      const int tokens_per_block = T / kMaxTokensPerBlock >= kBusyBlocks ? kMaxTokensPerBlock : 1;
      const int64_t token_blocks = (T + tokens_per_block - 1) / tokens_per_block;
      const int64_t block_rows = static_cast<int64_t>(tokens_per_block) * (heads + kv_heads + v_heads);
      const int64_t teams = kThreads / S;
      const int64_t shares = std::max<int64_t>(
          1, std::min((block_rows + teams - 1) / teams, (kBusyBlocks + token_blocks - 1) / token_blocks));
      const size_t shared = static_cast<size_t>(tokens_per_block) * half * sizeof(float2);
      qk_norm_rope_kernel<E, P, S, decltype(with_norm)::value>
          <<<dim3(static_cast<unsigned>(token_blocks), static_cast<unsigned>(shares)), kThreads, shared, stream>>>(
              q, k, v, row_scales, slots, slot_rows, positions.ptr<int32_t>(), inv_freq.ptr<float>(), T, tokens_per_block,
              heads, kv_heads, v_heads, half, eps);
    });
  };
  auto starts_aligned = [](const HeadGroup<E>& g) {
    return !g.in || (aligned16(g.in, g.out) && (g.in_stride * sizeof(E)) % 16 == 0 &&
                     (g.out_stride * sizeof(E)) % 16 == 0 && (!g.weight || aligned16(g.weight)));
  };
  auto with_pack = [&](auto with_norm) {
    if (half % kPack<E> == 0 && starts_aligned(q) && starts_aligned(k) && starts_aligned(v))
      launch(std::integral_constant<int, kPack<E>>{}, with_norm);
    else
      launch(std::integral_constant<int, 1>{}, with_norm);
  };
  if (norm)
    with_pack(std::true_type{});
  else
    with_pack(std::false_type{});
}

// heads of even size, at most kQkNormRopeMaxHeadDim; returns head_dim.
int64_t checked_head_dim(const char* op, const Tensor& x, int64_t width, int heads, int kv_heads) {
  if (heads <= 0 || kv_heads <= 0 || width % heads != 0 || (width / heads) % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": " + x.describe() + " does not split into " +
                                std::to_string(heads) + " heads of even size (with " + std::to_string(kv_heads) +
                                " key heads)");
  const int64_t D = width / heads;
  if (D > kQkNormRopeMaxHeadDim)
    throw std::invalid_argument(std::string(op) + ": heads of " + std::to_string(D) + " exceed the " +
                                std::to_string(kQkNormRopeMaxHeadDim) + " supported");
  return D;
}

// The norm weights [head_dim] of `dtype`, or both empty; returns whether they are there.
bool checked_norms(const char* op, const Tensor& q_norm, const Tensor& k_norm, DType dtype, int64_t D) {
  if (!q_norm.data && !k_norm.data) return false;
  check_op_arg(q_norm, op, "q_norm", Device::CUDA, {dtype}, {D});
  check_op_arg(k_norm, op, "k_norm", Device::CUDA, {dtype}, {D});
  return true;
}

}  // namespace

void qk_norm_rope_forward(const Tensor& q_out, const Tensor& k_out, const Tensor& q, const Tensor& k,
                          const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions, const Tensor& inv_freq,
                          int heads, int kv_heads, float eps, const Tensor& q_rstd, const Tensor& k_rstd,
                          cudaStream_t stream) {
  constexpr const char* op = "cuda::qk_norm_rope_forward";
  check_op_arg(q, op, "q", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  const int64_t T = q.shape[0], D = checked_head_dim(op, q, q.shape[1], heads, kv_heads);
  check_op_arg(k, op, "k", Device::CUDA, {q.dtype}, {T, kv_heads * D});
  check_op_arg(q_out, op, "q_out", Device::CUDA, {q.dtype}, {T, heads * D});
  check_op_arg(k_out, op, "k_out", Device::CUDA, {q.dtype}, {T, kv_heads * D});
  check_op_arg(positions, op, "positions", Device::CUDA, {DType::I32}, {T});
  check_op_arg(inv_freq, op, "inv_freq", Device::CUDA, {DType::F32}, {D / 2});
  const bool norm = checked_norms(op, q_norm, k_norm, q.dtype, D);
  if (q_rstd.data || k_rstd.data) {
    if (!norm) throw std::invalid_argument(std::string(op) + ": rstd outputs given without q/k norm weights");
    check_op_arg(q_rstd, op, "q_rstd", Device::CUDA, {DType::F32}, {T * heads});
    check_op_arg(k_rstd, op, "k_rstd", Device::CUDA, {DType::F32}, {T * kv_heads});
  }
  if (T == 0) return;
  dispatch_data(q.dtype, [&](auto tag) {
    using E = decltype(tag);
    const int64_t QD = heads * D, KD = kv_heads * D;
    const HeadGroup<E> qg{q.ptr<E>(), QD, q_out.ptr<E>(), QD, norm ? q_norm.ptr<E>() : nullptr, false,
                          q_rstd.ptr<float>()};
    const HeadGroup<E> kg{k.ptr<E>(), KD, k_out.ptr<E>(), KD, norm ? k_norm.ptr<E>() : nullptr, false,
                          k_rstd.ptr<float>()};
    launch_heads<E>(qg, kg, HeadGroup<E>{}, nullptr, nullptr, 0, positions, inv_freq, T, heads, kv_heads, 0,
                    static_cast<int>(D / 2), eps, stream);
    check_launch(op);
  });
}

bool check_qkv_norm_rope_store(const char* op, const Tensor& q_out, const CacheLayer& cache, const ScaledRows& qkv,
                               const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions,
                               const Tensor& inv_freq, const Tensor& slots, int heads, int kv_heads) {
  check_op_arg(q_out, op, "q_out", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  const int64_t T = q_out.shape[0], D = checked_head_dim(op, q_out, q_out.shape[1], heads, kv_heads);
  const int64_t QD = heads * D, KD = kv_heads * D;
  check_in_rows(qkv, op, "qkv", Device::CUDA, {q_out.dtype}, T, QD + 2 * KD);
  check_op_arg(cache.keys, op, "keys", Device::CUDA, {q_out.dtype, DType::F8_E4M3}, {kAnyExtent, KD});
  const int64_t rows = cache.keys.shape[0];
  check_op_arg(cache.values, op, "values", Device::CUDA, {cache.keys.dtype}, {rows, KD});
  if (cache.keys.dtype == DType::F8_E4M3) {
    check_op_arg(cache.key_scales, op, "key_scales", Device::CUDA, {DType::F32}, {rows, kv_heads});
    check_op_arg(cache.value_scales, op, "value_scales", Device::CUDA, {DType::F32}, {rows, kv_heads});
  }
  check_op_arg(slots, op, "slots", Device::CUDA, {DType::I32}, {T});
  check_op_arg(positions, op, "positions", Device::CUDA, {DType::I32}, {T});
  check_op_arg(inv_freq, op, "inv_freq", Device::CUDA, {DType::F32}, {D / 2});
  return checked_norms(op, q_norm, k_norm, q_out.dtype, D);
}

void qkv_norm_rope_store(const Tensor& q_out, const CacheLayer& cache, const ScaledRows& scaled_qkv, const Tensor& q_norm,
                         const Tensor& k_norm, const Tensor& positions, const Tensor& inv_freq, const Tensor& slots,
                         int heads, int kv_heads, float eps, cudaStream_t stream) {
  constexpr const char* op = "cuda::qkv_norm_rope_store";
  const bool norm = check_qkv_norm_rope_store(op, q_out, cache, scaled_qkv, q_norm, k_norm, positions, inv_freq, slots,
                                              heads, kv_heads);
  const int64_t T = q_out.shape[0], D = q_out.shape[1] / heads, QD = heads * D, KD = kv_heads * D;
  const int64_t rows = cache.keys.shape[0];
  const bool coded = cache.keys.dtype == DType::F8_E4M3;
  const Tensor& qkv = scaled_qkv.values;
  if (T == 0) return;
  dispatch_data(q_out.dtype, [&](auto tag) {
    using E = decltype(tag);
    const int64_t W = QD + 2 * KD;
    const E* qkv_rows = qkv.ptr<E>();
    const HeadGroup<E> qg{qkv_rows, W, q_out.ptr<E>(), QD, norm ? q_norm.ptr<E>() : nullptr, false};
    HeadGroup<E> kg{qkv_rows + QD, W, nullptr, KD, norm ? k_norm.ptr<E>() : nullptr, true};
    HeadGroup<E> vg{qkv_rows + QD + KD, W, nullptr, KD, nullptr, true};
    if (coded) {
      kg.codes = cache.keys.ptr<uint8_t>(), kg.scales = cache.key_scales.ptr<float>();
      vg.codes = cache.values.ptr<uint8_t>(), vg.scales = cache.value_scales.ptr<float>();
    } else {
      kg.out = cache.keys.ptr<E>(), vg.out = cache.values.ptr<E>();
    }
    launch_heads<E>(qg, kg, vg, scaled_qkv.scales.ptr<float>(), slots.ptr<int32_t>(), rows, positions, inv_freq, T, heads, kv_heads, kv_heads,
                    static_cast<int>(D / 2), eps, stream);
    check_launch(op);
  });
}

}  // namespace tandem::cuda
