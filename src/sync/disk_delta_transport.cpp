#include "sync/disk_delta_transport.h"

#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>

#include "io/safetensors.h"
#include "tensor/bf16.h"
#include "tensor/device_copy.h"
#include "world/errors.h"
#include "world/world.h"

namespace tandem {

namespace fs = std::filesystem;

namespace {

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

}  // namespace

DiskDeltaTransport::DiskDeltaTransport(MemoryPool& pool, const ParameterLayout& layout, const Allocation* master,
                                       DType dtype, DiskDeltaSettings settings, MPI_Comm comm)
    : pool_(pool), layout_(layout), master_(master), dtype_(dtype), settings_(std::move(settings)), comm_(comm) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
  if (dtype != DType::F32 && dtype != DType::BF16)
    throw std::invalid_argument(std::string("disk-delta: working dtype ") + dtype_name(dtype) + " (F32 or BF16)");
  weights_ = pool.allocate(tags::weights, layout.slab_bytes(dtype), "engine.weights");
}

DiskDeltaTransport::~DiskDeltaTransport() { pool_.release(weights_); }

Tensor DiskDeltaTransport::engine_weights() const {
  return Tensor::view(weights_->ptr, dtype_, pool_.device(), {layout_.slab_elements()});
}

Tensor DiskDeltaTransport::engine_view(const ParameterInfo& info) const {
  return Tensor::view(static_cast<std::byte*>(weights_->ptr) + info.offset * dtype_size(dtype_), dtype_, pool_.device(), info.shape);
}

std::span<std::byte> DiskDeltaTransport::baseline_of(const ParameterInfo& info) {
  const size_t element = dtype_size(dtype_);
  return {baseline_.data() + info.offset * element, static_cast<size_t>(info.numel()) * element};
}

SyncReport DiskDeltaTransport::sync() {
  if (version_ >= 0) return publish_and_apply();
  const auto start = std::chrono::steady_clock::now();
  take_baseline();
  SyncReport report;
  report.engine_seconds = seconds_since(start);
  report.seconds = report.engine_seconds;
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
  fail_together(comm_, error, kExitFailure, "disk-delta " + settings_.path.string());

  baseline_.assign(layout_.slab_bytes(dtype_), std::byte{0});
  const auto& tensors = layout_.tensors();
  if (settings_.baseline.empty()) {
    // The engines start from the trainer's first weights: they are the baseline.
    const Tensor master = Tensor::view(const_cast<void*>(pool_.readable_data(master_)), DType::F32, pool_.device(),
                                       {layout_.slab_elements()});
    convert_f32(engine_weights(), master);
    copy_tensor_to_host(baseline_.data(), engine_weights());
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!owns(i)) continue;
      const std::string mismatch = baseline_mismatch(
          tensors[i].name, {dtype_, tensors[i].shape, baseline_of(tensors[i]).size(), true}, dtype_, tensors[i].shape);
      if (!mismatch.empty()) error += mismatch + "\n";
    }
    fail_together(comm_, error, kExitBadInput, "disk-delta baseline");
    version_ = 0;
    return;
  }

  // An HF folder: each source rank checks its share before anyone loads it.
  std::unique_ptr<SafetensorsCheckpoint> checkpoint;
  try {
    checkpoint = std::make_unique<SafetensorsCheckpoint>(settings_.baseline);
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!owns(i)) continue;
      const SafetensorsFile* file = checkpoint->file_of(tensors[i].name);
      if (!file) {
        error += "tensor " + tensors[i].name + ": missing from the baseline " + checkpoint->origin().string() + "\n";
        continue;
      }
      const SafetensorsEntry& entry = file->entry(tensors[i].name);
      const std::string mismatch = baseline_mismatch(tensors[i].name, {entry.dtype, entry.shape, entry.bytes, true}, dtype_, tensors[i].shape);
      if (!mismatch.empty()) error += mismatch + " (" + file->path().string() + ")\n";
    }
  } catch (const std::exception& e) {
    error += e.what();
  }
  fail_together(comm_, error, kExitBadInput, "disk-delta baseline");
  try {
    for (const ParameterInfo& info : tensors) {
      const std::span<const std::byte> bytes = checkpoint->file_of(info.name)->bytes(info.name);
      std::memcpy(baseline_of(info).data(), bytes.data(), bytes.size());
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  fail_together(comm_, error, kExitBadInput, "disk-delta baseline");
  copy_host_to_tensor(engine_weights(), baseline_.data());
  version_ = 0;
}

SyncReport DiskDeltaTransport::publish_and_apply() {
  const int64_t version = version_ + 1;
  const fs::path folder = delta_version_folder(settings_.path, version);
  const std::string file_name = delta_file_name(rank_, size_);
  const auto& tensors = layout_.tensors();
  // A failed version is not published: its files must not linger either.
  const auto fail_publish_together = [&](const std::string& error) {
    try {
      fail_together(comm_, error, kExitFailure, "disk-delta publish of " + folder.string());
    } catch (const RanksFailedError&) {
      std::error_code ignored;
      if (rank_ == 0) fs::remove_all(folder, ignored);
      throw;
    }
  };

  // Source side: encode this rank's share of the new weights, compress, write.
  auto start = std::chrono::steady_clock::now();
  DeltaWriteStats written;
  std::string error;
  try {
    fs::create_directories(folder);
    const float* master = static_cast<const float*>(pool_.readable_data(master_));
    // An offloaded trainer's master weights are read from their pinned host copy.
    const Device master_device = master_->residency == Residency::Resident ? pool_.device() : Device::CPU;
    std::vector<std::vector<std::byte>> states;
    std::vector<size_t> owned;
    for (size_t i = 0; i < tensors.size(); ++i)
      if (owns(i)) owned.push_back(i);
    states.reserve(owned.size());
    std::vector<DeltaTensor> deltas;
    std::vector<float> values;
    for (size_t i : owned) {
      const ParameterInfo& info = tensors[i];
      const size_t n = static_cast<size_t>(info.numel());
      values.resize(n);
      copy_tensor_to_host(values.data(), Tensor::view(const_cast<float*>(master) + info.offset, DType::F32, master_device, {info.numel()}));
      std::vector<std::byte>& state = states.emplace_back(n * dtype_size(dtype_));
      if (dtype_ == DType::F32) {
        std::memcpy(state.data(), values.data(), state.size());
      } else {
        uint16_t* out = reinterpret_cast<uint16_t*>(state.data());
#pragma omp parallel for schedule(static)
        for (size_t k = 0; k < n; ++k) out[k] = float_to_bf16(values[k]);
      }
      // The trainer's tensors are contiguous row-major views of its slab.
      const std::string mismatch = baseline_mismatch(info.name, {dtype_, info.shape, baseline_of(info).size(), true}, dtype_, info.shape);
      if (!mismatch.empty()) throw std::runtime_error(mismatch);
      deltas.push_back({info.name, dtype_, info.shape, baseline_of(info), state});
    }
    written = write_delta_file(folder / file_name, deltas, settings_.encoding, settings_.compression_level, rank_);
  } catch (const std::exception& e) {
    error = e.what();
  }
  fail_publish_together(error);
  // Every rank's file is complete (the gather above): the index publishes the version.
  if (rank_ == 0) {
    try {
      DeltaIndex index{version, 0, settings_.encoding, {}};
      for (size_t i = 0; i < tensors.size(); ++i)
        index.weight_map.emplace_back(tensors[i].name, delta_file_name(static_cast<int>(i % static_cast<size_t>(size_)), size_));
      write_delta_index(folder, index);
      for (const auto& [old, old_folder] : version_folders(settings_.path))
        if (old <= version - settings_.keep_versions) fs::remove_all(old_folder);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  fail_publish_together(error);
  double source_seconds = seconds_since(start);

  // Engine side: read the published version, decode, verify, apply in place.
  start = std::chrono::steady_clock::now();
  size_t read_bytes = 0;
  try {
    const DeltaIndex index = read_delta_index(folder);
    if (index.version != version || index.base_version != 0 || index.encoding != settings_.encoding)
      throw std::runtime_error((folder / kSafetensorsIndexName).string() + ": version " + std::to_string(index.version) + " of base " +
                               std::to_string(index.base_version) + ", " + delta_encoding_name(index.encoding) + ", expected " +
                               std::to_string(version) + " of base 0, " + delta_encoding_name(settings_.encoding));
    std::map<std::string, std::string> file_of(index.weight_map.begin(), index.weight_map.end());
    std::set<std::string> files;
    for (const ParameterInfo& info : tensors) {
      const auto found = file_of.find(info.name);
      if (found == file_of.end()) throw std::runtime_error((folder / kSafetensorsIndexName).string() + ": tensor " + info.name + " is missing");
      files.insert(found->second);
    }
    std::set<std::string> applied;
    DeltaApplyTarget target;
    target.baseline = [&](const std::string& name, DType dtype, const std::vector<int64_t>& shape) -> std::span<const std::byte> {
      const ParameterInfo* info = layout_.find(name);
      if (!info) throw std::runtime_error("tensor " + name + ": not in the model");
      if (dtype != dtype_ || shape != info->shape)
        throw std::runtime_error("tensor " + name + ": " + dtype_name(dtype) + " of shape " + std::to_string(shape.size()) +
                                 "-d in the delta, not the engine's " + dtype_name(dtype_) + " " + std::to_string(info->shape.size()) + "-d");
      return baseline_of(*info);
    };
    target.apply = [&](const std::string& name, std::span<const std::byte> state) {
      if (!applied.insert(name).second) throw std::runtime_error("tensor " + name + " is in two files");
      copy_host_to_tensor(engine_view(*layout_.find(name)), state.data());
    };
    for (const std::string& file : files) {
      for (const std::string& name : apply_delta_file(folder / file, settings_.encoding, target))
        if (file_of[name] != file) throw std::runtime_error("tensor " + name + " is in " + file + ", the index says " + file_of[name]);
      read_bytes += fs::file_size(folder / file);
    }
    if (applied.size() != tensors.size())
      throw std::runtime_error(folder.string() + ": " + std::to_string(tensors.size() - applied.size()) + " tensors of the index in no file");
  } catch (const std::exception& e) {
    error = e.what();
  }
  fail_together(comm_, error, kExitFailure, "disk-delta engine");
  double engine_seconds = seconds_since(start);
  version_ = version;

  unsigned long long sizes[] = {written.file_bytes, written.changed_bytes, written.total_bytes};
  MPI_Allreduce(MPI_IN_PLACE, sizes, 3, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm_);
  double times[] = {source_seconds, engine_seconds};
  MPI_Allreduce(MPI_IN_PLACE, times, 2, MPI_DOUBLE, MPI_MAX, comm_);
  SyncReport report;
  report.bytes = written.file_bytes + read_bytes;
  report.wire_bytes = sizes[0];
  report.density = sizes[2] ? static_cast<double>(sizes[1]) / static_cast<double>(sizes[2]) : 0.0;
  report.source_seconds = times[0];
  report.engine_seconds = times[1];
  report.seconds = times[0] + times[1];
  return report;
}

}  // namespace tandem
