#include "inspect/inspect_command.h"

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "deck/command_flags.h"
#include "inspect/tensor_summary.h"
#include "io/checkpoint.h"
#include "io/checksum.h"
#include "io/hdf5_file.h"
#include "io/run_file.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kExitDamaged = 1;
constexpr int kExitBadInput = 2;

// Shown when --metrics is not given: the ones a user looks at first, where recorded.
const char* const kDefaultMetrics[] = {"reward_mean", "accuracy", "loss", "kl", "entropy", "grad_norm", "response_length"};

struct Options {
  fs::path file;
  std::vector<std::string> metrics;  // empty: kDefaultMetrics
  int64_t last = 10;
  bool csv = false, as_json = false, verify = false;
};

// A failure of the file itself (not of the request): reported with exit code 1.
struct Damaged : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

// ---- run files ------------------------------------------------------------------------

json metrics_table(const RunFile& run, const Options& options, const std::vector<int64_t>& steps) {
  const std::vector<std::string> names = run.metric_names();
  std::vector<std::string> shown = options.metrics;
  if (shown.empty())
    for (const char* name : kDefaultMetrics)
      if (std::binary_search(names.begin(), names.end(), name)) shown.push_back(name);
  for (const std::string& name : shown)
    if (!std::binary_search(names.begin(), names.end(), name))
      throw std::invalid_argument("no metric '" + name + "' in " + run.path().string() + " (it has " +
                                  std::to_string(names.size()) + "; --json lists them)");
  const size_t count = std::min(steps.size(), static_cast<size_t>(std::max<int64_t>(options.last, 0)));
  const size_t first = steps.size() - count;
  json rows = json::array();
  for (size_t row = first; row < steps.size(); ++row) rows.push_back(json{{"step", steps[row]}});
  for (const std::string& name : shown) {
    const std::vector<double> values = run.metric(name);
    for (size_t row = first; row < steps.size(); ++row) rows[row - first][name] = values[row];
  }
  return json{{"names", names}, {"shown", shown}, {"rows", rows}};
}

// time/<phase>: seconds per step; memory/<tag>/{device,host}_peak: bytes per step.
json phase_and_memory_summary(const RunFile& run) {
  json phases = json::object(), memory = json::object();
  for (const std::string& name : run.metric_names()) {
    const std::vector<double> values = run.metric(name);
    double total = 0, peak = 0;
    int64_t recorded = 0;
    for (double value : values)
      if (!std::isnan(value)) total += value, peak = std::max(peak, value), ++recorded;
    if (name.rfind("time/", 0) == 0) {
      phases[name.substr(5)] = {{"total_s", total}, {"mean_s", recorded ? total / recorded : 0.0}};
    } else if (name.rfind("memory/", 0) == 0) {
      // memory/device_peak, memory/<tag>/device_peak and their host_peak twins; other
      // memory metrics (per phase) are in the table and the report.
      const size_t slash = name.rfind('/');
      const std::string tag = slash > 6 ? name.substr(7, slash - 7) : std::string();
      const std::string kind = name.substr(slash + 1);
      if (tag.find('/') == std::string::npos && (kind == "device_peak" || kind == "host_peak"))
        memory[tag.empty() ? "(all)" : tag][kind + "_bytes"] = peak;
    }
  }
  return json{{"phase_seconds", phases}, {"memory_peak", memory}};
}

json inspect_run(const fs::path& path, const Options& options, json& problems) {
  const RunFile run = RunFile::open(path);
  const RunInfo info = run.info();
  const std::vector<int64_t> steps = run.steps();
  json report = {{"kind", "run"},          {"path", path.string()},       {"version", info.version},
                 {"git_revision", info.git_revision}, {"started_at", info.started_at}, {"ranks", info.ranks},
                 {"devices", info.devices}, {"deck", info.deck_text},
                 {"steps", {{"count", steps.size()}, {"first", steps.empty() ? 0 : steps.front()},
                            {"last", steps.empty() ? 0 : steps.back()}}},
                 {"sample_steps", run.sample_steps()}};
  report["metrics"] = metrics_table(run, options, steps);
  report.update(phase_and_memory_summary(run));
  if (options.verify) {
    // Every column and every sample group read back in full; each failure named.
    for (const std::string& name : run.metric_names()) try {
        if (run.metric(name).size() != steps.size())
          problems.push_back("metric '" + name + "' has a length other than the step column's");
      } catch (const std::exception& e) {
        problems.push_back(e.what());
      }
    for (int64_t step : run.sample_steps()) try {
        run.samples(step);
      } catch (const std::exception& e) {
        problems.push_back(e.what());
      }
  }
  return report;
}

// ---- checkpoints ----------------------------------------------------------------------

json inspect_checkpoint(const fs::path& path, const Options& options, json& problems) {
  const Checkpoint checkpoint = Checkpoint::open(path);
  json tensors = json::array();
  uint64_t bytes = 0;
  std::vector<unsigned char> buffer;
  for (const hdf5::TensorInfo& info : checkpoint.tensors()) {
    json entry = {{"name", info.name}, {"dtype", dtype_name(info.dtype)}, {"shape", info.shape}};
    try {
      const TensorSummary summary = summarize_checkpoint_tensor(checkpoint, info, buffer);
      entry["norm"] = summary.norm;
      entry["xxh3"] = checksum_hex(summary.xxh3);
      entry["finite"] = summary.finite;
      bytes += summary.bytes;
      if (!summary.finite) problems.push_back(path.string() + ": tensor '" + info.name + "' holds NaN or Inf");
    } catch (const std::exception& e) {
      // Without --verify the first unreadable tensor ends the listing.
      if (!options.verify) throw Damaged(e.what());
      problems.push_back(e.what());
    }
    tensors.push_back(entry);
  }
  return json{{"kind", "checkpoint"},
              {"path", path.string()},
              {"version", checkpoint.version()},
              {"git_revision", checkpoint.git_revision()},
              {"step", checkpoint.step()},
              {"data_cursor", checkpoint.data_cursor()},
              {"ranks", checkpoint.rng_states().size()},
              {"deck", checkpoint.deck_text()},
              {"tensor_bytes", bytes},
              {"tensors", tensors}};
}

// ---- text rendering -------------------------------------------------------------------

std::string number(const json& value) {
  if (value.is_null()) return "-";  // NaN: not recorded that step
  if (value.is_number_integer()) return std::to_string(value.get<int64_t>());
  const double x = value.get<double>();
  char text[32];
  const double magnitude = std::fabs(x);
  std::snprintf(text, sizeof text, magnitude != 0 && (magnitude < 1e-3 || magnitude >= 1e6) ? "%.4g" : "%.4f", x);
  return text;
}

std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) bytes /= 1024, ++unit;
  char text[32];
  std::snprintf(text, sizeof text, unit ? "%.1f %s" : "%.0f %s", bytes, units[unit]);
  return text;
}

void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows, const std::string& indent) {
  std::vector<size_t> widths;
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) {
      if (widths.size() <= c) widths.push_back(0);
      widths[c] = std::max(widths[c], row[c].size());
    }
  for (const auto& row : rows) {
    out << indent;
    for (size_t c = 0; c < row.size(); ++c) {
      // The first column (names) left-aligned, numbers right-aligned.
      if (c == 0) out << std::left << std::setw(static_cast<int>(widths[c])) << row[c];
      else out << "  " << std::right << std::setw(static_cast<int>(widths[c])) << row[c];
    }
    out << "\n";
  }
}

void print_deck(std::ostream& out, const std::string& deck) {
  out << "deck:\n";
  std::stringstream lines(deck);
  for (std::string line; std::getline(lines, line);) out << "  " << line << "\n";
}

void print_metrics_csv(std::ostream& out, const json& metrics) {
  out << "step";
  for (const auto& name : metrics["shown"]) out << "," << name.get<std::string>();
  out << "\n";
  for (const auto& row : metrics["rows"]) {
    out << row["step"].get<int64_t>();
    for (const auto& name : metrics["shown"]) {
      const json& value = row[name.get<std::string>()];
      out << ",";
      if (!value.is_null()) out << std::setprecision(17) << value.get<double>();
    }
    out << "\n";
  }
}

void print_run(std::ostream& out, const json& run) {
  out << "run file " << run["path"].get<std::string>() << "\n"
      << "  tandem " << run["version"].get<std::string>() << " (" << run["git_revision"].get<std::string>()
      << "), started " << run["started_at"].get<std::string>() << "\n"
      << "  ranks " << run["ranks"] << ":\n";
  for (const auto& device : run["devices"]) out << "    " << device.get<std::string>() << "\n";
  const json& steps = run["steps"];
  out << "  steps done " << steps["count"];
  if (steps["count"].get<int64_t>() > 0) out << " (" << steps["first"] << " to " << steps["last"] << ")";
  out << "\n  samples at steps ";
  if (run["sample_steps"].empty()) out << "none (run.samples-every = 0, or no such step yet)";
  for (size_t i = 0; i < run["sample_steps"].size(); ++i) out << (i ? ", " : "") << run["sample_steps"][i];
  out << "\n\n";
  print_deck(out, run["deck"].get<std::string>());

  const json& metrics = run["metrics"];
  out << "\nlast " << metrics["rows"].size() << " steps (" << metrics["names"].size()
      << " metrics recorded; --metrics a,b --last N picks):\n";
  std::vector<std::vector<std::string>> table{{"step"}};
  for (const auto& name : metrics["shown"]) table[0].push_back(name.get<std::string>());
  for (const auto& row : metrics["rows"]) {
    table.push_back({number(row["step"])});
    for (const auto& name : metrics["shown"]) table.back().push_back(number(row[name.get<std::string>()]));
  }
  print_table(out, table, "  ");

  out << "\ntime per phase:\n";
  std::vector<std::vector<std::string>> phases{{"phase", "total s", "mean s/step"}};
  for (const auto& [phase, seconds] : run["phase_seconds"].items())
    phases.push_back({phase, number(seconds["total_s"]), number(seconds["mean_s"])});
  print_table(out, phases, "  ");

  out << "\npeak memory per tag (over the steps):\n";
  std::vector<std::vector<std::string>> memory{{"tag", "device", "host"}};
  for (const auto& [tag, peaks] : run["memory_peak"].items())
    memory.push_back({tag, bytes_text(peaks.value("device_peak_bytes", 0.0)), bytes_text(peaks.value("host_peak_bytes", 0.0))});
  print_table(out, memory, "  ");
}

void print_checkpoint(std::ostream& out, const json& checkpoint) {
  out << "checkpoint " << checkpoint["path"].get<std::string>() << "\n"
      << "  tandem " << checkpoint["version"].get<std::string>() << " ("
      << checkpoint["git_revision"].get<std::string>() << ")\n"
      << "  step " << checkpoint["step"] << ", data cursor " << checkpoint["data_cursor"] << ", "
      << checkpoint["ranks"] << " rank RNG states\n"
      << "  " << checkpoint["tensors"].size() << " tensors, "
      << bytes_text(checkpoint["tensor_bytes"].get<double>()) << "\n\n";
  print_deck(out, checkpoint["deck"].get<std::string>());
  out << "\n";
  std::vector<std::vector<std::string>> table{{"tensor", "dtype", "shape", "norm", "xxh3-64"}};
  for (const auto& tensor : checkpoint["tensors"]) {
    std::string shape;
    for (const auto& extent : tensor["shape"]) shape += (shape.empty() ? "" : "x") + std::to_string(extent.get<int64_t>());
    table.push_back({tensor["name"].get<std::string>(), tensor["dtype"].get<std::string>(), shape.empty() ? "scalar" : shape,
                     tensor.contains("norm") ? number(tensor["norm"]) : "unreadable",
                     tensor.value("xxh3", std::string("-"))});
  }
  print_table(out, table, "  ");
}

// ---- what the file is -----------------------------------------------------------------

enum class Kind { Run, Checkpoint };

// A missing file, one that is not HDF5, or HDF5 that is not tandem's: std::invalid_argument
// (bad input). HDF5 that cannot be opened, e.g. truncated: Damaged.
Kind kind_of(const fs::path& path) {
  if (!fs::is_regular_file(path)) throw std::invalid_argument(path.string() + ": no such file");
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw std::invalid_argument(path.string() + ": not an HDF5 file, so neither a tandem run file nor a checkpoint");
  std::string format;
  try {
    const hdf5::File file = hdf5::File::open(path, hdf5::File::Access::ReadOnly);
    if (file.has_attribute("format")) format = file.string_attribute("format");
  } catch (const std::exception& e) {
    throw Damaged(std::string(e.what()) + " (damaged or truncated)");
  }
  if (format == "tandem run") return Kind::Run;
  if (format == "tandem checkpoint") return Kind::Checkpoint;
  throw std::invalid_argument(path.string() + ": an HDF5 file, but not a tandem run file or checkpoint (format attribute " +
                              (format.empty() ? std::string("missing") : "'" + format + "'") + ")");
}

}  // namespace

int inspect_command(int argc, char** argv, std::ostream& out, std::ostream& err) {
  namespace po = boost::program_options;
  po::options_description flags_spec(
      "tandem inspect FILE: what a run file (run.h5) or a checkpoint (ckpt_*.h5) holds.\n"
      "A run file: version, deck, ranks and devices, steps, the last metrics, time per phase,\n"
      "peak memory per tag, the steps with samples. A checkpoint: step, data cursor, every\n"
      "tensor with dtype, shape, L2 norm and xxh3-64 checksum of its bytes.\n"
      "Exit 0: read whole; 1: damaged (the object named); 2: not a tandem file, or bad flags");
  std::string metrics;
  flags_spec.add_options()
      ("file", po::value<std::string>()->value_name("FILE")->required(), "run.h5 or ckpt_*.h5 (also the first positional)")
      ("metrics", po::value<std::string>(&metrics)->value_name("A,B"), "metrics of the table (default: reward_mean, accuracy, loss, kl, entropy, grad_norm, response_length)")
      ("last", po::value<int64_t>()->value_name("N")->default_value(10), "rows of the table: the last N steps")
      ("csv", po::bool_switch(), "print only the metrics table, as CSV")
      ("json", po::bool_switch(), "print everything as one JSON object")
      ("verify", po::bool_switch(), "read every object and list each that fails; exit 1 if any")
      ("help", "print this help");
  po::positional_options_description positional;
  positional.add("file", 1);
  po::variables_map flags;
  if (const auto status = parse_command_flags("inspect", argc, argv, flags_spec, flags, out, err, positional))
    return *status;
  Options options;
  options.file = flags["file"].as<std::string>();
  options.metrics = split_commas(metrics);
  options.last = flags["last"].as<int64_t>();
  options.csv = flags["csv"].as<bool>();
  options.as_json = flags["json"].as<bool>();
  options.verify = flags["verify"].as<bool>();

  json problems = json::array();
  json report;
  try {
    const Kind kind = kind_of(options.file);
    if (options.csv && kind != Kind::Run) throw std::invalid_argument("--csv is for run files (a checkpoint has no metrics)");
    try {
      report = kind == Kind::Run ? inspect_run(options.file, options, problems)
                                 : inspect_checkpoint(options.file, options, problems);
    } catch (const std::invalid_argument&) {
      throw;
    } catch (const Damaged&) {
      throw;
    } catch (const std::exception& e) {
      throw Damaged(e.what());
    }
  } catch (const Damaged& e) {
    err << "tandem inspect: " << e.what() << "\n";
    return kExitDamaged;
  } catch (const std::exception& e) {
    err << "tandem inspect: " << e.what() << "\n";
    return kExitBadInput;
  }
  if (options.verify) report["verify"] = {{"ok", problems.empty()}, {"problems", problems}};
  if (options.as_json) {
    out << report.dump(2) << "\n";
  } else if (options.csv) {
    print_metrics_csv(out, report["metrics"]);
  } else {
    if (report["kind"] == "run") print_run(out, report);
    else print_checkpoint(out, report);
    if (options.verify) {
      out << "\nverify: " << (problems.empty() ? "every object read back whole" : std::to_string(problems.size()) + " problem(s)") << "\n";
      for (const auto& problem : problems) out << "  " << problem.get<std::string>() << "\n";
    }
  }
  return options.verify && !problems.empty() ? kExitDamaged : 0;
}

}  // namespace tandem
