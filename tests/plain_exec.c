/*
** plain_exec.c — TEST-ONLY program executor for the verifier tests (prl_reward_exec_fn).
**
** UNSANDBOXED: it runs `python3 -I -c PROGRAM` as a plain child process (fork/exec, pipes for
** stdin/stdout/stderr, its own process group, a wall-time kill, an output cap, rlimits on
** memory, CPU time and file size). test_reward runs only its own fixture programs through it,
** so the verifiers can be tested without root; everything that runs model-written programs
** (prl tasks check, the reward worker) uses the sandbox. The interpreter is $PRL_PYTHON if
** set, else /usr/bin/python3 if it exists, else python3 on PATH.
*/
#include "tests/plain_exec.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

enum { OUTPUT_CAP = 1 << 20 };

typedef struct sink {
    char *data;
    size_t len, cap;
    int over; /* more than OUTPUT_CAP bytes arrived */
} sink;

/* Read what is available on fd into s; returns 0 at EOF, 1 if more may come, -1 on error. */
static int drain(int fd, sink *s)
{
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0) return errno == EINTR || errno == EAGAIN ? 1 : -1;
    if (n == 0) return 0;
    if (s->len + (size_t)n > OUTPUT_CAP) {
        s->over = 1;
        return 1;
    }
    if (s->len + (size_t)n + 1 > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 8192;
        while (cap < s->len + (size_t)n + 1) cap *= 2;
        char *d = realloc(s->data, cap);
        if (!d) return -1;
        s->data = d;
        s->cap = cap;
    }
    memcpy(s->data + s->len, buf, (size_t)n);
    s->len += (size_t)n;
    s->data[s->len] = 0;
    return 1;
}

static const char *python_path(void)
{
    const char *env = getenv("PRL_PYTHON");
    if (env && *env) return env;
    return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

/* In the child: wire the pipes, limit resources, exec python. Never returns. */
static void child(int in, int out, int err, const char *program, double wall_s)
{
    setpgid(0, 0);
    dup2(in, 0), dup2(out, 1), dup2(err, 2);
    struct rlimit mem = {1UL << 30, 1UL << 30}, fsize = {1UL << 20, 1UL << 20};
    rlim_t cpu = (rlim_t)wall_s + 1;
    struct rlimit cpu_limit = {cpu, cpu};
    setrlimit(RLIMIT_AS, &mem);
    setrlimit(RLIMIT_FSIZE, &fsize);
    setrlimit(RLIMIT_CPU, &cpu_limit);
    const char *py = python_path();
    execlp(py, py, "-I", "-c", program, (char *)NULL);
    dprintf(2, "exec %s: %s\n", py, strerror(errno));
    _exit(127);
}

/* Feed stdin, collect stdout/stderr until both close or the deadline; 1 if timed out. */
static int pump(int in, int out, int err, const prl_reward_exec_request *req, sink *so, sink *se,
                double deadline)
{
    size_t sent = 0;
    int open_out = 1, open_err = 1;
    if (req->stdin_len == 0) close(in), in = -1;
    while (open_out || open_err) {
        double left = deadline - prl_now();
        if (left <= 0) {
            if (in >= 0) close(in);
            return 1;
        }
        struct pollfd p[3] = {{open_out ? out : -1, POLLIN, 0},
                              {open_err ? err : -1, POLLIN, 0},
                              {in, POLLOUT, 0}};
        int r = poll(p, 3, (int)(left * 1000) + 1);
        if (r < 0 && errno != EINTR) {
            if (in >= 0) close(in);
            return 1; /* cannot watch the child any more: stop it as if it timed out */
        }
        if (r <= 0) continue;
        if (p[0].revents && drain(out, so) <= 0) open_out = 0;
        if (p[1].revents && drain(err, se) <= 0) open_err = 0;
        if (in >= 0 && p[2].revents) {
            ssize_t n = (p[2].revents & POLLOUT)
                            ? write(in, req->stdin_data + sent, req->stdin_len - sent)
                            : -1;
            if (n > 0) sent += (size_t)n;
            if (n < 0 || sent == req->stdin_len) close(in), in = -1;
        }
        if (so->over || se->over) break;
    }
    if (in >= 0) close(in);
    return 0;
}

static void set_status(prl_reward_exec_result *res, int timed_out, int over, int wstatus)
{
    const char *s;
    if (timed_out) s = "timeout", res->exit_code = 128 + SIGKILL;
    else if (over) s = "output_limit", res->exit_code = 128 + SIGKILL;
    else if (WIFEXITED(wstatus)) {
        res->exit_code = WEXITSTATUS(wstatus);
        s = res->exit_code == 0 ? "ok" : res->exit_code == 127 ? "error" : "runtime_error";
    } else {
        res->exit_code = 128 + WTERMSIG(wstatus);
        s = WTERMSIG(wstatus) == SIGXCPU ? "timeout" : "killed";
    }
    snprintf(res->status, sizeof res->status, "%s", s);
}

prl_status test_exec_python(void *ctx, const prl_reward_exec_request *req,
                            prl_reward_exec_result *res)
{
    (void)ctx;
    memset(res, 0, sizeof *res);
    if (!req->lang || strcmp(req->lang, "python3") != 0)
        return prl_error_set(PRL_ERR_UNSUPPORTED, "exec: language '%s' (only python3)",
                             req->lang ? req->lang : "");
    int pin[2], pout[2], perr[2];
    if (pipe2(pin, O_CLOEXEC) || pipe2(pout, O_CLOEXEC) || pipe2(perr, O_CLOEXEC))
        return prl_error_set(PRL_ERR_IO, "exec: pipe: %s", strerror(errno));
    double t0 = prl_now();
    pid_t pid = fork();
    if (pid < 0) return prl_error_set(PRL_ERR_IO, "exec: fork: %s", strerror(errno));
    if (pid == 0) child(pin[0], pout[1], perr[1], req->program, req->wall_s);
    setpgid(pid, pid);
    close(pin[0]), close(pout[1]), close(perr[1]);
    fcntl(pin[1], F_SETFL, O_NONBLOCK);
    signal(SIGPIPE, SIG_IGN); /* a child that stops reading its stdin must not kill us */
    sink so = {0}, se = {0};
    int timed_out = pump(pin[1], pout[0], perr[0], req, &so, &se, t0 + req->wall_s);
    if (timed_out || so.over || se.over) kill(-pid, SIGKILL);
    int wstatus = 0;
    while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
    close(pout[0]), close(perr[0]);
    res->wall_s = prl_now() - t0;
    set_status(res, timed_out, so.over || se.over, wstatus);
    res->stdout_data = so.data ? so.data : strdup("");
    res->stdout_len = so.len;
    res->stderr_data = se.data ? se.data : strdup("");
    res->stderr_len = se.len;
    if (!res->stdout_data || !res->stderr_data) {
        prl_reward_exec_result_free(res);
        return prl_error_set(PRL_ERR_NOMEM, "exec: output buffers");
    }
    return PRL_OK;
}
