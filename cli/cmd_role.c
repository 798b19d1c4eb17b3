/*
** cmd_role.c — `prl role NAME ...`: run one role of a run as this process (docs/pipeline.md).
** `prl run` starts every role this way; `prl role NAME --connect ENDPOINT` joins a run from
** elsewhere.
*/
#include "cli/cli.h"

#include <string.h>

typedef struct role_entry {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} role_entry;

static const role_entry roles[] = {
    {"controller", cmd_role_controller, "owns run.db, leases work, records samples and steps"},
    {"rollout", cmd_role_rollout, "generates samples with the infer path"},
    {"reward", cmd_role_reward, "scores samples with the domain verifiers"},
    {"trainer", cmd_role_trainer, "GRPO updates; publishes policy versions"},
};
enum { N_ROLES = sizeof roles / sizeof roles[0] };

static void usage(FILE *out)
{
    fprintf(out, "usage: prl role NAME [options]   (prl role NAME --help for details)\n\n"
                 "Run one role of a training run as this process.\n\nroles:\n");
    for (int i = 0; i < N_ROLES; i++) fprintf(out, "  %-11s %s\n", roles[i].name, roles[i].summary);
}

int cmd_role(int argc, char **argv)
{
    if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        usage(argc < 3 ? stderr : stdout);
        return argc < 3 ? 2 : 0;
    }
    for (int i = 0; i < N_ROLES; i++)
        if (!strcmp(argv[2], roles[i].name)) return roles[i].run(argc, argv);
    fprintf(stderr, "prl role: unknown role '%s' (known:", argv[2]);
    for (int i = 0; i < N_ROLES; i++) fprintf(stderr, " %s", roles[i].name);
    fprintf(stderr, ")\n");
    return 2;
}
