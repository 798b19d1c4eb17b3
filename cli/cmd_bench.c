/*
** cmd_bench.c — `prl bench NAME [options]`: dispatches to one benchmark. Each lives in its
** own cli/bench_NAME.c (what they share is bench.c, behind the private bench.h); a new bench
** is one row of the table below.
*/
#include "cli/bench.h"

#include <string.h>

static const cli_command benches[] = {
    {"train", cmd_bench_train, "training step vs PyTorch"},
    {"decode", cmd_bench_decode, "KV-cached decoding vs PyTorch"},
    {"sandbox", cmd_bench_sandbox, "sandboxed vs bare executions"},
    {"pipeline", cmd_bench_pipeline, "prl run in sync vs async mode"},
    {"load", cmd_bench_load, "checkpoint loading: time and peak memory"},
    {"gateway", cmd_bench_gateway, "the gateway under load: latency and tokens/s"},
    {"sft", cmd_bench_sft, "SFT tokens/s with and without packing"},
    {"controller", cmd_bench_controller, "one controller and N simulated workers: leases/s, CPU"},
    {"trainer-ranks", cmd_bench_ranks, "the trainer's step time per rank count (MPI)"},
    {"dsa", cmd_bench_dsa, "DSA sparse attention vs the masked dense kernel, T = 512..4096"},
};
enum { N_BENCHES = sizeof benches / sizeof benches[0] };

int cmd_bench(int argc, char **argv)
{
    for (int i = 0; argc >= 3 && i < N_BENCHES; i++)
        if (!strcmp(argv[2], benches[i].name)) return benches[i].run(argc, argv);
    FILE *out =
        argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) ? stdout : stderr;
    if (out == stderr && argc >= 3) {
        char names[128];
        cli_command_names(benches, N_BENCHES, names, sizeof names);
        fprintf(stderr, "prl bench: unknown benchmark '%s'%s\n", argv[2],
                cli_did_you_mean(argv[2], names));
    }
    for (int i = 0; i < N_BENCHES; i++) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "prl bench %s [options]", benches[i].name);
        fprintf(out, "%s %-28s  %s (prl bench %s --help)\n", i ? "      " : "usage:", cmd,
                benches[i].summary, benches[i].name);
    }
    return out == stdout ? 0 : 2;
}
