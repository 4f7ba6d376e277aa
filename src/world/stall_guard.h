// Waiting for the other ranks without a busy loop, and naming the rank that stops answering.
// The step's MPI collectives run non-blocking and wait here: until every rank has arrived
// (an MPI_Ibarrier beside the collective), testing with sleeps that grow to a millisecond
// (a SIGSTOPped or hung rank no longer keeps the others at 100% CPU); from then on,
// testing without sleeps, since MPI moves a large message only while it is called.
// Each guarded collective also passes a token around the ring of its communicator's ranks,
// so when one does not complete within world.stall-timeout the rank after the silent one
// names it and the collective it did not reach, and the job ends (exit code 1). It asks
// first: a silent rank that is itself waiting (in any collective) answers, and is left to
// name the rank it waits for, so that the rank that stopped is the one named. Each
// communicator has its own ring: ranks that split into groups (trainer and rollout ranks)
// run different numbers of collectives, and a token must only wait on a rank that joins
// the same collective.
#pragma once
#include <mpi.h>

#include <functional>

namespace tandem {

// Collective over comm, the job's (duplicates it for the tokens): guards its collectives
// and forgets the communicators guarded before. timeout_seconds 0: wait forever.
void set_stall_timeout(MPI_Comm comm, double timeout_seconds);
// Collective over comm, a group of the job's ranks: guards its collectives too, until
// stop_guarding(comm) (before comm is freed).
void guard_collectives_on(MPI_Comm comm);
void stop_guarding(MPI_Comm comm);

// Waits for `request` (a non-blocking collective on every rank of comm: `what` names it
// in the report). A communicator that is not guarded waits without tokens. `between_tests`
// runs after each test that finds the request pending: work that must go on meanwhile,
// such as receiving the messages the other ranks send before they join.
void wait_for_ranks(MPI_Request request, const char* what, MPI_Comm comm, const std::function<void()>& between_tests = {});

// MPI_Allreduce and MPI_Allgather that wait through wait_for_ranks.
void all_reduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm, const char* what);
void all_gather(const void* send, int count, MPI_Datatype type, void* receive, MPI_Comm comm, const char* what);

}  // namespace tandem
