/*
** zygote.c — the supervisor side of the warm path: start a slot's zygote (zygote_main.c, a
** separate executable that embeds python3), hand it one run at a time, stop it.
**
** Why a separate executable: the supervisor is multithreaded, and a forked copy of it may
** not initialise an interpreter (malloc and stdio locks of other threads); an exec'd helper
** starts clean and holds nothing of the supervisor's memory, which every program's process
** then inherits. The zygote gets the sandbox handle and the slot (plain data, copied) at
** start, and per run the run's limits, the program text and the child's pipe ends and
** cgroup "tasks" files (SCM_RIGHTS); it clones the sandbox init with CLONE_PARENT, so the
** init is the supervisor's child exactly as in a cold run (reaped, killed and supervised by
** the same code in run.c), and answers its pid.
**
** What it does not do: decide anything about isolation. The init and the program run the
** same code as a cold run (child.c); only the final execve is replaced by entering the
** zygote's interpreter.
*/
#include "sandbox/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

enum { MAX_FDS = 5 + SBX_CG_MAX_FDS };

static int send_all(int fd, const void *p, size_t n, const int *fds, int n_fds)
{
    const char *c = p;
    while (n > 0) {
        struct iovec iov = {.iov_base = (void *)c, .iov_len = n};
        char ctl[CMSG_SPACE(sizeof(int) * MAX_FDS)];
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        if (n_fds > 0) { /* the fds ride on the first byte */
            memset(ctl, 0, sizeof ctl);
            m.msg_control = ctl;
            m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n_fds);
            struct cmsghdr *h = CMSG_FIRSTHDR(&m);
            h->cmsg_level = SOL_SOCKET, h->cmsg_type = SCM_RIGHTS;
            h->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n_fds);
            memcpy(CMSG_DATA(h), fds, sizeof(int) * (size_t)n_fds);
        }
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w, n -= (size_t)w, n_fds = 0;
    }
    return 0;
}

int sandbox__read_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t r = read(fd, c, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        c += r, n -= (size_t)r;
    }
    return 0;
}

void sbx_zygote_stop(sbx_slot *s)
{
    if (s->zygote_sock >= 0) close(s->zygote_sock); /* EOF: the zygote exits */
    s->zygote_sock = -1;
    if (s->zygote_pid > 0) {
        kill(s->zygote_pid, SIGKILL);
        while (waitpid(s->zygote_pid, NULL, 0) < 0 && errno == EINTR) {
        }
    }
    s->zygote_pid = 0;
}

/* fork + exec of the zygote with its end of the control socket as fd 3; the child makes
** only system calls (we may be multithreaded). */
static pid_t exec_zygote(const prl_sandbox *sb, int sock)
{
    const char *argv[] = {sb->zygote, NULL};
    const char *envp[] = {NULL}; /* the zygote sets the sandbox's own environment */
    pid_t pid = sbx_clone(0);
    if (pid != 0) return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (dup2(sock, SBX_ZYG_FD) < 0) _exit(126);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(argv[0], (char *const *)argv, (char *const *)envp);
    _exit(127);
}

prl_status sbx_zygote_start(const prl_sandbox *sb, sbx_slot *s)
{
    if (s->zygote_sock >= 0) return PRL_OK;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return prl_error_set(PRL_ERR_IO, "sandbox: socketpair: %s", strerror(errno));
    pid_t pid = exec_zygote(sb, sv[1]);
    close(sv[1]);
    if (pid < 0) {
        close(sv[0]);
        return prl_error_set(PRL_ERR_IO, "sandbox: starting the zygote: %s", strerror(errno));
    }
    s->zygote_pid = pid, s->zygote_sock = sv[0];
    size_t bpf_bytes = sb->bpf_len * sizeof *sb->bpf;
    sbx_zyg_hello *h = calloc(1, sizeof *h + bpf_bytes);
    if (!h) {
        sbx_zygote_stop(s);
        return prl_error_set(PRL_ERR_NOMEM, "sandbox: zygote hello");
    }
    h->magic = SBX_ZYG_MAGIC, h->size = sizeof *h;
    h->sb = *sb, h->slot = *s, h->bpf_len = sb->bpf_len;
    if (bpf_bytes) memcpy(h + 1, sb->bpf, bpf_bytes);
    sbx_zyg_reply rep;
    memset(&rep, 0, sizeof rep);
    int ok = send_all(sv[0], h, sizeof *h + bpf_bytes, NULL, 0) == 0 &&
             sandbox__read_all(sv[0], &rep, sizeof rep) == 0;
    free(h);
    if (ok && rep.pid == 0) return PRL_OK;
    sbx_zygote_stop(s);
    rep.msg[sizeof rep.msg - 1] = 0;
    return prl_error_set(PRL_ERR_IO, "sandbox: the zygote of slot %d did not start: %s", s->index,
                         ok ? rep.msg : "it exited (see its stderr)");
}

/* One request; -1 when the zygote is gone (the caller restarts it once). */
static pid_t spawn_once(sbx_slot *s, const sbx_spawn *sp, unsigned long flags, sbx_zyg_reply *rep)
{
    int fds[MAX_FDS] = {sp->sync_r, sp->report_w, sp->in_r, sp->out_w, sp->err_w};
    for (int i = 0; i < sp->n_cg_fds; i++) fds[5 + i] = sp->cg_fds[i];
    sbx_zyg_run run = {.magic = SBX_ZYG_MAGIC,
                       .n_fds = (uint32_t)(5 + sp->n_cg_fds),
                       .clone_flags = flags,
                       .lim = sp->lim,
                       .program_len = sp->program_len};
    if (send_all(s->zygote_sock, &run, sizeof run, fds, 5 + sp->n_cg_fds) < 0 ||
        send_all(s->zygote_sock, sp->program, sp->program_len, NULL, 0) < 0 ||
        sandbox__read_all(s->zygote_sock, rep, sizeof *rep) < 0)
        return -1;
    return 0;
}

pid_t sbx_zygote_spawn(const prl_sandbox *sb, sbx_slot *s, const sbx_spawn *sp, unsigned long flags)
{
    sbx_zyg_reply rep;
    memset(&rep, 0, sizeof rep);
    for (int attempt = 0; attempt < 2; attempt++) {
        prl_status rc = sbx_zygote_start(sb, s);
        if (rc) return -1;
        if (spawn_once(s, sp, flags, &rep) == 0) break;
        sbx_zygote_stop(s); /* died between runs (killed from outside): one fresh start */
        if (attempt == 1) {
            prl_error_set(PRL_ERR_IO, "sandbox: the zygote of slot %d stopped answering", s->index);
            return -1;
        }
    }
    if (rep.pid > 0) return rep.pid;
    rep.msg[sizeof rep.msg - 1] = 0;
    prl_error_set(PRL_ERR_IO, "sandbox: the zygote of slot %d could not clone: %s (%s)", s->index,
                  strerror(-rep.pid), rep.msg);
    return -1;
}
