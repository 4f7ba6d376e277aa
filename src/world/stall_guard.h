// Waiting for the other ranks without a busy loop, and naming the rank that stops answering.
// The step's MPI collectives run non-blocking and wait here, testing with sleeps that grow
// to a millisecond (a SIGSTOPped or hung rank no longer keeps the others at 100% CPU).
// Each guarded collective also passes a token around the ring of ranks, so when one does
// not complete within world.stall-timeout the rank after the silent one names it and the
// collective it did not reach, and the job ends (exit code 1).
#pragma once
#include <mpi.h>

namespace tandem {

// Collective over comm (duplicates it for the tokens). timeout_seconds 0: wait forever.
void set_stall_timeout(MPI_Comm comm, double timeout_seconds);

// Waits for `request` (a non-blocking collective on every rank: `what` names it in the report).
void wait_for_ranks(MPI_Request request, const char* what);

// MPI_Allreduce and MPI_Allgather that wait through wait_for_ranks.
void all_reduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm, const char* what);
void all_gather(const void* send, int count, MPI_Datatype type, void* receive, MPI_Comm comm, const char* what);

}  // namespace tandem
