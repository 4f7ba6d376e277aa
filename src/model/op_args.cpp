#include "model/op_args.h"

#include <stdexcept>

namespace tandem {

void check_op_arg(const Tensor& t, const char* op, const char* arg, Device device, std::initializer_list<DType> dtypes,
                  std::initializer_list<int64_t> shape) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument(std::string(op) + ": argument '" + arg + "' " + why);
  };
  if (!t.data) fail("is empty");
  if (t.device != device) fail(std::string("must be on ") + device_name(device) + ", got " + t.describe());
  bool dtype_ok = false;
  std::string allowed;
  for (DType dtype : dtypes) {
    dtype_ok = dtype_ok || t.dtype == dtype;
    allowed += (allowed.empty() ? "" : " or ") + std::string(dtype_name(dtype));
  }
  if (!dtype_ok) fail("must be " + allowed + ", got " + t.describe());
  if (!t.is_contiguous()) fail("must be contiguous, got " + t.describe());
  bool match = t.rank() == static_cast<int>(shape.size());
  for (size_t i = 0; match && i < shape.size(); ++i)
    match = shape.begin()[i] == kAnyExtent || t.shape[i] == shape.begin()[i];
  if (!match) {
    std::string wanted = "[";
    for (size_t i = 0; i < shape.size(); ++i)
      wanted += (i ? "," : "") + (shape.begin()[i] == kAnyExtent ? std::string("*") : std::to_string(shape.begin()[i]));
    fail("must have shape " + wanted + "], got " + t.describe());
  }
}

void check_in_rows(const ScaledRows& in, const char* op, const char* arg, Device device,
                   std::initializer_list<DType> dtypes, int64_t N, int64_t D) {
  check_op_arg(in.values, op, arg, device, dtypes, {N, D});
  if (in.scales.data) check_op_arg(in.scales, op, (std::string(arg) + " scales").c_str(), device, {DType::F32}, {N});
}

void check_out_rows(const ScaledRows& out, const char* op, Device device, DType dtype, int64_t N, int64_t D) {
  check_op_arg(out.values, op, "out", device, {dtype, DType::F8_E4M3}, {N, D});
  if (out.values.dtype == DType::F8_E4M3)
    check_op_arg(out.scales, op, "out scales", device, {DType::F32}, {N});
  else if (out.scales.data)
    throw std::invalid_argument(std::string(op) + ": scales are written only with FP8 codes, not " +
                                out.values.describe());
}

}  // namespace tandem
