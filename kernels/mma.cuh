// Warp-level building blocks of the tensor-core kernels (attention.cu, paged_attention.cu):
// cp.async copies into shared memory, ldmatrix operand loads, mma.sync m16n8k16 in BF16
// (or FP16) with FP32 accumulation, and the softmaxes' exponential.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with g = lane/4 and
// c = lane%4: an FP32 accumulator tile holds rows g (elements 0,1) and g+8 (elements 2,3),
// columns 2c and 2c+1. Two neighbouring accumulator tiles, rounded to BF16, are exactly
// the A operand of the next product, so probabilities never leave registers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tandem::cuda {

using bf16 = __nv_bfloat16;

// Shared-memory rows of D elements are padded by 16 bytes: the 8 rows one ldmatrix phase
// reads then start in 8 different bank quads.
template <int D>
inline constexpr int kPaddedStride = D + 8;

__device__ inline unsigned shared_address(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// 16 bytes global -> shared without passing through registers; with `fill` false nothing is
// read and the destination is zeroed. `fill` goes in as cp.async's ignore-src predicate,
// not as a source size, which ptxas turns into address arithmetic around each copy.
__device__ inline void copy_async_16(unsigned dst, const void* src, bool fill) {
  asm volatile(
      "{\n"
      ".reg .pred ignore;\n"
      "setp.eq.u32 ignore, %2, 0;\n"
      "cp.async.cg.shared.global [%0], [%1], 16, ignore;\n"
      "}\n" ::"r"(dst),
      "l"(src), "r"(static_cast<unsigned>(fill))
      : "memory");
}

__device__ inline void copy_async_16(void* dst, const void* src, bool fill) {
  copy_async_16(shared_address(dst), src, fill);
}

__device__ inline void copy_async_4(void* dst, const void* src, bool fill) {
  asm volatile(
      "{\n"
      ".reg .pred ignore;\n"
      "setp.eq.u32 ignore, %2, 0;\n"
      "cp.async.ca.shared.global [%0], [%1], 4, ignore;\n"
      "}\n" ::"r"(shared_address(dst)),
      "l"(src), "r"(static_cast<unsigned>(fill))
      : "memory");
}

__device__ inline void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int pending>
__device__ inline void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

__device__ inline void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p))
               : "memory");
}

__device__ inline void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p))
               : "memory");
}

// The A operand (16×16, row-major) at rows [row0, row0+16), columns [col0, col0+16) of a
// shared tile of D-element rows.
template <int D>
__device__ inline void load_a(unsigned (&a)[4], const bf16* tile, int row0, int col0, int lane) {
  ldmatrix_x4(a, tile + (row0 + (lane & 15)) * kPaddedStride<D> + col0 + (lane >> 4) * 8);
}

// B operands (16×8) of the two n-tiles n0 and n0+8 over k in [k0, k0+16), b[0..1] and
// b[2..3], when the tile stores Bᵀ: one row per n (K in Q·Kᵀ).
template <int D>
__device__ inline void load_b_rows_n(unsigned (&b)[4], const bf16* tile, int n0, int k0, int lane) {
  ldmatrix_x4(b, tile + (n0 + (lane & 7) + (lane >> 4) * 8) * kPaddedStride<D> + k0 + ((lane >> 3) & 1) * 8);
}

// The same operands when the tile stores B itself: one row per k (V in P·V).
template <int D>
__device__ inline void load_b_rows_k(unsigned (&b)[4], const bf16* tile, int k0, int n0, int lane) {
  ldmatrix_x4_trans(b, tile + (k0 + (lane & 15)) * kPaddedStride<D> + n0 + (lane >> 4) * 8);
}

// c += a · b on one 16×8 tile.
__device__ inline void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same product with FP16 operands (the decode kernel's widened FP8 codes).
__device__ inline void mma_f16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x rounded as the MUFU unit does, results below 2^-126 flushed to zero: the softmaxes'
// exponentials, where exp2f adds a rescale around each for the subnormal range.
__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ inline unsigned pack_bf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&pair);
}

__device__ inline unsigned pack_half2(float lo, float hi) {
  const __half2 pair = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&pair);
}

}  // namespace tandem::cuda
