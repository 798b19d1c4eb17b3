/*
** dp.h — the one public header of dp/: data-parallel ranks of one process group on Open MPI
** (MPI_COMM_WORLD), for the trainer's ranks (`trainer.ranks`, docs/scale-out.md "Trainer
** ranks"). Blocking byte transfers whose waits poll and sleep instead of spinning, so ranks
** waiting for rank 0 leave the CPU to the run's other roles; every MPI error is returned
** (MPI_ERRORS_RETURN) as PRL_ERR_IO naming the transfer. A rank that dies ends the whole
** group (mpirun's rule), which is how a dead rank fails the step.
**
** Built without MPI (CMake found none), prl_dp_init fails with a clear error and nothing
** else may be called.
*/
#ifndef PRL_DP_H
#define PRL_DP_H

#include "engine/engine.h"

typedef struct prl_dp {
    int rank, size;
    int active; /* MPI initialised here (prl_dp_finalize finalises it) */
} prl_dp;

/* 1 when prl was built with MPI. */
int prl_dp_available(void);
/* Join the group (MPI_Init_thread, funneled: MPI is called from one thread only). */
prl_status prl_dp_init(prl_dp *d, int *argc, char ***argv);
void prl_dp_finalize(prl_dp *d);
/* End every rank of the group at once (a rank that cannot go on). */
void prl_dp_abort(prl_dp *d, int code);

/* Transfers of `bytes` bytes (any size: sent in pieces of at most 1 GiB); ctx is the
** prl_dp (these are prl_grpo_comm's functions). Pairs of ranks see their messages in order. */
prl_status prl_dp_send(void *ctx, int to, const void *data, size_t bytes);
prl_status prl_dp_recv(void *ctx, int from, void *data, size_t bytes);
/* Rank 0's bytes to every rank. */
prl_status prl_dp_bcast(void *ctx, void *data, size_t bytes);

#endif /* PRL_DP_H */
