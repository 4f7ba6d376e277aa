// The one table of element types used everywhere: safetensors headers, HDF5 files,
// the pool and the kernels all go through it, so an unlisted type is refused at the edge.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace tandem {

enum class DType {
  F64, F32, F16, BF16, F8_E4M3, F8_E5M2,
  I64, I32, I16, I8, U64, U32, U16, U8, BOOL,
};
inline constexpr int kDTypeCount = 15;

struct DTypeInfo {
  DType dtype;
  const char* name;              // tandem's name, also stored in HDF5 attributes
  size_t size;                   // bytes per element
  const char* safetensors_code;  // the "dtype" string in a safetensors header
  bool is_float;
};

const DTypeInfo& dtype_info(DType dtype);
inline size_t dtype_size(DType dtype) { return dtype_info(dtype).size; }
inline const char* dtype_name(DType dtype) { return dtype_info(dtype).name; }

// Both throw std::invalid_argument naming the unknown string.
DType dtype_from_safetensors(std::string_view code);
DType dtype_from_name(std::string_view name);

}  // namespace tandem
