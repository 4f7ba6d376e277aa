#include "driver/resume.h"

#include "world/errors.h"
#include "world/log.h"
#include "world/world.h"

namespace tandem {

namespace {

// "" when every rank loaded `path`, else the first failing rank's reason.
std::string load_on_every_rank(const std::filesystem::path& path, const CheckpointLoader& loader, MPI_Comm comm) {
  std::string error;
  std::optional<Checkpoint> checkpoint;
  try {
    checkpoint.emplace(Checkpoint::open(path));
  } catch (const std::exception& failure) {
    error = failure.what();
  }
  if (checkpoint) {
    loader.check_fits(*checkpoint);  // the same verdict on every rank: not caught
    try {
      loader.load(*checkpoint);
    } catch (const std::exception& failure) {
      error = failure.what();
    }
  }
  for (const std::string& reason : all_gather_strings(comm, error))
    if (!reason.empty()) return reason;
  return "";
}

}  // namespace

std::optional<std::filesystem::path> resume_checkpoint(const std::filesystem::path& folder, const std::string& restart,
                                                       const CheckpointLoader& loader, MPI_Comm comm,
                                                       std::vector<std::string>& notes) {
  if (restart == "never") return std::nullopt;
  if (restart != "auto") {
    const std::string error = load_on_every_rank(restart, loader, comm);
    if (!error.empty()) throw RanksFailedError(kExitBadInput, "run.restart = " + restart + " cannot be resumed: " + error);
    return std::filesystem::path(restart);
  }
  const std::vector<std::filesystem::path> candidates = checkpoints_newest_first(folder);
  std::string reasons;
  for (const std::filesystem::path& candidate : candidates) {
    const std::string error = load_on_every_rank(candidate, loader, comm);
    if (error.empty()) return candidate;
    notes.push_back("passed over " + candidate.string() + ": " + error);
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    if (rank == 0) TLOG(warning) << "restart = auto passes over " << candidate.string() << ": " << error;
    reasons += "\n  " + error;
  }
  if (!candidates.empty())
    throw RanksFailedError(kExitBadInput, "restart = auto: none of the " + std::to_string(candidates.size()) + " checkpoints in " +
                        folder.string() + " loads (restart = never starts the run afresh):" + reasons);
  return std::nullopt;
}

bool starts_afresh(const std::filesystem::path& folder, const std::string& restart) {
  return restart == "never" || (restart == "auto" && checkpoints_newest_first(folder).empty());
}

}  // namespace tandem
