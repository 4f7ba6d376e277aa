// Every rank of a job must run the same deck: an MPMD launch (mpirun -np 1 tandem a.deck :
// -np 1 tandem b.deck) or a deck file edited while ranks start could give them different ones,
// and ranks training with different settings corrupt the run without any error.
#pragma once
#include <mpi.h>

#include "deck/deck.h"

namespace tandem {

// Collective. Compares a hash of each rank's resolved values (sources left out); where they
// differ, every rank throws the same RanksFailedError (bad input) naming each differing key
// with its value on that rank and on rank 0.
void require_same_deck_on_ranks(MPI_Comm comm, const Deck& deck);

}  // namespace tandem
