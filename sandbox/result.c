/*
** result.c — results, probe reports and the policy as JSON (the format is documented field by field in
** docs/sandbox.md).
**
** Program output is arbitrary bytes; JSON strings must be UTF-8. Each stream is given as a
** UTF-8 view with every invalid sequence replaced by U+FFFD, and when the bytes were not
** valid UTF-8 also as "<stream>_base64" holding the exact bytes.
*/
#include "sandbox/internal.h"

#include "engine/tokenizer.h"

#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* A JSON string of the bytes with invalid UTF-8 replaced; *valid says whether any was. */
static json_t *utf8_string(const char *s, size_t n, int *valid)
{
    char *view = NULL;
    size_t len = 0;
    long replaced = prl_utf8_view(s, n, &view, &len);
    *valid = replaced == 0;
    json_t *j = view ? json_stringn(view, len) : NULL;
    free(view);
    return j;
}

static json_t *base64(const char *s, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *p = (const unsigned char *)s;
    char *out = malloc((n + 2) / 3 * 4 + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        out[o++] = tab[v >> 18 & 63];
        out[o++] = tab[v >> 12 & 63];
        out[o++] = i + 1 < n ? tab[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? tab[v & 63] : '=';
    }
    json_t *j = json_stringn(out, o);
    free(out);
    return j;
}

static void add_stream(json_t *o, const char *name, const char *buf, size_t len, uint64_t total,
                       int truncated)
{
    char key[32];
    int valid;
    json_object_set_new(o, name, utf8_string(buf ? buf : "", buf ? len : 0, &valid));
    snprintf(key, sizeof key, "%s_truncated", name);
    json_object_set_new(o, key, json_boolean(truncated));
    snprintf(key, sizeof key, "%s_bytes", name);
    json_object_set_new(o, key, json_integer((json_int_t)total));
    if (!valid) {
        snprintf(key, sizeof key, "%s_base64", name);
        json_object_set_new(o, key, base64(buf, len));
    }
}

static const char *cgroup_name(int version)
{
    return version == 1 ? "v1" : version == 2 ? "v2" : "none";
}

static json_t *layers_object(unsigned layers)
{
    json_t *o = json_object();
    for (int i = 0; i < PRL_SANDBOX_N_LAYERS; i++)
        json_object_set_new(o, prl_sandbox_layer_name(1u << i), json_boolean(layers & (1u << i)));
    return o;
}

static json_t *limits_object(const prl_sandbox_limits *l)
{
    json_t *o = json_object();
    json_object_set_new(o, "cpu_seconds", json_real(l->cpu_seconds));
    json_object_set_new(o, "wall_seconds", json_real(l->wall_seconds));
    json_object_set_new(o, "memory_bytes", json_integer((json_int_t)l->memory_bytes));
    json_object_set_new(o, "output_bytes", json_integer((json_int_t)l->output_bytes));
    json_object_set_new(o, "output_kill", json_boolean(l->output_kill));
    json_object_set_new(o, "processes", json_integer(l->processes));
    json_object_set_new(o, "open_files", json_integer(l->open_files));
    json_object_set_new(o, "file_size_bytes", json_integer((json_int_t)l->file_size_bytes));
    json_object_set_new(o, "disk_bytes", json_integer((json_int_t)l->disk_bytes));
    return o;
}

static char *dump(json_t *o, int indent)
{
    size_t flags = JSON_REAL_PRECISION(6) | (indent > 0 ? JSON_INDENT(indent) : JSON_COMPACT);
    char *s = json_dumps(o, flags);
    json_decref(o);
    return s;
}

char *prl_sandbox_result_to_json(const prl_sandbox_result *r, int indent)
{
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "status", json_string(prl_sandbox_status_name(r->status)));
    int valid;
    json_object_set_new(o, "reason", utf8_string(r->reason, strlen(r->reason), &valid));
    json_object_set_new(o, "exit_code", json_integer(r->exit_code));
    const char *abbrev = r->signal ? sigabbrev_np(r->signal) : NULL;
    char sname[32];
    snprintf(sname, sizeof sname, "SIG%s", abbrev ? abbrev : "?");
    json_object_set_new(o, "signal", r->signal ? json_integer(r->signal) : json_null());
    json_object_set_new(o, "signal_name", r->signal ? json_string(sname) : json_null());
    add_stream(o, "stdout", r->out, r->out_len, r->out_total, r->out_truncated);
    add_stream(o, "stderr", r->err, r->err_len, r->err_total, r->err_truncated);
    json_object_set_new(o, "wall_seconds", json_real(r->wall_seconds));
    json_object_set_new(o, "cpu_seconds", json_real(r->cpu_seconds));
    json_object_set_new(o, "peak_memory_bytes", json_integer((json_int_t)r->peak_memory_bytes));
    json_object_set_new(o, "peak_memory_source",
                        json_string(r->peak_memory_from_cgroup ? "cgroup" : "rusage"));
    json_object_set_new(o, "limits", limits_object(&r->limits));
    json_t *iso = layers_object(r->layers);
    json_object_set_new(iso, "cgroup", json_string(cgroup_name(r->cgroup_version)));
    json_object_set_new(iso, "slot", json_integer(r->slot));
    json_object_set_new(iso, "uid", json_integer(r->uid));
    json_object_set_new(o, "isolation", iso);
    return dump(o, indent);
}

static json_t *strings_array(const char *const *names, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_string(names[i]));
    return a;
}

static json_t *policy_object(const prl_sandbox_policy *p)
{
    json_t *o = json_object();
    json_object_set_new(o, "mode", json_string(p->mode));
    json_object_set_new(o, "namespaces_missing", json_string(p->namespaces_missing));
    json_object_set_new(o, "seccomp", json_boolean(p->seccomp));
    json_object_set_new(o, "socket_families",
                        p->seccomp ? strings_array(p->families, (size_t)p->n_families)
                                   : json_null());
    json_object_set_new(o, "refused_syscalls", strings_array(p->refused, p->n_refused));
    json_t *when = json_object();
    for (size_t i = 0; i < p->n_conditional; i++)
        json_object_set_new(when, p->conditional[i][0], json_string(p->conditional[i][1]));
    json_object_set_new(o, "refused_with_arguments", when);
    json_t *lim = json_object();
    json_object_set_new(lim, "default", limits_object(&p->defaults));
    json_t *max = limits_object(&p->maxima);
    json_object_del(max, "output_kill");
    json_object_set_new(max, "file_size_bytes", json_null());
    json_object_set_new(lim, "maximum", max);
    json_object_set_new(o, "limits", lim);
    return o;
}

char *prl_sandbox_caps_to_json(const prl_sandbox_caps *caps, unsigned used, int indent)
{
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "available", layers_object(caps->layers));
    json_object_set_new(o, "used", layers_object(used));
    json_t *why = json_object();
    for (int i = 0; i < PRL_SANDBOX_N_LAYERS; i++)
        if (caps->why[i][0])
            json_object_set_new(why, prl_sandbox_layer_name(1u << i), json_string(caps->why[i]));
    json_object_set_new(o, "missing_because", why);
    json_object_set_new(o, "is_root", json_boolean(caps->is_root));
    json_object_set_new(o, "landlock_abi", json_integer(caps->landlock_abi));
    json_object_set_new(o, "cgroup", json_string(cgroup_name(caps->cgroup_version)));
    json_object_set_new(o, "cgroup_kill", json_string(caps->cgroup_kill_kind));
    if (caps->cgroup_note[0]) json_object_set_new(o, "cgroup_note", json_string(caps->cgroup_note));
    prl_sandbox_policy p;
    prl_sandbox_policy_get(used, &p);
    json_object_set_new(o, "policy", policy_object(&p));
    return dump(o, indent);
}
