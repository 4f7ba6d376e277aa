// The run file survives crashes and full disks through a copy taken at each checkpoint.
//
// At a checkpoint step the order is: the checkpoint under its temporary name, the step's
// metrics row (and samples) appended to run.h5, a durable copy of run.h5 as
// run.ckpt_<step>.h5 (a companion of the checkpoint), and only then the checkpoint's
// commit. So whatever instant a kill lands on, every committed checkpoint has a run file
// holding exactly the rows up to its step: run.h5 itself, truncated, or, when a failed
// write (a full disk, a kill inside HDF5) left run.h5 unreadable or short, the copy.
// Between checkpoints run.h5 is appended in place; the copy costs one file copy per
// checkpoint (in the kernel, or a reflink where the file system shares blocks).
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "io/run_file.h"

namespace tandem {

// <folder>/run.ckpt_<step>.h5
std::filesystem::path run_file_copy_path(const std::filesystem::path& folder, int64_t step);

// The copy of <folder>/run.h5 for the checkpoint of `step`, durable when this returns.
void save_run_file_copy(const std::filesystem::path& folder, int64_t step);

// The run file of a job resuming from `checkpoint` at `step`: <folder>/run.h5 truncated
// after `step` when it opens and holds the row of `step`; otherwise the checkpoint's copy
// restored over it, with a note in `notes` saying why. Empty when there is neither.
// Throws when run.h5 is unusable and the copy is missing or unusable too.
std::optional<RunFile> resume_run_file(const std::filesystem::path& folder, const std::filesystem::path& checkpoint,
                                       int64_t step, std::vector<std::string>& notes);

}  // namespace tandem
