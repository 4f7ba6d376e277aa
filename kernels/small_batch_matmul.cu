#include "small_batch_matmul.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "dependent_launch.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

namespace tandem::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kMaxTokens = 256;
constexpr int kChunk = 64;      // I elements a stage holds: one 128-byte swizzled column block
constexpr int kMaxSplits = 8;   // the portable cluster size
constexpr int kSharedLimit = 227 * 1024;

template <int kWarpgroups, int kTokenTiles>
struct Geometry {
  static constexpr int threads = 128 * kWarpgroups;
  static constexpr int rows = 64 * kWarpgroups;  // weight rows (columns of out) a block owns
  static constexpr int tokens = 64 * kTokenTiles;
  static constexpr int weight_tile_bytes = rows * 128;
  static constexpr int stage_bytes = weight_tile_bytes + tokens * 128;
  // Stages ahead keep 2-4 chunks of both operands in flight; at least 4, since a stage is
  // refilled two chunks after its products were issued (see the main loop).
  static constexpr int stages = std::min(6, (kSharedLimit - 1024) / stage_bytes);
  static_assert(stages >= 4);
  // The partial products in FP32, one row per token; the 4 floats of padding put the 8
  // weight rows x 4 token pairs of one fragment store in 32 distinct banks.
  static constexpr int partial_stride = rows + 4;
  static constexpr int partial_bytes = tokens * partial_stride * 4;
  static constexpr int shared_bytes = std::max(stages * stage_bytes, partial_bytes) + 1024;
  static_assert(shared_bytes <= kSharedLimit);
};

// Rows [0, valid) of a kRows x 64 tile, `stride` elements apart, into the 128-byte swizzle;
// rows past `valid` are zeroed. Thread t copies chunk t % 8 of rows t / 8, then every
// (threads / 8)-th row: a multiple of 8 rows apart, so the swizzle is the same on each.
template <int kRows, int kThreads>
__device__ __forceinline__ void load_rows(unsigned char* tile, const bf16* src, int64_t stride, int valid) {
  constexpr int rows_apart = kThreads / 8;
  static_assert(rows_apart % 8 == 0 && kRows % rows_apart == 0);
  const int first_row = threadIdx.x / 8, chunk = threadIdx.x % 8;
  const unsigned dst = shared_address(tile) + first_row * 128 + ((chunk ^ (first_row % 8)) << 4);
  const bf16* first = src + first_row * stride + chunk * 8;
#pragma unroll
  for (int i = 0; i < kRows / rows_apart; ++i) {
    const bool inside = first_row + i * rows_apart < valid;
    copy_async_16(dst + i * rows_apart * 128, inside ? first + i * rows_apart * stride : src, inside);
  }
}

// Block (row block blockIdx.x, slice blockIdx.y) of out = x · weightᵀ. Warpgroup g
// multiplies its 64 weight rows (A, K-major) by every token tile (B, K-major: the rows of
// x), so each accumulator fragment holds weight rows 16w + lane/4 (+8) and tokens
// 8j + 2(lane%4) (+1) of its token tile (wgmma.cuh).
template <int kWarpgroups, int kTokenTiles>
__global__ void __launch_bounds__(128 * kWarpgroups, 1)
    small_batch_matmul_kernel(bf16* out, const bf16* x, const bf16* weight, int tokens, int out_features,
                              int in_features, int chunks) {
  using G = Geometry<kWarpgroups, kTokenTiles>;
  constexpr int S = G::stages;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* shared = shared_raw + (1024 - shared_address(shared_raw) % 1024) % 1024;
  const cg::cluster_group cluster = cg::this_cluster();

  const int row0 = blockIdx.x * G::rows;
  const int64_t first_column = static_cast<int64_t>(blockIdx.y) * chunks * kChunk;
  const bf16* weight_src = weight + static_cast<int64_t>(row0) * in_features + first_column;
  const bf16* x_src = x + first_column;
  const auto weight_tile = [&](int chunk) { return shared + (chunk % S) * G::stage_bytes; };
  const auto x_tile = [&](int chunk) { return weight_tile(chunk) + G::weight_tile_bytes; };

  // The weights first: no kernel of the step writes them, so they stream in while the
  // kernel before this one (which wrote x) finishes. Chunk c is cp.async group c.
  for (int c = 0; c < S - 2 && c < chunks; ++c)
    load_rows<G::rows, G::threads>(weight_tile(c), weight_src + c * kChunk, in_features, G::rows);
  wait_for_prior_grid();
  for (int c = 0; c < S - 2; ++c) {
    if (c < chunks) load_rows<G::tokens, G::threads>(x_tile(c), x_src + c * kChunk, in_features, tokens);
    copy_async_commit();
  }

  float acc[kTokenTiles][8][4];
#pragma unroll
  for (auto& tile : acc)
#pragma unroll
    for (auto& fragment : tile) fragment[0] = fragment[1] = fragment[2] = fragment[3] = 0.0f;

  const int warpgroup = threadIdx.x / 128;
  for (int c = 0; c < chunks; ++c) {
    copy_async_wait<S - 3>();  // chunk c has landed (this thread's copies)
    async_proxy_fence();
    // Every thread's copies of chunk c are visible, and every warpgroup has waited for the
    // products of chunk c - 2 (end of the last iteration): its stage can be refilled.
    __syncthreads();
    const int refill = c + S - 2;
    if (refill < chunks) {
      load_rows<G::rows, G::threads>(weight_tile(refill), weight_src + refill * kChunk, in_features, G::rows);
      load_rows<G::tokens, G::threads>(x_tile(refill), x_src + refill * kChunk, in_features, tokens);
    }
    copy_async_commit();

    wgmma_fence();
    const uint64_t a = swizzled_descriptor(weight_tile(c) + warpgroup * 64 * 128, 16);
    const uint64_t b = swizzled_descriptor(x_tile(c), 16);
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk)
#pragma unroll
      for (int t = 0; t < kTokenTiles; ++t)
        wgmma_64x64_shared(acc[t], descriptor_plus(a, kk * 32), descriptor_plus(b, t * 64 * 128 + kk * 32), true);
    wgmma_commit();
    wgmma_wait<1>();  // chunk c - 1's products are done
  }
  wgmma_wait<0>();
#pragma unroll
  for (auto& tile : acc)
#pragma unroll
    for (auto& fragment : tile)
      asm volatile("" : "+f"(fragment[0]), "+f"(fragment[1]), "+f"(fragment[2]), "+f"(fragment[3])::"memory");
  copy_async_wait<0>();

  // Each slice sends its partial product to the blocks that own its tokens: block r of the
  // cluster owns tokens [r, r + 1) · tokens / splits and receives every slice's rows of
  // them into slot [slice][token][row] of its shared memory, which overlays the stages.
  // Stores to other blocks go out without waiting; only the owner reads, and locally.
  const int splits = static_cast<int>(cluster.num_blocks()), split = static_cast<int>(cluster.block_rank());
  const int tokens_each = G::tokens / splits;  // a multiple of 8: a fragment's 8 tokens have one owner
  float* slots = reinterpret_cast<float*>(shared);
  cluster.sync();  // every block is done with its stages
  const int lane = threadIdx.x % 32;
  const int row = warpgroup * 64 + (threadIdx.x % 128) / 32 * 16 + lane / 4;
#pragma unroll
  for (int t = 0; t < kTokenTiles; ++t)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int token = t * 64 + j * 8;
      if (token >= tokens) continue;  // padding rows: zeros nobody reads
      float* p = cluster.map_shared_rank(slots, token / tokens_each) +
                 (split * tokens_each + token % tokens_each + 2 * (lane % 4)) * G::partial_stride + row;
      p[0] = acc[t][j][0];
      p[G::partial_stride] = acc[t][j][1];
      p[8] = acc[t][j][2];
      p[G::partial_stride + 8] = acc[t][j][3];
    }
  cluster.sync();  // every slice's rows of this block's tokens have arrived

  // The sums over the slices in slice order: the same on every run.
  const int first_token = split * tokens_each;
  constexpr int quads = G::rows / 4;
  for (int i = threadIdx.x; i < tokens_each * quads; i += G::threads) {
    const int token = i / quads, column = i % quads * 4;
    if (first_token + token >= tokens) break;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < splits; ++s) {
      const float4 part = *reinterpret_cast<const float4*>(slots + (s * tokens_each + token) * G::partial_stride + column);
      sum.x += part.x;
      sum.y += part.y;
      sum.z += part.z;
      sum.w += part.w;
    }
    const uint2 packed{pack_bf16(sum.x, sum.y), pack_bf16(sum.z, sum.w)};
    *reinterpret_cast<uint2*>(out + static_cast<int64_t>(first_token + token) * out_features + row0 + column) = packed;
  }
}

template <int kWarpgroups, int kTokenTiles>
void launch(const Tensor& out, const Tensor& x, const Tensor& weight, int splits, cudaStream_t stream) {
  using G = Geometry<kWarpgroups, kTokenTiles>;
  const auto kernel = small_batch_matmul_kernel<kWarpgroups, kTokenTiles>;
  static const cudaError_t configured =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, G::shared_bytes);
  if (configured != cudaSuccess)
    throw std::runtime_error(std::string("cuda::small_batch_matmul: cudaFuncSetAttribute failed: ") +
                             cudaGetErrorString(configured));
  const auto tokens = static_cast<int>(x.shape[0]), in_features = static_cast<int>(x.shape[1]),
             out_features = static_cast<int>(weight.shape[0]);
  cudaLaunchAttribute attributes[2]{};
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = 1;
  attributes[0].val.clusterDim.y = static_cast<unsigned>(splits);
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(out_features / G::rows), static_cast<unsigned>(splits));
  config.blockDim = dim3(G::threads);
  config.dynamicSmemBytes = G::shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = 2;
  const cudaError_t status =
      cudaLaunchKernelEx(&config, kernel, out.ptr<bf16>(), x.ptr<bf16>(), weight.ptr<bf16>(), tokens, out_features,
                         in_features, in_features / kChunk / splits);
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("cuda::small_batch_matmul: launch failed: ") + cudaGetErrorString(status));
}

template <int kWarpgroups>
void launch_for_tokens(const Tensor& out, const Tensor& x, const Tensor& weight, int splits, cudaStream_t stream) {
  switch ((x.shape[0] + 63) / 64) {
    case 1: return launch<kWarpgroups, 1>(out, x, weight, splits, stream);
    case 2: return launch<kWarpgroups, 2>(out, x, weight, splits, stream);
    case 3: return launch<kWarpgroups, 3>(out, x, weight, splits, stream);
    default: return launch<kWarpgroups, 4>(out, x, weight, splits, stream);
  }
}

}  // namespace

bool small_batch_plan_fits(const SmallBatchPlan& plan, int64_t tokens, int64_t out_features, int64_t in_features) {
  const int64_t chunks = in_features / kChunk;
  return tokens >= 1 && tokens <= kMaxTokens && (plan.warpgroups == 1 || plan.warpgroups == 2) &&
         out_features > 0 && out_features % (64 * plan.warpgroups) == 0 && in_features % kChunk == 0 &&
         chunks > 0 && plan.splits >= 1 && plan.splits <= kMaxSplits && (plan.splits & (plan.splits - 1)) == 0 &&
         chunks % plan.splits == 0;
}

std::optional<SmallBatchPlan> plan_small_batch_matmul(int64_t tokens, int64_t out_features, int64_t in_features,
                                                      int multiprocessors) {
  // The most blocks that fit one wave; on a tie two warpgroups a block, which read x half
  // as often for the same weights.
  std::optional<SmallBatchPlan> best;
  int64_t best_blocks = 0;
  for (const int warpgroups : {2, 1})
    for (const int splits : {8, 4, 2, 1}) {
      const SmallBatchPlan plan{warpgroups, splits};
      if (!small_batch_plan_fits(plan, tokens, out_features, in_features)) continue;
      const int64_t blocks = out_features / (64 * warpgroups) * splits;
      if (blocks > multiprocessors) continue;
      if (blocks > best_blocks) best = plan, best_blocks = blocks;
      break;  // fewer splits give fewer blocks
    }
  return best;
}

void small_batch_matmul(const Tensor& out, const Tensor& x, const Tensor& weight, const SmallBatchPlan& plan,
                        cudaStream_t stream) {
  if (!small_batch_plan_fits(plan, x.shape[0], weight.shape[0], x.shape[1]))
    throw std::invalid_argument("cuda::small_batch_matmul: plan of " + std::to_string(plan.warpgroups) +
                                " warpgroups, " + std::to_string(plan.splits) + " splits does not fit x " +
                                x.describe() + ", weight " + weight.describe());
  if (plan.warpgroups == 2)
    launch_for_tokens<2>(out, x, weight, plan.splits, stream);
  else
    launch_for_tokens<1>(out, x, weight, plan.splits, stream);
}

}  // namespace tandem::cuda
