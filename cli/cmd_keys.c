/*
** cmd_keys.c — `prl keys generate --out DIR`: a CURVE keypair for a host's roles, so that
** they can join (or serve) a run off loopback (docs/scale-out.md "Several hosts"). The files
** are bus/curve.c's: DIR/public.key (give it to the other side) and DIR/secret.key (0600,
** stays on this host).
*/
#include "cli/cli.h"
#include "bus/bus.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static int keys_generate(int argc, char **argv)
{
    const char *out = NULL;
    cli_opt opts[] = {{"out", OPT_STR, &out, "DIR",
                       "directory for public.key and secret.key (made 0700 if missing)", 1, 0},
                      {0}};
    int pr = cli_parse(argc, argv, 3, opts, "prl keys generate --out DIR",
                       "Writes a new CURVE keypair: DIR/public.key (for the allow-list of the "
                       "controller or sandbox it joins, or for the workers that join it) and "
                       "DIR/secret.key (mode 0600). Refuses to replace an existing keypair.",
                       NULL, 0, NULL);
    if (pr) return pr == CLI_HELP ? 0 : 2;
    if (mkdir(out, 0700) != 0 && errno != EEXIST)
        return cli_failf("keys generate", 1, "cannot create %s: %s", out, strerror(errno));
    prl_bus_curve_keypair kp;
    if (prl_bus_curve_generate(out, &kp)) return cli_fail("keys generate");
    printf("%s\n", kp.public_z85);
    fprintf(stderr, "prl keys: wrote %s/public.key and %s/secret.key (0600)\n", out, out);
    return 0;
}

int cmd_keys(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[2], "generate")) return keys_generate(argc, argv);
    FILE *f = argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) ? stdout : stderr;
    fprintf(f, "usage: prl keys generate --out DIR\n\n"
               "CURVE keys for roles on other hosts (docs/pipeline.md \"Several hosts\").\n");
    return f == stdout ? 0 : 2;
}
