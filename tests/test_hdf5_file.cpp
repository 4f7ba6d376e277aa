#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/hdf5_file.h"
#include "support.h"

using namespace tandem;
using tandem::testing::run_command;
using tandem::testing::TempDir;

namespace {

// A tensor that owns its bytes, filled with random bits.
struct RandomTensor {
  std::vector<uint8_t> bytes;
  Tensor tensor;
  RandomTensor(DType dtype, std::vector<int64_t> shape, uint32_t seed) {
    tensor = Tensor::view(nullptr, dtype, Device::CPU, std::move(shape));
    bytes.resize(tensor.nbytes());
    std::mt19937 random(seed);
    for (auto& byte : bytes) byte = static_cast<uint8_t>(random());
    tensor.data = bytes.data();
  }
};

std::string message_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "(no exception)";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(Hdf5File, EveryDtypeRoundTripsBitExactly) {
  TempDir dir;
  const auto path = dir / "all.h5";
  std::vector<RandomTensor> written;
  {
    hdf5::File file = hdf5::File::create(path);
    {
      const hdf5::Group tensors = file.create_group("tensors");
      for (int index = 0; index < kDTypeCount; ++index) {
        const DType dtype = static_cast<DType>(index);
        written.emplace_back(dtype, std::vector<int64_t>{3, 5, 7}, 1000 + index);
        tensors.write_tensor(dtype_name(dtype), written.back().tensor);
      }
    }
    file.close();
  }
  const hdf5::File file = hdf5::File::open(path, hdf5::File::Access::ReadOnly);
  const hdf5::Group tensors = file.group("tensors");
  ASSERT_EQ(tensors.dataset_names().size(), static_cast<size_t>(kDTypeCount));
  for (int index = 0; index < kDTypeCount; ++index) {
    const DType dtype = static_cast<DType>(index);
    const hdf5::TensorInfo info = tensors.tensor_info(dtype_name(dtype));
    EXPECT_EQ(info.dtype, dtype);
    EXPECT_EQ(info.shape, (std::vector<int64_t>{3, 5, 7}));
    RandomTensor read_back(dtype, {3, 5, 7}, 0);
    tensors.read_tensor(dtype_name(dtype), read_back.tensor);
    EXPECT_EQ(read_back.bytes, written[index].bytes) << dtype_name(dtype);
  }
}

TEST(Hdf5File, ScalarAndEmptyTensorsRoundTrip) {
  TempDir dir;
  const auto path = dir / "edge.h5";
  RandomTensor scalar(DType::F64, {}, 1), empty(DType::BF16, {0, 4}, 2);
  {
    hdf5::File file = hdf5::File::create(path);
    file.write_tensor("scalar", scalar.tensor);
    file.write_tensor("empty", empty.tensor);
    file.close();
  }
  const hdf5::File file = hdf5::File::open(path, hdf5::File::Access::ReadOnly);
  EXPECT_TRUE(file.tensor_info("scalar").shape.empty());
  EXPECT_EQ(file.tensor_info("empty").shape, (std::vector<int64_t>{0, 4}));
  RandomTensor scalar_back(DType::F64, {}, 3), empty_back(DType::BF16, {0, 4}, 4);
  file.read_tensor("scalar", scalar_back.tensor);
  file.read_tensor("empty", empty_back.tensor);
  EXPECT_EQ(scalar_back.bytes, scalar.bytes);
}

TEST(Hdf5File, HalfIsStoredAsIeeeFloat16) {
  // h5py maps any 2-byte HDF5 float to numpy float16; the layout must be IEEE half too,
  // which HDF5's own conversion to float (and h5dump's printing) shows.
  const uint16_t bits[4] = {0x3C00, 0xC000, 0x3800, 0x7BFF};  // 1, -2, 0.5, 65504
  float converted[4];                                         // H5Tconvert works in place: packed halves in, floats out
  std::memcpy(converted, bits, sizeof bits);
  hdf5::Handle half = hdf5::file_type_of(DType::F16);
  ASSERT_GE(H5Tconvert(half.get(), H5T_NATIVE_FLOAT, 4, converted, nullptr, H5P_DEFAULT), 0);
  EXPECT_EQ(converted[0], 1.0f);
  EXPECT_EQ(converted[1], -2.0f);
  EXPECT_EQ(converted[2], 0.5f);
  EXPECT_EQ(converted[3], 65504.0f);

  TempDir dir;
  const auto path = dir / "half.h5";
  {
    hdf5::File file = hdf5::File::create(path);
    uint16_t data[3] = {0x3C00, 0xC000, 0x3800};
    file.write_tensor("half", Tensor::view(data, DType::F16, Device::CPU, {3}));
    file.close();
  }
  const auto dump = run_command("h5dump -d /half " + path.string());
  ASSERT_EQ(dump.exit_code, 0) << dump.output;
  EXPECT_TRUE(contains(dump.output, "1, -2, 0.5")) << dump.output;
}

TEST(Hdf5File, BoolIsTheEnumThatH5pyReadsAsBool) {
  TempDir dir;
  const auto path = dir / "bool.h5";
  {
    hdf5::File file = hdf5::File::create(path);
    uint8_t data[3] = {1, 0, 1};
    file.write_tensor("mask", Tensor::view(data, DType::BOOL, Device::CPU, {3}));
    file.close();
  }
  const auto dump = run_command("h5dump -d /mask " + path.string());
  ASSERT_EQ(dump.exit_code, 0) << dump.output;
  EXPECT_TRUE(contains(dump.output, "H5T_ENUM")) << dump.output;
  EXPECT_TRUE(contains(dump.output, "H5T_STD_I8LE")) << dump.output;
  EXPECT_TRUE(std::regex_search(dump.output, std::regex("\"FALSE\" +0;"))) << dump.output;
  EXPECT_TRUE(std::regex_search(dump.output, std::regex("\"TRUE\" +1;"))) << dump.output;
  EXPECT_TRUE(contains(dump.output, "TRUE, FALSE, TRUE")) << dump.output;
}

TEST(Hdf5File, MismatchedOrMissingTensorsAreNamedWithTheFile) {
  TempDir dir;
  const auto path = dir / "ckpt_00000010.h5";
  RandomTensor weight(DType::F32, {64, 64}, 7);
  {
    hdf5::File file = hdf5::File::create(path);
    file.create_group("tensors").write_tensor("layers.0.wq", weight.tensor);
    file.close();
  }
  const hdf5::File file = hdf5::File::open(path, hdf5::File::Access::ReadOnly);
  const hdf5::Group tensors = file.group("tensors");
  RandomTensor wrong_shape(DType::F32, {64, 128}, 0), wrong_dtype(DType::BF16, {64, 64}, 0);
  const std::string shape_message = message_of([&] { tensors.read_tensor("layers.0.wq", wrong_shape.tensor); });
  EXPECT_TRUE(
      contains(shape_message, "ckpt_00000010.h5: tensor 'layers.0.wq': shape [64,64] in file, expected [64,128]"))
      << shape_message;
  const std::string dtype_message = message_of([&] { tensors.read_tensor("layers.0.wq", wrong_dtype.tensor); });
  EXPECT_TRUE(contains(dtype_message, "ckpt_00000010.h5: tensor 'layers.0.wq': dtype F32 in file, expected BF16"))
      << dtype_message;
  const std::string missing_message = message_of([&] { tensors.read_tensor("layers.1.wq", weight.tensor); });
  EXPECT_TRUE(contains(missing_message, "ckpt_00000010.h5: tensor 'layers.1.wq' is missing")) << missing_message;
}

TEST(Hdf5File, TamperedDtypeOrShapeIsRefused) {
  TempDir dir;
  const auto path = dir / "tampered.h5";
  RandomTensor weight(DType::F32, {4, 4}, 7);
  {
    hdf5::File file = hdf5::File::create(path);
    file.write_tensor("w", weight.tensor);
    file.write_tensor("v", weight.tensor);
    file.close();
  }
  // What a hand edit with h5py could do: relabel the bits, or break the shape attribute.
  {
    hdf5::File file = hdf5::File::open(path, hdf5::File::Access::ReadWrite);
    hdf5::Handle w = hdf5::checked(H5Dopen2(file.id(), "w", H5P_DEFAULT), H5Dclose, "open w");
    hdf5::Handle text = hdf5::checked(H5Tcopy(H5T_C_S1), H5Tclose, "type");
    H5Tset_size(text.get(), H5T_VARIABLE);
    H5Adelete(w.get(), "dtype");
    hdf5::Handle space = hdf5::checked(H5Screate(H5S_SCALAR), H5Sclose, "space");
    hdf5::Handle attribute = hdf5::checked(
        H5Acreate2(w.get(), "dtype", text.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose, "attribute");
    const char* relabelled = "I32";
    H5Awrite(attribute.get(), text.get(), &relabelled);
    hdf5::Handle v = hdf5::checked(H5Dopen2(file.id(), "v", H5P_DEFAULT), H5Dclose, "open v");
    hdf5::Handle shape = hdf5::checked(H5Aopen(v.get(), "shape", H5P_DEFAULT), H5Aclose, "shape");
    const int64_t wrong[2] = {2, 8};
    H5Awrite(shape.get(), H5T_NATIVE_INT64, wrong);
  }
  const hdf5::File file = hdf5::File::open(path, hdf5::File::Access::ReadOnly);
  const std::string relabelled = message_of([&] { file.tensor_info("w"); });
  EXPECT_TRUE(contains(relabelled, "tensor 'w': stored as a 4-byte HDF5 type that does not hold I32 bits"))
      << relabelled;
  const std::string reshaped = message_of([&] { file.tensor_info("v"); });
  EXPECT_TRUE(contains(reshaped, "tensor 'v': shape attribute [2,8] disagrees with the dataset's extents [4,4]"))
      << reshaped;
}

TEST(Hdf5File, AttributesAndStringsRoundTrip) {
  TempDir dir;
  const auto path = dir / "text.h5";
  const std::string long_text(100000, 'x');  // past the 64 KiB limit of compact attributes
  {
    hdf5::File file = hdf5::File::create(path);
    file.set_attribute("name", "first");
    file.set_attribute("name", "second ü");
    file.set_attribute("count", int64_t{-42});
    file.write_string("deck", long_text);
    file.write_strings("devices", {"cuda:0", "", "cuda:1"});
    file.write_strings("nothing", {});
    file.close();
  }
  const hdf5::File file = hdf5::File::open(path, hdf5::File::Access::ReadOnly);
  EXPECT_EQ(file.string_attribute("name"), "second ü");
  EXPECT_EQ(file.int_attribute("count"), -42);
  EXPECT_EQ(file.read_string("deck"), long_text);
  EXPECT_EQ(file.read_strings("devices"), (std::vector<std::string>{"cuda:0", "", "cuda:1"}));
  EXPECT_TRUE(file.read_strings("nothing").empty());
  const std::string missing = message_of([&] { file.int_attribute("absent"); });
  EXPECT_TRUE(contains(missing, "text.h5: /: attribute 'absent' is missing")) << missing;
  const std::string wrong_kind = message_of([&] { file.int_attribute("name"); });
  EXPECT_TRUE(contains(wrong_kind, "attribute 'name' is not a single integer")) << wrong_kind;
}

TEST(Hdf5File, NestedNamesCreateGroupsAndBadNamesAreRefused) {
  TempDir dir;
  hdf5::File file = hdf5::File::create(dir / "nested.h5");
  RandomTensor small(DType::U8, {2}, 1);
  file.write_tensor("optim/m/layers.0.wq", small.tensor);
  file.write_tensor("optim/v/layers.0.wq", small.tensor);
  file.write_tensor("top", small.tensor);
  EXPECT_EQ(file.dataset_names(), (std::vector<std::string>{"optim/m/layers.0.wq", "optim/v/layers.0.wq", "top"}));
  EXPECT_TRUE(file.contains("optim/m"));
  EXPECT_FALSE(file.contains("optim/x/y"));
  EXPECT_EQ(file.group("optim").dataset_names(), (std::vector<std::string>{"m/layers.0.wq", "v/layers.0.wq"}));
  for (const char* bad : {"", "/abs", "a//b", "a/", ".", "a/./b"})
    EXPECT_THROW(file.write_tensor(bad, small.tensor), std::invalid_argument) << bad;
  EXPECT_THROW(file.write_tensor("top", small.tensor), std::runtime_error);  // exists already
}

TEST(Hdf5File, WritesOnlyContiguousHostTensors) {
  TempDir dir;
  hdf5::File file = hdf5::File::create(dir / "refuse.h5");
  RandomTensor matrix(DType::F32, {4, 4}, 1);
  Tensor transposed = matrix.tensor;
  transposed.strides = {1, 4};
  EXPECT_TRUE(contains(message_of([&] { file.write_tensor("t", transposed); }), "not contiguous"));
  Tensor on_gpu = matrix.tensor;
  on_gpu.device = Device::CUDA;
  EXPECT_TRUE(contains(message_of([&] { file.write_tensor("g", on_gpu); }), "needs host memory"));
}

TEST(Hdf5File, LibraryFailuresBecomeExceptionsWithoutStderrNoise) {
  TempDir dir;
  tandem::testing::write_text(dir / "not.h5", "plain text, not HDF5");
  ::testing::internal::CaptureStderr();
  const std::string missing = message_of([&] { hdf5::File::open(dir / "absent.h5", hdf5::File::Access::ReadOnly); });
  const std::string garbage = message_of([&] { hdf5::File::open(dir / "not.h5", hdf5::File::Access::ReadOnly); });
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(missing, (dir / "absent.h5").string() + ": cannot open HDF5 file")) << missing;
  EXPECT_TRUE(contains(missing, "No such file or directory")) << missing;
  EXPECT_TRUE(contains(garbage, (dir / "not.h5").string() + ": cannot open HDF5 file")) << garbage;
  EXPECT_EQ(printed, "");
}

TEST(Hdf5File, CloseRefusesWhileObjectsAreOpen) {
  TempDir dir;
  hdf5::File file = hdf5::File::create(dir / "open.h5");
  const hdf5::Group group = file.create_group("g");
  EXPECT_THROW(file.close(), std::logic_error);
}
