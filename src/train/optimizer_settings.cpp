#include "train/optimizer_settings.h"

#include <cstdlib>
#include <stdexcept>

namespace tandem {

OptimizerKind optimizer_kind_from_name(const std::string& name) {
  if (name == "adamw") return OptimizerKind::AdamW;
  if (name == "muon") return OptimizerKind::Muon;
  throw std::invalid_argument("unknown optimizer '" + name + "': expected adamw or muon");
}

std::pair<double, double> parse_betas(const std::string& text) {
  const size_t comma = text.find(',');
  const std::string expected = "expected two numbers in [0, 1) separated by a comma, as 0.9,0.99";
  if (comma == std::string::npos) throw std::invalid_argument("'" + text + "': " + expected);
  double betas[2];
  const std::string parts[2] = {text.substr(0, comma), text.substr(comma + 1)};
  for (int i = 0; i < 2; ++i) {
    const char* begin = parts[i].c_str();
    char* end = nullptr;
    betas[i] = std::strtod(begin, &end);
    while (end && (*end == ' ' || *end == '\t')) ++end;
    if (end == begin || *end != '\0' || !(betas[i] >= 0 && betas[i] < 1))
      throw std::invalid_argument("'" + text + "': " + expected);
  }
  return {betas[0], betas[1]};
}

OptimizerStateLocation optimizer_state_location_from_name(const std::string& name) {
  if (name == "device") return OptimizerStateLocation::Device;
  if (name == "host") return OptimizerStateLocation::Host;
  if (name == "disk") return OptimizerStateLocation::Disk;
  throw std::invalid_argument("unknown optimizer state location '" + name + "': expected device, host or disk");
}

const char* optimizer_kind_name(OptimizerKind kind) { return kind == OptimizerKind::Muon ? "muon" : "adamw"; }

}  // namespace tandem
