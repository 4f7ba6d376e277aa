#include "tensor/dtype.h"

#include <stdexcept>

namespace tandem {

namespace {
constexpr DTypeInfo kTable[kDTypeCount] = {
    {DType::F64, "F64", 8, "F64", true},
    {DType::F32, "F32", 4, "F32", true},
    {DType::F16, "F16", 2, "F16", true},
    {DType::BF16, "BF16", 2, "BF16", true},
    {DType::F8_E4M3, "F8_E4M3", 1, "F8_E4M3", true},
    {DType::F8_E5M2, "F8_E5M2", 1, "F8_E5M2", true},
    {DType::I64, "I64", 8, "I64", false},
    {DType::I32, "I32", 4, "I32", false},
    {DType::I16, "I16", 2, "I16", false},
    {DType::I8, "I8", 1, "I8", false},
    {DType::U64, "U64", 8, "U64", false},
    {DType::U32, "U32", 4, "U32", false},
    {DType::U16, "U16", 2, "U16", false},
    {DType::U8, "U8", 1, "U8", false},
    {DType::BOOL, "BOOL", 1, "BOOL", false},
};
}  // namespace

const DTypeInfo& dtype_info(DType dtype) {
  const auto index = static_cast<int>(dtype);
  if (index < 0 || index >= kDTypeCount) throw std::invalid_argument("invalid DType value " + std::to_string(index));
  return kTable[index];
}

DType dtype_from_safetensors(std::string_view code) {
  for (const auto& info : kTable)
    if (code == info.safetensors_code) return info.dtype;
  throw std::invalid_argument("unsupported safetensors dtype '" + std::string(code) +
                              "' (tandem accepts F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U64 U32 U16 U8 BOOL)");
}

DType dtype_from_name(std::string_view name) {
  for (const auto& info : kTable)
    if (name == info.name) return info.dtype;
  throw std::invalid_argument("unknown dtype name '" + std::string(name) + "'");
}

}  // namespace tandem
