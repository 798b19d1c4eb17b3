/*
** bench.h — private to `prl bench` (cmd_bench.c, bench.c, bench_*.c): the benches'
** entry points and what they share. Everything else in cli/ includes cli/cli.h only.
*/
#ifndef PRL_CLI_BENCH_H
#define PRL_CLI_BENCH_H

#include "cli/cli.h"

#ifndef PRL_SOURCE_DIR
#define PRL_SOURCE_DIR "."
#endif

/* `prl bench NAME [options]`: argv[2] is NAME, the options start at argv[3]. Exit codes as
** cli.h says (0, 2 for bad usage, 1 otherwise). */
int cmd_bench_train(int argc, char **argv);      /* bench_train.c: a training step vs PyTorch */
int cmd_bench_decode(int argc, char **argv);     /* bench_decode.c: KV-cached decoding vs PyTorch */
int cmd_bench_sandbox(int argc, char **argv);    /* bench_sandbox.c: sandboxed vs bare executions */
int cmd_bench_pipeline(int argc, char **argv);   /* bench_pipeline.c: prl run, sync vs async */
int cmd_bench_load(int argc, char **argv);       /* bench_load.c: checkpoint load time, memory */
int cmd_bench_gateway(int argc, char **argv);    /* bench_gateway.c: the gateway under load */
int cmd_bench_sft(int argc, char **argv);        /* bench_sft.c: SFT tokens/s, packed or not */
int cmd_bench_controller(int argc, char **argv); /* bench_controller.c: leases/s, CPU */
int cmd_bench_ranks(int argc, char **argv); /* bench_ranks.c: step time per trainer rank count */
int cmd_bench_dsa(int argc, char **argv);   /* bench_dsa.c: sparse vs masked dense DSA attention */

/* The bench's temporary directory $TMPDIR/prl-bench-NAME-XXXXXX (/tmp by default), made on the first call (later
** calls return the same one): the bench's own, removed with everything in it when the
** process exits, returns from main or is stopped by SIGINT/SIGTERM — unless
** bench_tmpdir_keep() was called, which names it instead. NULL with the error set when it
** cannot be made. */
const char *bench_tmpdir(const char *name);
void bench_tmpdir_keep(void);

/* The median of v[0..n), n >= 1 (sorts v in place). */
double bench_median(double *v, int n);

/* Run the PyTorch reference as a child process — `'python' 'reference' ARGS`, ARGS from fmt —
** with prl's BLAS core and thread count in its environment (OPENBLAS_CORETYPE,
** OPENBLAS_NUM_THREADS, OMP_NUM_THREADS), and parse the first JSON object of its output
** (up to 1 MiB) into *root (caller decrefs; NULL when there is none). *out (may be NULL) gets
** that output, NUL-terminated (caller frees). A child that cannot start or exits non-zero is
** PRL_ERR_IO naming the command. */
prl_status bench_reference(const char *python, const char *reference, json_t **root, char **out,
                           const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#endif /* PRL_CLI_BENCH_H */
