/*
** run.c — the supervisor side of one run: validate the request, prepare the slot (cgroup
** limits, fallback work dir), clone the sandbox init into its namespaces, write its uid
** maps, attach it to the cgroups, then one poll loop that feeds stdin, drains stdout and
** stderr under their caps, reads the init's reports and enforces the wall limit; finally
** reap, read the counters and classify (spec/sandbox.md §3.11, in that order).
**
** Warm runs (options.warm, python3): the init is cloned by the slot's zygote (zygote.c), as
** the supervisor's child all the same; everything else here is the cold path's.
**
** Killing: with a pid namespace SIGKILL to its init kills every process in it (setsid and
** double-fork escapees included); without one the slot's cgroup is killed (cgroup.kill or
** freezer), and without that the init is asked (SIGUSR1) to kill its children until none
** is left (it is their subreaper). A process-group kill alone is never relied on.
**
** Threads: everything here is per call and per slot, so different slots run concurrently.
** SIGPIPE (from feeding stdin to a program that stopped reading) is blocked in the calling
** thread only and a pending one is consumed before returning; no process-wide signal state
** is touched.
*/
#include "sandbox/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- request ---------- */

static prl_status check_request(const prl_sandbox *sb, int slot, const prl_sandbox_request *req,
                                prl_sandbox_limits *lim)
{
    if (slot < 0 || slot >= sb->n_slots)
        return prl_error_set(PRL_ERR_ARG, "sandbox: slot %d out of range 0..%d", slot,
                             sb->n_slots - 1);
    if (!req || !req->lang)
        return prl_error_set(PRL_ERR_ARG, "sandbox: the request has no language");
    int other = !strcmp(req->lang, "interpreter");
    if (strcmp(req->lang, "python3") != 0 && strcmp(req->lang, "sh") != 0 && !other)
        return prl_error_set(PRL_ERR_ARG,
                             "sandbox: unknown language '%.64s' (known: python3, sh, interpreter)",
                             req->lang);
    if (other && !sb->interpreter[0])
        return prl_error_set(PRL_ERR_ARG,
                             "sandbox: language 'interpreter' needs options.interpreter");
    if (!req->program || req->program_len == 0)
        return prl_error_set(PRL_ERR_ARG, "sandbox: the program is empty");
    const char *nul = memchr(req->program, 0, req->program_len);
    if (nul)
        return prl_error_set(PRL_ERR_ARG, "sandbox: the program contains a NUL byte at offset %zu",
                             (size_t)(nul - req->program));
    if (!req->stdin_data && req->stdin_len)
        return prl_error_set(PRL_ERR_ARG, "sandbox: stdin_len is %zu but stdin_data is NULL",
                             req->stdin_len);
    *lim = req->limits;
    prl_status rc = prl_sandbox_limits_check(lim);
    if (rc) return prl_error_wrap(rc, "sandbox: ");
    if (req->program_len > lim->disk_bytes)
        return prl_error_set(PRL_ERR_ARG,
                             "sandbox: the program (%zu bytes) is larger than disk_bytes (%llu)",
                             req->program_len, (unsigned long long)lim->disk_bytes);
    return PRL_OK;
}

/* ---------------------------------------------------------------- spawn setup ------ */

void sbx_build_spawn(const prl_sandbox *sb, const sbx_slot *s, const prl_sandbox_request *req,
                     const prl_sandbox_limits *lim, sbx_spawn *sp, char *prog_path, size_t prog_n)
{
    int mnt = (sb->layers & PRL_SANDBOX_MNTNS) != 0;
    int py = !strcmp(req->lang, "python3"), other = !strcmp(req->lang, "interpreter");
    sp->sb = sb;
    sp->slot = s;
    sp->layers = sb->layers;
    sp->lim = *lim;
    sp->program = req->program;
    sp->program_len = req->program_len;
    sp->program_name = py ? "main.py" : other ? "main" : "main.sh";
    sp->workdir = mnt ? "/sandbox" : s->work;
    const char *tmp = mnt ? "/tmp" : s->tmp;
    snprintf(prog_path, prog_n, "%s/%s", sp->workdir, sp->program_name);
    int a = 0;
    sp->argv[a++] = py ? sb->python3 : other ? sb->interpreter : sb->sh;
    if (py) { /* isolated mode (no user site, no PYTHON* env), no .pyc, unbuffered */
        sp->argv[a++] = "-I";
        sp->argv[a++] = "-B";
        sp->argv[a++] = "-u";
    }
    sp->argv[a++] = prog_path;
    sp->argv[a] = NULL;
    snprintf(sp->env_buf[0], sizeof sp->env_buf[0], "HOME=%s", sp->workdir);
    snprintf(sp->env_buf[1], sizeof sp->env_buf[1], "TMPDIR=%s", tmp);
    const char *env[] = {"PATH=/usr/bin:/bin",     sp->env_buf[0],
                         sp->env_buf[1],           "LANG=C.UTF-8",
                         "USER=sandbox",           "PYTHONDONTWRITEBYTECODE=1",
                         "PYTHONUNBUFFERED=1",     "OMP_NUM_THREADS=1",
                         "OPENBLAS_NUM_THREADS=1", NULL};
    memcpy(sp->envp, env, sizeof env);
    unsigned long long disk = (unsigned long long)lim->disk_bytes;
    snprintf(sp->tmpfs_opts[0], sizeof sp->tmpfs_opts[0], "size=1m,nr_inodes=256,mode=0755");
    snprintf(sp->tmpfs_opts[1], sizeof sp->tmpfs_opts[1],
             "size=%llu,nr_inodes=16384,mode=0700,uid=%u,gid=%u", disk, s->prog_uid, s->prog_gid);
    snprintf(sp->tmpfs_opts[2], sizeof sp->tmpfs_opts[2], "size=%llu,nr_inodes=16384,mode=1777",
             disk);
    snprintf(sp->tmpfs_opts[3], sizeof sp->tmpfs_opts[3], "size=64k,nr_inodes=64,mode=0755");
    snprintf(sp->passwd, sizeof sp->passwd,
             "sandbox:x:%u:%u:sandbox:/sandbox:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/"
             "usr/sbin/nologin\n",
             s->prog_uid, s->prog_gid);
    snprintf(sp->group, sizeof sp->group, "sandbox:x:%u:\nnogroup:x:65534:\n", s->prog_gid);
    sp->rw_dirs[0] = sp->workdir;
    sp->rw_dirs[1] = tmp;
    sp->rw_dirs[2] = mnt ? "/dev/shm" : NULL; /* the host's /dev/shm is not ours to fill */
    sp->rw_dirs[3] = NULL;
}

static unsigned long clone_flags(unsigned layers)
{
    unsigned long f = 0;
    if (layers & PRL_SANDBOX_USERNS) f |= CLONE_NEWUSER;
    if (layers & PRL_SANDBOX_PIDNS) f |= CLONE_NEWPID;
    if (layers & PRL_SANDBOX_NETNS) f |= CLONE_NEWNET;
    if (layers & PRL_SANDBOX_MNTNS) f |= CLONE_NEWNS;
    if (layers & PRL_SANDBOX_IPCNS) f |= CLONE_NEWIPC;
    if (layers & PRL_SANDBOX_UTSNS) f |= CLONE_NEWUTS;
    return f;
}

/* A pipe whose ends are >= 3, so dup2 onto 0..2 in the child can never clobber one. */
static int make_pipe(int fds[2])
{
    if (pipe2(fds, O_CLOEXEC) < 0) return -1;
    for (int i = 0; i < 2; i++)
        if (fds[i] < 3) {
            int hi = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
            close(fds[i]);
            fds[i] = hi;
        }
    return fds[0] >= 0 && fds[1] >= 0 ? 0 : -1;
}

static void close_fd(int *fd)
{
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* ---------------------------------------------------------------- fallback work dir */

/* No mount namespace: a fresh host directory per run, owned by the slot, with the program
** written into it by the supervisor (O_EXCL | O_NOFOLLOW). */
static prl_status hostdir_prepare(const sbx_slot *s, const prl_sandbox_request *req,
                                  const char *name)
{
    const char *dirs[2] = {s->work, s->tmp};
    for (int i = 0; i < 2; i++) {
        int fd = open(dirs[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) { /* leftovers of a crashed run */
            sbx_remove_tree_at(fd, s->host_uid);
            close(fd);
        } else if (mkdir(dirs[i], 0700) != 0)
            return prl_error_set(PRL_ERR_IO, "sandbox: mkdir %s: %s", dirs[i], strerror(errno));
        if (chown(dirs[i], s->host_uid, s->host_gid) != 0 || chmod(dirs[i], 0700) != 0)
            return prl_error_set(PRL_ERR_IO, "sandbox: chown %s: %s", dirs[i], strerror(errno));
    }
    int dfd = open(s->work, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int fd = dfd < 0
                 ? -1
                 : openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    prl_status rc = PRL_OK;
    if (fd < 0)
        rc = prl_error_set(PRL_ERR_IO, "sandbox: creating %s/%s: %s", s->work, name,
                           strerror(errno));
    for (size_t off = 0; rc == PRL_OK && off < req->program_len;) {
        ssize_t w = write(fd, req->program + off, req->program_len - off);
        if (w <= 0)
            rc = prl_error_set(PRL_ERR_IO, "sandbox: writing %s/%s: %s", s->work, name,
                               strerror(errno));
        else off += (size_t)w;
    }
    if (fd >= 0) close(fd);
    if (dfd >= 0) close(dfd);
    return rc;
}

/* After every process of the run is dead: empty the dirs without following any link. */
static void hostdir_clean(const sbx_slot *s)
{
    const char *dirs[2] = {s->work, s->tmp};
    for (int i = 0; i < 2; i++) {
        int fd = open(dirs[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) continue;
        fchmod(fd, 0700); /* the program may have taken its own permissions away */
        sbx_remove_tree_at(fd, s->host_uid);
        close(fd);
        rmdir(dirs[i]);
    }
}

/* ---------------------------------------------------------------- the run state ---- */

/* One output stream: up to `cap` bytes kept in a buffer that grows as needed (most
** programs print little; a result should not cost cap bytes each), the rest counted. */
typedef struct capture {
    int fd;
    char *buf;
    size_t len, alloc, cap;
    uint64_t total;
} capture;

enum { KILL_NONE, KILL_WALL, KILL_OUTPUT, KILL_CANCEL };

typedef struct run_state {
    prl_sandbox *sb;
    sbx_slot *slot;
    prl_sandbox_limits lim;
    pid_t c2;
    int report_r, in_w;
    capture out, err;
    const char *in_data;
    size_t in_len, in_off;
    char rep_buf[sizeof(sbx_report)];
    size_t rep_len;
    int report_eof;
    int setup_failed, setup_step, setup_err;
    int exited, status;
    int64_t maxrss_kb;
    int killed; /* KILL_* */
    const char *kill_stream;
    double t0, t_end, t_kill;
    const int *cancel; /* interactive runs: kill when set */
    int no_stdout;     /* interactive runs: stdout is the caller's */
    int warm;          /* start from the slot's zygote */
} run_state;

/* Kill the whole tree (strongest mechanism first). */
static void kill_tree(run_state *r, int why, const char *stream)
{
    if (!r->killed) {
        r->killed = why;
        r->kill_stream = stream;
        r->t_kill = prl_now();
        if (!r->t_end) r->t_end = r->t_kill;
    }
    /* Without a pid namespace the init must survive the kill: it reaps the dead (their
    ** orphans would otherwise become zombies of the host's init). The freezer kills all
    ** the others at once; else the init sweeps its children itself. */
    if (r->sb->layers & PRL_SANDBOX_PIDNS) kill(r->c2, SIGKILL);
    else if (sbx_cgroup_kill_but(&r->slot->cg, r->c2) < 0) kill(r->c2, SIGUSR1);
}

static int capture_read(capture *c, int *open_flag)
{
    char chunk[65536];
    for (;;) {
        ssize_t n = read(c->fd, chunk, sizeof chunk);
        if (n > 0) {
            size_t keep = c->len < c->cap ? c->cap - c->len : 0;
            if (keep > (size_t)n) keep = (size_t)n;
            if (c->len + keep + 1 > c->alloc) {
                size_t want = c->alloc * 2 > c->len + keep + 1 ? c->alloc * 2 : c->len + keep + 1;
                if (want > c->cap + 1) want = c->cap + 1;
                char *bigger = realloc(c->buf, want);
                if (!bigger) keep = c->alloc - 1 - c->len; /* keep what fits; still count */
                else c->buf = bigger, c->alloc = want;
            }
            memcpy(c->buf + c->len, chunk, keep);
            c->len += keep;
            c->total += (uint64_t)n;
            continue;
        }
        if (n == 0) {
            close_fd(&c->fd);
            *open_flag = 0;
            return 0;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN) return 0;
        close_fd(&c->fd);
        *open_flag = 0;
        return -1;
    }
}

static void read_reports(run_state *r)
{
    for (;;) {
        ssize_t n = read(r->report_r, r->rep_buf + r->rep_len, sizeof r->rep_buf - r->rep_len);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
            close_fd(&r->report_r);
            r->report_eof = 1;
            return;
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            return;
        }
        r->rep_len += (size_t)n;
        if (r->rep_len < sizeof r->rep_buf) continue;
        sbx_report rep;
        memcpy(&rep, r->rep_buf, sizeof rep);
        r->rep_len = 0;
        if (rep.kind == SBX_REPORT_SETUP_FAILED && !r->setup_failed) {
            r->setup_failed = 1;
            r->setup_step = rep.step;
            r->setup_err = rep.err;
        } else if (rep.kind == SBX_REPORT_EXITED && !r->exited) {
            r->exited = 1;
            r->status = rep.status;
            r->maxrss_kb = rep.maxrss_kb;
            if (!r->t_end) r->t_end = prl_now();
        }
    }
}

static void feed_stdin(run_state *r)
{
    while (r->in_off < r->in_len) {
        size_t n = r->in_len - r->in_off;
        ssize_t w = write(r->in_w, r->in_data + r->in_off, n > 65536 ? 65536 : n);
        if (w > 0) {
            r->in_off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) return;
        break; /* EPIPE: the program closed its stdin; not an error */
    }
    close_fd(&r->in_w); /* all fed (or refused): the program sees EOF */
}

/* The poll loop: until the init has exited (report EOF) and both streams hit EOF. */
static void supervise(run_state *r)
{
    int out_open = !r->no_stdout, err_open = 1;
    double deadline = r->t0 + r->lim.wall_seconds, drain_until = 0;
    if (r->in_len == 0) close_fd(&r->in_w);
    while (!r->report_eof || out_open || err_open) {
        struct pollfd p[4];
        int n = 0, ir = -1, io = -1, ie = -1, iw = -1;
        if (!r->report_eof) p[ir = n++] = (struct pollfd){r->report_r, POLLIN, 0};
        if (out_open) p[io = n++] = (struct pollfd){r->out.fd, POLLIN, 0};
        if (err_open) p[ie = n++] = (struct pollfd){r->err.fd, POLLIN, 0};
        if (r->in_w >= 0) p[iw = n++] = (struct pollfd){r->in_w, POLLOUT, 0};
        double t = prl_now(), until = r->killed || r->exited ? t + 0.05 : deadline;
        if (r->cancel && until > t + 0.1) until = t + 0.1; /* look at the cancel flag */
        if (r->report_eof && !drain_until) drain_until = t + 1.0;
        if (drain_until && drain_until < until) until = drain_until;
        int ms = until > t ? (int)ceil((until - t) * 1000) : 0;
        int got = poll(p, (nfds_t)n, ms);
        if (got < 0 && errno != EINTR) break;
        if (ir >= 0 && p[ir].revents) read_reports(r);
        if (io >= 0 && p[io].revents) capture_read(&r->out, &out_open);
        if (ie >= 0 && p[ie].revents) capture_read(&r->err, &err_open);
        if (iw >= 0 && p[iw].revents) feed_stdin(r);
        t = prl_now();
        if (r->lim.output_kill && !r->killed) {
            if (r->out.total > r->lim.output_bytes) kill_tree(r, KILL_OUTPUT, "stdout");
            else if (r->err.total > r->lim.output_bytes) kill_tree(r, KILL_OUTPUT, "stderr");
        }
        int cancelled = r->cancel && __atomic_load_n(r->cancel, __ATOMIC_ACQUIRE);
        if (!r->killed && !r->exited && !r->setup_failed && (t >= deadline || cancelled))
            kill_tree(r, cancelled ? KILL_CANCEL : KILL_WALL, NULL);
        /* Escalations: an init that does not go within 2 s of a kill, or after the program
        ** ended, is killed; a stream still open 1 s after the init left is given up on
        ** (some process outside the tree holds it: should not happen, never wait forever). */
        double since = r->killed ? t - r->t_kill : r->exited ? t - r->t_end : 0;
        if (!r->report_eof && since > 2.0) kill(r->c2, SIGKILL);
        if (drain_until && t >= drain_until) {
            if (r->sb->layers & PRL_SANDBOX_CGROUP_KILL) sbx_cgroup_kill(&r->slot->cg);
            break;
        }
    }
    close_fd(&r->out.fd);
    close_fd(&r->err.fd);
    close_fd(&r->in_w);
    close_fd(&r->report_r);
}

/* ---------------------------------------------------------------- classification --- */

static void describe_signal(char *out, size_t n, int sig)
{
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev) snprintf(out, n, "SIG%s", abbrev);
    else snprintf(out, n, "signal %d", sig);
}

static void classify(const run_state *r, const sbx_cg_stats *c0, const sbx_cg_stats *c1,
                     prl_sandbox_result *res)
{
    int sig = r->exited && WIFSIGNALED(r->status) ? WTERMSIG(r->status) : 0;
    int code = r->exited && WIFEXITED(r->status) ? WEXITSTATUS(r->status) : 0;
    if (r->killed && !r->exited) sig = SIGKILL;
    res->signal = sig;
    res->exit_code = sig ? 128 + sig : code;
    char sname[32];
    describe_signal(sname, sizeof sname, sig);
    int oom = (r->sb->layers & PRL_SANDBOX_CGROUP_MEMORY) && c1->oom_kills > c0->oom_kills;
    prl_sandbox_status st;
    char *why = res->reason;
    size_t wn = sizeof res->reason;
    if (r->killed == KILL_CANCEL) {
        st = PRL_SANDBOX_STATUS_TIMEOUT;
        snprintf(why, wn, "stopped by the caller (cancel): the process tree was killed");
    } else if (r->killed == KILL_WALL) {
        st = PRL_SANDBOX_STATUS_TIMEOUT;
        snprintf(why, wn, "wall time limit of %g s reached: the process tree was killed",
                 r->lim.wall_seconds);
    } else if (oom) {
        st = PRL_SANDBOX_STATUS_MEMORY_LIMIT;
        snprintf(why, wn, "memory limit of %llu MiB reached: the cgroup OOM killer fired (%s)",
                 (unsigned long long)(r->lim.memory_bytes >> 20),
                 sig ? sname : "the program survived it");
    } else if (sig == SIGXCPU) {
        st = PRL_SANDBOX_STATUS_TIMEOUT;
        snprintf(why, wn, "CPU time limit of %g s reached (SIGXCPU)", r->lim.cpu_seconds);
    } else if (sig == SIGXFSZ || r->killed == KILL_OUTPUT) {
        st = PRL_SANDBOX_STATUS_OUTPUT_LIMIT;
        if (sig == SIGXFSZ)
            snprintf(why, wn, "file size limit of %llu bytes exceeded (SIGXFSZ)",
                     (unsigned long long)r->lim.file_size_bytes);
        else
            snprintf(why, wn,
                     "output limit of %llu bytes passed on %s: the process tree was killed",
                     (unsigned long long)r->lim.output_bytes, r->kill_stream);
    } else if (sig == SIGSYS) {
        st = PRL_SANDBOX_STATUS_KILLED;
        snprintf(why, wn, "killed by SIGSYS: a forbidden system call or system call ABI");
    } else if (!r->exited) {
        st = PRL_SANDBOX_STATUS_SANDBOX_ERROR;
        snprintf(why, wn, "the sandbox init ended without reporting the program's exit");
    } else if (sig || code) {
        st = PRL_SANDBOX_STATUS_RUNTIME_ERROR;
        if (sig) snprintf(why, wn, "killed by %s", sname);
        else snprintf(why, wn, "exited with code %d", code);
    } else {
        st = PRL_SANDBOX_STATUS_OK;
        snprintf(why, wn, "exited with code 0");
    }
    res->status = st;
}

/* ---------------------------------------------------------------- the run ---------- */

static prl_status start_child(run_state *r, sbx_spawn *sp, int pipes[5][2])
{
    /* pipes: 0 sync, 1 report, 2 stdin, 3 stdout, 4 stderr */
    sp->sync_r = pipes[0][0];
    sp->report_w = pipes[1][1];
    sp->in_r = pipes[2][0];
    sp->out_w = pipes[3][1];
    sp->err_w = pipes[4][1];
    prl_status rc = sbx_cgroup_open_tasks(&r->slot->cg, sp->cg_fds, &sp->n_cg_fds);
    if (rc) return rc;
    r->t0 = prl_now();
    pid_t pid = r->warm ? sbx_zygote_spawn(r->sb, r->slot, sp, clone_flags(r->sb->layers))
                        : sbx_clone(clone_flags(r->sb->layers));
    if (pid < 0 && r->warm) {
        for (int i = 0; i < sp->n_cg_fds; i++) close(sp->cg_fds[i]);
        return PRL_ERR_IO; /* the zygote's error is set */
    }
    if (pid < 0) {
        for (int i = 0; i < sp->n_cg_fds; i++) close(sp->cg_fds[i]);
        return prl_error_set(PRL_ERR_IO, "sandbox: clone: %s", strerror(errno));
    }
    if (pid == 0) sbx_child_init(sp);
    r->c2 = pid;
    for (int i = 0; i < sp->n_cg_fds; i++) close(sp->cg_fds[i]);
    for (int i = 0; i < 5; i++) close_fd(&pipes[i][i == 0 || i == 2 ? 0 : 1]);
    const sbx_slot *s = r->slot;
    if (r->sb->layers & PRL_SANDBOX_USERNS) {
        char path[64], map[64];
        /* Unprivileged writers must deny setgroups before mapping gids. */
        const char *files[3] = {r->sb->caps.is_root ? NULL : "setgroups", "gid_map", "uid_map"};
        for (int i = 0; rc == PRL_OK && i < 3; i++) {
            if (!files[i]) continue;
            snprintf(path, sizeof path, "/proc/%ld/%s", (long)pid, files[i]);
            if (i == 0) snprintf(map, sizeof map, "deny");
            else
                snprintf(map, sizeof map, "%u %u 1\n", i == 1 ? s->prog_gid : s->prog_uid,
                         i == 1 ? s->host_gid : s->host_uid);
            int fd = open(path, O_WRONLY | O_CLOEXEC);
            ssize_t w = fd >= 0 ? write(fd, map, strlen(map)) : -1;
            if (w != (ssize_t)strlen(map))
                rc = prl_error_set(PRL_ERR_IO, "sandbox: writing '%s' to %s: %s", map, path,
                                   strerror(errno));
            if (fd >= 0) close(fd);
        }
    }
    if (rc == PRL_OK) rc = sbx_cgroup_attach(&s->cg, pid);
    if (rc == PRL_OK && write(pipes[0][1], "g", 1) != 1)
        rc = prl_error_set(PRL_ERR_IO, "sandbox: releasing the sandbox init: %s", strerror(errno));
    close_fd(&pipes[0][1]);
    if (rc) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        r->c2 = -1;
    }
    return rc;
}

static prl_status alloc_capture(capture *c, size_t cap, int fd)
{
    c->fd = fd;
    c->cap = cap;
    c->alloc = cap + 1 < 4096 ? cap + 1 : 4096;
    c->buf = malloc(c->alloc);
    if (!c->buf) return prl_error_set(PRL_ERR_NOMEM, "sandbox: output buffer");
    return PRL_OK;
}

/* An interactive run: the child's stdin and stdout ends become dups of the caller's fds,
** and the supervisor's own ends of those two pipes are closed (nothing to feed or capture). */
static prl_status own_stdio(run_state *r, const prl_sandbox_request *req, int pipes[5][2])
{
    int in = fcntl(req->stdin_fd, F_DUPFD_CLOEXEC, 3),
        out = fcntl(req->stdout_fd, F_DUPFD_CLOEXEC, 3);
    if (in < 0 || out < 0) {
        if (in >= 0) close(in);
        if (out >= 0) close(out);
        return prl_error_set(PRL_ERR_ARG, "sandbox: stdin_fd/stdout_fd: %s", strerror(errno));
    }
    close_fd(&pipes[2][0]), close_fd(&pipes[2][1]), close_fd(&pipes[3][0]), close_fd(&pipes[3][1]);
    pipes[2][0] = in, pipes[3][1] = out; /* the child's ends; the supervisor has none */
    r->cancel = req->cancel, r->no_stdout = 1, r->in_len = 0;
    return PRL_OK;
}

/* The program's stdin, stdout and stderr pipes become the slot uid's, so that it may reopen
** them: /dev/stdin, /dev/stdout and /proc/self/fd/N are links to them, and opening one checks
** the pipe's owner (0600, the creator's), which would otherwise be the supervisor. Only
** anonymous pipes (the file system of the sync pipe, pipefs) are changed: an interactive
** run's caller may pass anything, and a file or named FIFO on disk is not ours to chown. */
static prl_status give_stdio_to_slot(const sbx_slot *s, int pipes[5][2])
{
    struct stat anon, st;
    if (fstat(pipes[0][0], &anon) != 0)
        return prl_error_set(PRL_ERR_IO, "sandbox: fstat of a pipe: %s", strerror(errno));
    const int ends[3] = {pipes[2][0], pipes[3][1], pipes[4][1]};
    for (int i = 0; i < 3; i++) {
        if (fstat(ends[i], &st) != 0)
            return prl_error_set(PRL_ERR_IO, "sandbox: fstat of fd %d: %s", i, strerror(errno));
        if (!S_ISFIFO(st.st_mode) || st.st_dev != anon.st_dev) continue;
        if ((st.st_uid != s->host_uid || st.st_gid != s->host_gid) &&
            fchown(ends[i], s->host_uid, s->host_gid) != 0)
            return prl_error_set(PRL_ERR_IO, "sandbox: giving the program's fd %d to uid %u: %s", i,
                                 s->host_uid, strerror(errno));
    }
    return PRL_OK;
}

static prl_status run_slot(prl_sandbox *sb, sbx_slot *s, const prl_sandbox_request *req,
                           const prl_sandbox_limits *lim, prl_sandbox_result *res)
{
    run_state r = {.sb = sb,
                   .slot = s,
                   .lim = *lim,
                   .c2 = -1,
                   .report_r = -1,
                   .in_w = -1,
                   .in_data = req->stdin_data,
                   .in_len = req->stdin_len,
                   .warm = sb->warm && !strcmp(req->lang, "python3")};
    r.out.fd = r.err.fd = -1;
    res->warm = r.warm;
    sbx_spawn sp;
    memset(&sp, 0, sizeof sp);
    char prog_path[PATH_MAX + 16];
    sbx_build_spawn(sb, s, req, lim, &sp, prog_path, sizeof prog_path);
    int pipes[5][2];
    for (int i = 0; i < 5; i++) pipes[i][0] = pipes[i][1] = -1;
    sbx_cg_stats c0, c1;
    memset(&c1, 0, sizeof c1);
    int mnt = (sb->layers & PRL_SANDBOX_MNTNS) != 0;
    prl_status rc = sbx_cgroup_prepare(&s->cg, sb->layers, lim, &c0);
    if (rc == PRL_OK && !mnt) rc = hostdir_prepare(s, req, sp.program_name);
    for (int i = 0; rc == PRL_OK && i < 5; i++)
        if (make_pipe(pipes[i]) < 0)
            rc = prl_error_set(PRL_ERR_IO, "sandbox: pipe: %s", strerror(errno));
    if (rc == PRL_OK && req->own_stdio) rc = own_stdio(&r, req, pipes);
    if (rc == PRL_OK) rc = give_stdio_to_slot(s, pipes);
    if (rc == PRL_OK) rc = alloc_capture(&r.out, (size_t)lim->output_bytes, pipes[3][0]);
    if (rc == PRL_OK) rc = alloc_capture(&r.err, (size_t)lim->output_bytes, pipes[4][0]);
    if (rc == PRL_OK) {
        r.report_r = pipes[1][0];
        r.in_w = pipes[2][1];
        pipes[1][0] = pipes[2][1] = pipes[3][0] = pipes[4][0] = -1; /* now owned by r */
        for (int i = 0; i < 4; i++) {
            int fd = i == 0 ? r.report_r : i == 1 ? r.in_w : i == 2 ? r.out.fd : r.err.fd;
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        }
        rc = start_child(&r, &sp, pipes);
    }
    for (int i = 0; i < 5; i++) close_fd(&pipes[i][0]), close_fd(&pipes[i][1]);
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    if (rc == PRL_OK) {
        supervise(&r);
        int st;
        while (wait4(r.c2, &st, 0, &ru) < 0 && errno == EINTR) {
        }
        if (!r.t_end) r.t_end = prl_now();
        sbx_cgroup_stats(&s->cg, sb->layers, &c1);
        if (r.setup_failed)
            rc = prl_error_set(PRL_ERR_IO, "sandbox setup failed at step '%s': %s",
                               sbx_step_name(r.setup_step), strerror(r.setup_err));
    }
    /* Whatever happened, nothing of this run may outlive it. */
    if (!sbx_cgroup_empty(&s->cg)) sbx_cgroup_kill(&s->cg);
    sbx_cgroup_finish(&s->cg);
    if (!mnt) hostdir_clean(s);
    close_fd(&r.out.fd), close_fd(&r.err.fd), close_fd(&r.in_w), close_fd(&r.report_r);
    if (rc == PRL_OK) {
        classify(&r, &c0, &c1, res);
        res->wall_seconds = r.t_end - r.t0;
        res->cpu_seconds = c1.have_cpu && c0.have_cpu
                               ? (double)(c1.cpu_ns - c0.cpu_ns) * 1e-9
                               : (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
                                     (double)ru.ru_stime.tv_sec +
                                     1e-6 * (double)ru.ru_stime.tv_usec;
        if (c1.have_peak && (sb->layers & PRL_SANDBOX_CGROUP_MEMORY)) {
            res->peak_memory_bytes = c1.mem_peak > c0.mem_usage ? c1.mem_peak - c0.mem_usage : 0;
            res->peak_memory_from_cgroup = 1;
        } else {
            int64_t kb = r.maxrss_kb > ru.ru_maxrss ? r.maxrss_kb : ru.ru_maxrss;
            res->peak_memory_bytes = (uint64_t)kb * 1024;
        }
        res->out = r.out.buf, res->out_len = r.out.len, res->out_total = r.out.total;
        res->err = r.err.buf, res->err_len = r.err.len, res->err_total = r.err.total;
        res->out[res->out_len] = res->err[res->err_len] = 0;
        res->out_truncated = r.out.total > r.out.len;
        res->err_truncated = r.err.total > r.err.len;
    } else {
        free(r.out.buf);
        free(r.err.buf);
    }
    return rc;
}

prl_status prl_sandbox_run(prl_sandbox *sb, int slot, const prl_sandbox_request *req,
                           prl_sandbox_result *res)
{
    memset(res, 0, sizeof *res);
    res->status = PRL_SANDBOX_STATUS_SANDBOX_ERROR;
    res->exit_code = -1;
    res->slot = slot;
    res->layers = sb->layers;
    if (sb->layers & (PRL_SANDBOX_CGROUP_MEMORY | PRL_SANDBOX_CGROUP_PIDS | PRL_SANDBOX_CGROUP_CPU))
        res->cgroup_version = sb->caps.cgroup_version;
    prl_sandbox_limits lim;
    prl_status rc = check_request(sb, slot, req, &lim);
    if (rc == PRL_OK) {
        res->limits = lim;
        sbx_slot *s = &sb->slots[slot];
        res->uid = s->host_uid;
        if (atomic_exchange(&s->busy, 1))
            rc = prl_error_set(PRL_ERR_ARG, "sandbox: slot %d is busy with another run", slot);
        else {
            sigset_t pipe_set, old;
            sigemptyset(&pipe_set);
            sigaddset(&pipe_set, SIGPIPE);
            pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
            rc = run_slot(sb, s, req, &lim, res);
            sigset_t pending;
            struct timespec zero = {0, 0};
            if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) &&
                !sigismember(&old, SIGPIPE))
                sigtimedwait(&pipe_set, NULL, &zero);
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            atomic_store(&s->busy, 0);
        }
    }
    if (rc) {
        res->status = PRL_SANDBOX_STATUS_SANDBOX_ERROR;
        snprintf(res->reason, sizeof res->reason, "%s", prl_error_message());
    }
    return rc;
}
