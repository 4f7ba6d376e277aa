#include "io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <regex>
#include <stdexcept>

#include "io/checksum.h"
#include "io/disk_stream.h"
#include "io/durable_file.h"
#include "world/errors.h"
#include "world/version.h"

namespace tandem {

namespace {

constexpr const char* kFormat = "tandem checkpoint";
// 2: every tensor (and RNG state) carries the XXH3-64 of its bytes in attribute xxh3_64.
constexpr int64_t kFormatVersion = 2;
constexpr const char* kChecksumAttribute = "xxh3_64";

const std::regex& final_name_pattern() {
  static const std::regex pattern(R"(ckpt_(\d+)\.h5)");
  return pattern;
}

// Companions: `<what>.ckpt_<step>.h5` (the run file's copy: run.ckpt_<step>.h5).
const std::regex& companion_name_pattern() {
  static const std::regex pattern(R"([^.]+\.ckpt_(\d+)\.h5)");
  return pattern;
}

const std::regex& temporary_name_pattern() {
  static const std::regex pattern(R"(\.([^.]+\.)?ckpt_\d+\.h5\.tmp)");
  return pattern;
}

std::string padded_step(int64_t step) {
  char text[32];
  std::snprintf(text, sizeof text, "%08lld", static_cast<long long>(step));
  return text;
}

std::filesystem::path temporary_path(const std::filesystem::path& folder, int64_t step) {
  return folder / (".ckpt_" + padded_step(step) + ".h5.tmp");
}

std::string rank_entry(size_t rank) {
  char text[32];
  std::snprintf(text, sizeof text, "rank_%05zu", rank);
  return text;
}

// Datasets of at least this many bytes start on a block boundary, so their whole
// blocks go to the disk with O_DIRECT (disk_stream.h); smaller ones, a few KiB of norms
// and biases, go through the page cache unaligned rather than pad the file with gaps.
constexpr uint64_t kAlignedFromBytes = uint64_t{64} << 10;

void write_contents(const std::filesystem::path& path, const CheckpointContents& contents, std::stop_token stop,
                    DiskWrites writes) {
  hdf5::File file = hdf5::File::create(path, {kAlignedFromBytes, DiskStream::kBlockBytes});
  file.set_attribute("format", kFormat);
  file.set_attribute("format_version", kFormatVersion);
  file.set_attribute("version", tandem_version());
  file.set_attribute("git_revision", tandem_git_revision());
  file.set_attribute("step", contents.step);
  file.set_attribute("data_cursor", contents.data_cursor);
  file.write_string("deck", contents.deck_text);
  {
    const hdf5::Group rng = file.create_group("rng_states");
    rng.set_attribute("ranks", static_cast<int64_t>(contents.rng_states.size()));
    for (size_t rank = 0; rank < contents.rng_states.size(); ++rank) {
      const std::string& state = contents.rng_states[rank];
      // write_tensor only reads through the view.
      rng.write_tensor(rank_entry(rank), Tensor::view(const_cast<char*>(state.data()), DType::U8, Device::CPU,
                                                      {static_cast<int64_t>(state.size())}));
      rng.set_object_attribute(rank_entry(rank), kChecksumAttribute, xxh3_64_hex(state.data(), state.size()));
    }
  }
  {
    // The tensors' bytes go straight into storage HDF5 allocated for them, in large
    // writes past the page cache (disk_stream.h) and outside HDF5's lock, so a run file
    // written meanwhile by another thread does not wait for them.
    const hdf5::Group tensors = file.create_group("tensors");
    std::vector<hdf5::Group::RawStorage> storage;
    for (const auto& [name, tensor] : contents.tensors) {
      if (tensor.device != Device::CPU || !tensor.is_contiguous())
        throw std::invalid_argument(path.string() + ": tensor '" + name + "' is not a contiguous host tensor");
      storage.push_back(tensors.create_raw_tensor(name, tensor.dtype, tensor.shape));
    }
    DiskStream stream(path, writes);
    std::vector<std::string> checksums;
    for (size_t t = 0; t < contents.tensors.size(); ++t) {
      if (stop.stop_requested()) throw CheckpointAbandoned(path.string() + ": abandoned before it was complete");
      const Tensor& tensor = contents.tensors[t].second;
      checksums.push_back(xxh3_64_hex(tensor.data, tensor.nbytes()));
      if (storage[t].bytes != tensor.nbytes())
        throw std::logic_error(path.string() + ": tensor '" + contents.tensors[t].first + "' has " +
                               std::to_string(storage[t].bytes) + " bytes of storage for " +
                               std::to_string(tensor.nbytes()));
      stream.write_at(storage[t].offset, tensor.data, tensor.nbytes());
    }
    stream.close();
    for (size_t t = 0; t < contents.tensors.size(); ++t)
      tensors.set_object_attribute(contents.tensors[t].first, kChecksumAttribute, checksums[t]);
  }
  file.set_attribute("complete", int64_t{1});
  file.flush();
  file.close();
}

struct FoundCheckpoint {
  int64_t step;
  std::filesystem::path path;
};

// Files named like checkpoints, newest step first.
std::vector<FoundCheckpoint> checkpoints_in(const std::filesystem::path& folder) {
  std::vector<FoundCheckpoint> found;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    std::smatch match;
    if (entry.is_regular_file() && std::regex_match(name, match, final_name_pattern()))
      found.push_back({std::stoll(match[1].str()), entry.path()});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  return found;
}

bool is_complete_checkpoint(const std::filesystem::path& path) {
  try {
    Checkpoint::open(path);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

void remove_or_throw(const std::filesystem::path& path, const std::string& why) {
  std::error_code error;
  std::filesystem::remove(path, error);
  if (error) throw std::runtime_error(path.string() + ": cannot remove " + why + ": " + error.message());
}

// Unusable files under a final name are left alone: the writer never produces them, so
// they are evidence of something else going wrong, and a restart passes over them.
void prune(const std::filesystem::path& folder, int64_t committed_step, int keep_last) {
  for (const auto& entry : std::filesystem::directory_iterator(folder))
    if (std::regex_match(entry.path().filename().string(), temporary_name_pattern()))
      remove_or_throw(entry.path(), "a stale temporary checkpoint");
  int kept = 0;
  const std::vector<FoundCheckpoint> found = checkpoints_in(folder);
  for (const auto& checkpoint : found) {
    if (checkpoint.step > committed_step) {
      remove_or_throw(checkpoint.path, "a checkpoint after the restart step " + std::to_string(committed_step));
    } else if (keep_last > 0 && is_complete_checkpoint(checkpoint.path)) {
      if (kept < keep_last)
        ++kept;
      else
        remove_or_throw(checkpoint.path, "a checkpoint beyond the newest " + std::to_string(keep_last));
    }
  }
  // A companion lives as long as its checkpoint; one whose checkpoint never got committed
  // (a crash between the two renames) goes too.
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, companion_name_pattern()) &&
        !std::filesystem::exists(folder / checkpoint_file_name(std::stoll(match[1].str()))))
      remove_or_throw(entry.path(), "the companion of a removed checkpoint");
  }
}

// Throws BadInputError naming the file and the entry when `bytes` do not hash to the
// checksum stored with them. Files of format 1 have none to check.
void verify_checksum(const hdf5::Group& group, const std::string& name, const void* bytes, size_t size,
                     int64_t format_version, const std::string& file) {
  if (format_version < 2) return;
  const std::string where = file + ": " + (group.path_in_file() == "/" ? "" : group.path_in_file() + "/") + name;
  if (!group.object_has_attribute(name, kChecksumAttribute))
    throw BadInputError(where + ": no checksum (attribute " + kChecksumAttribute + "): the file was altered");
  const std::string stored = group.object_string_attribute(name, kChecksumAttribute);
  const std::string computed = xxh3_64_hex(bytes, size);
  if (stored != computed)
    throw BadInputError(where + ": checksum mismatch (xxh3 " + computed + ", stored " + stored +
                        "): the checkpoint is corrupt");
}

}  // namespace

std::string checkpoint_file_name(int64_t step) { return "ckpt_" + padded_step(step) + ".h5"; }

std::filesystem::path write_checkpoint_temporary(const std::filesystem::path& folder,
                                                 const CheckpointContents& contents, std::stop_token stop,
                                                 DiskWrites writes) {
  if (contents.step < 0)
    throw std::invalid_argument(folder.string() + ": checkpoint step " + std::to_string(contents.step) +
                                " is negative");
  std::filesystem::create_directories(folder);
  const std::filesystem::path temporary = temporary_path(folder, contents.step);
  try {
    write_contents(temporary, contents, stop, writes);
    fsync_path(temporary, false);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw;
  }
  return temporary;
}

std::filesystem::path commit_checkpoint(const std::filesystem::path& folder, int64_t step, int keep_last) {
  const std::filesystem::path temporary = temporary_path(folder, step);
  const std::filesystem::path final_path = folder / checkpoint_file_name(step);
  if (!std::filesystem::exists(temporary))
    throw std::runtime_error(temporary.string() + ": no temporary checkpoint of step " + std::to_string(step) +
                             " to commit");
  std::filesystem::rename(temporary, final_path);
  fsync_path(folder, true);
  prune(folder, step, keep_last);
  return final_path;
}

std::filesystem::path write_checkpoint(const std::filesystem::path& folder, const CheckpointContents& contents,
                                       int keep_last) {
  write_checkpoint_temporary(folder, contents);
  return commit_checkpoint(folder, contents.step, keep_last);
}

std::string checkpoint_companion_name(const std::string& what, int64_t step) {
  return what + "." + checkpoint_file_name(step);
}

std::vector<std::filesystem::path> checkpoints_newest_first(const std::filesystem::path& folder) {
  std::vector<std::filesystem::path> paths;
  if (!std::filesystem::is_directory(folder)) return paths;
  for (const auto& found : checkpoints_in(folder)) paths.push_back(found.path);
  return paths;
}

Checkpoint::Checkpoint(std::filesystem::path path, hdf5::File file) : path_(std::move(path)), file_(std::move(file)) {}

Checkpoint Checkpoint::open(const std::filesystem::path& path) {
  hdf5::File file = hdf5::File::open(path, hdf5::File::Access::ReadOnly);
  if (!file.has_attribute("format") || file.string_attribute("format") != kFormat)
    throw std::runtime_error(path.string() + ": not a tandem checkpoint (no format attribute '" + kFormat + "')");
  const int64_t format_version = file.int_attribute("format_version");
  if (format_version > kFormatVersion)
    throw std::runtime_error(path.string() + ": checkpoint format version " + std::to_string(format_version) +
                             " is newer than this tandem reads (" + std::to_string(kFormatVersion) + ")");
  if (!file.has_attribute("complete") || file.int_attribute("complete") != 1)
    throw std::runtime_error(path.string() +
                             ": checkpoint is incomplete (its writer stopped before setting complete = 1)");

  Checkpoint checkpoint(path, std::move(file));
  checkpoint.format_version_ = format_version;
  const hdf5::File& opened = checkpoint.file_;
  checkpoint.step_ = opened.int_attribute("step");
  std::smatch match;
  const std::string name = path.filename().string();
  if (std::regex_match(name, match, final_name_pattern()) && std::stoll(match[1].str()) != checkpoint.step_)
    throw std::runtime_error(path.string() + ": holds step " + std::to_string(checkpoint.step_) +
                             ", not the step its name says");
  checkpoint.data_cursor_ = opened.int_attribute("data_cursor");
  checkpoint.version_ = opened.string_attribute("version");
  checkpoint.git_revision_ = opened.string_attribute("git_revision");
  checkpoint.deck_text_ = opened.read_string("deck");
  {
    const hdf5::Group rng = opened.group("rng_states");
    const int64_t ranks = rng.int_attribute("ranks");
    for (int64_t rank = 0; rank < ranks; ++rank) {
      const std::string entry = rank_entry(static_cast<size_t>(rank));
      const hdf5::TensorInfo info = rng.tensor_info(entry);
      if (info.dtype != DType::U8 || info.shape.size() != 1)
        throw std::runtime_error(path.string() + ": /rng_states/" + entry + " is " + dtype_name(info.dtype) +
                                 shape_string(info.shape) + ", expected U8 bytes");
      std::string state(static_cast<size_t>(info.shape[0]), '\0');
      rng.read_tensor(entry, Tensor::view(state.data(), DType::U8, Device::CPU, info.shape));
      verify_checksum(rng, entry, state.data(), state.size(), format_version, path.string());
      checkpoint.rng_states_.push_back(std::move(state));
    }
  }
  const hdf5::Group tensors = opened.group("tensors");
  for (const auto& name : tensors.dataset_names()) checkpoint.tensors_.push_back(tensors.tensor_info(name));
  return checkpoint;
}

bool Checkpoint::has_tensor(const std::string& name) const {
  return std::any_of(tensors_.begin(), tensors_.end(), [&](const auto& info) { return info.name == name; });
}

const hdf5::TensorInfo& Checkpoint::tensor(const std::string& name) const {
  for (const auto& info : tensors_)
    if (info.name == name) return info;
  throw std::runtime_error(path_.string() + ": tensor '" + name + "' is missing (the checkpoint holds " +
                           std::to_string(tensors_.size()) + " tensors)");
}

void Checkpoint::read_tensor(const std::string& name, const Tensor& destination) const {
  tensor(name);  // a missing tensor fails here with the checkpoint's message
  const hdf5::Group tensors = file_.group("tensors");
  tensors.read_tensor(name, destination);
  verify_checksum(tensors, name, destination.data, destination.nbytes(), format_version_, path_.string());
}

}  // namespace tandem
