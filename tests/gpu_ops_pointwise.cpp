// The memory-bound CUDA kernels (embedding, rmsnorm, rope backward, swiglu, zero, copy,
// split, and the fused add + rmsnorm and q/k norm + rope)
// against CpuOps on identical values: fresh random inputs every run (the seed is printed
// with every failure), F32 and BF16 data, odd shapes that take the one-element paths,
// gradients that accumulate over repeated calls, input gradients that are overwritten
// (they start as NaN, so a kernel that read them would show), and argument checks.
//
// Per element, |gpu - cpu| <= rtol·|cpu| + atol·max|cpu| over the tensor:
//   F32 data                 rtol 1e-5, atol 1e-6  (FP32 operation order, libm last bits)
//   BF16 data                rtol 8e-3, atol 1e-5  (CpuOps runs on the same bf16-rounded
//                            inputs; the GPU rounds each output to bf16 once, and one bf16
//                            ulp is at most 2^-7 = 7.8e-3 of the value)
//   F32 statistics, weight   rtol 1e-5, atol 1e-5  (rstd, rmsnorm dweight: FP32 sums in
//   gradients                                       another order, from either data dtype)
//                            except add_rmsnorm's BF16 rstd: the data tolerance, as it
//                            normalises the sum rounded to BF16 (as it stores it) where
//                            CpuOps keeps the FP32 sum
//   exact                    embedding forward and backward (the backward adds in CpuOps's
//                            order), add_rmsnorm's sum (BF16: against the rounded CPU sum),
//                            zero, copy
#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "elementwise.cuh"
#include "embedding.cuh"
#include "model/cpu_ops.h"
#include "qk_norm_rope.cuh"
#include "rollout/cpu_paged_attention.h"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "gpu_support.h"
#include "swiglu.cuh"
#include "tensor/bf16.h"
#include "tensor/fp8.h"

using namespace tandem;
using tandem::testing::DeviceBuffer;
using tandem::testing::check;

namespace {

float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// A data tensor in both backends: the F32 values CpuOps works on, and the same values on
// the GPU in `dtype` (BF16 values are rounded first, so both backends start equal).
class Operand {
 public:
  Operand(DType dtype, std::vector<int64_t> shape, std::vector<float> values)
      : dtype_(dtype), host_(std::move(values)), device_(host_.size() * dtype_size(dtype)) {
    if (dtype == DType::BF16) std::ranges::transform(host_, host_.begin(), round_bf16);
    cpu_ = Tensor::view(host_.data(), DType::F32, Device::CPU, shape);
    gpu_ = Tensor::view(device_.data, dtype, Device::CUDA, shape);
    if (static_cast<size_t>(cpu_.numel()) != host_.size()) throw std::logic_error("Operand: values do not fit shape");
    upload();
  }
  Operand(const Operand&) = delete;
  Operand& operator=(const Operand&) = delete;

  const Tensor& cpu() const { return cpu_; }
  const Tensor& gpu() const { return gpu_; }
  const std::vector<float>& host() const { return host_; }

  std::vector<float> download() const {
    std::vector<float> values(host_.size());
    if (dtype_ == DType::F32) {
      check(cudaMemcpy(values.data(), device_.data, gpu_.nbytes(), cudaMemcpyDeviceToHost), "download");
      return values;
    }
    std::vector<uint16_t> bits(host_.size());
    check(cudaMemcpy(bits.data(), device_.data, gpu_.nbytes(), cudaMemcpyDeviceToHost), "download");
    std::ranges::transform(bits, values.begin(), bf16_to_float);
    return values;
  }

  // The CPU side takes the GPU's values, so the next comparison measures one more call's
  // error alone, not BF16 rounding carried over from the previous one.
  void adopt_device_values() { std::ranges::copy(download(), host_.begin()); }

 private:
  void upload() {
    if (dtype_ == DType::F32) {
      check(cudaMemcpy(device_.data, host_.data(), gpu_.nbytes(), cudaMemcpyHostToDevice), "upload");
      return;
    }
    std::vector<uint16_t> bits(host_.size());
    std::ranges::transform(host_, bits.begin(), float_to_bf16);
    check(cudaMemcpy(device_.data, bits.data(), gpu_.nbytes(), cudaMemcpyHostToDevice), "upload");
  }

  DType dtype_;
  std::vector<float> host_;
  DeviceBuffer device_;
  Tensor cpu_, gpu_;
};

// An I32 tensor (token ids, positions) in both backends.
class Ints {
 public:
  explicit Ints(std::vector<int32_t> values) : host_(std::move(values)), device_(host_.size() * 4) {
    const int64_t n = static_cast<int64_t>(host_.size());
    cpu_ = Tensor::view(host_.data(), DType::I32, Device::CPU, {n});
    gpu_ = Tensor::view(device_.data, DType::I32, Device::CUDA, {n});
    check(cudaMemcpy(device_.data, host_.data(), host_.size() * 4, cudaMemcpyHostToDevice), "upload");
  }
  const Tensor& cpu() const { return cpu_; }
  const Tensor& gpu() const { return gpu_; }

 private:
  std::vector<int32_t> host_;
  DeviceBuffer device_;
  Tensor cpu_, gpu_;
};

struct Tolerance {
  double rtol, atol;
};
constexpr Tolerance kExact{0, 0};
constexpr Tolerance kF32Data{1e-5, 1e-6};
constexpr Tolerance kBF16Data{8e-3, 1e-5};
constexpr Tolerance kF32Sums{1e-5, 1e-5};

Tolerance data_tolerance(DType dtype) { return dtype == DType::BF16 ? kBF16Data : kF32Data; }

// The start of a gradient that must be overwritten: any read of it propagates a NaN.
std::vector<float> nans(int64_t n) { return std::vector<float>(n, std::nanf("")); }

// Row scales as an FP8 projection's output carries them: positive, over decades.
std::vector<float> row_scales(std::vector<float> normal_values) {
  for (float& v : normal_values) v = std::exp2(v);
  return normal_values;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, Tolerance tolerance,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float w : want) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double error = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double allowed = tolerance.rtol * std::fabs(static_cast<double>(want[i])) + tolerance.atol * scale;
    if (error <= allowed) continue;
    const double excess = std::isnan(error) ? INFINITY : error - allowed;
    if (bad++ == 0 || excess > worst_excess) worst = i, worst_excess = excess;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off, worst at " << worst
                     << ": got " << got[worst] << ", want " << want[worst] << " (rtol " << tolerance.rtol
                     << ", atol " << tolerance.atol << " x max " << scale << ")";
}

// Expects an std::invalid_argument whose message names the op and the argument.
void expect_refused(const std::function<void()>& call, const std::string& op, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << op << " accepted a call that should name " << fragment;
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(op), std::string::npos) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

std::string label(const char* op, DType dtype, std::initializer_list<int64_t> sizes) {
  std::string text = std::string(op) + " " + dtype_name(dtype) + " [";
  for (int64_t size : sizes) text += (text.back() == '[' ? "" : ",") + std::to_string(size);
  return text + "]";
}

constexpr DType kDataTypes[] = {DType::F32, DType::BF16};

class GpuPointwise : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    scratch_.emplace(1 << 20);
    seed_trace_.emplace(__FILE__, __LINE__, "random seed " + std::to_string(seed_));
  }
  void TearDown() override { seed_trace_.reset(); }

  std::vector<float> normal(int64_t n, float mean = 0, float stddev = 1) {
    std::normal_distribution<float> distribution(mean, stddev);
    std::vector<float> values(n);
    for (float& v : values) v = distribution(rng_);
    return values;
  }
  int32_t integer(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng_); }

  // Ids with many repeats (every other token from a handful of ids) and both ends of
  // the vocabulary.
  std::vector<int32_t> token_ids(int64_t tokens, int64_t vocab) {
    std::vector<int32_t> ids(tokens);
    for (int64_t t = 0; t < tokens; ++t)
      ids[t] = t % 2 ? integer(0, static_cast<int32_t>(vocab - 1)) : integer(0, 4);
    ids.back() = static_cast<int32_t>(vocab - 1);
    return ids;
  }

  // A view of scratch device memory, for argument checks that never reach a kernel.
  Tensor device_view(DType dtype, std::vector<int64_t> shape) {
    return Tensor::view(scratch_->data, dtype, Device::CUDA, std::move(shape));
  }

  CpuOps cpu_;

 private:
  const unsigned seed_ = std::random_device{}();
  std::mt19937 rng_{seed_};
  std::optional<::testing::ScopedTrace> seed_trace_;
  std::optional<DeviceBuffer> scratch_;
};

// ---------------------------------------------------------------- embedding

struct EmbeddingShape {
  int64_t vocab, columns, tokens;
};
constexpr EmbeddingShape kEmbeddingShapes[] = {
    {300, 64, 1}, {300, 1000, 3}, {300, 1024, 257}, {300, 7, 257}, {151936, 64, 257}, {151936, 24, 3}};

TEST_F(GpuPointwise, EmbeddingForwardCopiesRowsExactly) {
  for (DType dtype : kDataTypes) {
    for (const auto& [V, C, T] : kEmbeddingShapes) {
      const Operand table(dtype, {V, C}, normal(V * C));
      const Ints ids(token_ids(T, V));
      Operand out(dtype, {T, C}, normal(T * C));
      cpu_.embedding_forward(out.cpu(), table.cpu(), ids.cpu());
      cuda::embedding_forward(out.gpu(), table.gpu(), ids.gpu(), nullptr);
      expect_close(out.download(), out.host(), kExact, label("embedding_forward", dtype, {V, C, T}));
    }
  }
}

// The backward pass adds each vocabulary row's gradients in token order, as CpuOps does,
// so it matches bit for bit, and a second call adds the same again on top.
TEST_F(GpuPointwise, EmbeddingBackwardAccumulatesBitForBitLikeCpu) {
  for (DType dtype : kDataTypes) {
    for (const auto& [V, C, T] : kEmbeddingShapes) {
      Operand dtable(DType::F32, {V, C}, normal(V * C));
      const Operand dout(dtype, {T, C}, normal(T * C));
      const Ints ids(token_ids(T, V));
      for (int call = 1; call <= 2; ++call) {
        cpu_.embedding_backward(dtable.cpu(), dout.cpu(), ids.cpu());
        cuda::embedding_backward(dtable.gpu(), dout.gpu(), ids.gpu(), nullptr);
        expect_close(dtable.download(), dtable.host(), kExact,
                     label("embedding_backward", dtype, {V, C, T}) + " call " + std::to_string(call));
      }
    }
  }
}

TEST_F(GpuPointwise, EmbeddingIdsOutsideTheVocabularyGiveNanRowsAndNoGradient) {
  const int64_t V = 300, C = 64;
  const Operand table(DType::F32, {V, C}, normal(V * C));
  const Ints ids({5, -1, 300, 5});
  Operand out(DType::F32, {4, C}, normal(4 * C));
  cuda::embedding_forward(out.gpu(), table.gpu(), ids.gpu(), nullptr);
  const std::vector<float> rows = out.download();
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(rows[c], table.host()[5 * C + c]);
    EXPECT_TRUE(std::isnan(rows[C + c]) && std::isnan(rows[2 * C + c])) << "column " << c;
    EXPECT_EQ(rows[3 * C + c], table.host()[5 * C + c]);
  }

  Operand dtable(DType::F32, {V, C}, std::vector<float>(V * C, 0.0f));
  const Operand dout(DType::F32, {4, C}, normal(4 * C));
  cuda::embedding_backward(dtable.gpu(), dout.gpu(), ids.gpu(), nullptr);
  std::vector<float> want(V * C, 0.0f);
  for (int64_t c = 0; c < C; ++c) want[5 * C + c] = dout.host()[c] + dout.host()[3 * C + c];
  expect_close(dtable.download(), want, kExact, "embedding_backward with ids -1 and 300");
}

TEST_F(GpuPointwise, EmbeddingRefusesBadArguments) {
  const Tensor table = device_view(DType::BF16, {300, 64}), ids = device_view(DType::I32, {3});
  const Tensor out = device_view(DType::BF16, {3, 64});
  const char* forward = "cuda::embedding_forward";
  expect_refused([&] { cuda::embedding_forward(out, device_view(DType::F16, {300, 64}), ids, nullptr); }, forward,
                 "'table'");
  expect_refused([&] { cuda::embedding_forward(device_view(DType::F32, {3, 64}), table, ids, nullptr); }, forward,
                 "'out'");
  expect_refused([&] { cuda::embedding_forward(device_view(DType::BF16, {3, 63}), table, ids, nullptr); }, forward,
                 "'out'");
  expect_refused([&] { cuda::embedding_forward(out, table, device_view(DType::F32, {3}), nullptr); }, forward, "'ids'");
  std::vector<uint16_t> host_table(300 * 64);
  expect_refused(
      [&] {
        cuda::embedding_forward(out, Tensor::view(host_table.data(), DType::BF16, Device::CPU, {300, 64}), ids,
                                nullptr);
      },
      forward, "'table'");
  const char* backward = "cuda::embedding_backward";
  expect_refused([&] { cuda::embedding_backward(table, out, ids, nullptr); }, backward, "'dtable'");
  expect_refused([&] { cuda::embedding_backward(device_view(DType::F32, {300, 64}), out, device_view(DType::I32, {4}),
                                                nullptr); },
                 backward, "'dout'");
}

// ---------------------------------------------------------------- rmsnorm

struct RowsShape {
  int64_t rows, columns;
};
// Per token [T, hidden] and per head [T*heads, head_dim]; rows of 1001 take the
// one-element path.
constexpr RowsShape kRmsnormShapes[] = {{1, 64},       {3, 1000},  {257, 1024}, {7, 1001},
                                        {257 * 16, 128}, {3 * 8, 16}, {257 * 8, 16}};

TEST_F(GpuPointwise, RmsnormForwardMatchesCpu) {
  for (DType dtype : kDataTypes) {
    for (const auto& [N, D] : kRmsnormShapes) {
      const Operand x(dtype, {N, D}, normal(N * D, 0.0f, 2.0f));
      const Operand weight(dtype, {D}, normal(D, 1.0f, 0.1f));
      Operand out(dtype, {N, D}, normal(N * D));
      Operand rstd(DType::F32, {N}, normal(N));
      cpu_.rmsnorm_forward(out.cpu(), rstd.cpu(), x.cpu(), weight.cpu(), 1e-6f);
      cuda::rmsnorm_forward(out.gpu(), rstd.gpu(), x.gpu(), weight.gpu(), 1e-6f, nullptr);
      expect_close(out.download(), out.host(), data_tolerance(dtype), label("rmsnorm_forward out", dtype, {N, D}));
      expect_close(rstd.download(), rstd.host(), kF32Sums, label("rmsnorm_forward rstd", dtype, {N, D}));
    }
  }
}

// dx accumulated (from random values) or overwritten (from NaN); dweight accumulates in both.
TEST_F(GpuPointwise, RmsnormBackwardAccumulatesOrOverwritesLikeCpu) {
  for (DType dtype : kDataTypes) {
    for (const auto& [N, D] : kRmsnormShapes) {
      for (const GradWrite dx_write : {GradWrite::accumulate, GradWrite::overwrite}) {
        const bool overwrite = dx_write == GradWrite::overwrite;
        const Operand x(dtype, {N, D}, normal(N * D, 0.0f, 2.0f));
        const Operand weight(dtype, {D}, normal(D, 1.0f, 0.1f));
        const Operand dout(dtype, {N, D}, normal(N * D));
        Operand dx(dtype, {N, D}, overwrite ? nans(N * D) : normal(N * D));
        Operand dweight(DType::F32, {D}, normal(D));
        // rstd as the forward pass leaves it, from the same (rounded) x on both sides.
        std::vector<float> normed(N * D), rstd_values(N);
        cpu_.rmsnorm_forward(Tensor::view(normed.data(), DType::F32, Device::CPU, {N, D}),
                             Tensor::view(rstd_values.data(), DType::F32, Device::CPU, {N}), x.cpu(), weight.cpu(),
                             1e-6f);
        const Operand rstd(DType::F32, {N}, rstd_values);
        for (int call = 1; call <= 2; ++call) {
          cpu_.rmsnorm_backward(dx.cpu(), dweight.cpu(), dout.cpu(), x.cpu(), weight.cpu(), rstd.cpu(), dx_write);
          cuda::rmsnorm_backward(dx.gpu(), dweight.gpu(), dout.gpu(), x.gpu(), weight.gpu(), rstd.gpu(), dx_write,
                                 nullptr);
          const std::string what = label(overwrite ? "rmsnorm_backward overwriting dx" : "rmsnorm_backward", dtype,
                                         {N, D}) + " call " + std::to_string(call);
          expect_close(dx.download(), dx.host(), data_tolerance(dtype), what + " dx");
          expect_close(dweight.download(), dweight.host(), kF32Sums, what + " dweight");
          dx.adopt_device_values();
        }
      }
    }
  }
}

TEST_F(GpuPointwise, RmsnormRefusesBadArguments) {
  const Tensor x = device_view(DType::BF16, {4, 128}), out = device_view(DType::BF16, {4, 128});
  const Tensor weight = device_view(DType::BF16, {128}), rstd = device_view(DType::F32, {4});
  const Tensor dweight = device_view(DType::F32, {128});
  const char* forward = "cuda::rmsnorm_forward";
  expect_refused([&] { cuda::rmsnorm_forward(out, device_view(DType::BF16, {4}), x, weight, 1e-6f, nullptr); },
                 forward, "'rstd'");
  expect_refused([&] { cuda::rmsnorm_forward(out, rstd, x, device_view(DType::F32, {128}), 1e-6f, nullptr); },
                 forward, "'weight'");
  expect_refused([&] { cuda::rmsnorm_forward(device_view(DType::BF16, {4, 64}), rstd, x, weight, 1e-6f, nullptr); },
                 forward, "'out'");
  const char* backward = "cuda::rmsnorm_backward";
  expect_refused([&] { cuda::rmsnorm_backward(out, weight, out, x, weight, rstd, GradWrite::accumulate, nullptr); }, backward, "'dweight'");
  expect_refused([&] { cuda::rmsnorm_backward(out, dweight, device_view(DType::F32, {4, 128}), x, weight, rstd,
                                              GradWrite::accumulate, nullptr); },
                 backward, "'dout'");
  expect_refused([&] { cuda::rmsnorm_backward(out, dweight, out, x, weight, device_view(DType::F32, {5}),
                                              GradWrite::overwrite, nullptr); },
                 backward, "'rstd'");
  const Tensor wide = device_view(DType::F32, {1, 20000}), wide_weight = device_view(DType::F32, {20000});
  const Tensor one_rstd = device_view(DType::F32, {1});
  expect_refused([&] { cuda::rmsnorm_backward(wide, wide_weight, wide, wide, wide_weight, one_rstd,
                                              GradWrite::accumulate, nullptr); },
                 backward, "20000");
  expect_refused([&] { cuda::rmsnorm_forward(wide, one_rstd, wide, wide_weight, 1e-6f, nullptr); }, forward, "20000");
}

// ---------------------------------------------------------------- add + rmsnorm

// Against CpuOps, and against the sum rounded on the host then cuda::rmsnorm_forward bit
// for bit: the fused kernel rounds the sum once to the data dtype and sums squares as the
// norm kernel does.
TEST_F(GpuPointwise, AddRmsnormMatchesCpuAndTheUnfusedNorm) {
  for (DType dtype : kDataTypes) {
    for (const auto& [N, D] : kRmsnormShapes) {
      const std::string what = label("add_rmsnorm_forward", dtype, {N, D});
      Operand hidden(dtype, {N, D}, normal(N * D, 0.0f, 2.0f));
      const Operand branch(dtype, {N, D}, normal(N * D));
      const Operand weight(dtype, {D}, normal(D, 1.0f, 0.1f));
      Operand out(dtype, {N, D}, normal(N * D)), rstd(DType::F32, {N}, normal(N));
      std::vector<float> host_sum(N * D);  // an Operand rounds it to dtype as it uploads it
      for (int64_t i = 0; i < N * D; ++i) host_sum[i] = hidden.host()[i] + branch.host()[i];
      const Operand unfused_hidden(dtype, {N, D}, host_sum);
      Operand unfused_out(dtype, {N, D}, normal(N * D)), unfused_rstd(DType::F32, {N}, normal(N));
      cuda::rmsnorm_forward(unfused_out.gpu(), unfused_rstd.gpu(), unfused_hidden.gpu(), weight.gpu(), 1e-6f, nullptr);

      cpu_.add_rmsnorm_forward(out.cpu(), rstd.cpu(), hidden.cpu(), branch.cpu(), weight.cpu(), 1e-6f);
      cuda::add_rmsnorm_forward(out.gpu(), rstd.gpu(), hidden.gpu(), branch.gpu(), weight.gpu(), 1e-6f, nullptr);
      std::vector<float> sum = hidden.host();
      if (dtype == DType::BF16) std::ranges::transform(sum, sum.begin(), round_bf16);
      expect_close(hidden.download(), sum, kExact, what + " hidden");
      // The kernel normalises the sum as stored (in BF16: rounded), the CPU twin the exact
      // sum: half an ulp of difference there can move the output by one more ulp. Normalise
      // the stored sum on the CPU too, so `out` measures the norm's own error.
      hidden.adopt_device_values();
      cpu_.rmsnorm_forward(out.cpu(), rstd.cpu(), hidden.cpu(), weight.cpu(), 1e-6f);
      expect_close(out.download(), out.host(), data_tolerance(dtype), what + " out");
      expect_close(rstd.download(), rstd.host(), dtype == DType::BF16 ? kBF16Data : kF32Sums, what + " rstd");

      expect_close(out.download(), unfused_out.download(), kExact, what + " out vs sum, rmsnorm");
      expect_close(rstd.download(), unfused_rstd.download(), kExact, what + " rstd vs sum, rmsnorm");
    }
  }
}

TEST_F(GpuPointwise, AddRmsnormRefusesBadArguments) {
  const Tensor hidden = device_view(DType::BF16, {4, 128}), out = device_view(DType::BF16, {4, 128});
  const Tensor weight = device_view(DType::BF16, {128}), rstd = device_view(DType::F32, {4});
  const char* op = "cuda::add_rmsnorm_forward";
  expect_refused([&] { cuda::add_rmsnorm_forward(out, rstd, hidden, device_view(DType::F32, {4, 128}), weight, 1e-6f,
                                                 nullptr); },
                 op, "'branch'");
  expect_refused([&] { cuda::add_rmsnorm_forward(device_view(DType::BF16, {4, 64}), rstd, hidden, hidden, weight,
                                                 1e-6f, nullptr); },
                 op, "'out'");
  expect_refused([&] { cuda::add_rmsnorm_forward(out, rstd, hidden, hidden, device_view(DType::BF16, {64}), 1e-6f,
                                                 nullptr); },
                 op, "'weight'");
  const Tensor wide = device_view(DType::F32, {1, 20000}), wide_weight = device_view(DType::F32, {20000});
  expect_refused([&] { cuda::add_rmsnorm_forward(wide, device_view(DType::F32, {1}), wide, wide, wide_weight, 1e-6f,
                                                 nullptr); },
                 op, "20000");
}

// ---------------------------------------------------------------- rope

struct RopeShape {
  int64_t tokens;
  int heads, head_dim;
};
// head_dim 6 takes the one-element path; 3 heads leave a partial group of heads; head_dim
// 80 has 5 packs of 8 a half (BF16), an odd count, where BF16's 8 packs of 8 at 128 would
// not tell a pack's index from an element's in the rotating kernels' angle table.
constexpr RopeShape kRopeShapes[] = {{1, 16, 128}, {3, 8, 128}, {257, 16, 128}, {257, 8, 16},
                                     {3, 2, 6},    {5, 3, 64},  {301, 4, 80}};

// Qwen3's frequencies (theta 1e6), computed as ModelConfig::rope_inv_freq does.
std::vector<float> inv_freq(int head_dim) {
  std::vector<float> freq(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i)
    freq[i] = 1.0f / std::pow(1e6f, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  return freq;
}

TEST_F(GpuPointwise, RopeBackwardMatchesCpu) {
  for (DType dtype : kDataTypes) {
    for (const auto& [T, heads, head_dim] : kRopeShapes) {
      std::vector<int32_t> position_values(T);
      for (int32_t& p : position_values) p = integer(0, 32767);  // large angles too
      const Ints positions(position_values);
      const Operand freq(DType::F32, {head_dim / 2}, inv_freq(head_dim));
      Operand dx(dtype, {T, heads * head_dim}, normal(T * heads * head_dim));
      cpu_.rope_backward(dx.cpu(), positions.cpu(), freq.cpu(), heads);
      cuda::rope_backward(dx.gpu(), positions.gpu(), freq.gpu(), heads, nullptr);
      expect_close(dx.download(), dx.host(), data_tolerance(dtype),
                   label("rope_backward", dtype, {T, heads, head_dim}));
    }
  }
}

// The per-head norm's backward behind RoPE in one pass, against CpuOps (RoPE's backward,
// then the norm's). Beside the rope shapes: tokens spanning many blocks, one head a token.
TEST_F(GpuPointwise, RmsnormRopeBackwardMatchesCpu) {
  std::vector<RopeShape> shapes(std::begin(kRopeShapes), std::end(kRopeShapes));
  shapes.push_back({2049, 16, 128});
  shapes.push_back({1000, 1, 128});
  for (DType dtype : kDataTypes) {
    for (const auto& [T, heads, head_dim] : shapes) {
      const int64_t W = heads * head_dim;
      std::vector<int32_t> position_values(T);
      for (int32_t& p : position_values) p = integer(0, 32767);
      const Ints positions(position_values);
      const Operand freq(DType::F32, {head_dim / 2}, inv_freq(head_dim));
      const Operand x(dtype, {T, W}, normal(T * W, 0.0f, 2.0f));
      const Operand weight(dtype, {head_dim}, normal(head_dim, 1.0f, 0.1f));
      const Operand dout(dtype, {T, W}, normal(T * W));
      Operand dx(dtype, {T, W}, nans(T * W));
      Operand dweight(DType::F32, {head_dim}, normal(head_dim));
      std::vector<float> normed(T * W), rstd_values(T * heads);
      cpu_.rmsnorm_forward(Tensor::view(normed.data(), DType::F32, Device::CPU, {T * heads, head_dim}),
                           Tensor::view(rstd_values.data(), DType::F32, Device::CPU, {T * heads}),
                           Tensor::view(x.cpu().data, DType::F32, Device::CPU, {T * heads, head_dim}), weight.cpu(),
                           1e-6f);
      const Operand rstd(DType::F32, {T * heads}, rstd_values);
      for (int call = 1; call <= 2; ++call) {
        cpu_.rmsnorm_rope_backward(dx.cpu(), dweight.cpu(), dout.cpu(), x.cpu(), weight.cpu(), rstd.cpu(),
                                   positions.cpu(), freq.cpu(), heads);
        cuda::rmsnorm_rope_backward(dx.gpu(), dweight.gpu(), dout.gpu(), x.gpu(), weight.gpu(), rstd.gpu(),
                                    positions.gpu(), freq.gpu(), heads, nullptr);
        const std::string what =
            label("rmsnorm_rope_backward", dtype, {T, heads, head_dim}) + " call " + std::to_string(call);
        expect_close(dx.download(), dx.host(), data_tolerance(dtype), what + " dx");
        expect_close(dweight.download(), dweight.host(), kF32Sums, what + " dweight");
        expect_close(dout.download(), dout.host(), kExact, what + " dout (left as it was)");
      }
    }
  }
}

TEST_F(GpuPointwise, RmsnormRopeBackwardRefusesBadArguments) {
  const Tensor x = device_view(DType::BF16, {3, 8 * 128}), weight = device_view(DType::BF16, {128});
  const Tensor dweight = device_view(DType::F32, {128}), rstd = device_view(DType::F32, {3 * 8});
  const Tensor positions = device_view(DType::I32, {3}), freq = device_view(DType::F32, {64});
  const char* op = "cuda::rmsnorm_rope_backward";
  expect_refused([&] { cuda::rmsnorm_rope_backward(x, dweight, x, x, weight, rstd, positions, freq, 7, nullptr); },
                 op, "7 heads");
  expect_refused([&] { cuda::rmsnorm_rope_backward(x, dweight, x, x, weight, device_view(DType::F32, {3}), positions,
                                                   freq, 8, nullptr); },
                 op, "'rstd'");
  expect_refused([&] { cuda::rmsnorm_rope_backward(x, dweight, x, x, weight, rstd, positions,
                                                   device_view(DType::F32, {32}), 8, nullptr); },
                 op, "'inv_freq'");
  expect_refused([&] { cuda::rmsnorm_rope_backward(x, dweight, device_view(DType::BF16, {3, 4 * 128}), x, weight,
                                                   rstd, positions, freq, 8, nullptr); },
                 op, "'dout'");
}

TEST_F(GpuPointwise, RopeRefusesBadArguments) {
  const Tensor dx = device_view(DType::BF16, {3, 8 * 128}), positions = device_view(DType::I32, {3});
  const Tensor freq = device_view(DType::F32, {64});
  const char* op = "cuda::rope_backward";
  expect_refused([&] { cuda::rope_backward(dx, positions, freq, 7, nullptr); }, op, "7 heads");
  expect_refused([&] { cuda::rope_backward(device_view(DType::BF16, {3, 8 * 5}), positions,
                                           device_view(DType::F32, {2}), 8, nullptr); },
                 op, "even size");
  expect_refused([&] { cuda::rope_backward(dx, device_view(DType::I32, {4}), freq, 8, nullptr); }, op, "'positions'");
  expect_refused([&] { cuda::rope_backward(dx, positions, device_view(DType::BF16, {64}), 8, nullptr); }, op,
                 "'inv_freq'");
  expect_refused([&] { cuda::rope_backward(device_view(DType::F16, {3, 8 * 128}), positions, freq, 8, nullptr); }, op,
                 "'dx'");
}

// ---------------------------------------------------------------- q/k norm + rope

struct QkShape {
  int64_t tokens;
  int heads, kv_heads, head_dim;
};
// Qwen3-0.6B at decode sizes (64 and 256 tokens: a token's heads shared out among
// blocks), alone and at a training sequence's 1024 tokens (two tokens a block), and 1023
// (the last block's second token missing); head_dim 6 takes the one-element path with
// one-lane teams, 512 (the widest) a whole warp per head; head_dim 80 an odd count of packs
// a half (5 of 8 in BF16, 10 of 4 in F32), at two tokens a block with the last one alone.
constexpr QkShape kQkShapes[] = {{1, 16, 8, 128},    {64, 16, 8, 128}, {256, 16, 8, 128}, {1024, 16, 8, 128},
                                 {1023, 16, 8, 128}, {3, 2, 1, 6},     {5, 4, 2, 64},     {3, 2, 2, 512},
                                 {601, 4, 2, 80}};

// With qk_norm weights and without (rope alone); then in place, as the engine rotates q
// and k of a model without qk_norm, which must give the same bits as into other buffers.
// With the weights, the first call also keeps each head's rstd (as the trainer does) and
// the in-place call keeps none (as the engine does).
TEST_F(GpuPointwise, QkNormRopeMatchesCpuAlsoInPlace) {
  for (DType dtype : kDataTypes) {
    for (const auto& [T, H, KV, D] : kQkShapes) {
      for (const bool norm : {true, false}) {
        const std::string what =
            label(norm ? "qk_norm_rope_forward" : "qk_norm_rope_forward without norms", dtype, {T, H, KV, D});
        std::vector<int32_t> position_values(T);
        for (int32_t& p : position_values) p = integer(0, 32767);
        const Ints positions(position_values);
        const Operand freq(DType::F32, {D / 2}, inv_freq(D));
        Operand q(dtype, {T, H * D}, normal(T * H * D, 0.0f, 2.0f)), k(dtype, {T, KV * D}, normal(T * KV * D, 0.0f, 2.0f));
        const Operand q_norm(dtype, {D}, normal(D, 1.0f, 0.2f)), k_norm(dtype, {D}, normal(D, 1.0f, 0.2f));
        Operand q_out(dtype, {T, H * D}, normal(T * H * D)), k_out(dtype, {T, KV * D}, normal(T * KV * D));
        const Tensor cpu_q_norm = norm ? q_norm.cpu() : Tensor{}, cpu_k_norm = norm ? k_norm.cpu() : Tensor{};
        const Tensor gpu_q_norm = norm ? q_norm.gpu() : Tensor{}, gpu_k_norm = norm ? k_norm.gpu() : Tensor{};
        const Operand q_rstd(DType::F32, {T * H}, nans(T * H)), k_rstd(DType::F32, {T * KV}, nans(T * KV));
        cpu_.qk_norm_rope_forward(q_out.cpu(), k_out.cpu(), q.cpu(), k.cpu(), cpu_q_norm, cpu_k_norm, positions.cpu(),
                                  freq.cpu(), H, KV, 1e-6f, norm ? q_rstd.cpu() : Tensor{},
                                  norm ? k_rstd.cpu() : Tensor{});
        cuda::qk_norm_rope_forward(q_out.gpu(), k_out.gpu(), q.gpu(), k.gpu(), gpu_q_norm, gpu_k_norm, positions.gpu(),
                                   freq.gpu(), H, KV, 1e-6f, norm ? q_rstd.gpu() : Tensor{},
                                   norm ? k_rstd.gpu() : Tensor{}, nullptr);
        expect_close(q_out.download(), q_out.host(), data_tolerance(dtype), what + " q");
        expect_close(k_out.download(), k_out.host(), data_tolerance(dtype), what + " k");
        if (norm) {
          expect_close(q_rstd.download(), q_rstd.host(), kF32Sums, what + " q_rstd");
          expect_close(k_rstd.download(), k_rstd.host(), kF32Sums, what + " k_rstd");
        }
        cuda::qk_norm_rope_forward(q.gpu(), k.gpu(), q.gpu(), k.gpu(), gpu_q_norm, gpu_k_norm, positions.gpu(),
                                   freq.gpu(), H, KV, 1e-6f, Tensor{}, Tensor{}, nullptr);
        expect_close(q.download(), q_out.download(), kExact, what + " q in place");
        expect_close(k.download(), k_out.download(), kExact, what + " k in place");
      }
    }
  }
}

// The engine's fused path, from the q|k|v rows of one GEMM into q and the KV cache,
// against CpuPagedAttention::store_qkv (the column split, qk_norm_rope_forward, store):
// every token goes to its own cache row, in shuffled order, and the rows no token writes
// keep their contents.
TEST_F(GpuPointwise, QkvNormRopeStoreMatchesCpuStoreQkvAlsoOfScaledRows) {
  CpuPagedAttention cpu_attention;
  for (DType dtype : kDataTypes) {
    for (const auto& [T, H, KV, D] : kQkShapes) {
      for (const bool norm : {true, false}) {
        const std::string what =
            label(norm ? "qkv_norm_rope_store" : "qkv_norm_rope_store without norms", dtype, {T, H, KV, D});
        std::vector<int32_t> position_values(T), slot_values(T + 5);
        for (int32_t& p : position_values) p = integer(0, 32767);
        for (size_t r = 0; r < slot_values.size(); ++r) slot_values[r] = static_cast<int32_t>(r);
        for (size_t r = slot_values.size() - 1; r > 0; --r) std::swap(slot_values[r], slot_values[integer(0, static_cast<int32_t>(r))]);
        slot_values.resize(T);
        const Ints positions(position_values), slots(slot_values);
        const int64_t rows = T + 5, W = (H + 2 * KV) * D;
        const Operand freq(DType::F32, {D / 2}, inv_freq(D));
        const Operand qkv(dtype, {T, W}, normal(T * W, 0.0f, 2.0f));
        const Operand q_norm(dtype, {D}, normal(D, 1.0f, 0.2f)), k_norm(dtype, {D}, normal(D, 1.0f, 0.2f));
        Operand q_out(dtype, {T, H * D}, normal(T * H * D));
        Operand keys(dtype, {rows, KV * D}, normal(rows * KV * D)), values(dtype, {rows, KV * D}, normal(rows * KV * D));
        const Tensor cpu_q_norm = norm ? q_norm.cpu() : Tensor{}, cpu_k_norm = norm ? k_norm.cpu() : Tensor{};
        const Tensor gpu_q_norm = norm ? q_norm.gpu() : Tensor{}, gpu_k_norm = norm ? k_norm.gpu() : Tensor{};
        cpu_attention.store_qkv(q_out.cpu(), {keys.cpu(), values.cpu()}, qkv.cpu(), cpu_q_norm, cpu_k_norm,
                                positions.cpu(), freq.cpu(), slots.cpu(), H, KV, 1e-6f);
        cuda::qkv_norm_rope_store(q_out.gpu(), {keys.gpu(), values.gpu()}, qkv.gpu(), gpu_q_norm, gpu_k_norm,
                                  positions.gpu(), freq.gpu(), slots.gpu(), H, KV, 1e-6f, nullptr);
        expect_close(q_out.download(), q_out.host(), data_tolerance(dtype), what + " q");
        expect_close(keys.download(), keys.host(), data_tolerance(dtype), what + " key cache");
        expect_close(values.download(), values.host(), kExact, what + " value cache");
        // An FP8 projection's rows, with their row scales: values are scaled once more.
        const Operand scales(DType::F32, {T}, row_scales(normal(T, 0.0f, 2.0f)));
        cpu_attention.store_qkv(q_out.cpu(), {keys.cpu(), values.cpu()}, {qkv.cpu(), scales.cpu()}, cpu_q_norm,
                                cpu_k_norm, positions.cpu(), freq.cpu(), slots.cpu(), H, KV, 1e-6f);
        cuda::qkv_norm_rope_store(q_out.gpu(), {keys.gpu(), values.gpu()}, {qkv.gpu(), scales.gpu()}, gpu_q_norm,
                                  gpu_k_norm, positions.gpu(), freq.gpu(), slots.gpu(), H, KV, 1e-6f, nullptr);
        expect_close(q_out.download(), q_out.host(), data_tolerance(dtype), what + " q of scaled rows");
        expect_close(keys.download(), keys.host(), data_tolerance(dtype), what + " key cache of scaled rows");
        expect_close(values.download(), values.host(), data_tolerance(dtype), what + " value cache of scaled rows");
      }
    }
  }
}

// The same into a cache of FP8 codes with a scale per (row, kv head), as an engine with
// rollout.kv-cache-dtype = fp8 stores: the GPU codes the values it would have stored in
// the dtype, the CPU its FP32 ones. The scales then agree within the dtype's error, and
// the decoded values within it plus one code step (2^-3 of the element, where a rounding
// point lies between the two) or the subnormal step (2^-9 of the scale).
TEST_F(GpuPointwise, QkvNormRopeStoreIntoFp8CodesMatchesCpu) {
  CpuPagedAttention cpu_attention;
  for (DType dtype : kDataTypes) {
    for (const auto& [T, H, KV, D] : kQkShapes) {
      const std::string what = label("qkv_norm_rope_store into FP8 codes", dtype, {T, H, KV, D});
      std::vector<int32_t> position_values(T), slot_values(T + 5);
      for (int32_t& p : position_values) p = integer(0, 32767);
      std::iota(slot_values.begin(), slot_values.end(), 0);
      for (size_t r = slot_values.size() - 1; r > 0; --r) std::swap(slot_values[r], slot_values[integer(0, static_cast<int32_t>(r))]);
      slot_values.resize(T);
      const Ints positions(position_values), slots(slot_values);
      const int64_t rows = T + 5, W = (H + 2 * KV) * D, KD = KV * D;
      const Operand freq(DType::F32, {D / 2}, inv_freq(D));
      const Operand qkv(dtype, {T, W}, normal(T * W, 0.0f, 2.0f));
      const Operand q_norm(dtype, {D}, normal(D, 1.0f, 0.2f)), k_norm(dtype, {D}, normal(D, 1.0f, 0.2f));
      Operand q_out(dtype, {T, H * D}, normal(T * H * D));
      struct Coded {
        std::vector<uint8_t> codes;
        std::vector<float> scales;
        DeviceBuffer codes_on_gpu, scales_on_gpu;
      };
      Coded keys{std::vector<uint8_t>(rows * KD), std::vector<float>(rows * KV), DeviceBuffer(rows * KD),
                 DeviceBuffer(rows * KV * 4)};
      Coded values{keys.codes, keys.scales, DeviceBuffer(rows * KD), DeviceBuffer(rows * KV * 4)};
      const auto layer = [&](Device device) {
        const auto view = [&](Coded& c, bool scales) {
          void* at = device == Device::CPU ? (scales ? static_cast<void*>(c.scales.data()) : c.codes.data())
                                           : (scales ? c.scales_on_gpu.data : c.codes_on_gpu.data);
          return scales ? Tensor::view(at, DType::F32, device, {rows, KV})
                        : Tensor::view(at, DType::F8_E4M3, device, {rows, KD});
        };
        return CacheLayer{view(keys, false), view(values, false), view(keys, true), view(values, true)};
      };
      cpu_attention.store_qkv(q_out.cpu(), layer(Device::CPU), qkv.cpu(), q_norm.cpu(), k_norm.cpu(),
                              positions.cpu(), freq.cpu(), slots.cpu(), H, KV, 1e-6f);
      cuda::qkv_norm_rope_store(q_out.gpu(), layer(Device::CUDA), qkv.gpu(), q_norm.gpu(), k_norm.gpu(),
                                positions.gpu(), freq.gpu(), slots.gpu(), H, KV, 1e-6f, nullptr);
      expect_close(q_out.download(), q_out.host(), data_tolerance(dtype), what + " q");
      const Tolerance tolerance = data_tolerance(dtype);
      for (Coded* c : {&keys, &values}) {
        std::vector<uint8_t> codes(c->codes.size());
        std::vector<float> scales(c->scales.size());
        check(cudaMemcpy(codes.data(), c->codes_on_gpu.data, codes.size(), cudaMemcpyDeviceToHost), "download");
        check(cudaMemcpy(scales.data(), c->scales_on_gpu.data, scales.size() * 4, cudaMemcpyDeviceToHost), "download");
        for (const int32_t row : slot_values)
          for (int64_t h = 0; h < KV; ++h) {
            const float want_scale = c->scales[row * KV + h], got_scale = scales[row * KV + h];
            ASSERT_NEAR(got_scale, want_scale, tolerance.rtol * want_scale + 1e-30) << what << " row " << row;
            for (int64_t d = 0; d < D; ++d) {
              const int64_t i = row * KD + h * D + d;
              const float want = e4m3_to_float(c->codes[i]) * want_scale, got = e4m3_to_float(codes[i]) * got_scale;
              ASSERT_LE(std::abs(got - want), 0.125f * std::abs(want) + 0x1p-9f * want_scale +
                                                   tolerance.rtol * 448 * want_scale)
                  << what << (c == &keys ? " key" : " value") << " row " << row << " head " << h << " dim " << d;
            }
          }
      }
    }
  }
}

TEST_F(GpuPointwise, QkvNormRopeStoreRefusesBadArguments) {
  const Tensor q_out = device_view(DType::BF16, {3, 16 * 128}), qkv = device_view(DType::BF16, {3, 32 * 128});
  const Tensor cache = device_view(DType::BF16, {8, 8 * 128}), weight = device_view(DType::BF16, {128});
  const Tensor positions = device_view(DType::I32, {3}), freq = device_view(DType::F32, {64});
  const char* op = "cuda::qkv_norm_rope_store";
  auto call = [&](const Tensor& rows, const Tensor& values, const Tensor& slots) {
    cuda::qkv_norm_rope_store(q_out, {cache, values}, rows, weight, weight, positions, freq, slots, 16, 8, 1e-6f,
                              nullptr);
  };
  expect_refused([&] { call(device_view(DType::BF16, {3, 31 * 128}), cache, positions); }, op, "'qkv'");
  expect_refused([&] { call(qkv, device_view(DType::BF16, {7, 8 * 128}), positions); }, op, "'values'");
  expect_refused([&] { call(qkv, cache, device_view(DType::I32, {2})); }, op, "'slots'");
}

TEST_F(GpuPointwise, QkNormRopeRefusesBadArguments) {
  const Tensor q = device_view(DType::BF16, {3, 16 * 128}), k = device_view(DType::BF16, {3, 8 * 128});
  const Tensor positions = device_view(DType::I32, {3}), freq = device_view(DType::F32, {64});
  const Tensor weight = device_view(DType::BF16, {128});
  const char* op = "cuda::qk_norm_rope_forward";
  const Tensor q_rstd = device_view(DType::F32, {3 * 16}), k_rstd = device_view(DType::F32, {3 * 8});
  auto call = [&](const Tensor& k_in, const Tensor& q_norm, const Tensor& k_norm, const Tensor& pos, int heads) {
    cuda::qk_norm_rope_forward(q, k_in, q, k_in, q_norm, k_norm, pos, freq, heads, 8, 1e-6f, Tensor{}, Tensor{},
                               nullptr);
  };
  auto keeping = [&](const Tensor& weights, const Tensor& q_kept, const Tensor& k_kept) {
    cuda::qk_norm_rope_forward(q, k, q, k, weights, weights, positions, freq, 16, 8, 1e-6f, q_kept, k_kept, nullptr);
  };
  expect_refused([&] { keeping(Tensor{}, q_rstd, k_rstd); }, op, "without q/k norm weights");
  expect_refused([&] { keeping(weight, q_rstd, Tensor{}); }, op, "'k_rstd'");
  expect_refused([&] { keeping(weight, k_rstd, k_rstd); }, op, "'q_rstd'");
  expect_refused([&] { call(k, weight, Tensor{}, positions, 16); }, op, "'k_norm'");
  expect_refused([&] { call(k, device_view(DType::F32, {128}), weight, positions, 16); }, op, "'q_norm'");
  expect_refused([&] { call(device_view(DType::BF16, {3, 7 * 128}), weight, weight, positions, 16); }, op, "'k'");
  expect_refused([&] { call(k, weight, weight, device_view(DType::I32, {4}), 16); }, op, "'positions'");
  expect_refused([&] { call(k, weight, weight, positions, 7); }, op, "7 heads");
  expect_refused(
      [&] {
        const Tensor wide_q = device_view(DType::BF16, {1, 2 * 1024}), wide_k = device_view(DType::BF16, {1, 1024});
        cuda::qk_norm_rope_forward(wide_q, wide_k, wide_q, wide_k, Tensor{}, Tensor{}, device_view(DType::I32, {1}),
                                   device_view(DType::F32, {512}), 2, 1, 1e-6f, Tensor{}, Tensor{}, nullptr);
      },
      op, "1024");
}

// ---------------------------------------------------------------- swiglu, add, zero, copy

// 1001, 7 and 3·1001 elements leave a tail after the last full pack.
constexpr RowsShape kFlatShapes[] = {{1, 64}, {3, 1000}, {257, 3072}, {3, 1001}, {1, 7}};

// Gate values wide enough to saturate the sigmoid, extremes included.
std::vector<float> with_extremes(std::vector<float> values) {
  const float extremes[] = {-100.0f, 100.0f, -30.0f, 30.0f};
  for (size_t i = 0; i < std::size(extremes) && i < values.size(); ++i) values[i] = extremes[i];
  return values;
}

TEST_F(GpuPointwise, SwigluForwardMatchesCpu) {
  for (DType dtype : kDataTypes) {
    for (const auto& [N, I] : kFlatShapes) {
      const Operand gate(dtype, {N, I}, with_extremes(normal(N * I, 0.0f, 3.0f)));
      const Operand up(dtype, {N, I}, normal(N * I));
      Operand out(dtype, {N, I}, normal(N * I));
      cpu_.swiglu_forward(out.cpu(), gate.cpu(), up.cpu());
      cuda::swiglu_forward(out.gpu(), gate.gpu(), up.gpu(), nullptr);
      expect_close(out.download(), out.host(), data_tolerance(dtype), label("swiglu_forward", dtype, {N, I}));
    }
  }
}

// gate|up as one GEMM writes them: each row of [N, 2I] holds gate's row, then up's.
TEST_F(GpuPointwise, SwigluOnStackedGateUpMatchesCpu) {
  for (DType dtype : kDataTypes) {
    for (const auto& [N, I] : kFlatShapes) {
      const Operand gate_up(dtype, {N, 2 * I}, with_extremes(normal(N * 2 * I, 0.0f, 3.0f)));
      Operand out(dtype, {N, I}, normal(N * I));
      cpu_.swiglu_forward(out.cpu(), gate_up.cpu());
      cuda::swiglu_forward(out.gpu(), gate_up.gpu(), nullptr);
      expect_close(out.download(), out.host(), data_tolerance(dtype), label("swiglu_forward stacked", dtype, {N, I}));
    }
  }
}

// dgate and dup start as NaN: the op overwrites them without reading.
TEST_F(GpuPointwise, SwigluBackwardOverwritesLikeCpu) {
  for (DType dtype : kDataTypes) {
    for (const auto& [N, I] : kFlatShapes) {
      const Operand gate(dtype, {N, I}, with_extremes(normal(N * I, 0.0f, 3.0f)));
      const Operand up(dtype, {N, I}, normal(N * I));
      const Operand dout(dtype, {N, I}, normal(N * I));
      Operand dgate(dtype, {N, I}, nans(N * I)), dup(dtype, {N, I}, nans(N * I));
      cpu_.swiglu_backward(dgate.cpu(), dup.cpu(), dout.cpu(), gate.cpu(), up.cpu());
      cuda::swiglu_backward(dgate.gpu(), dup.gpu(), dout.gpu(), gate.gpu(), up.gpu(), nullptr);
      const std::string what = label("swiglu_backward", dtype, {N, I});
      expect_close(dgate.download(), dgate.host(), data_tolerance(dtype), what + " dgate");
      expect_close(dup.download(), dup.host(), data_tolerance(dtype), what + " dup");
    }
  }
}

TEST_F(GpuPointwise, SwigluRefusesBadArguments) {
  const Tensor a = device_view(DType::BF16, {4, 96});
  expect_refused([&] { cuda::swiglu_forward(a, a, device_view(DType::BF16, {4, 95}), nullptr); },
                 "cuda::swiglu_forward", "'up'");
  expect_refused([&] { cuda::swiglu_forward(device_view(DType::F32, {4, 96}), a, a, nullptr); },
                 "cuda::swiglu_forward", "'out'");
  expect_refused([&] { cuda::swiglu_backward(a, device_view(DType::F32, {4, 96}), a, a, a, nullptr); },
                 "cuda::swiglu_backward", "'dup'");
  expect_refused([&] { cuda::swiglu_forward(a, device_view(DType::BF16, {4, 95}), nullptr); },
                 "cuda::swiglu_forward", "'gate_up'");
  expect_refused([&] { cuda::swiglu_forward(a, device_view(DType::BF16, {4, 96}), nullptr); },
                 "cuda::swiglu_forward", "'out'");
}

TEST_F(GpuPointwise, ZeroAndCopyCoverWholeTensors) {
  for (DType dtype : kDataTypes) {
    const Operand src(dtype, {3, 1001}, normal(3 * 1001));
    Operand dst(dtype, {3, 1001}, normal(3 * 1001));
    cuda::copy(dst.gpu(), src.gpu(), nullptr);
    expect_close(dst.download(), src.host(), kExact, label("copy", dtype, {3, 1001}));
    cuda::zero(dst.gpu(), nullptr);
    expect_close(dst.download(), std::vector<float>(3 * 1001, 0.0f), kExact, label("zero", dtype, {3, 1001}));
  }
}

TEST_F(GpuPointwise, ElementwiseRefusesBadArguments) {
  const Tensor a = device_view(DType::BF16, {4, 96});
  expect_refused([&] { cuda::copy(a, device_view(DType::BF16, {4, 95}), nullptr); }, "cuda::copy", "cannot copy");
  expect_refused([&] { cuda::copy(a, device_view(DType::F16, {4, 96}), nullptr); }, "cuda::copy", "cannot copy");
  std::vector<float> host(16);
  expect_refused([&] { cuda::zero(Tensor::view(host.data(), DType::F32, Device::CPU, {16}), nullptr); }, "cuda::zero",
                 "'dst'");
}

// ---------------------------------------------------------------- FP8 codes with row scales

// Rows of FP8 codes [N, D] and a scale per row, in both backends, as the engine's FP8
// projections take their inputs (Ops::rmsnorm_forward and swiglu_forward write them).
class CodedRows {
 public:
  CodedRows(int64_t rows, int64_t columns)
      : codes_(rows * columns), scales_(rows), codes_on_gpu_(rows * columns), scales_on_gpu_(rows * 4) {
    cpu_ = {Tensor::view(codes_.data(), DType::F8_E4M3, Device::CPU, {rows, columns}),
            Tensor::view(scales_.data(), DType::F32, Device::CPU, {rows})};
    gpu_ = {Tensor::view(codes_on_gpu_.data, DType::F8_E4M3, Device::CUDA, {rows, columns}),
            Tensor::view(scales_on_gpu_.data, DType::F32, Device::CUDA, {rows})};
  }
  const ScaledRows& cpu() const { return cpu_; }
  const ScaledRows& gpu() const { return gpu_; }

  // The GPU's rows against the CPU's: the scales within the data's error; each decoded
  // value within it plus one code step (2^-3 of the element, where a rounding point lies
  // between the two) or the subnormal step (2^-9 of the scale).
  void expect_close_to_cpu(Tolerance tolerance, const std::string& what) const {
    std::vector<uint8_t> codes(codes_.size());
    std::vector<float> scales(scales_.size());
    check(cudaMemcpy(codes.data(), codes_on_gpu_.data, codes.size(), cudaMemcpyDeviceToHost), "download");
    check(cudaMemcpy(scales.data(), scales_on_gpu_.data, scales.size() * 4, cudaMemcpyDeviceToHost), "download");
    const int64_t columns = static_cast<int64_t>(codes_.size() / scales_.size());
    for (size_t row = 0; row < scales_.size(); ++row) {
      const float want_scale = scales_[row], got_scale = scales[row];
      ASSERT_NEAR(got_scale, want_scale, tolerance.rtol * want_scale + 1e-30) << what << " row " << row;
      for (int64_t d = 0; d < columns; ++d) {
        const size_t i = row * columns + d;
        const float want = e4m3_to_float(codes_[i]) * want_scale, got = e4m3_to_float(codes[i]) * got_scale;
        ASSERT_LE(std::abs(got - want), 0.125f * std::abs(want) + 0x1p-9f * want_scale + tolerance.rtol * 448 * want_scale)
            << what << " row " << row << " column " << d;
      }
    }
  }

 private:
  std::vector<uint8_t> codes_;
  std::vector<float> scales_;
  DeviceBuffer codes_on_gpu_, scales_on_gpu_;
  ScaledRows cpu_{Tensor{}}, gpu_{Tensor{}};
};

// The norms before the FP8 projections: rmsnorm into codes, and the residual add of a
// scaled branch (down_proj's FP8 output) into codes or into the dtype.
TEST_F(GpuPointwise, NormsWriteFp8CodesAndAddScaledBranchesLikeCpu) {
  for (DType dtype : kDataTypes) {
    for (const auto& [N, D] : kRmsnormShapes) {
      const std::string what = label("rmsnorm into FP8 codes", dtype, {N, D});
      const Operand x(dtype, {N, D}, normal(N * D, 0.0f, 2.0f));
      const Operand weight(dtype, {D}, normal(D, 1.0f, 0.1f));
      Operand rstd(DType::F32, {N}, normal(N));
      CodedRows codes(N, D);
      cpu_.rmsnorm_forward(codes.cpu(), rstd.cpu(), x.cpu(), weight.cpu(), 1e-6f);
      cuda::rmsnorm_forward(codes.gpu(), rstd.gpu(), x.gpu(), weight.gpu(), 1e-6f, nullptr);
      codes.expect_close_to_cpu(data_tolerance(dtype), what);
      expect_close(rstd.download(), rstd.host(), kF32Sums, what + " rstd");

      for (const bool coded : {true, false}) {
        const std::string added = label(coded ? "add_rmsnorm of a scaled branch into FP8 codes"
                                              : "add_rmsnorm of a scaled branch",
                                        dtype, {N, D});
        Operand hidden(dtype, {N, D}, normal(N * D, 0.0f, 2.0f));
        const Operand branch(dtype, {N, D}, normal(N * D, 0.0f, 0.1f));
        const Operand scales(DType::F32, {N}, row_scales(normal(N, 0.0f, 3.0f)));
        Operand out(dtype, {N, D}, normal(N * D));
        CodedRows out_codes(N, D);
        const auto out_on = [&](Device device) -> ScaledRows {
          if (coded) return device == Device::CPU ? out_codes.cpu() : out_codes.gpu();
          return device == Device::CPU ? out.cpu() : out.gpu();
        };
        cpu_.add_rmsnorm_forward(out_on(Device::CPU), rstd.cpu(), hidden.cpu(), {branch.cpu(), scales.cpu()},
                                 weight.cpu(), 1e-6f);
        cuda::add_rmsnorm_forward(out_on(Device::CUDA), rstd.gpu(), hidden.gpu(), {branch.gpu(), scales.gpu()},
                                  weight.gpu(), 1e-6f, nullptr);
        expect_close(hidden.download(), hidden.host(), data_tolerance(dtype), added + " hidden");
        // The norm of the sum as the GPU stored it, so that out measures the norm's error.
        hidden.adopt_device_values();
        cpu_.rmsnorm_forward(out_on(Device::CPU), rstd.cpu(), hidden.cpu(), weight.cpu(), 1e-6f);
        if (coded) out_codes.expect_close_to_cpu(data_tolerance(dtype), added);
        else expect_close(out.download(), out.host(), data_tolerance(dtype), added + " out");
      }
    }
  }
}

// SwiGLU between the FP8 gate|up and down projections: gate|up with row scales, into FP8
// codes (down's input) or into the dtype.
TEST_F(GpuPointwise, SwigluOfScaledRowsWritesFp8CodesLikeCpu) {
  for (DType dtype : kDataTypes) {
    for (const auto& [N, I] : kFlatShapes) {
      const Operand gate_up(dtype, {N, 2 * I}, with_extremes(normal(N * 2 * I, 0.0f, 0.3f)));
      const Operand scales(DType::F32, {N}, row_scales(normal(N, 0.0f, 2.0f)));
      CodedRows codes(N, I);
      cpu_.swiglu_forward(codes.cpu(), {gate_up.cpu(), scales.cpu()});
      cuda::swiglu_forward(codes.gpu(), {gate_up.gpu(), scales.gpu()}, nullptr);
      codes.expect_close_to_cpu(data_tolerance(dtype), label("swiglu of scaled rows into FP8 codes", dtype, {N, I}));
      Operand out(dtype, {N, I}, normal(N * I));
      cpu_.swiglu_forward(out.cpu(), {gate_up.cpu(), scales.cpu()});
      cuda::swiglu_forward(out.gpu(), {gate_up.gpu(), scales.gpu()}, nullptr);
      expect_close(out.download(), out.host(), data_tolerance(dtype), label("swiglu of scaled rows", dtype, {N, I}));
    }
  }
}

}  // namespace
#endif  // TANDEM_HAVE_CUDA
