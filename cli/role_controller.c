/*
** role_controller.c — `prl role controller`: the run's coordinator process (controller/),
** started by `prl run` or by hand. Its progress lines go to stdout, its log to stderr.
*/
#include "cli/cli.h"
#include "controller/controller.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* The job config a run directory was started with (runs/NAME/job.json). */
prl_status cli_run_job_path(const char *run_dir, char *out, size_t n)
{
    int k = snprintf(out, n, "%s/job.json", run_dir);
    return k > 0 && (size_t)k < n ? PRL_OK : prl_error_set(PRL_ERR_ARG, "run directory path too long");
}

int cmd_role_controller(int argc, char **argv)
{
    const char *run_dir = NULL, *bind = NULL;
    cli_opt opts[] = {
        {"run", OPT_STR, &run_dir, "DIR", "the run directory (holds job.json, run.db, ckpt/)", 1, 0},
        {"bind", OPT_STR, &bind, "ENDPOINT", "where workers connect (default ipc://DIR/control.sock)", 0, 0},
        {0}};
    int pr = cli_parse(argc, argv, 3, opts, "prl role controller --run DIR [--bind ENDPOINT]",
                       "The controller: owns DIR/run.db, leases work to the rollout, reward and "
                       "trainer roles and records every sample (docs/pipeline.md).", NULL, 0, NULL);
    if (pr) return pr == CLI_HELP ? 0 : 2;
    cli_role_install_signals();
    char path[1100];
    prl_job_config job;
    prl_job_config_default(&job);
    if (cli_run_job_path(run_dir, path, sizeof path) || prl_job_config_load(&job, path)) {
        prl_job_config_free(&job);
        return cli_fail("role controller");
    }
    int failed = 0;
    prl_controller_options o = {.run_dir = run_dir, .endpoint = bind, .job = &job,
                                .progress = stdout, .stop = cli_role_stop_flag(), .failed = &failed};
    prl_status rc = prl_controller_run(&o);
    prl_job_config_free(&job);
    if (rc) {
        cli_fail("role controller");
        return failed ? CLI_RUN_FAILED : 1;
    }
    return *cli_role_stop_flag() ? 3 : 0;
}
