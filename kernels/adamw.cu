#include <cuda_bf16.h>

#include "adamw.cuh"

#include <algorithm>
#include <cstdint>

namespace tandem::cuda {

namespace {
// One element: every operation rounded on its own (no FMA contraction, IEEE sqrt and
// division), in the CPU twin's order: the two agree bit for bit, so a run restarts
// identically on either backend.
__device__ inline float adamw_element(float& param, float g, float& m, float& v, const AdamWStepScalars& k) {
  m = __fadd_rn(__fmul_rn(k.beta1, m), __fmul_rn(__fsub_rn(1.0f, k.beta1), g));
  v = __fadd_rn(__fmul_rn(k.beta2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, k.beta2), g), g));
  param = __fsub_rn(__fmul_rn(param, k.decay),
                    __fdiv_rn(__fmul_rn(k.step_size, m), __fadd_rn(__fdiv_rn(__fsqrt_rn(v), k.bias2_sqrt), k.eps)));
  return param;
}

// The runs of one launch (at most kRunsPerLaunch; longer lists take several launches):
// run r covers elements [start[r], start[r + 1]) of the launch's concatenation, stored
// from slab offset offset[r], and steps with scalars[which[r]]. Passed by value: the
// table travels in the launch's parameters, with no copy to queue before it.
constexpr int kRunsPerLaunch = 128;
struct RunTable {
  int64_t start[kRunsPerLaunch + 1];
  int64_t offset[kRunsPerLaunch];
  uint8_t which[kRunsPerLaunch];
  AdamWStepScalars scalars[2];
  int runs;
};

// V consecutive elements at slab offset i: V = 4 moves 16 bytes of each FP32 stream and 8
// of the BF16 one per access (the step is memory-bound, and wider accesses keep more
// bytes in flight); V = 1 serves runs not in whole aligned packs.
template <int V>
__device__ inline void adamw_pack(float* __restrict__ params, const float* __restrict__ grads,
                                  float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                                  uint16_t* __restrict__ working, int64_t i, const AdamWStepScalars& k) {
  if constexpr (V == 4) {
    float4 p = *reinterpret_cast<float4*>(params + i), m = *reinterpret_cast<float4*>(exp_avg + i),
           v = *reinterpret_cast<float4*>(exp_avg_sq + i);
    const float4 g = *reinterpret_cast<const float4*>(grads + i);
    adamw_element(p.x, g.x, m.x, v.x, k);
    adamw_element(p.y, g.y, m.y, v.y, k);
    adamw_element(p.z, g.z, m.z, v.z, k);
    adamw_element(p.w, g.w, m.w, v.w, k);
    *reinterpret_cast<float4*>(params + i) = p;
    *reinterpret_cast<float4*>(exp_avg + i) = m;
    *reinterpret_cast<float4*>(exp_avg_sq + i) = v;
    if (working) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y), hi = __floats2bfloat162_rn(p.z, p.w);
      *reinterpret_cast<uint2*>(working + i) =
          make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi));
    }
  } else {
    float p = params[i], m = exp_avg[i], v = exp_avg_sq[i];
    adamw_element(p, grads[i], m, v, k);
    params[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (working) {
      const __nv_bfloat16 rounded = __float2bfloat16_rn(p);
      working[i] = *reinterpret_cast<const uint16_t*>(&rounded);
    }
  }
}

// Every run of the table in one grid-stride pass over their concatenation: a thread's
// packs only move forward, and so does its cursor into the table.
template <int V>
__global__ void adamw_runs_kernel(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                                  uint16_t* working, RunTable table) {
  const int64_t packs = table.start[table.runs] / V;
  int r = 0;
  for (int64_t pack = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; pack < packs;
       pack += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = pack * V;
    while (e >= table.start[r + 1]) ++r;
    adamw_pack<V>(params, grads, exp_avg, exp_avg_sq, working, table.offset[r] + (e - table.start[r]),
                  table.scalars[table.which[r]]);
  }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
}  // namespace

void adamw_step_runs(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                     std::span<const AdamWRun> runs, const AdamWStepScalars& decayed,
                     const AdamWStepScalars& undecayed, uint16_t* working, cudaStream_t stream) {
  bool packed = aligned(params, 16) && aligned(grads, 16) && aligned(exp_avg, 16) && aligned(exp_avg_sq, 16) &&
                (!working || aligned(working, 8));
  for (const AdamWRun& run : runs) packed = packed && run.offset % 4 == 0 && run.count % 4 == 0;
  const unsigned threads = 256;
  for (size_t first = 0; first < runs.size(); first += kRunsPerLaunch) {
    RunTable table{};
    table.scalars[0] = undecayed;
    table.scalars[1] = decayed;
    table.runs = 0;
    for (size_t i = first; i < std::min(runs.size(), first + kRunsPerLaunch); ++i) {
      if (runs[i].count == 0) continue;
      table.offset[table.runs] = runs[i].offset;
      table.which[table.runs] = runs[i].decayed ? 1 : 0;
      table.start[table.runs + 1] = table.start[table.runs] + runs[i].count;
      ++table.runs;
    }
    if (table.runs == 0) continue;
    const int64_t work = table.start[table.runs] / (packed ? 4 : 1);
    const auto blocks = static_cast<unsigned>(std::min<int64_t>((work + threads - 1) / threads, 132 * 16));
    if (packed)
      adamw_runs_kernel<4><<<blocks, threads, 0, stream>>>(params, grads, exp_avg, exp_avg_sq, working, table);
    else
      adamw_runs_kernel<1><<<blocks, threads, 0, stream>>>(params, grads, exp_avg, exp_avg_sq, working, table);
  }
}

void adamw_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, size_t count,
                const AdamWStepScalars& scalars, uint16_t* working, cudaStream_t stream) {
  const AdamWRun run{0, static_cast<int64_t>(count), true};
  adamw_step_runs(params, grads, exp_avg, exp_avg_sq, {&run, 1}, scalars, scalars, working, stream);
}

}  // namespace tandem::cuda
