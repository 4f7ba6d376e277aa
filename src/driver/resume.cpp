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

ResumeChoice choose_resume(const std::filesystem::path& folder, const std::string& restart) {
  ResumeChoice choice{restart, folder, {}};
  if (restart == "auto")
    choice.candidates = checkpoints_newest_first(folder);
  else if (restart != "never")
    choice.candidates = {restart};
  return choice;
}

std::optional<std::filesystem::path> resume_checkpoint(const ResumeChoice& choice, const CheckpointLoader& loader,
                                                       MPI_Comm comm, std::vector<std::string>& notes) {
  if (choice.starts_afresh()) return std::nullopt;
  if (choice.restart != "auto") {
    const std::string error = load_on_every_rank(choice.restart, loader, comm);
    if (!error.empty())
      throw RanksFailedError(kExitBadInput, "run.restart = " + choice.restart + " cannot be resumed: " + error);
    return std::filesystem::path(choice.restart);
  }
  std::string reasons;
  for (const std::filesystem::path& candidate : choice.candidates) {
    const std::string error = load_on_every_rank(candidate, loader, comm);
    if (error.empty()) return candidate;
    notes.push_back("passed over " + candidate.string() + ": " + error);
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    if (rank == 0) TLOG(warning) << "restart = auto passes over " << candidate.string() << ": " << error;
    reasons += "\n  " + error;
  }
  throw RanksFailedError(kExitBadInput, "restart = auto: none of the " + std::to_string(choice.candidates.size()) +
                                            " checkpoints in " + choice.folder.string() +
                                            " loads (restart = never starts the run afresh):" + reasons);
}

}  // namespace tandem
