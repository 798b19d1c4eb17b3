/*
** data.c — the report's JSON document (report.h): which kind of run a directory holds, and
** its run, steps and events read from run.db (read-only) or an SFT run's metrics.jsonl.
*/
#include "report/report_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

prl_report_options prl_report_defaults(void)
{
    return (prl_report_options){.samples_per_step = 16};
}

/* The run's name: the last component of dir ("runs/NAME/" gives NAME). */
static void dir_name(const char *dir, char *out, size_t n)
{
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && dir[start - 1] != '/') start--;
    snprintf(out, n, "%.*s", (int)(len - start), dir + start);
}

/* Parse JSON object text; what names it in the error. */
static prl_status parse_object(const char *text, const char *what, json_t **out)
{
    json_error_t err;
    *out = json_loads(text ? text : "{}", 0, &err);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return prl_error_set(PRL_ERR_FORMAT, "%s: not a JSON object (%s)", what, err.text);
    }
    return PRL_OK;
}

/* steps[i]'s metrics with "step" first, appended to arr. */
static prl_status add_steps(const prl_store_step *steps, size_t n, json_t *arr)
{
    for (size_t i = 0; i < n; i++) {
        char what[64];
        snprintf(what, sizeof what, "run.db step %lld metrics", (long long)steps[i].step);
        json_t *m, *row = json_pack("{sI}", "step", (json_int_t)steps[i].step);
        prl_status rc = parse_object(steps[i].metrics, what, &m);
        if (rc != PRL_OK) {
            json_decref(row);
            return rc;
        }
        json_object_del(m, "step");
        json_object_update(row, m);
        json_decref(m);
        json_array_append_new(arr, row);
    }
    return PRL_OK;
}

static prl_status add_events(prl_store *db, int64_t run, json_t *arr)
{
    prl_store_event *ev = NULL;
    size_t n = 0;
    prl_status rc = prl_store_events_list(db, run, &ev, &n);
    for (size_t i = 0; rc == PRL_OK && i < n; i++) {
        char what[64];
        json_t *detail;
        snprintf(what, sizeof what, "run.db event %lld detail", (long long)ev[i].id);
        rc = parse_object(ev[i].detail, what, &detail);
        if (rc == PRL_OK)
            json_array_append_new(arr,
                                  json_pack("{sI sf ss so}", "id", (json_int_t)ev[i].id, "time",
                                            ev[i].time, "kind", ev[i].kind, "detail", detail));
    }
    prl_store_events_free(ev, n);
    return rc;
}

/* "opd" when the job config enables distillation, else "grpo". */
static const char *run_kind(const json_t *config)
{
    return json_is_true(json_object_get(json_object_get(config, "opd"), "enabled")) ? "opd"
                                                                                    : "grpo";
}

/* A GRPO or OPD run: everything from run.db. */
static prl_status gather_db(const char *dir, const char *db_path, const prl_report_options *o,
                            json_t *doc)
{
    char name[256];
    dir_name(dir, name, sizeof name);
    prl_store *db = NULL;
    prl_store_run run = {0};
    prl_store_step *steps = NULL;
    size_t n = 0;
    json_t *config = NULL, *runobj = json_object_get(doc, "run");
    prl_status rc = prl_store_open_readonly(db_path, &db);
    if (rc == PRL_OK) rc = prl_store_run_get(db, name, &run);
    if (rc == PRL_OK) rc = parse_object(run.config, "run.db run config", &config);
    if (rc == PRL_OK) {
        json_object_set_new(runobj, "kind", json_string(run_kind(config)));
        json_object_set_new(runobj, "status", json_string(run.status ? run.status : ""));
        json_object_set_new(runobj, "created", json_real(run.created));
        json_object_set_new(runobj, "config", config);
        rc = prl_store_steps_list(db, run.id, &steps, &n);
    } else {
        json_decref(config);
    }
    if (rc == PRL_OK) rc = add_steps(steps, n, json_object_get(doc, "steps"));
    if (rc == PRL_OK) rc = add_events(db, run.id, json_object_get(doc, "events"));
    if (rc == PRL_OK)
        rc = report_samples(db, run.id, steps, n, dir, o, runobj, json_object_get(doc, "samples"));
    prl_store_steps_free(steps, n);
    prl_store_run_free(&run);
    prl_store_close(db);
    return rc;
}

/* One line of metrics.jsonl (number `line`, `len` bytes at `text`); a last line without its
** newline that does not parse is a tail torn by a crash (docs/formats.md) and is skipped. */
static prl_status sft_line(const char *path, int line, const char *text, size_t len, int last,
                           json_t *arr)
{
    json_error_t err;
    json_t *row = json_loadb(text, len, 0, &err);
    if (!row && last) return PRL_OK;
    if (!json_is_object(row) || !json_is_integer(json_object_get(row, "step"))) {
        json_decref(row);
        return prl_error_set(PRL_ERR_FORMAT, "%s:%d: not a metrics line with a \"step\"%s%s", path,
                             line, row ? "" : ": ", row ? "" : err.text);
    }
    json_array_append_new(arr, row);
    return PRL_OK;
}

/* An SFT run: the steps from metrics.jsonl, the recipe (when the folder has one) as config. */
static prl_status gather_sft(const char *dir, const char *path, json_t *doc)
{
    char *text = NULL, recipe[4096];
    size_t len = 0;
    json_t *runobj = json_object_get(doc, "run"), *steps = json_object_get(doc, "steps");
    json_object_set_new(runobj, "kind", json_string("sft"));
    snprintf(recipe, sizeof recipe, "%s/recipe.json", dir);
    json_t *config = access(recipe, R_OK) == 0 ? json_load_file(recipe, 0, NULL) : NULL;
    json_object_set_new(runobj, "config", config ? config : json_object());
    prl_status rc = prl_file_read(path, &text, &len);
    int line = 0;
    for (size_t at = 0; rc == PRL_OK && at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - text) : len;
        line++;
        if (end > at) rc = sft_line(path, line, text + at, end - at, !nl, steps);
        at = end + 1;
    }
    free(text);
    if (rc == PRL_OK && json_array_size(steps) == 0)
        rc = prl_error_set(PRL_ERR_FORMAT, "%s: no metrics lines", path);
    return rc;
}

prl_status prl_report_gather(const char *dir, const prl_report_options *o, json_t **out)
{
    *out = NULL;
    char db_path[4096], jsonl[4096], name[256];
    snprintf(db_path, sizeof db_path, "%s/run.db", dir);
    snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", dir);
    dir_name(dir, name, sizeof name);
    json_t *doc = json_pack("{s{ss ss} s[] s[] s[]}", "run", "dir", dir, "name", name, "steps",
                            "events", "samples");
    if (!doc) return prl_error_set(PRL_ERR_NOMEM, "report of %s", dir);
    prl_status rc;
    if (access(db_path, F_OK) == 0) rc = gather_db(dir, db_path, o, doc);
    else if (access(jsonl, F_OK) == 0) rc = gather_sft(dir, jsonl, doc);
    else
        rc = prl_error_set(PRL_ERR_IO,
                           "%s: neither run.db (a GRPO or OPD run) nor metrics.jsonl (an SFT "
                           "run: a recipe's run.dir, or prl sft --metrics) is there",
                           dir);
    if (rc != PRL_OK) {
        json_decref(doc);
        return rc;
    }
    *out = doc;
    return PRL_OK;
}
