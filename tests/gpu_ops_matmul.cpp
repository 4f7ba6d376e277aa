// The CUDA matmul family (kernels/matmul.cu) against CpuOps, on fresh random inputs each
// run: F32 data (tight, which also proves TF32 is off) and BF16 data (FP32 accumulation,
// one rounding of each data output), odd shapes, gradients accumulated into nonzero
// buffers and each one selectively left out, and the argument checks.
#ifdef TANDEM_HAVE_CUDA
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "matmul.cuh"
#include "model/cpu_ops.h"
#include "support.h"
#include "tensor/bf16.h"
#include "tensor/device_copy.h"

using namespace tandem;

namespace {

// Per element: |gpu - ref| <= tolerance · (|ref| + rms(ref)). The rms term keeps entries
// that cancel to near zero from demanding more precision than their sum ever had.
constexpr double kF32Tolerance = 1e-4;             // F32 data: FP32 products, no TF32 (which errs ~1e-3)
constexpr double kBf16Tolerance = 1e-2;            // BF16 out/dx: one rounding (2^-9) plus summation order
constexpr double kBf16GradientTolerance = 1e-3;    // F32 dweight/dbias from BF16 inputs

double worst_scaled_error(const std::vector<float>& got, const std::vector<float>& ref) {
  if (got.size() != ref.size()) return INFINITY;
  double sum_squares = 0;
  for (float r : ref) sum_squares += static_cast<double>(r) * r;
  const double rms = ref.empty() ? 0.0 : std::sqrt(sum_squares / static_cast<double>(ref.size()));
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double error = std::abs(static_cast<double>(got[i]) - ref[i]) / (std::abs(ref[i]) + rms + 1e-30);
    if (!(error <= worst)) worst = error;  // a NaN becomes the worst
  }
  return worst;
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// A cudaMalloc'd tensor of one dtype, written and read as floats.
class DeviceTensor {
 public:
  DeviceTensor(DType dtype, std::vector<int64_t> shape) {
    tensor_ = Tensor::view(nullptr, dtype, Device::CUDA, std::move(shape));
    check_cuda(cudaMalloc(&tensor_.data, std::max<size_t>(tensor_.nbytes(), 1)), "cudaMalloc");
  }
  DeviceTensor(DType dtype, std::vector<int64_t> shape, const std::vector<float>& values)
      : DeviceTensor(dtype, std::move(shape)) {
    write(values);
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() { cudaFree(tensor_.data); }

  const Tensor& tensor() const { return tensor_; }

  void write(const std::vector<float>& values) const {
    if (tensor_.dtype == DType::F32) return copy_host_to_tensor(tensor_, values.data());
    std::vector<uint16_t> bits(values.size());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]);
    copy_host_to_tensor(tensor_, bits.data());
  }

  std::vector<float> read() const {
    check_cuda(cudaDeviceSynchronize(), "kernels before read");
    std::vector<float> values(static_cast<size_t>(tensor_.numel()));
    if (tensor_.dtype == DType::F32) {
      copy_tensor_to_host(values.data(), tensor_);
      return values;
    }
    std::vector<uint16_t> bits(values.size());
    copy_tensor_to_host(bits.data(), tensor_);
    for (size_t i = 0; i < values.size(); ++i) values[i] = bf16_to_float(bits[i]);
    return values;
  }

 private:
  Tensor tensor_;
};

// Normal(0,1) samples representable in `dtype`, so the CPU sees exactly what the GPU sees.
std::vector<float> random_values(std::mt19937& rng, DType dtype, int64_t count) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = dtype == DType::BF16 ? bf16_to_float(float_to_bf16(normal(rng))) : normal(rng);
  return values;
}

Tensor host_view(std::vector<float>& values, std::vector<int64_t> shape) {
  return Tensor::view(values.data(), DType::F32, Device::CPU, std::move(shape));
}

struct Shape {
  int64_t N, I, O;
};

// Odd row counts (1, 7, 129, 1000), extents off the multiples of 8 and up to 1024+8.
struct ForwardCase {
  Shape shape;
  bool bias;
};
const ForwardCase kForwardCases[] = {
    {{1, 1024, 1032}, true}, {{7, 33, 17}, false},    {{129, 1032, 136}, true},
    {{1000, 1024, 1032}, false}, {{1000, 8, 1032}, true}, {{129, 72, 1032}, false},
};

struct BackwardCase {
  Shape shape;
  bool dx, dweight, dbias;  // which gradients are wanted; the others are passed empty
};
const BackwardCase kBackwardCases[] = {
    {{1, 1024, 1032}, true, true, true},    {{7, 33, 17}, true, false, false},
    {{129, 1032, 136}, false, true, true},  {{1000, 1024, 1032}, true, true, false},
    {{1000, 8, 1032}, false, false, true},  {{129, 72, 1032}, false, true, false},
    {{7, 1032, 1024}, true, true, true},
};

std::string describe(const Shape& s, DType dtype) {
  return std::string(dtype_name(dtype)) + " N=" + std::to_string(s.N) + " I=" + std::to_string(s.I) +
         " O=" + std::to_string(s.O);
}

class GpuMatmul : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
    context_ = cuda::make_matmul_context(nullptr);
  }
  void TearDown() override {
    if (context_.plans) cuda::destroy_matmul_context(context_);
  }

  void check_forward(DType dtype, const ForwardCase& c, std::mt19937& rng, double tolerance) {
    const auto [N, I, O] = c.shape;
    SCOPED_TRACE(describe(c.shape, dtype) + (c.bias ? " with bias" : ""));
    std::vector<float> x = random_values(rng, dtype, N * I), weight = random_values(rng, dtype, O * I),
                       bias = random_values(rng, dtype, O), out(static_cast<size_t>(N * O));
    const DeviceTensor x_d(dtype, {N, I}, x), weight_d(dtype, {O, I}, weight), bias_d(dtype, {O}, bias),
        out_d(dtype, {N, O});
    cuda::matmul_forward(context_, out_d.tensor(), x_d.tensor(), weight_d.tensor(),
                         c.bias ? bias_d.tensor() : Tensor{});
    cpu_.matmul_forward(host_view(out, {N, O}), host_view(x, {N, I}), host_view(weight, {O, I}),
                        c.bias ? host_view(bias, {O}) : Tensor{});
    EXPECT_LE(worst_scaled_error(out_d.read(), out), tolerance) << "out";
  }

  // `calls` backward calls on the same inputs into gradients that start nonzero. With
  // dx_write = overwrite the GPU's dx starts as NaN (a read of it would show) and the CPU's
  // as random values.
  void check_backward(DType dtype, const BackwardCase& c, std::mt19937& rng, double data_tolerance,
                      double gradient_tolerance, int calls, GradWrite dx_write) {
    const auto [N, I, O] = c.shape;
    const bool overwrite = dx_write == GradWrite::overwrite;
    SCOPED_TRACE(describe(c.shape, dtype) + " wanted:" + (c.dx ? " dx" : "") + (c.dweight ? " dweight" : "") +
                 (c.dbias ? " dbias" : "") + ", calls " + std::to_string(calls) +
                 (overwrite ? ", dx overwritten" : ", dx accumulated"));
    std::vector<float> x = random_values(rng, dtype, N * I), weight = random_values(rng, dtype, O * I),
                       dout = random_values(rng, dtype, N * O), dx = random_values(rng, dtype, N * I),
                       dweight = random_values(rng, DType::F32, O * I), dbias = random_values(rng, DType::F32, O);
    const DeviceTensor x_d(dtype, {N, I}, x), weight_d(dtype, {O, I}, weight), dout_d(dtype, {N, O}, dout),
        dx_d(dtype, {N, I}, overwrite ? std::vector<float>(dx.size(), std::nanf("")) : dx), dweight_d(DType::F32, {O, I}, dweight), dbias_d(DType::F32, {O}, dbias);
    for (int call = 0; call < calls; ++call) {
      cuda::matmul_backward(context_, c.dx ? dx_d.tensor() : Tensor{}, c.dweight ? dweight_d.tensor() : Tensor{},
                            c.dbias ? dbias_d.tensor() : Tensor{}, dout_d.tensor(), x_d.tensor(), weight_d.tensor(),
                            dx_write);
      cpu_.matmul_backward(host_view(dx, {N, I}), host_view(dweight, {O, I}), host_view(dbias, {O}),
                           host_view(dout, {N, O}), host_view(x, {N, I}), host_view(weight, {O, I}), dx_write);
    }
    if (c.dx) {
      EXPECT_LE(worst_scaled_error(dx_d.read(), dx), data_tolerance) << "dx";
    }
    if (c.dweight) {
      EXPECT_LE(worst_scaled_error(dweight_d.read(), dweight), gradient_tolerance) << "dweight";
    }
    if (c.dbias) {
      EXPECT_LE(worst_scaled_error(dbias_d.read(), dbias), gradient_tolerance) << "dbias";
    }
  }

  cuda::MatmulContext context_;
  CpuOps cpu_;
};

// A fresh seed per test, printed with any failure.
uint32_t fresh_seed() { return std::random_device{}(); }

TEST_F(GpuMatmul, ForwardF32MatchesCpu) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (const ForwardCase& c : kForwardCases) check_forward(DType::F32, c, rng, kF32Tolerance);
}

TEST_F(GpuMatmul, ForwardBf16MatchesCpu) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (const ForwardCase& c : kForwardCases) check_forward(DType::BF16, c, rng, kBf16Tolerance);
}

TEST_F(GpuMatmul, BackwardF32MatchesCpu) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (const BackwardCase& c : kBackwardCases)
    check_backward(DType::F32, c, rng, kF32Tolerance, kF32Tolerance, 1, GradWrite::accumulate);
}

TEST_F(GpuMatmul, BackwardBf16MatchesCpu) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (const BackwardCase& c : kBackwardCases)
    check_backward(DType::BF16, c, rng, kBf16Tolerance, kBf16GradientTolerance, 1, GradWrite::accumulate);
}

// Micro-batches: two calls add two products on top of what the buffers held.
TEST_F(GpuMatmul, BackwardAccumulatesOverCalls) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const BackwardCase c{{129, 1032, 136}, true, true, true};
  check_backward(DType::F32, c, rng, kF32Tolerance, kF32Tolerance, 2, GradWrite::accumulate);
  check_backward(DType::BF16, c, rng, kBf16Tolerance, kBf16GradientTolerance, 2, GradWrite::accumulate);
}

// The first writer of a shared input gradient: dx holds one product (never read, so the
// NaN it starts with is gone), while dweight and dbias still add up over the two calls.
TEST_F(GpuMatmul, BackwardOverwritesDxAndAccumulatesWeights) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (const BackwardCase& c : {BackwardCase{{129, 1032, 136}, true, true, true}, BackwardCase{{7, 33, 17}, true, false,
                                                                                                false}}) {
    check_backward(DType::F32, c, rng, kF32Tolerance, kF32Tolerance, 2, GradWrite::overwrite);
    check_backward(DType::BF16, c, rng, kBf16Tolerance, kBf16GradientTolerance, 2, GradWrite::overwrite);
  }
}

void expect_invalid(const std::function<void()>& call, const std::string& expected) {
  try {
    call();
    ADD_FAILURE() << "no error, expected one containing: " << expected;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

TEST_F(GpuMatmul, ArgumentChecksFire) {
  const int64_t N = 4, I = 8, O = 16;
  const DType bf16 = DType::BF16;
  const DeviceTensor x(bf16, {N + 1, I}), weight(bf16, {O, I}), out(bf16, {N, O}), dx(bf16, {N, I}),
      dweight(DType::F32, {O, I}), dbias(DType::F32, {O}), weight_f32(DType::F32, {O, I});
  const Tensor none;
  std::vector<float> host(N * I);

  const Tensor misaligned = Tensor::view(static_cast<char*>(x.tensor().data) + 2, bf16, Device::CUDA, {N, I});
  const Tensor x_on_host = Tensor::view(host.data(), bf16, Device::CPU, {N, I});
  const Tensor x_f16 = Tensor::view(x.tensor().data, DType::F16, Device::CUDA, {N, I});
  const Tensor x_rows = Tensor::view(x.tensor().data, bf16, Device::CUDA, {N, I});
  const Tensor wrong_out = Tensor::view(out.tensor().data, bf16, Device::CUDA, {N, O - 1});
  const Tensor dweight_bf16 = Tensor::view(dweight.tensor().data, bf16, Device::CUDA, {O, I});
  const Tensor short_dbias = Tensor::view(dbias.tensor().data, DType::F32, Device::CUDA, {O - 1});
  const Tensor dout = Tensor::view(out.tensor().data, bf16, Device::CUDA, {N, O});

  auto forward = [&](const Tensor& o, const Tensor& in, const Tensor& w, const Tensor& b) {
    return [&, o, in, w, b] { cuda::matmul_forward(context_, o, in, w, b); };
  };
  expect_invalid(forward(out.tensor(), x_rows, weight_f32.tensor(), none), "argument 'weight' must be BF16");
  expect_invalid(forward(out.tensor(), x_f16, weight.tensor(), none), "argument 'x' must be BF16 or F32");
  expect_invalid(forward(wrong_out, x_rows, weight.tensor(), none), "argument 'out' must have shape [4,16]");
  expect_invalid(forward(out.tensor(), x_on_host, weight.tensor(), none), "argument 'x' must be on cuda");
  expect_invalid(forward(out.tensor(), misaligned, weight.tensor(), none), "argument 'x' must be 16-byte aligned");
  expect_invalid(forward(out.tensor(), x_rows, weight.tensor(), short_dbias), "argument 'bias' must be BF16");

  auto backward = [&](const Tensor& gx, const Tensor& gw, const Tensor& gb, const Tensor& g) {
    return [&, gx, gw, gb, g] { cuda::matmul_backward(context_, gx, gw, gb, g, x_rows, weight.tensor(), GradWrite::accumulate); };
  };
  expect_invalid(backward(dx.tensor(), dweight_bf16, none, dout), "argument 'dweight' must be F32");
  expect_invalid(backward(none, none, short_dbias, dout), "argument 'dbias' must have shape [16]");
  expect_invalid(backward(dx.tensor(), none, none, none), "argument 'dout' is empty");
  expect_invalid(backward(misaligned, none, none, dout), "argument 'dx' must be 16-byte aligned");

  cuda::MatmulContext destroyed = cuda::make_matmul_context(nullptr);
  cuda::destroy_matmul_context(destroyed);
  expect_invalid([&] { cuda::matmul_forward(destroyed, out.tensor(), x_rows, weight.tensor(), none); },
                 "MatmulContext was not made by make_matmul_context");
}

}  // namespace

#endif  // TANDEM_HAVE_CUDA
