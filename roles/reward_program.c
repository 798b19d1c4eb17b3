/*
** reward_program.c — reward.program (roles.h; docs/rewards.md "Reward programs"): the reward
** worker's own scoring process — python3, sh or any interpreter under /usr with its script —
** started once and kept: one JSON request line on its stdin per sample, one JSON reply line on its
** stdout.
**
** It runs as an interactive sandbox run (sandbox.h own_stdio) in a thread of the worker,
** with the sandbox's limits and layers — the network namespace too unless reward.network —
** in a sandbox of the worker's own (one slot, a uid range per worker). A program that dies,
** or that does not answer within reward.timeout, is stopped and started again and the same
** request is sent again (twice at most, then the worker reports an error and the controller
** hands the sample out again). A reply that is not a JSON object with a "score" number in
** [0, 1] is not retried: the sample's result says why (score 0, flag exec_error) — a
** program's bug is recorded, never a crash.
*/
#include "roles/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    MAX_REPLY = 1 << 20, /* bytes of one reply line */
    MAX_TRIES = 3,       /* one request: the first try and two restarts */
    UID_BASE = 30000     /* worker k's sandbox runs as uid 30000 + k (the service: 10000 + slot) */
};

struct prl_reward_program {
    prl_sandbox *sb;
    char lang[16];
    char *script; /* the program text (read once: a restart runs the same program) */
    size_t script_len;
    double timeout;
    pthread_t thread;
    int running;
    int cancel;              /* set to stop the run (read by the sandbox's supervisor) */
    int req_w, rep_r;        /* our pipe ends: requests out, replies in */
    int child_in, child_out; /* the program's ends, owned by the run's thread */
    prl_sandbox_result last; /* of the run that ended last */
    char *buf;               /* reply bytes read and not yet taken */
    size_t len;
    uint64_t requests, restarts;
};

/* ---------------------------------------------------------------- the command ------ */

/* An interpreter named on its own ("node") as the file in /usr/bin or /usr/local/bin, or
** an absolute path; it must be an executable file under /usr (what the sandbox shows). */
static prl_status find_interpreter(const char *name, char *path, size_t n)
{
    static const char *const dirs[] = {"/usr/bin", "/usr/local/bin"};
    struct stat st;
    for (int i = 0; i < 2 && name[0] != '/'; i++) {
        snprintf(path, n, "%s/%s", dirs[i], name);
        if (!stat(path, &st) && S_ISREG(st.st_mode)) break;
    }
    if (name[0] == '/') snprintf(path, n, "%s", name);
    if (strncmp(path, "/usr/", 5) || strstr(path, "/../") || stat(path, &st) ||
        !S_ISREG(st.st_mode) || !(st.st_mode & S_IXOTH))
        return prl_error_set(PRL_ERR_CONFIG,
                             "reward.program: interpreter '%s' is not an executable file under "
                             "/usr (the sandbox shows /usr only)",
                             name);
    return PRL_OK;
}

/* reward.program's argv: [interpreter, script]. python3 and sh are the sandbox's own
** languages; any other interpreter under /usr runs the script as lang "interpreter". */
static prl_status parse_argv(const prl_job_config *job, char *lang, size_t n, char *interp,
                             size_t in, char *path, size_t pn)
{
    json_error_t je;
    json_t *a = json_loads(job->reward_program, 0, &je);
    const char *cmd = json_string_value(json_array_get(a, 0));
    const char *script = json_string_value(json_array_get(a, 1));
    const char *base = cmd ? strrchr(cmd, '/') : NULL;
    base = base ? base + 1 : cmd;
    prl_status rc = PRL_OK;
    interp[0] = 0;
    if (json_array_size(a) != 2 || !cmd || !script)
        rc = prl_error_set(PRL_ERR_CONFIG,
                           "reward.program must be [INTERPRETER, SCRIPT], e.g. [\"python3\", "
                           "\"my_reward.py\"] (got %s)",
                           job->reward_program);
    else if (!strcmp(base, "python3") || !strcmp(base, "sh")) snprintf(lang, n, "%s", base);
    else if (!(rc = find_interpreter(cmd, interp, in))) snprintf(lang, n, "interpreter");
    if (!rc) snprintf(path, pn, "%s", script);
    json_decref(a);
    return rc;
}

prl_status prl_reward_program_check(const prl_job_config *job)
{
    if (!prl_job_has_reward_program(job)) return PRL_OK;
    char lang[16], interp[1024], path[1024], *text = NULL;
    size_t len = 0;
    prl_status rc = parse_argv(job, lang, sizeof lang, interp, sizeof interp, path, sizeof path);
    if (!rc && prl_file_read(path, &text, &len))
        rc = prl_error_set(PRL_ERR_CONFIG, "reward.program: cannot read the script '%s'", path);
    else if (!rc && len == 0)
        rc = prl_error_set(PRL_ERR_CONFIG, "reward.program: the script '%s' is empty", path);
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- the process ------ */

static void *run_thread(void *arg)
{
    prl_reward_program *p = arg;
    prl_sandbox_request req = {.lang = p->lang,
                               .program = p->script,
                               .program_len = p->script_len,
                               .own_stdio = 1,
                               .stdin_fd = p->child_in,
                               .stdout_fd = p->child_out,
                               .cancel = &p->cancel};
    prl_sandbox_limits_default(&req.limits);
    req.limits.wall_seconds = req.limits.cpu_seconds = 3600; /* a lifetime, not a request */
    prl_sandbox_result_free(&p->last);
    prl_sandbox_run(p->sb, 0, &req, &p->last);
    close(p->child_in), close(p->child_out); /* the program's ends: now our reads see EOF */
    return NULL;
}

static prl_status start(prl_reward_program *p)
{
    int a[2], b[2];
    if (pipe2(a, O_CLOEXEC)) return prl_error_set(PRL_ERR_IO, "reward program: pipe");
    if (pipe2(b, O_CLOEXEC)) {
        close(a[0]), close(a[1]);
        return prl_error_set(PRL_ERR_IO, "reward program: pipe");
    }
    p->child_in = a[0], p->req_w = a[1], p->rep_r = b[0], p->child_out = b[1];
    fcntl(p->rep_r, F_SETFL, fcntl(p->rep_r, F_GETFL) | O_NONBLOCK);
    p->cancel = 0, p->len = 0;
    if (pthread_create(&p->thread, NULL, run_thread, p)) {
        close(a[0]), close(a[1]), close(b[0]), close(b[1]);
        return prl_error_set(PRL_ERR_IO, "reward program: thread");
    }
    p->running = 1;
    return PRL_OK;
}

/* The last line of the ended run's stderr (a traceback's message) into out ("" if none). */
static void last_stderr_line(const prl_reward_program *p, char *out, size_t n)
{
    const char *err = p->last.err ? p->last.err : "";
    size_t end = strlen(err), start;
    while (end > 0 && (err[end - 1] == '\n' || err[end - 1] == ' ')) end--;
    for (start = end; start > 0 && err[start - 1] != '\n';) start--;
    snprintf(out, n, "%.*s", (int)(end - start < n ? end - start : n - 1), err + start);
}

/* Stop the program (whatever it is doing) and reap its run. */
static void stop(prl_reward_program *p, const char *why)
{
    if (!p->running) return;
    __atomic_store_n(&p->cancel, 1, __ATOMIC_RELEASE);
    close(p->req_w);
    pthread_join(p->thread, NULL);
    close(p->rep_r);
    p->running = 0;
    if (why) {
        char last[160];
        last_stderr_line(p, last, sizeof last);
        fprintf(stderr, "[reward] reward program stopped (%s): %s %s%s%s\n", why,
                prl_sandbox_status_name(p->last.status), p->last.reason,
                last[0] ? "; stderr: " : "", last);
    }
}

static prl_status write_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return prl_error_set(PRL_ERR_IO, "the reward program closed its stdin");
        s += w, n -= (size_t)w;
    }
    return PRL_OK;
}

/* One reply line (malloc'd, without the newline) within `timeout` seconds. */
static prl_status read_line(prl_reward_program *p, double timeout, char **line)
{
    double end = prl_now() + timeout;
    for (;;) {
        char *nl = p->buf ? memchr(p->buf, '\n', p->len) : NULL;
        if (nl) {
            size_t k = (size_t)(nl - p->buf);
            *line = strndup(p->buf, k);
            memmove(p->buf, nl + 1, p->len - k - 1);
            p->len -= k + 1;
            return *line ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "reply");
        }
        if (p->len >= MAX_REPLY)
            return prl_error_set(PRL_ERR_FORMAT, "a reply line is longer than %d bytes", MAX_REPLY);
        double left = end - prl_now();
        if (left <= 0)
            return prl_error_set(PRL_ERR_IO, "no reply within reward.timeout = %g s", timeout);
        struct pollfd pf = {p->rep_r, POLLIN, 0};
        if (poll(&pf, 1, (int)ceil(left * 1000)) <= 0) continue;
        char *nb = realloc(p->buf, MAX_REPLY + 1);
        if (!nb) return prl_error_set(PRL_ERR_NOMEM, "reply");
        p->buf = nb;
        ssize_t r = read(p->rep_r, p->buf + p->len, MAX_REPLY - p->len);
        if (r == 0) return prl_error_set(PRL_ERR_IO, "the reward program exited");
        if (r > 0) p->len += (size_t)r;
    }
}

/* ---------------------------------------------------------------- replies ---------- */

/* A reply into a result: {"score": x in [0, 1], "breakdown": {name: number or bool}}; else
** score 0, flag exec_error and the reason as the check "reward_program". */
static void take_reply(const char *line, prl_reward_result *out)
{
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    json_t *score = json_object_get(o, "score"), *bd = json_object_get(o, "breakdown");
    double v = json_number_value(score);
    memset(out, 0, sizeof *out);
    const char *why = !o                               ? "not JSON"
                      : !json_is_object(o)             ? "not a JSON object"
                      : !json_is_number(score)         ? "no number \"score\""
                      : !isfinite(v) || v < 0 || v > 1 ? "\"score\" is not in [0, 1]"
                      : bd && !json_is_object(bd)      ? "\"breakdown\" is not an object"
                                                       : NULL;
    prl_reward_check *c = &out->checks[out->n_checks++];
    snprintf(c->name, sizeof c->name, "reward_program");
    c->passed = why == NULL;
    if (why) {
        snprintf(c->detail, sizeof c->detail, "bad reply (%s): %.120s", why, line);
        out->flags = PRL_REWARD_EXEC_ERROR;
        json_decref(o);
        return;
    }
    out->score = v;
    snprintf(c->detail, sizeof c->detail, "score %g", v);
    const char *k;
    json_t *x;
    json_object_foreach(bd, k, x)
    {
        if (out->n_checks >= PRL_REWARD_MAX_CHECKS) break;
        c = &out->checks[out->n_checks++];
        snprintf(c->name, sizeof c->name, "%s", k);
        double w = json_is_number(x) ? json_number_value(x) : json_is_true(x) ? 1 : 0;
        c->passed = w > 0;
        snprintf(c->detail, sizeof c->detail, "%g", w);
    }
    json_decref(o);
}

/* ---------------------------------------------------------------- API -------------- */

prl_status prl_reward_program_open(prl_reward_program **out, const prl_job_config *job,
                                   int worker_index)
{
    *out = NULL;
    prl_reward_program *p = calloc(1, sizeof *p);
    if (!p) return prl_error_set(PRL_ERR_NOMEM, "reward program");
    char path[1024], interp[1024];
    prl_status rc =
        parse_argv(job, p->lang, sizeof p->lang, interp, sizeof interp, path, sizeof path);
    if (!rc) rc = prl_file_read(path, &p->script, &p->script_len);
    prl_sandbox_options so;
    prl_sandbox_options_default(&so);
    so.slots = 1;
    so.uid_base = UID_BASE + (unsigned)worker_index;
    so.interpreter = interp[0] ? interp : NULL;
    so.network = job->reward_network; /* reward.network: the host's */
    if (!rc) rc = prl_sandbox_init(&p->sb, &so);
    p->timeout = job->reward_timeout;
    signal(SIGPIPE, SIG_IGN); /* a program that died under a write is a restart, not our end */
    if (rc) {
        prl_reward_program_close(p);
        return prl_error_wrap(rc, "reward.program: ");
    }
    *out = p;
    return PRL_OK;
}

prl_status prl_reward_program_score(prl_reward_program *p, const char *request,
                                    prl_reward_result *out)
{
    prl_status rc = PRL_ERR_IO;
    char why[300] = "";
    for (int t = 0; t < MAX_TRIES; t++) {
        char *line = NULL;
        rc = p->running ? PRL_OK : start(p);
        if (!rc) rc = write_all(p->req_w, request, strlen(request));
        if (!rc) rc = write_all(p->req_w, "\n", 1);
        if (!rc) rc = read_line(p, p->timeout, &line);
        if (!rc) {
            p->requests++;
            take_reply(line, out);
            free(line);
            return PRL_OK;
        }
        snprintf(why, sizeof why, "%s", prl_error_message());
        stop(p, why); /* died, hung or garbled: start afresh and ask again */
        char last[160];
        last_stderr_line(p, last, sizeof last);
        if (last[0]) snprintf(why + strlen(why), sizeof why - strlen(why), "; stderr: %s", last);
        p->restarts++;
    }
    return prl_error_set(rc, "reward program: %s (%d tries)", why, MAX_TRIES);
}

uint64_t prl_reward_program_restarts(const prl_reward_program *p) { return p ? p->restarts : 0; }

void prl_reward_program_close(prl_reward_program *p)
{
    if (!p) return;
    stop(p, NULL);
    prl_sandbox_result_free(&p->last);
    if (p->sb) prl_sandbox_free(p->sb);
    free(p->script), free(p->buf), free(p);
}
