#include "sync/disk_delta_transport.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>

#include "io/safetensors.h"
#include "tensor/device_copy.h"
#include "world/errors.h"
#include "world/log.h"
#include "world/world.h"

namespace tandem {

namespace fs = std::filesystem;

namespace {

// A source rank rounds its weights through a device buffer of this size.
constexpr size_t kStagingBytes = size_t{64} << 20;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The numbers of the version folders under root (weight_v000001 -> 1).
std::vector<std::pair<int64_t, fs::path>> version_folders(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> found;
  if (!fs::is_directory(root)) return found;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("weight_v", 0) != 0) continue;
    char* end = nullptr;
    const long long version = std::strtoll(name.c_str() + 8, &end, 10);
    if (end && *end == '\0') found.emplace_back(version, entry.path());
  }
  return found;
}

// Why the HF folder's tensor cannot be the baseline of `info` in `dtype`; "" when it can.
std::string hf_baseline_mismatch(const SafetensorsCheckpoint& checkpoint, const ParameterInfo& info, DType dtype) {
  const SafetensorsFile* file = checkpoint.file_of(info.name);
  if (!file) return "tensor " + info.name + ": missing from the baseline " + checkpoint.origin().string();
  const SafetensorsEntry& entry = file->entry(info.name);
  const std::string mismatch = baseline_mismatch(info.name, {entry.dtype, entry.shape, entry.bytes, true}, dtype, info.shape);
  return mismatch.empty() ? "" : mismatch + " (" + file->path().string() + ")";
}

}  // namespace

DiskDeltaTransport::DiskDeltaTransport(MemoryPool& pool, const ParameterLayout& layout, const Allocation* master,
                                       DType dtype, DiskDeltaSettings settings)
    : pool_(pool), layout_(layout), master_(master), dtype_(dtype), settings_(std::move(settings)) {
  MPI_Comm_rank(settings_.comm, &rank_);
  MPI_Comm_size(settings_.comm, &size_);
  if (dtype != DType::F32 && dtype != DType::BF16)
    throw std::invalid_argument(std::string("disk-delta: working dtype ") + dtype_name(dtype) + " (F32 or BF16)");
  if ((master != nullptr) != (rank_ < settings_.source_ranks) || settings_.source_ranks > size_)
    throw std::invalid_argument("disk-delta: rank " + std::to_string(rank_) + " of " + std::to_string(size_) + (master ? " has" : " has no") +
                                " master weights, and the source ranks are the first " + std::to_string(settings_.source_ranks));
  const size_t slab = layout.slab_bytes(dtype);
  if (settings_.engine) weights_ = pool.allocate(tags::weights, slab, "engine.weights");
  // Under a tag of its own: no handoff moves it, it is there at every sync.
  if (master_) staging_ = pool.allocate(tag_named("sync_staging"), std::min(slab, kStagingBytes), "sync.staging");
  held_ = std::make_unique<PinnedMemory>(slab, pool.device());
  if (master_) state_ = std::make_unique<PinnedMemory>(slab, pool.device());
}

DiskDeltaTransport::~DiskDeltaTransport() {
  for (Allocation* allocation : {weights_, staging_})
    if (allocation) pool_.release(allocation);
}

Tensor DiskDeltaTransport::engine_weights() const {
  if (!weights_) throw std::logic_error("disk-delta: a trainer rank holds no engine weights (they are on the rollout ranks)");
  return Tensor::view(weights_->ptr, dtype_, pool_.device(), {layout_.slab_elements()});
}

std::span<std::byte> DiskDeltaTransport::bytes_of(PinnedMemory& slab, const ParameterInfo& info) const {
  const size_t element = dtype_size(dtype_);
  return std::span(static_cast<std::byte*>(slab.data()), slab.bytes()).subspan(info.offset * element, static_cast<size_t>(info.numel()) * element);
}

SyncReport DiskDeltaTransport::sync() {
  const auto start = std::chrono::steady_clock::now();
  const bool first = version_ < 0;
  if (first) take_baseline();
  const double baseline_seconds = seconds_since(start);
  // Source side: this rank's share of the new weights, rounded into the state.
  const auto rounding = std::chrono::steady_clock::now();
  std::string error;
  if (master_) {
    try {
      round_owned_tensors();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  fail_together(settings_.comm, error, kExitFailure, "disk-delta source");
  const double round_seconds = master_ ? seconds_since(rounding) : 0.0;
  SyncReport report;
  // The first sync publishes only a trainer that is not at the baseline (a resumed run).
  if (!first || any_source_differs_from_baseline()) report = publish_and_apply(round_seconds);
  report.engine_seconds += baseline_seconds;
  report.seconds += baseline_seconds;
  return report;
}

void DiskDeltaTransport::take_baseline() {
  std::string error;
  if (rank_ == 0) {
    // Versions left by an earlier job are deltas against another baseline.
    try {
      for (const auto& [version, folder] : version_folders(settings_.path)) fs::remove_all(folder);
      fs::create_directories(settings_.path);
    } catch (const std::exception& e) {
      error = std::string("cannot prepare the folder: ") + e.what();
    }
  }
  fail_together(settings_.comm, error, kExitFailure, "disk-delta " + settings_.path.string());

  const auto& tensors = layout_.tensors();
  if (settings_.baseline.empty()) {
    try {
      std::vector<float> values = settings_.initial_weights();
      if (values.size() != static_cast<size_t>(layout_.slab_elements()))
        throw std::runtime_error("the initial weights hold " + std::to_string(values.size()) + " values, the model " +
                                 std::to_string(layout_.slab_elements()));
      // The rounding of every rank's working copy (the same on the host and the device).
      convert_f32(Tensor::view(held_->data(), dtype_, Device::CPU, {layout_.slab_elements()}),
                  Tensor::view(values.data(), DType::F32, Device::CPU, {layout_.slab_elements()}));
    } catch (const std::exception& e) {
      error = e.what();
    }
    fail_together(settings_.comm, error, kExitBadInput, "disk-delta baseline");
  } else {
    // An HF folder: each source rank checks its share before anyone loads it.
    std::unique_ptr<SafetensorsCheckpoint> checkpoint;
    try {
      checkpoint = std::make_unique<SafetensorsCheckpoint>(settings_.baseline);
      for (size_t i = 0; i < tensors.size(); ++i)
        if (owns(i))
          if (const std::string mismatch = hf_baseline_mismatch(*checkpoint, tensors[i], dtype_); !mismatch.empty())
            error += mismatch + "\n";
    } catch (const std::exception& e) {
      error += e.what();
    }
    fail_together(settings_.comm, error, kExitBadInput, "disk-delta baseline");
    // Each rank loads what it needs; an engine refuses a folder it sees otherwise than the sources.
    try {
      for (size_t i = 0; i < tensors.size(); ++i) {
        if (!owns(i) && !settings_.engine) continue;
        if (const std::string mismatch = hf_baseline_mismatch(*checkpoint, tensors[i], dtype_); !mismatch.empty())
          throw std::runtime_error(mismatch);
        const std::span<const std::byte> bytes = checkpoint->file_of(tensors[i].name)->bytes(tensors[i].name);
        std::memcpy(bytes_of(*held_, tensors[i]).data(), bytes.data(), bytes.size());
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    fail_together(settings_.comm, error, kExitBadInput, "disk-delta baseline");
  }
  if (settings_.engine) copy_host_to_tensor(engine_weights(), held_->data());
  version_ = 0;
}

void DiskDeltaTransport::round_owned_tensors() {
  // An offloaded trainer's master weights are read through their pinned host copy's mapping.
  const auto* master = static_cast<const float*>(pool_.readable_data(master_));
  const int64_t chunk = static_cast<int64_t>(staging_->bytes / dtype_size(dtype_));
  for (size_t i = 0; i < layout_.tensors().size(); ++i) {
    if (!owns(i)) continue;
    const ParameterInfo& info = layout_.tensors()[i];
    std::byte* out = bytes_of(*state_, info).data();
    for (int64_t first = 0; first < info.numel(); first += chunk) {
      const int64_t n = std::min(chunk, info.numel() - first);
      const Tensor staged = Tensor::view(staging_->ptr, dtype_, pool_.device(), {n});
      convert_f32(staged, Tensor::view(const_cast<float*>(master) + info.offset + first, DType::F32, pool_.device(), {n}));
      copy_tensor_to_host(out + first * dtype_size(dtype_), staged);
    }
  }
}

// Collective: whether any source rank's new state differs from the baseline it holds.
bool DiskDeltaTransport::any_source_differs_from_baseline() {
  int differs = 0;
  if (master_) {
    const auto& tensors = layout_.tensors();
#pragma omp parallel for schedule(dynamic, 1) reduction(max : differs)
    for (size_t i = 0; i < tensors.size(); ++i)
      if (owns(i)) {
        const std::span<std::byte> held = bytes_of(*held_, tensors[i]), state = bytes_of(*state_, tensors[i]);
        differs = std::max(differs, std::memcmp(held.data(), state.data(), held.size()) != 0 ? 1 : 0);
      }
  }
  MPI_Allreduce(MPI_IN_PLACE, &differs, 1, MPI_INT, MPI_MAX, settings_.comm);
  return differs != 0;
}

SyncReport DiskDeltaTransport::publish_and_apply(double round_seconds) {
  const int64_t version = version_ + 1;
  const fs::path folder = delta_version_folder(settings_.path, version);
  const auto& tensors = layout_.tensors();
  const MPI_Comm comm = settings_.comm;
  // A failed version is not published: its files must not linger either.
  const auto fail_publish_together = [&](const std::string& error) {
    try {
      fail_together(comm, error, kExitFailure, "disk-delta publish of " + folder.string());
    } catch (const RanksFailedError&) {
      std::error_code ignored;
      if (rank_ == 0) fs::remove_all(folder, ignored);
      throw;
    }
  };

  // Source side: encode this rank's share against the version held, compress, write.
  auto start = std::chrono::steady_clock::now();
  DeltaWriteStats written;
  std::string error;
  if (master_) {
    try {
      fs::create_directories(folder);
      std::vector<DeltaTensor> deltas;
      for (size_t i = 0; i < tensors.size(); ++i)
        if (owns(i))
          deltas.push_back({tensors[i].name, dtype_, tensors[i].shape, bytes_of(*held_, tensors[i]), bytes_of(*state_, tensors[i])});
      written = write_delta_file(folder / delta_file_name(rank_, settings_.source_ranks), deltas, settings_.encoding,
                                 settings_.compression_level, rank_);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  fail_publish_together(error);
  // Every source rank's file is complete (the gather above): the index publishes the version.
  const auto publishing = std::chrono::steady_clock::now();
  if (rank_ == 0) {
    try {
      DeltaIndex index{version, version_, settings_.encoding, {}};
      for (size_t i = 0; i < tensors.size(); ++i)
        index.weight_map.emplace_back(tensors[i].name,
                                      delta_file_name(static_cast<int>(i % static_cast<size_t>(settings_.source_ranks)), settings_.source_ranks));
      write_delta_index(folder, index);
      for (const auto& [old, old_folder] : version_folders(settings_.path))
        if (old <= version - settings_.keep_versions) fs::remove_all(old_folder);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  fail_publish_together(error);
  const double publish_seconds = seconds_since(publishing);
  const double source_seconds = master_ ? round_seconds + seconds_since(start) : 0.0;

  // Engine side: read the published version, decode it onto the version held, verify, apply.
  start = std::chrono::steady_clock::now();
  DeltaApplyStats applied;
  double device_seconds = 0;
  if (settings_.engine) {
    try {
      applied = apply_version(folder, version);
      const auto copying = std::chrono::steady_clock::now();
      copy_host_to_tensor(engine_weights(), held_->data());
      device_seconds = seconds_since(copying);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  fail_together(comm, error, kExitFailure, "disk-delta engine");
  const double engine_seconds = settings_.engine ? seconds_since(start) : 0.0;
  // Both sides hold the new version: the base of the next.
  version_ = version;
  if (!settings_.engine) std::swap(held_, state_);
  TLOG(debug) << "disk-delta version " << version << " (against " << version - 1 << "): source: round " << round_seconds << " s, encode "
              << written.encode_seconds << " s, write " << written.write_seconds << " s (" << written.file_bytes << " bytes), publish "
              << publish_seconds << " s; engine: read and decode " << applied.decode_seconds << " s, verify " << applied.verify_seconds
              << " s, to the device " << device_seconds << " s";

  unsigned long long sizes[] = {written.file_bytes, written.changed_bytes, written.total_bytes};
  MPI_Allreduce(MPI_IN_PLACE, sizes, 3, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm);
  double times[] = {source_seconds, engine_seconds};
  MPI_Allreduce(MPI_IN_PLACE, times, 2, MPI_DOUBLE, MPI_MAX, comm);
  SyncReport report;
  report.bytes = written.file_bytes + applied.file_bytes;
  report.wire_bytes = sizes[0];
  report.density = sizes[2] ? static_cast<double>(sizes[1]) / static_cast<double>(sizes[2]) : 0.0;
  report.source_seconds = times[0];
  report.engine_seconds = times[1];
  report.seconds = times[0] + times[1];
  return report;
}

// Every file of the version, decoded and verified in place onto the version held (its
// base, checked first). Returns what the files took.
DeltaApplyStats DiskDeltaTransport::apply_version(const fs::path& folder, int64_t version) {
  const auto& tensors = layout_.tensors();
  const fs::path index_path = folder / kSafetensorsIndexName;
  const DeltaIndex index = read_delta_index(folder);
  if (index.version != version || index.base_version != version_)
    throw std::runtime_error(index_path.string() + ": version " + std::to_string(index.version) + " is a delta against version " +
                             std::to_string(index.base_version) + "; this engine holds version " + std::to_string(version_) +
                             " and expects version " + std::to_string(version));
  if (index.encoding != settings_.encoding)
    throw std::runtime_error(index_path.string() + ": encoding " + delta_encoding_name(index.encoding) + ", the engine's is " +
                             delta_encoding_name(settings_.encoding));
  std::map<std::string, std::string> file_of(index.weight_map.begin(), index.weight_map.end());
  std::set<std::string> files;
  for (const ParameterInfo& info : tensors) {
    const auto found = file_of.find(info.name);
    if (found == file_of.end()) throw std::runtime_error(index_path.string() + ": tensor " + info.name + " is missing");
    files.insert(found->second);
  }
  std::set<std::string> applied;
  const HeldBytes held = [&](const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
    const ParameterInfo* info = layout_.find(name);
    if (!info) throw std::runtime_error("tensor " + name + ": not in the model");
    if (dtype != dtype_ || shape != info->shape)
      throw std::runtime_error("tensor " + name + ": " + dtype_name(dtype) + " of shape " + std::to_string(shape.size()) +
                               "-d in the delta, not the engine's " + dtype_name(dtype_) + " " + std::to_string(info->shape.size()) + "-d");
    if (!applied.insert(name).second) throw std::runtime_error("tensor " + name + " is in two files");
    return bytes_of(*held_, *info);
  };
  DeltaApplyStats total;
  for (const std::string& file : files) {
    const DeltaApplyStats stats = apply_delta_file(folder / file, settings_.encoding, held);
    for (const std::string& name : stats.tensors)
      if (file_of[name] != file) throw std::runtime_error("tensor " + name + " is in " + file + ", the index says " + file_of[name]);
    total.decode_seconds += stats.decode_seconds;
    total.verify_seconds += stats.verify_seconds;
    total.file_bytes += stats.file_bytes;
  }
  if (applied.size() != tensors.size())
    throw std::runtime_error(folder.string() + ": " + std::to_string(tensors.size() - applied.size()) + " tensors of the index in no file");
  return total;
}

}  // namespace tandem
