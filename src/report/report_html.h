// report.html of a run folder: one static file with everything inlined (the run's data,
// the page's script, Chart.js), so it opens from a scratch disk with no server and no
// network. Plots of the metrics against the step, and a token view of the samples.
#pragma once
#include <filesystem>

namespace tandem {

inline constexpr const char* kReportFileName = "report.html";

// Reads <run_folder>/run.h5 and writes <run_folder>/report.html (or `output` when given)
// atomically: a reader never sees half a page. Returns the path written.
std::filesystem::path write_report(const std::filesystem::path& run_folder, const std::filesystem::path& output = {});

}  // namespace tandem
