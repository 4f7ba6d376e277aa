#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

namespace tandem {

static_assert(std::endian::native == std::endian::little, "safetensors stores little-endian data");

using nlohmann::json;

namespace {

// A header larger than this is a corrupt length field, not a real checkpoint (the
// reference implementation uses the same bound).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

std::string errno_text() { return std::strerror(errno); }

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& why) {
  throw std::runtime_error(path.string() + ": " + why);
}
[[noreturn]] void fail_tensor(const std::filesystem::path& path, const std::string& name, const std::string& why) {
  throw std::runtime_error(path.string() + ": tensor '" + name + "' " + why);
}

// Element count of a shape, refusing negative extents and overflow.
bool checked_numel(const std::vector<int64_t>& shape, uint64_t& count) {
  count = 1;
  for (int64_t extent : shape) {
    if (extent < 0) return false;
    if (extent != 0 && count > UINT64_MAX / static_cast<uint64_t>(extent)) return false;
    count *= static_cast<uint64_t>(extent);
  }
  return true;
}

SafetensorsEntry parse_entry(const std::filesystem::path& path, const std::string& name, const json& value,
                             uint64_t data_bytes) {
  if (!value.is_object()) fail_tensor(path, name, "has a header entry that is not an object: " + value.dump());
  SafetensorsEntry entry;
  entry.name = name;
  if (!value.contains("dtype") || !value.at("dtype").is_string()) fail_tensor(path, name, "has no dtype string");
  try {
    entry.dtype = dtype_from_safetensors(value.at("dtype").get<std::string>());
  } catch (const std::invalid_argument& error) {
    fail_tensor(path, name, error.what());
  }
  if (!value.contains("shape") || !value.at("shape").is_array()) fail_tensor(path, name, "has no shape list");
  for (const json& extent : value.at("shape")) {
    if (!extent.is_number_unsigned()) fail_tensor(path, name, "has a shape entry that is not a non-negative integer: " + extent.dump());
    entry.shape.push_back(extent.get<int64_t>());
  }
  const json& offsets = value.contains("data_offsets") ? value.at("data_offsets") : json();
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
    fail_tensor(path, name, "needs data_offsets [begin, end] of non-negative integers, got " + offsets.dump());
  const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
  if (begin > end || end > data_bytes)
    fail_tensor(path, name, "has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                                "] outside the " + std::to_string(data_bytes) + "-byte data section");
  uint64_t numel = 0;
  if (!checked_numel(entry.shape, numel) || numel > UINT64_MAX / dtype_size(entry.dtype))
    fail_tensor(path, name, "has an impossible shape " + shape_string(entry.shape));
  if (end - begin != numel * dtype_size(entry.dtype))
    fail_tensor(path, name, "spans " + std::to_string(end - begin) + " bytes but " + dtype_name(entry.dtype) +
                                shape_string(entry.shape) + " needs " + std::to_string(numel * dtype_size(entry.dtype)));
  entry.offset = begin;
  entry.bytes = end - begin;
  return entry;
}

// Writes to a temporary beside the target and renames it into place once complete.
class AtomicFile {
 public:
  explicit AtomicFile(const std::filesystem::path& path)
      : path_(path), temporary_(path.string() + ".tmp." + std::to_string(::getpid())) {
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(temporary_, "cannot create (" + errno_text() + ")");
  }
  ~AtomicFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(temporary_.c_str());
    }
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes) {
    const char* cursor = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t written = ::write(fd_, cursor, std::min<size_t>(bytes, 1u << 30));
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) fail(temporary_, "write failed (" + errno_text() + ")");
      cursor += written;
      bytes -= static_cast<size_t>(written);
    }
  }

  void commit() {
    if (::fsync(fd_) != 0) fail(temporary_, "fsync failed (" + errno_text() + ")");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
      ::unlink(temporary_.c_str());
      fail(temporary_, "close failed (" + errno_text() + ")");
    }
    if (::rename(temporary_.c_str(), path_.c_str()) != 0) {
      const std::string why = errno_text();
      ::unlink(temporary_.c_str());
      fail(path_, "cannot rename the finished temporary into place (" + why + ")");
    }
    // The rename lives in the folder: fsync it too, or a crash may forget the new name.
    const std::filesystem::path folder = path_.has_parent_path() ? path_.parent_path() : std::filesystem::path(".");
    const int folder_fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (folder_fd < 0) fail(folder, "cannot open the folder to fsync it (" + errno_text() + ")");
    const int synced = ::fsync(folder_fd);
    ::close(folder_fd);
    if (synced != 0) fail(folder, "fsync of the folder failed (" + errno_text() + ")");
  }

 private:
  std::filesystem::path path_;
  std::filesystem::path temporary_;
  int fd_ = -1;
};

}  // namespace

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open (" + errno_text() + ")");
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    ::close(fd);
    fail(path, "cannot stat (" + errno_text() + ")");
  }
  const uint64_t file_bytes = static_cast<uint64_t>(info.st_size);
  if (file_bytes < 8) {
    ::close(fd);
    fail(path, "is " + std::to_string(file_bytes) + " bytes, too short for a safetensors header");
  }
  // Private and writable: views can be handed out as mutable tensors without any write
  // ever reaching the file.
  mapping_ = ::mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    fail(path, "cannot be memory-mapped (" + errno_text() + ")");
  }
  mapped_bytes_ = file_bytes;

  try {
    const auto* bytes = static_cast<const std::byte*>(mapping_);
    uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, bytes, 8);
    if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8)
      fail(path, "declares a " + std::to_string(header_bytes) + "-byte header in a " + std::to_string(file_bytes) +
                     "-byte file (corrupt or not safetensors)");
    const std::string_view header_text(reinterpret_cast<const char*>(bytes + 8), header_bytes);
    json header;
    try {
      header = json::parse(header_text);
    } catch (const json::parse_error& error) {
      fail(path, std::string("header is not valid JSON (") + error.what() + ")");
    }
    if (!header.is_object()) fail(path, "header is not a JSON object");
    data_ = bytes + 8 + header_bytes;
    const uint64_t data_bytes = file_bytes - 8 - header_bytes;

    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        if (!value.is_object()) fail(path, "__metadata__ is not an object");
        for (const auto& [key, text] : value.items()) {
          if (!text.is_string()) fail(path, "__metadata__ value '" + key + "' is not a string");
          metadata_[key] = text.get<std::string>();
        }
        continue;
      }
      entries_.push_back(parse_entry(path, name, value, data_bytes));
    }
    std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) { return a.name < b.name; });

    std::vector<const SafetensorsEntry*> by_offset;
    for (const auto& entry : entries_)
      if (entry.bytes > 0) by_offset.push_back(&entry);
    std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i)
      if (by_offset[i]->offset < by_offset[i - 1]->offset + by_offset[i - 1]->bytes)
        fail_tensor(path, by_offset[i]->name, "overlaps tensor '" + by_offset[i - 1]->name + "'");
  } catch (...) {
    ::munmap(mapping_, mapped_bytes_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) ::munmap(mapping_, mapped_bytes_);
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const SafetensorsEntry& entry, std::string_view key) { return entry.name < key; });
  return it != entries_.end() && it->name == name ? &*it : nullptr;
}

const SafetensorsEntry& SafetensorsFile::entry(std::string_view name) const {
  const SafetensorsEntry* found = find(name);
  if (!found) fail_tensor(path_, std::string(name), "is not in the file");
  return *found;
}

std::span<const std::byte> SafetensorsFile::bytes(std::string_view name) const {
  const SafetensorsEntry& found = entry(name);
  return {data_ + found.offset, found.bytes};
}

Tensor SafetensorsFile::tensor(std::string_view name) const {
  const SafetensorsEntry& found = entry(name);
  return Tensor::view(const_cast<std::byte*>(data_ + found.offset), found.dtype, Device::CPU, found.shape);
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::filesystem::path& folder) {
  const auto single = folder / kSafetensorsSingleName;
  const auto index = folder / kSafetensorsIndexName;
  if (std::filesystem::exists(single)) {
    origin_ = single;
    files_.push_back(std::make_unique<SafetensorsFile>(single));
    for (const auto& entry : files_.back()->entries()) tensor_file_[entry.name] = files_.back().get();
    return;
  }
  if (!std::filesystem::exists(index))
    fail(folder, std::string("holds neither ") + kSafetensorsSingleName + " nor " + kSafetensorsIndexName);
  origin_ = index;
  std::ifstream in(index, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  json root;
  try {
    root = json::parse(text.str());
  } catch (const json::parse_error& error) {
    fail(index, std::string("is not valid JSON (") + error.what() + ")");
  }
  if (!root.is_object() || !root.contains("weight_map") || !root.at("weight_map").is_object())
    fail(index, "has no weight_map object");
  std::map<std::string, const SafetensorsFile*> shards;
  for (const auto& [name, shard] : root.at("weight_map").items()) {
    if (!shard.is_string()) fail_tensor(index, name, "maps to " + shard.dump() + ", not a file name");
    const std::string shard_name = shard.get<std::string>();
    if (shard_name.find('/') != std::string::npos || shard_name == "." || shard_name == "..")
      fail_tensor(index, name, "maps to '" + shard_name + "', which is not a file in the folder");
    auto [it, inserted] = shards.try_emplace(shard_name, nullptr);
    if (inserted) {
      files_.push_back(std::make_unique<SafetensorsFile>(folder / shard_name));
      it->second = files_.back().get();
    }
    if (!it->second->find(name))
      fail_tensor(index, name, "is mapped to shard '" + shard_name + "', which does not contain it");
    tensor_file_[name] = it->second;
  }
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : tensor_file_) names.push_back(name);
  return names;
}

const SafetensorsFile* SafetensorsCheckpoint::file_of(std::string_view name) const {
  auto it = tensor_file_.find(name);
  return it == tensor_file_.end() ? nullptr : it->second;
}

size_t SafetensorsTensor::bytes() const {
  uint64_t numel = 0;
  if (!checked_numel(shape, numel)) throw std::invalid_argument("tensor '" + name + "' has an impossible shape " + shape_string(shape));
  return numel * dtype_size(dtype);
}

void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsTensor> tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& tensor : tensors) {
    if (tensor.name.empty() || tensor.name == "__metadata__")
      fail(path, "cannot store a tensor named '" + tensor.name + "'");
    if (header.contains(tensor.name)) fail_tensor(path, tensor.name, "is listed twice");
    if (!tensor.data && tensor.bytes() > 0) fail_tensor(path, tensor.name, "has no data");
    header[tensor.name] = {{"dtype", dtype_info(tensor.dtype).safetensors_code},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.bytes()}}};
    offset += tensor.bytes();
  }
  std::string text = header.dump();
  // The data section must start 8-byte aligned; the format pads the header with spaces.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  const uint64_t header_bytes = text.size();

  AtomicFile file(path);
  file.write(&header_bytes, sizeof header_bytes);
  file.write(text.data(), text.size());
  for (const auto& tensor : tensors) file.write(tensor.data, tensor.bytes());
  file.commit();
}

void write_safetensors_sharded(const std::filesystem::path& folder, std::span<const SafetensorsTensor> tensors,
                               size_t max_shard_bytes, const std::map<std::string, std::string>& metadata) {
  if (max_shard_bytes == 0) fail(folder, "a sharded checkpoint needs a positive shard size");
  std::vector<std::span<const SafetensorsTensor>> shards;
  size_t begin = 0, shard_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i > begin && shard_bytes + tensors[i].bytes() > max_shard_bytes) {
      shards.push_back(tensors.subspan(begin, i - begin));
      begin = i;
      shard_bytes = 0;
    }
    shard_bytes += tensors[i].bytes();
  }
  if (begin < tensors.size() || shards.empty()) shards.push_back(tensors.subspan(begin));

  json weight_map = json::object();
  uint64_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    write_safetensors(folder / name, shards[s], metadata);
    for (const auto& tensor : shards[s]) {
      weight_map[tensor.name] = name;
      total += tensor.bytes();
    }
  }
  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomically(folder / kSafetensorsIndexName, index.dump(2) + "\n");
}

void write_file_atomically(const std::filesystem::path& path, std::string_view contents) {
  AtomicFile file(path);
  file.write(contents.data(), contents.size());
  file.commit();
}

}  // namespace tandem
