#include "report/report_html.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>
#include <string>

#include "deck/deck.h"
#include "deck/deck_error.h"
#include "io/run_file.h"
#include "report/report_assets.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Four decimals are more than a plot or a tooltip shows, and keep a 64k-token sample's
// arrays a few hundred KiB each. NaN (not measured) becomes null.
json rounded(double value) {
  if (!std::isfinite(value)) return nullptr;
  return std::round(value * 1e4) / 1e4;
}

json rounded(const std::vector<float>& values) {
  json array = json::array();
  for (const float value : values) array.push_back(rounded(value));
  return array;
}

// The lowest and highest of the values as the page reads them (rounded), of a - b where b
// is given; null where none is finite. The page fixes a statistic's colour scale from
// these, so it need not go over every token of a long sample before it paints.
json range(const std::vector<float>& a, const std::vector<float>& b = {}) {
  double low = INFINITY, high = -INFINITY;
  for (size_t i = 0; i < a.size(); ++i) {
    const json x = rounded(a[i]), y = b.empty() ? json(0.0) : rounded(i < b.size() ? b[i] : NAN);
    if (x.is_null() || y.is_null()) continue;
    const double value = x.get<double>() - y.get<double>();
    low = std::min(low, value);
    high = std::max(high, value);
  }
  return low <= high ? json::array({low, high}) : json(nullptr);
}

json sample_json(const SampleRecord& sample) {
  return json{{"reward", rounded(sample.reward)},
              {"advantage", rounded(sample.advantage)},
              {"prompt", sample.prompt_pieces.empty() ? json::array({sample.prompt_text}) : json(sample.prompt_pieces)},
              {"completion", sample.completion_pieces.empty() ? json::array({sample.completion_text}) : json(sample.completion_pieces)},
              {"per_token", !sample.completion_pieces.empty()},
              {"rollout_lp", rounded(sample.rollout_logp)},
              {"train_lp", rounded(sample.train_logp)},
              {"entropy", rounded(sample.entropy)},
              {"ref_lp", rounded(sample.reference_logp)},
              {"ranges",
               {{"diff", range(sample.train_logp, sample.rollout_logp)},
                {"entropy", range(sample.entropy)},
                {"rollout_lp", range(sample.rollout_logp)},
                {"train_lp", range(sample.train_logp)},
                {"ref_lp", range(sample.reference_logp)}}}};
}

json run_json(const RunFile& run, int64_t sample_steps) {
  const RunInfo info = run.info();
  // The deck gives the group size: a step's samples are its groups, one after the other.
  // A deck this tandem no longer reads (an older run) leaves it unknown: one group per step.
  json group_size = nullptr;
  try {
    group_size = Deck::load_text(info.deck_text, run.path().string() + ": /deck", {}).get<int64_t>("grpo.group-size");
  } catch (const DeckError&) {
  }
  json data = {{"run",
                {{"path", run.path().string()},
                 {"version", info.version},
                 {"git_revision", info.git_revision},
                 {"started_at", info.started_at},
                 {"ranks", info.ranks},
                 {"devices", info.devices},
                 {"deck", info.deck_text}}},
               {"group_size", group_size},
               {"steps", run.steps()},
               {"metrics", json::object()},
               {"samples", json::array()}};
  for (const std::string& name : run.metric_names()) {
    json column = json::array();
    for (const double value : run.metric(name)) column.push_back(rounded(value));
    data["metrics"][name] = std::move(column);
  }
  std::vector<int64_t> steps = run.sample_steps();
  if (sample_steps > 0 && static_cast<int64_t>(steps.size()) > sample_steps) steps.erase(steps.begin(), steps.end() - sample_steps);
  data["sample_steps_left_out"] = run.sample_steps().size() - steps.size();
  for (const int64_t step : steps) {
    json samples = json::array();
    for (const SampleRecord& sample : run.samples(step)) samples.push_back(sample_json(sample));
    data["samples"].push_back({{"step", step}, {"samples", std::move(samples)}});
  }
  return data;
}

void replace_marker(std::string& page, const std::string& marker, const std::string& text) {
  const size_t at = page.find(marker);
  if (at == std::string::npos) throw std::logic_error("report page template lacks " + marker);
  page.replace(at, marker.size(), text);
}

}  // namespace

fs::path write_report(const fs::path& run_folder, const ReportSettings& settings) {
  const RunFile run = RunFile::open(run_folder / kRunFileName);
  // Inside <script type="application/json">, "</" could close the element: JSON allows "<\/".
  std::string data = run_json(run, settings.sample_steps).dump(-1, ' ', false, json::error_handler_t::replace);
  for (size_t at = data.find("</"); at != std::string::npos; at = data.find("</", at + 3)) data.replace(at, 2, "<\\/");
  std::string page = report_page_template();
  replace_marker(page, "/*TANDEM_CHART_JS*/", chart_js());
  replace_marker(page, "/*TANDEM_RUN_DATA*/", data);

  const fs::path target = settings.output.empty() ? run_folder / kReportFileName : settings.output;
  const fs::path temporary = target.parent_path() / ("." + target.filename().string() + ".tmp");
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << page;
    out.close();
    if (!out) throw std::runtime_error(temporary.string() + ": cannot write the report");
  }
  fs::rename(temporary, target);
  return target;
}

}  // namespace tandem
