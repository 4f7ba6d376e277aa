// Which optimizer trains the policy and with what constants: the [optimizer] section of
// the deck, built into this struct by the driver (optimizer_settings_from_deck). The
// learning rate is not here: it comes per step from the schedules of grpo.lr and sft.lr.
#pragma once
#include <filesystem>
#include <string>
#include <utility>

#include "train/adamw.h"

namespace tandem {

enum class OptimizerKind {
  AdamW,  // every tensor
  Muon,   // the layers' 2-D matrices (q, k, v, o, gate, up, down); AdamW the rest
};
OptimizerKind optimizer_kind_from_name(const std::string& name);  // "adamw" | "muon"
const char* optimizer_kind_name(OptimizerKind kind);
// "beta1,beta2", each in [0, 1): throws std::invalid_argument saying what is wrong.
std::pair<double, double> parse_betas(const std::string& text);

enum class OptimizerStateLocation { Device, Host, Disk };
OptimizerStateLocation optimizer_state_location_from_name(const std::string& name);  // device | host | disk

struct OptimizerSettings {
  OptimizerKind kind = OptimizerKind::AdamW;
  // AdamW's betas, eps and weight decay; lr is set per step. Under Muon they serve the
  // tensors Muon does not take, and the weight decay serves Muon's matrices too.
  AdamWSettings adamw;
  double momentum = 0.95;  // Muon's Nesterov momentum
  // Where the state lives: beside the master weights, or in host memory (pinned on CUDA)
  // or an OptimizerStateFile under state_path (empty: the run folder), whence each step
  // streams it through two device slots of chunk_bytes (optimizer_state_chunks.h).
  OptimizerStateLocation state = OptimizerStateLocation::Device;
  std::filesystem::path state_path;
  size_t chunk_bytes = size_t{64} << 20;
};

}  // namespace tandem
