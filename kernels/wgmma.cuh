// Hopper's warpgroup MMA (wgmma, sm_90a) for the attention kernels: a warpgroup of 4 warps
// multiplies a 64-row A (from shared memory, or from registers) by a B tile in shared
// memory, asynchronously, without ldmatrix: the operand loads that bound the mma.sync
// kernels go away.
//
// Shared operands are tiles of BF16 rows of 64 elements (128 bytes) in the 128-byte swizzle
// (PTX ISA, "Shared Memory Matrix Layout"): in each 1024-byte group of 8 rows, 16-byte chunk
// c of row r sits at chunk c ^ (r % 8), so the 8 rows a phase reads hit 8 bank quads. A D-wide
// tile is D/64 such column blocks of kRows rows, one after the other.
//
// The accumulator fragments are mma.sync's (mma.cuh): warp w of the warpgroup holds rows
// 16w + lane/4 (elements 0,1) and 16w + lane/4 + 8 (elements 2,3) of every 8-column tile,
// columns 2(lane%4) and 2(lane%4)+1; two neighbouring tiles rounded to BF16 are the A
// operand of the next product, as in the mma.sync kernels.
#pragma once
#include <cstdint>

#include "mma.cuh"

namespace tandem::cuda {

// A tile of kRows rows × D BF16 columns, D a multiple of 64, in D/64 swizzled column blocks.
template <int kRows, int D>
struct SwizzledTile {
  static_assert(D % 64 == 0 && kRows % 8 == 0);
  static constexpr int block_bytes = kRows * 128;
  static constexpr int bytes = (D / 64) * block_bytes;
};

// Byte offset of 16-byte chunk `chunk` (of D/8) of row `row` in a SwizzledTile.
template <int kRows>
__device__ inline int swizzled_offset(int row, int chunk) {
  return (chunk / 8) * (kRows * 128) + row * 128 + (((chunk % 8) ^ (row % 8)) << 4);
}

// The matrix descriptor of a 128-byte swizzled operand at `tile` (1024-byte aligned but for
// the 32-byte steps along K within a row). `leading` is the byte step between 64-element
// column blocks along M/N (only read for MN-major operands); 8-row groups are 1024 bytes apart.
__device__ inline uint64_t swizzled_descriptor(const void* tile, int leading) {
  return static_cast<uint64_t>((shared_address(tile) & 0x3FFFF) >> 4) |
         static_cast<uint64_t>(leading >> 4) << 16 | static_cast<uint64_t>(1024 >> 4) << 32 | 1ull << 62;
}

// The descriptor of the operand `bytes` further on in the same tile: the start address is
// the low 14 bits in 16-byte units, and shared memory (< 256 KB) never carries out of them.
__device__ inline uint64_t descriptor_plus(uint64_t descriptor, int bytes) { return descriptor + (bytes >> 4); }

// Orders this thread's earlier register and shared-memory accesses before the warpgroup's
// next wgmma, and shared-memory writes by other means (cp.async) before its reads.
__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void async_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int pending>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
}

// With `accumulate` false the products overwrite d instead of adding to it.
//
// d[8 tiles of 8 columns] += A (64 × 16, K-major descriptor) · B (16 × 64, K-major: 64 rows
// of B's transpose, as K's rows in Q·Kᵀ).
__device__ inline void wgmma_64x64_shared(float (&d)[8][4], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, accumulate, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// d[8 tiles] += A (64 × 16 in registers, the mma.sync A fragment) · B (16 × 64, MN-major: 16
// rows of 64 columns, as V's rows in P·V).
__device__ inline void wgmma_64x64_registers(float (&d)[8][4], const unsigned (&a)[4], uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, accumulate, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}

// The same with 128 columns of B (two 64-column blocks, `leading` in b apart).
__device__ inline void wgmma_64x128_registers(float (&d)[16][4], const unsigned (&a)[4], uint64_t b,
                                              bool accumulate) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, accumulate, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),
        "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
        "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}

}  // namespace tandem::cuda
