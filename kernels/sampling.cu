#include <cuda_bf16.h>

#include <cfloat>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "model/op_args.h"
#include "sampling.cuh"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kAll = 0xffffffffu;
// The pick pass sums the row in chunks of 256 tokens (8 per lane of a warp), in index
// order, keeping one FP64 sum per chunk in shared memory: the chunk holding the target is
// then found from that table and only it is read again.
constexpr int kPerLane = 8;
constexpr int kChunk = 32 * kPerLane;
constexpr int64_t kMaxVocab = int64_t{1} << 20;  // 32 KiB of chunk sums
// Truncation searches the bits of w = exp(z - max) in [0, 1]: non-negative floats order as
// their bits do. Each pass splits the bracket into 16 buckets, so 8 passes at most.
constexpr int kBuckets = 16;
constexpr uint32_t kKeyEnd = 0x3F800001u;  // one past the bits of 1.0f

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ inline int lane_id() { return threadIdx.x % 32; }
__device__ inline int warp_id() { return threadIdx.x / 32; }

// Rows are read in packs of kPerLane consecutive tokens, one 16-byte access for BF16.
template <class T>
struct alignas(16) Pack {
  T v[kPerLane];
};

template <class T>
struct Row {
  const T* x;
  int64_t V;
  float temperature;  // 1 when greedy
  float max;          // of z = x / temperature
  bool packed;        // the row's packs are 16-byte aligned
  // Divided, not multiplied by 1/T, and expf, not __expf: the CPU twin's arithmetic. x / 1
  // is x exactly, and a division per token costs as much as the read of the row.
  __device__ float z_of(float x_i) const { return temperature == 1.f ? x_i : x_i / temperature; }
  __device__ float z(int64_t i) const { return z_of(to_float(x[i])); }
  __device__ float weight(int64_t i) const { return expf(z(i) - max); }
  __device__ void z_of_pack(const Pack<T>& pack, float (&out)[kPerLane]) const {
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) out[e] = z_of(to_float(pack.v[e]));
  }
  // z of tokens [i, i + kPerLane), -inf past the row's end.
  __device__ void load_z(int64_t i, float (&out)[kPerLane]) const {
    if (packed && i + kPerLane <= V) {
      z_of_pack(*reinterpret_cast<const Pack<T>*>(x + i), out);
    } else {
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) out[e] = i + e < V ? z(i + e) : -INFINITY;
    }
  }
  // Below this z, expf(z - max) is surely under the weight w: the margin covers the
  // rounding of expf, logf and the subtraction, so tokens can be skipped before expf.
  __device__ float z_floor(float w) const { return w > 0 ? max + logf(w) - 1e-3f : -INFINITY; }
};

// The tokens kept after truncation: weight bits above `key`, and those equal to it up to
// index `last_tie` (ties go to the lower index, as in the CPU's sort).
struct Cut {
  uint32_t key;
  int64_t last_tie;
  __device__ bool keeps(int64_t i, float w) const {
    const uint32_t k = __float_as_uint(w);
    return k > key || (k == key && i <= last_tie);
  }
};

// Same value in every thread; fixed order, so the result is the same run after run.
template <class V, class Op>
__device__ V block_reduce(V v, Op op) {
  __shared__ V partial[kWarps];
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(kAll, v, offset));
  if (lane_id() == 0) partial[warp_id()] = v;
  __syncthreads();
  V total = partial[0];
  for (int w = 1; w < kWarps; ++w) total = op(total, partial[w]);
  __syncthreads();
  return total;
}

__device__ double block_sum(double v) {
  return block_reduce(v, [](double a, double b) { return a + b; });
}

__device__ double warp_inclusive_scan(double v) {
  for (int offset = 1; offset < 32; offset <<= 1) {
    const double before = __shfl_up_sync(kAll, v, offset);
    if (lane_id() >= offset) v += before;
  }
  return v;
}

// The weight bits of the last token kept, in the CPU's order, when keeping tokens while
// `enough` (count >= k, or mass >= top_p * kept mass) is not yet true of those before it.
struct Threshold {
  uint32_t key;
  double count_above, mass_above;  // of the tokens with larger weight bits
  double ties;                     // tokens with exactly these weight bits
};

struct Need {
  bool by_mass;
  double amount;
  __device__ bool met(double count, double mass) const { return (by_mass ? mass : count) >= amount; }
};

// Narrows [lo, hi), which holds the threshold (`need` is met at lo, and not at hi), by a
// factor of 16 per pass over the row until one weight value is left in it.
template <class T>
__device__ Threshold search(const Row<T>& row, uint32_t lo, Need need) {
  __shared__ double partial[kWarps][2 * kBuckets];
  uint32_t hi = kKeyEnd;
  double count_above = 0, mass_above = 0;
  for (;;) {
    const uint32_t step = (hi - lo + kBuckets - 1) / kBuckets;
    // count[j], mass[j]: tokens with bits in [lo + j * step, hi), this thread's share.
    float count[kBuckets] = {}, mass[kBuckets] = {};
    uint32_t low_key = UINT32_MAX, high_key = 0;
    const float z_floor = row.z_floor(__uint_as_float(lo));
    for (int64_t i = threadIdx.x * kPerLane; i < row.V; i += kThreads * kPerLane) {
      float z[kPerLane];
      row.load_z(i, z);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        if (z[e] < z_floor) continue;  // most tokens, once the bracket has narrowed
        const float w = expf(z[e] - row.max);
        const uint32_t key = __float_as_uint(w);
        if (key < lo || key >= hi) continue;
        low_key = min(low_key, key), high_key = max(high_key, key);
        const uint32_t bucket = (key - lo) / step;
#pragma unroll
        for (int j = 0; j < kBuckets; ++j)
          if (j <= bucket) count[j] += 1.f, mass[j] += w;
      }
    }
#pragma unroll
    for (int j = 0; j < kBuckets; ++j) {
      for (int offset = 16; offset > 0; offset >>= 1) {
        count[j] += __shfl_xor_sync(kAll, count[j], offset);
        mass[j] += __shfl_xor_sync(kAll, mass[j], offset);
      }
      if (lane_id() == 0) partial[warp_id()][j] = count[j], partial[warp_id()][kBuckets + j] = mass[j];
    }
    low_key = block_reduce(low_key, [](uint32_t a, uint32_t b) { return min(a, b); });  // syncs the partials too
    high_key = block_reduce(high_key, [](uint32_t a, uint32_t b) { return max(a, b); });
    double C[kBuckets + 1], M[kBuckets + 1];
    C[kBuckets] = M[kBuckets] = 0;
    for (int j = 0; j < kBuckets; ++j) {
      C[j] = M[j] = 0;
      for (int w = 0; w < kWarps; ++w) C[j] += partial[w][j], M[j] += partial[w][kBuckets + j];
    }
    __syncthreads();  // partial is rewritten by the next pass
    if (low_key == high_key) return {low_key, count_above, mass_above, C[0]};

    // The highest non-empty bucket whose lower edge still meets the need; failing that
    // (rounding of top_p's target), the lowest non-empty one, which keeps everything.
    const int buckets = static_cast<int>(min(static_cast<uint32_t>(kBuckets), (hi - lo + step - 1) / step));
    int j = static_cast<int>((low_key - lo) / step);
    for (int b = buckets - 1; b > j; --b)
      if (C[b] > C[b + 1] && need.met(count_above + C[b], mass_above + M[b])) {
        j = b;
        break;
      }
    const double inside = C[j] - C[j + 1];
    count_above += C[j + 1], mass_above += M[j + 1];
    const uint32_t next = j + 1 < buckets ? lo + (j + 1) * step : hi;
    lo = max(lo + j * step, low_key);
    hi = min(next, high_key + 1);
    if (hi - lo == 1) return {lo, count_above, mass_above, inside};
  }
}

// The index of the n-th token (from 1, in index order) whose weight bits are `key`.
template <class T>
__device__ int64_t nth_tie(const Row<T>& row, uint32_t key, int64_t n) {
  __shared__ int warp_ties[kWarps];
  __shared__ int64_t found;
  int64_t seen = 0;
  for (int64_t base = 0; seen < n; base += kThreads) {  // seen is the same in every thread
    const int64_t i = base + threadIdx.x;
    const bool tie = i < row.V && __float_as_uint(row.weight(i)) == key;
    const unsigned ballot = __ballot_sync(kAll, tie);
    if (lane_id() == 0) warp_ties[warp_id()] = __popc(ballot);
    __syncthreads();
    int64_t before = seen;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp_id()) before += warp_ties[w];
      seen += warp_ties[w];
    }
    if (tie && before + __popc(ballot & ((1u << lane_id()) - 1)) + 1 == n) found = i;
    __syncthreads();
  }
  return found;
}

// The tokens top-k, then top-p, keep: the CPU's set, found without sorting.
template <class T>
__device__ Cut truncation(const Row<T>& row, int32_t top_k, float top_p, double row_mass) {
  const int64_t k = top_k > 0 ? min(static_cast<int64_t>(top_k), row.V) : row.V;
  if (k == row.V && top_p >= 1) return {0, row.V};
  Threshold at{0, 0, 0, static_cast<double>(row.V)};
  double kept_ties = static_cast<double>(row.V), kept_mass = row_mass;
  if (k < row.V) {
    at = search(row, 0, Need{false, static_cast<double>(k)});
    kept_ties = fmin(fmax(static_cast<double>(k) - at.count_above, 1.0), at.ties);
    kept_mass = at.mass_above + kept_ties * __uint_as_float(at.key);
  }
  if (top_p < 1) {
    const double target = static_cast<double>(top_p) * kept_mass;
    // The last token kept outweighs (1 - top_p) * kept mass / k: it and the tokens after it
    // hold more than that mass. Half that bound starts the bracket, so the first pass
    // already skips most tokens before expf.
    const float floor = static_cast<float>(0.5 * (1.0 - top_p) * kept_mass / static_cast<double>(k));
    const Threshold p = search(row, max(at.key, __float_as_uint(floor)), Need{true, target});
    const double allowed = k < row.V && p.key == at.key ? kept_ties : p.ties;
    const double w = __uint_as_float(p.key);
    kept_ties = w > 0 ? fmin(fmax(ceil((target - p.mass_above) / w), 1.0), allowed) : allowed;
    at = p;
  }
  const int64_t n = static_cast<int64_t>(kept_ties);
  return {at.key, n < static_cast<int64_t>(at.ties) ? nth_tie(row, at.key, n) : row.V};
}

// The FP64 sums of the kept weights of chunks [first, first + chunks), into chunk_mass;
// returns their total.
template <class T>
__device__ double sum_chunks(const Row<T>& row, Cut cut, double* chunk_mass, int64_t first, int64_t chunks) {
  const float z_floor = row.z_floor(__uint_as_float(cut.key));
  double total = 0;
  for (int64_t c = warp_id(); c < chunks; c += kWarps) {
    const int64_t start = (first + c) * kChunk + lane_id() * kPerLane;
    float z[kPerLane];
    row.load_z(start, z);
    double kept = 0;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      if (z[e] < z_floor) continue;
      const float w = expf(z[e] - row.max);
      if (cut.keeps(start + e, w)) kept += w;
    }
    for (int offset = 16; offset > 0; offset >>= 1) kept += __shfl_xor_sync(kAll, kept, offset);
    if (lane_id() == 0) chunk_mass[c] = kept;
    total += kept;  // the same in every lane of the warp
  }
  if (lane_id() != 0) total = 0;
  return block_sum(total);  // its barrier publishes chunk_mass
}

struct Located {
  int64_t index;  // of the entry where the running sum passes the target
  double start;   // the running sum before it
  bool reached;   // false: rounding left the target out of reach, index is the last entry with mass
};

// Walks mass[0, n) in order from `start`: the first entry with mass whose running sum
// passes `target`, or failing that the last entry with mass.
__device__ Located locate(const double* mass, int64_t n, double start, double target) {
  __shared__ double warp_mass[kWarps];
  __shared__ double hit_start;
  // Each thread owns a run of consecutive entries; a block scan gives where each run starts.
  const int64_t per_thread = (n + kThreads - 1) / kThreads;
  const int64_t first = min(threadIdx.x * per_thread, n), end = min(first + per_thread, n);
  double own = 0;
  for (int64_t c = first; c < end; ++c) own += mass[c];
  const double inclusive = warp_inclusive_scan(own);
  if (lane_id() == 31) warp_mass[warp_id()] = inclusive;
  __syncthreads();
  double running = start + inclusive - own;
  for (int w = 0; w < warp_id(); ++w) running += warp_mass[w];
  int64_t hit = n, last = -1;
  double at = 0;
  for (int64_t c = first; c < end; ++c) {
    if (mass[c] <= 0) continue;
    last = c;
    if (hit == n && running + mass[c] > target) hit = c, at = running;
    running += mass[c];
  }
  const int64_t hit_index = block_reduce(hit, [](int64_t a, int64_t b) { return a < b ? a : b; });
  const int64_t last_index = block_reduce(last, [](int64_t a, int64_t b) { return a > b ? a : b; });
  if (hit == hit_index && hit < n) hit_start = at;
  __syncthreads();
  const Located located = hit_index < n ? Located{hit_index, hit_start, true} : Located{last_index, 0, false};
  __syncthreads();  // hit_start is rewritten by the next call
  return located;
}

// Inside one chunk, by one warp: the first kept token whose running sum (from chunk.start)
// passes `target`, or, when the chunk was not reached, its last kept token with weight. The
// same in every lane.
template <class T>
__device__ int64_t pick_in_chunk(const Row<T>& row, Cut cut, Located chunk, double target) {
  const int64_t start = chunk.index * kChunk + lane_id() * kPerLane;
  float w[kPerLane];
  row.load_z(start, w);
  double lane_mass = 0;
  for (int e = 0; e < kPerLane; ++e) {
    w[e] = expf(w[e] - row.max);
    if (!cut.keeps(start + e, w[e])) w[e] = 0.f;
    lane_mass += w[e];
  }
  const double lane_end = warp_inclusive_scan(lane_mass);
  double sum = chunk.start + lane_end - lane_mass;
  int64_t lane_hit = -1, lane_last = -1;
  for (int e = 0; e < kPerLane; ++e) {
    if (w[e] <= 0) continue;
    lane_last = start + e;
    sum += w[e];
    if (chunk.reached && lane_hit < 0 && sum > target) lane_hit = start + e;
  }
  const unsigned hits = __ballot_sync(kAll, lane_hit >= 0);
  if (hits) return __shfl_sync(kAll, lane_hit, __ffs(hits) - 1);
  for (int offset = 16; offset > 0; offset >>= 1) lane_last = max(lane_last, __shfl_xor_sync(kAll, lane_last, offset));
  return lane_last;
}

// locate for one warp over entries in registers, P consecutive ones a lane (lane l holds
// entries l P + [0, P)). The same in every lane.
template <int P>
__device__ Located warp_locate(const double (&mass)[P], double start, double target) {
  double own = 0;
#pragma unroll
  for (int j = 0; j < P; ++j) own += mass[j];
  double running = start + warp_inclusive_scan(own) - own;
  int hit = -1, last = -1;
  double at = 0;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    if (mass[j] <= 0) continue;
    last = lane_id() * P + j;
    if (hit < 0 && running + mass[j] > target) hit = last, at = running;
    running += mass[j];
  }
  if (const unsigned hits = __ballot_sync(kAll, hit >= 0)) {
    const int from = __ffs(hits) - 1;
    return {__shfl_sync(kAll, hit, from), __shfl_sync(kAll, at, from), true};
  }
  for (int offset = 16; offset > 0; offset >>= 1) last = max(last, __shfl_xor_sync(kAll, last, offset));
  return {last, 0, false};
}

// What each tile of kTile tokens of a row gives the row's combination: max and first argmax
// of z, and the FP64 sum of expf(z - tile max), rescaled to the row's max when combined
// (the same weights up to the last bit of each term); the same sum and max for each of its
// chunks, so that a draw reads only the chunk it lands in. A tile's CTA reads kTilePacks
// packs a thread, all in flight before the first is used, and reduces with two barriers:
// one read of the row at the copy rate needs that many bytes in flight, and little else
// per CTA.
constexpr int kTileThreads = 256;
constexpr int kTileWarps = kTileThreads / 32;
constexpr int kTilePacks = 4;
constexpr int kTile = kTileThreads * kTilePacks * kPerLane;  // 8192 tokens
constexpr int kTileChunks = kTile / kChunk;
constexpr int64_t kMaxTiles = kMaxVocab / kTile;
constexpr int kTilesPerLane = static_cast<int>(kMaxTiles / 32);  // one warp combines a row
static_assert(kTile % kChunk == 0 && kTileChunks == 32, "a tile is a chunk a lane");
static_assert(kTilePacks == 4 && kTileWarps * kTilePacks == kTileChunks, "a warp's pack p is one chunk");
struct TileStats {
  double mass;
  float max;
  int32_t first;  // V when the tile holds nothing above -inf
  int32_t bad;    // a NaN or +inf
};
struct ChunkStats {
  double mass;  // at the tile's max
  float max;    // a chunk whose weights all underflow at the row's max gets no mass
};

__host__ __device__ constexpr int64_t tiles_of(int64_t V) { return V > kTile ? (V + kTile - 1) / kTile : 1; }

// Truncated draws are left to sample_kernel: their passes over the row want a larger CTA
// and more registers than the tiles' reads can spare.
__device__ bool truncated_draw(float temperature, int32_t top_k, float top_p, int64_t V) {
  return temperature != 0 && ((top_k > 0 && top_k < V) || top_p < 1);
}

// Warp sums (or maxima) of 4 values a lane, scattered: lane l ends with the one of value
// l / 8, in 6 shuffles where 4 reductions take 20.
template <class V, class Op>
__device__ V warp_reduce_scatter4(const V (&v)[4], Op op) {
  const bool high16 = lane_id() & 16, high8 = lane_id() & 8;
  const V keep0 = high16 ? v[2] : v[0], keep1 = high16 ? v[3] : v[1];
  const V half0 = op(keep0, __shfl_xor_sync(kAll, high16 ? v[0] : v[2], 16));
  const V half1 = op(keep1, __shfl_xor_sync(kAll, high16 ? v[1] : v[3], 16));
  V x = op(high8 ? half1 : half0, __shfl_xor_sync(kAll, high8 ? half0 : half1, 8));
  for (int offset = 4; offset > 0; offset >>= 1) x = op(x, __shfl_xor_sync(kAll, x, offset));
  return x;
}

// A sum of weights taken at `taken_at` (a tile's max), at the row's max instead. Weights
// whose largest, `largest`, underflows to 0 at the row's max (as the CPU's FP32 weights do)
// give no mass, or a draw could land among them and find no token there.
__device__ double mass_at_row_max(double mass, float taken_at, float largest, float row_max) {
  return expf(largest - row_max) > 0 ? mass * exp(static_cast<double>(taken_at) - static_cast<double>(row_max)) : 0.0;
}

struct RowTotals {
  float max;
  int64_t first;  // first argmax
  bool bad;       // a NaN or +inf, or nothing above -inf
  double mass;    // of all weights, at the row's max
};

// One warp combines the row's tiles, written by other CTAs (read from L2): lane l takes
// tiles l kTilesPerLane + [0, kTilesPerLane), whose masses at the row's max it leaves in
// `scaled`. The same totals in every lane.
__device__ RowTotals warp_combine_tiles(const TileStats* row_stats, int64_t tiles, int64_t V,
                                        double (&scaled)[kTilesPerLane]) {
  TileStats own[kTilesPerLane];
  float max = -INFINITY;
  bool bad = false;
#pragma unroll
  for (int j = 0; j < kTilesPerLane; ++j) {
    const int64_t t = lane_id() * kTilesPerLane + j;
    own[j] = {0, -INFINITY, static_cast<int32_t>(V), 0};
    if (t < tiles) own[j] = {__ldcg(&row_stats[t].mass), __ldcg(&row_stats[t].max), __ldcg(&row_stats[t].first),
                             __ldcg(&row_stats[t].bad)};
    max = fmaxf(max, own[j].max);
    bad |= own[j].bad != 0;
  }
  for (int offset = 16; offset > 0; offset >>= 1) max = fmaxf(max, __shfl_xor_sync(kAll, max, offset));
  int64_t first = V;
  double mass = 0;
#pragma unroll
  for (int j = 0; j < kTilesPerLane; ++j) {
    if (own[j].max == max) first = min(first, static_cast<int64_t>(own[j].first));
    scaled[j] = mass_at_row_max(own[j].mass, own[j].max, own[j].max, max);
    mass += scaled[j];
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    first = min(first, __shfl_xor_sync(kAll, first, offset));
    mass += __shfl_xor_sync(kAll, mass, offset);
  }
  return {max, first, __any_sync(kAll, bad) || first == V, mass};
}

// A row whose logits hold a NaN or +inf, or only -inf, gets id -1 and a NaN log-prob.
__device__ bool settled_as_bad(int32_t* ids, float* logprobs, int64_t r, const RowTotals& totals) {
  if (totals.bad && threadIdx.x == 0) ids[r] = -1, logprobs[r] = NAN;
  return totals.bad;
}

template <class T>
__device__ void write_token(int32_t* ids, float* logprobs, int64_t r, const Row<T>& row, int64_t id, double mass) {
  ids[r] = static_cast<int32_t>(id);
  logprobs[r] = static_cast<float>(static_cast<double>(row.z(id) - row.max) - log(mass));
}

// A full-vocabulary draw, by one warp: its tile from the rescaled tile sums, its chunk from
// that tile's chunk sums, then its token.
template <class T>
__device__ int64_t draw_from_all(const Row<T>& row, const TileStats* row_stats, const ChunkStats* row_chunks,
                                 const double (&tile_mass)[kTilesPerLane], double mass, float u) {
  double target = static_cast<double>(u) * mass;
  const Located tile = warp_locate(tile_mass, 0.0, target);
  const ChunkStats own = {__ldcg(&row_chunks[tile.index * kTileChunks + lane_id()].mass),
                          __ldcg(&row_chunks[tile.index * kTileChunks + lane_id()].max)};
  const float tile_max = __ldcg(&row_stats[tile.index].max);
  const double chunk_mass[1] = {mass_at_row_max(own.mass, tile_max, own.max, row.max)};
  if (!tile.reached) target = INFINITY;
  Located chunk = warp_locate(chunk_mass, tile.start, target);
  chunk.index += tile.index * kTileChunks;
  return pick_in_chunk(row, Cut{0, row.V}, chunk, target);
}

// Grid (B, tiles): pack p of thread t holds tokens kPerLane (p kTileThreads + t) + [0,
// kPerLane) of the tile, so a warp's pack p is one chunk, 512 contiguous bytes of BF16. The
// last CTA of a row to finish (counted in tiles_done[r], which it sets back to 0) combines
// the row's tiles with one warp and settles the row, unless its draw is truncated: then
// sample_kernel does.
template <class T>
__global__ void __launch_bounds__(kTileThreads)
    tile_kernel(int32_t* ids, float* logprobs, TileStats* stats, ChunkStats* chunk_stats, int32_t* tiles_done,
                const T* logits, int64_t V, bool packed, const float* temperatures, const int32_t* top_ks,
                const float* top_ps, const float* uniforms) {
  __shared__ float warp_max[kTileWarps];
  __shared__ int32_t warp_first[kTileWarps];
  __shared__ bool warp_bad[kTileWarps];
  __shared__ double warp_mass[kTileWarps];
  __shared__ ChunkStats tile_chunks[kTileChunks];
  const int64_t r = blockIdx.x;  // rows on x: y and z stop at 65535
  const float temperature = temperatures[r];
  Row<T> row{logits + r * V, V, temperature == 0 ? 1.f : temperature, 0.f, packed};
  const int64_t tile = static_cast<int64_t>(blockIdx.y) * kTile;
  auto start_of = [&](int p) { return tile + (p * kTileThreads + threadIdx.x) * kPerLane; };
  float z[kTilePacks][kPerLane];
  if (packed && tile + kTile <= V) {  // every pack whole: the loads go out together
    Pack<T> packs[kTilePacks];
#pragma unroll
    for (int p = 0; p < kTilePacks; ++p) packs[p] = *reinterpret_cast<const Pack<T>*>(row.x + start_of(p));
#pragma unroll
    for (int p = 0; p < kTilePacks; ++p) row.z_of_pack(packs[p], z[p]);
  } else {
#pragma unroll
    for (int p = 0; p < kTilePacks; ++p) row.load_z(start_of(p), z[p]);
  }
  // Per token only a max and a flag: the tile's first argmax is looked for after its max is
  // known, by the threads that hold it. FP32 sums of a pack's 8 weights, FP64 beyond: a
  // conversion to FP64 per token would cost more than the read.
  float pack_max[kTilePacks];
  bool bad = false;
#pragma unroll
  for (int p = 0; p < kTilePacks; ++p) {
    pack_max[p] = -INFINITY;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      bad |= !(z[p][e] <= FLT_MAX);  // NaN or +inf
      pack_max[p] = fmaxf(pack_max[p], z[p][e]);
    }
  }
  const float m = fmaxf(fmaxf(pack_max[0], pack_max[1]), fmaxf(pack_max[2], pack_max[3]));
  float max = m;
  for (int offset = 16; offset > 0; offset >>= 1) max = fmaxf(max, __shfl_xor_sync(kAll, max, offset));
  bad = __any_sync(kAll, bad);
  if (lane_id() == 0) warp_max[warp_id()] = max, warp_bad[warp_id()] = bad;
  __syncthreads();
  max = warp_max[0];
  for (int w = 1; w < kTileWarps; ++w) max = fmaxf(max, warp_max[w]);
  double pack_mass[kTilePacks] = {};
  int32_t first = static_cast<int32_t>(V);
  if (max > -INFINITY) {
#pragma unroll
    for (int p = 0; p < kTilePacks; ++p) {
      float sum = 0;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) sum += expf(z[p][e] - max);
      pack_mass[p] = sum;
    }
    if (m == max)  // this thread's tokens in index order: the first of equal maxima
#pragma unroll
      for (int p = kTilePacks - 1; p >= 0; --p)
#pragma unroll
        for (int e = kPerLane - 1; e >= 0; --e)
          if (z[p][e] == max) first = static_cast<int32_t>(start_of(p) + e);
  }
  // Lanes 0, 8, 16 and 24 of warp w end with chunks w, 8 + w, 16 + w and 24 + w.
  const double chunk_mass = warp_reduce_scatter4(pack_mass, [](double a, double b) { return a + b; });
  const float chunk_max = warp_reduce_scatter4(pack_max, [](float a, float b) { return fmaxf(a, b); });
  if (lane_id() % 8 == 0) tile_chunks[lane_id() / 8 * kTileWarps + warp_id()] = {chunk_mass, chunk_max};
  double mass = chunk_mass + __shfl_xor_sync(kAll, chunk_mass, 8);
  mass += __shfl_xor_sync(kAll, mass, 16);
  for (int offset = 16; offset > 0; offset >>= 1) first = min(first, __shfl_xor_sync(kAll, first, offset));
  if (lane_id() == 0) warp_mass[warp_id()] = mass, warp_first[warp_id()] = first;
  __syncthreads();
  if (warp_id() != 0) return;
  // Warp 0 writes the tile's statistics and announces them: one fence, by the only warp
  // that wrote.
  const int64_t row_tile = r * gridDim.y + blockIdx.y;
  chunk_stats[row_tile * kTileChunks + lane_id()] = tile_chunks[lane_id()];
  if (lane_id() == 0) {
    TileStats out{0, max, static_cast<int32_t>(V), 0};
    for (int w = 0; w < kTileWarps; ++w) {
      out.mass += warp_mass[w];
      out.first = min(out.first, warp_first[w]);
      out.bad |= warp_bad[w];
    }
    stats[row_tile] = out;
  }
  __threadfence();  // the statistics reach L2 before the count that announces them
  bool last = false;
  if (lane_id() == 0) {
    last = atomicAdd(tiles_done + r, 1) == static_cast<int32_t>(gridDim.y) - 1;
    if (last) {
      tiles_done[r] = 0;  // for the next call: every tile of this one has counted
      __threadfence();    // and the other tiles' statistics are read after their counts
    }
  }
  last = __shfl_sync(kAll, last, 0);
  if (!last || truncated_draw(temperature, top_ks[r], top_ps[r], V)) return;
  double tile_mass[kTilesPerLane];
  const TileStats* row_stats = stats + r * gridDim.y;
  const RowTotals totals = warp_combine_tiles(row_stats, gridDim.y, V, tile_mass);
  if (settled_as_bad(ids, logprobs, r, totals)) return;
  row.max = totals.max;
  const int64_t id = temperature == 0 ? totals.first
                                      : draw_from_all(row, row_stats, chunk_stats + r * gridDim.y * kTileChunks,
                                                      tile_mass, totals.mass, uniforms[r]);
  if (lane_id() == 0) write_token(ids, logprobs, r, row, id, totals.mass);
}

// One CTA per row, after tile_kernel; only rows with a truncated draw have work. It finds
// the cut with passes over the row, sums the kept weights of every chunk, and picks from
// the chunk the draw lands in.
template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    sample_kernel(int32_t* ids, float* logprobs, const TileStats* stats, const T* logits, int64_t V, bool packed,
                  const float* temperatures, const int32_t* top_ks, const float* top_ps, const float* uniforms) {
  extern __shared__ double chunk_mass[];
  __shared__ RowTotals shared_totals;
  const int64_t r = blockIdx.x;
  const float temperature = temperatures[r];
  if (!truncated_draw(temperature, top_ks[r], top_ps[r], V)) return;
  if (warp_id() == 0) {
    double unused[kTilesPerLane];
    const RowTotals totals = warp_combine_tiles(stats + r * tiles_of(V), tiles_of(V), V, unused);
    if (lane_id() == 0) shared_totals = totals;
  }
  __syncthreads();
  const RowTotals totals = shared_totals;
  if (settled_as_bad(ids, logprobs, r, totals)) return;
  const Row<T> row{logits + r * V, V, temperature, totals.max, packed};
  const Cut cut = truncation(row, top_ks[r], top_ps[r], totals.mass);
  const int64_t chunks = (V + kChunk - 1) / kChunk;
  const double target = static_cast<double>(uniforms[r]) * sum_chunks(row, cut, chunk_mass, 0, chunks);
  const Located chunk = locate(chunk_mass, chunks, 0.0, target);
  if (warp_id() != 0) return;
  const int64_t id = pick_in_chunk(row, cut, chunk, target);
  if (lane_id() == 0) write_token(ids, logprobs, r, row, id, totals.mass);
}

}  // namespace

size_t sample_tokens_workspace_bytes(int64_t rows, int64_t vocab) {
  return static_cast<size_t>(rows * tiles_of(vocab)) * (sizeof(TileStats) + kTileChunks * sizeof(ChunkStats));
}

void sample_tokens(const Tensor& ids, const Tensor& logprobs, const Tensor& logits, const Tensor& temperature,
                   const Tensor& top_k, const Tensor& top_p, const Tensor& u, const Tensor& workspace,
                   const Tensor& tiles_done, cudaStream_t stream) {
  const char* op = "cuda::sample_tokens";
  check_op_arg(logits, op, "logits", Device::CUDA, {DType::BF16, DType::F32}, {kAnyExtent, kAnyExtent});
  const int64_t B = logits.shape[0], V = logits.shape[1];
  check_op_arg(ids, op, "ids", Device::CUDA, {DType::I32}, {B});
  check_op_arg(logprobs, op, "logprobs", Device::CUDA, {DType::F32}, {B});
  check_op_arg(temperature, op, "temperature", Device::CUDA, {DType::F32}, {B});
  check_op_arg(top_k, op, "top_k", Device::CUDA, {DType::I32}, {B});
  check_op_arg(top_p, op, "top_p", Device::CUDA, {DType::F32}, {B});
  check_op_arg(u, op, "u", Device::CUDA, {DType::F32}, {B});
  check_op_arg(workspace, op, "workspace", Device::CUDA, {DType::U8}, {kAnyExtent});
  check_op_arg(tiles_done, op, "tiles_done", Device::CUDA, {DType::I32}, {kAnyExtent});
  if (V > kMaxVocab)
    throw std::invalid_argument(std::string(op) + ": logits " + logits.describe() + " has a vocabulary over " +
                                std::to_string(kMaxVocab) + " (the per-chunk sums must fit in shared memory)");
  const size_t bytes = sample_tokens_workspace_bytes(B, V);
  if (static_cast<size_t>(workspace.shape[0]) < bytes || reinterpret_cast<uintptr_t>(workspace.data) % 8 != 0)
    throw std::invalid_argument(std::string(op) + ": workspace " + workspace.describe() + " is not " +
                                std::to_string(bytes) + " aligned bytes for " + std::to_string(B) + " rows of " +
                                std::to_string(V) + " logits");
  if (tiles_done.shape[0] < B)
    throw std::invalid_argument(std::string(op) + ": tiles_done " + tiles_done.describe() + " has fewer than " +
                                std::to_string(B) + " rows");
  if (B == 0) return;
  const size_t shared = static_cast<size_t>((V + kChunk - 1) / kChunk) * sizeof(double);
  const int64_t tiles = tiles_of(V);  // V = 0: one tile, a bad row
  auto* stats = reinterpret_cast<TileStats*>(workspace.data);
  auto* chunk_stats = reinterpret_cast<ChunkStats*>(stats + B * tiles);
  auto launch = [&](auto* data) {
    const bool packed = reinterpret_cast<uintptr_t>(data) % 16 == 0 && V * sizeof(*data) % 16 == 0;
    tile_kernel<<<dim3(static_cast<unsigned>(B), static_cast<unsigned>(tiles)), kTileThreads, 0, stream>>>(
        ids.ptr<int32_t>(), logprobs.ptr<float>(), stats, chunk_stats, tiles_done.ptr<int32_t>(), data, V, packed,
        temperature.ptr<float>(), top_k.ptr<int32_t>(), top_p.ptr<float>(), u.ptr<float>());
    sample_kernel<<<static_cast<unsigned>(B), kThreads, shared, stream>>>(
        ids.ptr<int32_t>(), logprobs.ptr<float>(), stats, data, V, packed, temperature.ptr<float>(),
        top_k.ptr<int32_t>(), top_p.ptr<float>(), u.ptr<float>());
  };
  if (logits.dtype == DType::BF16)
    launch(logits.ptr<const __nv_bfloat16>());
  else
    launch(logits.ptr<const float>());
  if (const cudaError_t status = cudaGetLastError(); status != cudaSuccess)
    throw std::runtime_error(std::string(op) + ": kernel launch failed: " + cudaGetErrorString(status));
}

}  // namespace tandem::cuda
