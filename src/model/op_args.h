// Argument checks shared by the op backends: every op checks each argument once per call
// (device, dtype, contiguity, shape) and says which op and which argument is wrong
// before any memory is touched.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>

#include "tensor/tensor.h"

namespace tandem {

inline constexpr int64_t kAnyExtent = -1;

// Throws std::invalid_argument("<op>: argument '<arg>' ...") unless `t` is non-empty,
// contiguous, on `device`, of one of `dtypes`, and of `shape` (kAnyExtent matches any).
void check_op_arg(const Tensor& t, const char* op, const char* arg, Device device, std::initializer_list<DType> dtypes,
                  std::initializer_list<int64_t> shape);

}  // namespace tandem
