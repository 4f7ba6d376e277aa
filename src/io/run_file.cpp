#include "io/run_file.h"

#include <cstdio>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>

#include "io/hdf5_file.h"

namespace tandem {

namespace {

using hdf5::check;
using hdf5::checked;
using hdf5::Handle;

constexpr const char* kFormat = "tandem run";
constexpr int64_t kFormatVersion = 1;
constexpr const char* kStepColumn = "step";
// 8 KiB chunks: one chunk write per step, and a thousand steps per chunk read.
constexpr hsize_t kRowsPerChunk = 1024;

struct Column {
  Handle dataset;
  std::string where;
};

Column open_column(const hdf5::Group& metrics, const std::string& name) {
  Column column{Handle(), metrics.file() + ": metric '" + name + "'"};
  column.dataset = checked(H5Dopen2(metrics.id(), name.c_str(), H5P_DEFAULT), H5Dclose, column.where + ": cannot open");
  return column;
}

// A 1-D column that grows without limit; rows never written read as `fill`.
Column create_column(const hdf5::Group& metrics, const std::string& name, hid_t type, const void* fill, hsize_t rows) {
  const size_t slash = name.rfind('/');
  std::optional<hdf5::Group> nested;
  if (slash != std::string::npos) nested = metrics.require_group(name.substr(0, slash));
  const hdf5::Group& parent = nested ? *nested : metrics;
  const std::string leaf = nested ? name.substr(slash + 1) : name;
  Column column{Handle(), metrics.file() + ": metric '" + name + "'"};
  const hsize_t maximum = H5S_UNLIMITED;
  Handle space = checked(H5Screate_simple(1, &rows, &maximum), H5Sclose, column.where + ": cannot create a dataspace");
  Handle creation = checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, column.where + ": cannot create a property list");
  check(H5Pset_chunk(creation.get(), 1, &kRowsPerChunk), column.where + ": cannot set the chunk size");
  check(H5Pset_fill_value(creation.get(), type, fill), column.where + ": cannot set the fill value");
  column.dataset =
      checked(H5Dcreate2(parent.id(), leaf.c_str(), type, space.get(), H5P_DEFAULT, creation.get(), H5P_DEFAULT),
              H5Dclose, column.where + ": cannot create");
  return column;
}

hsize_t rows_of(const Column& column) {
  Handle space = checked(H5Dget_space(column.dataset.get()), H5Sclose, column.where + ": cannot read the dataspace");
  hsize_t rows = 0;
  if (H5Sget_simple_extent_ndims(space.get()) != 1) throw std::runtime_error(column.where + " is not a 1-D dataset");
  check(H5Sget_simple_extent_dims(space.get(), &rows, nullptr), column.where + ": cannot read the length");
  return rows;
}

void resize(const Column& column, hsize_t rows) {
  check(H5Dset_extent(column.dataset.get(), &rows),
        column.where + ": cannot resize to " + std::to_string(rows) + " rows");
}

// One element at `row`, read or written through `memory_type`.
template <class Transfer>
void access_row(const Column& column, hsize_t row, Transfer transfer) {
  Handle file_space =
      checked(H5Dget_space(column.dataset.get()), H5Sclose, column.where + ": cannot read the dataspace");
  const hsize_t one = 1;
  check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &row, nullptr, &one, nullptr),
        column.where + ": cannot select row " + std::to_string(row));
  Handle memory_space =
      checked(H5Screate_simple(1, &one, nullptr), H5Sclose, column.where + ": cannot create a dataspace");
  transfer(memory_space.get(), file_space.get());
}

void write_row(const Column& column, hsize_t row, hid_t memory_type, const void* value) {
  access_row(column, row, [&](hid_t memory_space, hid_t file_space) {
    check(H5Dwrite(column.dataset.get(), memory_type, memory_space, file_space, H5P_DEFAULT, value),
          column.where + ": cannot write row " + std::to_string(row));
  });
}

int64_t read_step_row(const Column& column, hsize_t row) {
  int64_t value = 0;
  access_row(column, row, [&](hid_t memory_space, hid_t file_space) {
    check(H5Dread(column.dataset.get(), H5T_NATIVE_INT64, memory_space, file_space, H5P_DEFAULT, &value),
          column.where + ": cannot read row " + std::to_string(row));
  });
  return value;
}

template <class T>
std::vector<T> read_all(const Column& column, hid_t memory_type) {
  std::vector<T> values(rows_of(column));
  if (!values.empty())
    check(H5Dread(column.dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()),
          column.where + ": cannot read");
  return values;
}

std::vector<std::string> metric_names_in(const hdf5::Group& metrics) {
  std::vector<std::string> names = metrics.dataset_names();
  names.erase(std::remove(names.begin(), names.end(), kStepColumn), names.end());
  return names;
}

hdf5::File open_checked(const std::filesystem::path& path, hdf5::File::Access access) {
  hdf5::File file = hdf5::File::open(path, access);
  if (!file.has_attribute("format") || file.string_attribute("format") != kFormat)
    throw std::runtime_error(path.string() + ": not a tandem run file (no format attribute '" + kFormat + "')");
  const int64_t version = file.int_attribute("format_version");
  if (version > kFormatVersion)
    throw std::runtime_error(path.string() + ": run file format version " + std::to_string(version) +
                             " is newer than this tandem reads (" + std::to_string(kFormatVersion) + ")");
  return file;
}

}  // namespace

RunFile RunFile::create(const std::filesystem::path& path, const RunInfo& info) {
  if (std::filesystem::exists(path))
    throw std::runtime_error(path.string() +
                             ": run file already exists (a restart reopens it; a new run needs a new name)");
  if (info.ranks < 1 || info.devices.size() != static_cast<size_t>(info.ranks))
    throw std::invalid_argument(path.string() + ": run info lists " + std::to_string(info.devices.size()) +
                                " devices for " + std::to_string(info.ranks) + " ranks");
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  hdf5::File file = hdf5::File::create(path);
  file.set_attribute("format", kFormat);
  file.set_attribute("format_version", kFormatVersion);
  file.set_attribute("version", info.version);
  file.set_attribute("git_revision", info.git_revision);
  file.set_attribute("ranks", info.ranks);
  file.set_attribute("started_at", info.started_at);
  file.write_string("deck", info.deck_text);
  file.write_strings("devices", info.devices);
  {
    const hdf5::Group metrics = file.create_group("metrics");
    const int64_t no_step = 0;
    create_column(metrics, kStepColumn, H5T_STD_I64LE, &no_step, 0);
  }
  file.flush();
  file.close();
  return RunFile(path);
}

RunFile RunFile::open(const std::filesystem::path& path) {
  open_checked(path, hdf5::File::Access::ReadOnly).close();
  return RunFile(path);
}

RunInfo RunFile::info() const {
  hdf5::File file = open_checked(path_, hdf5::File::Access::ReadOnly);
  RunInfo info;
  info.deck_text = file.read_string("deck");
  info.version = file.string_attribute("version");
  info.git_revision = file.string_attribute("git_revision");
  info.ranks = file.int_attribute("ranks");
  info.devices = file.read_strings("devices");
  info.started_at = file.string_attribute("started_at");
  return info;
}

void RunFile::append_metrics(int64_t step, const MetricValues& values) const {
  const std::string where = path_.string();
  std::set<std::string> seen;
  for (const auto& [name, value] : values) {
    hdf5::validate_name(name, where);
    if (name == kStepColumn) throw std::invalid_argument(where + ": 'step' is reserved and cannot be a metric name");
    if (!seen.insert(name).second)
      throw std::invalid_argument(where + ": metric '" + name + "' given twice for step " + std::to_string(step));
  }
  hdf5::File file = open_checked(path_, hdf5::File::Access::ReadWrite);
  {
    const hdf5::Group metrics = file.group("metrics");
    const Column steps = open_column(metrics, kStepColumn);
    const hsize_t row = rows_of(steps);
    if (row > 0) {
      const int64_t last = read_step_row(steps, row - 1);
      if (step <= last)
        throw std::invalid_argument(where + ": metrics for step " + std::to_string(step) + " appended after step " +
                                    std::to_string(last));
    }
    const std::vector<std::string> existing = metric_names_in(metrics);
    resize(steps, row + 1);
    write_row(steps, row, H5T_NATIVE_INT64, &step);
    // Every column grows, so metrics missing from this step read as the NaN fill value.
    for (const auto& name : existing) resize(open_column(metrics, name), row + 1);
    const double missing = std::numeric_limits<double>::quiet_NaN();
    for (const auto& [name, value] : values) {
      const bool known = std::binary_search(existing.begin(), existing.end(), name);
      const Column column =
          known ? open_column(metrics, name) : create_column(metrics, name, H5T_IEEE_F64LE, &missing, row + 1);
      write_row(column, row, H5T_NATIVE_DOUBLE, &value);
    }
  }
  file.flush();
  file.close();
}

namespace {

std::string sample_group_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}

template <class T>
Tensor flat_view(const std::vector<T>& values, DType dtype) {
  return Tensor::view(const_cast<T*>(values.data()), dtype, Device::CPU, {static_cast<int64_t>(values.size())});
}

template <class T>
std::vector<T> read_flat(const hdf5::Group& group, const std::string& name, DType dtype) {
  const hdf5::TensorInfo info = group.tensor_info(name);
  std::vector<T> values(info.shape.empty() ? 1 : static_cast<size_t>(info.shape[0]));
  group.read_tensor(name, flat_view(values, dtype));
  return values;
}

}  // namespace

void RunFile::append_samples(int64_t step, const std::vector<SampleRecord>& samples) const {
  std::vector<std::string> prompt_texts, completion_texts;
  std::vector<int32_t> prompt_tokens, completion_tokens;
  std::vector<int64_t> prompt_offsets = {0}, completion_offsets = {0};
  std::vector<float> rollout_logp, train_logp, entropy, reference_logp, advantages;
  std::vector<double> rewards;
  std::vector<std::string> prompt_pieces, completion_pieces;
  std::vector<uint8_t> response_mask;
  const bool with_reference = !samples.empty() && std::all_of(samples.begin(), samples.end(), [](const SampleRecord& sample) {
    return sample.reference_logp.size() == sample.completion_tokens.size();
  });
  for (const SampleRecord& sample : samples) {
    const size_t n = sample.completion_tokens.size();
    if (sample.rollout_logp.size() != n || sample.train_logp.size() != n || sample.entropy.size() != n ||
        sample.completion_pieces.size() != n || sample.prompt_pieces.size() != sample.prompt_tokens.size() ||
        (with_reference && sample.reference_logp.size() != n))
      throw std::invalid_argument(path_.string() + ": a sample of step " + std::to_string(step) +
                                  " has per-token values that do not match its tokens");
    prompt_texts.push_back(sample.prompt_text);
    completion_texts.push_back(sample.completion_text);
    prompt_tokens.insert(prompt_tokens.end(), sample.prompt_tokens.begin(), sample.prompt_tokens.end());
    completion_tokens.insert(completion_tokens.end(), sample.completion_tokens.begin(), sample.completion_tokens.end());
    prompt_offsets.push_back(static_cast<int64_t>(prompt_tokens.size()));
    completion_offsets.push_back(static_cast<int64_t>(completion_tokens.size()));
    rollout_logp.insert(rollout_logp.end(), sample.rollout_logp.begin(), sample.rollout_logp.end());
    train_logp.insert(train_logp.end(), sample.train_logp.begin(), sample.train_logp.end());
    entropy.insert(entropy.end(), sample.entropy.begin(), sample.entropy.end());
    if (with_reference) reference_logp.insert(reference_logp.end(), sample.reference_logp.begin(), sample.reference_logp.end());
    prompt_pieces.insert(prompt_pieces.end(), sample.prompt_pieces.begin(), sample.prompt_pieces.end());
    completion_pieces.insert(completion_pieces.end(), sample.completion_pieces.begin(), sample.completion_pieces.end());
    response_mask.insert(response_mask.end(), sample.prompt_tokens.size(), 0);
    response_mask.insert(response_mask.end(), n, 1);
    advantages.push_back(sample.advantage);
    rewards.push_back(sample.reward);
  }
  hdf5::File file = open_checked(path_, hdf5::File::Access::ReadWrite);
  {
    const hdf5::Group all = file.require_group("samples");
    const std::string name = sample_group_name(step);
    if (all.contains(name)) all.remove(name);
    const hdf5::Group group = all.create_group(name);
    group.write_strings("prompt_text", prompt_texts);
    group.write_strings("completion_text", completion_texts);
    group.write_tensor("prompt_tokens", flat_view(prompt_tokens, DType::I32));
    group.write_tensor("completion_tokens", flat_view(completion_tokens, DType::I32));
    group.write_tensor("prompt_offsets", flat_view(prompt_offsets, DType::I64));
    group.write_tensor("completion_offsets", flat_view(completion_offsets, DType::I64));
    group.write_tensor("rollout_logp", flat_view(rollout_logp, DType::F32));
    group.write_tensor("train_logp", flat_view(train_logp, DType::F32));
    group.write_tensor("entropy", flat_view(entropy, DType::F32));
    if (with_reference) group.write_tensor("reference_logp", flat_view(reference_logp, DType::F32));
    group.write_strings("prompt_pieces", prompt_pieces);
    group.write_strings("completion_pieces", completion_pieces);
    group.write_tensor("response_mask", flat_view(response_mask, DType::U8));
    group.write_tensor("advantage", flat_view(advantages, DType::F32));
    group.write_tensor("reward", flat_view(rewards, DType::F64));
  }
  file.flush();
  file.close();
}

std::vector<SampleRecord> RunFile::samples(int64_t step) const {
  const hdf5::File file = open_checked(path_, hdf5::File::Access::ReadOnly);
  const hdf5::Group group = file.group("samples").group(sample_group_name(step));
  const auto prompt_texts = group.read_strings("prompt_text"), completion_texts = group.read_strings("completion_text");
  const auto prompt_tokens = read_flat<int32_t>(group, "prompt_tokens", DType::I32);
  const auto completion_tokens = read_flat<int32_t>(group, "completion_tokens", DType::I32);
  const auto prompt_offsets = read_flat<int64_t>(group, "prompt_offsets", DType::I64);
  const auto completion_offsets = read_flat<int64_t>(group, "completion_offsets", DType::I64);
  const auto rollout_logp = read_flat<float>(group, "rollout_logp", DType::F32);
  const auto train_logp = read_flat<float>(group, "train_logp", DType::F32);
  const auto advantages = read_flat<float>(group, "advantage", DType::F32);
  const auto rewards = read_flat<double>(group, "reward", DType::F64);
  // Columns added later: absent from older files.
  auto optional_floats = [&](const char* name) {
    return group.contains(name) ? read_flat<float>(group, name, DType::F32) : std::vector<float>();
  };
  auto optional_strings = [&](const char* name) {
    return group.contains(name) ? group.read_strings(name) : std::vector<std::string>();
  };
  const auto entropy = optional_floats("entropy"), reference_logp = optional_floats("reference_logp");
  const auto prompt_pieces = optional_strings("prompt_pieces"), completion_pieces = optional_strings("completion_pieces");
  std::vector<SampleRecord> samples(prompt_texts.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    SampleRecord& sample = samples[i];
    sample.prompt_text = prompt_texts[i];
    sample.completion_text = completion_texts[i];
    sample.prompt_tokens.assign(prompt_tokens.begin() + prompt_offsets[i], prompt_tokens.begin() + prompt_offsets[i + 1]);
    const auto from = completion_offsets[i], to = completion_offsets[i + 1];
    sample.completion_tokens.assign(completion_tokens.begin() + from, completion_tokens.begin() + to);
    sample.rollout_logp.assign(rollout_logp.begin() + from, rollout_logp.begin() + to);
    sample.train_logp.assign(train_logp.begin() + from, train_logp.begin() + to);
    if (!entropy.empty()) sample.entropy.assign(entropy.begin() + from, entropy.begin() + to);
    if (!reference_logp.empty()) sample.reference_logp.assign(reference_logp.begin() + from, reference_logp.begin() + to);
    if (!completion_pieces.empty()) sample.completion_pieces.assign(completion_pieces.begin() + from, completion_pieces.begin() + to);
    if (!prompt_pieces.empty())
      sample.prompt_pieces.assign(prompt_pieces.begin() + prompt_offsets[i], prompt_pieces.begin() + prompt_offsets[i + 1]);
    sample.advantage = advantages[i];
    sample.reward = rewards[i];
  }
  return samples;
}

std::vector<int64_t> RunFile::sample_steps() const {
  const hdf5::File file = open_checked(path_, hdf5::File::Access::ReadOnly);
  std::vector<int64_t> steps;
  if (!file.contains("samples")) return steps;
  for (const std::string& name : file.group("samples").dataset_names()) {
    const size_t slash = name.find('/');
    const int64_t step = std::stoll(name.substr(5, slash - 5));
    if (steps.empty() || steps.back() != step) steps.push_back(step);
  }
  return steps;
}

void RunFile::truncate_after(int64_t step) const {
  hdf5::File file = open_checked(path_, hdf5::File::Access::ReadWrite);
  if (file.contains("samples")) {
    const hdf5::Group all = file.group("samples");
    for (const std::string& name : all.dataset_names()) {
      const std::string group = name.substr(0, name.find('/'));
      if (std::stoll(group.substr(5)) > step && all.contains(group)) all.remove(group);
    }
  }
  {
    const hdf5::Group metrics = file.group("metrics");
    const Column steps = open_column(metrics, kStepColumn);
    const std::vector<int64_t> recorded = read_all<int64_t>(steps, H5T_NATIVE_INT64);
    const auto kept = static_cast<hsize_t>(std::upper_bound(recorded.begin(), recorded.end(), step) - recorded.begin());
    if (kept == recorded.size()) return;
    resize(steps, kept);
    for (const auto& name : metric_names_in(metrics)) {
      bool recorded_before = false;
      {
        const Column column = open_column(metrics, name);
        resize(column, kept);
        for (double value : read_all<double>(column, H5T_NATIVE_DOUBLE)) recorded_before |= !std::isnan(value);
      }
      // A metric first recorded after `step` did not exist yet in an uninterrupted run.
      if (!recorded_before) metrics.remove(name);
    }
  }
  file.flush();
  file.close();
}

namespace {

std::string job_group_name(size_t number) {
  char name[32];
  std::snprintf(name, sizeof name, "job_%04zu", number);
  return name;
}

}  // namespace

void RunFile::append_job(const JobRecord& job) const {
  hdf5::File file = open_checked(path_, hdf5::File::Access::ReadWrite);
  {
    const hdf5::Group all = file.require_group("jobs");
    size_t number = 1;
    while (all.contains(job_group_name(number))) ++number;
    const hdf5::Group group = all.create_group(job_group_name(number));
    group.set_attribute("started_at", job.started_at);
    group.set_attribute("resumed_from", job.resumed_from);
    group.set_attribute("resumed_step", job.resumed_step);
    group.write_string("deck", job.deck_text);
    group.write_strings("changed_keys", job.changed_keys);
    group.write_strings("notes", job.notes);
  }
  file.flush();
  file.close();
}

std::vector<JobRecord> RunFile::jobs() const {
  const hdf5::File file = open_checked(path_, hdf5::File::Access::ReadOnly);
  std::vector<JobRecord> jobs;
  if (!file.contains("jobs")) return jobs;
  const hdf5::Group all = file.group("jobs");
  for (size_t number = 1; all.contains(job_group_name(number)); ++number) {
    const hdf5::Group group = all.group(job_group_name(number));
    JobRecord job;
    job.started_at = group.string_attribute("started_at");
    job.resumed_from = group.string_attribute("resumed_from");
    job.resumed_step = group.int_attribute("resumed_step");
    job.deck_text = group.read_string("deck");
    job.changed_keys = group.read_strings("changed_keys");
    job.notes = group.read_strings("notes");
    jobs.push_back(std::move(job));
  }
  return jobs;
}

std::vector<int64_t> RunFile::steps() const {
  const hdf5::File file = open_checked(path_, hdf5::File::Access::ReadOnly);
  return read_all<int64_t>(open_column(file.group("metrics"), kStepColumn), H5T_NATIVE_INT64);
}

std::vector<std::string> RunFile::metric_names() const {
  const hdf5::File file = open_checked(path_, hdf5::File::Access::ReadOnly);
  return metric_names_in(file.group("metrics"));
}

std::vector<double> RunFile::metric(const std::string& name) const {
  const hdf5::File file = open_checked(path_, hdf5::File::Access::ReadOnly);
  const hdf5::Group metrics = file.group("metrics");
  if (name == kStepColumn || !metrics.contains(name))
    throw std::runtime_error(path_.string() + ": no metric '" + name + "' in /metrics");
  return read_all<double>(open_column(metrics, name), H5T_NATIVE_DOUBLE);
}

}  // namespace tandem
