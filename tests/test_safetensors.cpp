// safetensors reading and writing: every dtype of the table, sharded checkpoints, and
// corrupt files refused with the file and tensor named.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.h"
#include "support.h"

using namespace tandem;
using namespace tandem::testing;

namespace {

std::vector<std::byte> random_bytes(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> bytes(count);
  for (auto& b : bytes) b = static_cast<std::byte>(rng() & 0xff);
  return bytes;
}

// A file with a hand-written header, for the corrupt cases.
void write_raw(const std::filesystem::path& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t length = header.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << header;
  out << std::string(data_bytes, '\0');
}

std::string open_error(const std::filesystem::path& path) {
  try {
    SafetensorsFile file(path);
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  return "accepted";
}

TEST(Safetensors, RoundTripsEveryDtypeOfTheTable) {
  TempDir dir;
  std::vector<std::vector<std::byte>> storage;
  std::vector<SafetensorsTensor> tensors;
  for (int i = 0; i < kDTypeCount; ++i) {
    const DType dtype = static_cast<DType>(i);
    storage.push_back(random_bytes(3 * 5 * dtype_size(dtype), i));
    tensors.push_back({std::string("t.") + dtype_name(dtype), dtype, {3, 5}, storage.back().data()});
  }
  const float scalar = 2.5f;
  tensors.push_back({"scalar", DType::F32, {}, &scalar});
  tensors.push_back({"empty", DType::BF16, {0, 4}, nullptr});
  write_safetensors(dir / "all.safetensors", tensors, {{"format", "pt"}, {"note", "tandem"}});

  const SafetensorsFile file(dir / "all.safetensors");
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("note"), "tandem");
  ASSERT_EQ(file.entries().size(), tensors.size());
  for (const auto& tensor : tensors) {
    const SafetensorsEntry& entry = file.entry(tensor.name);
    EXPECT_EQ(entry.dtype, tensor.dtype) << tensor.name;
    EXPECT_EQ(entry.shape, tensor.shape) << tensor.name;
    ASSERT_EQ(entry.bytes, tensor.bytes()) << tensor.name;
    if (entry.bytes) EXPECT_EQ(std::memcmp(file.bytes(tensor.name).data(), tensor.data, entry.bytes), 0) << tensor.name;
  }
  EXPECT_EQ(file.tensor("scalar").numel(), 1);
  EXPECT_EQ(*file.tensor("scalar").ptr<float>(), 2.5f);
  EXPECT_EQ(file.tensor("t.BF16").describe(), "BF16[3,5] cpu");

  // The header is padded so the data section starts 8-byte aligned.
  std::ifstream in(dir / "all.safetensors", std::ios::binary);
  uint64_t header_bytes = 0;
  in.read(reinterpret_cast<char*>(&header_bytes), 8);
  EXPECT_EQ((8 + header_bytes) % 8, 0u);
  EXPECT_EQ(in.get(), '{');
}

TEST(Safetensors, ViewsAreCopyOnWriteAndNeverReachTheFile) {
  TempDir dir;
  const std::vector<float> values = {1, 2, 3, 4};
  const SafetensorsTensor tensor{"w", DType::F32, {4}, values.data()};
  write_safetensors(dir / "w.safetensors", std::span(&tensor, 1));
  {
    const SafetensorsFile file(dir / "w.safetensors");
    file.tensor("w").ptr<float>()[0] = 99;
    EXPECT_EQ(file.tensor("w").ptr<float>()[0], 99);
  }
  const SafetensorsFile again(dir / "w.safetensors");
  EXPECT_EQ(again.tensor("w").ptr<float>()[0], 1);
}

TEST(Safetensors, ShardedCheckpointsSplitBySizeAndReadBack) {
  TempDir dir;
  std::vector<std::vector<std::byte>> storage;
  std::vector<SafetensorsTensor> tensors;
  for (int i = 0; i < 5; ++i) {
    storage.push_back(random_bytes(i == 3 ? 4000 : 1000, 100 + i));
    tensors.push_back({"layer." + std::to_string(i), DType::U8, {static_cast<int64_t>(storage.back().size())},
                       storage.back().data()});
  }
  write_safetensors_sharded(dir.path(), tensors, 2500);
  // 1000+1000 | 1000 | 4000 (alone: larger than a shard) | 1000
  for (int s = 1; s <= 4; ++s) EXPECT_TRUE(std::filesystem::exists(dir / ("model-0000" + std::to_string(s) + "-of-00004.safetensors")));
  const auto index = nlohmann::json::parse(read_text(dir / kSafetensorsIndexName));
  EXPECT_EQ(index.at("metadata").at("total_size"), 8000);
  EXPECT_EQ(index.at("weight_map").at("layer.3"), "model-00003-of-00004.safetensors");

  const SafetensorsCheckpoint checkpoint(dir.path());
  EXPECT_TRUE(checkpoint.sharded());
  EXPECT_EQ(checkpoint.origin(), dir / kSafetensorsIndexName);
  ASSERT_EQ(checkpoint.names().size(), 5u);
  for (const auto& tensor : tensors) {
    const SafetensorsFile* file = checkpoint.file_of(tensor.name);
    ASSERT_NE(file, nullptr) << tensor.name;
    EXPECT_EQ(std::memcmp(file->bytes(tensor.name).data(), tensor.data, tensor.bytes()), 0) << tensor.name;
  }
  EXPECT_EQ(checkpoint.file_of("absent"), nullptr);
}

TEST(Safetensors, SingleFileIsPreferredOverAnIndexAsTransformersDoes) {
  TempDir dir;
  const float value = 1;
  const SafetensorsTensor a{"a", DType::F32, {1}, &value}, b{"b", DType::F32, {1}, &value};
  write_safetensors_sharded(dir.path(), std::span(&a, 1), 1 << 20);
  write_safetensors(dir / kSafetensorsSingleName, std::span(&b, 1));
  const SafetensorsCheckpoint checkpoint(dir.path());
  EXPECT_FALSE(checkpoint.sharded());
  EXPECT_EQ(checkpoint.names(), std::vector<std::string>{"b"});
}

TEST(Safetensors, CorruptFilesAreRefusedNamingFileAndTensor) {
  TempDir dir;
  const auto path = dir / "bad.safetensors";
  const std::string file = path.string();
  auto entry = [](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return "{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
  };
  const std::vector<std::tuple<std::string, size_t, std::vector<std::string>>> cases = {
      {"{\"w\":" + entry("C64", "[1]", "[0,8]") + "}", 8, {"tensor 'w'", "'C64'"}},
      {"{\"w\":" + entry("F32", "[4]", "[0,16]") + "}", 8, {"tensor 'w'", "outside the 8-byte data section"}},
      {"{\"w\":" + entry("F32", "[3]", "[0,8]") + "}", 8, {"tensor 'w'", "spans 8 bytes", "needs 12"}},
      {"{\"w\":" + entry("F32", "[-1]", "[0,4]") + "}", 8, {"tensor 'w'", "non-negative"}},
      {"{\"w\":" + entry("F32", "[2]", "[8,0]") + "}", 8, {"tensor 'w'", "outside"}},
      {"{\"w\":" + entry("F32", "[2]", "[0]") + "}", 8, {"tensor 'w'", "data_offsets"}},
      {"{\"a\":" + entry("F32", "[2]", "[0,8]") + ",\"b\":" + entry("F32", "[2]", "[4,12]") + "}", 12,
       {"tensor 'b'", "overlaps tensor 'a'"}},
      {"{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, {"tensor 'w'", "no dtype"}},
      {"{\"__metadata__\":{\"format\":1}}", 0, {"__metadata__ value 'format'"}},
      {"{\"w\": [", 0, {"not valid JSON"}},
      {"[]", 0, {"not a JSON object"}},
  };
  for (const auto& [header, data_bytes, expected] : cases) {
    write_raw(path, header, data_bytes);
    const std::string message = open_error(path);
    EXPECT_NE(message.find(file), std::string::npos) << message;
    for (const auto& part : expected) EXPECT_NE(message.find(part), std::string::npos) << "wanted '" << part << "' in: " << message;
  }

  std::ofstream(path, std::ios::binary) << "abc";
  EXPECT_NE(open_error(path).find("too short"), std::string::npos);
  {
    std::ofstream out(path, std::ios::binary);
    const uint64_t length = 1000;
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << "{}";
  }
  EXPECT_NE(open_error(path).find("declares a 1000-byte header in a 10-byte file"), std::string::npos);
  EXPECT_NE(open_error(dir / "absent.safetensors").find("cannot open"), std::string::npos);
}

TEST(Safetensors, LookupsAndIndexesNameWhatIsMissing) {
  TempDir dir;
  const float value = 1;
  const SafetensorsTensor a{"a", DType::F32, {1}, &value};
  write_safetensors(dir / "model-00001-of-00001.safetensors", std::span(&a, 1));
  const SafetensorsFile file(dir / "model-00001-of-00001.safetensors");
  try {
    file.entry("absent");
    FAIL();
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("model-00001-of-00001.safetensors: tensor 'absent' is not in the file"),
              std::string::npos)
        << error.what();
  }

  auto checkpoint_error = [&](const std::string& index) {
    write_text(dir / kSafetensorsIndexName, index);
    try {
      SafetensorsCheckpoint checkpoint(dir.path());
    } catch (const std::runtime_error& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  std::string message = checkpoint_error(R"({"weight_map": {"a": "model-00001-of-00001.safetensors", "b": "model-00001-of-00001.safetensors"}})");
  EXPECT_NE(message.find(kSafetensorsIndexName), std::string::npos) << message;
  EXPECT_NE(message.find("tensor 'b' is mapped to shard 'model-00001-of-00001.safetensors'"), std::string::npos) << message;
  message = checkpoint_error(R"({"weight_map": {"a": "model-00002-of-00002.safetensors"}})");
  EXPECT_NE(message.find("model-00002-of-00002.safetensors: cannot open"), std::string::npos) << message;
  message = checkpoint_error(R"({"weight_map": {"a": "../elsewhere.safetensors"}})");
  EXPECT_NE(message.find("tensor 'a' maps to '../elsewhere.safetensors'"), std::string::npos) << message;
  message = checkpoint_error(R"({"metadata": {}})");
  EXPECT_NE(message.find("has no weight_map"), std::string::npos) << message;

  TempDir empty;
  try {
    SafetensorsCheckpoint checkpoint(empty.path());
    FAIL();
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find(empty.path().string()), std::string::npos);
  }
}

TEST(Safetensors, WriterRefusesDuplicatesAndLeavesNoPartialFile) {
  TempDir dir;
  const float value = 1;
  const SafetensorsTensor twice[] = {{"w", DType::F32, {1}, &value}, {"w", DType::F32, {1}, &value}};
  try {
    write_safetensors(dir / "dup.safetensors", twice);
    FAIL();
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("tensor 'w' is listed twice"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  EXPECT_THROW(write_safetensors(dir / "missing-folder" / "x.safetensors", std::span(twice, 1)), std::runtime_error);
}

}  // namespace
