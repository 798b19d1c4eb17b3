/*
** args.c — flag parsing, help text and error printing shared by every subcommand.
**
** Flags are declared as a table per subcommand, so the parser, the --help text and the
** "unknown flag" errors come from one place. Numbers are parsed strictly: trailing junk,
** overflow and empty values are errors that name the flag.
*/
#include "cli/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void cli_print_help(FILE *out, const char *usage, const char *summary, const cli_opt *opts)
{
    fprintf(out, "usage: %s\n\n%s\n", usage, summary);
    if (opts && opts[0].name) fprintf(out, "\noptions:\n");
    for (const cli_opt *o = opts; o && o->name; o++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(out, "  %-24s %s%s\n", left, o->help, o->required ? " (required)" : "");
    }
    fprintf(out, "  %-24s %s\n", "--help", "show this help");
}

int cli_failf(const char *cmd, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "prl %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return code;
}

int cli_fail(const char *cmd) { return cli_failf(cmd, 1, "%s", prl_error_message()); }

void cli_command_names(const cli_command *c, int n, char *out, size_t size)
{
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < n && k < size; i++)
        k += (size_t)snprintf(out + k, size - k, "%s%s", i ? "|" : "", c[i].name);
}

const char *cli_did_you_mean(const char *word, const char *choices)
{
    static char out[160];
    char best[64] = "", choice[64];
    int best_d = 1 << 30;
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        snprintf(choice, sizeof choice, "%.*s", (int)len, p);
        int d = prl_edit_distance(word, choice);
        if (d < best_d && (d <= 2 || 3 * d <= (int)len))
            best_d = d, snprintf(best, sizeof best, "%s", choice);
        p += len + (bar != NULL);
    }
    if (*best) snprintf(out, sizeof out, " (did you mean '%s'?)", best);
    else out[0] = 0;
    return out;
}

int cli_require_new(const char *cmd, const char *flag, const char *path)
{
    struct stat sb;
    if (!*path) return cli_failf(cmd, 2, "--%s: the path is empty", flag);
    if (lstat(path, &sb) == 0)
        return cli_failf(cmd, 2,
                         "--%s %s exists: choose a new path (prl writes only what it creates, so "
                         "it never replaces an existing one)",
                         flag, path);
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", path);
    char *slash = strrchr(parent, '/');
    if (!slash) snprintf(parent, sizeof parent, ".");
    else if (slash == parent) parent[1] = 0;
    else *slash = 0;
    if (stat(parent, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return cli_failf(cmd, 2, "--%s %s: the folder %s does not exist", flag, path, parent);
    if (access(parent, W_OK) != 0)
        return cli_failf(cmd, 2, "--%s %s: the folder %s is not writable", flag, path, parent);
    return 0;
}

static int parse_value(cli_opt *o, const char *v)
{
    char *end = NULL;
    errno = 0;
    switch (o->type) {
    case OPT_STR: *(const char **)o->ptr = v; return 0;
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno || x < -2147483647L || x > 2147483647L) return -1;
        *(int *)o->ptr = (int)x;
        return 0;
    }
    case OPT_U64: {
        if (*v == '-') return -1;
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || errno) return -1;
        *(uint64_t *)o->ptr = x;
        return 0;
    }
    case OPT_DOUBLE: {
        double x = strtod(v, &end);
        if (!*v || *end || errno) return -1;
        *(double *)o->ptr = x;
        return 0;
    }
    case OPT_FLAG: return -1;
    }
    return -1;
}

static const char *type_word(cli_opt_type t)
{
    return t == OPT_INT      ? "an integer"
           : t == OPT_U64    ? "a non-negative integer"
           : t == OPT_DOUBLE ? "a number"
                             : "a value";
}

int cli_parse(int argc, char **argv, int first, cli_opt *opts, const char *usage,
              const char *summary, const char **pos, int max_pos, int *n_pos)
{
    int np = 0;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            cli_print_help(stdout, usage, summary, opts);
            return CLI_HELP;
        }
        if (strncmp(a, "--", 2) != 0) {
            if (np >= max_pos) {
                fprintf(stderr, "prl: unexpected argument '%s'\n\n", a);
                cli_print_help(stderr, usage, summary, opts);
                return CLI_USAGE;
            }
            pos[np++] = a;
            continue;
        }
        char name[64];
        const char *eq = strchr(a + 2, '=');
        size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        snprintf(name, sizeof name, "%.*s", (int)len, a + 2);
        cli_opt *o = opts;
        while (o->name && strcmp(o->name, name) != 0) o++;
        if (!o->name) {
            char names[2048] = "";
            for (const cli_opt *q = opts; q->name; q++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                         q == opts ? "" : "|", q->name);
            char hint[160];
            snprintf(hint, sizeof hint, "%s", cli_did_you_mean(name, names));
            if (*hint) { /* "(did you mean 'seed'?)" -> "(did you mean '--seed'?)" */
                char *q = strchr(hint, '\'');
                memmove(q + 3, q + 1, strlen(q + 1) + 1);
                q[1] = q[2] = '-';
            }
            fprintf(stderr, "prl: unknown option '--%s'%s (see --help)\n", name, hint);
            return CLI_USAGE;
        }
        o->seen = 1;
        if (o->type == OPT_FLAG) {
            if (eq) {
                fprintf(stderr, "prl: option '--%s' takes no value\n", name);
                return CLI_USAGE;
            }
            *(int *)o->ptr = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "prl: option '--%s' needs %s\n", name, o->arg ? o->arg : "a value");
            return CLI_USAGE;
        }
        if (parse_value(o, v) != 0) {
            fprintf(stderr, "prl: option '--%s' must be %s, got '%s'\n", name, type_word(o->type),
                    v);
            return CLI_USAGE;
        }
    }
    for (cli_opt *o = opts; o->name; o++)
        if (o->required && !o->seen) {
            fprintf(stderr, "prl: missing required option '--%s' (see --help)\n", o->name);
            return CLI_USAGE;
        }
    if (n_pos) *n_pos = np;
    return CLI_OK;
}

int cli_setup_blas(const char *cmd, int threads)
{
    if (prl_blas_init(threads) != PRL_OK) return cli_fail(cmd);
    prl_blas_print(stderr);
    return 0;
}

int cli_infer_options(const char *cmd, prl_infer_options *io, const char *precision,
                      const char *mla, const char *matmul)
{
    if (prl_infer_options_preset(io, precision ? precision : "fp32") ||
        prl_infer_options_set(io, NULL, mla, matmul))
        return cli_failf(cmd, 2, "%s", prl_error_message());
    return 0;
}

prl_status cli_json_ids(json_t *v, const char *file, int line, int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!json_is_array(v) || json_array_size(v) == 0)
        return prl_error_set(PRL_ERR_FORMAT, "%s:%d: \"ids\" must be a non-empty array", file,
                             line);
    size_t len = json_array_size(v);
    int32_t *out = malloc(len * sizeof *out);
    if (!out) return prl_error_set(PRL_ERR_NOMEM, "%s:%d: %zu ids", file, line, len);
    for (size_t i = 0; i < len; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) > 0x7fffffff) {
            free(out);
            return prl_error_set(PRL_ERR_FORMAT, "%s:%d: ids[%zu] is not a token id", file, line,
                                 i);
        }
        out[i] = (int32_t)json_integer_value(e);
    }
    *ids = out, *n = len;
    return PRL_OK;
}

prl_status cli_json_messages(json_t *v, const char *file, int line, prl_chat_message **msgs,
                             size_t *n)
{
    char where[1100];
    snprintf(where, sizeof where, "%s:%d", file, line);
    return prl_chat_from_json(v, where, msgs, n);
}

prl_status cli_jsonl_ids_line(json_t *obj, const prl_tokenizer *tok, const char *file, int line,
                              const char *text_needs, int32_t **ids, size_t *n, int *done)
{
    *done = 0;
    json_t *v;
    if (!json_is_object(obj))
        return prl_error_set(PRL_ERR_FORMAT, "%s:%d: each line must be a JSON object", file, line);
    if ((v = json_object_get(obj, "ids"))) {
        *done = 1;
        return cli_json_ids(v, file, line, ids, n);
    }
    if (!tok)
        return prl_error_set(PRL_ERR_ARG, "%s:%d: %s a tokenizer.json in the checkpoint", file,
                             line, text_needs);
    return PRL_OK;
}

prl_status cli_jsonl_sequence(json_t *obj, const prl_tokenizer *tok, const char *file, int line,
                              int32_t **ids, uint8_t **mask, size_t *n)
{
    json_t *v;
    *ids = NULL;
    *mask = NULL;
    *n = 0;
    int done = 0;
    prl_status rc = cli_jsonl_ids_line(obj, tok, file, line, "text input needs", ids, n, &done);
    if (rc || done) return rc;
    if ((v = json_object_get(obj, "text")) && json_is_string(v)) {
        rc = prl_tokenizer_encode(tok, json_string_value(v), json_string_length(v), 0, ids, n);
    } else if ((v = json_object_get(obj, "messages")) && json_is_array(v)) {
        prl_chat_message *cm;
        size_t nm;
        if ((rc = cli_json_messages(v, file, line, &cm, &nm))) return rc;
        rc = prl_tokenizer_encode_chat(tok, cm, nm, 0, ids, mask, n);
        free(cm);
    } else {
        return prl_error_set(PRL_ERR_FORMAT,
                             "%s:%d: a line needs \"ids\", \"text\" or \"messages\"", file, line);
    }
    if (rc) return prl_error_wrap(rc, "%s:%d: ", file, line);
    if (*n == 0) return prl_error_set(PRL_ERR_FORMAT, "%s:%d: empty sequence", file, line);
    return PRL_OK;
}

int cli_jsonl_prompt_len(json_t *obj, const uint8_t *mask, size_t n)
{
    if (mask) {
        for (size_t i = 0; i < n; i++)
            if (mask[i]) return (int)i;
        return (int)n;
    }
    json_t *v = json_object_get(obj, "prompt_len");
    return json_is_integer(v) ? (int)json_integer_value(v) : 1;
}

prl_status cli_jsonl_for_each(const char *path, cli_jsonl_fn fn, void *user)
{
    FILE *f = fopen(path, "rb");
    if (!f) return prl_error_set(PRL_ERR_IO, "cannot open %s: %m", path);
    char *buf = NULL;
    size_t cap = 0;
    ssize_t len;
    int line = 0, go = 1;
    prl_status st = PRL_OK;
    while (st == PRL_OK && go && (len = getline(&buf, &cap, f)) >= 0) {
        line++;
        if (strspn(buf, " \t\r\n") == (size_t)len) continue;
        json_error_t err;
        json_t *obj = json_loadb(buf, (size_t)len, 0, &err);
        if (!obj) {
            st = prl_error_set(PRL_ERR_FORMAT, "%s:%d: invalid JSON: %s", path, line, err.text);
            break;
        }
        st = fn(user, obj, line, &go);
        json_decref(obj);
    }
    free(buf);
    fclose(f);
    return st;
}
