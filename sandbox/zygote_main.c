/*
** zygote_main.c — `prl-sandbox-zygote`, a slot's pre-started python3 (the warm path of
** sandbox/; the supervisor side is zygote.c).
**
** Started by the supervisor with its control socket as fd 3 and an empty environment: it
** reads the sandbox handle and the slot, takes the sandbox's environment, points its
** stdin/stdout/stderr at pipes (as a cold run's are), and initialises the interpreter exactly
** as `python3 -I -B -u /sandbox/main.py` would (same argv parsing, site imports done), but
** does not run anything. Then, per request: clone the sandbox init with CLONE_PARENT (so it
** is the supervisor's child), which runs the cold path's code (child.c: namespaces, root,
** cgroups, rlimits, ids, capabilities, no_new_privs, Landlock, seccomp); the program process
** then, instead of execve, restores the interpreter's signal dispositions, closes the report
** pipe and runs the file with Py_RunMain in its own copy of the untouched interpreter.
**
** What carries over between programs: nothing a program did (each is a copy-on-write copy of
** the zygote, which never runs a program, in fresh namespaces and tmpfs dirs). What all
** programs of one zygote share: the interpreter state after start-up, including its string
** hash seed (a cold run draws a new one per run; docs/sandbox.md "Warm runs").
*/
#include "sandbox/internal.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

enum { MAX_FDS = 5 + SBX_CG_MAX_FDS };

static struct sigaction py_signals[NSIG];

static void reply(int pid, const char *msg)
{
    sbx_zyg_reply r;
    memset(&r, 0, sizeof r);
    r.pid = pid;
    snprintf(r.msg, sizeof r.msg, "%s", msg ? msg : "");
    if (write(SBX_ZYG_FD, &r, sizeof r) != (ssize_t)sizeof r) _exit(1);
}

/* The program process: the interpreter as the zygote left it, in the sandbox. */
static void enter_python(const sbx_spawn *sp)
{
    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP) sigaction(s, &sp->signals[s], NULL);
    /* What execve would have done: a process whose ids changed without an exec is not
    ** dumpable, so its /proc entries would be root's (hidden by hidepid=2); and its name. */
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    const char *base = strrchr(sp->argv[0], '/');
    prctl(PR_SET_NAME, base ? base + 1 : sp->argv[0], 0, 0, 0);
    PyOS_AfterFork_Child();
    _exit(Py_RunMain());
}

/* stdin: a pipe at EOF; stdout and stderr: a pipe nobody reads. Pipes like a cold run's, so
** the interpreter's stream objects are made for the same kind of file (never seekable). */
static int stdio_pipes(void)
{
    int in[2], out[2];
    if (pipe(in) < 0 || pipe(out) < 0) return -1;
    if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(out[1], 2) < 0) return -1;
    close(in[0]), close(in[1]), close(out[1]);
    return fcntl(out[0], F_SETFD, FD_CLOEXEC);
}

static int init_python(const sbx_spawn *sp, char *err, size_t n)
{
    /* From the dispositions a cold python3 starts with (the sandbox init resets them all): an
    ** ignored signal survives execve, and the supervisor's may be ignored (SIGCHLD, SIGPIPE). */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP) sigaction(s, &dfl, NULL);
    clearenv();
    for (int i = 0; sp->envp[i]; i++)
        if (putenv((char *)sp->envp[i]) != 0) return snprintf(err, n, "putenv"), -1;
    PyConfig cfg;
    PyConfig_InitPythonConfig(&cfg);
    cfg.parse_argv = 1;
    int argc = 0;
    while (sp->argv[argc]) argc++;
    PyStatus st = PyConfig_SetBytesArgv(&cfg, argc, (char *const *)sp->argv);
    if (!PyStatus_Exception(st)) st = PyConfig_SetBytesString(&cfg, &cfg.program_name, sp->argv[0]);
    if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&cfg);
    PyConfig_Clear(&cfg);
    if (PyStatus_Exception(st))
        return snprintf(err, n, "python: %s", st.err_msg ? st.err_msg : "initialisation failed"),
               -1;
    for (int s = 1; s < NSIG; s++) sigaction(s, NULL, &py_signals[s]);
    return 0;
}

static int copy_in(const char *path, const char *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    int ok = write(fd, data, n) == (ssize_t)n;
    close(fd);
    return ok ? 0 : -1;
}

/* The interpreter must start with the files a sandboxed one sees. Of the host, a sandbox with
** a mount namespace shows /usr and /etc/ld.so.cache only; /usr is the same here, but the
** host's /etc has more (Debian's sitecustomize.py is a link into /etc/python3.11, which a
** cold start in the sandbox fails to import). So: a private mount namespace whose /etc is the
** sandbox's (passwd and group of the slot, ld.so.cache), and "/" as the working directory. */
static int sandbox_etc(const sbx_spawn *sp, char *err, size_t n)
{
    if (!(sp->layers & PRL_SANDBOX_MNTNS)) return chdir("/"); /* the program sees the host's */
    static char cache[1 << 20];
    ssize_t cache_n = -1;
    int fd = open("/etc/ld.so.cache", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) cache_n = read(fd, cache, sizeof cache), close(fd);
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        mount("tmpfs", "/etc", "tmpfs", MS_NOSUID | MS_NODEV, "size=2m,mode=0755") < 0 ||
        copy_in("/etc/passwd", sp->passwd, strlen(sp->passwd)) < 0 ||
        copy_in("/etc/group", sp->group, strlen(sp->group)) < 0 ||
        (cache_n > 0 && copy_in("/etc/ld.so.cache", cache, (size_t)cache_n) < 0) || chdir("/") < 0)
        return snprintf(err, n, "the zygote's /etc (needs root with a mount namespace): %s",
                        strerror(errno)),
               -1;
    return 0;
}

/* The interpreter linked here must be the sandbox's python3 (same version). */
static int same_python(const char *python3, char *err, size_t n)
{
    char real[PATH_MAX], want[32];
    snprintf(want, sizeof want, "/python%d.%d", PY_MAJOR_VERSION, PY_MINOR_VERSION);
    size_t lw = strlen(want), lr;
    if (!realpath(python3, real) || (lr = strlen(real)) < lw || strcmp(real + lr - lw, want))
        return snprintf(err, n, "options.python3 %.160s is not the python%d.%d this zygote embeds",
                        python3, PY_MAJOR_VERSION, PY_MINOR_VERSION),
               -1;
    return 0;
}

/* Receive a run's header with its fds. */
static int recv_run(sbx_zyg_run *run, int fds[MAX_FDS])
{
    struct iovec iov = {.iov_base = run, .iov_len = sizeof *run};
    char ctl[CMSG_SPACE(sizeof(int) * MAX_FDS)];
    struct msghdr m = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = ctl,
                       .msg_controllen = sizeof ctl};
    ssize_t r;
    while ((r = recvmsg(SBX_ZYG_FD, &m, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
    }
    if (r <= 0) return -1;
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    int n = h && h->cmsg_type == SCM_RIGHTS ? (int)((h->cmsg_len - CMSG_LEN(0)) / sizeof(int)) : 0;
    if (n > 0) memcpy(fds, CMSG_DATA(h), sizeof(int) * (size_t)n);
    if ((size_t)r < sizeof *run &&
        sandbox__read_all(SBX_ZYG_FD, (char *)run + r, sizeof *run - (size_t)r))
        return -1;
    if (run->magic != SBX_ZYG_MAGIC || (int)run->n_fds != n || n < 5) return -1;
    return n;
}

/* One run: clone the sandbox init for it and answer its pid. */
static int serve_one(const prl_sandbox *sb, const sbx_slot *slot)
{
    sbx_zyg_run run;
    int fds[MAX_FDS];
    int n = recv_run(&run, fds);
    if (n < 0) return -1;
    char *program = malloc(run.program_len ? run.program_len : 1);
    if (!program || sandbox__read_all(SBX_ZYG_FD, program, run.program_len)) return -1;
    prl_sandbox_request req = {.lang = "python3",
                               .program = program,
                               .program_len = run.program_len};
    sbx_spawn sp;
    memset(&sp, 0, sizeof sp);
    char prog_path[PATH_MAX + 16];
    sbx_build_spawn(sb, slot, &req, &run.lim, &sp, prog_path, sizeof prog_path);
    sp.sync_r = fds[0], sp.report_w = fds[1], sp.in_r = fds[2], sp.out_w = fds[3],
    sp.err_w = fds[4];
    sp.n_cg_fds = n - 5;
    for (int i = 0; i < sp.n_cg_fds; i++) sp.cg_fds[i] = fds[5 + i];
    sp.enter = enter_python, sp.signals = py_signals;
    pid_t pid = sbx_clone((unsigned long)run.clone_flags | CLONE_PARENT);
    if (pid == 0) sbx_child_init(&sp);
    int e = errno;
    for (int i = 0; i < n; i++) close(fds[i]);
    free(program);
    reply(pid > 0 ? pid : -e, pid > 0 ? "" : "clone");
    return 0;
}

int main(void)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (getppid() == 1) return 1; /* the supervisor is already gone */
    sbx_zyg_hello h;
    if (sandbox__read_all(SBX_ZYG_FD, &h, sizeof h) || h.magic != SBX_ZYG_MAGIC ||
        h.size != sizeof h)
        return 1;
    struct sock_filter *bpf = calloc(h.bpf_len ? h.bpf_len : 1, sizeof *bpf);
    if (!bpf || sandbox__read_all(SBX_ZYG_FD, bpf, h.bpf_len * sizeof *bpf)) return 1;
    prl_sandbox *sb = &h.sb;
    sbx_slot *slot = &h.slot;
    sb->slots = slot, sb->bpf = bpf, sb->n_slots = 1;
    /* The environment and argv of a python3 run of this slot (the program is written by the
    ** init per run; the interpreter only needs its path). */
    prl_sandbox_request req = {.lang = "python3", .program = "", .program_len = 0};
    sbx_spawn sp;
    memset(&sp, 0, sizeof sp);
    char prog_path[PATH_MAX + 16], err[256] = "";
    prl_sandbox_limits lim;
    prl_sandbox_limits_default(&lim);
    sbx_build_spawn(sb, slot, &req, &lim, &sp, prog_path, sizeof prog_path);
    if (same_python(sb->python3, err, sizeof err) || sandbox_etc(&sp, err, sizeof err) ||
        stdio_pipes() < 0 || init_python(&sp, err, sizeof err)) {
        reply(-1, err[0] ? err : strerror(errno));
        return 1;
    }
    reply(0, "");
    while (serve_one(sb, slot) == 0) {
    }
    return 0;
}
