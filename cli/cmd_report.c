/*
** cmd_report.c — `prl report`: one self-contained HTML page of a run (report/report.h,
** docs/report.md).
*/
#include "cli/cli.h"
#include "report/report.h"

#include <stdio.h>
#include <sys/stat.h>

static const char USAGE[] = "prl report runs/NAME [--out FILE.html] [--samples N]";
static const char SUMMARY[] =
    "Writes one HTML file that opens offline: curves over steps (reward, accuracy, in-run eval, "
    "KL and train-infer mismatch, routing per MoE layer, loss scale, tokens/s, per-stage time), "
    "the events and a sample browser of a GRPO or OPD run (runs/NAME/run.db), or the curves of an "
    "SFT run (a folder with metrics.jsonl). The output must be new (default "
    "runs/NAME/report.html); run.db is only read.";

int cmd_report(int argc, char **argv)
{
    const char *out = NULL, *pos[2];
    prl_report_options o = prl_report_defaults();
    cli_opt opts[] = {
        {"out", OPT_STR, &out, "FILE.html",
         "the page to write (must not exist; default runs/NAME/report.html)", 0, 0},
        {"samples", OPT_INT, &o.samples_per_step, "N",
         "sample browser: at most N samples of each step (default 16; 0: none)", 0, 0},
        {0},
    };
    int n_pos = 0;
    int rc = cli_parse(argc, argv, 2, opts, USAGE, SUMMARY, pos, 2, &n_pos);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (n_pos != 1) return cli_failf("report", 2, "give one run directory (usage: %s)", USAGE);
    const char *dir = pos[0];
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return cli_failf("report", 2, "%s is not a run directory", dir);
    if (o.samples_per_step < 0)
        return cli_failf("report", 2, "--samples %d must be >= 0", o.samples_per_step);
    char def[4096];
    if (!out) {
        snprintf(def, sizeof def, "%s/report.html", dir);
        out = def;
    }
    if (cli_require_new("report", "out", out)) return 2; /* before any work */
    json_t *doc = NULL;
    if (prl_report_gather(dir, &o, &doc)) return cli_fail("report");
    prl_status st = prl_report_write_page(out, doc);
    json_t *run = json_object_get(doc, "run");
    if (st == PRL_OK)
        fprintf(stderr, "prl report: %s run, %zu steps, %zu events, %zu samples -> %s\n",
                json_string_value(json_object_get(run, "kind")),
                json_array_size(json_object_get(doc, "steps")),
                json_array_size(json_object_get(doc, "events")),
                json_array_size(json_object_get(doc, "samples")), out);
    json_decref(doc);
    return st ? cli_fail("report") : 0;
}
