/*
** cmd_tasks.c — `prl tasks demo`: the SFT demo data set.
*/
#include "cli/cli.h"
#include "tasks/tasks.h"

#include <string.h>

int cmd_tasks(int argc, char **argv)
{
    const char *usage = "prl tasks demo --out FILE.jsonl [--n N] [--seed S]";
    const char *summary = "Writes N arithmetic chat examples (the SFT demo set) as JSONL.";
    if (argc < 3 || strcmp(argv[2], "demo") != 0) {
        if (argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
            cli_print_help(stdout, usage, summary, NULL);
            return 0;
        }
        return cli_failf("tasks", 2, "expected a subcommand: demo (see prl tasks --help)");
    }
    const char *out = NULL;
    int n = 200;
    uint64_t seed = 1;
    cli_opt opts[] = {
        {"out", OPT_STR, &out, "FILE", "JSONL file to write", 1, 0},
        {"n", OPT_INT, &n, "N", "number of examples (default 200)", 0, 0},
        {"seed", OPT_U64, &seed, "S", "seed (default 1)", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 3, opts, usage, summary, NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (n < 1) return cli_failf("tasks", 2, "--n must be >= 1, got %d", n);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    FILE *f = fopen(tmp, "w");
    if (!f) return cli_failf("tasks", 1, "cannot create %s: %m", tmp);
    prl_status st = prl_tasks_write_demo(f, n, seed);
    if (fclose(f) != 0 && st == PRL_OK) st = prl_error_set(PRL_ERR_IO, "writing %s failed", tmp);
    if (st == PRL_OK && rename(tmp, out) != 0) st = prl_error_set(PRL_ERR_IO, "rename to %s: %m", out);
    if (st) {
        remove(tmp);
        return cli_fail("tasks");
    }
    fprintf(stderr, "prl tasks: wrote %d examples to %s\n", n, out);
    return 0;
}
