/*
** samples.c — the sample browser's data (report_int.h): a bounded number of each step's
** samples from run.db, with the prompt decoded to text and every response token to its own
** text by the run's tokenizer (its checkpoints' tokenizer.json), beside the ids, the infer
** log-probs, the loss mask, the reward and the verifier's breakdown.
**
** Per-token train log-probs are not stored in run.db (only the step's mismatch statistics
** are), so the page colours tokens by the infer log-prob; `prl diagnose --run` recomputes
** the train side.
*/
#include "report/report_int.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The path fmt(a, b) into out[n]: 1 when it fits and is a readable file. */
__attribute__((format(printf, 3, 0))) static int readable(char *out, size_t n, const char *fmt,
                                                          const char *a, const char *b)
{
    int len = snprintf(out, n, fmt, a, b);
    return len > 0 && (size_t)len < n && access(out, R_OK) == 0;
}

/* The run's tokenizer.json into out[n] (1), or 0 when none is found: the final checkpoint,
** else the newest ckpt/vN, else the job's model.init (as the run resolved it: relative to
** where it was started, which is usually where the report runs). */
static int find_tokenizer(const char *dir, const json_t *config, char *out, size_t n)
{
    if (readable(out, n, "%s/final/tokenizer.json", dir, "")) return 1;
    char ckpt[4096], best[256] = "";
    if (snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir) >= (int)sizeof ckpt) return 0;
    DIR *d = opendir(ckpt);
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] == 'v' && strcmp(e->d_name, best) > 0 &&
            readable(out, n, "%s/%s/tokenizer.json", ckpt, e->d_name))
            snprintf(best, sizeof best, "%s", e->d_name);
    if (d) closedir(d);
    /* vNNNNNN are zero-padded: the greatest name is the newest version */
    if (best[0]) return readable(out, n, "%s/%s/tokenizer.json", ckpt, best);
    const char *init = json_string_value(json_object_get(json_object_get(config, "model"), "init"));
    return init && readable(out, n, "%s/tokenizer.json", init, "");
}

/* bytes[0..len) as a JSON string (invalid UTF-8 shown as U+FFFD), or NULL. */
static json_t *text_json(const char *bytes, size_t len)
{
    char *view = NULL;
    size_t vlen = 0;
    if (prl_utf8_view(bytes, len, &view, &vlen) < 0) return NULL;
    json_t *s = json_stringn(view, vlen);
    free(view);
    return s;
}

/* The prompt as one text and each response token as its own; without a tokenizer the prompt
** is null and a token shows its id. */
static prl_status decode_sample(const prl_tokenizer *tok, const prl_store_sample *s, json_t *row)
{
    json_t *prompt = json_null(), *tokens = json_array();
    if (tok) {
        char *text = NULL;
        size_t len = 0;
        prl_status rc = prl_tokenizer_decode(tok, s->tokens, (size_t)s->prompt_len, 0, &text, &len);
        if (rc != PRL_OK) {
            json_decref(tokens);
            return prl_error_wrap(rc, "sample (step %lld, prompt '%s', sample %d): ",
                                  (long long)s->step, s->prompt_id, s->sample_index);
        }
        prompt = text_json(text, len);
        free(text);
    }
    for (int i = s->prompt_len; i < s->n_tokens; i++) {
        const uint8_t *b = NULL;
        size_t len = 0;
        char id[24];
        if (tok && prl_tokenizer_token_bytes(tok, s->tokens[i], &b, &len) == PRL_OK) {
            json_array_append_new(tokens, text_json((const char *)b, len));
        } else {
            snprintf(id, sizeof id, "[%d]", (int)s->tokens[i]);
            json_array_append_new(tokens, json_string(id));
        }
    }
    json_object_set_new(row, "prompt", prompt ? prompt : json_null());
    json_object_set_new(row, "tokens", tokens);
    return PRL_OK;
}

/* ids, infer log-probs (null where not finite) and the loss mask (null: every token trains). */
static void sample_arrays(const prl_store_sample *s, json_t *row)
{
    int nr = s->n_tokens - s->prompt_len;
    json_t *ids = json_array(), *lp = json_array(),
           *mask = s->loss_mask ? json_array() : json_null();
    for (int i = 0; i < nr; i++) {
        json_array_append_new(ids, json_integer(s->tokens[s->prompt_len + i]));
        double v = s->logprobs[i];
        json_array_append_new(lp, isfinite(v) ? json_real(v) : json_null());
        if (s->loss_mask) json_array_append_new(mask, json_integer(s->loss_mask[i]));
    }
    json_object_set_new(row, "ids", ids);
    json_object_set_new(row, "logprobs", lp);
    json_object_set_new(row, "mask", mask);
}

static prl_status sample_row(const prl_tokenizer *tok, const prl_store_sample *s, json_t *out)
{
    json_t *detail = json_loads(s->reward_detail ? s->reward_detail : "{}", 0, NULL);
    json_t *row =
        json_pack("{sI ss si sI sf ss si so}", "step", (json_int_t)s->step, "prompt_id",
                  s->prompt_id, "sample_index", s->sample_index, "version", (json_int_t)s->version,
                  "reward", s->reward, "status", prl_store_sample_status_name(s->status), "stop",
                  s->stop, "detail", detail ? detail : json_object());
    if (!row) return prl_error_set(PRL_ERR_NOMEM, "sample browser");
    prl_status rc = decode_sample(tok, s, row);
    if (rc != PRL_OK) {
        json_decref(row);
        return rc;
    }
    sample_arrays(s, row);
    json_array_append_new(out, row);
    return PRL_OK;
}

prl_status report_samples(prl_store *db, int64_t run, const prl_store_step *steps, size_t n,
                          const char *dir, const prl_report_options *o, json_t *runobj, json_t *out)
{
    char path[4096];
    prl_tokenizer *tok = NULL;
    prl_status rc = PRL_OK;
    if (find_tokenizer(dir, json_object_get(runobj, "config"), path, sizeof path))
        rc = prl_tokenizer_load(path, &tok);
    if (rc != PRL_OK) return prl_error_wrap(rc, "the run's tokenizer: ");
    json_object_set_new(runobj, "tokenizer", tok ? json_string(path) : json_null());
    json_int_t total = 0, shown = 0;
    for (size_t i = 0; rc == PRL_OK && i < n; i++) {
        prl_store_sample *smp = NULL;
        size_t ns = 0;
        rc = prl_store_samples_for_step(db, run, steps[i].step, -1, &smp, &ns);
        total += (json_int_t)ns;
        for (size_t k = 0; rc == PRL_OK && k < ns && (int)k < o->samples_per_step; k++, shown++)
            rc = sample_row(tok, &smp[k], out);
        prl_store_samples_free(smp, ns);
    }
    prl_tokenizer_free(tok);
    json_object_set_new(runobj, "samples_total", json_integer(total));
    json_object_set_new(runobj, "samples_shown", json_integer(shown));
    return rc;
}
