// The CUDA attention family (kernels/attention.cu) against its CPU twin, CpuOps, on fresh
// random inputs: packed batches with odd lengths (an empty sequence too), GQA ratios 1, 2
// and 4, every head size the tensor-core path covers plus one it does not, BF16 and F32.
// Both backends see identical values (BF16 inputs are rounded first, and the backward ops
// get the same out and lse), so the differences are the GPU's own roundings and sum orders.
//
// Tolerances:
// - F32 (scalar path): |gpu - cpu| <= 1e-4 + 1e-4·|cpu| per element. Both sum the same FP32
//   products in another order over at most 300 keys: ~1e-6 expected.
// - BF16: |gpu - cpu| <= tolerance·RMS(cpu) + 2^-8·|cpu| per element. The second term is
//   the BF16 store itself (half an ulp is 2^-9 of the value, with room to spare); the first is the arithmetic, judged against the tensor's RMS because the
//   errors come from rounded terms of sums whose result may be far smaller than the terms.
//   out 2e-2: P is rounded to BF16 before P·V (2^-9 per weight, averaging out over the
//   keys). lse 1e-3 absolute: FP32 scores from exact BF16 products, only exp2/log2 and the
//   sum order differ (~1e-6). dq, dk, dv 5e-2: P and dS are rounded to BF16 before their
//   products (as in FlashAttention 2), and Σ_j dS_ij = 0 makes the sums cancel, so errors
//   scale with the terms, not with the (smaller) result. The kernels' arithmetic, run in a
//   CPU emulation of the mma/ldmatrix fragments on these shapes with several seeds, stayed
//   below 8e-3 (out) and 2.8e-2 (gradients, dq the largest) of the RMS beyond the store
//   term. An indexing or masking mistake gives errors of the order of the RMS itself.
#ifdef TANDEM_HAVE_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attention.cuh"
#include "model/cpu_ops.h"
#include "gpu_support.h"
#include "tensor/bf16.h"
#include "tensor/device_copy.h"
#include "tensor/memory_pool.h"

using namespace tandem;
using namespace tandem::testing;

namespace {

struct Case {
  std::vector<int> lengths;
  int heads, kv_heads, head_dim;
  DType dtype;
};

std::string case_name(const Case& c) {
  return std::string(dtype_name(c.dtype)) + "_d" + std::to_string(c.head_dim) + "_h" + std::to_string(c.heads) + "_kv" +
         std::to_string(c.kv_heads) + "_max" + std::to_string(*std::max_element(c.lengths.begin(), c.lengths.end()));
}

void round_to(std::vector<float>& values, DType dtype) {
  if (dtype == DType::BF16)
    for (float& x : values) x = bf16_to_float(float_to_bf16(x));
}

// Device tensors from one pool, released together.
class DeviceTensors {
 public:
  DeviceTensors() : pool_(MemoryPool::create(Device::CUDA, 0)) {}
  ~DeviceTensors() {
    for (Allocation* allocation : allocations_) pool_->release(allocation);
  }

  Tensor make(DType dtype, std::vector<int64_t> shape) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    Allocation* allocation = pool_->allocate(tags::activations, std::max<int64_t>(count, 1) * dtype_size(dtype),
                                             "attention_test." + std::to_string(allocations_.size()));
    allocations_.push_back(allocation);
    return Tensor::view(allocation->ptr, dtype, Device::CUDA, std::move(shape));
  }

  // `values` must already be representable in `dtype`.
  Tensor upload(const std::vector<float>& values, DType dtype, std::vector<int64_t> shape) {
    const Tensor t = make(dtype, std::move(shape));
    write(t, values);
    return t;
  }

  static void write(const Tensor& t, const std::vector<float>& values) {
    if (t.dtype == DType::F32) return copy_host_to_tensor(t, values.data());
    std::vector<uint16_t> bits(values.size());
    std::transform(values.begin(), values.end(), bits.begin(), float_to_bf16);
    copy_host_to_tensor(t, bits.data());
  }

  static std::vector<float> read(const Tensor& t) {
    std::vector<float> values(t.numel());
    if (t.dtype == DType::F32) {
      copy_tensor_to_host(values.data(), t);
      return values;
    }
    std::vector<uint16_t> bits(values.size());
    copy_tensor_to_host(bits.data(), t);
    std::transform(bits.begin(), bits.end(), values.begin(), bf16_to_float);
    return values;
  }

 private:
  std::unique_ptr<MemoryPool> pool_;
  std::vector<Allocation*> allocations_;
};

Tensor host_view(std::vector<float>& values, std::vector<int64_t> shape) {
  return Tensor::view(values.data(), DType::F32, Device::CPU, std::move(shape));
}

double rms(const std::vector<float>& x) {
  double sum = 0;
  for (float v : x) sum += static_cast<double>(v) * v;
  return std::sqrt(sum / std::max<size_t>(x.size(), 1));
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, DType dtype, double bf16_tolerance,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double scale = rms(want);
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i << " = " << got[i];
    const double error = std::abs(static_cast<double>(got[i]) - want[i]);
    const double allowed = dtype == DType::F32 ? 1e-4 + 1e-4 * std::abs(want[i])
                                               : bf16_tolerance * scale + std::ldexp(std::abs(want[i]), -8);
    if (error - allowed > worst_excess) {
      worst_excess = error - allowed;
      worst = i;
    }
  }
  EXPECT_LE(worst_excess, 0) << what << ": element " << worst << " is " << got[worst] << ", CPU " << want[worst]
                             << " (RMS " << scale << ")";
}

// One packed batch: inputs, and the CPU's results on exactly those values.
struct Problem {
  Case shape;
  int64_t tokens = 0;
  std::vector<int32_t> cu_seqlens;
  std::vector<float> q, k, v, dout;
  std::vector<float> exact_out;               // the CPU's out
  std::vector<float> out, lse, dq, dk, dv;  // CPU results from out rounded to the case's dtype

  int64_t q_width() const { return static_cast<int64_t>(shape.heads) * shape.head_dim; }
  int64_t kv_width() const { return static_cast<int64_t>(shape.kv_heads) * shape.head_dim; }

  Problem(const Case& c, uint32_t seed) : shape(c) {
    cu_seqlens.push_back(0);
    for (int length : c.lengths) cu_seqlens.push_back(cu_seqlens.back() + length);
    tokens = cu_seqlens.back();
    std::mt19937 rng(seed);
    // Queries twice as large as keys: scores of std ~2 give peaked softmax rows, so the
    // online rescaling really happens.
    const auto fill = [&](std::vector<float>& x, int64_t count, float std) {
      std::normal_distribution<float> normal(0.f, std);
      x.resize(count);
      for (float& e : x) e = normal(rng);
      round_to(x, c.dtype);
    };
    fill(q, tokens * q_width(), 2.f);
    fill(k, tokens * kv_width(), 1.f);
    fill(v, tokens * kv_width(), 1.f);
    fill(dout, tokens * q_width(), 1.f);
    solve_on_cpu();
  }

  void solve_on_cpu() {
    CpuOps cpu;
    std::vector<int32_t> cu = cu_seqlens;
    const Tensor cu_t = Tensor::view(cu.data(), DType::I32, Device::CPU, {static_cast<int64_t>(cu.size())});
    out.assign(tokens * q_width(), 0.f);
    lse.assign(tokens * shape.heads, 0.f);
    cpu.attention_forward(host_view(out, {tokens, q_width()}), host_view(lse, {tokens, shape.heads}),
                          host_view(q, {tokens, q_width()}), host_view(k, {tokens, kv_width()}),
                          host_view(v, {tokens, kv_width()}), cu_t, shape.heads, shape.kv_heads);
    exact_out = out;
    round_to(out, shape.dtype);  // what a BF16 forward hands to backward
    // The op overwrites its gradients: NaN shows any element it would read or miss.
    dq.assign(tokens * q_width(), std::nanf(""));
    dk.assign(tokens * kv_width(), std::nanf(""));
    dv.assign(tokens * kv_width(), std::nanf(""));
    cpu.attention_backward(host_view(dq, {tokens, q_width()}), host_view(dk, {tokens, kv_width()}),
                           host_view(dv, {tokens, kv_width()}), host_view(dout, {tokens, q_width()}),
                           host_view(out, {tokens, q_width()}), host_view(lse, {tokens, shape.heads}),
                           host_view(q, {tokens, q_width()}), host_view(k, {tokens, kv_width()}),
                           host_view(v, {tokens, kv_width()}), cu_t, shape.heads, shape.kv_heads, {});
  }
};

// What backward gets as its dS scratch: room for the tiles of any packing of the batch
// (dq from the stored tiles), one tile short of that, or none (both: dq recomputes them).
enum class ScoreScratch { room, one_short, none };

constexpr int64_t kScoreTile = 64 * 64;

int64_t score_scratch_elements(const Problem& p) {
  return cuda::attention_score_grad_elements(p.tokens, static_cast<int64_t>(p.cu_seqlens.size()) - 1, p.shape.heads);
}

constexpr uint16_t kBf16Nan = 0x7fc0;

// The problem's tensors on the device; gradients and the dS scratch start as NaN: the
// backward pass must overwrite every gradient element, and read only dS it stored.
struct DeviceProblem {
  DeviceTensors memory;
  Tensor cu_seqlens, q, k, v, dout, out, lse, dq, dk, dv, row_dots, score_grads;

  explicit DeviceProblem(const Problem& p) {
    const DType dtype = p.shape.dtype;
    cu_seqlens = memory.make(DType::I32, {static_cast<int64_t>(p.cu_seqlens.size())});
    copy_host_to_tensor(cu_seqlens, p.cu_seqlens.data());
    q = memory.upload(p.q, dtype, {p.tokens, p.q_width()});
    k = memory.upload(p.k, dtype, {p.tokens, p.kv_width()});
    v = memory.upload(p.v, dtype, {p.tokens, p.kv_width()});
    dout = memory.upload(p.dout, dtype, {p.tokens, p.q_width()});
    out = memory.make(dtype, {p.tokens, p.q_width()});
    lse = memory.make(DType::F32, {p.tokens, p.shape.heads});
    dq = memory.make(dtype, {p.tokens, p.q_width()});
    dk = memory.make(dtype, {p.tokens, p.kv_width()});
    dv = memory.make(dtype, {p.tokens, p.kv_width()});
    for (const Tensor* t : {&dq, &dk, &dv}) DeviceTensors::write(*t, std::vector<float>(t->numel(), std::nanf("")));
    row_dots = memory.make(DType::F32, {p.tokens, p.shape.heads});
    score_grads = memory.make(DType::BF16, {score_scratch_elements(p)});
    copy_host_to_tensor(score_grads, std::vector<uint16_t>(score_grads.numel(), kBf16Nan).data());
  }

  // Elements of the dS scratch that are no longer NaN.
  int64_t scores_written() const {
    std::vector<uint16_t> bits(score_grads.numel());
    copy_tensor_to_host(bits.data(), score_grads);
    return std::count_if(bits.begin(), bits.end(), [](uint16_t b) { return b != kBf16Nan; });
  }

  void forward(const Problem& p) {
    cuda::attention_forward(out, lse, q, k, v, cu_seqlens, p.shape.heads, p.shape.kv_heads, nullptr);
    check(cudaDeviceSynchronize(), "attention_forward");
  }

  // Backward from the CPU's out and lse, so both backends differentiate the same values.
  void backward(const Problem& p, ScoreScratch scratch = ScoreScratch::room) {
    DeviceTensors::write(out, p.out);
    copy_host_to_tensor(lse, p.lse.data());
    Tensor scores = scratch == ScoreScratch::none ? Tensor{} : score_grads;
    if (scratch == ScoreScratch::one_short) scores.shape[0] -= kScoreTile;
    cuda::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, cu_seqlens, p.shape.heads, p.shape.kv_heads,
                             {row_dots, scores}, nullptr);
    check(cudaDeviceSynchronize(), "attention_backward");
  }
};

constexpr double kOutTolerance = 2e-2, kGradientTolerance = 5e-2;

uint32_t fresh_seed() {
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  return seed;
}

class GpuAttention : public ::testing::TestWithParam<Case> {};

TEST_P(GpuAttention, ForwardAndBackwardMatchCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Problem problem(GetParam(), seed);
  DeviceProblem gpu(problem);
  const DType dtype = problem.shape.dtype;

  gpu.forward(problem);
  // Against the unrounded CPU result: the BF16 store is part of the error.
  expect_close(DeviceTensors::read(gpu.out), problem.exact_out, dtype, kOutTolerance, "out");
  const std::vector<float> lse = DeviceTensors::read(gpu.lse);
  for (size_t i = 0; i < lse.size(); ++i)
    ASSERT_NEAR(lse[i], problem.lse[i], dtype == DType::F32 ? 1e-4 + 1e-4 * std::abs(problem.lse[i]) : 1e-3)
        << "lse element " << i;

  for (const ScoreScratch scratch : {ScoreScratch::room, ScoreScratch::none}) {
    const std::string mode = scratch == ScoreScratch::room ? " (dq from stored dS)" : " (dq recomputed)";
    gpu.backward(problem, scratch);
    expect_close(DeviceTensors::read(gpu.dq), problem.dq, dtype, kGradientTolerance, "dq" + mode);
    expect_close(DeviceTensors::read(gpu.dk), problem.dk, dtype, kGradientTolerance, "dk" + mode);
    expect_close(DeviceTensors::read(gpu.dv), problem.dv, dtype, kGradientTolerance, "dv" + mode);
  }
}

const std::vector<int> kOddLengths = {1, 7, 64, 129, 300};

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuAttention,
    ::testing::Values(
        // Tensor-core path: Qwen3-0.6B's heads, then the other head sizes and GQA ratios (the
        // forward takes the warpgroup MMA at 128 and 64, mma.sync at 16 and 32).
        Case{kOddLengths, 16, 8, 128, DType::BF16}, Case{kOddLengths, 8, 2, 64, DType::BF16},
        // Whole tiles and a training-length sequence: the dk/dv items off the diagonal take
        // the unmasked softmax, up to the last query tile when it is full (512, 192); 65
        // leaves a one-row tile to mask. 8 key tiles a row keep the forward's rescale
        // (skipped while the row maximum stays) going over many tiles.
        Case{{512, 192, 65}, 16, 8, 128, DType::BF16},
        Case{{1, 7, 0, 64, 129, 300}, 2, 2, 16, DType::BF16}, Case{kOddLengths, 4, 2, 32, DType::BF16},
        // Scalar path: a head size the tiles do not cover, and F32.
        Case{kOddLengths, 4, 2, 40, DType::BF16}, Case{kOddLengths, 4, 1, 16, DType::F32},
        Case{kOddLengths, 8, 2, 64, DType::F32}, Case{kOddLengths, 4, 2, 128, DType::F32}),
    [](const ::testing::TestParamInfo<Case>& info) { return case_name(info.param); });

class GpuAttentionPaths : public ::testing::TestWithParam<DType> {};

// Backward is deterministic (no atomics) and overwrites dq, dk, dv: a second pass on top of
// the first one's gradients repeats them bit for bit (a pass that added would double them).
TEST_P(GpuAttentionPaths, BackwardRepeatsExactlyAndOverwrites) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const DType dtype = GetParam();
  Problem problem(Case{kOddLengths, 4, 2, 64, dtype}, seed);
  DeviceProblem gpu(problem);
  const std::vector<const Tensor*> grads = {&gpu.dq, &gpu.dk, &gpu.dv};
  const char* names[] = {"dq", "dk", "dv"};
  for (const ScoreScratch scratch : {ScoreScratch::room, ScoreScratch::none}) {
    gpu.backward(problem, scratch);
    std::vector<std::vector<float>> once;
    for (const Tensor* t : grads) once.push_back(DeviceTensors::read(*t));
    gpu.backward(problem, scratch);
    const std::vector<float>* cpu[] = {&problem.dq, &problem.dk, &problem.dv};
    for (size_t g = 0; g < grads.size(); ++g) {
      const std::vector<float> again = DeviceTensors::read(*grads[g]);
      for (size_t i = 0; i < again.size(); ++i) ASSERT_EQ(again[i], once[g][i]) << names[g] << " element " << i;
      expect_close(again, *cpu[g], dtype, kGradientTolerance, std::string(names[g]) + " after two passes");
    }
  }
}

// A dS scratch one tile short of the bound is not touched, and dq is recomputed: the same
// bits as with no scratch. With room, the tensor-core path stores dS there (the scalar
// path never does).
TEST_P(GpuAttentionPaths, AScratchShortOfTheBoundIsLeftAlone) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const DType dtype = GetParam();
  const Problem problem(Case{kOddLengths, 4, 2, 64, dtype}, seed);
  DeviceProblem gpu(problem);
  gpu.backward(problem, ScoreScratch::none);
  const std::vector<float> recomputed = DeviceTensors::read(gpu.dq);
  gpu.backward(problem, ScoreScratch::one_short);
  EXPECT_EQ(gpu.scores_written(), 0);
  const std::vector<float> short_scratch = DeviceTensors::read(gpu.dq);
  for (size_t i = 0; i < recomputed.size(); ++i) ASSERT_EQ(short_scratch[i], recomputed[i]) << "dq element " << i;
  gpu.backward(problem, ScoreScratch::room);
  if (dtype == DType::BF16) EXPECT_GT(gpu.scores_written(), 0);
  else EXPECT_EQ(gpu.scores_written(), 0);
}

// Changing the keys and values of the middle sequence leaves everything the other
// sequences compute bit-identical: out, lse, and every gradient row they own.
TEST_P(GpuAttentionPaths, SequencesDoNotSeeEachOther) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const DType dtype = GetParam();
  const Case shape{{129, 300, 64}, 4, 2, 128, dtype};
  Problem problem(shape, seed);
  const auto run = [&](const Problem& p) {
    DeviceProblem gpu(p);
    gpu.forward(p);
    std::vector<std::vector<float>> results = {DeviceTensors::read(gpu.out), DeviceTensors::read(gpu.lse)};
    gpu.backward(p);
    for (const Tensor* t : {&gpu.dq, &gpu.dk, &gpu.dv}) results.push_back(DeviceTensors::read(*t));
    return results;
  };
  const auto before = run(problem);

  std::mt19937 rng(seed + 1);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int64_t first = problem.cu_seqlens[1], end = problem.cu_seqlens[2];
  for (std::vector<float>* x : {&problem.k, &problem.v}) {
    for (int64_t i = first * problem.kv_width(); i < end * problem.kv_width(); ++i) (*x)[i] = normal(rng);
    round_to(*x, dtype);
  }
  problem.solve_on_cpu();  // backward takes the CPU's out and lse of the changed batch
  const auto after = run(problem);

  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  for (size_t r = 0; r < before.size(); ++r) {
    const size_t width = before[r].size() / problem.tokens;
    size_t changed = 0;
    for (int64_t t = 0; t < problem.tokens; ++t) {
      const bool middle = t >= first && t < end;
      for (size_t e = t * width; e < (t + 1) * width; ++e) {
        if (middle) changed += before[r][e] != after[r][e];
        else ASSERT_EQ(before[r][e], after[r][e]) << names[r] << " row " << t << " changed";
      }
    }
    EXPECT_GT(changed, 0u) << names[r] << " of the changed sequence did not change";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuAttentionPaths, ::testing::Values(DType::BF16, DType::F32),
                         [](const ::testing::TestParamInfo<DType>& info) { return dtype_name(info.param); });

TEST(GpuAttentionArgs, WrongShapesAndDtypesAreRefused) {
  REQUIRE_GPU();
  DeviceTensors memory;
  const int64_t T = 10;
  const Tensor q = memory.make(DType::BF16, {T, 4 * 16}), k = memory.make(DType::BF16, {T, 2 * 16}),
               v = memory.make(DType::BF16, {T, 2 * 16}), out = memory.make(DType::BF16, {T, 4 * 16}),
               lse = memory.make(DType::F32, {T, 4}), cu = memory.make(DType::I32, {2});
  const Tensor k_f32 = memory.make(DType::F32, {T, 2 * 16}), lse_wide = memory.make(DType::F32, {T, 5});
  EXPECT_THROW(cuda::attention_forward(out, lse, q, k_f32, v, cu, 4, 2, nullptr), std::invalid_argument);
  EXPECT_THROW(cuda::attention_forward(out, lse_wide, q, k, v, cu, 4, 2, nullptr), std::invalid_argument);
  EXPECT_THROW(cuda::attention_forward(out, lse, q, k, v, cu, 4, 3, nullptr), std::invalid_argument);
  EXPECT_THROW(cuda::attention_forward(out, lse, q, k, v, cu, 3, 1, nullptr), std::invalid_argument);
  const Tensor host_q = Tensor::view(q.data, DType::BF16, Device::CPU, {T, 4 * 16});
  EXPECT_THROW(cuda::attention_forward(out, lse, host_q, k, v, cu, 4, 2, nullptr), std::invalid_argument);
  const AttentionScratch scratch{memory.make(DType::F32, {T, 4}), Tensor{}};
  EXPECT_THROW(cuda::attention_backward(k, k, v, out, out, lse, q, k, v, cu, 4, 2, scratch, nullptr),
               std::invalid_argument)
      << "a [T, kv_heads*head_dim] dq is accepted";
  EXPECT_THROW(cuda::attention_backward(out, k_f32, v, out, out, lse, q, k, v, cu, 4, 2, scratch, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cuda::attention_backward(out, k, v, out, out, lse, q, k, v, cu, 4, 2, {lse_wide, Tensor{}}, nullptr),
               std::invalid_argument)
      << "a [T, heads + 1] row_dots is accepted";
  try {
    cuda::attention_forward(out, lse, q, k_f32, v, cu, 4, 2, nullptr);
    ADD_FAILURE() << "an F32 k beside a BF16 q is accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'k'"), std::string::npos) << e.what();
  }
}

}  // namespace
#endif  // TANDEM_HAVE_CUDA
