// Which checkpoint a job resumes from. `restart = auto` takes the newest one that every
// rank loads and verifies (checksums, finite weights); one that fails is passed over with
// a warning naming the file and the tensor, and the next older one is tried, so a corrupt
// checkpoint cannot send an automatically resubmitted job into a crash loop.
#pragma once
#include <mpi.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"

namespace tandem {

struct CheckpointLoader {
  // Whether this job can resume the checkpoint at all (ranks, model): a failure is the
  // job's, not the file's, and ends the job instead of trying an older checkpoint.
  std::function<void(const Checkpoint&)> check_fits;
  // Reads the checkpoint into this rank's state; throws when its contents fail a check.
  std::function<void(const Checkpoint&)> load;
};

// What `restart` (a checkpoint path, "auto" or "never") resumes from, listed once before
// anything is loaded, so that what start-up lays out for a fresh start and what
// resume_checkpoint loads come from the same listing.
struct ResumeChoice {
  std::string restart;
  std::filesystem::path folder;
  std::vector<std::filesystem::path> candidates;  // newest first: the named one, or the folder's under auto

  // restart = never, or auto and the folder holds no checkpoint: resume_checkpoint loads
  // nothing (one that does not load fails the job rather than start it afresh).
  bool starts_afresh() const { return candidates.empty(); }
};
ResumeChoice choose_resume(const std::filesystem::path& folder, const std::string& restart);

// Collective. Loads the first of the choice's candidates that every rank loads and returns
// its path, or nothing for a fresh start. Each checkpoint passed over adds a line to
// `notes` (and to the log as a warning). With "auto", checkpoint files none of which loads
// are a BadInputError listing why (a fresh start would overwrite the run's record).
std::optional<std::filesystem::path> resume_checkpoint(const ResumeChoice& choice, const CheckpointLoader& loader,
                                                       MPI_Comm comm, std::vector<std::string>& notes);

}  // namespace tandem
