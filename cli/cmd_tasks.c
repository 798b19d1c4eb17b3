/*
** cmd_tasks.c — `prl tasks generate|demos|check|demo`: task data of the four domains, their
** SFT demonstrations, scoring of answers with the verifiers of reward/, and the SFT demo set.
**
** Output goes to stdout or, with --out, to a file written atomically. `check` runs programs
** in the sandbox (roles/exec.c).
*/
#include "cli/cli.h"
#include "tasks/tasks.h"

#include <stdlib.h>
#include <string.h>

/* Run `write(c, f)` into --out atomically, or into stdout. */
static int write_output(const char *out, const prl_tasks_config *c)
{
    if (!out) {
        prl_status st = prl_tasks_write_jsonl(c, stdout);
        if (st == PRL_OK && fflush(stdout) != 0)
            st = prl_error_set(PRL_ERR_IO, "writing stdout failed");
        return st ? cli_fail("tasks") : 0;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return cli_failf("tasks", 1, "out of memory");
    prl_status st = prl_tasks_write_jsonl(c, mem);
    if (fclose(mem) != 0 && st == PRL_OK) st = prl_error_set(PRL_ERR_NOMEM, "buffering output");
    if (st == PRL_OK) st = prl_file_write_atomic(out, text, len);
    free(text);
    if (st) return cli_fail("tasks");
    fprintf(stderr, "prl tasks: wrote %d %s %s lines to %s\n", c->n,
            prl_tasks_domain_name(c->domain), prl_tasks_split_name(c->split), out);
    return 0;
}

/* generate and demos: the same flags, demos adds --error-rate (--tool-rate and --think-rate
** go with both). */
static int generate(int argc, char **argv, int demos)
{
    const char *domain = NULL, *split = "train", *out = NULL;
    prl_tasks_config c;
    prl_tasks_config_default(&c, PRL_TASK_REASONING);
    c.demos = demos;
    cli_opt opts[] = {
        {"domain", OPT_STR, &domain, "D", "reasoning, general, agent or coding", 1, 0},
        {"split", OPT_STR, &split, "S", "train or eval (default train)", 0, 0},
        {"n", OPT_INT, &c.n, "N", "number of problems (default 100)", 0, 0},
        {"seed", OPT_U64, &c.seed, "S", "seed (default 1)", 0, 0},
        {"difficulty", OPT_INT, &c.difficulty, "K", "1..3, or 0 for a mix (default 1)", 0, 0},
        {"out", OPT_STR, &out, "FILE", "JSONL file to write (default stdout)", 0, 0},
        /* demos only: generate ends the table here */
        {demos ? "error-rate" : NULL, OPT_DOUBLE, &c.error_rate, "P",
         "probability of a deliberate mistake per demonstration (default 0)", 0, 0},
        {"tool-rate", OPT_DOUBLE, &c.tool_rate, "P",
         "reasoning: probability of a python tool demonstration (default by difficulty)", 0, 0},
        {"think-rate", OPT_DOUBLE, &c.think_rate, "P",
         "modes: share of think demonstrations, the rest no-think, each prompt ending in its "
         "switch (docs/tasks.md \"Modes\"; default: no modes)",
         0, 0},
        {0},
    };
    const char *usage = demos
                            ? "prl tasks demos --domain D [--split train|eval] [--n N] [--seed S] "
                              "[--difficulty K] [--error-rate P] [--out FILE]"
                            : "prl tasks generate --domain D [--split train|eval] [--n N] "
                              "[--seed S] [--difficulty K] [--out FILE]";
    const char *summary = demos
                              ? "Writes N problems with SFT demonstrations (assistant and tool "
                                "turns) as chat JSONL (docs/tasks.md)."
                              : "Writes N problems (prompt + answer key or hidden tests) as JSONL "
                                "(docs/tasks.md).";
    int rc = cli_parse(argc, argv, 3, opts, usage, summary, NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (prl_tasks_domain_parse(domain, &c.domain) || prl_tasks_split_parse(split, &c.split))
        return cli_failf("tasks", 2, "%s", prl_error_message());
    if (c.n < 1) return cli_failf("tasks", 2, "--n must be >= 1, got %d", c.n);
    if (c.difficulty < 0 || c.difficulty > PRL_TASKS_MAX_DIFFICULTY)
        return cli_failf("tasks", 2, "--difficulty must be 0..3, got %d", c.difficulty);
    if (!(c.error_rate >= 0 && c.error_rate <= 1))
        return cli_failf("tasks", 2, "--error-rate must be in [0, 1], got %g", c.error_rate);
    if (c.tool_rate != -1 && !(c.tool_rate >= 0 && c.tool_rate <= 1)) /* -1: by difficulty */
        return cli_failf("tasks", 2, "--tool-rate must be in [0, 1], got %g", c.tool_rate);
    if (c.think_rate != -1 && !(c.think_rate >= 0 && c.think_rate <= 1)) /* -1: no modes */
        return cli_failf("tasks", 2, "--think-rate must be in [0, 1], got %g", c.think_rate);
    if (out && cli_require_new("tasks", "out", out)) return 2;
    return write_output(out, &c);
}

/* The SFT demo set (arithmetic chats), kept for scripts/run-demo.sh and the SFT tests. */
static int demo(int argc, char **argv)
{
    const char *usage = "prl tasks demo --out FILE.jsonl [--n N] [--seed S]";
    const char *summary = "Writes N arithmetic chat examples (the SFT demo set) as JSONL.";
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
    if (cli_require_new("tasks", "out", out)) return 2;
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return cli_failf("tasks", 1, "out of memory");
    prl_status st = prl_tasks_write_demo(mem, n, seed);
    if (fclose(mem) != 0 && st == PRL_OK) st = prl_error_set(PRL_ERR_NOMEM, "buffering output");
    if (st == PRL_OK) st = prl_file_write_atomic(out, text, len);
    free(text);
    if (st) return cli_fail("tasks");
    fprintf(stderr, "prl tasks: wrote %d examples to %s\n", n, out);
    return 0;
}

int cmd_tasks(int argc, char **argv)
{
    const char *sub = argc >= 3 ? argv[2] : "";
    if (!strcmp(sub, "generate")) return generate(argc, argv, 0);
    if (!strcmp(sub, "demos")) return generate(argc, argv, 1);
    if (!strcmp(sub, "check")) return cmd_tasks_check(argc, argv);
    if (!strcmp(sub, "demo")) return demo(argc, argv);
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h")) {
        printf("usage: prl tasks generate|demos|check|demo [options]   (--help on each)\n\n"
               "  generate  problems of one domain and split (prompt + answer key / hidden tests)\n"
               "  demos     the same problems with SFT demonstrations\n"
               "  check     score answers with the domain's verifier\n"
               "  demo      the arithmetic SFT demo set\n");
        return 0;
    }
    if (*sub)
        return cli_failf("tasks", 2, "unknown subcommand '%s'%s (generate, demos, check or demo)",
                         sub, cli_did_you_mean(sub, "generate|demos|check|demo"));
    return cli_failf("tasks", 2,
                     "expected a subcommand: generate, demos, check or demo (see prl "
                     "tasks --help)");
}
