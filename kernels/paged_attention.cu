#include "paged_attention.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "e4m3.cuh"
#include "mma.cuh"
#include "model/op_args.h"
#include "qk_norm_rope.cuh"

namespace tandem::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 64;  // keys per shared-memory stage; split ranges are whole chunks
constexpr int kMaxSplits = 32;
constexpr int kScalarMaxHeadDim = 256;

struct Geometry {
  int tokens, sequences, heads, kv_heads, head_dim;
  int max_blocks, block_size;
  unsigned block_magic;  // key / block_size as (umulhi(key, magic) + key) >> shift (block_index)
  int block_shift;
  int64_t cache_blocks;  // whole blocks the cache holds
  int slice_heads;       // query heads per block (tensor-core path): a kv head's group, or part of it
  int slices;            // blocks per kv head's group
  int per_tile;          // queries per block (tensor-core path)
  int splits;
  float scale;
};

// ---------------------------------------------------------------------------------------
// Device helpers: a sequence's place in the batch, clamped into the tensors.

struct Sequence {
  int start, queries, context;  // first new token, new tokens, cached tokens
};

__device__ inline Sequence sequence_at(const int* cu_queries, const int* context_lens, const Geometry& geo, int b) {
  const int start = min(max(cu_queries[b], 0), geo.tokens);
  const int end = min(max(cu_queries[b + 1], start), geo.tokens);
  const int context = min(max(context_lens[b], 0), geo.max_blocks * geo.block_size);
  return {start, end - start, context};
}

// key / block_size for keys below 2^31 without a division: Granlund and Montgomery's
// round-up multiplier, set on the host by divide_by_block.
__device__ inline int block_index(const Geometry& geo, int key) {
  return static_cast<int>((__umulhi(static_cast<unsigned>(key), geo.block_magic) + static_cast<unsigned>(key)) >>
                          geo.block_shift);
}

// The last sequence whose first new token is at or before token t.
__device__ inline int sequence_of(const int* cu_queries, int sequences, int t) {
  int lo = 0, hi = sequences;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (cu_queries[mid] <= t) lo = mid;
    else hi = mid;
  }
  return lo;
}

// Keys [0, context) in `splits` ranges of equal length, rounded up to whole chunks; a
// short context uses fewer ranges ("active"), so blocks of the others exit at once.
__device__ inline int split_length(int context, int splits) {
  const int share = (context + splits - 1) / splits;
  return (share + kChunk - 1) / kChunk * kChunk;
}

__device__ inline int active_splits(int context, int splits) {
  const int length = split_length(context, splits);
  return length > 0 ? (context + length - 1) / length : 0;
}

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(bf16 x) { return __bfloat162float(x); }
__device__ inline void store(float* p, float x) { *p = x; }
__device__ inline void store(bf16* p, float x) { *p = __float2bfloat16_rn(x); }

// Elements [d, d + N) of row (token, head) from their softmax-weighted value sums and the
// row's weight sum and maximum score (log2 units): the output itself when the sequence has
// one active split, else the split's normalised partial and (once per row) its log-sum-exp
// for combine_splits. N = 2 stores a pair at once (d even).
template <int N>
__device__ inline void write_result(bf16* out, float* partial_out, float* partial_lse, const Geometry& geo, int active,
                                    int split, int64_t token, int head, int d, const float (&values)[N], float sum,
                                    float max) {
  static_assert(N == 1 || N == 2);
  const float inverse = sum > 0 ? 1.f / sum : 0.f;
  if (active == 1) {
    bf16* to = out + (token * geo.heads + head) * geo.head_dim + d;
    if constexpr (N == 2)
      *reinterpret_cast<__nv_bfloat162*>(to) = __floats2bfloat162_rn(values[0] * inverse, values[1] * inverse);
    else
      *to = __float2bfloat16_rn(values[0] * inverse);
  } else {
    const int64_t partial_row = (static_cast<int64_t>(split) * geo.tokens + token) * geo.heads + head;
    float* to = partial_out + partial_row * geo.head_dim + d;
    if constexpr (N == 2) *reinterpret_cast<float2*>(to) = make_float2(values[0] * inverse, values[1] * inverse);
    else *to = values[0] * inverse;
    if (d == 0) partial_lse[partial_row] = sum > 0 ? max + log2f(sum) : -INFINITY;
  }
}

__device__ inline float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

__device__ inline float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}

// A layer of the cache as the kernels see it: Cache is the working dtype, or uint8_t for
// F8_E4M3 codes, whose (row, kv head) scale is at scales[row·kv_heads + head], which is
// the element offset of the head's first element divided by head_dim.
template <class Cache>
struct CacheView {
  const Cache* keys;
  const Cache* values;
  const float* key_scales;  // null unless Cache is uint8_t
  const float* value_scales;
};

__device__ inline float to_float(uint8_t code) { return e4m3_to_float(code); }  // the code alone, before its scale

// ---------------------------------------------------------------------------------------
// store: one thread per `Unit` of a row (16 bytes when rows and pointers allow).

template <class Unit>
__global__ void store_rows(Unit* key_cache, Unit* value_cache, const Unit* k, const Unit* v, const int* slots,
                           int tokens, int64_t rows, int units_per_row) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(tokens) * units_per_row) return;
  const int64_t slot = slots[i / units_per_row];
  if (slot < 0 || slot >= rows) return;
  const int64_t dst = slot * units_per_row + i % units_per_row;
  key_cache[dst] = k[i];
  value_cache[dst] = v[i];
}

// A head of head_dim elements into codes of one scale, by the 32 lanes of a warp.
template <class Element>
__device__ inline void store_coded_head(uint8_t* codes, float* scale, const Element* x, int head_dim, int lane) {
  float amax = 0.f;
  for (int d = lane; d < head_dim; d += 32) amax = fmaxf(amax, fabsf(to_float(x[d])));
  amax = warp_max(amax);
  const float inverse = e4m3_inverse_scale(amax);
  for (int d = lane; d < head_dim; d += 32) codes[d] = to_e4m3(to_float(x[d]) * inverse);
  if (lane == 0) *scale = e4m3_scale(amax);
}

// An F8_E4M3 cache: one warp per (token, kv head).
template <class Element>
__global__ void __launch_bounds__(kThreads)
    store_coded_rows(uint8_t* key_codes, uint8_t* value_codes, float* key_scales, float* value_scales,
                     const Element* k, const Element* v, const int* slots, int tokens, int64_t rows, int kv_heads,
                     int head_dim) {
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (item >= static_cast<int64_t>(tokens) * kv_heads) return;
  const int64_t t = item / kv_heads, head = item % kv_heads, slot = slots[t];
  if (slot < 0 || slot >= rows) return;
  const int64_t from = item * head_dim, to = (slot * kv_heads + head) * head_dim;
  store_coded_head(key_codes + to, key_scales + slot * kv_heads + head, k + from, head_dim, lane);
  store_coded_head(value_codes + to, value_scales + slot * kv_heads + head, v + from, head_dim, lane);
}

// ---------------------------------------------------------------------------------------
// Scalar path: one warp per (token, head), lanes holding head dims lane, lane+32, ...,
// online softmax over the keys in order. No split: this path serves F32 (tests, CPU
// parity) and head sizes the tensor-core tiles do not cover.

constexpr int kLaneDims = kScalarMaxHeadDim / 32;

template <class Element, class Cache>
__global__ void __launch_bounds__(kThreads)
    attend_rows(Element* out, const Element* q, CacheView<Cache> cache, const int* cu_queries,
                const int* context_lens, const int* block_tables, Geometry geo) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<int64_t>(geo.tokens) * geo.heads) return;
  const int t = static_cast<int>(row / geo.heads), h = static_cast<int>(row % geo.heads);
  const int b = sequence_of(cu_queries, geo.sequences, t);
  const Sequence seq = sequence_at(cu_queries, context_lens, geo, b);
  if (t < seq.start || t >= seq.start + seq.queries) return;
  const int D = geo.head_dim, kv_head = h / (geo.heads / geo.kv_heads);
  const int64_t q_stride = static_cast<int64_t>(geo.heads) * D, kv_stride = static_cast<int64_t>(geo.kv_heads) * D;
  const int keys = min(seq.context - seq.queries + (t - seq.start) + 1, seq.context);  // causal, up to itself
  const int* table = block_tables + static_cast<int64_t>(b) * geo.max_blocks;

  float qi[kLaneDims], acc[kLaneDims] = {};
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i)
    qi[i] = lane + 32 * i < D ? to_float(q[t * q_stride + h * D + lane + 32 * i]) : 0.f;
  float max = -INFINITY, sum = 0;
  for (int j = 0; j < keys; ++j) {
    const int index = block_index(geo, j);
    const int block = table[index];
    if (block < 0 || block >= geo.cache_blocks) continue;
    const int64_t offset =
        (static_cast<int64_t>(block) * geo.block_size + (j - index * geo.block_size)) * kv_stride + kv_head * D;
    const float key_scale = cache.key_scales ? cache.key_scales[offset / D] : 1.f;
    const float value_scale = cache.value_scales ? cache.value_scales[offset / D] : 1.f;
    float dot = 0;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i)
      if (lane + 32 * i < D) dot += qi[i] * (to_float(cache.keys[offset + lane + 32 * i]) * key_scale);
    const float score = warp_sum(dot) * geo.scale;
    const float new_max = fmaxf(max, score);
    const float correction = expf(max - new_max), p = expf(score - new_max);
    sum = sum * correction + p;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i)
      acc[i] = acc[i] * correction +
               (lane + 32 * i < D ? p * (to_float(cache.values[offset + lane + 32 * i]) * value_scale) : 0.f);
    max = new_max;
  }
  const float inverse = sum > 0 ? 1.f / sum : 0.f;
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i)
    if (lane + 32 * i < D) store(out + t * q_stride + h * D + lane + 32 * i, acc[i] * inverse);
}

// ---------------------------------------------------------------------------------------
// Tensor-core path (BF16). Block (tile, kv head slice, split) holds the rows (query, head)
// of up to per_tile queries of one sequence times slice_heads heads of one GQA group, at
// most 16·RowTiles rows, and streams the split's keys through shared memory in chunks of
// kChunk rows gathered through the block table. Warps own 16 rows and a share of every
// chunk's 16-key sub-tiles, each with its own online softmax; at the end the warps'
// states meet in shared memory, and the block writes either the output (one active
// split) or an FP32 partial result and its log-sum-exp for combine_splits.

struct Tile {
  int sequence;
  Sequence seq;
  int first_query;  // within the sequence
  int queries;      // in this tile
};

__device__ inline Tile tile_at(const int* cu_queries, const int* context_lens, const Geometry& geo, int b, int index) {
  const Sequence seq = sequence_at(cu_queries, context_lens, geo, b);
  const int first = index * geo.per_tile;
  return {b, seq, first, max(min(geo.per_tile, seq.queries - first), 0)};
}

// Maps a flat block index onto (sequence, tile) from cu_queries on the device: the grid
// is an upper bound on the tile count, and blocks past the last tile get false. A decode
// step (one query per sequence, known from T == B) maps directly; otherwise warp 0 scans
// 32 sequences at a time and all threads get the answer.
__device__ bool find_tile(const int* cu_queries, const int* context_lens, const Geometry& geo, int index, Tile& found) {
  if (geo.tokens == geo.sequences) {
    found = tile_at(cu_queries, context_lens, geo, index, 0);
    return true;
  }
  __shared__ Tile slot;
  __shared__ bool hit;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int before = 0;  // tiles of the sequences already scanned
    bool any = false;
    for (int base = 0; base < geo.sequences && !any; base += 32) {
      const int s = base + lane;
      int tiles = 0;
      if (s < geo.sequences) {
        const int start = min(max(cu_queries[s], 0), geo.tokens);
        const int length = min(max(cu_queries[s + 1], start), geo.tokens) - start;
        tiles = (length + geo.per_tile - 1) / geo.per_tile;
      }
      int through = tiles;  // inclusive prefix sum over the lanes
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int lower = __shfl_up_sync(kFullMask, through, offset);
        if (lane >= offset) through += lower;
      }
      const int first = before + through - tiles;
      const bool mine = index >= first && index < first + tiles;
      if (mine) slot = tile_at(cu_queries, context_lens, geo, s, index - first);
      any = __ballot_sync(kFullMask, mine) != 0;
      before += __shfl_sync(kFullMask, through, 31);
    }
    if (lane == 0) hit = any;
  }
  __syncthreads();
  found = slot;
  return hit;
}

// A coded cache's values enter P·V as FP16 weights P' = P · scale / unit, with o kept in
// units of the largest value scale so far (both attention kernels), so that every weight
// stays within [0, 1].
struct ValueUnit {
  float scale = 0.f;  // the unit; 0 until a value scale is not
  // Takes `largest` (this step's largest value scale) in: returns 1 / the new unit (0 while
  // it is 0) and sets `change`, which takes o from the old unit to the new one.
  __device__ float move(float largest, float& change) {
    const float unit = fmaxf(scale, largest), inverse = unit > 0.f ? 1.f / unit : 0.f;
    change = scale * inverse;
    scale = unit;
    return inverse;
  }
};

// Q, then one chunk of K and V (a coded cache's: codes, then the chunk's key and value
// scales): the next chunk comes in once this one is done (a coded cache's waits in
// registers meanwhile), and the blocks an SM (3 of 64 rows at head_dim 128) hide each
// other's loads.
template <int D, int RowTiles, bool Coded>
struct TileShared {
  static constexpr int stride = kPaddedStride<D>;
  static constexpr int q_elements = 16 * RowTiles * stride;
  static constexpr int chunk_elements = kChunk * stride;
  static constexpr int bytes = (q_elements + 2 * chunk_elements) * 2 + (Coded ? 2 * kChunk * 4 : 0);
  // After the key loop the whole of it holds each warp's state: [warp][16 rows][state_stride]
  // FP32 output rows, then [warp][16] maxima and sums.
  static constexpr int state_stride = D + 8;
  static_assert((kWarps * 16 * state_stride + 2 * kWarps * 16) * 4 <= bytes);
};

// An F8_E4M3 cache (Coded) reaches shared memory through registers: a thread loads its
// 16-code pieces of the next chunk before the current chunk's products and writes them
// after, widened and exact (keys to BF16 beside Q, values to FP16), with their scales
// apart. The products see the codes, and the scales act in FP32: a key's on its scores,
// a value's on its weight P' (ValueUnit), as in the decode kernel. Codes times their scale
// rounded to 16 bits instead would err alike across a head of one scale, enough to move a
// peaked softmax's output by ~5% of its RMS.
// Blocks of 64 rows are built for 3 an SM; blocks of 16 leave the register count to the
// compiler (a minimum of 0 blocks).
template <int D, int RowTiles, bool Coded>
__global__ void __launch_bounds__(kThreads, RowTiles == 4 ? 3 : 0)
    attend_tiles(bf16* out, float* partial_out, float* partial_lse, const bf16* q,
                 CacheView<std::conditional_t<Coded, uint8_t, bf16>> cache, const int* cu_queries,
                 const int* context_lens, const int* block_tables, Geometry geo) {
  using Shared = TileShared<D, RowTiles, Coded>;
  extern __shared__ __align__(16) unsigned char shared[];
  Tile tile;
  if (!find_tile(cu_queries, context_lens, geo, blockIdx.x, tile)) return;
  const int group = geo.heads / geo.kv_heads, kv_head = blockIdx.y / geo.slices, slice = blockIdx.y % geo.slices;
  const int head0 = kv_head * group + slice * geo.slice_heads;
  const int slice_heads = min(geo.slice_heads, group - slice * geo.slice_heads);
  const int rows = tile.queries * slice_heads;  // row r: query r / slice_heads, head head0 + r % slice_heads
  const int first_position = tile.seq.context - tile.seq.queries + tile.first_query;
  const int split_keys = split_length(tile.seq.context, geo.splits);
  const int active = active_splits(tile.seq.context, geo.splits), split = blockIdx.z;
  if (split >= active || rows == 0) return;
  const int key_begin = split * split_keys;
  const int key_end = min(min(key_begin + split_keys, tile.seq.context), first_position + tile.queries);
  const int chunks = key_end > key_begin ? (key_end - key_begin + kChunk - 1) / kChunk : 0;

  // Many rows: warps split them (prefill); few: warps split each chunk's keys (decode).
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_tiles = RowTiles == 1 || rows <= 16 ? 1 : rows <= 32 ? 2 : 4;
  const int key_groups = kWarps / row_tiles, row_tile = warp % row_tiles, key_group = warp / row_tiles;
  const int64_t q_stride = static_cast<int64_t>(geo.heads) * D, kv_stride = static_cast<int64_t>(geo.kv_heads) * D;
  const float scale_log2 = geo.scale * kLog2e;

  bf16* q_tile = reinterpret_cast<bf16*>(shared);
  bf16* k_chunks = q_tile + Shared::q_elements;
  bf16* v_chunks = k_chunks + Shared::chunk_elements;  // a coded cache's: FP16 codes
  // Coded: [kChunk] each, the keys' scales times the softmax scale (log2 units), and the
  // values' scales.
  float* chunk_key_scales = reinterpret_cast<float*>(v_chunks + Shared::chunk_elements);
  float* chunk_value_scales = chunk_key_scales + kChunk;
  const int* table = block_tables + static_cast<int64_t>(tile.sequence) * geo.max_blocks;
  // Element offset of column `col` of key `key` in the cache, or -1 for a key past key_end
  // or a block outside the cache (which read as zeros).
  const auto locate = [&](int key, int col) -> int64_t {
    const int index = block_index(geo, key);
    const int block = key < key_end ? table[index] : -1;
    if (block < 0 || block >= geo.cache_blocks) return -1;
    return (static_cast<int64_t>(block) * geo.block_size + (key - index * geo.block_size)) * kv_stride + kv_head * D +
           col;
  };
  // Keys [key_begin + n·kChunk, +kChunk) into shared memory.
  const auto load_chunk = [&](int n) {
    constexpr int per_row = D / 8;
#pragma unroll
    for (int i = 0; i < kChunk * per_row / kThreads; ++i) {
      const int c = threadIdx.x + i * kThreads, r = c / per_row, col = (c % per_row) * 8;
      const int64_t offset = locate(key_begin + n * kChunk + r, col);
      const int at = r * Shared::stride + col;
      copy_async_16(k_chunks + at, cache.keys + max(offset, int64_t{0}), offset >= 0);
      copy_async_16(v_chunks + at, cache.values + max(offset, int64_t{0}), offset >= 0);
    }
    copy_async_commit();
  };
  // The coded chunk's pieces of this thread (16 codes each, zero where a key is missing).
  constexpr int kPieces = Coded ? (kChunk * D / 16 + kThreads - 1) / kThreads : 1;  // 1: unused
  uint4 key_codes[kPieces], value_codes[kPieces];
  float key_scale[kPieces], value_scale[kPieces];
  const auto load_codes = [&](int n) {
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const int c = threadIdx.x + i * kThreads, r = c / (D / 16);
      const int64_t offset = c < kChunk * D / 16 ? locate(key_begin + n * kChunk + r, c % (D / 16) * 16) : -1;
      key_codes[i] = value_codes[i] = make_uint4(0, 0, 0, 0);
      key_scale[i] = value_scale[i] = 0.f;
      if (offset >= 0) {
        key_codes[i] = __ldg(reinterpret_cast<const uint4*>(cache.keys + offset));
        value_codes[i] = __ldg(reinterpret_cast<const uint4*>(cache.values + offset));
        key_scale[i] = __ldg(cache.key_scales + offset / D);
        value_scale[i] = __ldg(cache.value_scales + offset / D);
      }
    }
  };
  const auto write_codes = [&] {
    const auto put = [](bf16* to, const uint4& codes, auto pack) {
      float x[16];
      unpack_e4m3x16(codes, x);
      unsigned pairs[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) pairs[i] = pack(x[2 * i], x[2 * i + 1]);
      reinterpret_cast<uint4*>(to)[0] = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
      reinterpret_cast<uint4*>(to)[1] = make_uint4(pairs[4], pairs[5], pairs[6], pairs[7]);
    };
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const int c = threadIdx.x + i * kThreads, r = c / (D / 16), col = c % (D / 16) * 16;
      if (c >= kChunk * D / 16) continue;
      const int at = r * Shared::stride + col;
      put(k_chunks + at, key_codes[i], [](float x, float y) { return pack_bf16(x, y); });
      put(v_chunks + at, value_codes[i], [](float x, float y) { return pack_half2(x, y); });
      if (col == 0) chunk_key_scales[r] = key_scale[i] * scale_log2, chunk_value_scales[r] = value_scale[i];
    }
  };

  float o[D / 8][4] = {};
  // Per row (g and g+8 of the warp's 16): running max of the scores in log2 units and
  // this lane's share of the running sum of exponentials.
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  ValueUnit value_unit;  // coded: moved once a chunk
  int position[2];  // of the row's query; rows past the tile see no key
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row_tile * 16 + lane / 4 + 8 * half;
    position[half] = r < rows ? first_position + r / slice_heads : -1;
  }
  if (chunks > 0) {
    for (int c = threadIdx.x; c < 16 * RowTiles * (D / 8); c += kThreads) {
      const int r = c / (D / 8), col = (c % (D / 8)) * 8;
      const bool inside = r < rows;
      const int64_t token = tile.seq.start + tile.first_query + r / slice_heads;
      copy_async_16(q_tile + r * Shared::stride + col,
                    inside ? q + token * q_stride + (head0 + r % slice_heads) * D + col : q, inside);
    }
    if constexpr (Coded) {
      copy_async_commit();
      load_codes(0);
      write_codes();
    } else {
      load_chunk(0);  // one group with Q
    }
  }
  // Q's fragments are read from shared memory at each use: held in registers (32 at head_dim
  // 128) they would leave room for only 2 blocks an SM.
  for (int n = 0; n < chunks; ++n) {
    if (Coded && n + 1 < chunks) load_codes(n + 1);
    copy_async_wait<0>();  // Q, and a BF16 cache's chunk n
    __syncthreads();
    const bf16* keys = k_chunks;
    const bf16* values = v_chunks;
    // Coded: o's unit moves to the largest value scale so far, once a chunk (the same in
    // every warp); the first 16 keys a warp takes apply the change with their correction.
    float unit_change = 1.f, inverse_unit = 1.f;
    if constexpr (Coded) {
      static_assert(kChunk == 64 && kWarps <= kChunk / 16);
      float largest = fmaxf(chunk_value_scales[lane], chunk_value_scales[lane + 32]);
#pragma unroll
      for (int mask = 16; mask > 0; mask /= 2) largest = fmaxf(largest, __shfl_xor_sync(kFullMask, largest, mask));
      inverse_unit = value_unit.move(largest, unit_change);
    }
    for (int sub = key_group; sub < kChunk / 16; sub += key_groups) {
      float s[2][4] = {};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        unsigned a[4], b[4];
        load_a<D>(a, q_tile, row_tile * 16, kk * 16, lane);
        load_b_rows_n<D>(b, keys, sub * 16, kk * 16, lane);
        mma(s[0], a, b[0], b[1]);
        mma(s[1], a, b[2], b[3]);
      }
      const int key_base = key_begin + n * kChunk + sub * 16 + 2 * (lane % 4);
      // This lane's keys nt·8 + 2·(lane % 4) + e: their score factors, and (coded) their
      // values' weights in o's unit.
      float key_factor[2][2], value_weight[2][2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = sub * 16 + nt * 8 + 2 * (lane % 4) + e;
          key_factor[nt][e] = Coded ? chunk_key_scales[r] : scale_log2;
          value_weight[nt][e] = Coded ? chunk_value_scales[r] * inverse_unit : 1.f;
        }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = key_base + nt * 8 + e;
            float& x = s[nt][2 * half + e];
            x = key < key_end && key <= position[half] ? x * key_factor[nt][e] : -INFINITY;
            tile_max = fmaxf(tile_max, x);
          }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 2));
        const float new_max = fmaxf(row_max[half], tile_max);
        // A row that has seen no key yet keeps max -inf: subtract 0 instead, so that its
        // exponentials are exp2(-inf) = 0 rather than exp2(-inf + inf) = NaN.
        const float base = new_max == -INFINITY ? 0.f : new_max;
        const float correction = exp2f(row_max[half] - base);
        row_max[half] = new_max;
        float sum = 0;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = exp2f(s[nt][2 * half + e] - base);
            s[nt][2 * half + e] = p;
            sum += p;
          }
        row_sum[half] = row_sum[half] * correction + sum;
        const float o_change = correction * unit_change;
#pragma unroll
        for (int n8 = 0; n8 < D / 8; ++n8) {
          o[n8][2 * half] *= o_change;
          o[n8][2 * half + 1] *= o_change;
        }
      }
      unit_change = 1.f;
      const auto weights = [&](int nt, int half) {
        return Coded ? pack_half2(s[nt][2 * half] * value_weight[nt][0], s[nt][2 * half + 1] * value_weight[nt][1])
                     : pack_bf16(s[nt][2 * half], s[nt][2 * half + 1]);
      };
      const unsigned p[4] = {weights(0, 0), weights(0, 1), weights(1, 0), weights(1, 1)};
#pragma unroll
      for (int n16 = 0; n16 < D / 16; ++n16) {
        unsigned b[4];
        load_b_rows_k<D>(b, values, sub * 16, n16 * 16, lane);
        if constexpr (Coded) {
          mma_f16(o[2 * n16], p, b[0], b[1]);
          mma_f16(o[2 * n16 + 1], p, b[2], b[3]);
        } else {
          mma(o[2 * n16], p, b[0], b[1]);
          mma(o[2 * n16 + 1], p, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the next chunk, or the states below, overwrite this one
    if (n + 1 < chunks) {
      if constexpr (Coded) write_codes();
      else load_chunk(n + 1);
    }
  }
  if constexpr (Coded)  // o back from its unit
#pragma unroll
    for (int n8 = 0; n8 < D / 8; ++n8)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n8][e] *= value_unit.scale;

  if (key_groups == 1) {  // each warp holds its 16 rows whole: nothing to merge
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = row_sum[half];
      sum += __shfl_xor_sync(kFullMask, sum, 1);
      sum += __shfl_xor_sync(kFullMask, sum, 2);
      const int r = row_tile * 16 + lane / 4 + 8 * half;
      if (r >= rows) continue;
      const int64_t token = tile.seq.start + tile.first_query + r / slice_heads;
#pragma unroll
      for (int n8 = 0; n8 < D / 8; ++n8)
        write_result(out, partial_out, partial_lse, geo, active, split, token, head0 + r % slice_heads,
                     n8 * 8 + 2 * (lane % 4), {o[n8][2 * half], o[n8][2 * half + 1]}, sum, row_max[half]);
    }
    return;
  }
  float* state = reinterpret_cast<float*>(shared);
  float* state_max = state + kWarps * 16 * Shared::state_stride;
  float* state_sum = state_max + kWarps * 16;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = warp * 16 + lane / 4 + 8 * half;
    float sum = row_sum[half];
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    sum += __shfl_xor_sync(kFullMask, sum, 2);
#pragma unroll
    for (int n8 = 0; n8 < D / 8; ++n8)
      *reinterpret_cast<float2*>(state + r * Shared::state_stride + n8 * 8 + 2 * (lane % 4)) =
          make_float2(o[n8][2 * half], o[n8][2 * half + 1]);
    if (lane % 4 == 0) {
      state_max[r] = row_max[half];
      state_sum[r] = sum;
    }
  }
  __syncthreads();

  // Row r's state is spread over the warps of its row tile, one per key group.
  for (int e = threadIdx.x; e < rows * D; e += kThreads) {
    const int r = e / D, d = e % D, local = r % 16;
    float best = -INFINITY;
    for (int g = 0; g < key_groups; ++g) best = fmaxf(best, state_max[(r / 16 + g * row_tiles) * 16 + local]);
    const float base = best == -INFINITY ? 0.f : best;
    float sum = 0, value = 0;
    for (int g = 0; g < key_groups; ++g) {
      const int w = (r / 16 + g * row_tiles) * 16 + local;
      const float weight = exp2f(state_max[w] - base);
      sum += weight * state_sum[w];
      value += weight * state[w * Shared::state_stride + d];
    }
    const int64_t token = tile.seq.start + tile.first_query + r / slice_heads;
    write_result(out, partial_out, partial_lse, geo, active, split, token, head0 + r % slice_heads, d, {value}, sum,
                 best);
  }
}

// ---------------------------------------------------------------------------------------
// Decode path (one query per sequence, GQA group of 1, 2 or 4, head_dim 64 or 128, a BF16
// or F8_E4M3 cache). Block (kv head, sequence, split) streams the split's keys in stages of
// 16: its warps take disjoint stages, each through a ring of its own with Layout::stages - 1
// stages in flight (cp.async) while it works on one, so no warp waits for another before
// the end, where the warps merge by log-sum-exp.
//
// A stage's products run on the tensor cores with the keys as the 16 rows of m16n8k16:
// scores Sᵀ = K·Qᵀ with the group's queries as the first G of 8 columns, then
// Oᵀ += Vᵀ·Pᵀ with the head's dims as rows. Queries as rows would leave 16 - G of 16 rows
// idle and twice the products; dot products on the CUDA cores cost ~3 instructions per
// cached element and leave the kernel issue-bound, not memory-bound.
// K comes in by ldmatrix, V by ldmatrix.trans; both stages' rows are 16-byte pieces
// swizzled so that the 8 keys of an ldmatrix phase fall into 8 bank quads. FP8 codes
// widen to FP16 pairs (exact) and the products run in FP16: q times the softmax scale,
// and P'ᵀ = P times each value's scale over the largest value scale seen so far (o is kept
// in units of it), so that every B operand stays in [0, 1] or near q's own range.

constexpr int kDecodeStageKeys = 16;  // a warp's stage: the 16 rows of one product
constexpr int kDecodeMaxBlocksPerSm = 4;  // 128 registers a thread
constexpr int kDecodeMaxGroup = 4;

struct KeyPlace {
  int block, offset;  // a block-table entry (-1: no key) and the key's row in that block
};

// A decode step's new tokens straight from the layer's q|k|v projection
// (paged_attend_qkv): each block normalises and rotates its group's queries itself, and
// the block whose keys end at its sequence's new token first stores that token's key and
// value, as qkv_norm_rope_store would have. qkv null: q holds the queries and the cache
// the new keys already (paged_attend).
struct FreshRows {
  const bf16* qkv = nullptr;          // [T, (heads + 2·kv_heads)·head_dim]
  const float* row_scales = nullptr;  // [T], or null
  const bf16* q_norm = nullptr;       // [head_dim] each, or both null (rope alone)
  const bf16* k_norm = nullptr;
  const int* positions = nullptr;   // [T]
  const float* inv_freq = nullptr;  // [head_dim / 2]
  const int* slots = nullptr;       // [T]
  void* keys = nullptr;             // the cache layer, written: BF16, or codes and their scales
  void* values = nullptr;
  float* key_scales = nullptr;
  float* value_scales = nullptr;
  int64_t rows = 0;
  float eps = 0.f;
};

// Head `job` of token t's fresh row, by one warp whose lane l holds dims l·P + [0, P) of
// either half of the head (the dims that rotate together): job < G is query head
// kv_head·G + job, then kv head kv_head's key, then its value. A job's inputs are loaded
// (load_fresh_head) apart from its arithmetic (prepare_fresh_head), so that a warp's first
// job's loads can go out before the block-table reads and the first copies and wait beside
// them, rather than after them.
template <int D>
struct FreshHead {
  static constexpr int P = D / 64;
  bf16 x1[P], x2[P];  // the projection's dims of either half
  bf16 w1[P], w2[P];  // their norm weights, where the job has a norm
  float freq[P];      // their rotation's inverse frequencies (query and key)
  float row_scale;
  int position;       // query and key
  int slot;           // key and value: the cache row
  int kind;           // 0 query, 1 key, 2 value
  int head;           // the query head, or the kv head
  bool normed;
};

template <int D, int G>
__device__ FreshHead<D> load_fresh_head(const FreshRows& fresh, const Geometry& geo, int64_t t, int job, int kv_head,
                                        int lane) {
  constexpr int P = D / 64, H = D / 2;
  const int kind = job < G ? 0 : job - G + 1;
  const int head = kind == 0 ? kv_head * G + job : kv_head;
  const int column = (kind == 0 ? head : kind == 1 ? geo.heads + head : geo.heads + geo.kv_heads + head) * D;
  const bf16* in = fresh.qkv + t * (geo.heads + 2 * geo.kv_heads) * D + column + lane * P;
  FreshHead<D> h;
  h.kind = kind, h.head = head;
#pragma unroll
  for (int e = 0; e < P; ++e) h.x1[e] = in[e], h.x2[e] = in[H + e];
  h.row_scale = fresh.row_scales ? fresh.row_scales[t] : 1.f;
  const bf16* weight = kind == 0 ? fresh.q_norm : kind == 1 ? fresh.k_norm : nullptr;
  h.normed = weight != nullptr;
  if (h.normed) {
#pragma unroll
    for (int e = 0; e < P; ++e) h.w1[e] = weight[lane * P + e], h.w2[e] = weight[H + lane * P + e];
  }
  if (kind < 2) {
    h.position = fresh.positions[t];
#pragma unroll
    for (int e = 0; e < P; ++e) h.freq[e] = fresh.inv_freq[lane * P + e];
  }
  if (kind > 0) h.slot = fresh.slots[t];
  return h;
}

// Job `job` from its inputs h: a query normalised, rotated and rounded to BF16 into
// queries[job]; a key (normalised and rotated) or a value into the cache row h.slot
// (skipped outside the cache) and, as the cache holds it, into held[0] or held[1] ([2][D]).
// The arithmetic and roundings of qkv_norm_rope_store.
template <int D, bool Coded>
__device__ void prepare_fresh_head(const FreshHead<D>& h, const FreshRows& fresh, const Geometry& geo, int job,
                                   bf16* queries, float* held, int lane) {
  constexpr int P = D / 64, H = D / 2;
  const int kind = h.kind, head = h.head;
  float x1[P], x2[P];
#pragma unroll
  for (int e = 0; e < P; ++e)
    x1[e] = __bfloat162float(h.x1[e]) * h.row_scale, x2[e] = __bfloat162float(h.x2[e]) * h.row_scale;
  if (kind < 2) {
    if (h.normed) {
      float sum = 0.f;
#pragma unroll
      for (int e = 0; e < P; ++e) sum += x1[e] * x1[e] + x2[e] * x2[e];
      const float rstd = 1.0f / sqrtf(warp_sum(sum) / static_cast<float>(D) + fresh.eps);
#pragma unroll
      for (int e = 0; e < P; ++e) {
        x1[e] = __bfloat162float(h.w1[e]) * (x1[e] * rstd);
        x2[e] = __bfloat162float(h.w2[e]) * (x2[e] * rstd);
      }
    }
    const float position = static_cast<float>(h.position);
#pragma unroll
    for (int e = 0; e < P; ++e) {
      float sine, cosine;
      sincosf(position * h.freq[e], &sine, &cosine);
      const float y1 = x1[e] * cosine - x2[e] * sine, y2 = x2[e] * cosine + x1[e] * sine;
      x1[e] = y1, x2[e] = y2;
    }
  }
#pragma unroll
  for (int e = 0; e < P; ++e)
    x1[e] = __bfloat162float(__float2bfloat16_rn(x1[e])), x2[e] = __bfloat162float(__float2bfloat16_rn(x2[e]));
  if (kind == 0) {
    bf16* to = queries + job * D + lane * P;
#pragma unroll
    for (int e = 0; e < P; ++e) to[e] = __float2bfloat16_rn(x1[e]), to[H + e] = __float2bfloat16_rn(x2[e]);
    return;
  }
  const int64_t slot = h.slot;
  const bool stored = slot >= 0 && slot < fresh.rows;  // a slot outside the cache is skipped
  const int64_t at = (slot * geo.kv_heads + head) * D + lane * P;
  void* to = kind == 1 ? fresh.keys : fresh.values;
  if constexpr (Coded) {  // the cache's codes, and held as code · scale
    float amax = 0.f;
#pragma unroll
    for (int e = 0; e < P; ++e) amax = fmaxf(amax, fmaxf(fabsf(x1[e]), fabsf(x2[e])));
    amax = warp_max(amax);
    const float inverse = e4m3_inverse_scale(amax), scale = e4m3_scale(amax);
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const uint8_t low = to_e4m3(x1[e] * inverse), high = to_e4m3(x2[e] * inverse);
      x1[e] = e4m3_to_float(low) * scale, x2[e] = e4m3_to_float(high) * scale;
      if (stored) static_cast<uint8_t*>(to)[at + e] = low, static_cast<uint8_t*>(to)[at + H + e] = high;
    }
    if (stored && lane == 0) (kind == 1 ? fresh.key_scales : fresh.value_scales)[slot * geo.kv_heads + head] = scale;
  } else if (stored) {
#pragma unroll
    for (int e = 0; e < P; ++e)
      static_cast<bf16*>(to)[at + e] = __float2bfloat16_rn(x1[e]), static_cast<bf16*>(to)[at + H + e] = __float2bfloat16_rn(x2[e]);
  }
  float* own = held + (kind - 1) * D + lane * P;
#pragma unroll
  for (int e = 0; e < P; ++e) own[e] = x1[e], own[H + e] = x2[e];
}

template <int D, bool Coded>
struct DecodeLayout {
  static constexpr int row_bytes = D * (Coded ? 1 : 2);  // a key's head in the cache
  static constexpr int pieces = row_bytes / 16;           // 16-byte pieces of a row
  static constexpr int half_bytes = kDecodeStageKeys * row_bytes;  // a stage's K, and its V
  static constexpr int stage_bytes = 2 * half_bytes + (Coded ? 2 * kDecodeStageKeys * 4 : 0);  // + scales
  // Ring depth per warp, measured (H100, batch 256): a BF16 ring of 2 (64 KB a block, 3
  // blocks an SM) beat 3 (2 blocks); codes keep 3 (50 KB, 4 blocks), where 2 with 5 or 6
  // blocks an SM did no better or spilled.
  static constexpr int stages = Coded ? 3 : 2;
  static constexpr int rings_bytes = kWarps * stages * stage_bytes;
  // Then, for fresh rows (FreshRows), the group's queries (BF16), and in FP32 the new key
  // and value and the group's scores against that key.
  static constexpr int queries_bytes = kDecodeMaxGroup * D * static_cast<int>(sizeof(bf16));
  static constexpr int shared_bytes = rings_bytes + queries_bytes + (2 * D + kDecodeMaxGroup) * 4;
  // As many as fit in a multiprocessor's 228 KB, with the 1 KB each block reserves.
  static constexpr int blocks_per_sm = std::min(kDecodeMaxBlocksPerSm, 228 * 1024 / (shared_bytes + 1024));
  static_assert(pieces == 4 || pieces % 8 == 0, "a piece swizzle for this row size");
};

// Where piece p of a stage's key r lies, in 16-byte units: the 8 consecutive keys an
// ldmatrix phase reads at one piece land in 8 different bank quads.
template <int Pieces>
__device__ inline int swizzled_piece(int r, int p) {
  if constexpr (Pieces == 4) return r * Pieces + (p ^ (r / 2 % 4));  // two keys a 128-byte line
  else return r * Pieces + (p ^ (r % 8));
}

// The head dim of row r (0..15) of the Oᵀ tile over piece p: V's ldmatrix.trans gives
// BF16 rows in order; a coded piece's byte pairs give dims 2r and 2r + 1 to rows r, r + 8.
template <bool Coded>
__device__ inline int decode_dim(int p, int r) {
  return Coded ? 16 * p + 2 * (r % 8) + r / 8 : 16 * p + r;
}

// Folds the online-softmax state (other_max, other_sum, other_value) into (max, sum, value):
// maxima in log2 units, sums and values relative to their own maximum.
__device__ inline void merge_state(float& max, float& sum, float& value, float other_max, float other_sum,
                                   float other_value) {
  const float best = fmaxf(max, other_max);
  const float base = best == -INFINITY ? 0.f : best;  // both empty: weights exp2(-inf) = 0
  const float weight = exp2f(max - base), other_weight = exp2f(other_max - base);
  sum = sum * weight + other_sum * other_weight;
  value = value * weight + other_value * other_weight;
  max = best;
}

__device__ inline float warp_column_max(float x) {  // over the 8 lanes of a fragment column pair
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 4));
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 8));
  return fmaxf(x, __shfl_xor_sync(kFullMask, x, 16));
}

template <int D, int G, bool Coded>
__global__ void __launch_bounds__(kThreads, DecodeLayout<D, Coded>::blocks_per_sm)
    attend_decode(bf16* out, float* partial_out, float* partial_lse, const bf16* q,
                  CacheView<std::conditional_t<Coded, uint8_t, bf16>> cache, const int* cu_queries,
                  const int* context_lens, const int* block_tables, Geometry geo, FreshRows fresh) {
  using Layout = DecodeLayout<D, Coded>;
  using Cache = std::conditional_t<Coded, uint8_t, bf16>;
  constexpr int kPieces = Layout::pieces, kStages = Layout::stages;
  constexpr int kPieceElements = 16 / sizeof(Cache);
  extern __shared__ __align__(16) unsigned char shared[];
  const int kv_head = blockIdx.x, b = blockIdx.y, split = blockIdx.z;
  const Sequence seq = sequence_at(cu_queries, context_lens, geo, b);
  const int active = active_splits(seq.context, geo.splits);
  if (seq.queries == 0 || split >= active) return;
  // The sequence's first new token (its only one in a valid decode step) sees keys up to itself.
  const int split_keys = split_length(seq.context, geo.splits), key_begin = split * split_keys;
  const int range_end = min(min(key_begin + split_keys, seq.context), seq.context - seq.queries + 1);
  // With fresh rows, the block whose range ends at the new token takes that key from
  // shared memory, where it puts it, rather than from the cache row it stores it into.
  const bool holds_new_key = fresh.qkv && key_begin < range_end && range_end == seq.context;
  const int key_end = range_end - (holds_new_key ? 1 : 0);
  const int stages = key_end > key_begin ? (key_end - key_begin + kDecodeStageKeys - 1) / kDecodeStageKeys : 0;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;  // fragment row, column pair (mma.cuh)
  const int mine = stages > warp ? (stages - warp + kWarps - 1) / kWarps : 0;  // stages warp + kWarps·n
  const int64_t token = seq.start, q_stride = static_cast<int64_t>(geo.heads) * D;
  const int head0 = kv_head * G;
  const int* table = block_tables + static_cast<int64_t>(b) * geo.max_blocks;
  unsigned char* ring = shared + warp * kStages * Layout::stage_bytes;
  const float scale_log2 = geo.scale * kLog2e;

  // Lane l: the block-table entry of key l % 16 of the warp's stage n and the key's place in
  // that block (block -1 past the range); row_of makes it a cache row (rows < 2^31, checked
  // on the host), or -1 for a block outside the cache (which reads as zeros, as in
  // attend_tiles). Apart, so that an entry is first needed a stage after its read.
  const auto locate = [&](int n) -> KeyPlace {
    const int key = key_begin + (warp + kWarps * n) * kDecodeStageKeys + lane % 16;
    if (n >= mine || key >= key_end) return {-1, 0};
    const int index = block_index(geo, key);
    return {table[index], key - index * geo.block_size};
  };
  const auto row_of = [&](KeyPlace place) {
    return place.block >= 0 && place.block < geo.cache_blocks ? place.block * geo.block_size + place.offset : -1;
  };
  // Stage n's slot in the ring: K pieces, V pieces, then (coded) 16 key and 16 value scales.
  const auto stage_at = [&](int n) { return ring + n % kStages * Layout::stage_bytes; };
  const auto scales_at = [&](int n) { return reinterpret_cast<float*>(stage_at(n) + 2 * Layout::half_bytes); };
  // One commit group per call, empty past the warp's stages, so that the wait counts hold.
  // Each copy instruction takes whole rows (32 / pieces keys), as the cache lays them out.
  constexpr int kKeysPerCopy = 32 / kPieces;
  const int piece = lane % kPieces;
  const Cache* keys_from = cache.keys + kv_head * D + piece * kPieceElements;  // + row · kv_heads · D
  const Cache* values_from = cache.values + kv_head * D + piece * kPieceElements;
  const float* scales_from = Coded ? (lane < 16 ? cache.key_scales : cache.value_scales) + kv_head : nullptr;
  // Row r's offset in units of `unit` elements, r < 0 as row 0: one 32 x 32 -> 64-bit multiply.
  const auto offset = [](int row, unsigned unit) {
    return static_cast<uint64_t>(static_cast<unsigned>(max(row, 0))) * unit;
  };
  const unsigned row_elements = geo.kv_heads * D;
  const auto fetch = [&](int n, KeyPlace place) {
    if (n < mine) {
      const int row = row_of(place);
      unsigned char* keys = stage_at(n);
      unsigned char* values = keys + Layout::half_bytes;
#pragma unroll
      for (int i = 0; i < kDecodeStageKeys / kKeysPerCopy; ++i) {
        const int r = i * kKeysPerCopy + lane / kPieces;
        const int key_row = __shfl_sync(kFullMask, row, r);
        const uint64_t from = offset(key_row, row_elements);
        const int at = swizzled_piece<kPieces>(r, piece) * 16;
        copy_async_16(keys + at, keys_from + from, key_row >= 0);
        copy_async_16(values + at, values_from + from, key_row >= 0);
      }
      if constexpr (Coded)  // lanes 0-15: key l's key scale; 16-31: key l-16's value scale
        copy_async_4(scales_at(n) + lane, scales_from + offset(row, geo.kv_heads), row >= 0);
    }
    copy_async_commit();
  };

  // Fresh rows: each warp's first job's inputs go out first (the copies' commits keep
  // loads behind them), so that they wait beside the block-table reads and the first
  // copies rather than after them.
  const int jobs = fresh.qkv ? G + (holds_new_key ? 2 : 0) : 0;
  FreshHead<D> first_head;
  if (warp < jobs) first_head = load_fresh_head<D, G>(fresh, geo, token, warp, kv_head, lane);

  // The block-table reads of the first stages go out together; afterwards each stage's
  // read is one stage ahead of its copy.
  KeyPlace where[kStages];
#pragma unroll
  for (int n = 0; n < kStages; ++n) where[n] = locate(n);
#pragma unroll
  for (int n = 0; n + 1 < kStages; ++n) fetch(n, where[n]);
  KeyPlace next = where[kStages - 1];

  // Qᵀ as B operands: column g is query g (zero past the group). Step j's k rows are dims
  // 16j + [2c, 2c+1] and [2c+8, 2c+9] for BF16; for codes (whose 4 bytes at a time come
  // from one key) 16j + 4c + [0, 1] and [2, 3], in FP16 times the softmax scale.
  unsigned query[D / 16][2];
  const bf16* own = q + token * q_stride + (head0 + min(g, G - 1)) * D;
  // Fresh rows: the group's queries and (one block a sequence) the new key and value,
  // made while the first stages' copies are in flight; then the group's scores against
  // that key, in log2 units as the stages' are.
  bf16* fresh_queries = reinterpret_cast<bf16*>(shared + Layout::rings_bytes);
  float* fresh_rows = reinterpret_cast<float*>(shared + Layout::rings_bytes + Layout::queries_bytes);  // k, v, scores
  if (fresh.qkv) {
    for (int job = warp; job < jobs; job += kWarps) {
      const FreshHead<D> head = job == warp ? first_head : load_fresh_head<D, G>(fresh, geo, token, job, kv_head, lane);
      prepare_fresh_head<D, Coded>(head, fresh, geo, job, fresh_queries, fresh_rows, lane);
    }
    __syncthreads();
    own = fresh_queries + min(g, G - 1) * D;
    if (holds_new_key && warp < G) {
      float dot = 0.f;
      for (int d = lane; d < D; d += 32) dot += __bfloat162float(fresh_queries[warp * D + d]) * fresh_rows[d];
      dot = warp_sum(dot);
      if (lane == 0) fresh_rows[2 * D + warp] = dot * scale_log2;
    }
  }
#pragma unroll
  for (int j = 0; j < D / 16; ++j) {
    if constexpr (Coded) {
      const __nv_bfloat162* four = reinterpret_cast<const __nv_bfloat162*>(own + 16 * j + 4 * c);
      const float2 low = __bfloat1622float2(four[0]), high = __bfloat1622float2(four[1]);
      query[j][0] = pack_half2(low.x * scale_log2, low.y * scale_log2);
      query[j][1] = pack_half2(high.x * scale_log2, high.y * scale_log2);
    } else {
      query[j][0] = *reinterpret_cast<const unsigned*>(own + 16 * j + 2 * c);
      query[j][1] = *reinterpret_cast<const unsigned*>(own + 16 * j + 8 + 2 * c);
    }
    if (g >= G) query[j][0] = query[j][1] = 0u;
  }

  // Oᵀ tiles, one per 16-dim piece: rows decode_dim(p, ·), columns the queries. Per column
  // (query 2c + i): the running max in log2 units and this lane's keys' share of the sum.
  float o[D / 16][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  ValueUnit value_unit;  // coded: moved every stage
  // This lane's ldmatrix row: K (and coded V) pieces 2j + lane/16 of key lane % 16, BF16 V
  // pieces 2j + lane/8 % 2 of key 8·(lane/16) + lane % 8.
  const int k_row = lane % 16, k_piece = lane / 16;
  const int v_row = Coded ? k_row : lane / 16 * 8 + lane % 8, v_piece = Coded ? k_piece : lane / 8 % 2;
  for (int n = 0; n < mine; ++n) {
    __syncwarp();  // every lane's reads of stage n - 1, whose slot the fetch below refills
    fetch(n + kStages - 1, next);
    next = locate(n + kStages);
    copy_async_wait<kStages - 1>();
    __syncwarp();  // the lanes' copies of stage n, visible to the whole warp
    const unsigned char* keys = stage_at(n);
    const unsigned char* values = keys + Layout::half_bytes;
    const float* scales = scales_at(n);
    const int key0 = key_begin + (warp + kWarps * n) * kDecodeStageKeys;

    // Sᵀ: rows keys g and g+8 (elements 0,1 and 2,3), columns queries 2c and 2c+1; even
    // and odd steps in two accumulators, for two chains of products instead of one.
    float s[2][4] = {};
    if constexpr (Coded) {
#pragma unroll
      for (int j = 0; j < D / 32; ++j) {
        unsigned r[4];
        ldmatrix_x4(r, keys + swizzled_piece<kPieces>(k_row, 2 * j + k_piece) * 16);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const unsigned a[4] = {e4m3x2_to_half2(r[2 * half] & 0xffffu), e4m3x2_to_half2(r[2 * half + 1] & 0xffffu),
                                 e4m3x2_to_half2(r[2 * half] >> 16), e4m3x2_to_half2(r[2 * half + 1] >> 16)};
          mma_f16(s[half], a, query[2 * j + half][0], query[2 * j + half][1]);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < D / 16; ++j) {
        unsigned a[4];
        ldmatrix_x4(a, keys + swizzled_piece<kPieces>(k_row, 2 * j + k_piece) * 16);
        mma(s[j % 2], a, query[j][0], query[j][1]);
      }
    }
    // V's fragments (a BF16 x4 load per 16 dims, a coded one per 32) go out before the
    // softmax, whose shuffles and exponentials they then overlap instead of following.
    constexpr int kValueLoads = D / (Coded ? 32 : 16);
    unsigned v_frag[kValueLoads][4];
#pragma unroll
    for (int j = 0; j < kValueLoads; ++j)
      ldmatrix_x4_trans(v_frag[j], values + swizzled_piece<kPieces>(v_row, 2 * j + v_piece) * 16);
    float score[4];
    const float key_factor[2] = {Coded ? scales[g] : scale_log2, Coded ? scales[g + 8] : scale_log2};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = e / 2;  // key g, or g + 8
      score[e] = key0 + g + 8 * row < key_end ? (s[0][e] + s[1][e]) * key_factor[row] : -INFINITY;
    }
    // Coded: o moves to the largest value scale so far, and each value's weight is its
    // scale in that unit.
    float unit_change = 1.f, value_weight[2] = {1.f, 1.f};
    if constexpr (Coded) {
      const float low = scales[kDecodeStageKeys + g], high = scales[kDecodeStageKeys + g + 8];
      const float inverse = value_unit.move(warp_column_max(fmaxf(low, high)), unit_change);
      value_weight[0] = low * inverse, value_weight[1] = high * inverse;
    }
    float o_change[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float best = fmaxf(row_max[i], warp_column_max(fmaxf(score[i], score[i + 2])));
      // A column that has seen no key yet keeps max -inf: subtract 0 instead, so that its
      // exponentials are exp2(-inf) = 0 rather than exp2(-inf + inf) = NaN.
      const float base = best == -INFINITY ? 0.f : best;
      const float correction = fast_exp2(row_max[i] - base);
      row_max[i] = best;
      score[i] = fast_exp2(score[i] - base);
      score[i + 2] = fast_exp2(score[i + 2] - base);
      row_sum[i] = row_sum[i] * correction + score[i] + score[i + 2];
      o_change[i] = correction * unit_change;
    }
    if (__any_sync(kFullMask, o_change[0] != 1.f || o_change[1] != 1.f)) {
#pragma unroll
      for (int p = 0; p < D / 16; ++p) {
        o[p][0] *= o_change[0], o[p][1] *= o_change[1];
        o[p][2] *= o_change[0], o[p][3] *= o_change[1];
      }
    }
    // Pᵀ as B operands: lane (g, c) needs query g's weights of keys 2c, 2c+1 (b0) and
    // 2c+8, 2c+9 (b1), which lanes 4·(2c) + g/2 and 4·(2c+1) + g/2 hold as a column pair.
    unsigned low, high;  // this lane's weights of keys g and g+8, queries 2c and 2c+1
    if constexpr (Coded) {
      low = pack_half2(score[0] * value_weight[0], score[1] * value_weight[0]);
      high = pack_half2(score[2] * value_weight[1], score[3] * value_weight[1]);
    } else {
      low = pack_bf16(score[0], score[1]);
      high = pack_bf16(score[2], score[3]);
    }
    const int even = 8 * c + g / 2, odd = even + 4;
    const unsigned pick = g % 2 ? 0x7632u : 0x5410u;  // the column pair's half that is query g
    const unsigned b0 = __byte_perm(__shfl_sync(kFullMask, low, even), __shfl_sync(kFullMask, low, odd), pick);
    const unsigned b1 = __byte_perm(__shfl_sync(kFullMask, high, even), __shfl_sync(kFullMask, high, odd), pick);
    if constexpr (Coded) {
#pragma unroll
      for (int j = 0; j < kValueLoads; ++j) {
        const unsigned (&r)[4] = v_frag[j];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          // Keys (2c, 2c+1) [+8] of dims 2g, 2g+1 → FP16 pairs of one dim, two keys.
          const unsigned first = __byte_perm(r[2 * half], 0u, 0x3120u), second = __byte_perm(r[2 * half + 1], 0u, 0x3120u);
          const unsigned a[4] = {e4m3x2_to_half2(first & 0xffffu), e4m3x2_to_half2(first >> 16),
                                 e4m3x2_to_half2(second & 0xffffu), e4m3x2_to_half2(second >> 16)};
          mma_f16(o[2 * j + half], a, b0, b1);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < kValueLoads; ++j) mma(o[j], v_frag[j], b0, b1);
    }
  }

  // Each warp's state goes into its own ring, once every copy into it was waited for (all
  // of the warp's stages were) and every lane has read its last piece.
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int offset = 4; offset < 32; offset <<= 1) row_sum[i] += __shfl_xor_sync(kFullMask, row_sum[i], offset);
  const float unit = Coded ? value_unit.scale : 1.f;
  __syncwarp();
  float* state = reinterpret_cast<float*>(ring);  // [G][D] outputs, then [G] maxima and [G] sums
#pragma unroll
  for (int p = 0; p < D / 16; ++p)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int query = 2 * c + e % 2;
      if (query < G) state[query * D + decode_dim<Coded>(p, g + 8 * (e / 2))] = o[p][e] * unit;
    }
  if (g == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (2 * c + i < G) state[G * D + 2 * c + i] = row_max[i], state[G * D + G + 2 * c + i] = row_sum[i];
  }
  __syncthreads();

  for (int e = threadIdx.x; e < G * D; e += kThreads) {
    const int query = e / D, d = e % D;
    float max = -INFINITY, sum = 0.f, value = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      const float* other = reinterpret_cast<const float*>(shared + w * kStages * Layout::stage_bytes);
      merge_state(max, sum, value, other[G * D + query], other[G * D + G + query], other[query * D + d]);
    }
    if (holds_new_key) merge_state(max, sum, value, fresh_rows[2 * D + query], 1.f, fresh_rows[D + d]);
    write_result(out, partial_out, partial_lse, geo, active, split, token, head0 + query, d, {value}, sum, max);
  }
}

// One warp per (token, head) of a sequence with more than one active split: the splits'
// normalised partial outputs weighted by their share of the softmax sum.
__global__ void __launch_bounds__(kThreads)
    combine_splits(bf16* out, const float* partial_out, const float* partial_lse, const int* cu_queries,
                   const int* context_lens, Geometry geo) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<int64_t>(geo.tokens) * geo.heads) return;
  const int t = static_cast<int>(row / geo.heads);
  const int b = sequence_of(cu_queries, geo.sequences, t);
  const Sequence seq = sequence_at(cu_queries, context_lens, geo, b);
  const int active = active_splits(seq.context, geo.splits);
  if (active <= 1 || t < seq.start || t >= seq.start + seq.queries) return;
  const int64_t split_rows = static_cast<int64_t>(geo.tokens) * geo.heads;
  float best = -INFINITY;
  for (int s = 0; s < active; ++s) best = fmaxf(best, partial_lse[s * split_rows + row]);
  const float base = best == -INFINITY ? 0.f : best;
  float sum = 0;
  for (int s = 0; s < active; ++s) sum += exp2f(partial_lse[s * split_rows + row] - base);
  const float inverse = sum > 0 ? 1.f / sum : 0.f;
  const int D = geo.head_dim;
  for (int d = lane; d < D; d += 32) {
    float value = 0;
    for (int s = 0; s < active; ++s)
      value += exp2f(partial_lse[s * split_rows + row] - base) * partial_out[(s * split_rows + row) * D + d];
    out[row * D + d] = __float2bfloat16_rn(value * inverse);
  }
}

// ---------------------------------------------------------------------------------------
// Host side.

void check_launch(const char* op) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("kernels/paged_attention.cu: ") + op + ": kernel launch failed: " +
                             cudaGetErrorString(status));
}

[[noreturn]] void fail(const char* op, const std::string& why) {
  throw std::invalid_argument(std::string(op) + ": " + why);
}

// block_index's multiplier: with shift the least s where 2^s >= block_size,
// magic = 2^32 (2^s - block_size) / block_size + 1, which is below 2^32.
void divide_by_block(Geometry& geo, int block_size) {
  int shift = 0;
  while ((int64_t{1} << shift) < block_size) ++shift;
  geo.block_size = block_size;
  geo.block_shift = shift;
  geo.block_magic =
      static_cast<unsigned>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - block_size)) / block_size + 1);
}

bool tensor_core_head_dim(int head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

// Calls launch(std::integral_constant<int, D>) for the tensor-core head sizes.
template <class Launch>
void with_head_dim(int head_dim, Launch&& launch) {
  switch (head_dim) {
    case 16: return launch(std::integral_constant<int, 16>{});
    case 32: return launch(std::integral_constant<int, 32>{});
    case 64: return launch(std::integral_constant<int, 64>{});
    case 128: return launch(std::integral_constant<int, 128>{});
    default: throw std::logic_error("kernels/paged_attention.cu: no tiles for head_dim " + std::to_string(head_dim));
  }
}

int multiprocessors() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    throw std::runtime_error("kernels/paged_attention.cu: cannot read the device's multiprocessor count");
  return count;
}

// The tensor-core launch for a step of `tokens` new tokens in `sequences` sequences:
// everything follows from the shapes. A decode step (T == B) holds one query per
// sequence and gets 16-row blocks; otherwise blocks hold 64 rows.
struct TilePlan {
  int row_tiles, slice_heads, slices, per_tile;
  int64_t tiles;  // blocks per kv head slice and split
  int splits;
};

TilePlan plan_tiles(int64_t tokens, int64_t sequences, int heads, int kv_heads, int64_t max_context,
                    int64_t workspace_rows, int sms) {
  TilePlan plan{};
  const int group = heads / kv_heads;
  plan.row_tiles = tokens == sequences ? 1 : 4;
  plan.slice_heads = std::min(group, 16 * plan.row_tiles);
  plan.slices = (group + plan.slice_heads - 1) / plan.slice_heads;
  plan.per_tile = std::max(1, 16 * plan.row_tiles / plan.slice_heads);
  // Σ ceil(n_b / per_tile) <= (T + B·(per_tile - 1)) / per_tile.
  plan.tiles = (tokens + sequences * (plan.per_tile - 1)) / plan.per_tile;
  // About eight blocks per multiprocessor (two or three resident, a few waves, so that
  // the last wave's tail is short), no more ranges than the longest context has chunks,
  // and no more partials than the workspace holds. Short contexts use fewer ranges.
  const int64_t blocks = plan.tiles * kv_heads * plan.slices;
  int64_t splits = (8 * static_cast<int64_t>(sms) + blocks - 1) / blocks;
  splits = std::min<int64_t>(splits, kMaxSplits);
  splits = std::min<int64_t>(splits, (max_context + kChunk - 1) / kChunk);
  splits = std::min<int64_t>(splits, workspace_rows / std::max<int64_t>(tokens * heads, 1));
  plan.splits = static_cast<int>(std::max<int64_t>(splits, 1));
  return plan;
}

// Decode steps (T == B) on the decode kernel: the group sizes and head sizes it is built for.
bool decode_kernel_fits(int group, int head_dim) {
  return (group == 1 || group == 2 || group == 4) && (head_dim == 64 || head_dim == 128);
}

int decode_blocks_per_sm(int head_dim, bool coded) {
  if (head_dim == 64) return coded ? DecodeLayout<64, true>::blocks_per_sm : DecodeLayout<64, false>::blocks_per_sm;
  return coded ? DecodeLayout<128, true>::blocks_per_sm : DecodeLayout<128, false>::blocks_per_sm;
}

// Calls launch(std::integral_constant<int, G>) for the decode kernel's group sizes.
template <class Launch>
void with_group(int group, Launch&& launch) {
  switch (group) {
    case 1: return launch(std::integral_constant<int, 1>{});
    case 2: return launch(std::integral_constant<int, 2>{});
    case 4: return launch(std::integral_constant<int, 4>{});
    default:
      throw std::logic_error("kernels/paged_attention.cu: no decode kernel for groups of " + std::to_string(group));
  }
}

// Blocks (sequence, kv head, split) of a decode step: split-K only when the B·kv_heads
// blocks leave whole resident slots of the device empty, and never into more blocks than
// it holds at once (a second wave and the combine cost more than empty slots). Further
// limits as in plan_tiles.
int plan_decode_splits(int64_t sequences, int heads, int kv_heads, int64_t max_context, int64_t workspace_rows,
                       int sms, int blocks_per_sm) {
  const int64_t blocks = sequences * kv_heads;
  int64_t splits = static_cast<int64_t>(blocks_per_sm) * sms / blocks;
  splits = std::min<int64_t>(splits, kMaxSplits);
  splits = std::min<int64_t>(splits, (max_context + kChunk - 1) / kChunk);
  splits = std::min<int64_t>(splits, workspace_rows / std::max<int64_t>(sequences * heads, 1));
  return static_cast<int>(std::max<int64_t>(splits, 1));
}

template <class Kernel>
void allow_shared(Kernel kernel, int bytes, const char* what) {
  cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status == cudaSuccess)  // the blocks per multiprocessor it was designed for need the largest carveout
    status = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  static_cast<int>(cudaSharedmemCarveoutMaxShared));
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("kernels/paged_attention.cu: cannot give the ") + what + " kernel " +
                             std::to_string(bytes) + " bytes of shared memory: " + cudaGetErrorString(status));
}

template <int D>
void allow_tile_shared() {
  allow_shared(attend_tiles<D, 1, false>, TileShared<D, 1, false>::bytes, "attend");
  allow_shared(attend_tiles<D, 4, false>, TileShared<D, 4, false>::bytes, "attend");
  allow_shared(attend_tiles<D, 1, true>, TileShared<D, 1, true>::bytes, "attend");
  allow_shared(attend_tiles<D, 4, true>, TileShared<D, 4, true>::bytes, "attend");
}

template <int D, int G, bool Coded>
void allow_decode_shared() {
  allow_shared(attend_decode<D, G, Coded>, DecodeLayout<D, Coded>::shared_bytes, "decode");
}

bool aligned_16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data) % 16 == 0; }

// The cache's tensors: keys and values of the working dtype, or F8_E4M3 with scales;
// returns whether they are coded.
bool check_cache(const char* op, const CacheLayer& cache, DType working, int64_t width, int64_t kv_heads) {
  check_op_arg(cache.keys, op, "keys", Device::CUDA, {working, DType::F8_E4M3}, {kAnyExtent, width});
  const int64_t rows = cache.keys.shape[0];
  check_op_arg(cache.values, op, "values", Device::CUDA, {cache.keys.dtype}, {rows, width});
  if (cache.keys.dtype != DType::F8_E4M3) return false;
  check_op_arg(cache.key_scales, op, "key_scales", Device::CUDA, {DType::F32}, {rows, kv_heads});
  check_op_arg(cache.value_scales, op, "value_scales", Device::CUDA, {DType::F32}, {rows, kv_heads});
  return true;
}

template <class Cache>
CacheView<Cache> cache_view(const CacheLayer& cache) {
  return {cache.keys.ptr<const Cache>(), cache.values.ptr<const Cache>(), cache.key_scales.ptr<const float>(),
          cache.value_scales.ptr<const float>()};
}

}  // namespace

void paged_attention_setup() {
  static std::once_flag once;
  std::call_once(once, [] {
    allow_tile_shared<16>(), allow_tile_shared<32>(), allow_tile_shared<64>(), allow_tile_shared<128>();
    allow_decode_shared<64, 1, false>(), allow_decode_shared<64, 2, false>(), allow_decode_shared<64, 4, false>();
    allow_decode_shared<128, 1, false>(), allow_decode_shared<128, 2, false>(), allow_decode_shared<128, 4, false>();
    allow_decode_shared<64, 1, true>(), allow_decode_shared<64, 2, true>(), allow_decode_shared<64, 4, true>();
    allow_decode_shared<128, 1, true>(), allow_decode_shared<128, 2, true>(), allow_decode_shared<128, 4, true>();
  });
}

size_t paged_workspace_floats(int64_t max_tokens, int64_t max_sequences, int heads, int kv_heads, int head_dim) {
  if (max_sequences < 1 || max_tokens < max_sequences || heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 ||
      head_dim <= 0)
    throw std::invalid_argument("cuda::paged_workspace_floats: steps of " + std::to_string(max_tokens) +
                                " tokens in " + std::to_string(max_sequences) + " sequences, " +
                                std::to_string(heads) + " query heads over " + std::to_string(kv_heads) +
                                " key/value heads of " + std::to_string(head_dim) + " dims");
  const int sms = multiprocessors();
  const auto rows = [&](int64_t tokens, int64_t sequences) {  // (split, token, head) rows of one step
    int64_t splits = plan_tiles(tokens, sequences, heads, kv_heads, INT_MAX, INT64_MAX, sms).splits;
    if (tokens == sequences)  // either decode launch, whichever the dtype and alignment pick
      splits = std::max<int64_t>(splits, plan_decode_splits(sequences, heads, kv_heads, INT_MAX, INT64_MAX, sms,
                                                             kDecodeMaxBlocksPerSm));
    return splits * tokens * heads;
  };
  // Decode steps of every size; longer steps split most with a single sequence.
  int64_t most = 0;
  for (int64_t b = 1; b <= max_sequences; ++b) most = std::max(most, rows(b, b));
  for (int64_t t = 2; t <= max_tokens; ++t) most = std::max(most, rows(t, 1));
  return static_cast<size_t>(most) * (head_dim + 1);
}

void paged_store(const CacheLayer& cache, const Tensor& k, const Tensor& v, const Tensor& slots, cudaStream_t stream) {
  const char* op = "cuda::paged_store";
  check_op_arg(cache.keys, op, "keys", Device::CUDA, {DType::BF16, DType::F32, DType::F8_E4M3}, {kAnyExtent, kAnyExtent});
  const int64_t width = cache.keys.shape[1];
  if (cache.keys.dtype == DType::F8_E4M3)
    check_op_arg(k, op, "k", Device::CUDA, {DType::BF16, DType::F32}, {kAnyExtent, width});
  else
    check_op_arg(k, op, "k", Device::CUDA, {cache.keys.dtype}, {kAnyExtent, width});
  const int64_t T = k.shape[0];
  check_op_arg(v, op, "v", Device::CUDA, {k.dtype}, {T, width});
  check_op_arg(slots, op, "slots", Device::CUDA, {DType::I32}, {T});
  // A coded cache's scales name its heads; other rows are copied whole.
  const Tensor& scales = cache.key_scales;
  const int64_t kv_heads = scales.data && scales.shape.size() == 2 ? scales.shape[1] : 1;
  if (kv_heads < 1 || width % kv_heads != 0)
    fail(op, k.describe() + " does not split into the " + std::to_string(kv_heads) + " heads of " + scales.describe());
  const bool coded = check_cache(op, cache, k.dtype, width, kv_heads);
  if (T > INT_MAX) fail(op, "more than INT_MAX tokens in " + slots.describe());
  if (T == 0) return;
  const int64_t rows = cache.keys.shape[0];
  if (coded) {
    const auto launch = [&](auto element) {
      using Element = decltype(element);
      const int64_t threads = T * kv_heads * 32;
      store_coded_rows<Element><<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
          cache.keys.ptr<uint8_t>(), cache.values.ptr<uint8_t>(), cache.key_scales.ptr<float>(),
          cache.value_scales.ptr<float>(), k.ptr<const Element>(), v.ptr<const Element>(), slots.ptr<const int>(),
          static_cast<int>(T), rows, static_cast<int>(kv_heads), static_cast<int>(width / kv_heads));
    };
    if (k.dtype == DType::BF16) launch(bf16{});
    else launch(float{});
    return check_launch(op);
  }
  const int64_t row_bytes = width * static_cast<int64_t>(dtype_size(k.dtype));
  const auto launch = [&](auto unit) {
    using Unit = decltype(unit);
    const int units = static_cast<int>(row_bytes / sizeof(Unit));
    const int64_t threads = T * units;
    store_rows<Unit><<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        cache.keys.ptr<Unit>(), cache.values.ptr<Unit>(), k.ptr<const Unit>(), v.ptr<const Unit>(),
        slots.ptr<const int>(), static_cast<int>(T), rows, units);
  };
  const bool wide = row_bytes % 16 == 0 && aligned_16(cache.keys) && aligned_16(cache.values) && aligned_16(k) &&
                    aligned_16(v);
  if (wide) launch(uint4{});
  else if (row_bytes % 4 == 0) launch(unsigned{});
  else launch(uint16_t{});
  check_launch(op);
}

namespace {

// Whether paged_attend runs a step of T tokens in B sequences on the decode kernel.
bool takes_decode_kernel(const Tensor& out, const Tensor& q, const CacheLayer& cache, int64_t T, int64_t B, int heads,
                         int kv_heads) {
  // The grid's y dimension holds the sequences (at most 65,535).
  return q.dtype == DType::BF16 && T == B && B <= 65535 && decode_kernel_fits(heads / kv_heads, q.shape[1] / heads) &&
         aligned_16(q) && aligned_16(out) && aligned_16(cache.keys) && aligned_16(cache.values);
}

// paged_attend, whose decode kernel takes `fresh` (FreshRows; other paths take none).
void attend(const char* op, const Tensor& out, const Tensor& q, const CacheLayer& cache, const PagedBatch& batch,
            int heads, int kv_heads, const Tensor& workspace, const FreshRows& fresh, cudaStream_t stream) {
  check_op_arg(q, op, "q", Device::CUDA, {DType::BF16, DType::F32}, {kAnyExtent, kAnyExtent});
  const int64_t T = q.shape[0];
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || q.shape[1] % heads != 0 || q.shape[1] == 0 ||
      q.shape[1] / heads > kScalarMaxHeadDim)
    fail(op, std::to_string(heads) + " query heads over " + std::to_string(kv_heads) +
                 " key/value heads do not fit q " + q.describe() + " (head_dim at most " +
                 std::to_string(kScalarMaxHeadDim) + ")");
  const int64_t D = q.shape[1] / heads;
  check_op_arg(out, op, "out", Device::CUDA, {q.dtype}, {T, heads * D});
  const bool coded = check_cache(op, cache, q.dtype, kv_heads * D, kv_heads);
  const int64_t rows = cache.keys.shape[0];
  check_op_arg(batch.cu_queries, op, "cu_queries", Device::CUDA, {DType::I32}, {kAnyExtent});
  const int64_t B = batch.cu_queries.shape[0] - 1;
  if (B < 1 || B > T)
    fail(op, "cu_queries " + batch.cu_queries.describe() + " must describe 1 to " + std::to_string(T) +
                 " sequences (each has a new token)");
  check_op_arg(batch.context_lens, op, "context_lens", Device::CUDA, {DType::I32}, {B});
  check_op_arg(batch.block_tables, op, "block_tables", Device::CUDA, {DType::I32}, {B, kAnyExtent});
  check_op_arg(workspace, op, "workspace", Device::CUDA, {DType::F32}, {kAnyExtent});
  const int64_t max_blocks = batch.block_tables.shape[1];
  if (batch.block_size < 1 || max_blocks * batch.block_size > INT_MAX || T > INT_MAX)
    fail(op, "block size " + std::to_string(batch.block_size) + " with " + std::to_string(max_blocks) +
                 " blocks per sequence and " + std::to_string(T) + " tokens is out of range");
  if (rows > INT_MAX) fail(op, cache.keys.describe() + " holds more than INT_MAX rows");

  Geometry geo{};
  geo.tokens = static_cast<int>(T);
  geo.sequences = static_cast<int>(B);
  geo.heads = heads;
  geo.kv_heads = kv_heads;
  geo.head_dim = static_cast<int>(D);
  geo.max_blocks = static_cast<int>(max_blocks);
  divide_by_block(geo, batch.block_size);
  geo.cache_blocks = rows / batch.block_size;
  geo.scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int* cu = batch.cu_queries.ptr<const int>();
  const int* context = batch.context_lens.ptr<const int>();
  const int* tables = batch.block_tables.ptr<const int>();

  const bool decode = takes_decode_kernel(out, q, cache, T, B, heads, kv_heads);
  const bool tiled = q.dtype == DType::BF16 && tensor_core_head_dim(geo.head_dim) && aligned_16(q) &&
                     aligned_16(out) && aligned_16(cache.keys) && aligned_16(cache.values);
  if (fresh.qkv && !decode) throw std::logic_error(std::string(op) + ": fresh rows off the decode kernel");
  if (!tiled) {
    const unsigned blocks = static_cast<unsigned>((T * heads + kWarps - 1) / kWarps);
    const auto launch = [&](auto element, auto stored) {
      using Element = decltype(element);
      using Cache = decltype(stored);
      attend_rows<Element, Cache><<<blocks, kThreads, 0, stream>>>(out.ptr<Element>(), q.ptr<const Element>(),
                                                                   cache_view<Cache>(cache), cu, context, tables, geo);
    };
    if (q.dtype == DType::BF16) coded ? launch(bf16{}, uint8_t{}) : launch(bf16{}, bf16{});
    else coded ? launch(float{}, uint8_t{}) : launch(float{}, float{});
    return check_launch(op);
  }

  paged_attention_setup();
  const int64_t workspace_rows = workspace.shape[0] / (D + 1);
  const int64_t max_context = max_blocks * batch.block_size;
  const int sms = multiprocessors(), group = heads / kv_heads;
  const TilePlan plan = plan_tiles(T, B, heads, kv_heads, max_context, workspace_rows, sms);
  geo.slice_heads = plan.slice_heads;
  geo.slices = plan.slices;
  geo.per_tile = plan.per_tile;
  geo.splits = decode ? plan_decode_splits(B, heads, kv_heads, max_context, workspace_rows, sms,
                                           decode_blocks_per_sm(geo.head_dim, coded))
                      : plan.splits;
  float* partial_out = workspace.ptr<float>();
  float* partial_lse = partial_out + static_cast<int64_t>(geo.splits) * T * heads * D;
  const auto launch = [&](auto coded_tag, auto kernel, dim3 grid, int bytes, auto... extra) {
    using Cache = std::conditional_t<decltype(coded_tag)::value, uint8_t, bf16>;
    kernel<<<grid, kThreads, bytes, stream>>>(out.ptr<bf16>(), partial_out, partial_lse, q.ptr<const bf16>(),
                                              cache_view<Cache>(cache), cu, context, tables, geo, extra...);
  };
  const auto with_coded = [&](auto&& f) { coded ? f(std::true_type{}) : f(std::false_type{}); };
  with_coded([&](auto coded_tag) {
    constexpr bool Coded = decltype(coded_tag)::value;
    if (decode) {
      // A sequence's kv heads side by side: together they read whole cache rows (every
      // head's 2 x head_dim bytes of a token), where blocks of one head over many sequences
      // read 1/kv_heads of each row and leave the rest to a later wave.
      const dim3 grid(static_cast<unsigned>(kv_heads), static_cast<unsigned>(B), static_cast<unsigned>(geo.splits));
      with_group(group, [&](auto g) {
        constexpr int G = decltype(g)::value;
        if (geo.head_dim == 64) {
          launch(coded_tag, attend_decode<64, G, Coded>, grid, DecodeLayout<64, Coded>::shared_bytes, fresh);
        } else {
          launch(coded_tag, attend_decode<128, G, Coded>, grid, DecodeLayout<128, Coded>::shared_bytes, fresh);
        }
      });
    } else {
      const dim3 grid(static_cast<unsigned>(plan.tiles), static_cast<unsigned>(kv_heads * plan.slices),
                      static_cast<unsigned>(plan.splits));
      with_head_dim(geo.head_dim, [&](auto dim) {
        constexpr int Dim = decltype(dim)::value;
        if (plan.row_tiles == 1) launch(coded_tag, attend_tiles<Dim, 1, Coded>, grid, TileShared<Dim, 1, Coded>::bytes);
        else launch(coded_tag, attend_tiles<Dim, 4, Coded>, grid, TileShared<Dim, 4, Coded>::bytes);
      });
    }
  });
  check_launch(op);
  if (geo.splits > 1) {
    const unsigned blocks = static_cast<unsigned>((T * heads + kWarps - 1) / kWarps);
    combine_splits<<<blocks, kThreads, 0, stream>>>(out.ptr<bf16>(), partial_out, partial_lse, cu, context, geo);
    check_launch(op);
  }
}

}  // namespace

void paged_attend(const Tensor& out, const Tensor& q, const CacheLayer& cache, const PagedBatch& batch, int heads,
                  int kv_heads, const Tensor& workspace, cudaStream_t stream) {
  attend("cuda::paged_attend", out, q, cache, batch, heads, kv_heads, workspace, FreshRows{}, stream);
}

void paged_attend_qkv(const Tensor& out, const Tensor& q_scratch, const CacheLayer& cache, const ScaledRows& qkv,
                      const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions, const Tensor& inv_freq,
                      const PagedBatch& batch, int heads, int kv_heads, float eps, const Tensor& workspace,
                      cudaStream_t stream) {
  const char* op = "cuda::paged_attend_qkv";
  const bool norm =
      check_qkv_norm_rope_store(op, q_scratch, cache, qkv, q_norm, k_norm, positions, inv_freq, batch.slots, heads,
                                kv_heads);
  const int64_t T = q_scratch.shape[0], B = batch.cu_queries.numel() - 1;
  if (!takes_decode_kernel(out, q_scratch, cache, T, B, heads, kv_heads) || !aligned_16(qkv.values)) {
    qkv_norm_rope_store(q_scratch, cache, qkv, q_norm, k_norm, positions, inv_freq, batch.slots, heads, kv_heads, eps,
                        stream);
    return paged_attend(out, q_scratch, cache, batch, heads, kv_heads, workspace, stream);
  }
  FreshRows fresh;
  fresh.qkv = qkv.values.ptr<const bf16>();
  fresh.row_scales = qkv.scales.ptr<const float>();
  fresh.q_norm = norm ? q_norm.ptr<const bf16>() : nullptr;
  fresh.k_norm = norm ? k_norm.ptr<const bf16>() : nullptr;
  fresh.positions = positions.ptr<const int>();
  fresh.inv_freq = inv_freq.ptr<const float>();
  fresh.slots = batch.slots.ptr<const int>();
  fresh.keys = cache.keys.data;
  fresh.values = cache.values.data;
  fresh.key_scales = cache.key_scales.ptr<float>();
  fresh.value_scales = cache.value_scales.ptr<float>();
  fresh.rows = cache.keys.shape[0];
  fresh.eps = eps;
  attend(op, out, q_scratch, cache, batch, heads, kv_heads, workspace, fresh, stream);
}

}  // namespace tandem::cuda
