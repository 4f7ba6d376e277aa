#include <gtest/gtest.h>

#include <set>
#include <stdexcept>

#include "tensor/dtype.h"
#include "tensor/bf16.h"
#include "tensor/tensor.h"

#include <cmath>
#include <limits>

using namespace tandem;

TEST(DType, TableCoversEveryTypeWithSafetensorsCodes) {
  const std::pair<const char*, size_t> expected[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2},  {"U8", 1},      {"BOOL", 1}};
  std::set<std::string> names;
  for (const auto& [code, size] : expected) {
    const DType dtype = dtype_from_safetensors(code);
    EXPECT_EQ(dtype_size(dtype), size) << code;
    EXPECT_STREQ(dtype_info(dtype).safetensors_code, code);
    EXPECT_EQ(dtype_from_name(dtype_name(dtype)), dtype);
    names.insert(dtype_name(dtype));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kDTypeCount));
}

TEST(DType, UnlistedTypesAreRefusedByName) {
  for (const char* code : {"C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "bf16", "", "F4"}) {
    try {
      dtype_from_safetensors(code);
      FAIL() << "accepted " << code;
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find(std::string("'") + code + "'"), std::string::npos) << error.what();
    }
  }
  EXPECT_THROW(dtype_info(static_cast<DType>(99)), std::invalid_argument);
}

TEST(Tensor, ViewIsContiguousRowMajor) {
  float storage[24];
  Tensor t = Tensor::view(storage, DType::F32, Device::CPU, {2, 3, 4});
  EXPECT_EQ(t.strides, (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  t.strides = {1, 2, 6};
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(Tensor::view(storage, DType::BF16, Device::CUDA, {28, 1024}).describe(), "BF16[28,1024] cuda");
}

TEST(Bf16, RoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);  // exactly half way, even stays
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);  // half way above an odd: rounds up to even
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  for (float x : {0.0f, 3.140625f, -0.5f, 65280.0f}) EXPECT_EQ(bf16_to_float(float_to_bf16(x)), x);
}
