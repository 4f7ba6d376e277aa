// The safetensors format: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}} padded
// with spaces to a multiple of 8 bytes, then the raw row-major tensor bytes (offsets count
// from the end of the header). Dtypes go through the one table in tensor/dtype.h.
//
// Files are memory-mapped, never read whole: a 16 GB checkpoint costs page cache, not
// heap. Every error names the file and, where there is one, the tensor.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace tandem {

// The file names of a Hugging Face weights folder.
inline constexpr const char* kSafetensorsSingleName = "model.safetensors";
inline constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  size_t offset = 0;  // from the start of the data section
  size_t bytes = 0;
};

class SafetensorsFile {
 public:
  // Maps the file and validates the whole header: JSON syntax, dtypes, shapes, offsets
  // inside the file, byte counts equal to shape x dtype size, no overlapping tensors.
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // sorted by name
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(std::string_view name) const;
  // Both throw std::runtime_error naming the file and the tensor when it is absent.
  const SafetensorsEntry& entry(std::string_view name) const;
  std::span<const std::byte> bytes(std::string_view name) const;
  // A view onto the mapping. The mapping is private: writes through it never reach the
  // file. Its address is only as aligned as the file's offsets (copy before vector math).
  Tensor tensor(std::string_view name) const;

 private:
  std::filesystem::path path_;
  void* mapping_ = nullptr;
  size_t mapped_bytes_ = 0;
  const std::byte* data_ = nullptr;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// The weights of a Hugging Face model folder: model.safetensors, or, failing that, the
// shards named by model.safetensors.index.json (the order transformers uses).
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::filesystem::path& folder);

  // The single file, or the index: what an error about the whole checkpoint names.
  const std::filesystem::path& origin() const { return origin_; }
  bool sharded() const { return origin_.filename() == kSafetensorsIndexName; }
  std::vector<std::string> names() const;  // sorted
  // The file holding the tensor, or nullptr.
  const SafetensorsFile* file_of(std::string_view name) const;

 private:
  std::filesystem::path origin_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*, std::less<>> tensor_file_;
};

// One tensor to write: `data` holds numel(shape) x dtype_size(dtype) bytes, row-major.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes() const;
};

// Writes one file atomically (a temporary beside it, fsync, rename): readers never see a
// partial file. Tensors are stored in the order given.
void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsTensor> tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes model-0000i-of-0000n.safetensors shards of at most max_shard_bytes each (a
// larger tensor gets a shard of its own), then model.safetensors.index.json.
void write_safetensors_sharded(const std::filesystem::path& folder, std::span<const SafetensorsTensor> tensors,
                               size_t max_shard_bytes, const std::map<std::string, std::string>& metadata = {});

// Writes a small text file atomically (temporary beside it, fsync, rename).
void write_file_atomically(const std::filesystem::path& path, std::string_view contents);

}  // namespace tandem
