#include "io/run_file_copy.h"

#include <stdexcept>

#include "io/checkpoint.h"
#include "io/durable_file.h"
#include "world/errors.h"

namespace tandem {

namespace {

// run.h5 truncated after `step`, or the reason it cannot serve a resume from `step`.
std::string reuse_after_truncating(const std::filesystem::path& path, int64_t step) {
  if (!std::filesystem::exists(path)) return "it is missing";
  try {
    const RunFile run = RunFile::open(path);
    run.truncate_after(step);
    const std::vector<int64_t> steps = run.steps();
    const int64_t last = steps.empty() ? 0 : steps.back();
    if (last != step) return "its last row is step " + std::to_string(last) + ", not " + std::to_string(step);
    return "";
  } catch (const std::exception& error) {
    return error.what();
  }
}

}  // namespace

std::filesystem::path run_file_copy_path(const std::filesystem::path& folder, int64_t step) {
  return folder / checkpoint_companion_name("run", step);
}

void save_run_file_copy(const std::filesystem::path& folder, int64_t step) {
  durable_copy(folder / kRunFileName, run_file_copy_path(folder, step));
}

std::optional<RunFile> resume_run_file(const std::filesystem::path& folder, const std::filesystem::path& checkpoint,
                                       int64_t step, std::vector<std::string>& notes) {
  const std::filesystem::path path = folder / kRunFileName;
  const std::filesystem::path copy = run_file_copy_path(checkpoint.parent_path(), step);
  const std::string why = reuse_after_truncating(path, step);
  if (why.empty()) return RunFile::open(path);
  if (!std::filesystem::exists(copy)) {
    if (!std::filesystem::exists(path)) return std::nullopt;
    throw BadInputError(path.string() + " cannot continue from step " + std::to_string(step) + " (" + why +
                        ") and there is no copy " + copy.string() + " to restore it from");
  }
  const std::string error = reuse_after_truncating(copy, step);
  if (!error.empty())
    throw BadInputError(path.string() + " cannot continue from step " + std::to_string(step) + " (" + why +
                        "), nor can its copy " + copy.string() + " (" + error + ")");
  durable_copy(copy, path);
  notes.push_back(path.string() + " was restored from " + copy.string() + ": " + why);
  return RunFile::open(path);
}

}  // namespace tandem
