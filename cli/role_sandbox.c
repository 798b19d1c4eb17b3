/*
** role_sandbox.c — `prl role sandbox --bind ENDPOINT [--slots N]`: the sandbox service
** process (sandbox/service.c; docs/sandbox.md "Sandbox service"). It runs until SIGTERM,
** SIGINT or a `stop` message and exits 0 after a clean stop, 1 when it cannot start
** (sandbox or socket), 2 on bad usage.
*/
#include "cli/cli.h"
#include "bus/bus.h"
#include "sandbox/sandbox.h"

int cmd_role_sandbox(int argc, char **argv)
{
    prl_sandbox_service_options opt;
    prl_sandbox_service_options_default(&opt);
    int uid_base = 0;
    cli_opt opts[] = {
        {"bind", OPT_STR, &opt.endpoint, "ENDPOINT", "ROUTER endpoint to bind, e.g. ipc://runs/NAME/sandbox.sock", 1, 0},
        {"slots", OPT_INT, &opt.slots, "N", "programs run at once, one per slot (default 1, at most 256)", 0, 0},
        {"uid-base", OPT_INT, &uid_base, "UID", "first slot uid (default: derived from the pid)", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 3, opts, "prl role sandbox --bind ENDPOINT [--slots N] [--uid-base UID]",
                       "Serves `exec` requests over the bus: runs each program in the sandbox and answers "
                       "`exec_result` (docs/pipeline.md). Stops on SIGTERM, SIGINT or a `stop` message.",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (opt.slots < 1 || opt.slots > 256) return cli_failf("role sandbox", 2, "--slots must be in 1..256, got %d", opt.slots);
    if (uid_base < 0) return cli_failf("role sandbox", 2, "--uid-base must be positive");
    opt.uid_base = (unsigned)uid_base;
    prl_status st = prl_sandbox_service_run(&opt, NULL);
    if (st != PRL_OK) cli_fail("role sandbox");
    prl_bus_shutdown(); /* lets libzmq finish closing: the ipc socket file is removed */
    return st != PRL_OK;
}
