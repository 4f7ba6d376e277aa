// SIGTERM (Slurm's time limit, scancel), SIGINT (Ctrl-C) and SIGUSR1 (sbatch --signal, and
// what mpirun forwards) ask the job to stop cleanly at the next step boundary; a second
// one ends the process at once, as if no handler were there.
#pragma once
#include <string>

namespace tandem {

// Installs the handlers (after MPI_Init, which may install its own).
void install_stop_signals();
// The first stop signal this process received, or 0.
int stop_signal_received();
// "SIGTERM", "SIGINT", "SIGUSR1" or "signal N".
std::string signal_name(int signal);

}  // namespace tandem
