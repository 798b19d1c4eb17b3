/*
** metrics.c — a step's metrics in the controller (internal.h): the JSON written to run.db's
** steps table (docs/store.md), its copy appended to runs/NAME/metrics.jsonl, and the
** progress line printed per step (docs/pipeline.md).
*/
#include "roles/controller/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The step's teacher metrics (JSON object text into out[n]): per teacher its samples' load
** and scoring time, loads and the peak RSS of the process that taught it; per teacher
** process that answered, its peak RSS. */
static void teach_metrics(const ctl *c, const step_run *r, char *out, size_t n)
{
    size_t k = (size_t)snprintf(out, n, "{");
    uint64_t peak = 0;
    for (int t = 0; t < PRL_OPD_TEACHERS && k < n; t++) {
        if (!r->teach_rss_kb[t]) continue;
        peak = r->teach_rss_kb[t] > peak ? r->teach_rss_kb[t] : peak;
        k += (size_t)snprintf(out + k, n - k,
                              "%s\"%s\": {\"load_s\": %.3f, \"teach_s\": %.3f, "
                              "\"loads\": %d, \"peak_rss_kb\": %llu}",
                              k > 1 ? ", " : "", prl_opd_teacher_key(t), r->teach_load_s[t],
                              r->teach_s[t], r->teach_loads[t],
                              (unsigned long long)r->teach_rss_kb[t]);
    }
    if (k < n) k += (size_t)snprintf(out + k, n - k, "%s\"processes\": {", k > 1 ? ", " : "");
    for (int i = 0, first = 1; i < c->nw && k < n; i++) {
        if (!r->proc_rss_kb[i]) continue;
        k += (size_t)snprintf(out + k, n - k, "%s\"%s\": %llu", first ? "" : ", ", c->w[i].name,
                              (unsigned long long)r->proc_rss_kb[i]);
        first = 0;
    }
    if (k < n) snprintf(out + k, n - k, "}, \"peak_rss_kb\": %llu}", (unsigned long long)peak);
}

/* With opd.revisit: how many of the step's groups were revisits and the mean teacher KL they
** were drawn with, against the mean over every prompt with a KL before the step (-1: none). */
static void revisit_metrics(const ctl *c, const step_run *r, char *out, size_t n)
{
    int nr = 0, np = 0;
    double kr = 0, kp = 0;
    for (int i = 0; i < r->n; i++)
        if (r->g[i].revisit) nr++, kr += c->teacher_kl[r->g[i].prompt];
    for (int p = 0; p < c->n_tasks; p++)
        if (c->teacher_kl[p] >= 0) np++, kp += c->teacher_kl[p];
    snprintf(out, n, "\"revisits\": %d, \"revisit_kl\": %.6f, \"prompts_kl\": %.6f, ", nr,
             nr ? kr / nr : -1.0, np ? kp / np : -1.0);
}

void ctl_step_metrics(ctl *c, step_run *r, const char *trainer_metrics, double train_s, char *out,
                      size_t n, prl_store_step *st)
{
    int samples = 0, solved = 0, stale = 0, degenerate = 0, hacking = 0, unparsed = 0;
    double rsum = 0, tok = 0, trunc = 0;
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < c->G; j++) {
            const slot *s = &r->g[i].s[j];
            samples++, rsum += s->reward, solved += ctl_sample_correct(s);
            degenerate += (s->flags & PRL_REWARD_DEGENERATE) != 0;
            hacking += (s->flags & PRL_REWARD_HACKING) != 0;
            unparsed += (s->flags & PRL_REWARD_JUDGE_UNPARSED) != 0;
            tok += s->n - s->prompt_len, trunc += s->stop != 0;
            stale += !ctl_sample_fresh(c, r, s);
        }
    double now = prl_now();
    double rollout_s = (r->t_rolled ? r->t_rolled : now) - r->t_open;
    double score_s = r->t_scored && r->t_rolled ? r->t_scored - r->t_rolled : 0;
    /* open → first rollout lease: in async mode the rollout workers may still be busy with
    ** the previous step; rollout_s − rollout_wait_s is the time the step's rollout took */
    double wait_s = r->t_leased && r->t_leased < now ? r->t_leased - r->t_open : 0;
    double step_s = now - r->t_open;
    /* the pace of the run: time since the previous step was committed (in async mode steps
    ** overlap, so this is less than step_s) */
    double interval_s = now - (c->t_last_commit ? c->t_last_commit : c->t_start);
    c->t_last_commit = now;
    char teachers[2400] = "", tm[2048], rv[128] = "";
    if (c->job->opd_enabled) { /* OPD: the teacher stage (last score → last teacher answer) */
        teach_metrics(c, r, tm, sizeof tm);
        snprintf(teachers, sizeof teachers, "\"teach_s\": %.3f, \"teachers\": %s, ",
                 r->t_taught && r->t_scored ? r->t_taught - r->t_scored : 0, tm);
    }
    if (ctl_revisit_count(c)) revisit_metrics(c, r, rv, sizeof rv);
    *st = (prl_store_step){.run = c->run,
                           .step = r->step,
                           .reward_mean = samples ? rsum / samples : 0,
                           .accuracy = samples ? (double)solved / samples : 0,
                           .tokens_per_s = rollout_s > 0 ? tok / rollout_s : 0,
                           .step_seconds = step_s};
    snprintf(
        out, n,
        "{\"samples\": %d, \"groups\": %d, \"groups_kept\": %d, \"groups_dropped\": %d, "
        "\"stale\": %d, \"reward_mean\": %.6f, \"accuracy\": %.6f, \"response_tokens\": %.0f, "
        "\"truncated_share\": %.4f, \"rollout_s\": %.3f, \"rollout_wait_s\": %.3f, "
        "\"score_tail_s\": %.3f, \"train_s\": %.3f, "
        "\"step_s\": %.3f, \"interval_s\": %.3f, \"reward_busy_s\": %.3f, \"tokens_per_s\": %.1f, "
        "\"cursor_end\": %lld, \"version\": %lld, \"degenerate_share\": %.4f, "
        "\"hacking_share\": %.4f, \"judge_unparsed\": %d, %s%s\"trainer\": %s}",
        samples, r->n, r->accepted, r->dropped, stale, st->reward_mean, st->accuracy, tok,
        samples ? trunc / samples : 0, rollout_s, wait_s, score_s, train_s, step_s, interval_s,
        r->score_seconds, st->tokens_per_s, (long long)c->cursor, (long long)c->version,
        samples ? (double)degenerate / samples : 0, samples ? (double)hacking / samples : 0,
        unparsed, teachers, rv, trainer_metrics);
}

void ctl_progress_line(ctl *c, const prl_store_step *st, const char *metrics, step_run *r)
{
    json_error_t je;
    json_t *mj = json_loads(metrics, 0, &je);
    double roll = json_number_value(json_object_get(mj, "rollout_s"));
    double tail = json_number_value(json_object_get(mj, "score_tail_s"));
    double train = json_number_value(json_object_get(mj, "train_s"));
    double interval = json_number_value(json_object_get(mj, "interval_s"));
    int stale = (int)json_integer_value(json_object_get(mj, "stale"));
    /* loss scaling (fp16 training): the scale and the skipped updates, when a scaler ran */
    json_t *tr = json_object_get(mj, "trainer"), *ls = json_object_get(tr, "loss_scale");
    char scale[96] = "";
    if (json_is_number(ls))
        snprintf(scale, sizeof scale, " | scale %g  skipped %lld (%lld total)",
                 json_number_value(ls),
                 (long long)json_integer_value(json_object_get(tr, "skipped")),
                 (long long)json_integer_value(json_object_get(tr, "skipped_total")));
    json_t *kl = json_object_get(json_object_get(mj, "trainer"), "opd_teacher_kl");
    char opd[48] = ""; /* OPD: the reverse KL student→teacher of the step's tokens */
    if (json_is_number(kl)) snprintf(opd, sizeof opd, " | KL %.4f", json_number_value(kl));
    /* the reward-hacking monitors: the share of the step's samples each flagged */
    double degen = json_number_value(json_object_get(mj, "degenerate_share"));
    double hack = json_number_value(json_object_get(mj, "hacking_share"));
    char mon[64] = "";
    if (degen > 0 || hack > 0)
        snprintf(mon, sizeof mon, " | degen %.1f%%  hack %.1f%%", 100 * degen, 100 * hack);
    json_decref(mj);
    c->interval_sum += interval, c->intervals++;
    if (!c->o->progress) return;
    char el[32], eta[32];
    prl_format_duration(el, sizeof el, prl_now() - c->t_start);
    prl_format_duration(eta, sizeof eta,
                        (c->job->steps - c->version) * c->interval_sum / c->intervals);
    fprintf(c->o->progress,
            "step %lld  v%lld/%d | reward %.3f  acc %5.1f%% | %6.0f tok/s | rollout %.1fs  score "
            "%.1fs  "
            "train %.1fs | step %.1fs | stale %d  dropped %d%s%s%s | %s, eta %s\n",
            (long long)r->step, (long long)c->version, c->job->steps, st->reward_mean,
            100 * st->accuracy, st->tokens_per_s, roll, tail, train, interval, stale, r->dropped,
            scale, opd, mon, el, eta);
    fflush(c->o->progress);
}

/* {"step": S, ...the metrics' fields} as one line of text (malloc'd), or NULL. */
static char *metrics_line(int64_t step, const char *metrics)
{
    json_error_t je;
    json_t *fields = json_loads(metrics, 0, &je), *line = json_object();
    char *text = NULL;
    if (json_is_object(fields) && line && !json_object_set_new(line, "step", json_integer(step)) &&
        !json_object_update(line, fields))
        text = json_dumps(line, JSON_COMPACT);
    json_decref(fields), json_decref(line);
    return text;
}

/* runs/NAME/metrics.jsonl: run.db is the source of truth, so a failure here is logged, the
** appends stop, and the next start's catch-up writes what is missing. */
void ctl_metrics_append(ctl *c, int64_t step, const char *metrics)
{
    if (c->metrics_file_failed) return;
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", c->o->run_dir);
    char *line = metrics_line(step, metrics);
    prl_status rc = line ? prl_file_append_line(path, line)
                         : prl_error_set(PRL_ERR_FORMAT,
                                         "step %lld: metrics are not a JSON "
                                         "object",
                                         (long long)step);
    if (rc) {
        ctl_log("metrics.jsonl: %s (no more lines until the run restarts)", prl_error_message());
        c->metrics_file_failed = 1;
    }
    free(line);
}

/* The file's lines of steps below `next` kept, the others dropped (a run taken back to an
** older version: run.db dropped those steps, which are made again); returns the step of the
** last line kept, or -1 (no file, no line). The file is prl's copy of run.db's steps. */
static int64_t keep_steps_below(const char *path, int64_t next)
{
    char *text = NULL;
    size_t len = 0, kept = 0;
    if (access(path, F_OK) != 0 || prl_file_append_line(path, NULL) ||
        prl_file_read(path, &text, &len))
        return -1;
    int64_t last = -1;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) + 1 : strlen(line);
        json_error_t je;
        json_t *o = json_loadb(line, n, 0, &je);
        int64_t step = json_is_integer(json_object_get(o, "step"))
                           ? (int64_t)json_integer_value(json_object_get(o, "step"))
                           : -1;
        json_decref(o);
        if (step < next) {
            memmove(text + kept, line, n);
            kept += n, last = step > last ? step : last;
        }
        line += n;
    }
    if (kept < len && prl_file_write_atomic(path, text, kept))
        ctl_log("metrics.jsonl: %s", prl_error_message());
    free(text);
    return last;
}

prl_status ctl_metrics_catch_up(ctl *c)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", c->o->run_dir);
    for (int64_t s = keep_steps_below(path, c->next_step) + 1; s < c->next_step; s++) {
        char *mt = NULL;
        prl_status rc = prl_store_step_metrics(c->db, c->run, s, &mt);
        if (rc) return rc;
        ctl_metrics_append(c, s, mt);
        free(mt);
    }
    return PRL_OK;
}
