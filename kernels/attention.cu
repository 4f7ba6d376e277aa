#include "attention.cuh"

#include <cuda_bf16.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "mma.cuh"
#include "wgmma.cuh"
#include "model/op_args.h"

namespace tandem::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------------------------------
// Scalar path: one warp per row (a query row for forward and dq, a key row for dk/dv),
// each lane holding head dims lane, lane+32, ... The reference-grade path for F32 and for
// head sizes the tensor-core tiles do not cover.

constexpr int kScalarMaxHeadDim = 256;
constexpr int kLaneDims = kScalarMaxHeadDim / 32;
constexpr int kScalarThreads = 128;

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(bf16 x) { return __bfloat162float(x); }
__device__ inline void store(float* p, float x) { *p = x; }
__device__ inline void store(bf16* p, float x) { *p = __float2bfloat16_rn(x); }

struct Span {
  int start, end;  // tokens [start, end) of one sequence
};

// The sequence that holds token t: the last s with cu_seqlens[s] <= t. Clamped so that a
// broken table can only give wrong rows, never rows outside [0, tokens).
__device__ Span sequence_of(const int* cu_seqlens, int sequences, int tokens, int t) {
  int lo = 0, hi = sequences;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (cu_seqlens[mid] <= t) lo = mid;
    else hi = mid;
  }
  return {min(max(cu_seqlens[lo], 0), t), min(max(cu_seqlens[lo + 1], t + 1), tokens)};
}

__device__ inline float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

template <class Element>
__device__ void load_lanes(float (&x)[kLaneDims], const Element* row, int head_dim, int lane) {
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i) x[i] = lane + 32 * i < head_dim ? to_float(row[lane + 32 * i]) : 0.f;
}

template <class Element>
__device__ float lanes_dot(const float (&x)[kLaneDims], const Element* row, int head_dim, int lane) {
  float sum = 0;
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i)
    if (lane + 32 * i < head_dim) sum += x[i] * to_float(row[lane + 32 * i]);
  return warp_sum(sum);
}

template <class Element>
__device__ void store_lanes(Element* row, const float (&x)[kLaneDims], int head_dim, int lane) {
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i)
    if (lane + 32 * i < head_dim) store(row + lane + 32 * i, x[i]);
}

struct Geometry {
  int tokens, sequences, heads, kv_heads, head_dim;
  float scale;
};

template <class Element>
__global__ void __launch_bounds__(kScalarThreads)
    forward_rows(Element* out, float* lse, const Element* q, const Element* k, const Element* v,
                 const int* cu_seqlens, Geometry geo) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<int64_t>(geo.tokens) * geo.heads) return;
  const int t = static_cast<int>(row / geo.heads), h = static_cast<int>(row % geo.heads);
  const int kv_head = h / (geo.heads / geo.kv_heads), D = geo.head_dim;
  const int64_t q_stride = static_cast<int64_t>(geo.heads) * D, kv_stride = static_cast<int64_t>(geo.kv_heads) * D;
  const Span span = sequence_of(cu_seqlens, geo.sequences, geo.tokens, t);

  float qi[kLaneDims], acc[kLaneDims] = {};
  load_lanes(qi, q + t * q_stride + h * D, D, lane);
  // Online softmax: the running maximum rescales what was summed before it.
  float max = -INFINITY, sum = 0;
  for (int j = span.start; j <= t; ++j) {
    const float score = lanes_dot(qi, k + j * kv_stride + kv_head * D, D, lane) * geo.scale;
    const float new_max = fmaxf(max, score);
    const float correction = expf(max - new_max), p = expf(score - new_max);
    sum = sum * correction + p;
    const Element* vj = v + j * kv_stride + kv_head * D;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i)
      acc[i] = acc[i] * correction + (lane + 32 * i < D ? p * to_float(vj[lane + 32 * i]) : 0.f);
    max = new_max;
  }
  Element* oi = out + t * q_stride + h * D;
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i)
    if (lane + 32 * i < D) store(oi + lane + 32 * i, acc[i] / sum);
  if (lane == 0) lse[row] = max + logf(sum);
}

// rowsum(dO∘O) of every (token, head) row, the term each dS subtracts, for both kernels below.
template <class Element>
__global__ void __launch_bounds__(kScalarThreads)
    row_dot_rows(float* row_dots, const Element* dout, const Element* out, Geometry geo) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<int64_t>(geo.tokens) * geo.heads) return;
  float d[kLaneDims];
  load_lanes(d, dout + row * geo.head_dim, geo.head_dim, lane);
  const float dot = lanes_dot(d, out + row * geo.head_dim, geo.head_dim, lane);
  if (lane == 0) row_dots[row] = dot;
}

// dq[t] = Σ_j dS_tj k_j over the keys t sees, with dS = P ∘ (dP − rowsum(dO∘O)) · scale.
template <class Element>
__global__ void __launch_bounds__(kScalarThreads)
    backward_query_rows(Element* dq, const Element* dout, const float* row_dots, const float* lse, const Element* q,
                        const Element* k, const Element* v, const int* cu_seqlens, Geometry geo) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<int64_t>(geo.tokens) * geo.heads) return;
  const int t = static_cast<int>(row / geo.heads), h = static_cast<int>(row % geo.heads);
  const int kv_head = h / (geo.heads / geo.kv_heads), D = geo.head_dim;
  const int64_t q_stride = static_cast<int64_t>(geo.heads) * D, kv_stride = static_cast<int64_t>(geo.kv_heads) * D;
  const Span span = sequence_of(cu_seqlens, geo.sequences, geo.tokens, t);

  float qi[kLaneDims], doi[kLaneDims], acc[kLaneDims] = {};
  load_lanes(qi, q + t * q_stride + h * D, D, lane);
  load_lanes(doi, dout + t * q_stride + h * D, D, lane);
  const float dot_out = row_dots[row], row_lse = lse[row];
  for (int j = span.start; j <= t; ++j) {
    const Element* kj = k + j * kv_stride + kv_head * D;
    const float p = expf(lanes_dot(qi, kj, D, lane) * geo.scale - row_lse);
    const float dscore = p * (lanes_dot(doi, v + j * kv_stride + kv_head * D, D, lane) - dot_out) * geo.scale;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i)
      if (lane + 32 * i < D) acc[i] += dscore * to_float(kj[lane + 32 * i]);
  }
  store_lanes(dq + t * q_stride + h * D, acc, D, lane);
}

// dk[j] = Σ dS_tj q_t and dv[j] = Σ P_tj dO_t over the queries t >= j of j's sequence
// and over every query head of j's group: each warp owns its key row, so no atomics.
template <class Element>
__global__ void __launch_bounds__(kScalarThreads)
    backward_key_rows(Element* dk, Element* dv, const Element* dout, const float* row_dots, const float* lse,
                      const Element* q, const Element* k, const Element* v, const int* cu_seqlens, Geometry geo) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<int64_t>(geo.tokens) * geo.kv_heads) return;
  const int j = static_cast<int>(row / geo.kv_heads), kv_head = static_cast<int>(row % geo.kv_heads);
  const int group = geo.heads / geo.kv_heads, D = geo.head_dim;
  const int64_t q_stride = static_cast<int64_t>(geo.heads) * D, kv_stride = static_cast<int64_t>(geo.kv_heads) * D;
  const Span span = sequence_of(cu_seqlens, geo.sequences, geo.tokens, j);

  float kj[kLaneDims], vj[kLaneDims], dk_acc[kLaneDims] = {}, dv_acc[kLaneDims] = {};
  load_lanes(kj, k + j * kv_stride + kv_head * D, D, lane);
  load_lanes(vj, v + j * kv_stride + kv_head * D, D, lane);
  for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
    for (int t = j; t < span.end; ++t) {
      const Element* qt = q + t * q_stride + h * D;
      const Element* dot_row = dout + t * q_stride + h * D;
      const int64_t index = static_cast<int64_t>(t) * geo.heads + h;
      const float p = expf(lanes_dot(kj, qt, D, lane) * geo.scale - lse[index]);
      const float dscore = p * (lanes_dot(vj, dot_row, D, lane) - row_dots[index]) * geo.scale;
#pragma unroll
      for (int i = 0; i < kLaneDims; ++i) {
        if (lane + 32 * i >= D) continue;
        dv_acc[i] += p * to_float(dot_row[lane + 32 * i]);
        dk_acc[i] += dscore * to_float(qt[lane + 32 * i]);
      }
    }
  }
  store_lanes(dk + j * kv_stride + kv_head * D, dk_acc, D, lane);
  store_lanes(dv + j * kv_stride + kv_head * D, dv_acc, D, lane);
}

// ---------------------------------------------------------------------------------------
// Tensor-core path (BF16). A block holds a tile of 64 query rows (forward, dq) or 64 key
// rows (dk/dv) and streams the other side through shared memory in tiles of 64 rows,
// double-buffered with cp.async. Each of the 4 warps owns 16 of the block's rows, so every
// row statistic and accumulator stays in that warp's registers: the 4 warps are one
// warpgroup, whose MMA (wgmma.cuh) gives each warp those same 16 rows.
// Fragment layout and the PTX wrappers: mma.cuh and wgmma.cuh.

constexpr int kTile = 64;
constexpr int kWarps = kTile / 16;
constexpr int kThreads = kWarps * 32;

template <int D>
struct TileLayout {
  static constexpr int stride = kPaddedStride<D>;
  static constexpr int elements = kTile * stride;
  static constexpr int bytes = elements * 2;
};

// The warp's 16×kTile FP32 accumulator tiles rounded to BF16 A operands, one per 16
// columns: tiles 2i and 2i+1 are exactly the A operand of a product over those columns.
__device__ inline void as_a_operands(unsigned (&a)[kTile / 16][4], const float (&tiles)[kTile / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    a[kk][0] = pack_bf16(tiles[2 * kk][0], tiles[2 * kk][1]);
    a[kk][1] = pack_bf16(tiles[2 * kk][2], tiles[2 * kk][3]);
    a[kk][2] = pack_bf16(tiles[2 * kk + 1][0], tiles[2 * kk + 1][1]);
    a[kk][3] = pack_bf16(tiles[2 * kk + 1][2], tiles[2 * kk + 1][3]);
  }
}

// acc[kTile/8 tiles] = this warp's 16 rows of `a_tile` times the kTile rows of `b_tile`,
// both D wide: A·Bᵀ with both operands stored row-major (Q·Kᵀ, dO·Vᵀ, K·Qᵀ, V·dOᵀ).
template <int D>
__device__ inline void multiply_rows(float (&acc)[kTile / 8][4], const bf16* a_tile, int a_row0, const bf16* b_tile,
                                     int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned a[4];
    load_a<D>(a, a_tile, a_row0, kk * 16, lane);
#pragma unroll
    for (int n = 0; n < kTile / 16; ++n) {
      unsigned b[4];
      load_b_rows_n<D>(b, b_tile, n * 16, kk * 16, lane);
      mma(acc[2 * n], a, b[0], b[1]);
      mma(acc[2 * n + 1], a, b[2], b[3]);
    }
  }
}

// acc[D/8 tiles] += the warp's 16×kTile weights (A operands from as_a_operands) times
// the kTile × D tile `rows` (P·V, dS·K, Pᵀ·dO, dSᵀ·Q).
template <int D>
__device__ inline void accumulate_product(float (&acc)[D / 8][4], const unsigned (&weights)[kTile / 16][4],
                                          const bf16* rows, int lane) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      unsigned b[4];
      load_b_rows_k<D>(b, rows, kk * 16, n * 16, lane);
      mma(acc[2 * n], weights[kk], b[0], b[1]);
      mma(acc[2 * n + 1], weights[kk], b[2], b[3]);
    }
  }
}

// acc (this warp's 16 rows × D) written to `dst` rows starting at `first` (rows >= `rows`
// are outside the sequence and skipped): the backward ops' only write of a gradient row.
template <int D>
__device__ inline void store_rows(bf16* dst, int64_t row_stride, int rows, int first, const float (&acc)[D / 8][4],
                                  int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = first + lane / 4 + 8 * half;
    if (row >= rows) continue;
    bf16* base = dst + row * row_stride + 2 * (lane % 4);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<__nv_bfloat162*>(base + n * 8) = __floats2bfloat162_rn(acc[n][2 * half], acc[n][2 * half + 1]);
    }
  }
}

// Σ a[i]·b[i] over 8 BF16 values at 16-byte aligned addresses (global or shared).
__device__ inline float dot8(const bf16* a, const bf16* b) {
  const uint4 x = *reinterpret_cast<const uint4*>(a), y = *reinterpret_cast<const uint4*>(b);
  const __nv_bfloat162* xs = reinterpret_cast<const __nv_bfloat162*>(&x);
  const __nv_bfloat162* ys = reinterpret_cast<const __nv_bfloat162*>(&y);
  float sum = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 fx = __bfloat1622float2(xs[e]), fy = __bfloat1622float2(ys[e]);
    sum += fx.x * fy.x + fx.y * fy.y;
  }
  return sum;
}

struct SequenceTile {
  int start;             // first token of the sequence
  int length;            // its tokens
  int tile;              // the block's tile within it, in launch order
  int tiles;             // the sequence's tiles of kTile rows
  int64_t pairs_before;  // (query tile, key tile <= it) pairs of the sequences before it
};

// Maps a flat block index onto (sequence, tile) from cu_seqlens on the device: the grid
// is an upper bound on the tile count (the host does not read cu_seqlens), and blocks past
// the last tile get false. Warp 0 scans 32 sequences at a time; all threads get the answer.
__device__ bool find_sequence_tile(const int* cu_seqlens, int sequences, int tokens, int index, SequenceTile& found) {
  __shared__ SequenceTile slot;
  __shared__ bool hit;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int before = 0;  // tiles of the sequences already scanned
    int64_t pairs_before = 0;
    bool any = false;
    for (int base = 0; base < sequences && !any; base += 32) {
      const int s = base + lane;
      int start = 0, length = 0;
      if (s < sequences) {
        start = min(max(cu_seqlens[s], 0), tokens);
        length = min(max(cu_seqlens[s + 1], start), tokens) - start;
      }
      const int tiles = (length + kTile - 1) / kTile;
      int through = tiles;  // inclusive prefix sum over the lanes
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int lower = __shfl_up_sync(kFullMask, through, offset);
        if (lane >= offset) through += lower;
      }
      const int64_t pairs = static_cast<int64_t>(tiles) * (tiles + 1) / 2;
      int64_t pairs_through = pairs;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int64_t lower = __shfl_up_sync(kFullMask, pairs_through, offset);
        if (lane >= offset) pairs_through += lower;
      }
      const int first = before + through - tiles;
      const bool mine = index >= first && index < first + tiles;
      if (mine) slot = {start, length, index - first, tiles, pairs_before + pairs_through - pairs};
      any = __ballot_sync(kFullMask, mine) != 0;
      before += __shfl_sync(kFullMask, through, 31);
      pairs_before += __shfl_sync(kFullMask, pairs_through, 31);
    }
    if (lane == 0) hit = any;
  }
  __syncthreads();
  found = slot;
  return hit;
}

// Head dims that are a multiple of 64 run on Hopper's warpgroup MMA (wgmma.cuh): the
// tensor cores read its operands from shared memory themselves, where mma.sync spends an
// ldmatrix on every operand. The smaller ones keep mma.sync and padded rows. The kernels
// below go through these helpers and do not see which of the two runs.
template <int D>
inline constexpr bool kWarpgroupMma = D % 64 == 0;

// One kTile × D operand tile in shared memory.
template <int D>
constexpr int operand_tile_bytes() {
  if constexpr (kWarpgroupMma<D>)
    return SwizzledTile<kTile, D>::bytes;
  else
    return TileLayout<D>::bytes;
}

// A kernel's dynamic shared memory: `tiles` operand tiles, then `extra` bytes. Swizzled
// tiles start on a 1024-byte boundary, the first one at first_operand_tile.
template <int D>
constexpr int tiles_shared_bytes(int tiles, int extra = 0) {
  return tiles * operand_tile_bytes<D>() + extra + (kWarpgroupMma<D> ? 1024 : 0);
}

template <int D>
__device__ unsigned char* first_operand_tile(unsigned char* shared) {
  if constexpr (kWarpgroupMma<D>)
    return shared + (1024 - shared_address(shared) % 1024) % 1024;
  else
    return shared;
}

// Rows [0, rows) of a kTile × D tile, `row_stride` elements apart in global memory, into
// shared memory; rows past `rows` are zeroed so that they add nothing to any product.
// Thread t copies 16-byte chunk t % chunks of rows t / chunks, then every rows_apart-th: a
// multiple of 8 rows apart, so the swizzle, and the step between its destinations, is the
// same on every row it copies, and the loop is a run of copies at fixed strides.
template <int D>
__device__ void load_operand_tile(unsigned char* tile, const bf16* src, int64_t row_stride, int rows) {
  constexpr int chunks = D / 8, rows_apart = kThreads / chunks;
  static_assert(kThreads % chunks == 0 && rows_apart % 8 == 0);
  constexpr int row_bytes = kWarpgroupMma<D> ? 128 : kPaddedStride<D> * 2;
  const int first_row = threadIdx.x / chunks, chunk = threadIdx.x % chunks;
  int first_offset;
  if constexpr (kWarpgroupMma<D>)
    first_offset = swizzled_offset<kTile>(first_row, chunk);
  else
    first_offset = first_row * row_bytes + chunk * 16;
  const unsigned dst = shared_address(tile) + first_offset;
  const bf16* first_src = src + first_row * row_stride + chunk * 8;
#pragma unroll
  for (int i = 0; i < kTile / rows_apart; ++i) {
    const bool inside = first_row + i * rows_apart < rows;
    copy_async_16(dst + i * rows_apart * row_bytes, inside ? first_src + i * rows_apart * row_stride : src, inside);
  }
}

// The barrier after a cp.async wait: the tiles are then visible to every thread and, for
// the warpgroup MMA, to the tensor cores, which read shared memory through the async proxy.
template <int D>
__device__ void operand_tiles_ready() {
  if constexpr (kWarpgroupMma<D>) async_proxy_fence();
  __syncthreads();
}

// The products below run in batches: begin_products, then any number of score_product
// and weight_product calls (on distinct accumulators), then end_products, after which
// every accumulator holds its result. On the warpgroup MMA the batch is issued to the
// tensor cores back to back and waited for once; on mma.sync each product runs where it
// is called.
template <int D>
__device__ void begin_products() {
  if constexpr (kWarpgroupMma<D>) wgmma_fence();
}

// A batch can also be closed without waiting for it (commit_products), so that the threads
// work on while the tensor cores run it; wait_products<pending> then returns once at most
// `pending` of the closed batches are still running (they finish in order), and
// products_ready pins the accumulators a finished batch wrote: the compiler sees the
// products as done where they were issued, and must not read them before the wait.
template <int D>
__device__ void commit_products() {
  if constexpr (kWarpgroupMma<D>) wgmma_commit();
}

template <int D, int pending>
__device__ void wait_products() {
  if constexpr (kWarpgroupMma<D>) wgmma_wait<pending>();
}

template <int D>
__device__ void end_products() {
  commit_products<D>();
  wait_products<D, 0>();
}

template <int D, int N>
__device__ void products_ready(float (&acc)[N][4]) {
  if constexpr (kWarpgroupMma<D>)
#pragma unroll
    for (auto& tile : acc)
      asm volatile("" : "+f"(tile[0]), "+f"(tile[1]), "+f"(tile[2]), "+f"(tile[3])::"memory");
}

// acc = the block's kTile rows of a_tile times the kTile rows of b_tile, both D wide: A·Bᵀ
// with both operands stored row-major (Q·Kᵀ, dO·Vᵀ, K·Qᵀ, V·dOᵀ). Warp w gets rows 16w on.
template <int D>
__device__ void score_product(float (&acc)[kTile / 8][4], const unsigned char* a_tile, const unsigned char* b_tile,
                              int lane) {
  if constexpr (kWarpgroupMma<D>) {
    const uint64_t a = swizzled_descriptor(a_tile, 16), b = swizzled_descriptor(b_tile, 16);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int offset = (kk / 4) * SwizzledTile<kTile, D>::block_bytes + (kk % 4) * 32;
      wgmma_64x64_shared(acc, descriptor_plus(a, offset), descriptor_plus(b, offset), kk > 0);
    }
  } else {
    for (auto& tile : acc) tile[0] = tile[1] = tile[2] = tile[3] = 0;
    multiply_rows<D>(acc, reinterpret_cast<const bf16*>(a_tile), threadIdx.x / 32 * 16,
                     reinterpret_cast<const bf16*>(b_tile), lane);
  }
}

// acc += the warps' 16 × kTile weights (A operands from as_a_operands) times the kTile × D
// tile `rows` (P·V, dS·K, Pᵀ·dO, dSᵀ·Q).
template <int D>
__device__ void weight_product(float (&acc)[D / 8][4], const unsigned (&weights)[kTile / 16][4],
                               const unsigned char* rows, int lane) {
  if constexpr (kWarpgroupMma<D>) {
    static_assert(D == 64 || D == 128);
    const uint64_t first = swizzled_descriptor(rows, SwizzledTile<kTile, D>::block_bytes);
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      const uint64_t b = descriptor_plus(first, kk * 16 * 128);
      if constexpr (D == 64)
        wgmma_64x64_registers(acc, weights[kk], b, true);
      else
        wgmma_64x128_registers(acc, weights[kk], b, true);
    }
  } else {
    accumulate_product<D>(acc, weights, reinterpret_cast<const bf16*>(rows), lane);
  }
}

// Q, K twice and V once: small enough for 3 blocks an SM, whose products and softmaxes
// interleave.
template <int D>
constexpr int forward_shared_bytes = tiles_shared_bytes<D>(4);

template <int D>
__global__ void __launch_bounds__(kThreads)
    forward_tiles(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const int* cu_seqlens,
                  Geometry geo) {
  extern __shared__ __align__(16) unsigned char shared[];
  SequenceTile where;
  if (!find_sequence_tile(cu_seqlens, geo.sequences, geo.tokens, blockIdx.x, where)) return;
  // A sequence's last tile sees the most keys: launch it first.
  const int q0 = (where.tiles - 1 - where.tile) * kTile;
  const int h = blockIdx.y, kv_head = h / (geo.heads / geo.kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q_stride = static_cast<int64_t>(geo.heads) * D, kv_stride = static_cast<int64_t>(geo.kv_heads) * D;
  const int key_end = min(q0 + kTile, where.length);  // the tile's last query sees keys below this
  const int key_tiles = (key_end + kTile - 1) / kTile;
  const float scale_log2 = geo.scale * kLog2e;

  constexpr int tile_bytes = operand_tile_bytes<D>();
  unsigned char* q_tile = first_operand_tile<D>(shared);
  unsigned char* k_tiles = q_tile + tile_bytes;
  unsigned char* v_tile = k_tiles + 2 * tile_bytes;
  const bf16* q_src = q + (where.start + q0) * q_stride + h * D;
  const bf16* k_src = k + where.start * kv_stride + kv_head * D;
  const bf16* v_src = v + where.start * kv_stride + kv_head * D;
  // One commit group per load of keys or values, empty or not: keys n+1 go in at the top of
  // step n, values n+1 at its end, once values n are read.
  load_operand_tile<D>(q_tile, q_src, q_stride, key_end - q0);
  load_operand_tile<D>(k_tiles, k_src, kv_stride, min(kTile, key_end));
  copy_async_commit();
  load_operand_tile<D>(v_tile, v_src, kv_stride, min(kTile, key_end));
  copy_async_commit();

  float o[D / 8][4] = {};
  // Per row (g and g+8 of the warp's 16): running max of the scores in log2 units and this
  // lane's share of the running sum of exponentials.
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  for (int n = 0; n < key_tiles; ++n) {
    const int stage = n & 1, key0 = n * kTile, next = key0 + kTile;
    if (n + 1 < key_tiles)
      load_operand_tile<D>(k_tiles + (stage ^ 1) * tile_bytes, k_src + next * kv_stride, kv_stride,
                           min(kTile, key_end - next));
    copy_async_commit();
    copy_async_wait<2>();  // keys n
    const unsigned char* k_tile = k_tiles + stage * tile_bytes;
    operand_tiles_ready<D>();
    float s[kTile / 8][4];
    begin_products<D>();
    score_product<D>(s, q_tile, k_tile, lane);
    end_products<D>();
    if (key0 + kTile - 1 > q0) {  // the tile reaches past the diagonal: hide future keys
#pragma unroll
      for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = q0 + warp * 16 + lane / 4 + 8 * (i / 2), key = key0 + nt * 8 + 2 * (lane % 4) + i % 2;
          if (key > row) s[nt][i] = -INFINITY;
        }
    }
    // Online softmax. Tile 0 holds key 0, which every row sees, so row_max is finite from
    // the first tile on and exp2(row_max_old - row_max_new) never meets inf - inf.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // The scale is positive, so the tile's raw maximum scaled once is its scaled maximum.
      float raw_max = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kTile / 8; ++nt) raw_max = fmaxf(raw_max, fmaxf(s[nt][2 * half], s[nt][2 * half + 1]));
      float tile_max = fmaxf(row_max[half], raw_max * scale_log2);
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 2));
      const float correction = fast_exp2(row_max[half] - tile_max);
      row_max[half] = tile_max;
      float sum = 0;
#pragma unroll
      for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = fast_exp2(fmaf(s[nt][2 * half + e], scale_log2, -tile_max));
          s[nt][2 * half + e] = p;
          sum += p;
        }
      row_sum[half] = row_sum[half] * correction + sum;
      if (correction != 1.0f)  // the maximum moved
#pragma unroll
        for (int n8 = 0; n8 < D / 8; ++n8) {
          o[n8][2 * half] *= correction;
          o[n8][2 * half + 1] *= correction;
        }
    }
    unsigned p[kTile / 16][4];
    as_a_operands(p, s);
    copy_async_wait<1>();  // values n
    operand_tiles_ready<D>();
    begin_products<D>();
    weight_product<D>(o, p, v_tile, lane);
    end_products<D>();
    __syncthreads();  // values n + 1 and keys n + 2 overwrite values n and keys n
    if (n + 1 < key_tiles)
      load_operand_tile<D>(v_tile, v_src + next * kv_stride, kv_stride, min(kTile, key_end - next));
    copy_async_commit();
  }

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float sum = row_sum[half];
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    sum += __shfl_xor_sync(kFullMask, sum, 2);
    const int row = q0 + warp * 16 + lane / 4 + 8 * half;
    if (row >= where.length) continue;
    const float inverse = 1.f / sum;
    bf16* dst = out + (where.start + row) * q_stride + h * D + 2 * (lane % 4);
#pragma unroll
    for (int n8 = 0; n8 < D / 8; ++n8)
      *reinterpret_cast<__nv_bfloat162*>(dst + n8 * 8) =
          __floats2bfloat162_rn(o[n8][2 * half] * inverse, o[n8][2 * half + 1] * inverse);
    if (lane % 4 == 0) lse[static_cast<int64_t>(where.start + row) * geo.heads + h] = (row_max[half] + log2f(sum)) * kLn2;
  }
}

// Where the dS tile of (query tile qt, key tile kt <= qt) of head h sits in the scratch:
// sequence after sequence, then query tile, key tile and head.
__device__ inline int64_t score_tile_slot(const SequenceTile& where, int qt, int kt, int heads, int h) {
  return (where.pairs_before + static_cast<int64_t>(qt) * (qt + 1) / 2 + kt) * heads + h;
}

constexpr int kScoreTileElements = kTile * kTile;
constexpr int kDotThreads = 256;

// rowsum(dO∘O) of every (token, head) row, the term each dS = P∘(dP − rowsum) subtracts:
// once here, where every tile that sees a row would otherwise sum it again. Teams of up to
// 8 lanes per row, 16-byte loads.
template <int D>
__global__ void __launch_bounds__(kDotThreads)
    row_dot_tiles(float* row_dots, const bf16* dout, const bf16* out, int64_t rows) {
  constexpr int chunks = D / 8, lanes = chunks < 8 ? chunks : 8;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / lanes;
  const int lane = threadIdx.x % lanes;
  float part = 0;
  if (row < rows)
    for (int c = lane; c < chunks; c += lanes) part += dot8(dout + row * D + c * 8, out + row * D + c * 8);
#pragma unroll
  for (int offset = lanes / 2; offset > 0; offset >>= 1) part += __shfl_xor_sync(kFullMask, part, offset);
  if (row < rows && lane == 0) row_dots[row] = part;
}

template <int D>
constexpr int query_shared_bytes = tiles_shared_bytes<D>(6);  // Q, dO; K and V twice

// dq for one tile of 64 queries of one head: loops over the key tiles its rows see,
// recomputing P and dS (three products a key tile).
template <int D>
__global__ void __launch_bounds__(kThreads)
    backward_query_tiles(bf16* dq, const bf16* dout, const float* row_dots, const float* lse, const bf16* q,
                         const bf16* k, const bf16* v, const int* cu_seqlens, Geometry geo) {
  extern __shared__ __align__(16) unsigned char shared[];
  SequenceTile where;
  if (!find_sequence_tile(cu_seqlens, geo.sequences, geo.tokens, blockIdx.x, where)) return;
  const int q0 = (where.tiles - 1 - where.tile) * kTile;
  const int h = blockIdx.y, kv_head = h / (geo.heads / geo.kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q_stride = static_cast<int64_t>(geo.heads) * D, kv_stride = static_cast<int64_t>(geo.kv_heads) * D;
  const int key_end = min(q0 + kTile, where.length);
  const int key_tiles = (key_end + kTile - 1) / kTile;
  const float scale_log2 = geo.scale * kLog2e;

  constexpr int tile_bytes = operand_tile_bytes<D>();
  unsigned char* q_tile = first_operand_tile<D>(shared);
  unsigned char* dout_tile = q_tile + tile_bytes;
  unsigned char* k_tiles = dout_tile + tile_bytes;
  unsigned char* v_tiles = k_tiles + 2 * tile_bytes;
  const int64_t row0 = where.start + q0;
  const bf16* k_src = k + where.start * kv_stride + kv_head * D;
  const bf16* v_src = v + where.start * kv_stride + kv_head * D;
  load_operand_tile<D>(q_tile, q + row0 * q_stride + h * D, q_stride, key_end - q0);
  load_operand_tile<D>(dout_tile, dout + row0 * q_stride + h * D, q_stride, key_end - q0);
  load_operand_tile<D>(k_tiles, k_src, kv_stride, min(kTile, key_end));
  load_operand_tile<D>(v_tiles, v_src, kv_stride, min(kTile, key_end));
  copy_async_commit();

  // Statistics of this lane's rows (g and g+8): lse in log2 units (+inf past the sequence,
  // so those rows get P = 0) and rowsum(dO∘O).
  float row_lse[2], row_dot[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = q0 + warp * 16 + lane / 4 + 8 * half;
    const int64_t index = static_cast<int64_t>(where.start + r) * geo.heads + h;
    row_lse[half] = r < where.length ? lse[index] * kLog2e : INFINITY;
    row_dot[half] = r < where.length ? row_dots[index] : 0.f;
  }

  float dq_acc[D / 8][4] = {};
  for (int n = 0; n < key_tiles; ++n) {
    const int stage = n & 1, key0 = n * kTile;
    if (n + 1 < key_tiles) {
      const int next = key0 + kTile;
      load_operand_tile<D>(k_tiles + (stage ^ 1) * tile_bytes, k_src + next * kv_stride, kv_stride,
                           min(kTile, key_end - next));
      load_operand_tile<D>(v_tiles + (stage ^ 1) * tile_bytes, v_src + next * kv_stride, kv_stride,
                           min(kTile, key_end - next));
      copy_async_commit();
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    operand_tiles_ready<D>();
    const unsigned char* k_tile = k_tiles + stage * tile_bytes;
    float s[kTile / 8][4], ds[kTile / 8][4];
    begin_products<D>();
    score_product<D>(s, q_tile, k_tile, lane);
    score_product<D>(ds, dout_tile, v_tiles + stage * tile_bytes, lane);  // dP = dO·Vᵀ
    end_products<D>();
    const bool diagonal = key0 + kTile - 1 > q0;
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int half = i / 2, row = q0 + warp * 16 + lane / 4 + 8 * half, key = key0 + nt * 8 + 2 * (lane % 4) + i % 2;
        const float p = diagonal && key > row ? 0.f : fast_exp2(fmaf(s[nt][i], scale_log2, -row_lse[half]));
        ds[nt][i] = p * (ds[nt][i] - row_dot[half]) * geo.scale;
      }
    unsigned ds_a[kTile / 16][4];
    as_a_operands(ds_a, ds);
    begin_products<D>();
    weight_product<D>(dq_acc, ds_a, k_tile, lane);
    end_products<D>();
    __syncthreads();
  }
  store_rows<D>(dq + (where.start + q0) * q_stride + h * D, q_stride, where.length - q0, warp * 16, dq_acc, lane);
}

template <int D>
constexpr int stored_query_shared_bytes = tiles_shared_bytes<D>(2);  // K twice

// A score tile in the scratch is in fragment order: backward_key_tiles' warp w writes its
// A operand kk of dSᵀ (keys 16w.., queries 16kk..) as 32 lanes × 16 bytes at
// (4w + kk)·32 + lane, one coalesced 512-byte store.
__device__ inline int score_fragment(int key_chunk, int query_chunk, int lane) {
  return (key_chunk * (kTile / 16) + query_chunk) * 32 + lane;
}

__device__ inline unsigned transpose_8x8(unsigned x) {
  unsigned y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// The A operand of dS (16 queries × 16 keys) from the stored operand of dSᵀ over the same
// keys and queries: each 8×8 block transposed in registers, the off-diagonal two swapped.
__device__ inline void score_operand(unsigned (&a)[4], const uint4& stored) {
  a[0] = transpose_8x8(stored.x);
  a[1] = transpose_8x8(stored.z);
  a[2] = transpose_8x8(stored.y);
  a[3] = transpose_8x8(stored.w);
}

// dq for one tile of 64 queries of one head from the dS tiles backward_key_tiles stored:
// one product a key tile (dq += dS·K) where recomputing dS takes three. The dS operands
// go from global memory straight to registers, a key tile ahead. Four blocks an SM.
template <int D>
__global__ void __launch_bounds__(kThreads, 4)
    backward_query_tiles_stored(bf16* dq, const bf16* k, const bf16* score_grads, int64_t score_capacity,
                                const int* cu_seqlens, Geometry geo) {
  extern __shared__ __align__(16) unsigned char shared[];
  SequenceTile where;
  if (!find_sequence_tile(cu_seqlens, geo.sequences, geo.tokens, blockIdx.x, where)) return;
  const int query_tile = where.tiles - 1 - where.tile, q0 = query_tile * kTile;
  const int h = blockIdx.y, kv_head = h / (geo.heads / geo.kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q_stride = static_cast<int64_t>(geo.heads) * D, kv_stride = static_cast<int64_t>(geo.kv_heads) * D;
  const int key_end = min(q0 + kTile, where.length);

  constexpr int tile_bytes = operand_tile_bytes<D>();
  unsigned char* k_tiles = first_operand_tile<D>(shared);
  const bf16* k_src = k + where.start * kv_stride + kv_head * D;
  const auto load_k = [&](int n, int stage) {
    load_operand_tile<D>(k_tiles + stage * tile_bytes, k_src + n * kTile * kv_stride, kv_stride,
                         min(kTile, key_end - n * kTile));
    copy_async_commit();
  };
  const auto load_scores = [&](int n, uint4 (&stored)[kTile / 16]) {
    // Slots past the scratch come only from a cu_seqlens that breaks the rules: zeros.
    const int64_t slot = score_tile_slot(where, query_tile, n, geo.heads, h);
    const uint4* tile = reinterpret_cast<const uint4*>(score_grads) + slot * (kScoreTileElements / 8);
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk)
      stored[kk] = slot < score_capacity ? tile[score_fragment(kk, warp, lane)] : make_uint4(0, 0, 0, 0);
  };
  load_k(0, 0);
  uint4 next[kTile / 16];
  load_scores(0, next);

  float dq_acc[D / 8][4] = {};
  for (int n = 0; n <= query_tile; ++n) {
    const int stage = n & 1;
    unsigned ds_a[kTile / 16][4];
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) score_operand(ds_a[kk], next[kk]);
    if (n < query_tile) {
      load_k(n + 1, stage ^ 1);
      load_scores(n + 1, next);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    operand_tiles_ready<D>();
    begin_products<D>();
    weight_product<D>(dq_acc, ds_a, k_tiles + stage * tile_bytes, lane);
    end_products<D>();
    __syncthreads();
  }
  store_rows<D>(dq + (where.start + q0) * q_stride + h * D, q_stride, where.length - q0, warp * 16, dq_acc, lane);
}

template <int D>
struct KeyTileShared {
  static constexpr int tiles = 2 + 2 * 2;  // K, V; Q and dO twice
  static constexpr int bytes = tiles_shared_bytes<D>(tiles, 4 * kTile * static_cast<int>(sizeof(float)));
};

// dk and dv for one tile of 64 keys of one kv head: loops over every query head of the
// group and every query tile that sees these keys, so the sums over GQA heads and queries
// stay in registers and each gradient row is written by one thread, once. With
// score_grads, each item's dS tile is stored there too (transposed: key rows), for
// backward_query_tiles_stored.
template <int D>
__global__ void __launch_bounds__(kThreads)
    backward_key_tiles(bf16* dk, bf16* dv, bf16* score_grads, int64_t score_capacity, const bf16* dout,
                       const float* row_dots,
                       const float* lse, const bf16* q, const bf16* k, const bf16* v, const int* cu_seqlens,
                       Geometry geo) {
  extern __shared__ __align__(16) unsigned char shared[];
  SequenceTile where;
  if (!find_sequence_tile(cu_seqlens, geo.sequences, geo.tokens, blockIdx.x, where)) return;
  // Natural order: a sequence's first key tile is seen by the most queries and goes first.
  const int key0 = where.tile * kTile, kv_head = blockIdx.y, group = geo.heads / geo.kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q_stride = static_cast<int64_t>(geo.heads) * D, kv_stride = static_cast<int64_t>(geo.kv_heads) * D;
  const float scale_log2 = geo.scale * kLog2e;
  const int query_tiles = where.tiles - where.tile;  // per head, from the diagonal tile on
  const int items = group * query_tiles;

  constexpr int tile_bytes = operand_tile_bytes<D>();
  unsigned char* k_tile = first_operand_tile<D>(shared);
  unsigned char* v_tile = k_tile + tile_bytes;
  unsigned char* staged = v_tile + tile_bytes;  // stage s: Q at staged + 2s tiles, then dO
  float* lse_rows = reinterpret_cast<float*>(staged + 4 * tile_bytes);  // [2][kTile]
  float* dot_rows = lse_rows + 2 * kTile;                              // [2][kTile], rowsum(dO∘O)
  const int64_t key_row0 = where.start + key0;
  load_operand_tile<D>(k_tile, k + key_row0 * kv_stride + kv_head * D, kv_stride, where.length - key0);
  load_operand_tile<D>(v_tile, v + key_row0 * kv_stride + kv_head * D, kv_stride, where.length - key0);

  const auto item_head = [&](int item) { return kv_head * group + item / query_tiles; };
  const auto item_q0 = [&](int item) { return (where.tile + item % query_tiles) * kTile; };
  const auto load_item = [&](int item, int stage) {
    const int h = item_head(item), q0 = item_q0(item), rows = where.length - q0;
    const int64_t row0 = where.start + q0;
    unsigned char* tiles = staged + 2 * stage * tile_bytes;
    load_operand_tile<D>(tiles, q + row0 * q_stride + h * D, q_stride, rows);
    load_operand_tile<D>(tiles + tile_bytes, dout + row0 * q_stride + h * D, q_stride, rows);
    for (int r = threadIdx.x; r < kTile; r += kThreads) {
      const int64_t index = (row0 + r) * geo.heads + h;
      copy_async_4(lse_rows + stage * kTile + r, r < rows ? lse + index : lse, r < rows);
      copy_async_4(dot_rows + stage * kTile + r, r < rows ? row_dots + index : row_dots, r < rows);
    }
    copy_async_commit();
  };
  load_item(0, 0);  // in one group with K and V

  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  for (int item = 0; item < items; ++item) {
    const int stage = item & 1, h = item_head(item), q0 = item_q0(item);
    if (item + 1 < items) {
      load_item(item + 1, stage ^ 1);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    operand_tiles_ready<D>();
    const unsigned char* q_staged = staged + 2 * stage * tile_bytes;
    const unsigned char* dout_staged = q_staged + tile_bytes;
    const float* lse_stage = lse_rows + stage * kTile;
    const float* dot_stage = dot_rows + stage * kTile;

    // Transposed products: this warp's 16 keys (rows) against the tile's 64 queries. Each
    // product is issued as soon as its operands are: P comes while dPᵀ runs, dS while
    // dV += Pᵀ·dO runs.
    const bool diagonal = q0 < key0 + kTile - 1;
    const auto hidden = [&](int nt, int i) {
      // Queries past the sequence, and future ones on the diagonal, get P = 0.
      const int key = key0 + warp * 16 + lane / 4 + 8 * (i / 2), query = q0 + nt * 8 + 2 * (lane % 4) + i % 2;
      return query >= where.length || (diagonal && query < key);
    };
    // The lane's two neighbouring columns (queries) of 8-column tile nt, read as a pair.
    const auto columns = [&](const float* row_values, int nt) {
      return *reinterpret_cast<const float2*>(row_values + nt * 8 + 2 * (lane % 4));
    };
    float p[kTile / 8][4], ds[kTile / 8][4];
    unsigned p_a[kTile / 16][4], ds_a[kTile / 16][4];
    begin_products<D>();
    score_product<D>(p, k_tile, q_staged, lane);  // Sᵀ = K·Qᵀ
    commit_products<D>();
    score_product<D>(ds, v_tile, dout_staged, lane);  // dPᵀ = V·dOᵀ
    commit_products<D>();
    wait_products<D, 1>();
    products_ready<D>(p);
    // Only the diagonal item and a sequence's last query tile have entries to hide: the
    // others skip the mask.
    const auto probabilities = [&](auto masked) {
#pragma unroll
      for (int nt = 0; nt < kTile / 8; ++nt) {
        const float2 row_lse = columns(lse_stage, nt);
        const float neg_lse_log2[2] = {-row_lse.x * kLog2e, -row_lse.y * kLog2e};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float prob = fast_exp2(fmaf(p[nt][i], scale_log2, neg_lse_log2[i % 2]));
          if constexpr (decltype(masked)::value) p[nt][i] = hidden(nt, i) ? 0.f : prob;
          else p[nt][i] = prob;
        }
      }
    };
    if (diagonal || q0 + kTile > where.length) probabilities(std::true_type{});
    else probabilities(std::false_type{});
    as_a_operands(p_a, p);
    begin_products<D>();
    weight_product<D>(dv_acc, p_a, dout_staged, lane);  // dV += Pᵀ·dO
    commit_products<D>();
    wait_products<D, 1>();
    products_ready<D>(ds);
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt) {
      const float2 row_dot = columns(dot_stage, nt);
#pragma unroll
      for (int i = 0; i < 4; ++i) ds[nt][i] = p[nt][i] * (ds[nt][i] - (i % 2 ? row_dot.y : row_dot.x)) * geo.scale;
    }
    as_a_operands(ds_a, ds);
    begin_products<D>();
    weight_product<D>(dk_acc, ds_a, q_staged, lane);  // dK += dSᵀ·Q
    commit_products<D>();
    if (const int64_t slot = score_tile_slot(where, q0 / kTile, where.tile, geo.heads, h); slot < score_capacity) {
      uint4* tile = reinterpret_cast<uint4*>(score_grads) + slot * (kScoreTileElements / 8);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk)
        tile[score_fragment(warp, kk, lane)] = make_uint4(ds_a[kk][0], ds_a[kk][1], ds_a[kk][2], ds_a[kk][3]);
    }
    wait_products<D, 0>();
    __syncthreads();
  }
  products_ready<D>(dk_acc);
  products_ready<D>(dv_acc);
  store_rows<D>(dk + key_row0 * kv_stride + kv_head * D, kv_stride, where.length - key0, warp * 16, dk_acc, lane);
  store_rows<D>(dv + key_row0 * kv_stride + kv_head * D, kv_stride, where.length - key0, warp * 16, dv_acc, lane);
}

// ---------------------------------------------------------------------------------------
// Host side.

void check_launch(const char* op) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("kernels/attention.cu: ") + op + ": kernel launch failed: " +
                             cudaGetErrorString(status));
}

// Checks the arguments both ops share and returns the launch geometry.
Geometry check_shared_args(const char* op, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                           const Tensor& v, const Tensor& cu_seqlens, int heads, int kv_heads) {
  check_op_arg(q, op, "q", Device::CUDA, {DType::BF16, DType::F32}, {kAnyExtent, kAnyExtent});
  const int64_t tokens = q.shape[0];
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(heads) + " query heads do not group over " +
                                std::to_string(kv_heads) + " key/value heads");
  if (q.shape[1] % heads != 0 || q.shape[1] / heads > kScalarMaxHeadDim || q.shape[1] == 0)
    throw std::invalid_argument(std::string(op) + ": argument 'q' " + q.describe() + " does not split into " +
                                std::to_string(heads) + " heads of 1 to " + std::to_string(kScalarMaxHeadDim) +
                                " dims");
  if (tokens > INT_MAX) throw std::invalid_argument(std::string(op) + ": more than INT_MAX tokens in " + q.describe());
  const int64_t head_dim = q.shape[1] / heads;
  check_op_arg(k, op, "k", Device::CUDA, {q.dtype}, {tokens, kv_heads * head_dim});
  check_op_arg(v, op, "v", Device::CUDA, {q.dtype}, {tokens, kv_heads * head_dim});
  check_op_arg(out, op, "out", Device::CUDA, {q.dtype}, {tokens, heads * head_dim});
  check_op_arg(lse, op, "lse", Device::CUDA, {DType::F32}, {tokens, heads});
  check_op_arg(cu_seqlens, op, "cu_seqlens", Device::CUDA, {DType::I32}, {kAnyExtent});
  if (cu_seqlens.shape[0] < 2)
    throw std::invalid_argument(std::string(op) + ": argument 'cu_seqlens' " + cu_seqlens.describe() +
                                " must hold at least one sequence (two offsets)");
  return {static_cast<int>(tokens), static_cast<int>(cu_seqlens.shape[0] - 1), heads, kv_heads,
          static_cast<int>(head_dim), 1.0f / std::sqrt(static_cast<float>(head_dim))};
}

// Calls launch(std::integral_constant<int, D>) when the tensor-core path covers the call.
template <class Launch>
bool launch_on_tensor_cores(const Geometry& geo, std::initializer_list<const Tensor*> tensors, Launch&& launch) {
  if ((*tensors.begin())->dtype != DType::BF16) return false;
  for (const Tensor* t : tensors)
    if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0) return false;
  switch (geo.head_dim) {
    case 16: launch(std::integral_constant<int, 16>{}); return true;
    case 32: launch(std::integral_constant<int, 32>{}); return true;
    case 64: launch(std::integral_constant<int, 64>{}); return true;
    case 128: launch(std::integral_constant<int, 128>{}); return true;
    default: return false;
  }
}

// Blocks enough for every tile of every sequence: Σ ceil(len/kTile) <= (T + S·(kTile-1)) / kTile.
dim3 tile_grid(const Geometry& geo, int heads) {
  const int64_t bound = (static_cast<int64_t>(geo.tokens) + static_cast<int64_t>(geo.sequences) * (kTile - 1)) / kTile;
  return dim3(static_cast<unsigned>(bound), static_cast<unsigned>(heads));
}

unsigned row_blocks(const Geometry& geo, int heads) {
  const int64_t warps = static_cast<int64_t>(geo.tokens) * heads, per_block = kScalarThreads / 32;
  return static_cast<unsigned>((warps + per_block - 1) / per_block);
}

template <class Kernel>
void allow_shared(Kernel kernel, int bytes) {
  const cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("kernels/attention.cu: cannot give a kernel ") + std::to_string(bytes) +
                             " bytes of shared memory: " + cudaGetErrorString(status));
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& cu_seqlens, int heads, int kv_heads, cudaStream_t stream) {
  const char* op = "cuda::attention_forward";
  const Geometry geo = check_shared_args(op, out, lse, q, k, v, cu_seqlens, heads, kv_heads);
  if (geo.tokens == 0) return;
  const int* cu = cu_seqlens.ptr<const int>();
  const bool tiled = launch_on_tensor_cores(geo, {&q, &k, &v, &out}, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    allow_shared(forward_tiles<D>, forward_shared_bytes<D>);
    forward_tiles<D><<<tile_grid(geo, heads), kThreads, forward_shared_bytes<D>, stream>>>(
        out.ptr<bf16>(), lse.ptr<float>(), q.ptr<const bf16>(), k.ptr<const bf16>(), v.ptr<const bf16>(), cu, geo);
  });
  if (!tiled) {
    const unsigned blocks = row_blocks(geo, heads);
    if (q.dtype == DType::BF16)
      forward_rows<bf16><<<blocks, kScalarThreads, 0, stream>>>(out.ptr<bf16>(), lse.ptr<float>(), q.ptr<const bf16>(),
                                                                k.ptr<const bf16>(), v.ptr<const bf16>(), cu, geo);
    else
      forward_rows<float><<<blocks, kScalarThreads, 0, stream>>>(out.ptr<float>(), lse.ptr<float>(),
                                                                 q.ptr<const float>(), k.ptr<const float>(),
                                                                 v.ptr<const float>(), cu, geo);
  }
  check_launch(op);
}

// n(n+1)/2 dS tiles a head for a sequence of n tiles grows fastest with all the tokens in
// one sequence; each other sequence adds at most one tile by its rounding.
int64_t attention_score_grad_elements(int64_t tokens, int64_t sequences, int heads) {
  const int64_t longest = (tokens + kTile - 1) / kTile;
  return (longest * (longest + 1) / 2 + sequences - 1) * heads * kScoreTileElements;
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& out,
                        const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& cu_seqlens, int heads, int kv_heads, const AttentionScratch& scratch,
                        cudaStream_t stream) {
  const char* op = "cuda::attention_backward";
  const Geometry geo = check_shared_args(op, out, lse, q, k, v, cu_seqlens, heads, kv_heads);
  for (const auto& [tensor, name] : {std::pair{&dq, "dq"}, {&dout, "dout"}})
    check_op_arg(*tensor, op, name, Device::CUDA, {q.dtype}, {geo.tokens, static_cast<int64_t>(heads) * geo.head_dim});
  for (const auto& [tensor, name] : {std::pair{&dk, "dk"}, {&dv, "dv"}})
    check_op_arg(*tensor, op, name, Device::CUDA, {q.dtype},
                 {geo.tokens, static_cast<int64_t>(kv_heads) * geo.head_dim});
  check_op_arg(scratch.row_dots, op, "scratch.row_dots", Device::CUDA, {DType::F32}, {geo.tokens, heads});
  if (scratch.score_grads.data)
    check_op_arg(scratch.score_grads, op, "scratch.score_grads", Device::CUDA, {DType::BF16}, {kAnyExtent});
  if (geo.tokens == 0) return;
  const int* cu = cu_seqlens.ptr<const int>();
  float* row_dots = scratch.row_dots.ptr<float>();
  const int64_t rows = static_cast<int64_t>(geo.tokens) * heads;
  const bool tiled = launch_on_tensor_cores(geo, {&q, &k, &v, &out, &dout, &dq, &dk, &dv}, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    constexpr int lanes = D / 8 < 8 ? D / 8 : 8;
    row_dot_tiles<D><<<static_cast<unsigned>((rows * lanes + kDotThreads - 1) / kDotThreads), kDotThreads, 0, stream>>>(
        row_dots, dout.ptr<const bf16>(), out.ptr<const bf16>(), rows);
    check_launch(op);
    // Room for every dS tile: the key-tile kernel stores them and dq takes one product a
    // tile from them; otherwise dq recomputes them (three products a tile).
    const int64_t score_tiles = scratch.score_grads.numel() / kScoreTileElements;
    const bool stored = scratch.score_grads.data &&
                        scratch.score_grads.numel() >= attention_score_grad_elements(geo.tokens, geo.sequences, heads) &&
                        reinterpret_cast<uintptr_t>(scratch.score_grads.data) % 16 == 0;
    bf16* score_grads = scratch.score_grads.ptr<bf16>();
    allow_shared(backward_key_tiles<D>, KeyTileShared<D>::bytes);
    backward_key_tiles<D><<<tile_grid(geo, kv_heads), kThreads, KeyTileShared<D>::bytes, stream>>>(
        dk.ptr<bf16>(), dv.ptr<bf16>(), score_grads, stored ? score_tiles : 0, dout.ptr<const bf16>(), row_dots,
        lse.ptr<const float>(), q.ptr<const bf16>(), k.ptr<const bf16>(), v.ptr<const bf16>(), cu, geo);
    check_launch(op);
    if (stored) {
      allow_shared(backward_query_tiles_stored<D>, stored_query_shared_bytes<D>);
      backward_query_tiles_stored<D><<<tile_grid(geo, heads), kThreads, stored_query_shared_bytes<D>, stream>>>(
          dq.ptr<bf16>(), k.ptr<const bf16>(), score_grads, score_tiles, cu, geo);
    } else {
      allow_shared(backward_query_tiles<D>, query_shared_bytes<D>);
      backward_query_tiles<D><<<tile_grid(geo, heads), kThreads, query_shared_bytes<D>, stream>>>(
          dq.ptr<bf16>(), dout.ptr<const bf16>(), row_dots, lse.ptr<const float>(), q.ptr<const bf16>(),
          k.ptr<const bf16>(), v.ptr<const bf16>(), cu, geo);
    }
  });
  if (!tiled) {
    const auto launch = [&](auto element) {
      using Element = decltype(element);
      row_dot_rows<Element><<<row_blocks(geo, heads), kScalarThreads, 0, stream>>>(row_dots, dout.ptr<const Element>(),
                                                                                   out.ptr<const Element>(), geo);
      check_launch(op);
      backward_query_rows<Element><<<row_blocks(geo, heads), kScalarThreads, 0, stream>>>(
          dq.ptr<Element>(), dout.ptr<const Element>(), row_dots, lse.ptr<const float>(), q.ptr<const Element>(),
          k.ptr<const Element>(), v.ptr<const Element>(), cu, geo);
      check_launch(op);
      backward_key_rows<Element><<<row_blocks(geo, kv_heads), kScalarThreads, 0, stream>>>(
          dk.ptr<Element>(), dv.ptr<Element>(), dout.ptr<const Element>(), row_dots, lse.ptr<const float>(),
          q.ptr<const Element>(), k.ptr<const Element>(), v.ptr<const Element>(), cu, geo);
    };
    if (q.dtype == DType::BF16) launch(bf16{});
    else launch(float{});
  }
  check_launch(op);
}

}  // namespace tandem::cuda
