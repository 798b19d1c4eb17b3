/*
** keys.c — the key-table machinery shared by the job config and the SFT recipe (keys.h).
*/
#include "job/keys.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const prl_key_spec *find(const prl_key_table *t, const char *path)
{
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->keys[i].path, path)) return &t->keys[i];
    return NULL;
}

/* A path that some key's path continues ("grpo" of "grpo.clip_high"). */
static int is_section(const prl_key_table *t, const char *path)
{
    size_t n = strlen(path);
    for (int i = 0; i < t->n; i++)
        if (!strncmp(t->keys[i].path, path, n) && t->keys[i].path[n] == '.') return 1;
    return 0;
}

static prl_status unknown(const prl_key_table *t, const char *path, const char *source)
{
    const char *best = NULL;
    int best_d = 1 << 30;
    for (int i = 0; i < t->n; i++) {
        int d = prl_edit_distance(path, t->keys[i].path);
        if (d < best_d) best_d = d, best = t->keys[i].path;
    }
    if (best && best_d <= 4)
        return prl_error_set(PRL_ERR_CONFIG, "%s: unknown key '%s' (did you mean '%s'?)", source,
                             path, best);
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
static prl_status assign(void *cfg, const prl_key_spec *k, json_t *v, const char *source)
{
    char *base = (char *)cfg + k->offset;
    double x = json_is_number(v) ? json_number_value(v) : 0;
    switch (k->type) {
    case PRL_KEY_INT:
    case PRL_KEY_U64:
        if (!json_is_integer(v))
            return prl_error_set(PRL_ERR_CONFIG, "%s: key '%s' must be an integer", source,
                                 k->path);
        break;
    case PRL_KEY_REAL:
        if (!json_is_number(v))
            return prl_error_set(PRL_ERR_CONFIG, "%s: key '%s' must be a number", source, k->path);
        break;
    case PRL_KEY_BOOL:
        if (!json_is_boolean(v))
            return prl_error_set(PRL_ERR_CONFIG, "%s: key '%s' must be true or false", source,
                                 k->path);
        *(int *)base = json_is_true(v);
        return PRL_OK;
    case PRL_KEY_ARGV: {
        size_t i, n = json_array_size(v);
        json_t *a;
        if (!json_is_array(v) || n > (size_t)k->max)
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: key '%s' must be an array of at most %g strings", source,
                                 k->path, k->max);
        json_array_foreach(
            v, i, a) if (!json_is_string(a) ||
                         !*json_string_value(a)) return prl_error_set(PRL_ERR_CONFIG,
                                                                      "%s: key '%s': entry %zu "
                                                                      "must be a non-empty string",
                                                                      source, k->path, i);
        char *copy = json_dumps(v, JSON_COMPACT);
        if (!copy) return prl_error_set(PRL_ERR_NOMEM, "config list");
        free(*(char **)base);
        *(char **)base = copy;
        return PRL_OK;
    }
    case PRL_KEY_STR: {
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
    if (k->type == PRL_KEY_INT) *(int *)base = (int)json_integer_value(v);
    else if (k->type == PRL_KEY_U64) *(uint64_t *)base = (uint64_t)json_integer_value(v);
    else *(double *)base = x;
    return PRL_OK;
}

prl_status prl_keys_default(const prl_key_table *t, void *cfg)
{
    memset(cfg, 0, t->size);
    for (int i = 0; i < t->n; i++) {
        json_t *v = json_loads(t->keys[i].def, JSON_DECODE_ANY, NULL);
        prl_status rc =
            v ? assign(cfg, &t->keys[i], v, "defaults") : prl_error_set(PRL_ERR_NOMEM, "defaults");
        json_decref(v);
        if (rc) {
            prl_keys_free(t, cfg);
            return rc;
        }
    }
    return PRL_OK;
}

void prl_keys_free(const prl_key_table *t, void *cfg)
{
    for (int i = 0; i < t->n; i++)
        if (t->keys[i].type == PRL_KEY_STR || t->keys[i].type == PRL_KEY_ARGV) {
            char **s = (char **)((char *)cfg + t->keys[i].offset);
            free(*s);
            *s = NULL;
        }
    memset(cfg, 0, t->size);
}

/* Walk one object whose members continue `prefix` ("" at the top): every member must be a
** known key or a section holding keys. */
static prl_status apply_object(const prl_key_table *t, void *cfg, const char *prefix, json_t *obj,
                               const char *source)
{
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v)
    {
        char path[160];
        snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", name);
        const prl_key_spec *k = find(t, path);
        prl_status rc;
        if (k) rc = assign(cfg, k, v, source);
        else if (!is_section(t, path)) rc = unknown(t, path, source); /* suggests the nearest key */
        else if (!json_is_object(v))
            rc = prl_error_set(PRL_ERR_CONFIG, "%s: '%s' must be an object of keys", source, path);
        else rc = apply_object(t, cfg, path, v, source);
        if (rc) return rc;
    }
    return PRL_OK;
}

prl_status prl_keys_parse(const prl_key_table *t, void *cfg, const char *json_text,
                          const char *source)
{
    json_error_t err;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return prl_error_set(PRL_ERR_CONFIG, "%s:%d: invalid JSON: %s", source, err.line, err.text);
    prl_status rc =
        json_is_object(root)
            ? apply_object(t, cfg, "", root, source)
            : prl_error_set(PRL_ERR_CONFIG, "%s: a config must be a JSON object", source);
    json_decref(root);
    return rc || !t->check ? rc : t->check(cfg, source);
}

prl_status prl_keys_load(const prl_key_table *t, void *cfg, const char *path)
{
    char *text = NULL;
    size_t len = 0;
    prl_status rc = prl_file_read(path, &text, &len);
    if (rc) return rc;
    rc = prl_keys_parse(t, cfg, text, path);
    free(text);
    return rc;
}

prl_status prl_keys_set(const prl_key_table *t, void *cfg, const char *assignment)
{
    prl_status rc = prl_keys_assign(t, cfg, assignment);
    return rc || !t->check ? rc : t->check(cfg, "--set");
}

prl_status prl_keys_assign(const prl_key_table *t, void *cfg, const char *assignment)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment)
        return prl_error_set(PRL_ERR_CONFIG, "--set '%s': expected key=value", assignment);
    char path[160];
    size_t n = (size_t)(eq - assignment);
    if (n >= sizeof path) return prl_error_set(PRL_ERR_CONFIG, "--set: key too long");
    memcpy(path, assignment, n);
    path[n] = 0;
    const prl_key_spec *k = find(t, path);
    if (!k) return unknown(t, path, "--set");
    json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    if (!v) v = json_string(eq + 1); /* a bare word is a string */
    prl_status rc = v ? assign(cfg, k, v, "--set") : prl_error_set(PRL_ERR_NOMEM, "--set");
    json_decref(v);
    return rc;
}

char *prl_keys_to_json(const prl_key_table *t, const void *cfg)
{
    json_t *root = json_object();
    for (int i = 0; i < t->n && root; i++) {
        const prl_key_spec *k = &t->keys[i];
        json_t *obj = root;
        const char *seg = k->path, *dot;
        while ((dot = strchr(seg, '.')) != NULL) { /* the enclosing objects, made on demand */
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(dot - seg), seg);
            json_t *sub = json_object_get(obj, name);
            if (!sub) json_object_set_new(obj, name, sub = json_object());
            obj = sub;
            seg = dot + 1;
        }
        const char *base = (const char *)cfg + k->offset;
        json_t *v = k->type == PRL_KEY_INT    ? json_integer(*(const int *)base)
                    : k->type == PRL_KEY_U64  ? json_integer((json_int_t) * (const uint64_t *)base)
                    : k->type == PRL_KEY_REAL ? json_real(*(const double *)base)
                    : k->type == PRL_KEY_BOOL ? json_boolean(*(const int *)base)
                    : k->type == PRL_KEY_ARGV ? json_loads(*(char *const *)base, 0, NULL)
                                              : json_string(*(char *const *)base);
        json_object_set_new(obj, seg, v);
    }
    char *text =
        root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17))
             : NULL;
    json_decref(root);
    return text;
}
