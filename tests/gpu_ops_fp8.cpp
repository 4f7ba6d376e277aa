// The engine's FP8 projections on the GPU (Ops::quantize_fp8 and Ops::fp8_matmul_forward:
// kernels/quantize.cu, cuBLASLt's FP8 GEMM in kernels/matmul.cu) against CpuOps, on fresh
// random inputs each run (the seed is printed with every failure):
//   quantize_fp8        exact: the same largest magnitude, the same FP32 product per
//                       element and the same rounding (nearest even, saturating at 448)
//   fp8_matmul_forward  |gpu - cpu| <= 1e-2 · (|cpu| + rms(cpu)), F32 and BF16 out: E4M3
//                       products are exact in FP32, but Hopper's FP8 tensor cores add
//                       them with fewer mantissa bits than FP32 (about 14, as DeepSeek-V3
//                       measured on the H800) before cuBLASLt promotes the sums (F32 out
//                       failed 1e-5 for most elements of a 3072-long sum; BF16 out passed
//                       1e-2 with its rounding on top)
#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gpu_support.h"
#include "model/cpu_ops.h"
#include "model/cuda_ops.h"
#include "tensor/bf16.h"
#include "tensor/fp8.h"

using namespace tandem;
using tandem::testing::check;
using tandem::testing::DeviceBuffer;

namespace {

class GpuFp8 : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_GPU();
    gpu_.emplace();
    seed_trace_.emplace(__FILE__, __LINE__, "random seed " + std::to_string(seed_));
  }
  void TearDown() override { seed_trace_.reset(); }

  std::vector<float> normal(int64_t n, float stddev) {
    std::normal_distribution<float> distribution(0.0f, stddev);
    std::vector<float> values(n);
    for (float& v : values) v = distribution(rng_);
    return values;
  }

  // Bytes on the device, and back.
  template <class T>
  std::unique_ptr<DeviceBuffer> upload(const std::vector<T>& values) {
    auto buffer = std::make_unique<DeviceBuffer>(values.size() * sizeof(T));
    check(cudaMemcpy(buffer->data, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    return buffer;
  }
  template <class T>
  std::vector<T> download(const DeviceBuffer& buffer, size_t count) {
    gpu_->synchronize();
    std::vector<T> values(count);
    check(cudaMemcpy(values.data(), buffer.data, count * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return values;
  }

  CpuOps cpu_;
  std::optional<CudaOps> gpu_;

 private:
  const unsigned seed_ = std::random_device{}();
  std::mt19937 rng_{seed_};
  std::optional<::testing::ScopedTrace> seed_trace_;
};

std::vector<uint16_t> to_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]);
  return bits;
}

// A weight matrix's shapes: one tail element past the packs, a few blocks' worth, and
// more elements than the blocks take in one stride.
struct MatrixShape {
  int64_t rows, columns;
};
constexpr MatrixShape kQuantizeShapes[] = {{1, 7}, {33, 1001}, {4096, 1024}};

TEST_F(GpuFp8, QuantizeGivesTheCpusCodesAndScale) {
  for (const DType dtype : {DType::F32, DType::BF16}) {
    for (const auto& [R, C] : kQuantizeShapes) {
      const std::string what = std::string("quantize_fp8 ") + dtype_name(dtype) + " [" + std::to_string(R) + "," +
                               std::to_string(C) + "]";
      std::vector<float> values = normal(R * C, 0.05f);
      values[R * C / 2] = -0.9f;  // the largest magnitude, negative and inside
      if (dtype == DType::BF16)
        for (float& v : values) v = bf16_to_float(float_to_bf16(v));
      const auto x = dtype == DType::BF16 ? upload(to_bf16(values)) : upload(values);
      const DeviceBuffer codes(R * C), scale(sizeof(float));
      gpu_->quantize_fp8(Tensor::view(codes.data, DType::F8_E4M3, Device::CUDA, {R, C}),
                         Tensor::view(scale.data, DType::F32, Device::CUDA, {1}),
                         Tensor::view(x->data, dtype, Device::CUDA, {R, C}));
      std::vector<uint8_t> want_codes(R * C);
      float want_scale = 0;
      cpu_.quantize_fp8(Tensor::view(want_codes.data(), DType::F8_E4M3, Device::CPU, {R, C}),
                        Tensor::view(&want_scale, DType::F32, Device::CPU, {1}),
                        Tensor::view(values.data(), DType::F32, Device::CPU, {R, C}));
      EXPECT_EQ(download<float>(scale, 1)[0], want_scale) << what;
      EXPECT_EQ(want_scale, std::abs(values[R * C / 2]) / 448) << what;
      const std::vector<uint8_t> got = download<uint8_t>(codes, R * C);
      int64_t differ = 0;
      for (int64_t i = 0; i < R * C; ++i) differ += got[i] != want_codes[i];
      EXPECT_EQ(differ, 0) << what << ": codes that differ";
    }
  }
}

TEST_F(GpuFp8, QuantizeOfZerosIsZero) {
  const DeviceBuffer x(64 * 4), codes(64), scale(sizeof(float));
  gpu_->quantize_fp8(Tensor::view(codes.data, DType::F8_E4M3, Device::CUDA, {4, 16}),
                     Tensor::view(scale.data, DType::F32, Device::CUDA, {1}),
                     Tensor::view(x.data, DType::F32, Device::CUDA, {4, 16}));
  EXPECT_EQ(download<float>(scale, 1)[0], 0.0f);
  for (const uint8_t code : download<uint8_t>(codes, 64)) EXPECT_EQ(code, 0);
}

struct ProductShape {
  int64_t tokens, in, out;
};
// A decode step's projections at the Qwen3-0.6B shape (q|k|v, down), a single token, and
// small odd token counts.
constexpr ProductShape kProductShapes[] = {{256, 1024, 4096}, {37, 3072, 1024}, {1, 16, 16}, {5, 48, 32}};

TEST_F(GpuFp8, MatmulOfCodesMatchesCpu) {
  for (const DType out_dtype : {DType::F32, DType::BF16}) {
    for (const auto& [N, I, O] : kProductShapes) {
      const std::string what = std::string("fp8_matmul_forward into ") + dtype_name(out_dtype) + " [" +
                               std::to_string(N) + "," + std::to_string(I) + "," + std::to_string(O) + "]";
      std::vector<uint8_t> x_codes(N * I), weight_codes(O * I);
      for (auto* codes : {&x_codes, &weight_codes}) {
        const std::vector<float> values = normal(static_cast<int64_t>(codes->size()), 100.0f);
        for (size_t i = 0; i < codes->size(); ++i) (*codes)[i] = float_to_e4m3(values[i]);
      }
      const float weight_scale = 3e-4f;
      const auto x = upload(x_codes), weight = upload(weight_codes), scale = upload(std::vector<float>{weight_scale});
      const DeviceBuffer out(N * O * 4);
      gpu_->fp8_matmul_forward(Tensor::view(out.data, out_dtype, Device::CUDA, {N, O}),
                               Tensor::view(x->data, DType::F8_E4M3, Device::CUDA, {N, I}),
                               Tensor::view(weight->data, DType::F8_E4M3, Device::CUDA, {O, I}),
                               Tensor::view(scale->data, DType::F32, Device::CUDA, {1}));
      std::vector<float> want(N * O);
      float cpu_scale = weight_scale;
      cpu_.fp8_matmul_forward(Tensor::view(want.data(), DType::F32, Device::CPU, {N, O}),
                              Tensor::view(x_codes.data(), DType::F8_E4M3, Device::CPU, {N, I}),
                              Tensor::view(weight_codes.data(), DType::F8_E4M3, Device::CPU, {O, I}),
                              Tensor::view(&cpu_scale, DType::F32, Device::CPU, {1}));
      std::vector<float> got(N * O);
      if (out_dtype == DType::F32) {
        got = download<float>(out, N * O);
      } else {
        const std::vector<uint16_t> bits = download<uint16_t>(out, N * O);
        for (size_t i = 0; i < bits.size(); ++i) got[i] = bf16_to_float(bits[i]);
      }
      double square_sum = 0;
      for (const float w : want) square_sum += static_cast<double>(w) * w;
      const double rms = std::sqrt(square_sum / static_cast<double>(want.size()));
      constexpr double tolerance = 1e-2;
      int64_t bad = 0;
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const double error = std::abs(got[i] - want[i]) / (std::abs(want[i]) + rms);
        worst = std::max(worst, error);
        bad += !(error <= tolerance);
      }
      std::printf("%s: largest error %.3g of (|cpu| + rms)\n", what.c_str(), worst);
      EXPECT_EQ(bad, 0) << what << ": elements off (rms " << rms << ")";
      EXPECT_GT(rms, 0.0) << what;
    }
  }
}

TEST_F(GpuFp8, MatmulRefusesWidthsOutsideSixteens) {
  const DeviceBuffer buffer(64 * 64 * 4);
  const auto view = [&](DType dtype, std::vector<int64_t> shape) {
    return Tensor::view(buffer.data, dtype, Device::CUDA, std::move(shape));
  };
  try {
    gpu_->fp8_matmul_forward(view(DType::F32, {4, 16}), view(DType::F8_E4M3, {4, 24}),
                             view(DType::F8_E4M3, {16, 24}), view(DType::F32, {1}));
    ADD_FAILURE() << "an inner width of 24 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 16"), std::string::npos) << e.what();
  }
}

}  // namespace
#endif
