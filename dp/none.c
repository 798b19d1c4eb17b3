/*
** none.c — dp.h without MPI (CMake found no MPI): joining a group is refused with the fix.
*/
#include "dp/dp.h"

int prl_dp_available(void) { return 0; }

prl_status prl_dp_init(prl_dp *d, int *argc, char ***argv)
{
    (void)argc, (void)argv;
    d->rank = 0, d->size = 1, d->active = 0;
    return prl_error_set(PRL_ERR_UNSUPPORTED, "this prl was built without MPI: install "
                                              "libopenmpi-dev and openmpi-bin "
                                              "(scripts/install-deps.sh) and rebuild");
}

void prl_dp_finalize(prl_dp *d) { (void)d; }
void prl_dp_abort(prl_dp *d, int code) { (void)d, (void)code; }

prl_status prl_dp_send(void *ctx, int to, const void *data, size_t bytes)
{
    (void)ctx, (void)to, (void)data, (void)bytes;
    return prl_error_set(PRL_ERR_UNSUPPORTED, "built without MPI");
}

prl_status prl_dp_recv(void *ctx, int from, void *data, size_t bytes)
{
    (void)ctx, (void)from, (void)data, (void)bytes;
    return prl_error_set(PRL_ERR_UNSUPPORTED, "built without MPI");
}

prl_status prl_dp_bcast(void *ctx, void *data, size_t bytes)
{
    (void)ctx, (void)data, (void)bytes;
    return prl_error_set(PRL_ERR_UNSUPPORTED, "built without MPI");
}
