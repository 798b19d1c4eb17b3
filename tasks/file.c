/*
** file.c — users' prompt files (tasks.h, docs/tasks.md "Prompt files"): a JSONL file, or a
** directory of *.jsonl shards read in sorted name order, turned line by line into task
** objects of the shape the generators write, so that the rollout, the verifiers and run.db
** take them as they take generated ones.
**
** A line's structure is checked here (JSON, prompt or messages, the verifier's name, id,
** split, the fields each verifier needs and their types); what the fields mean (a
** constraint's parameters, an answer that must parse) is checked by the verifier itself
** (prl_reward_file_read). Every error names FILE:LINE and the field.
*/
#include "tasks/tasks_int.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The verifiers a line may name, and the rollout domain each one plays as: math and choice
** as Reasoning (the python tool is available), code as Coding, constraints as General
** (one turn), agent in the tool environment. No verifier (a reward program scores): General. */
static const struct {
    const char *name;
    prl_task_domain domain;
} verifiers[] = {{"math", PRL_TASK_REASONING},
                 {"choice", PRL_TASK_REASONING},
                 {"code", PRL_TASK_CODING},
                 {"constraints", PRL_TASK_GENERAL},
                 {"agent", PRL_TASK_AGENT}};
enum { N_VERIFIERS = sizeof verifiers / sizeof verifiers[0] };

/* Keys the loader sets itself; a line may not hold them with another meaning. */
static const char *const reserved[] = {"domain", "source", "difficulty"};

typedef struct file_ctx {
    const char *path; /* file being read */
    int line;
    prl_tasks_file_options opt;
    prl_tasks_line_fn fn;
    void *user;
    json_t *ids; /* id -> "FILE:LINE" of its first line */
} file_ctx;

static prl_status bad(const file_ctx *f, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static prl_status bad(const file_ctx *f, const char *field, const char *fmt, ...)
{
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (!field) return prl_error_set(PRL_ERR_FORMAT, "%s:%d: %s", f->path, f->line, why);
    return prl_error_set(PRL_ERR_FORMAT, "%s:%d: field '%s': %s", f->path, f->line, field, why);
}

int prl_tasks_verifier_domain(const char *name, prl_task_domain *domain)
{
    for (int i = 0; name && i < N_VERIFIERS; i++)
        if (!strcmp(verifiers[i].name, name)) {
            *domain = verifiers[i].domain;
            return 1;
        }
    return 0;
}

/* ---------------------------------------------------------------- fields ----------- */

/* "messages": an array of {role, content} strings ending in a user message. */
static prl_status check_messages(const file_ctx *f, const json_t *msgs)
{
    size_t n = json_array_size(msgs), i;
    if (!json_is_array(msgs) || n == 0)
        return bad(f, "messages", "must be a non-empty array of {\"role\", \"content\"}");
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || !json_is_string(json_object_get(m, "content")))
            return bad(f, "messages", "message %zu needs string \"role\" and \"content\"", i);
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant"))
            return bad(f, "messages", "message %zu: role '%.20s' is not system, user or assistant",
                       i, role);
        if (i == n - 1 && strcmp(role, "user"))
            return bad(f, "messages", "the last message must be the user's (got %.20s)", role);
    }
    return PRL_OK;
}

/* The prompt as "messages" in the task: a "prompt" string becomes one user message; an
** agent line without either gets the environment's own system and user messages. */
static prl_status prompt_messages(const file_ctx *f, json_t *line, const char *verifier)
{
    json_t *prompt = json_object_get(line, "prompt"), *msgs = json_object_get(line, "messages");
    if (prompt && msgs) return bad(f, "prompt", "give \"prompt\" or \"messages\", not both");
    if (msgs) return check_messages(f, msgs);
    if (prompt) {
        if (!json_is_string(prompt) || !*json_string_value(prompt))
            return bad(f, "prompt", "must be a non-empty string");
        json_t *m = tasks__prompt(NULL, json_string_value(prompt));
        if (!m) return prl_error_set(PRL_ERR_NOMEM, "prompt");
        json_object_del(line, "prompt");
        return json_object_set_new(line, "messages", m) ? prl_error_set(PRL_ERR_NOMEM, "prompt")
                                                        : PRL_OK;
    }
    if (!verifier || strcmp(verifier, "agent"))
        return bad(f, "prompt", "missing: a line needs \"prompt\" (text) or \"messages\" (chat)");
    prl_agent_task t;
    if (prl_agent_task_from_spec(json_object_get(line, "env"), &t))
        return bad(f, "env", "%s", prl_error_message());
    json_t *m = tasks__prompt(prl_agent_system_prompt(), t.prompt);
    if (!m || json_object_set_new(line, "messages", m)) return prl_error_set(PRL_ERR_NOMEM, "env");
    return PRL_OK;
}

static prl_status check_string_list(const file_ctx *f, const json_t *a, const char *field)
{
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x) if (!json_is_string(x) || !*json_string_value(x)) return bad(
        f, field, "entry %zu must be a non-empty string", i);
    return PRL_OK;
}

/* code: "tests" [{stdin, stdout}] and/or "asserts" [string], 1..PRL_TASKS_MAX_TESTS in all. */
static prl_status check_code(const file_ctx *f, const json_t *line)
{
    json_t *tests = json_object_get(line, "tests"), *asserts = json_object_get(line, "asserts");
    if ((tests && !json_is_array(tests)) || (asserts && !json_is_array(asserts)))
        return bad(f, tests && !json_is_array(tests) ? "tests" : "asserts", "must be an array");
    size_t n = json_array_size(tests) + json_array_size(asserts), i;
    if (n == 0 || n > PRL_TASKS_MAX_TESTS)
        return bad(f, "tests",
                   "code needs 1..%d tests in \"tests\" ({\"stdin\", \"stdout\"}) "
                   "and \"asserts\" (Python assert statements); got %zu",
                   PRL_TASKS_MAX_TESTS, n);
    json_t *t;
    json_array_foreach(tests, i, t)
    {
        if (!json_is_string(json_object_get(t, "stdin")) ||
            !json_is_string(json_object_get(t, "stdout")))
            return bad(f, "tests", "test %zu needs strings \"stdin\" and \"stdout\"", i);
    }
    return check_string_list(f, asserts, "asserts");
}

/* The fields of the line's verifier (their meaning is the verifier's to check). */
/* A choice line's "choices" shown to the model: "\n\nA) first\nB) second..." after the last
** (user) message, so the letters the verifier reads name options the prompt states. */
static prl_status show_choices(json_t *line)
{
    json_t *ch = json_object_get(line, "choices"), *msgs = json_object_get(line, "messages");
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    if (!ch || !last) return PRL_OK;
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return prl_error_set(PRL_ERR_NOMEM, "choices");
    fputs(json_string_value(json_object_get(last, "content")), mem);
    for (size_t i = 0; i < json_array_size(ch); i++)
        fprintf(mem, "%s%c) %s", i ? "\n" : "\n\n", (char)('A' + i),
                json_string_value(json_array_get(ch, i)));
    prl_status rc = fclose(mem) == 0 ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "choices");
    if (!rc && json_object_set_new(last, "content", json_string(text)))
        rc = prl_error_set(PRL_ERR_NOMEM, "choices");
    free(text);
    return rc;
}

static prl_status check_verifier_fields(const file_ctx *f, const json_t *line, const char *v)
{
    json_t *answer = json_object_get(line, "answer");
    if (!strcmp(v, "math") && !json_is_string(answer) && !json_is_number(answer))
        return bad(f, "answer", "math needs the answer as a string or a number");
    if (!strcmp(v, "choice")) {
        const char *a = json_string_value(answer);
        if (!a || strlen(a) != 1 || a[0] < 'A' || a[0] > 'Z')
            return bad(f, "answer", "choice needs one capital letter A..Z");
        json_t *ch = json_object_get(line, "choices");
        if (ch && (!json_is_array(ch) || (size_t)(a[0] - 'A') >= json_array_size(ch)))
            return bad(f, "choices", "must be an array holding option %c", a[0]);
        if (ch && json_array_size(ch) > 26) return bad(f, "choices", "at most 26 options (A..Z)");
        if (ch) return check_string_list(f, ch, "choices");
    }
    if (!strcmp(v, "code")) return check_code(f, line);
    if (!strcmp(v, "constraints")) {
        json_t *c = json_object_get(line, "constraints");
        if (!json_is_array(c) || json_array_size(c) == 0)
            return bad(f, "constraints", "must be a non-empty array of constraint objects");
    }
    prl_agent_task t; /* {seed, difficulty} or a world and goal: one the environment plays */
    if (!strcmp(v, "agent") && prl_agent_task_from_spec(json_object_get(line, "env"), &t))
        return bad(f, "env", "%s", prl_error_message());
    return PRL_OK;
}

/* ---------------------------------------------------------------- one line --------- */

static prl_status set_str(json_t *o, const char *key, const char *value)
{
    return json_object_set_new(o, key, json_string(value)) ? prl_error_set(PRL_ERR_NOMEM, "%s", key)
                                                           : PRL_OK;
}

/* "id": the line's own (unique in the files), else "<file name>:<line>". */
static prl_status line_id(file_ctx *f, json_t *line)
{
    json_t *id = json_object_get(line, "id");
    char where[600], own[300];
    const char *base = strrchr(f->path, '/');
    snprintf(where, sizeof where, "%s:%d", f->path, f->line);
    if (id &&
        (!json_is_string(id) || !*json_string_value(id) || strlen(json_string_value(id)) > 200))
        return bad(f, "id", "must be a non-empty string of at most 200 bytes");
    if (!id) {
        snprintf(own, sizeof own, "%s:%d", base ? base + 1 : f->path, f->line);
        prl_status rc = set_str(line, "id", own);
        if (rc) return rc;
    }
    const char *s = json_string_value(json_object_get(line, "id"));
    const char *first = json_string_value(json_object_get(f->ids, s));
    if (first) return bad(f, "id", "'%.80s' is also the id of %s", s, first);
    return json_object_set_new(f->ids, s, json_string(where)) ? prl_error_set(PRL_ERR_NOMEM, "ids")
                                                              : PRL_OK;
}

/* "split": the line's, else the stable hash of its problem statement (the built-in rule). */
static prl_status line_split(const file_ctx *f, json_t *line)
{
    json_t *s = json_object_get(line, "split");
    prl_task_split split;
    if (s) {
        if (!json_is_string(s) || prl_tasks_split_parse(json_string_value(s), &split))
            return bad(f, "split", "must be \"train\" or \"eval\"");
        return PRL_OK;
    }
    char *text = NULL;
    prl_status rc = prl_tasks_canonical_text(line, &text);
    if (rc) return bad(f, NULL, "%s", prl_error_message());
    split = prl_tasks_split_of(text, strlen(text));
    free(text);
    return set_str(line, "split", prl_tasks_split_name(split));
}

static prl_status take_line(file_ctx *f, json_t *line)
{
    if (!json_is_object(line)) return bad(f, NULL, "a line must be a JSON object");
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
        if (json_object_get(line, reserved[i]))
            return bad(f, reserved[i], "is set by prl (keep your own labels under other keys)");
    json_t *v = json_object_get(line, "verifier");
    const char *name = json_string_value(v);
    prl_task_domain domain = PRL_TASK_GENERAL;
    if (v && !prl_tasks_verifier_domain(name, &domain))
        return bad(f, "verifier", "'%.40s' is not one of math, code, constraints, choice, agent",
                   name ? name : "(not a string)");
    if (!v && f->opt.require_verifier)
        return bad(f, "verifier",
                   "missing: name one (math, code, constraints, choice, agent) "
                   "or score with reward.program");
    prl_status rc = name ? check_verifier_fields(f, line, name) : PRL_OK;
    if (!rc) rc = prompt_messages(f, line, name);
    if (!rc && name && !strcmp(name, "choice")) rc = show_choices(line);
    char where[600];
    snprintf(where, sizeof where, "%s:%d", f->path, f->line);
    if (!rc) rc = set_str(line, "domain", prl_tasks_domain_name(domain));
    if (!rc) rc = set_str(line, "source", where);
    if (!rc) rc = json_object_set_new(line, "difficulty", json_integer(0));
    if (!rc) rc = line_id(f, line);
    if (!rc) rc = line_split(f, line);
    return rc ? rc : f->fn(f->user, line);
}

/* ---------------------------------------------------------------- files ------------ */

static prl_status read_one(file_ctx *f, const char *path)
{
    char *text = NULL;
    size_t len = 0;
    prl_status rc = prl_file_read(path, &text, &len);
    if (rc) return rc;
    f->path = path, f->line = 0;
    for (char *p = text, *end = text + len; !rc && p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *stop = nl ? nl : end;
        f->line++;
        *stop = 0;
        const char *q = p;
        while (*q == ' ' || *q == '\t' || *q == '\r') q++;
        if (*q) { /* blank lines are skipped (still counted) */
            json_error_t err;
            json_t *line = json_loads(p, JSON_REJECT_DUPLICATES, &err);
            if (!line) rc = bad(f, NULL, "invalid JSON: %s (column %d)", err.text, err.column);
            else rc = take_line(f, line);
            json_decref(line);
        }
        p = stop + 1;
    }
    free(text);
    return rc;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The *.jsonl files of a directory, sorted by name (malloc'd paths). */
static prl_status list_shards(const char *dir, char ***out, int *n)
{
    DIR *d = opendir(dir);
    if (!d) return prl_error_set(PRL_ERR_IO, "%s: cannot open the directory", dir);
    char **v = NULL;
    int k = 0, cap = 0;
    prl_status rc = PRL_OK;
    struct dirent *e;
    while (!rc && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 7 || strcmp(e->d_name + len - 6, ".jsonl") || e->d_name[0] == '.') continue;
        if (k == cap) {
            char **nv = realloc(v, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *v);
            if (!nv) rc = prl_error_set(PRL_ERR_NOMEM, "shard list");
            else v = nv;
        }
        if (!rc && asprintf(&v[k], "%s/%s", dir, e->d_name) < 0)
            rc = prl_error_set(PRL_ERR_NOMEM, "shard list");
        else if (!rc) k++;
    }
    closedir(d);
    if (!rc && k == 0) rc = prl_error_set(PRL_ERR_FORMAT, "%s: no *.jsonl files in it", dir);
    if (!rc) qsort(v, (size_t)k, sizeof *v, cmp_names);
    *out = v, *n = k;
    return rc;
}

prl_status prl_tasks_file_read(const char *path, const prl_tasks_file_options *opt,
                               prl_tasks_line_fn fn, void *user)
{
    struct stat sb;
    if (!path || !*path || stat(path, &sb))
        return prl_error_set(PRL_ERR_IO, "prompt file '%s' does not exist", path ? path : "");
    file_ctx f = {.fn = fn, .user = user, .ids = json_object()};
    if (opt) f.opt = *opt;
    if (!f.ids) return prl_error_set(PRL_ERR_NOMEM, "prompt file");
    prl_status rc = PRL_OK;
    if (S_ISDIR(sb.st_mode)) {
        char **shards = NULL;
        int n = 0;
        rc = list_shards(path, &shards, &n);
        for (int i = 0; !rc && i < n; i++) rc = read_one(&f, shards[i]);
        for (int i = 0; i < n; i++) free(shards[i]);
        free(shards);
    } else {
        rc = read_one(&f, path);
    }
    if (!rc && json_object_size(f.ids) == 0)
        rc = prl_error_set(PRL_ERR_FORMAT, "prompt file '%s' holds no lines", path);
    json_decref(f.ids);
    return rc;
}
