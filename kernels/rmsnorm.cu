#include "rmsnorm.cuh"

#include <algorithm>
#include <type_traits>

#include "e4m3.cuh"
#include "model/op_args.h"
#include "pointwise.cuh"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 256;
// The backward pass writes one row of weight-gradient partials per block: enough blocks
// to fill the GPU, few enough that the partials stay small next to the activations.
constexpr int64_t kMaxPartials = 512;
// Blocks that keep every SM of a large GPU (132 on an H200) busy.
constexpr int64_t kBusyBlocks = 256;

// Both passes give each row to a team of S lanes (a power of two; part of a warp, or whole
// warps for wide rows) that holds the row in registers: lane i of a team owns packs i,
// i + S, ... (at most L of them, 16 elements) of every row the team takes. So each input
// is read once, and in the backward pass the weight is loaded once per thread and the
// lane's share of the weight gradient stays in registers across all its rows.
template <int N>
inline constexpr int kPacksPerLane = 16 / N;
template <int S>
inline constexpr int kTeamsPerBlock = S >= kThreads ? 1 : kThreads / S;

// op (a sum, a max) over a team of S lanes, the same on every lane and every run. Teams
// wider than a warp combine their warps' results in shared memory, so every thread of
// the block must call it the same number of times.
template <int S, class Op>
__device__ inline float team_reduce(float v, float* warp_results, Op op) {
  constexpr int width = S < 32 ? S : 32;
  const unsigned mask = group_mask<width>();
#pragma unroll
  for (int offset = width / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(mask, v, offset));
  if constexpr (S > 32) {
    const int warp = threadIdx.x / 32, first = warp / (S / 32) * (S / 32);
    __syncthreads();  // the previous call's readers are done
    if (threadIdx.x % 32 == 0) warp_results[warp] = v;
    __syncthreads();
    v = warp_results[first];
#pragma unroll
    for (int w = 1; w < S / 32; ++w) v = op(v, warp_results[first + w]);
  }
  return v;
}

template <int S>
__device__ inline float team_sum(float v, float* warp_sums) {
  return team_reduce<S>(v, warp_sums, [](float a, float b) { return a + b; });
}

// One row per team: the team reads its row once into registers, sums its squares, and
// writes the normalised row from those registers. The block holds blockDim.x / S teams
// (fewer than kTeamsPerBlock when rows are few, so that they spread over every SM).
// With AddBranch, x += branch · (branch_scales[row], or 1) first (rounded to T and written
// back, so the norm sees the sum as stored, as a separate add would have left it). With
// Codes, the row goes out as FP8 codes of one scale (codes, code_scales) instead of `out`.
// No __restrict__: x is read and written.
template <class T, int N, int S, bool AddBranch, bool Codes>
__global__ void __launch_bounds__(kTeamsPerBlock<S>* S)
    rmsnorm_forward_kernel(T* out, uint8_t* codes, float* code_scales, float* rstd, T* x, const T* branch,
                           const float* branch_scales, const T* weight, int64_t rows, int columns, float eps) {
  constexpr int L = kPacksPerLane<N>;
  using P = Pack<T, N>;
  __shared__ float warp_sums[kTeamsPerBlock<S> * S / 32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / S) + threadIdx.x / S;
  const int lane = threadIdx.x % S;
  const int packs = columns / N;
  const bool valid = row < rows;
  P* xr = reinterpret_cast<P*>(x + row * columns);
  P v[L], w[L];
  float sum = 0;
#pragma unroll
  for (int j = 0; j < L; ++j) {
    if (!valid || lane + j * S >= packs) continue;
    v[j] = xr[lane + j * S];
    w[j] = reinterpret_cast<const P*>(weight)[lane + j * S];  // loaded now, its latency hidden by the sum
    if constexpr (AddBranch) {
      const P b = reinterpret_cast<const P*>(branch + row * columns)[lane + j * S];
      const float scale = branch_scales ? branch_scales[row] : 1.f;
#pragma unroll
      for (int k = 0; k < N; ++k) v[j].v[k] = from_float<T>(to_float(v[j].v[k]) + to_float(b.v[k]) * scale);
      xr[lane + j * S] = v[j];
    }
#pragma unroll
    for (int k = 0; k < N; ++k) sum += to_float(v[j].v[k]) * to_float(v[j].v[k]);
  }
  sum = team_sum<S>(sum, warp_sums);
  const float r = 1.0f / sqrtf(sum / static_cast<float>(columns) + eps);
  float y[L][N];
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < L; ++j) {
    if (!valid || lane + j * S >= packs) continue;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      y[j][k] = to_float(w[j].v[k]) * (to_float(v[j].v[k]) * r);
      amax = fmaxf(amax, fabsf(y[j][k]));
    }
  }
  if constexpr (Codes) amax = team_reduce<S>(amax, warp_sums, [](float a, float b) { return fmaxf(a, b); });
  if (!valid) return;  // after the team's last shared reduction
  if (lane == 0) rstd[row] = r;
  const float inverse = e4m3_inverse_scale(amax);
  if (Codes && lane == 0) code_scales[row] = e4m3_scale(amax);
#pragma unroll
  for (int j = 0; j < L; ++j) {
    const int p = lane + j * S;
    if (p >= packs) continue;
    if constexpr (Codes) store_e4m3<N>(codes + row * columns + p * N, y[j], inverse);
    else store<N>(out + row * columns + p * N, y[j]);
  }
}

// The rotation behind a per-head norm (qk_norm_rope_forward's order), which the backward
// undoes on each head's gradient before the norm's: rows are (token, head) pairs, `heads`
// a token, rotated by position · inv_freq[i] (dims i and i + columns/2 together).
struct RopeAngles {
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int heads = 0;
};
// A rotating block's rows span at most this many tokens, whose angles it computes once
// into shared memory for all their heads.
constexpr int64_t kRopeTokensPerBlock = 32;

// Block b owns rows [b·rows_per_block, (b+1)·rows_per_block) (a multiple of the teams per
// block, so every team runs the same number of steps); team t takes every teams-th row
// from t. Each lane sums dout·x·rstd over its rows in registers; the block then writes the
// sum over its teams, in team order, as partials[b]. AccumulateDx adds into dx, else dx is
// overwritten without being read. With Rope, dout is the gradient of the rotated rows: a
// lane rotates its packs back with their partners in the other half of the head (the
// rope backward in registers, where a kernel of its own read and wrote the gradient).
template <class T, int N, int S, bool AccumulateDx, bool Rope>
__global__ void __launch_bounds__(kTeamsPerBlock<S>* S)
    rmsnorm_backward_kernel(T* dx, float* partials, const T* dout, const T* x, const T* weight, const float* rstd,
                            int64_t rows, int columns, int64_t rows_per_block, RopeAngles rope) {
  constexpr int L = kPacksPerLane<N>, teams = kTeamsPerBlock<S>;
  using P = Pack<T, N>;
  // [teams][columns] of team sums when teams > 1, then with Rope the block's angles
  // [tokens][columns / 2] of (cos, sin), each token's in transposed_angle_slot's order.
  extern __shared__ __align__(16) float shared[];
  float* team_dweight = shared;
  float2* angles = reinterpret_cast<float2*>(shared + (teams > 1 ? teams * columns : 0));
  __shared__ float warp_sums[teams * S / 32];
  const int team = threadIdx.x / S, lane = threadIdx.x % S;
  const int packs = columns / N, half = columns / 2;
  bool owned[L];
  P w[L];
  float dweight[L][N];
#pragma unroll
  for (int j = 0; j < L; ++j) {
    owned[j] = lane + j * S < packs;
    if (owned[j]) w[j] = reinterpret_cast<const P*>(weight)[lane + j * S];
#pragma unroll
    for (int k = 0; k < N; ++k) dweight[j][k] = 0;
  }

  const int64_t first = blockIdx.x * rows_per_block;
  int64_t first_token = 0;
  if constexpr (Rope) {
    first_token = first / rope.heads;
    const int64_t tokens = (min(first + rows_per_block, rows) - 1) / rope.heads - first_token + 1;
    // The angle is rounded to FP32 before sin/cos, as the forward computed it.
    for (int i = threadIdx.x; i < tokens * half; i += blockDim.x) {
      const int dim = i % half;
      float sine, cosine;
      sincosf(static_cast<float>(rope.positions[first_token + i / half]) * rope.inv_freq[dim], &sine, &cosine);
      angles[i - dim + transposed_angle_slot<N>(dim, packs / 2)] = make_float2(cosine, sine);
    }
    __syncthreads();
  }
  for (int64_t row = first + team; row < first + rows_per_block; row += teams) {
    const bool valid = row < rows;
    const P* dy = reinterpret_cast<const P*>(dout + row * columns);
    const P* xr = reinterpret_cast<const P*>(x + row * columns);
    P* dxr = reinterpret_cast<P*>(dx + row * columns);
    P v[L], d[L];
    float g[L][N];
#pragma unroll
    for (int j = 0; j < L; ++j) {
      if (!valid || !owned[j]) continue;
      const int p = lane + j * S;
      const P own = dy[p];
      v[j] = xr[p];
      if constexpr (AccumulateDx) d[j] = dxr[p];
      if constexpr (Rope) {
        // y1 = x1·cos - x2·sin, y2 = x2·cos + x1·sin; so dx1 = dy1·cos + dy2·sin and
        // dx2 = dy2·cos - dy1·sin.
        const bool first_half = p < packs / 2;
        const P partner = dy[first_half ? p + packs / 2 : p - packs / 2];
        const float sign = first_half ? 1.0f : -1.0f;
        const float2* a = angles + (row / rope.heads - first_token) * half + p % (packs / 2);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const float2 cs = a[k * (packs / 2)];
          g[j][k] = to_float(own.v[k]) * cs.x + sign * to_float(partner.v[k]) * cs.y;
        }
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k) g[j][k] = to_float(own.v[k]);
      }
    }
    const float r = valid ? rstd[row] : 0.0f;
    // With n = x·rstd and dn = dout·weight: dx = rstd·(dn - n·mean(dn·n)).
    float dot = 0;
#pragma unroll
    for (int j = 0; j < L; ++j) {
      if (!valid || !owned[j]) continue;
#pragma unroll
      for (int k = 0; k < N; ++k) dot += g[j][k] * to_float(w[j].v[k]) * to_float(v[j].v[k]);
    }
    const float mean = team_sum<S>(dot, warp_sums) * r / static_cast<float>(columns);
#pragma unroll
    for (int j = 0; j < L; ++j) {
      if (!valid || !owned[j]) continue;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float gk = g[j][k], vk = to_float(v[j].v[k]);
        const float share = r * (gk * to_float(w[j].v[k]) - vk * r * mean);
        if constexpr (AccumulateDx)
          d[j].v[k] = from_float<T>(to_float(d[j].v[k]) + share);
        else
          d[j].v[k] = from_float<T>(share);
        dweight[j][k] += gk * vk * r;
      }
      dxr[lane + j * S] = d[j];
    }
  }

  float* partial = partials + blockIdx.x * static_cast<int64_t>(columns);
  float* own = teams == 1 ? partial : team_dweight + team * columns;
#pragma unroll
  for (int j = 0; j < L; ++j)
    if (owned[j]) store<N>(own + (lane + j * S) * N, dweight[j]);
  if constexpr (teams > 1) {
    __syncthreads();
    for (int i = threadIdx.x; i < columns; i += teams * S) {
      float sum = 0;
      for (int t = 0; t < teams; ++t) sum += team_dweight[t * columns + i];
      partial[i] = sum;
    }
  }
}

// dweight += the sum of the blocks' partials, in block order: thread (i, j) of a
// 32×32 block sums every 32nd partial of column i from j, then lane j = 0 adds the 32
// sums in order.
__global__ void rmsnorm_dweight_kernel(float* dweight, const float* partials, int64_t blocks, int columns) {
  __shared__ float sums[32][33];
  const int i = blockIdx.x * 32 + threadIdx.x;
  float sum = 0;
  if (i < columns)
#pragma unroll 8
    for (int64_t b = threadIdx.y; b < blocks; b += 32) sum += partials[b * columns + i];
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || i >= columns) return;
  float total = 0;
  for (int j = 0; j < 32; ++j) total += sums[j][threadIdx.x];
  dweight[i] += total;
}

void check_row_width(int64_t columns, const char* op) {
  if (columns > kRmsnormMaxColumns)
    throw std::invalid_argument(std::string(op) + ": rows of " + std::to_string(columns) + " exceed the " +
                                std::to_string(kRmsnormMaxColumns) + " supported");
}

// The forward kernel for checked arguments; branch is empty for the plain norm.
void launch_rmsnorm_forward(const ScaledRows& out, const Tensor& rstd, const Tensor& x, const ScaledRows& branch,
                            const Tensor& weight, float eps, cudaStream_t stream, const char* op) {
  const int64_t N = x.shape[0], D = x.shape[1];
  check_row_width(D, op);
  if (N == 0 || D == 0) return;
  const bool add_branch = branch.values.data != nullptr, coded = out.values.dtype == DType::F8_E4M3;
  dispatch_data(x.dtype, [&](auto tag) {
    using E = decltype(tag);
    auto launch = [&](auto pack, auto with_branch, auto with_codes) {
      constexpr int P = decltype(pack)::value;
      constexpr int L = kPacksPerLane<P>;
      constexpr bool Codes = decltype(with_codes)::value;
      with_team_size<4, 1024>((D / P + L - 1) / L, [&](auto team) {
        constexpr int S = decltype(team)::value;
        // Few rows (a decode step's 64 to 256 tokens): smaller blocks, down to a warp or a
        // team, until there are enough to occupy every SM.
        int teams = kTeamsPerBlock<S>;
        while ((N + teams - 1) / teams < kBusyBlocks && (teams / 2) * S >= 32) teams /= 2;
        rmsnorm_forward_kernel<E, P, S, decltype(with_branch)::value, Codes>
            <<<static_cast<unsigned>((N + teams - 1) / teams), teams * S, 0, stream>>>(
                Codes ? nullptr : out.values.ptr<E>(), Codes ? out.values.ptr<uint8_t>() : nullptr,
                out.scales.ptr<float>(), rstd.ptr<float>(), x.ptr<E>(), branch.values.ptr<E>(),
                branch.scales.ptr<float>(), weight.ptr<E>(), N, static_cast<int>(D), eps);
      });
    };
    auto with_pack = [&](auto with_branch, auto with_codes) {
      if (D % kPack<E> == 0 && aligned16(out.values.data, x.data, weight.data) &&
          (!add_branch || aligned16(branch.values.data)))
        launch(std::integral_constant<int, kPack<E>>{}, with_branch, with_codes);
      else
        launch(std::integral_constant<int, 1>{}, with_branch, with_codes);
    };
    auto with_branch = [&](auto with_codes) {
      if (add_branch)
        with_pack(std::true_type{}, with_codes);
      else
        with_pack(std::false_type{}, with_codes);
    };
    if (coded)
      with_branch(std::true_type{});
    else
      with_branch(std::false_type{});
    check_launch(op);
  });
}

// The backward kernels for checked arguments, x [N, D]; rope.heads is 0 for the plain norm.
void launch_rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                             const Tensor& weight, const Tensor& rstd, GradWrite dx_write, RopeAngles rope,
                             cudaStream_t stream, const char* op) {
  const int64_t N = x.shape[0], D = x.shape[1];
  if (N == 0 || D == 0) return;
  const bool rotate = rope.heads > 0;
  dispatch_data(x.dtype, [&](auto tag) {
    using E = decltype(tag);
    auto launch = [&](auto pack, auto accumulate, auto with_rope) {
      constexpr int P = decltype(pack)::value;
      constexpr int L = kPacksPerLane<P>;
      with_team_size<4, 1024>((D / P + L - 1) / L, [&](auto team) {
        constexpr int S = decltype(team)::value, teams = kTeamsPerBlock<S>;
        // The chunking depends on the shape alone, never on the device, so the order
        // of every sum is the same on every GPU and every run.
        int64_t rows_per_block = teams * ((N + teams * kMaxPartials - 1) / (teams * kMaxPartials));
        if (rotate)
          rows_per_block =
              std::min(rows_per_block, std::max<int64_t>(teams, kRopeTokensPerBlock * rope.heads / teams * teams));
        const int64_t blocks = (N + rows_per_block - 1) / rows_per_block;
        const int64_t block_tokens = rotate ? (rows_per_block - 1) / rope.heads + 2 : 0;
        const StreamScratch partials(static_cast<size_t>(blocks * D) * sizeof(float), stream, op);
        const size_t shared_bytes = (teams > 1 ? static_cast<size_t>(teams * D) * sizeof(float) : 0) +
                                    static_cast<size_t>(block_tokens * (D / 2)) * sizeof(float2);
        if (shared_bytes > 48 * 1024)
          throw std::invalid_argument(std::string(op) + ": rows of " + std::to_string(D) + " with " +
                                      std::to_string(rope.heads) + " heads a token need " +
                                      std::to_string(shared_bytes) + " bytes of shared memory, over 48 KiB");
        rmsnorm_backward_kernel<E, P, S, decltype(accumulate)::value, decltype(with_rope)::value>
            <<<static_cast<unsigned>(blocks), teams * S, shared_bytes, stream>>>(
                dx.ptr<E>(), partials.at<float>(0), dout.ptr<E>(), x.ptr<E>(), weight.ptr<E>(), rstd.ptr<float>(), N,
                static_cast<int>(D), rows_per_block, rope);
        check_launch(op);
        rmsnorm_dweight_kernel<<<static_cast<unsigned>((D + 31) / 32), dim3(32, 32), 0, stream>>>(
            dweight.ptr<float>(), partials.at<float>(0), blocks, static_cast<int>(D));
      });
    };
    // A pack never straddles the two halves a rotation pairs.
    const int64_t pack_unit = rotate ? D / 2 : D;
    auto with_pack = [&](auto accumulate, auto with_rope) {
      if (pack_unit % kPack<E> == 0 && aligned16(dx.data, dout.data, x.data, weight.data))
        launch(std::integral_constant<int, kPack<E>>{}, accumulate, with_rope);
      else
        launch(std::integral_constant<int, 1>{}, accumulate, with_rope);
    };
    if (rotate)
      with_pack(std::false_type{}, std::true_type{});
    else if (dx_write == GradWrite::accumulate)
      with_pack(std::true_type{}, std::false_type{});
    else
      with_pack(std::false_type{}, std::false_type{});
    check_launch(op);
  });
}

}  // namespace

void rmsnorm_forward(const ScaledRows& out, const Tensor& rstd, const Tensor& x, const Tensor& weight, float eps,
                     cudaStream_t stream) {
  constexpr const char* op = "cuda::rmsnorm_forward";
  check_op_arg(x, op, "x", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  const int64_t N = x.shape[0], D = x.shape[1];
  check_out_rows(out, op, Device::CUDA, x.dtype, N, D);
  check_op_arg(rstd, op, "rstd", Device::CUDA, {DType::F32}, {N});
  check_op_arg(weight, op, "weight", Device::CUDA, {x.dtype}, {D});
  launch_rmsnorm_forward(out, rstd, x, Tensor{}, weight, eps, stream, op);
}

void add_rmsnorm_forward(const ScaledRows& out, const Tensor& rstd, const Tensor& hidden, const ScaledRows& branch,
                         const Tensor& weight, float eps, cudaStream_t stream) {
  constexpr const char* op = "cuda::add_rmsnorm_forward";
  check_op_arg(hidden, op, "hidden", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  const int64_t N = hidden.shape[0], D = hidden.shape[1];
  check_in_rows(branch, op, "branch", Device::CUDA, {hidden.dtype}, N, D);
  check_out_rows(out, op, Device::CUDA, hidden.dtype, N, D);
  check_op_arg(rstd, op, "rstd", Device::CUDA, {DType::F32}, {N});
  check_op_arg(weight, op, "weight", Device::CUDA, {hidden.dtype}, {D});
  launch_rmsnorm_forward(out, rstd, hidden, branch, weight, eps, stream, op);
}

void rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                      const Tensor& weight, const Tensor& rstd, GradWrite dx_write, cudaStream_t stream) {
  constexpr const char* op = "cuda::rmsnorm_backward";
  check_op_arg(x, op, "x", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  const int64_t N = x.shape[0], D = x.shape[1];
  check_op_arg(dx, op, "dx", Device::CUDA, {x.dtype}, {N, D});
  check_op_arg(dweight, op, "dweight", Device::CUDA, {DType::F32}, {D});
  check_op_arg(dout, op, "dout", Device::CUDA, {x.dtype}, {N, D});
  check_op_arg(weight, op, "weight", Device::CUDA, {x.dtype}, {D});
  check_op_arg(rstd, op, "rstd", Device::CUDA, {DType::F32}, {N});
  check_row_width(D, op);
  launch_rmsnorm_backward(dx, dweight, dout, x, weight, rstd, dx_write, RopeAngles{}, stream, op);
}

void rmsnorm_rope_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                           const Tensor& weight, const Tensor& rstd, const Tensor& positions, const Tensor& inv_freq,
                           int heads, cudaStream_t stream) {
  constexpr const char* op = "cuda::rmsnorm_rope_backward";
  check_op_arg(x, op, "x", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  const int64_t T = x.shape[0];
  if (heads <= 0 || x.shape[1] % heads != 0 || (x.shape[1] / heads) % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": " + x.describe() + " does not split into " +
                                std::to_string(heads) + " heads of even size");
  const int64_t D = x.shape[1] / heads;
  check_op_arg(dx, op, "dx", Device::CUDA, {x.dtype}, {T, heads * D});
  check_op_arg(dweight, op, "dweight", Device::CUDA, {DType::F32}, {D});
  check_op_arg(dout, op, "dout", Device::CUDA, {x.dtype}, {T, heads * D});
  check_op_arg(weight, op, "weight", Device::CUDA, {x.dtype}, {D});
  check_op_arg(rstd, op, "rstd", Device::CUDA, {DType::F32}, {T * heads});
  check_op_arg(positions, op, "positions", Device::CUDA, {DType::I32}, {T});
  check_op_arg(inv_freq, op, "inv_freq", Device::CUDA, {DType::F32}, {D / 2});
  check_row_width(D, op);
  const auto per_head = [&](const Tensor& t) { return Tensor::view(t.data, t.dtype, t.device, {T * heads, D}); };
  launch_rmsnorm_backward(per_head(dx), dweight, per_head(dout), per_head(x), weight, rstd, GradWrite::overwrite,
                          RopeAngles{positions.ptr<int32_t>(), inv_freq.ptr<float>(), heads}, stream, op);
}

}  // namespace tandem::cuda
