#include "tensor/finite.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "tensor/bf16.h"
#include "tensor/f16.h"

namespace tandem {

namespace {

// Exponent bits all set: an infinity or a NaN, in any IEEE-style format.
template <class Bits>
std::optional<int64_t> first_with_exponent(const Tensor& tensor, Bits exponent) {
  const Bits* bits = static_cast<const Bits*>(tensor.data);
  const int64_t n = tensor.numel();
  for (int64_t i = 0; i < n; ++i)
    if ((bits[i] & exponent) == exponent) return i;
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> first_non_finite(const Tensor& tensor) {
  if (tensor.device != Device::CPU || !tensor.is_contiguous())
    throw std::invalid_argument("first_non_finite: needs a contiguous CPU tensor, got " + tensor.describe());
  if (tensor.numel() == 0) return std::nullopt;
  switch (tensor.dtype) {
    case DType::F64: return first_with_exponent<uint64_t>(tensor, 0x7ff0000000000000ull);
    case DType::F32: return first_with_exponent<uint32_t>(tensor, 0x7f800000u);
    case DType::F16: return first_with_exponent<uint16_t>(tensor, 0x7c00u);
    case DType::BF16: return first_with_exponent<uint16_t>(tensor, 0x7f80u);
    default: return std::nullopt;
  }
}

std::string describe_non_finite(const Tensor& tensor) {
  const std::optional<int64_t> index = first_non_finite(tensor);
  if (!index) return "";
  double value = 0;
  switch (tensor.dtype) {
    case DType::F64: value = tensor.ptr<double>()[*index]; break;
    case DType::F32: value = tensor.ptr<float>()[*index]; break;
    case DType::F16: value = f16_to_float(tensor.ptr<uint16_t>()[*index]); break;
    default: value = bf16_to_float(tensor.ptr<uint16_t>()[*index]); break;
  }
  return "element " + std::to_string(*index) + " of " + shape_string(tensor.shape) + " is " +
         (std::isnan(value) ? "NaN" : value > 0 ? "+Inf" : "-Inf");
}

}  // namespace tandem
