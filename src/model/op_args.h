// Argument checks shared by the op backends: every op checks each argument once per call
// (device, dtype, contiguity, shape) and says which op and which argument is wrong
// before any memory is touched.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>

#include "model/ops.h"  // ScaledRows
#include "tensor/tensor.h"

namespace tandem {

inline constexpr int64_t kAnyExtent = -1;

// Throws std::invalid_argument("<op>: argument '<arg>' ...") unless `t` is non-empty,
// contiguous, on `device`, of one of `dtypes`, and of `shape` (kAnyExtent matches any).
void check_op_arg(const Tensor& t, const char* op, const char* arg, Device device, std::initializer_list<DType> dtypes,
                  std::initializer_list<int64_t> shape);

// The rows an op reads, `arg` [N, D] of one of `dtypes`, with or without a scale per row
// (F32 [N], checked as "<arg> scales").
void check_in_rows(const ScaledRows& in, const char* op, const char* arg, Device device,
                   std::initializer_list<DType> dtypes, int64_t N, int64_t D);
// The rows an op writes, "out" [N, D]: of `dtype` without scales, or FP8 E4M3 codes with a
// scale per row (F32 [N]).
void check_out_rows(const ScaledRows& out, const char* op, Device device, DType dtype, int64_t N, int64_t D);

}  // namespace tandem
