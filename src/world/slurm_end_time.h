// When the Slurm job this process runs in will be ended by its time limit.
#pragma once
#include <ctime>
#include <optional>
#include <string>

namespace tandem {

// None outside Slurm (no SLURM_JOB_ID). Read from SLURM_JOB_END_TIME when Slurm sets it,
// else asked of squeue (`squeue -h -j ID -o %e`); a job without a limit has none. `note`
// says why there is none where there should be one (squeue missing or unreadable).
std::optional<std::time_t> slurm_job_end_time(std::string& note);

}  // namespace tandem
