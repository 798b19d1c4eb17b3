/*
** mpi.c — dp.h on Open MPI: MPI_COMM_WORLD with MPI_ERRORS_RETURN, non-blocking calls
** completed by a polling wait.
**
** Why poll: a blocking Open MPI call busy-waits at 100 % of a core. Ranks > 0 spend most of a
** run waiting for rank 0's next step; on a shared machine that would starve the rollout
** workers. The wait tests the request, yields for the first ~1 ms (a transfer in progress
** finishes at full speed), then sleeps 0.2 ms between tests, 2 ms after a second idle.
*/
#include "dp/dp.h"

#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <unistd.h>

enum { PIECE = 1 << 30 };

int prl_dp_available(void) { return 1; }

static prl_status mpi_error(int e, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(e, text, &n) != MPI_SUCCESS) n = 0;
    text[n] = 0;
    return prl_error_set(PRL_ERR_IO, "MPI %s: %s", what, n ? text : "error");
}

static prl_status wait_for(MPI_Request *rq, const char *what)
{
    double t0 = prl_now();
    for (long i = 0;; i++) {
        int done = 0, e = MPI_Test(rq, &done, MPI_STATUS_IGNORE);
        if (e != MPI_SUCCESS) return mpi_error(e, what);
        if (done) return PRL_OK;
        if (i < 1000) sched_yield();
        else usleep(prl_now() - t0 > 1.0 ? 2000 : 200);
    }
}

prl_status prl_dp_init(prl_dp *d, int *argc, char ***argv)
{
    d->rank = 0, d->size = 1, d->active = 0;
    int provided = 0, e = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (e != MPI_SUCCESS) return mpi_error(e, "init");
    d->active = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if ((e = MPI_Comm_rank(MPI_COMM_WORLD, &d->rank)) != MPI_SUCCESS ||
        (e = MPI_Comm_size(MPI_COMM_WORLD, &d->size)) != MPI_SUCCESS)
        return mpi_error(e, "rank and size");
    return PRL_OK;
}

void prl_dp_finalize(prl_dp *d)
{
    if (d->active) MPI_Finalize();
    d->active = 0;
}

void prl_dp_abort(prl_dp *d, int code)
{
    if (d->active) MPI_Abort(MPI_COMM_WORLD, code);
}

typedef enum { OP_SEND, OP_RECV, OP_BCAST } op_kind;

static const char *op_name(op_kind op)
{
    return op == OP_SEND ? "send" : op == OP_RECV ? "receive" : "broadcast";
}

/* One transfer of `bytes` (0 included) in pieces of at most PIECE; peer: to or from. */
static prl_status transfer(op_kind op, int peer, void *data, size_t bytes)
{
    size_t at = 0;
    do {
        size_t len = bytes - at < PIECE ? bytes - at : PIECE;
        char *p = (char *)data + at;
        MPI_Request rq;
        int e = op == OP_SEND   ? MPI_Isend(p, (int)len, MPI_BYTE, peer, 0, MPI_COMM_WORLD, &rq)
                : op == OP_RECV ? MPI_Irecv(p, (int)len, MPI_BYTE, peer, 0, MPI_COMM_WORLD, &rq)
                                : MPI_Ibcast(p, (int)len, MPI_BYTE, 0, MPI_COMM_WORLD, &rq);
        if (e != MPI_SUCCESS) return mpi_error(e, op_name(op));
        prl_status rc = wait_for(&rq, op_name(op));
        if (rc) return rc;
        at += len;
    } while (at < bytes);
    return PRL_OK;
}

prl_status prl_dp_send(void *ctx, int to, const void *data, size_t bytes)
{
    (void)ctx; /* MPI_Isend does not write the buffer */
    return transfer(OP_SEND, to, (void *)(uintptr_t)data, bytes);
}

prl_status prl_dp_recv(void *ctx, int from, void *data, size_t bytes)
{
    (void)ctx;
    return transfer(OP_RECV, from, data, bytes);
}

prl_status prl_dp_bcast(void *ctx, void *data, size_t bytes)
{
    (void)ctx;
    return transfer(OP_BCAST, 0, data, bytes);
}
