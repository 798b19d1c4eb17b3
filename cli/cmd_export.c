/*
** cmd_export.c — `prl export`: a checkpoint as a Hugging Face model directory.
**
** The weights go out in BF16 (default) or F32, sharded past --shard-size with an index, the
** config with its original keys, the tokenizer files as they are; the output directory must
** be new (engine/export.c builds it under a temporary name and renames it into place).
*/
#include "cli/cli.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "2GB", "500MB", "1.5GiB", "4096" (bytes); decimal units as Hugging Face's max_shard_size. */
static int parse_size(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1},
                 {"B", 1},
                 {"KB", 1e3},
                 {"MB", 1e6},
                 {"GB", 1e9},
                 {"TB", 1e12},
                 {"KIB", 1024.0},
                 {"MIB", 1048576.0},
                 {"GIB", 1073741824.0},
                 {"TIB", 1099511627776.0}};
    char unit[8] = {0};
    for (int i = 0; end[i] && i < 7; i++) unit[i] = (char)toupper((unsigned char)end[i]);
    if (end == s || strlen(end) > 3 || !(v > 0)) return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(unit, units[i].unit)) {
            double b = v * units[i].mult;
            if (b < 1 || b > 1e15) return -1;
            *out = (size_t)b;
            return 0;
        }
    return -1;
}

int cmd_export(int argc, char **argv)
{
    const char *ckpt = NULL, *out = NULL, *dtype = "bf16", *shard = "2GB";
    cli_opt opts[] = {
        {"ckpt", OPT_STR, &ckpt, "DIR", "checkpoint directory (prl's or an imported one)", 1, 0},
        {"out", OPT_STR, &out, "HFDIR", "new directory to write (must not exist)", 1, 0},
        {"dtype", OPT_STR, &dtype, "T", "weights as bf16 (default) or f32", 0, 0},
        {"shard-size", OPT_STR, &shard, "SIZE",
         "largest shard, e.g. 2GB, 500MB, 1GiB (default 2GB); one file when all fit", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 2, opts,
                       "prl export --ckpt DIR --out HFDIR [--dtype bf16|f32] [--shard-size 2GB]",
                       "Writes a checkpoint as a Hugging Face model directory: config.json, "
                       "model.safetensors or shards + model.safetensors.index.json, tokenizer "
                       "files.",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    prl_dtype dt = !strcmp(dtype, "bf16")  ? PRL_DTYPE_BF16
                   : !strcmp(dtype, "f32") ? PRL_DTYPE_F32
                                           : PRL_DTYPE_COUNT;
    if (dt == PRL_DTYPE_COUNT)
        return cli_failf("export", 2, "--dtype %s: choose bf16 or f32", dtype);
    size_t shard_bytes;
    if (parse_size(shard, &shard_bytes))
        return cli_failf("export", 2, "--shard-size %s: give a size such as 2GB, 500MB or 1GiB",
                         shard);
    if (cli_require_new("export", "out", out)) return 2;
    prl_model m;
    if (prl_checkpoint_load(&m, ckpt)) return cli_fail("export");
    prl_export_options eo = {.dtype = dt, .shard_bytes = shard_bytes};
    prl_status st = prl_checkpoint_export(&m, ckpt, out, &eo);
    if (st == PRL_OK)
        printf("exported %s -> %s (%zu parameters, %s)\n", ckpt, out, m.n_params,
               dt == PRL_DTYPE_BF16 ? "bf16" : "f32");
    prl_model_free(&m);
    return st ? cli_fail("export") : 0;
}
