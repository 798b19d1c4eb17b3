/*
** cmd_role.c — `prl role NAME [options]`: dispatches to one process of the pipeline
** (docs/pipeline.md). Each role lives in its own cli/role_NAME.c and parses its options from
** argv[3]; a new role is one row of the table below.
*/
#include "cli/cli.h"

#include <string.h>

static const cli_command roles[] = {
    {"controller", cmd_role_controller, "owns run.db, leases work, records samples and steps"},
    {"trainer", cmd_role_trainer, "GRPO updates; writes and announces policy versions"},
    {"rollout", cmd_role_rollout, "generates samples with the infer path"},
    {"reward", cmd_role_reward, "scores samples with the domain verifiers"},
    {"teacher", cmd_role_teacher, "OPD: scores student samples with one domain expert at a time"},
    {"sandbox", cmd_role_sandbox, "runs programs for rollout and reward workers (--bind ENDPOINT)"},
};
enum { N_ROLES = sizeof roles / sizeof roles[0] };

static void usage(FILE *out)
{
    fprintf(out, "usage: prl role NAME [options]   (prl role NAME --help for details)\n\n"
                 "Runs one process of the pipeline (docs/pipeline.md).\n\nroles:\n");
    for (int i = 0; i < N_ROLES; i++) fprintf(out, "  %-10s %s\n", roles[i].name, roles[i].summary);
}

/* "controller, trainer, ..." for error messages. */
static void known_roles(char *out, size_t n)
{
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < N_ROLES && k < n; i++)
        k += (size_t)snprintf(out + k, n - k, "%s%s", i ? ", " : "", roles[i].name);
}

int cmd_role(int argc, char **argv)
{
    if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        usage(argc < 3 ? stderr : stdout);
        return argc < 3 ? 2 : 0;
    }
    for (int i = 0; i < N_ROLES; i++)
        if (!strcmp(argv[2], roles[i].name)) return roles[i].run(argc, argv);
    char known[256];
    known_roles(known, sizeof known);
    return cli_failf("role", 2, "unknown role '%s' (known roles: %s)", argv[2], known);
}
