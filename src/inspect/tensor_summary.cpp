#include "inspect/tensor_summary.h"

#include <cmath>
#include <cstring>

#include "io/checksum.h"
#include "tensor/bf16.h"
#include "tensor/f16.h"

namespace tandem {
namespace {

template <class T>
T load(const unsigned char* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

// Element `i` as a double. F8 counts as its raw byte: checkpoints hold no F8 tensors, and a
// norm of the bits still tells two copies apart.
double element(const unsigned char* data, DType dtype, size_t i) {
  const unsigned char* at = data + i * dtype_size(dtype);
  switch (dtype) {
    case DType::F64: return load<double>(at);
    case DType::F32: return load<float>(at);
    case DType::F16: return f16_to_float(load<uint16_t>(at));
    case DType::BF16: return bf16_to_float(load<uint16_t>(at));
    case DType::I64: return static_cast<double>(load<int64_t>(at));
    case DType::I32: return load<int32_t>(at);
    case DType::I16: return load<int16_t>(at);
    case DType::I8: return load<int8_t>(at);
    case DType::U64: return static_cast<double>(load<uint64_t>(at));
    case DType::U32: return load<uint32_t>(at);
    case DType::U16: return load<uint16_t>(at);
    case DType::U8:
    case DType::BOOL:
    case DType::F8_E4M3:
    case DType::F8_E5M2: return *at;
  }
  return 0;
}

}  // namespace

TensorSummary summarize_checkpoint_tensor(const Checkpoint& checkpoint, const hdf5::TensorInfo& info,
                                          std::vector<unsigned char>& buffer) {
  int64_t count = 1;
  for (int64_t extent : info.shape) count *= extent;
  TensorSummary summary;
  summary.bytes = static_cast<uint64_t>(count) * dtype_size(info.dtype);
  buffer.resize(summary.bytes);
  checkpoint.read_tensor(info.name, Tensor::view(buffer.data(), info.dtype, Device::CPU, info.shape));
  double sum_of_squares = 0;
  for (size_t i = 0; i < static_cast<size_t>(count); ++i) {
    const double value = element(buffer.data(), info.dtype, i);
    summary.finite &= std::isfinite(value);
    sum_of_squares += value * value;
  }
  summary.norm = std::sqrt(sum_of_squares);
  summary.xxh3 = xxh3_64(buffer.data(), buffer.size());
  return summary;
}

}  // namespace tandem
