#include "world/slurm_end_time.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace tandem {

namespace {

// squeue prints the end time as local time, 2026-12-01T21:05:33.
std::optional<std::time_t> parse_local_time(const std::string& text) {
  std::tm fields{};
  if (!strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &fields)) return std::nullopt;
  fields.tm_isdst = -1;
  const std::time_t time = std::mktime(&fields);
  if (time == -1) return std::nullopt;
  return time;
}

}  // namespace

std::optional<std::time_t> slurm_job_end_time(std::string& note) {
  const char* job = std::getenv("SLURM_JOB_ID");
  if (!job || !*job) return std::nullopt;
  if (const char* end = std::getenv("SLURM_JOB_END_TIME"); end && *end) {
    char* rest = nullptr;
    const long long seconds = std::strtoll(end, &rest, 10);
    if (*rest == '\0' && seconds > 0) return static_cast<std::time_t>(seconds);
  }
  const std::string command = "squeue -h -j " + std::string(job) + " -o %e 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    note = "cannot run squeue";
    return std::nullopt;
  }
  char line[128] = {};
  const bool read = std::fgets(line, sizeof line, pipe) != nullptr;
  pclose(pipe);
  std::string text = read ? line : "";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.empty() || text == "N/A" || text == "NONE" || text == "Unknown") {
    if (text.empty()) note = "squeue gave no end time for job " + std::string(job);
    return std::nullopt;
  }
  const auto time = parse_local_time(text);
  if (!time) note = "cannot read squeue's end time '" + text + "'";
  return time;
}

}  // namespace tandem
