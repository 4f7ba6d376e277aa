// What the disk-delta run tests share: decoding a published version the way an engine
// does (onto the bytes of its base version), and which metrics are the transport's own
// (or timings) rather than the run's.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "sync/delta_format.h"
#include "tiny_hf_folder.h"

namespace tandem::testing {

inline constexpr int kDiskDeltaSteps = 3;
// A fresh run's first sync publishes nothing (the engines hold the trainer's weights): step
// s publishes version s.
inline constexpr int kDiskDeltaNewestVersion = kDiskDeltaSteps;

// A tiny pretrained model and prompts in dir.
inline ModelConfig write_disk_delta_inputs(const TempDir& dir) {
  const ModelConfig config = write_tiny_hf_model(dir / "model");
  write_text(dir / "prompts.jsonl",
             "{\"prompt\": \"What is 2+3?\", \"answer\": 5}\n{\"prompt\": \"What is 7-4?\", \"answer\": 3}\n"
             "{\"prompt\": \"What is 1+1?\", \"answer\": 2}\n{\"prompt\": \"What is 9-2?\", \"answer\": 7}\n");
  return config;
}

// The tandem command line of a short run on them, by `ranks` ranks, with a checkpoint at
// every step (the weights each version is against).
inline std::string disk_delta_run(const TempDir& dir, const std::string& name, const std::string& device, int ranks,
                                  const std::string& extra) {
  return tandem_binary() + " --world.device=" + device + " --run.output-dir=" + dir.path().string() + " --run.name=" + name +
         " --model.path=" + (dir / "model").string() + " --task.name=jsonl --task.path=" + (dir / "prompts.jsonl").string() +
         " --task.reward=last-number --task.prompts-per-step=" + std::to_string(ranks) +
         " --grpo.group-size=2 --grpo.max-new-tokens=4 --grpo.lr=1e-3 --sft.steps=0 --run.steps=" + std::to_string(kDiskDeltaSteps) +
         " --run.checkpoint-every=1 --run.keep-checkpoints=" + std::to_string(kDiskDeltaSteps) + " " + extra;
}

using TensorBytes = std::map<std::string, std::vector<std::byte>>;

// Every tensor's bytes in an HF folder.
inline TensorBytes tensor_bytes(const SafetensorsCheckpoint& folder) {
  TensorBytes bytes;
  for (const std::string& name : folder.names()) {
    const auto tensor = folder.file_of(name)->bytes(name);
    bytes[name].assign(tensor.begin(), tensor.end());
  }
  return bytes;
}

// Applies a published version onto `weights`, the bytes of its base version, the way an
// engine does: they are the version's after it. Returns the changed bytes its files count.
inline size_t apply_version(const std::filesystem::path& folder, TensorBytes& weights) {
  const DeltaIndex index = read_delta_index(folder);
  const HeldBytes held = [&](const std::string& name, DType, const std::vector<int64_t>&) -> std::span<std::byte> {
    return weights.at(name);
  };
  std::set<std::string> files;
  for (const auto& [tensor, file] : index.weight_map) files.insert(file);
  size_t decoded = 0, changed = 0;
  for (const std::string& file : files) {
    decoded += apply_delta_file(folder / file, index.encoding, held).tensors.size();
    const SafetensorsFile written(folder / file);
    for (const auto& [key, value] : written.metadata())
      if (weights.count(key)) changed += nlohmann::json::parse(value).at("changed_bytes").get<size_t>();
  }
  EXPECT_EQ(decoded, index.weight_map.size());
  return changed;
}

// The FP32 master weights of a run's checkpoint at `step`, by tensor of the model folder.
inline TensorBytes master_weights(const std::filesystem::path& run, int step, const SafetensorsCheckpoint& model) {
  const Checkpoint checkpoint = Checkpoint::open(run / checkpoint_file_name(step));
  TensorBytes weights;
  for (const std::string& name : model.names()) {
    const SafetensorsEntry& entry = model.file_of(name)->entry(name);
    std::vector<std::byte>& bytes = weights[name];
    bytes.resize(static_cast<size_t>(entry.bytes));
    checkpoint.read_tensor("master." + name, Tensor::view(bytes.data(), DType::F32, Device::CPU, entry.shape));
  }
  return weights;
}

inline bool is_transport_specific(const std::string& metric) {
  for (const char* prefix : {"sync/", "time/", "memory/"})
    if (metric.rfind(prefix, 0) == 0) return true;
  const std::string timing = "seconds";  // timings differ run to run
  const bool is_timing = metric.size() >= timing.size() && metric.compare(metric.size() - timing.size(), timing.size(), timing) == 0;
  return is_timing || metric.find("_per_s") != std::string::npos;
}

}  // namespace tandem::testing
