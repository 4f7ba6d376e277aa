// report.html of a run folder: one static file with everything inlined (the run's data,
// the page's script, Chart.js), so it opens from a scratch disk with no server and no
// network. Plots of the metrics against the step, and a token view of the samples.
#pragma once
#include <cstdint>
#include <filesystem>

namespace tandem {

inline constexpr const char* kReportFileName = "report.html";

struct ReportSettings {
  // The token view holds the samples of the latest this many sample steps (0: all): a
  // step of 256 samples of 500 tokens is several MB of page.
  int64_t sample_steps = 8;
  std::filesystem::path output;  // empty: <run folder>/report.html
};

// Reads <run_folder>/run.h5 and writes the report atomically: a reader never sees half a
// page. Returns the path written.
std::filesystem::path write_report(const std::filesystem::path& run_folder, const ReportSettings& settings = {});

}  // namespace tandem
