/*
** generate.c — the generation loop shared by the four domains: names, configs, seeding,
** the train/eval split, the JSONL line layout, and small helpers for the generators.
**
** Candidate k of a run is drawn by the domain generator from
** prl_rng(seed, k, 16*domain + difficulty, 0, PRL_RNG_TASK) (its demonstration with c = 1).
** Its split is a hash of its canonical text (prl_tasks_canonical_text); candidates of the
** other split are skipped, so the n problems of a split are the first n candidates that
** belong to it — and a problem text can never be in both splits.
*/
#include "tasks/tasks_int.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *const domain_names[PRL_TASK_N_DOMAINS] = {"reasoning", "general", "agent",
                                                             "coding"};
static const tasks__make_fn domain_make[PRL_TASK_N_DOMAINS] = {
    tasks__reasoning_make, tasks__general_make, tasks__agent_make, tasks__coding_make};

const char *prl_tasks_domain_name(prl_task_domain d)
{
    return (unsigned)d < PRL_TASK_N_DOMAINS ? domain_names[d] : NULL;
}

prl_status prl_tasks_domain_parse(const char *name, prl_task_domain *out)
{
    for (int d = 0; d < PRL_TASK_N_DOMAINS; d++)
        if (name && !strcmp(name, domain_names[d])) {
            *out = (prl_task_domain)d;
            return PRL_OK;
        }
    return prl_error_set(PRL_ERR_ARG,
                         "unknown domain '%s' (expected reasoning, general, agent "
                         "or coding)",
                         name ? name : "(null)");
}

const char *prl_tasks_split_name(prl_task_split s)
{
    return s == PRL_SPLIT_EVAL ? "eval" : "train";
}

prl_status prl_tasks_split_parse(const char *name, prl_task_split *out)
{
    if (name && !strcmp(name, "train")) *out = PRL_SPLIT_TRAIN;
    else if (name && !strcmp(name, "eval")) *out = PRL_SPLIT_EVAL;
    else
        return prl_error_set(PRL_ERR_ARG, "unknown split '%s' (expected train or eval)",
                             name ? name : "(null)");
    return PRL_OK;
}

prl_task_split prl_tasks_split_of(const char *canonical, size_t len)
{
    uint64_t h = prl_checksum64(canonical, len, 0x73706c6974ULL);
    return h % PRL_TASKS_EVAL_MODULUS == 0 ? PRL_SPLIT_EVAL : PRL_SPLIT_TRAIN;
}

void prl_tasks_config_default(prl_tasks_config *c, prl_task_domain domain)
{
    *c = (prl_tasks_config){.domain = domain,
                            .split = PRL_SPLIT_TRAIN,
                            .difficulty = 1,
                            .n = 100,
                            .seed = 1,
                            .tool_rate = -1,
                            .think_rate = -1};
}

/* ---------------------------------------------------------------- helpers ---------- */

json_t *tasks__message(const char *role, const char *content)
{
    return json_pack("{s:s, s:s}", "role", role, "content", content);
}

prl_status tasks__append(json_t *array, const char *role, const char *content)
{
    json_t *m = tasks__message(role, content);
    if (!m || json_array_append_new(array, m) != 0)
        return prl_error_set(PRL_ERR_NOMEM, "tasks: building a message");
    return PRL_OK;
}

json_t *tasks__prompt(const char *system, const char *user)
{
    json_t *a = json_array();
    if (!a) return NULL;
    if ((system && tasks__append(a, "system", system)) || tasks__append(a, "user", user)) {
        json_decref(a);
        return NULL;
    }
    return a;
}

int64_t tasks__range(prl_rng *r, int64_t lo, int64_t hi)
{
    PRL_ASSERT(hi >= lo);
    return lo + (int64_t)(prl_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

int tasks__chance(prl_rng *r, double p) { return prl_rng_uniform(r) < p; }

void tasks__buf_printf(tasks__buf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? 2 * b->cap : 128;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

void tasks__buf_free(tasks__buf *b)
{
    free(b->s);
    memset(b, 0, sizeof *b);
}

/* ---------------------------------------------------------------- canonical text --- */

/* Length of a user text without the mode switch it may end with (the split is the
** problem's, whatever the mode). */
static size_t without_switch(const char *text)
{
    size_t n = strlen(text);
    const char *sw[2] = {PRL_MODE_THINK_SWITCH, PRL_MODE_NO_THINK_SWITCH};
    for (int i = 0; i < 2; i++) {
        size_t k = strlen(sw[i]);
        if (n >= k && !memcmp(text + n - k, sw[i], k)) return n - k;
    }
    return n;
}

/* Content of the last user message of the line's "messages", or NULL. */
static const char *last_user(const json_t *line)
{
    const char *text = NULL;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(line, "messages"), i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (role && !strcmp(role, "user")) text = json_string_value(json_object_get(m, "content"));
    }
    return text;
}

prl_status prl_tasks_canonical_text(const json_t *line, char **text)
{
    *text = NULL;
    const char *user = last_user(line);
    if (!user) return prl_error_set(PRL_ERR_FORMAT, "task has no user message");
    prl_task_domain d =
        PRL_TASK_REASONING; /* set by the parse; initialised for -Wmaybe-uninitialized */
    prl_status rc = prl_tasks_domain_parse(json_string_value(json_object_get(line, "domain")), &d);
    if (rc) return rc;
    tasks__buf b = {0};
    tasks__buf_printf(&b, "%.*s", (int)without_switch(user), user);
    if (d == PRL_TASK_AGENT) {
        prl_agent_task t;
        rc = prl_agent_task_from_spec(json_object_get(line, "env"), &t);
        if (rc) {
            tasks__buf_free(&b);
            return rc;
        }
        char world[512];
        prl_agent_world_format(&t.world, world, sizeof world);
        tasks__buf_printf(&b, "\n%s", world);
    }
    if (b.oom) {
        tasks__buf_free(&b);
        return prl_error_set(PRL_ERR_NOMEM, "canonical text");
    }
    *text = b.s;
    return PRL_OK;
}

/* ---------------------------------------------------------------- the loop --------- */

static prl_status check_config(const prl_tasks_config *c)
{
    if (!prl_tasks_domain_name(c->domain))
        return prl_error_set(PRL_ERR_ARG, "tasks: domain %d out of range", (int)c->domain);
    if (c->split != PRL_SPLIT_TRAIN && c->split != PRL_SPLIT_EVAL)
        return prl_error_set(PRL_ERR_ARG, "tasks: split %d out of range", (int)c->split);
    if (c->difficulty < 0 || c->difficulty > PRL_TASKS_MAX_DIFFICULTY)
        return prl_error_set(PRL_ERR_ARG, "tasks: difficulty %d must be 1..%d (or 0 for mixed)",
                             c->difficulty, PRL_TASKS_MAX_DIFFICULTY);
    if (c->n < 0) return prl_error_set(PRL_ERR_ARG, "tasks: n = %d must be >= 0", c->n);
    if (!(c->error_rate >= 0 && c->error_rate <= 1))
        return prl_error_set(PRL_ERR_ARG, "tasks: error rate %g must be in [0, 1]", c->error_rate);
    if (!(c->tool_rate <= 1)) /* also rejects NaN */
        return prl_error_set(PRL_ERR_ARG, "tasks: tool rate %g must be <= 1", c->tool_rate);
    if (!(c->think_rate <= 1))
        return prl_error_set(PRL_ERR_ARG, "tasks: think rate %g must be <= 1 (< 0: no modes)",
                             c->think_rate);
    return PRL_OK;
}

static void draft_free(tasks__draft *d)
{
    json_decref(d->prompt);
    json_decref(d->fields);
    json_decref(d->turns);
    free(d->think);
    memset(d, 0, sizeof *d);
}

/* The JSONL object of candidate k (fields in documented order). Steals the draft. */
static json_t *assemble(const prl_tasks_config *c, uint64_t k, int difficulty, tasks__draft *d)
{
    char id[96];
    snprintf(id, sizeof id, "%s-d%d-s%llu-%llu", domain_names[c->domain], c->difficulty,
             (unsigned long long)c->seed, (unsigned long long)k);
    json_t *line = json_pack("{s:s, s:s, s:i, s:s}", "id", id, "domain", domain_names[c->domain],
                             "difficulty", difficulty, "split", "train");
    if (!line) return NULL;
    json_t *msgs = json_deep_copy(d->prompt);
    int bad = !msgs || json_object_set_new(line, "messages", msgs) != 0;
    if (!bad && d->turns) bad = json_array_extend(msgs, d->turns) != 0;
    bad = bad || json_object_update(line, d->fields) != 0;
    if (!bad && c->demos)
        bad = json_object_set_new(line, "demo_error", json_string(d->demo_error)) != 0;
    if (bad) {
        json_decref(line);
        return NULL;
    }
    return line;
}

/* Resolved difficulty of candidate k (config 0 = mixed: drawn per candidate). */
static int difficulty_of(const prl_tasks_config *c, uint64_t k)
{
    if (c->difficulty) return c->difficulty;
    prl_rng r;
    prl_rng_init(&r, c->seed, k, 16u * c->domain, 2, PRL_RNG_TASK);
    return (int)tasks__range(&r, 1, PRL_TASKS_MAX_DIFFICULTY);
}

static double default_tool_rate(int difficulty)
{
    static const double rate[PRL_TASKS_MAX_DIFFICULTY + 1] = {0, 0.1, 0.25, 0.5};
    return rate[difficulty];
}

/* ---------------------------------------------------------------- modes ------------ */

/* The mode of candidate k (think_rate >= 0) from a draw of its own, so no other draw moves. */
static prl_tasks_mode mode_of(const prl_tasks_config *c, uint64_t k, uint64_t coord)
{
    prl_rng r;
    prl_rng_init(&r, c->seed, k, coord, 3, PRL_RNG_TASK);
    return tasks__chance(&r, c->think_rate) ? PRL_MODE_THINK : PRL_MODE_NO_THINK;
}

/* The reasoning of a domain whose generator gave none: General names the constraints to
** meet; Coding the program's shape. */
static void default_think(const prl_tasks_config *c, const json_t *fields, tasks__buf *b)
{
    if (c->domain == PRL_TASK_GENERAL) {
        tasks__buf_printf(b, "Constraints:");
        size_t i;
        json_t *con;
        json_array_foreach(json_object_get(fields, "constraints"), i, con) tasks__buf_printf(
            b, "%s %s", i ? "," : "", json_string_value(json_object_get(con, "type")));
        tasks__buf_printf(b, ".");
    } else if (c->domain == PRL_TASK_CODING) {
        tasks__buf_printf(b, "Read the input, compute, print the result.");
    } else {
        tasks__buf_printf(b, "Work it out step by step.");
    }
}

/* Put a line in mode m: the switch ends its user message, and a think demonstration's first
** assistant turn opens with the reasoning in a think block. */
static prl_status put_mode(const prl_tasks_config *c, json_t *line, prl_tasks_mode m,
                           const tasks__draft *d)
{
    json_t *msgs = json_object_get(line, "messages");
    prl_status rc = prl_tasks_mode_apply(msgs, m);
    if (rc) return rc;
    if (json_object_set_new(line, "mode", json_string(prl_tasks_mode_name(m))) != 0)
        return prl_error_set(PRL_ERR_NOMEM, "tasks: mode");
    if (m != PRL_MODE_THINK || !c->demos) return PRL_OK;
    json_t *first = NULL;
    size_t i;
    json_t *msg;
    json_array_foreach(msgs, i, msg)
    {
        const char *role = json_string_value(json_object_get(msg, "role"));
        if (role && !strcmp(role, "assistant")) {
            first = msg;
            break;
        }
    }
    if (!first) return PRL_OK;
    tasks__buf b = {0};
    tasks__buf_printf(&b, PRL_THINK_OPEN);
    if (d->think) tasks__buf_printf(&b, "%s", d->think);
    else default_think(c, d->fields, &b);
    tasks__buf_printf(&b, PRL_THINK_CLOSE "%s",
                      json_string_value(json_object_get(first, "content")));
    int bad = b.oom || json_object_set_new(first, "content", json_string(b.s)) != 0;
    tasks__buf_free(&b);
    return bad ? prl_error_set(PRL_ERR_NOMEM, "tasks: think block") : PRL_OK;
}

/* ---------------------------------------------------------------- the candidates --- */

/* Make candidate k; *line is NULL when it belongs to the other split. */
static prl_status candidate(const prl_tasks_config *c, uint64_t k, json_t **line)
{
    *line = NULL;
    int difficulty = difficulty_of(c, k);
    tasks__gen g = {.difficulty = difficulty,
                    .demos = c->demos,
                    .error_rate = c->error_rate,
                    .tool_rate = c->tool_rate >= 0 ? c->tool_rate : default_tool_rate(difficulty),
                    .moded = c->think_rate >= 0};
    uint64_t coord = 16u * c->domain + (uint64_t)difficulty;
    prl_rng_init(&g.problem, c->seed, k, coord, 0, PRL_RNG_TASK);
    prl_rng_init(&g.demo, c->seed, k, coord, 1, PRL_RNG_TASK);
    tasks__draft d = {0};
    prl_status rc = domain_make[c->domain](&g, &d);
    json_t *obj = rc ? NULL : assemble(c, k, difficulty, &d);
    if (rc) {
        draft_free(&d);
        return prl_error_wrap(rc, "%s problem %llu: ", domain_names[c->domain],
                              (unsigned long long)k);
    }
    if (!obj) {
        draft_free(&d);
        return prl_error_set(PRL_ERR_NOMEM, "tasks: building line %llu", (unsigned long long)k);
    }
    char *canon = NULL;
    rc = prl_tasks_canonical_text(obj, &canon); /* the split before the mode's switch */
    if (rc == PRL_OK && prl_tasks_split_of(canon, strlen(canon)) == c->split) {
        json_object_set_new(obj, "split", json_string(prl_tasks_split_name(c->split)));
        if (g.moded) rc = put_mode(c, obj, mode_of(c, k, coord), &d);
        if (rc == PRL_OK) *line = obj, obj = NULL;
    }
    free(canon);
    json_decref(obj);
    draft_free(&d);
    return rc;
}

prl_status prl_tasks_generate(const prl_tasks_config *c, prl_tasks_line_fn fn, void *user)
{
    prl_status rc = check_config(c);
    if (rc) return rc;
    /* An eval candidate turns up once in ~10; a split with this few distinct problems is
    ** too small for the request, and looping forever would hide that. */
    uint64_t max_candidates = 1000 + 100 * (uint64_t)c->n;
    int made = 0;
    for (uint64_t k = 0; rc == PRL_OK && made < c->n; k++) {
        if (k == max_candidates)
            return prl_error_set(PRL_ERR_RANGE,
                                 "tasks: only %d %s problems of %s in %llu "
                                 "candidates (difficulty %d): ask for fewer",
                                 made, prl_tasks_split_name(c->split), domain_names[c->domain],
                                 (unsigned long long)k, c->difficulty);
        json_t *line;
        rc = candidate(c, k, &line);
        if (rc == PRL_OK && line) {
            rc = fn(user, line);
            made++;
        }
        json_decref(line);
    }
    return rc;
}

static prl_status write_line(void *user, json_t *line)
{
    FILE *out = user;
    char *text = json_dumps(line, JSON_COMPACT);
    if (!text) return prl_error_set(PRL_ERR_NOMEM, "tasks: serialising a line");
    int ok = fputs(text, out) >= 0 && fputc('\n', out) != EOF;
    free(text);
    return ok ? PRL_OK : prl_error_set(PRL_ERR_IO, "tasks: write failed");
}

prl_status prl_tasks_write_jsonl(const prl_tasks_config *c, FILE *out)
{
    return prl_tasks_generate(c, write_line, out);
}
