// One job from a resolved deck: the world, the run folder, the colocated memory, the
// step loop with its handoffs, metrics and checkpoints, and the end-of-run summary.
#pragma once
#include <mpi.h>

#include "deck/deck.h"

namespace tandem {

// Collective over comm. Returns the process exit status; throws on errors, after which
// the caller aborts the job.
int run_job(const Deck& deck, MPI_Comm comm);

}  // namespace tandem
