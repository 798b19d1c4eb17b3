/*
** cmd_sandbox.c — `prl sandbox exec` (run one program in the sandbox) and `prl sandbox
** probe` (which isolation layers this host supports).
**
** probe also prints the policy a sandbox here enforces: the mode, the socket families
** allowed, the system calls refused and the limits (defaults and maxima).
**
** exec prints the program's stdout on stdout and its stderr on stderr, then a one-line
** summary on stderr; exit code 0 when the status is ok, 1 otherwise (2: bad usage). With
** --json the result JSON (docs/sandbox.md) is printed instead, whatever the status.
*/
#include "cli/cli.h"
#include "sandbox/sandbox.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Concurrent `prl sandbox exec` processes must not share slot uids (RLIMIT_NPROC counts per
** uid, and without a pid namespace a uid is the only wall between runs): derive the base
** from our pid, which is unique among running processes. */
static unsigned cli_uid_base(void) { return 200000u + (unsigned)getpid(); }

static int open_sandbox(prl_sandbox **sb, prl_sandbox_caps *caps, int warm)
{
    prl_sandbox_options opt;
    prl_sandbox_options_default(&opt);
    opt.warm = warm;
    if (prl_sandbox_probe(caps) != PRL_OK) return cli_fail("sandbox");
    opt.caps = caps;
    opt.uid_base = cli_uid_base();
    if (prl_sandbox_init(sb, &opt) != PRL_OK) return cli_fail("sandbox");
    return 0;
}

static void print_summary(const prl_sandbox_result *r)
{
    fprintf(stderr, "prl sandbox: %s: %s; wall %.3f s, cpu %.3f s, peak memory %.1f MiB%s%s\n",
            prl_sandbox_status_name(r->status), r->reason, r->wall_seconds, r->cpu_seconds,
            (double)r->peak_memory_bytes / (1 << 20), r->out_truncated ? ", stdout truncated" : "",
            r->err_truncated ? ", stderr truncated" : "");
}

static int sandbox_exec(int argc, char **argv)
{
    const char *lang = NULL, *file = NULL, *stdin_file = NULL;
    prl_sandbox_limits lim;
    prl_sandbox_limits_default(&lim);
    uint64_t memory_mb = lim.memory_bytes >> 20, output_kb = lim.output_bytes >> 10,
             fsize_mb = lim.file_size_bytes >> 20, disk_mb = lim.disk_bytes >> 20;
    int json = 0, warm = 0;
    cli_opt opts[] = {
        {"lang", OPT_STR, &lang, "LANG", "python3 or sh", 1, 0},
        {"warm", OPT_FLAG, &warm, NULL,
         "python3: start from a pre-started interpreter (docs/sandbox.md \"Warm runs\")", 0, 0},
        {"file", OPT_STR, &file, "FILE", "the program to run", 1, 0},
        {"stdin", OPT_STR, &stdin_file, "FILE",
         "bytes for the program's stdin (default: none, EOF)", 0, 0},
        {"cpu", OPT_DOUBLE, &lim.cpu_seconds, "S", "CPU seconds per process (default 11)", 0, 0},
        {"wall", OPT_DOUBLE, &lim.wall_seconds, "S", "wall-clock seconds (default 10)", 0, 0},
        {"memory", OPT_U64, &memory_mb, "MB", "memory of the whole tree in MiB (default 1024)", 0,
         0},
        {"output", OPT_U64, &output_kb, "KB", "KiB kept per output stream (default 1024)", 0, 0},
        {"output-kill", OPT_FLAG, &lim.output_kill, NULL,
         "kill the program when an output passes the cap", 0, 0},
        {"procs", OPT_INT, &lim.processes, "N", "processes + threads (default 64)", 0, 0},
        {"files", OPT_INT, &lim.open_files, "N", "open files per process (default 64)", 0, 0},
        {"fsize", OPT_U64, &fsize_mb, "MB", "largest file in MiB (default 16)", 0, 0},
        {"disk", OPT_U64, &disk_mb, "MB", "size of the work dir and of /tmp in MiB (default 64)", 0,
         0},
        {"json", OPT_FLAG, &json, NULL, "print the result as JSON", 0, 0},
        {0},
    };
    const char *usage =
        "prl sandbox exec --lang python3|sh --file FILE [--warm] [--stdin FILE] [limits] [--json]";
    int rc =
        cli_parse(argc, argv, 3, opts, usage,
                  "Runs a program in the sandbox (namespaces, seccomp, Landlock, rlimits, cgroups) "
                  "and reports its status, output, time and memory.",
                  NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (strcmp(lang, "python3") != 0 && strcmp(lang, "sh") != 0)
        return cli_failf("sandbox", 2, "unknown --lang '%s' (python3 or sh)", lang);
    if (memory_mb > ((uint64_t)1 << 40) || output_kb > ((uint64_t)1 << 40) ||
        fsize_mb > ((uint64_t)1 << 40) || disk_mb > ((uint64_t)1 << 40))
        return cli_failf("sandbox", 2, "--memory, --output, --fsize and --disk must be below 2^40");
    lim.memory_bytes = memory_mb << 20, lim.output_bytes = output_kb << 10;
    lim.file_size_bytes = fsize_mb << 20, lim.disk_bytes = disk_mb << 20;
    prl_sandbox_request req = {.lang = lang, .limits = lim};
    char *program = NULL, *input = NULL;
    if (prl_file_read(file, &program, &req.program_len) != PRL_OK) return cli_fail("sandbox");
    req.program = program;
    if (stdin_file && prl_file_read(stdin_file, &input, &req.stdin_len) != PRL_OK) {
        free(program);
        return cli_fail("sandbox");
    }
    req.stdin_data = input;
    prl_sandbox *sb = NULL;
    prl_sandbox_caps caps;
    if (open_sandbox(&sb, &caps, warm)) {
        free(program), free(input);
        return 1;
    }
    prl_sandbox_result res;
    prl_status st = prl_sandbox_run(sb, 0, &req, &res);
    if (json) {
        char *text = prl_sandbox_result_to_json(&res, 2);
        printf("%s\n", text ? text : "{}");
        free(text);
    } else if (st == PRL_OK) {
        fwrite(res.out, 1, res.out_len, stdout);
        fflush(stdout);
        fwrite(res.err, 1, res.err_len, stderr);
        print_summary(&res);
    } else cli_fail("sandbox");
    int ok = st == PRL_OK && res.status == PRL_SANDBOX_STATUS_OK;
    prl_sandbox_result_free(&res);
    prl_sandbox_free(sb);
    free(program), free(input);
    return ok ? 0 : 1;
}

/* Names separated by spaces, wrapped before column 96 with a two-space indent. */
static void print_wrapped(const char *const *names, size_t n)
{
    int col = 0;
    for (size_t i = 0; i < n; i++) {
        int len = (int)strlen(names[i]);
        if (col && col + 1 + len > 96) printf("\n"), col = 0;
        col += printf(col ? " %s" : "  %s", names[i]);
    }
    printf("\n");
}

static void print_limit_row(const char *name, double dflt, double max, const char *unit)
{
    char m[32];
    if (max > 0) snprintf(m, sizeof m, "%g", max);
    else snprintf(m, sizeof m, "none");
    printf("  %-16s %-12g %-12s %s\n", name, dflt, m, unit);
}

static void print_policy(unsigned used)
{
    prl_sandbox_policy p;
    prl_sandbox_policy_get(used, &p);
    if (p.namespaces_missing[0])
        printf("mode: %s (no %s namespace)\n", p.mode, p.namespaces_missing);
    else printf("mode: %s (user pid net mount ipc uts)\n", p.mode);
    if (!p.seccomp) {
        printf("seccomp: not used: every socket family and system call is open\n");
    } else {
        printf("socket families allowed (every other one: EPERM):\n");
        print_wrapped(p.families, (size_t)p.n_families);
        printf("system calls refused (EPERM):\n");
        print_wrapped(p.refused, p.n_refused);
        printf("refused with some arguments:\n");
        for (size_t i = 0; i < p.n_conditional; i++)
            printf("  %-28s %s\n", p.conditional[i][0], p.conditional[i][1]);
    }
    const prl_sandbox_limits *d = &p.defaults, *m = &p.maxima;
    const double mib = 1 << 20;
    printf("limits             default      maximum\n");
    print_limit_row("cpu_seconds", d->cpu_seconds, m->cpu_seconds, "s, per process");
    print_limit_row("wall_seconds", d->wall_seconds, m->wall_seconds, "s");
    print_limit_row("memory", (double)d->memory_bytes / mib, (double)m->memory_bytes / mib,
                    "MiB, whole tree");
    print_limit_row("output", (double)d->output_bytes / mib, (double)m->output_bytes / mib,
                    "MiB kept per stream");
    print_limit_row("processes", d->processes, m->processes, "tasks of the tree");
    print_limit_row("open_files", d->open_files, m->open_files, "per process");
    print_limit_row("file_size", (double)d->file_size_bytes / mib, (double)m->file_size_bytes / mib,
                    "MiB");
    print_limit_row("disk", (double)d->disk_bytes / mib, (double)m->disk_bytes / mib,
                    "MiB, each tmpfs");
}

static int sandbox_probe(int argc, char **argv)
{
    int json = 0;
    cli_opt opts[] = {{"json", OPT_FLAG, &json, NULL, "print the report as JSON", 0, 0}, {0}};
    int rc =
        cli_parse(argc, argv, 3, opts, "prl sandbox probe [--json]",
                  "Detects which isolation layers work on this host, which ones a sandbox uses, "
                  "and why a missing one is missing; then the policy a sandbox here enforces: "
                  "the mode, the socket families allowed, the system calls refused, the limits.",
                  NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    prl_sandbox *sb = NULL;
    prl_sandbox_caps caps;
    if (open_sandbox(&sb, &caps, 0)) return 1;
    unsigned used = prl_sandbox_layers(sb);
    prl_sandbox_free(sb);
    if (json) {
        char *text = prl_sandbox_caps_to_json(&caps, used, 2);
        printf("%s\n", text ? text : "{}");
        free(text);
        return 0;
    }
    printf("layer          state\n");
    for (int i = 0; i < PRL_SANDBOX_N_LAYERS; i++) {
        unsigned l = 1u << i;
        const char *state = used & l ? "used" : caps.layers & l ? "available, not used" : "missing";
        const char *why = caps.why[i];
        if (l == PRL_SANDBOX_SOCKET_FILTER && !(used & l) && (used & PRL_SANDBOX_NETNS))
            why = "(not needed: inet sockets reach only the net namespace's loopback)";
        printf("  %-14s %-20s %s\n", prl_sandbox_layer_name(l), state, why);
    }
    printf("root %s, cgroup %s, cgroup kill %s, landlock ABI %d\n", caps.is_root ? "yes" : "no",
           caps.cgroup_version ? (caps.cgroup_version == 1 ? "v1" : "v2") : "none",
           caps.cgroup_kill_kind[0] ? caps.cgroup_kill_kind : "none", caps.landlock_abi);
    if (caps.cgroup_note[0]) printf("note: %s\n", caps.cgroup_note);
    print_policy(used);
    return 0;
}

int cmd_sandbox(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[2], "exec")) return sandbox_exec(argc, argv);
    if (argc >= 3 && !strcmp(argv[2], "probe")) return sandbox_probe(argc, argv);
    int help = argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"));
    fprintf(
        help ? stdout : stderr,
        "usage: prl sandbox exec --lang python3|sh --file FILE [options]   run a program isolated\n"
        "       prl sandbox probe [--json]                                  show the isolation "
        "layers and the policy\n"
        "(prl sandbox exec --help for the limits)\n");
    return help ? 0 : 2;
}
