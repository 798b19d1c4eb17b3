/*
** pairs.c — preference pairs: the reader of pairs files (rm.h, docs/formats.md) and the
** General pairs of `prl rm pairs`, a good answer (the generator's demonstration, checked by
** the verifier) against four ways GRPO was seen to game the rule checks: a repeated word,
** another problem's answer, the constraints' words listed, and an answer cut short.
*/
#include "rm/rm.h"

#include "reward/reward.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- reading ---------- */

void prl_rm_pairs_free(prl_rm_pairs *p)
{
    for (int i = 0; p->p && i < p->n; i++) {
        free(p->p[i].msgs);
        json_decref(p->p[i].line);
    }
    free(p->p);
    memset(p, 0, sizeof *p);
}

/* The prompt of a line: "messages" (a chat) or "prompt" (one user message). */
static prl_status line_prompt(prl_rm_pair *q, const char *where)
{
    json_t *msgs = json_object_get(q->line, "messages");
    json_t *prompt = json_object_get(q->line, "prompt");
    if (msgs && prompt)
        return prl_error_set(PRL_ERR_FORMAT, "%s: give \"prompt\" or \"messages\", not both",
                             where);
    if (msgs) {
        prl_status rc = prl_chat_from_json(msgs, where, &q->msgs, &q->n_msgs);
        if (!rc && q->n_msgs == 0)
            rc = prl_error_set(PRL_ERR_FORMAT, "%s: \"messages\" is empty", where);
        return rc;
    }
    if (!json_is_string(prompt))
        return prl_error_set(PRL_ERR_FORMAT, "%s: needs a string \"prompt\" or a \"messages\" chat",
                             where);
    q->msgs = malloc(sizeof *q->msgs);
    if (!q->msgs) return prl_error_set(PRL_ERR_NOMEM, "pairs");
    q->msgs[0] = (prl_chat_message){"user", json_string_value(prompt)};
    q->n_msgs = 1;
    return PRL_OK;
}

static prl_status parse_pair(prl_rm_pair *q, const char *where)
{
    if (!json_is_object(q->line))
        return prl_error_set(PRL_ERR_FORMAT, "%s: expected a JSON object", where);
    prl_status rc = line_prompt(q, where);
    if (rc) return rc;
    static const char *const keys[] = {"chosen", "rejected"};
    const char **dst[] = {&q->chosen, &q->rejected};
    for (int k = 0; k < 2; k++) {
        *dst[k] = json_string_value(json_object_get(q->line, keys[k]));
        if (!*dst[k] || !**dst[k])
            return prl_error_set(PRL_ERR_FORMAT, "%s: needs a non-empty string \"%s\"", where,
                                 keys[k]);
    }
    json_t *m = json_object_get(q->line, "margin");
    q->margin = m ? json_number_value(m) : -1;
    if (m && (!json_is_number(m) || !(q->margin >= 0) || q->margin > 1e6))
        return prl_error_set(PRL_ERR_FORMAT, "%s: \"margin\" must be a number >= 0", where);
    return PRL_OK;
}

prl_status prl_rm_pairs_read(const char *path, prl_rm_pairs *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return prl_error_set(PRL_ERR_IO, "%s: cannot open", path);
    char *buf = NULL;
    size_t cap = 0;
    ssize_t len;
    int line_no = 0, cap_pairs = 0;
    prl_status rc = PRL_OK;
    while (!rc && (len = getline(&buf, &cap, f)) >= 0) {
        line_no++;
        char where[1100];
        snprintf(where, sizeof where, "%s:%d", path, line_no);
        size_t k = 0;
        while (k < (size_t)len && isspace((unsigned char)buf[k])) k++;
        if (k == (size_t)len) continue; /* a blank line */
        if (out->n == cap_pairs) {
            cap_pairs = cap_pairs ? 2 * cap_pairs : 256;
            prl_rm_pair *p = realloc(out->p, (size_t)cap_pairs * sizeof *p);
            if (!p) {
                rc = prl_error_set(PRL_ERR_NOMEM, "pairs");
                break;
            }
            out->p = p;
        }
        prl_rm_pair *q = &out->p[out->n++];
        memset(q, 0, sizeof *q);
        json_error_t je;
        q->line = json_loadb(buf, (size_t)len, JSON_REJECT_DUPLICATES, &je);
        rc = q->line ? parse_pair(q, where)
                     : prl_error_set(PRL_ERR_FORMAT, "%s: invalid JSON: %s", where, je.text);
    }
    free(buf);
    fclose(f);
    if (!rc && out->n == 0) rc = prl_error_set(PRL_ERR_FORMAT, "%s: no pairs", path);
    if (rc) prl_rm_pairs_free(out);
    return rc;
}

/* ---------------------------------------------------------------- General pairs ---- */

/* The words of a text as byte spans (split at whitespace), so that an edit keeps the rest of
** the text — its lines, bullets and punctuation — as it was. */
typedef struct words {
    const char *text;
    int (*span)[2]; /* [start, end) of each word */
    int n;
} words;

static int words_split(words *ws, const char *text)
{
    ws->text = text, ws->n = 0;
    ws->span = malloc((strlen(text) / 2 + 2) * sizeof *ws->span);
    if (!ws->span) return -1;
    for (int i = 0; text[i];) {
        while (text[i] && isspace((unsigned char)text[i])) i++;
        if (!text[i]) break;
        ws->span[ws->n][0] = i;
        while (text[i] && !isspace((unsigned char)text[i])) i++;
        ws->span[ws->n++][1] = i;
    }
    return 0;
}

static void words_free(words *ws) { free(ws->span); }

/* Growable text. */
typedef struct sbuf {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2 + 64;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p, b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_word(sbuf *b, const char *w)
{
    if (b->n) sb_add(b, " ", 1);
    sb_add(b, w, strlen(w));
}

/* A word of w without its punctuation, lowercased, into out. */
static void bare(const char *w, char *out, size_t n)
{
    size_t k = 0;
    for (; *w && k + 1 < n; w++)
        if (isalnum((unsigned char)*w) || *w == '\'') out[k++] = (char)tolower((unsigned char)*w);
    out[k] = 0;
}

/* "repeated": the good answer with one of its words said 5–8 times in a row before it (the
** copies bare and lowercased, the rest of the text untouched). */
static char *make_repeated(const words *ws, prl_rng *r)
{
    sbuf b = {0};
    int at = (int)(prl_rng_u64(r) % (uint64_t)ws->n), times = 5 + (int)(prl_rng_u64(r) % 4);
    char w[64], raw[64];
    int s0 = ws->span[at][0], len = ws->span[at][1] - s0;
    snprintf(raw, sizeof raw, "%.*s", len, ws->text + s0);
    bare(raw, w, sizeof w);
    if (!*w) snprintf(w, sizeof w, "very");
    sb_add(&b, ws->text, (size_t)s0);
    for (int k = 0; k < times; k++) {
        sb_add(&b, w, strlen(w));
        sb_add(&b, " ", 1);
    }
    sb_add(&b, ws->text + s0, strlen(ws->text + s0));
    if (b.oom) free(b.s);
    return b.oom ? NULL : b.s;
}

/* "truncated": the text up to the end of its first 30–70 % of words (at least one, one fewer
** than all): a prefix of the good answer. */
static char *make_truncated(const words *ws, prl_rng *r)
{
    int keep = (int)(ws->n * (0.3 + 0.4 * prl_rng_uniform(r)));
    if (keep < 1) keep = 1;
    if (keep >= ws->n) keep = ws->n - 1;
    int end = ws->span[keep - 1][1];
    char *out = malloc((size_t)end + 1);
    if (!out) return NULL;
    memcpy(out, ws->text, (size_t)end);
    out[end] = 0;
    return out;
}

/* "stuffed": the words the constraints name and the topic's words, 6–12 of them drawn with
** repeats, capitalised and ended by '.' — the padding GRPO learned ("Old small red ..."). */
static char *make_stuffed(const json_t *task, prl_rng *r)
{
    const char *vocab[3 * 40 + 40];
    int nv = 0;
    size_t i;
    const json_t *c, *x;
    json_array_foreach(json_object_get(task, "constraints"), i, c)
    {
        static const char *const keys[] = {"word", "first", "second"};
        for (int k = 0; k < 3 && nv < 120; k++) {
            const char *w = json_string_value(json_object_get(c, keys[k]));
            if (w && *w) vocab[nv++] = w;
        }
    }
    json_array_foreach(json_object_get(task, "topic_words"), i, x)
    {
        if (nv < 160 && json_string_value(x)) vocab[nv++] = json_string_value(x);
    }
    if (nv == 0) vocab[nv++] = "good";
    sbuf b = {0};
    int n = 6 + (int)(prl_rng_u64(r) % 7);
    for (int k = 0; k < n; k++) sb_word(&b, vocab[prl_rng_u64(r) % (uint64_t)nv]);
    sb_add(&b, ".", 1);
    if (!b.oom) b.s[0] = (char)toupper((unsigned char)b.s[0]);
    if (b.oom) free(b.s);
    return b.oom ? NULL : b.s;
}

/* The demonstration's answer (the last message) and whether the verifier scores it 1. */
static const char *good_answer(const json_t *task)
{
    json_t *msgs = json_object_get(task, "messages");
    size_t n = json_array_size(msgs);
    json_t *last = json_array_get(msgs, n ? n - 1 : 0);
    const char *role = json_string_value(json_object_get(last, "role"));
    const char *text = json_string_value(json_object_get(last, "content"));
    if (!role || strcmp(role, "assistant") || !text || !*text) return NULL;
    char *js = json_dumps(task, JSON_COMPACT);
    prl_chat_message turn = {"assistant", text};
    prl_reward_result res;
    int ok = js && prl_reward_general(js, &turn, 1, &res) == PRL_OK && res.score >= 1.0;
    free(js);
    return ok ? text : NULL;
}

typedef struct pairs_ctx {
    const prl_rm_pairs_options *o;
    FILE *out;
    int problem, written, skipped;
    char *prev_good; /* the previous problem's good answer (off_topic) */
} pairs_ctx;

static prl_status write_pair(pairs_ctx *c, const json_t *task, const char *good, const char *bad,
                             const char *kind)
{
    json_t *msgs = json_deep_copy(json_object_get(task, "messages"));
    json_array_remove(msgs, json_array_size(msgs) - 1); /* the prompt: without the answer */
    char id[160];
    snprintf(id, sizeof id, "%s-%s", json_string_value(json_object_get(task, "id")), kind);
    json_t *o = json_pack("{s:s, s:s, s:o, s:s, s:s}", "id", id, "kind", kind, "messages", msgs,
                          "chosen", good, "rejected", bad);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text) return prl_error_set(PRL_ERR_NOMEM, "pairs");
    int bad_io = fprintf(c->out, "%s\n", text) < 0;
    free(text);
    if (bad_io) return prl_error_set(PRL_ERR_IO, "pairs: write failed");
    c->written++;
    return PRL_OK;
}

static prl_status on_task(void *user, json_t *task)
{
    pairs_ctx *c = user;
    int k = c->problem++;
    const char *good = good_answer(task);
    if (!good) { /* a demonstration the verifier does not pass is no "chosen" */
        c->skipped++;
        return PRL_OK;
    }
    words ws;
    prl_status rc = PRL_OK;
    if (words_split(&ws, good) || ws.n < 2) {
        words_free(&ws);
        c->skipped++;
        return PRL_OK;
    }
    prl_rng r;
    char *bad[4] = {NULL};
    static const char *const kinds[4] = {"repeated", "off_topic", "stuffed", "truncated"};
    prl_rng_init(&r, c->o->seed, (uint64_t)k, 100, 0, PRL_RNG_TASK);
    bad[0] = make_repeated(&ws, &r);
    bad[1] = c->prev_good ? strdup(c->prev_good) : NULL; /* the first problem has none */
    prl_rng_init(&r, c->o->seed, (uint64_t)k, 102, 0, PRL_RNG_TASK);
    bad[2] = make_stuffed(task, &r);
    prl_rng_init(&r, c->o->seed, (uint64_t)k, 103, 0, PRL_RNG_TASK);
    bad[3] = make_truncated(&ws, &r);
    for (int i = 0; !rc && i < 4; i++)
        if (bad[i] && strcmp(bad[i], good)) rc = write_pair(c, task, good, bad[i], kinds[i]);
    for (int i = 0; i < 4; i++) free(bad[i]);
    words_free(&ws);
    free(c->prev_good);
    c->prev_good = strdup(good);
    return rc;
}

prl_status prl_rm_pairs_write(const prl_rm_pairs_options *o, FILE *out, int *written)
{
    prl_tasks_config tc;
    prl_tasks_config_default(&tc, PRL_TASK_GENERAL);
    tc.n = o->n, tc.seed = o->seed, tc.split = o->split, tc.difficulty = o->difficulty;
    tc.demos = 1, tc.error_rate = 0;
    pairs_ctx c = {.o = o, .out = out};
    prl_status rc = prl_tasks_generate(&tc, on_task, &c);
    free(c.prev_good);
    if (written) *written = c.written;
    return rc;
}
