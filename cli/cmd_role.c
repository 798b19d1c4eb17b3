/*
** cmd_role.c — `prl role NAME [options]`: one process of the pipeline (docs/pipeline.md),
** started by `prl run` or by hand. Each role's options are parsed here and the process runs
** in roles/ (roles/roles.h, roles/controller/controller.h); a new role is one row of the
** table below.
**
** Exit codes: 0 after a clean stop (a `stop` message, the run done), 1 when the role failed, 2
** on bad usage, PRL_ROLE_SIGNALED_EXIT (3) when SIGTERM or SIGINT stopped it (the launcher
** restarts it); the controller also PRL_RUN_FAILED_EXIT when the run failed for good.
*/
#include "cli/cli.h"
#include "bus/bus.h"
#include "roles/controller/controller.h"
#include "roles/gateway/gateway.h"
#include "roles/roles.h"

#include <string.h>

/* The job config a run directory was started with (runs/NAME/job.json). */
prl_status cli_run_job_path(const char *run_dir, char *out, size_t n)
{
    int k = snprintf(out, n, "%s/job.json", run_dir);
    return k > 0 && (size_t)k < n ? PRL_OK
                                  : prl_error_set(PRL_ERR_ARG, "run directory path too long");
}

static int role_controller(int argc, char **argv)
{
    const char *run_dir = NULL, *bind = NULL;
    cli_opt opts[] = {{"run", OPT_STR, &run_dir, "DIR",
                       "the run directory (holds job.json, run.db, ckpt/)", 1, 0},
                      {"bind", OPT_STR, &bind, "ENDPOINT",
                       "where workers connect (default ipc://DIR/control.sock)", 0, 0},
                      {0}};
    int pr = cli_parse(argc, argv, 3, opts, "prl role controller --run DIR [--bind ENDPOINT]",
                       "The controller: owns DIR/run.db, leases work to the rollout, reward and "
                       "trainer roles and records every sample (docs/pipeline.md).",
                       NULL, 0, NULL);
    if (pr) return pr == CLI_HELP ? 0 : 2;
    prl_role_install_signals();
    char path[1100];
    prl_job_config job;
    prl_job_config_default(&job);
    if (cli_run_job_path(run_dir, path, sizeof path) || prl_job_config_load(&job, path)) {
        /* the same file would fail every restart: the run fails, naming it (run.db) */
        char why[700];
        snprintf(why, sizeof why, "%s", prl_error_message());
        prl_job_config_free(&job);
        if (prl_controller_record_failure(run_dir, why))
            fprintf(stderr, "prl role controller: %s\n", prl_error_message());
        prl_error_set(PRL_ERR_CONFIG, "%s", why);
        cli_fail("role controller");
        return PRL_RUN_FAILED_EXIT;
    }
    int failed = 0;
    prl_controller_options o = {.run_dir = run_dir,
                                .endpoint = bind,
                                .job = &job,
                                .progress = stdout,
                                .stop = prl_role_stop_flag(),
                                .failed = &failed};
    prl_status rc = prl_controller_run(&o);
    prl_job_config_free(&job);
    if (rc) {
        cli_fail("role controller");
        return failed ? PRL_RUN_FAILED_EXIT : 1;
    }
    return *prl_role_stop_flag() ? PRL_ROLE_SIGNALED_EXIT : 0;
}

static int role_sandbox(int argc, char **argv)
{
    prl_sandbox_service_options opt;
    prl_sandbox_service_options_default(&opt);
    int uid_base = 0;
    const char *key = NULL, *curve_keys = NULL, *authorized = NULL;
    int allow_remote = 0;
    cli_opt opts[] = {
        {"bind", OPT_STR, &opt.endpoint, "ENDPOINT",
         "ROUTER endpoint to bind, e.g. ipc://runs/NAME/sandbox.sock", 1, 0},
        {"curve-keys", OPT_STR, &curve_keys, "DIR",
         "serve other hosts over CURVE with this keypair (prl keys generate), instead of --key", 0,
         0},
        {"authorized-keys", OPT_STR, &authorized, "FILE",
         "with --curve-keys: the workers' public keys, one a line", 0, 0},
        {"allow-remote", OPT_FLAG, &allow_remote, NULL, "allow a non-loopback tcp:// --bind", 0, 0},
        {"slots", OPT_INT, &opt.slots, "N",
         "programs run at once, one per slot (default 1, at most 256)", 0, 0},
        {"warm", OPT_FLAG, &opt.warm, NULL,
         "python3 programs start from a pre-started interpreter per slot (docs/sandbox.md)", 0, 0},
        {"uid-base", OPT_INT, &uid_base, "UID", "first slot uid (default: derived from the pid)", 0,
         0},
        {"key", OPT_STR, &key, "FILE",
         "the run's bus key: only workers presenting it are served (default: bus.key beside an "
         "ipc:// socket)",
         0, 0},
        {0},
    };
    int rc = cli_parse(
        argc, argv, 3, opts,
        "prl role sandbox --bind ENDPOINT [--slots N] [--warm] [--uid-base UID]",
        "Serves `exec` requests over the bus: runs each program in the sandbox and answers "
        "`exec_result` (docs/pipeline.md). Only workers presenting the run's bus key (or, with "
        "--curve-keys, an authorized CURVE key) are served. Stops on SIGTERM or SIGINT (exit 3).",
        NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (opt.slots < 1 || opt.slots > 256)
        return cli_failf("role sandbox", 2, "--slots must be in 1..256, got %d", opt.slots);
    if (uid_base < 0) return cli_failf("role sandbox", 2, "--uid-base must be positive");
    opt.uid_base = (unsigned)uid_base;
    prl_bus_secret secret;
    prl_bus_curve_keypair kp;
    prl_bus_curve_allow allow = {0};
    if (curve_keys) { /* another host's workers (docs/scale-out.md "Several hosts") */
        if (!authorized)
            return cli_failf("role sandbox", 2, "--curve-keys needs --authorized-keys FILE");
        if (prl_bus_endpoint_check(opt.endpoint, allow_remote) ||
            prl_bus_curve_load(curve_keys, &kp) || prl_bus_curve_allow_load(authorized, &allow))
            return cli_fail("role sandbox");
        opt.curve = &kp, opt.curve_allow = &allow;
    } else if (prl_bus_endpoint_check(opt.endpoint, 0) ||
               prl_role_load_secret(key, opt.endpoint, &secret)) {
        return cli_fail("role sandbox");
    } else {
        opt.secret = secret.hex;
    }
    prl_sandbox_service_stats stats = {0};
    prl_status st = prl_sandbox_service_run(&opt, &stats);
    prl_bus_curve_allow_free(&allow);
    if (st != PRL_OK) cli_fail("role sandbox");
    prl_bus_shutdown(); /* lets libzmq finish closing: the ipc socket file is removed */
    return st != PRL_OK ? 1 : stats.signal ? PRL_ROLE_SIGNALED_EXIT : 0;
}

/* A worker role: what it runs, its help text and which of the shared options it takes. */
typedef struct worker_role {
    const char *name;
    prl_status (*run)(const prl_worker_options *o);
    const char *help;
    int sandbox, threads, cache, ranks;
} worker_role;

static const worker_role workers[] = {
    {"rollout", prl_role_rollout_run,
     "A rollout worker: generates samples with the infer path "
     "for the controller at ENDPOINT (docs/pipeline.md).",
     1, 1, 1, 0},
    {"reward", prl_role_reward_run,
     "A reward worker: scores samples with the domain verifiers "
     "for the controller at ENDPOINT (docs/pipeline.md).",
     1, 0, 0, 0},
    {"trainer", prl_role_trainer_run,
     "The trainer: GRPO (or OPD) updates of each step's samples; "
     "writes and announces policy versions (docs/pipeline.md).",
     0, 1, 0, 1},
    {"teacher", prl_role_teacher_run,
     "An OPD teacher: scores the student's samples with one "
     "domain expert at a time (docs/opd.md).",
     0, 1, 0, 0},
};

static const worker_role *worker_named(const char *name)
{
    for (size_t i = 0; i < sizeof workers / sizeof workers[0]; i++)
        if (!strcmp(workers[i].name, name)) return &workers[i];
    return NULL;
}

static int role_worker(int argc, char **argv)
{
    const worker_role *wr = worker_named(argv[2]);
    char def_name[32], usage[96], name_help[96], cmd[32];
    snprintf(def_name, sizeof def_name, "%s-0", wr->name);
    snprintf(usage, sizeof usage, "prl role %s --connect ENDPOINT [options]", wr->name);
    snprintf(name_help, sizeof name_help, "worker name, stable across restarts (default %s)",
             def_name);
    snprintf(cmd, sizeof cmd, "role %s", wr->name);
    prl_worker_options o = {.name = def_name};
    int threads = 0;
    cli_opt opts[13] = {
        /* the most a role takes, and the {0} that ends them */
        {"connect", OPT_STR, &o.connect, "ENDPOINT", "the controller's endpoint", 1, 0},
        {"name", OPT_STR, &o.name, "NAME", name_help, 0, 0},
        {"key", OPT_STR, &o.key, "FILE",
         "the run's bus key (default: bus.key beside an ipc:// endpoint)", 0, 0},
        {"curve-keys", OPT_STR, &o.curve_keys, "DIR",
         "another host: this worker's CURVE keypair (prl keys generate), instead of --key", 0, 0},
        {"server-key", OPT_STR, &o.server_key, "FILE",
         "with --curve-keys: the controller's public.key", 0, 0}};
    int k = 5;
    if (wr->cache)
        opts[k++] = (cli_opt){"cache",
                              OPT_STR,
                              &o.cache,
                              "DIR",
                              "fetch each policy version over the bus into DIR (no shared disk)",
                              0,
                              0};
    if (wr->sandbox) {
        opts[k++] = (cli_opt){"sandbox",
                              OPT_STR,
                              &o.sandbox,
                              "ENDPOINT",
                              "sandbox service for programs (default: a local sandbox)",
                              0,
                              0};
        opts[k++] = (cli_opt){"sandbox-key",
                              OPT_STR,
                              &o.sandbox_key,
                              "FILE",
                              "with --curve-keys: a --sandbox on another host, its public.key",
                              0,
                              0};
    }
    if (wr->threads)
        opts[k++] = (cli_opt){
            "threads", OPT_INT, &threads, "N", "threads (default: PRL_THREADS or all CPUs)", 0, 0};
    if (wr->ranks)
        opts[k++] = (cli_opt){"ranks",
                              OPT_INT,
                              &o.ranks,
                              "N",
                              "one rank of N data-parallel trainers started by mpirun or srun "
                              "(trainer.ranks; default 1: no MPI)",
                              0,
                              0};
    opts[k++] = (cli_opt){"allow-remote",
                          OPT_FLAG,
                          &o.allow_remote,
                          NULL,
                          "allow a non-loopback tcp:// endpoint",
                          0,
                          0};
    int pr = cli_parse(argc, argv, 3, opts, usage, wr->help, NULL, 0, NULL);
    if (pr) return pr == CLI_HELP ? 0 : 2;
    if (wr->threads && cli_setup_blas(cmd, threads)) return 1;
    prl_role_install_signals();
    if (wr->run(&o)) return cli_fail(cmd);
    return *prl_role_stop_flag() ? PRL_ROLE_SIGNALED_EXIT : 0;
}

static int role_gateway(int argc, char **argv)
{
    prl_gateway_options o = {0};
    int threads = 0;
    cli_opt opts[] = {
        {"bind", OPT_STR, &o.bind, "HOST:PORT",
         "where to serve HTTP (port 0: any free one; default the job's gateway.bind)", 0, 0},
        {"connect", OPT_STR, &o.connect, "ENDPOINT", "the controller's endpoint: play its run", 0,
         0},
        {"name", OPT_STR, &o.name, "NAME", "worker name (default gateway-0)", 0, 0},
        {"key", OPT_STR, &o.key, "FILE",
         "with --connect: the run's bus key (default: bus.key beside an ipc:// endpoint)", 0, 0},
        {"slots", OPT_INT, &o.slots, "N", "groups held at once (default 64)", 0, 0},
        {"model", OPT_STR, &o.model, "DIR", "without --connect: serve this checkpoint alone", 0, 0},
        {"addr-file", OPT_STR, &o.addr_file, "FILE",
         "write the served address here (default with --connect: RUN_DIR/gateway.addr)", 0, 0},
        {"max-body", OPT_INT, &o.max_body, "BYTES", "alone: largest request body (default 1 MiB)",
         0, 0},
        {"max-tokens", OPT_INT, &o.max_tokens, "N", "alone: default max_tokens (default 96)", 0, 0},
        {"max-batch", OPT_INT, &o.max_batch, "N", "alone: sequences decoded together (default 16)",
         0, 0},
        {"threads", OPT_INT, &threads, "N", "threads (default: PRL_THREADS or all CPUs)", 0, 0},
        {"allow-remote", OPT_FLAG, &o.allow_remote, NULL, "serve (and connect) beyond loopback", 0,
         0},
        {0}};
    int pr = cli_parse(argc, argv, 3, opts,
                       "prl role gateway (--connect ENDPOINT | --model DIR --bind HOST:PORT) "
                       "[options]",
                       "The gateway: an OpenAI-compatible HTTP server through which outside "
                       "agents play the run's episodes, every turn recorded token-in/token-out "
                       "(docs/gateway.md).",
                       NULL, 0, NULL);
    if (pr) return pr == CLI_HELP ? 0 : 2;
    if (o.max_body < 0 || o.max_tokens < 0 || o.max_batch < 0 || o.slots < 0 || o.slots > 4096)
        return cli_failf("role gateway", 2,
                         "--max-body, --max-tokens, --max-batch must be positive, --slots in "
                         "1..4096");
    if (cli_setup_blas("role gateway", threads)) return 1;
    prl_role_install_signals();
    if (prl_role_gateway_run(&o)) return cli_fail("role gateway");
    return *prl_role_stop_flag() ? PRL_ROLE_SIGNALED_EXIT : 0;
}

static const cli_command roles[] = {
    {"controller", role_controller, "owns run.db, leases work, records samples and steps"},
    {"trainer", role_worker, "GRPO updates; writes and announces policy versions"},
    {"rollout", role_worker, "generates samples with the infer path"},
    {"reward", role_worker, "scores samples with the domain verifiers"},
    {"teacher", role_worker, "OPD: scores student samples with one domain expert at a time"},
    {"gateway", role_gateway, "OpenAI-compatible HTTP endpoint for outside agents"},
    {"sandbox", role_sandbox, "runs programs for rollout and reward workers (--bind ENDPOINT)"},
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
    char names[256];
    cli_command_names(roles, N_ROLES, names, sizeof names);
    return cli_failf("role", 2, "unknown role '%s'%s (known roles: %s)", argv[2],
                     cli_did_you_mean(argv[2], names), known);
}
