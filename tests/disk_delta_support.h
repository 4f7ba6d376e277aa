// What the disk-delta run tests share: decoding a published version the way an engine
// does, and which metrics are the transport's own (or timings) rather than the run's.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "sync/delta_format.h"
#include "tiny_hf_folder.h"

namespace tandem::testing {

inline constexpr int kDiskDeltaSteps = 3;
// The first sync publishes version 1 (the trainer's weights at the start), each step one more.
inline constexpr int kDiskDeltaNewestVersion = kDiskDeltaSteps + 1;

// A tiny pretrained model and prompts in dir.
inline ModelConfig write_disk_delta_inputs(const TempDir& dir) {
  const ModelConfig config = write_tiny_hf_model(dir / "model");
  write_text(dir / "prompts.jsonl",
             "{\"prompt\": \"What is 2+3?\", \"answer\": 5}\n{\"prompt\": \"What is 7-4?\", \"answer\": 3}\n"
             "{\"prompt\": \"What is 1+1?\", \"answer\": 2}\n{\"prompt\": \"What is 9-2?\", \"answer\": 7}\n");
  return config;
}

// The tandem command line of a short run on them, by `ranks` ranks, with a checkpoint at the end.
inline std::string disk_delta_run(const TempDir& dir, const std::string& name, const std::string& device, int ranks,
                                  const std::string& extra) {
  return tandem_binary() + " --world.device=" + device + " --run.output-dir=" + dir.path().string() + " --run.name=" + name +
         " --model.path=" + (dir / "model").string() + " --task.name=jsonl --task.path=" + (dir / "prompts.jsonl").string() +
         " --task.reward=last-number --task.prompts-per-step=" + std::to_string(ranks) +
         " --grpo.group-size=2 --grpo.max-new-tokens=4 --grpo.lr=1e-3 --sft.steps=0 --run.steps=" + std::to_string(kDiskDeltaSteps) +
         " --run.checkpoint-every=" + std::to_string(kDiskDeltaSteps) + " " + extra;
}

// The weights a published version decodes to: the baseline with every file of the index applied.
inline std::map<std::string, std::vector<std::byte>> decode_version(const std::filesystem::path& folder,
                                                                    const SafetensorsCheckpoint& baseline) {
  const DeltaIndex index = read_delta_index(folder);
  std::map<std::string, std::vector<std::byte>> weights;
  DeltaApplyTarget target;
  target.baseline = [&](const std::string& name, DType, const std::vector<int64_t>&) { return baseline.file_of(name)->bytes(name); };
  target.state = [&](const std::string& name) -> std::span<std::byte> {
    weights[name].resize(baseline.file_of(name)->bytes(name).size());
    return weights[name];
  };
  std::set<std::string> files;
  for (const auto& [tensor, file] : index.weight_map) files.insert(file);
  for (const std::string& file : files) apply_delta_file(folder / file, index.encoding, target);
  EXPECT_EQ(weights.size(), index.weight_map.size());
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
