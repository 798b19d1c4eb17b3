/*
** job.c — the job configuration: a table of keys (path, type, field, range, choices) drives
** defaults, parsing, `--set` overrides, validation and serialisation alike (job.h).
*/
#include "job/job.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum key_type { K_INT, K_U64, K_REAL, K_BOOL, K_STR } key_type;

typedef struct key_spec {
    const char *path;      /* "grpo.clip_high" */
    key_type type;
    size_t offset;         /* into prl_job_config */
    double min, max;       /* numbers: allowed range (inclusive) */
    const char *def;       /* default, as JSON text */
    const char *choices;   /* strings: "a|b|c", or NULL for free text */
} key_spec;

#define F(field) offsetof(prl_job_config, field)
#define BIG 1e18

static const key_spec keys[] = {
    {"run.name", K_STR, F(name), 0, 0, "\"job\"", NULL},
    {"run.seed", K_U64, F(seed), 0, BIG, "1", NULL},
    {"model.init", K_STR, F(init), 0, 0, "\"runs/sft-base/ckpt\"", NULL},
    {"task.domain", K_STR, F(domain), 0, 0, "\"reasoning\"", "reasoning|general|agent|coding"},
    {"task.difficulty", K_INT, F(difficulty), 0, 3, "0", NULL},
    {"task.train_problems", K_INT, F(train_problems), 1, 1e7, "2000", NULL},
    {"task.eval_problems", K_INT, F(eval_problems), 1, 1e6, "100", NULL},
    {"rollout.workers", K_INT, F(rollout_workers), 1, 64, "1", NULL},
    {"rollout.batch_prompts", K_INT, F(batch_prompts), 1, 4096, "8", NULL},
    {"rollout.group_size", K_INT, F(group_size), 1, 1024, "8", NULL},
    {"rollout.max_new_tokens", K_INT, F(max_new_tokens), 1, 65536, "96", NULL},
    {"rollout.max_turns", K_INT, F(max_turns), 1, 64, "10", NULL},
    {"rollout.temperature", K_REAL, F(temperature), 0, 100, "1.0", NULL},
    {"rollout.top_p", K_REAL, F(top_p), 1e-9, 1, "1.0", NULL},
    {"rollout.precision", K_STR, F(precision), 0, 0, "\"fp32\"", "fp32|bf16|fp16|aligned"},
    {"rollout.threads", K_INT, F(rollout_threads), 0, 256, "0", NULL},
    {"reward.workers", K_INT, F(reward_workers), 1, 64, "1", NULL},
    {"reward.timeout", K_REAL, F(reward_timeout), 0.01, 3600, "2.0", NULL},
    {"sandbox.slots", K_INT, F(sandbox_slots), 1, 256, "2", NULL},
    {"trainer.threads", K_INT, F(trainer_threads), 0, 256, "0", NULL},
    {"grpo.adv_norm", K_STR, F(adv_norm), 0, 0, "\"std\"", "std|none"},
    {"grpo.adv_eps", K_REAL, F(adv_eps), 1e-12, 1, "1e-6", NULL},
    {"grpo.singleton", K_STR, F(singleton), 0, 0, "\"zero\"", "zero|verl|drop"},
    {"grpo.clip_low", K_REAL, F(clip_low), 0, 0.999999, "0.2", NULL},
    {"grpo.clip_high", K_REAL, F(clip_high), 0, 100, "0.28", NULL},
    {"grpo.clip_c", K_REAL, F(clip_c), 0, 1e6, "3.0", NULL},
    {"grpo.loss_agg", K_STR, F(loss_agg), 0, 0, "\"token-mean\"",
     "token-mean|token-sum|seq-mean-token-mean|seq-mean-token-sum|seq-mean-token-sum-norm"},
    {"grpo.loss_scale_factor", K_REAL, F(loss_scale_factor), 0, 1e9, "0", NULL},
    {"grpo.kl_coef", K_REAL, F(kl_coef), 0, 1e3, "0", NULL},
    {"grpo.ppo_epochs", K_INT, F(ppo_epochs), 1, 100, "1", NULL},
    {"grpo.minibatches", K_INT, F(minibatches), 1, 4096, "1", NULL},
    {"optim.kind", K_STR, F(optimizer), 0, 0, "\"adamw\"", "adamw|muon"},
    {"optim.lr", K_REAL, F(lr), 1e-12, 10, "1e-5", NULL},
    {"optim.weight_decay", K_REAL, F(weight_decay), 0, 10, "0", NULL},
    {"optim.grad_clip", K_REAL, F(grad_clip), 0, 1e9, "1.0", NULL},
    {"optim.warmup", K_INT, F(warmup), 0, 1e9, "0", NULL},
    {"controller.mode", K_STR, F(mode), 0, 0, "\"sync\"", "sync|async"},
    {"controller.max_lag", K_INT, F(max_lag), 0, 1000, "1", NULL},
    {"controller.steps", K_INT, F(steps), 1, 1e9, "50", NULL},
    {"controller.dynamic_sampling", K_BOOL, F(dynamic_sampling), 0, 1, "false", NULL},
    {"controller.retire_solved_epochs", K_INT, F(retire_solved_epochs), 0, 64, "0", NULL},
    {"controller.lease_seconds", K_REAL, F(lease_seconds), 0.1, 86400, "60", NULL},
    {"controller.heartbeat_seconds", K_REAL, F(heartbeat_seconds), 0.01, 3600, "2", NULL},
    {"checkpoint.every", K_INT, F(checkpoint_every), 0, 1e9, "10", NULL},
};
enum { N_KEYS = sizeof keys / sizeof keys[0] };

static const key_spec *find(const char *path)
{
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].path, path)) return &keys[i];
    return NULL;
}

/* A top-level name that starts some key's path ("grpo" of "grpo.clip_high"). */
static int is_section(const char *name)
{
    size_t n = strlen(name);
    for (int i = 0; i < N_KEYS; i++)
        if (!strncmp(keys[i].path, name, n) && keys[i].path[n] == '.') return 1;
    return 0;
}

static prl_status unknown(const char *path, const char *source)
{
    const char *best = NULL;
    int best_d = 1 << 30;
    for (int i = 0; i < N_KEYS; i++) {
        int d = prl_edit_distance(path, keys[i].path);
        if (d < best_d) best_d = d, best = keys[i].path;
    }
    if (best && best_d <= 4)
        return prl_error_set(PRL_ERR_CONFIG, "%s: unknown key '%s' (did you mean '%s'?)", source, path, best);
    return prl_error_set(PRL_ERR_CONFIG, "%s: unknown key '%s'", source, path);
}

static int in_choices(const char *choices, const char *s)
{
    size_t n = strlen(s);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !strncmp(p, s, n)) return 1;
        p += len + (bar != NULL);
    }
    return 0;
}

/* Store JSON value v into the key's field, checking its type, range and choices. */
static prl_status assign(prl_job_config *c, const key_spec *k, json_t *v, const char *source)
{
    char *base = (char *)c + k->offset;
    double x = json_is_number(v) ? json_number_value(v) : 0;
    switch (k->type) {
    case K_INT:
    case K_U64:
        if (!json_is_integer(v))
            return prl_error_set(PRL_ERR_CONFIG, "%s: key '%s' must be an integer", source, k->path);
        break;
    case K_REAL:
        if (!json_is_number(v))
            return prl_error_set(PRL_ERR_CONFIG, "%s: key '%s' must be a number", source, k->path);
        break;
    case K_BOOL:
        if (!json_is_boolean(v))
            return prl_error_set(PRL_ERR_CONFIG, "%s: key '%s' must be true or false", source, k->path);
        *(int *)base = json_is_true(v);
        return PRL_OK;
    case K_STR: {
        if (!json_is_string(v))
            return prl_error_set(PRL_ERR_CONFIG, "%s: key '%s' must be a string", source, k->path);
        const char *s = json_string_value(v);
        if (k->choices && !in_choices(k->choices, s))
            return prl_error_set(PRL_ERR_CONFIG, "%s: key '%s': '%s' is not one of %s", source,
                                 k->path, s, k->choices);
        char *copy = strdup(s);
        if (!copy) return prl_error_set(PRL_ERR_NOMEM, "config string");
        free(*(char **)base);
        *(char **)base = copy;
        return PRL_OK;
    }
    }
    if (!isfinite(x) || x < k->min || x > k->max)
        return prl_error_set(PRL_ERR_CONFIG, "%s: key '%s' = %g is out of range [%g, %g]", source,
                             k->path, x, k->min, k->max);
    if (k->type == K_INT) *(int *)base = (int)json_integer_value(v);
    else if (k->type == K_U64) *(uint64_t *)base = (uint64_t)json_integer_value(v);
    else *(double *)base = x;
    return PRL_OK;
}

prl_status prl_job_config_default(prl_job_config *c)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < N_KEYS; i++) {
        json_t *v = json_loads(keys[i].def, JSON_DECODE_ANY, NULL);
        prl_status rc = v ? assign(c, &keys[i], v, "defaults") : prl_error_set(PRL_ERR_NOMEM, "defaults");
        json_decref(v);
        if (rc) {
            prl_job_config_free(c);
            return rc;
        }
    }
    return PRL_OK;
}

void prl_job_config_free(prl_job_config *c)
{
    for (int i = 0; i < N_KEYS; i++)
        if (keys[i].type == K_STR) free(*(char **)((char *)c + keys[i].offset));
    memset(c, 0, sizeof *c);
}

/* Walk one section object: every member must be a known key. */
static prl_status apply_section(prl_job_config *c, const char *section, json_t *obj, const char *source)
{
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        char path[128];
        snprintf(path, sizeof path, "%s.%s", section, name);
        const key_spec *k = find(path);
        if (!k) return unknown(path, source);
        prl_status rc = assign(c, k, v, source);
        if (rc) return rc;
    }
    return PRL_OK;
}

prl_status prl_job_config_parse(prl_job_config *c, const char *json_text, const char *source)
{
    json_error_t err;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return prl_error_set(PRL_ERR_CONFIG, "%s:%d: invalid JSON: %s", source, err.line, err.text);
    prl_status rc = json_is_object(root) ? PRL_OK
                  : prl_error_set(PRL_ERR_CONFIG, "%s: a job config must be a JSON object", source);
    const char *section;
    json_t *obj;
    json_object_foreach(root, section, obj) {
        if (rc) break;
        if (!is_section(section)) {
            rc = unknown(section, source); /* suggests the nearest key, e.g. run.seed for seed */
            break;
        }
        if (!json_is_object(obj)) {
            rc = prl_error_set(PRL_ERR_CONFIG, "%s: '%s' must be an object of keys", source, section);
            break;
        }
        rc = apply_section(c, section, obj, source);
    }
    json_decref(root);
    return rc ? rc : prl_job_config_check(c, source);
}

prl_status prl_job_config_load(prl_job_config *c, const char *path)
{
    char *text = NULL;
    size_t len = 0;
    prl_status rc = prl_file_read(path, &text, &len);
    if (rc) return rc;
    rc = prl_job_config_parse(c, text, path);
    free(text);
    return rc;
}

prl_status prl_job_config_set(prl_job_config *c, const char *assignment)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment)
        return prl_error_set(PRL_ERR_CONFIG, "--set '%s': expected key=value", assignment);
    char path[128];
    size_t n = (size_t)(eq - assignment);
    if (n >= sizeof path) return prl_error_set(PRL_ERR_CONFIG, "--set: key too long");
    memcpy(path, assignment, n);
    path[n] = 0;
    const key_spec *k = find(path);
    if (!k) return unknown(path, "--set");
    json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    if (!v) v = json_string(eq + 1); /* a bare word is a string */
    prl_status rc = v ? assign(c, k, v, "--set") : prl_error_set(PRL_ERR_NOMEM, "--set");
    json_decref(v);
    return rc ? rc : prl_job_config_check(c, "--set");
}

prl_status prl_job_config_check(const prl_job_config *c, const char *source)
{
    if ((long)c->batch_prompts * c->group_size <= 0)
        return prl_error_set(PRL_ERR_CONFIG, "%s: rollout.batch_prompts x rollout.group_size = %d x %d "
                             "must be > 0", source, c->batch_prompts, c->group_size);
    if (c->clip_c != 0 && c->clip_c <= 1)
        return prl_error_set(PRL_ERR_CONFIG, "%s: key 'grpo.clip_c' = %g must be > 1 (or 0 to "
                             "disable the dual clip)", source, c->clip_c);
    if (!strcmp(c->loss_agg, "seq-mean-token-sum-norm") && !(c->loss_scale_factor > 0))
        return prl_error_set(PRL_ERR_CONFIG, "%s: key 'grpo.loss_scale_factor' must be > 0 with "
                             "grpo.loss_agg = seq-mean-token-sum-norm", source);
    if (c->minibatches > c->batch_prompts * c->group_size)
        return prl_error_set(PRL_ERR_CONFIG, "%s: key 'grpo.minibatches' = %d exceeds the %d "
                             "samples of a step", source, c->minibatches, c->batch_prompts * c->group_size);
    if (c->heartbeat_seconds >= c->lease_seconds)
        return prl_error_set(PRL_ERR_CONFIG, "%s: key 'controller.heartbeat_seconds' = %g must be "
                             "below controller.lease_seconds = %g", source, c->heartbeat_seconds,
                             c->lease_seconds);
    return PRL_OK;
}

char *prl_job_config_to_json(const prl_job_config *c)
{
    json_t *root = json_object();
    for (int i = 0; i < N_KEYS && root; i++) {
        const key_spec *k = &keys[i];
        char section[64];
        const char *dot = strchr(k->path, '.');
        snprintf(section, sizeof section, "%.*s", (int)(dot - k->path), k->path);
        json_t *obj = json_object_get(root, section);
        if (!obj) json_object_set_new(root, section, obj = json_object());
        const char *base = (const char *)c + k->offset;
        json_t *v = k->type == K_INT ? json_integer(*(const int *)base)
                  : k->type == K_U64 ? json_integer((json_int_t) * (const uint64_t *)base)
                  : k->type == K_REAL ? json_real(*(const double *)base)
                  : k->type == K_BOOL ? json_boolean(*(const int *)base)
                  : json_string(*(char *const *)base);
        json_object_set_new(obj, dot + 1, v);
    }
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(root);
    return text;
}
