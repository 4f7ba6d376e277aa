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

// Collective. Loads `restart` (a checkpoint path, "auto" or "never") and returns the path
// loaded, or nothing for a fresh start. Each checkpoint passed over adds a line to `notes`
// (and to the log as a warning). With "auto", checkpoint files none of which loads are a
// BadInputError listing why (a fresh start would overwrite the run's record).
std::optional<std::filesystem::path> resume_checkpoint(const std::filesystem::path& folder, const std::string& restart,
                                                       const CheckpointLoader& loader, MPI_Comm comm,
                                                       std::vector<std::string>& notes);

// Whether resume_checkpoint will start afresh, known before anything is loaded: `restart`
// is never, or auto and the folder holds no checkpoint (one that does not load fails the
// job rather than start it afresh).
bool starts_afresh(const std::filesystem::path& folder, const std::string& restart);

}  // namespace tandem
