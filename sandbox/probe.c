/*
** probe.c — detect which isolation layers work on this host (spec/sandbox.md §3.13).
**
** Every namespace, mount and seccomp check runs in a throwaway child, so the caller's
** process is never changed; a failing check records "<what was tried>: <errno text>" as the
** reason the layer is missing. Without root the namespaces are tried inside a fresh user
** namespace, as the sandbox would have to use them. cgroups are tried with a trial group
** (mkdir, write a limit, rmdir) in cgroup.c.
*/
#include "sandbox/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef LANDLOCK_CREATE_RULESET_VERSION
#define LANDLOCK_CREATE_RULESET_VERSION (1U << 0)
#endif

typedef struct probe_ctx {
    int is_root;
    char dir[64];            /* scratch mount point */
    struct sock_filter *bpf; /* the real seccomp program, for the trial load */
    size_t bpf_len;
    int step_w; /* the child writes the index of the failing step here */
} probe_ctx;

/* Steps, for the reason text. */
static const char *const probe_steps[] = {
    "",
    "unshare(CLONE_NEWUSER)",
    "writing the uid map",
    "unshare",
    "fork in the pid namespace",
    "pid is not 1 in the new pid namespace",
    "making / private",
    "mounting a tmpfs",
    "pivot_root",
    "mounting proc",
    "bringing up loopback",
    "no_new_privs",
    "loading seccomp",
    "the seccomp filter did not deny unshare",
    "setrlimit",
};
enum {
    P_USERNS = 1,
    P_MAP,
    P_UNSHARE,
    P_FORK,
    P_PID1,
    P_PRIVATE,
    P_TMPFS,
    P_PIVOT,
    P_PROC,
    P_LOOPBACK,
    P_NNP,
    P_SECCOMP,
    P_FILTER,
    P_RLIMIT
};

static int fail_at(const probe_ctx *c, int step)
{
    int e = errno ? errno : EINVAL;
    if (write(c->step_w, &step, sizeof step) < 0) { /* nothing more to do */
    }
    return e;
}

static int write_proc(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t w = write(fd, text, strlen(text));
    close(fd);
    return w == (ssize_t)strlen(text) ? 0 : -1;
}

/* Non-root: every other namespace needs a user namespace with our uid mapped. */
static int enter_userns(const probe_ctx *c, char *map_line)
{
    if (unshare(CLONE_NEWUSER) < 0) return fail_at(c, P_USERNS);
    if (write_proc("/proc/self/setgroups", "deny") < 0 ||
        write_proc("/proc/self/uid_map", map_line) < 0)
        return fail_at(c, P_MAP);
    return 0;
}

static int try_unshare(const probe_ctx *c, int flags, char *map_line)
{
    if (!c->is_root) {
        int e = enter_userns(c, map_line);
        if (e) return e;
    }
    if (flags && unshare(flags) < 0) return fail_at(c, P_UNSHARE);
    return 0;
}

/* ---------------------------------------------------------------- the checks ------- */

typedef int (*check_fn)(const probe_ctx *c, char *map_line);

static int check_user(const probe_ctx *c, char *map_line)
{
    if (unshare(CLONE_NEWUSER) < 0) return fail_at(c, P_USERNS);
    if (!c->is_root && write_proc("/proc/self/setgroups", "deny") < 0) return fail_at(c, P_MAP);
    if (write_proc("/proc/self/uid_map", map_line) < 0) return fail_at(c, P_MAP);
    return getuid() == SBX_INNER_ID ? 0 : fail_at(c, P_MAP);
}

static int in_new_pid(const probe_ctx *c, int (*then)(const probe_ctx *), char *map_line, int flags)
{
    int e = try_unshare(c, CLONE_NEWPID | flags, map_line);
    if (e) return e;
    pid_t p = sbx_clone(0);
    if (p < 0) return fail_at(c, P_FORK);
    if (p == 0) _exit(getpid() != 1 ? fail_at(c, P_PID1) : then ? then(c) : 0);
    int st;
    if (waitpid(p, &st, 0) < 0) return fail_at(c, P_FORK);
    return WIFEXITED(st) ? WEXITSTATUS(st) : EINTR;
}

static int check_pid(const probe_ctx *c, char *map_line)
{
    return in_new_pid(c, NULL, map_line, 0);
}

static int mount_proc(const probe_ctx *c)
{
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return fail_at(c, P_PRIVATE);
    if (mount("proc", c->dir, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2") < 0)
        return fail_at(c, P_PROC);
    return 0;
}

static int check_proc(const probe_ctx *c, char *map_line)
{
    return in_new_pid(c, mount_proc, map_line, CLONE_NEWNS);
}

static int check_mnt(const probe_ctx *c, char *map_line)
{
    int e = try_unshare(c, CLONE_NEWNS, map_line);
    if (e) return e;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return fail_at(c, P_PRIVATE);
    if (mount("tmpfs", c->dir, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k") < 0)
        return fail_at(c, P_TMPFS);
    if (chdir(c->dir) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0)
        return fail_at(c, P_PIVOT);
    return 0;
}

static int check_net(const probe_ctx *c, char *map_line)
{
    int e = try_unshare(c, CLONE_NEWNET, map_line);
    if (e) return e;
    return sbx_loopback_up() < 0 ? fail_at(c, P_LOOPBACK) : 0;
}

static int check_ipc(const probe_ctx *c, char *map_line)
{
    return try_unshare(c, CLONE_NEWIPC, map_line);
}
static int check_uts(const probe_ctx *c, char *map_line)
{
    return try_unshare(c, CLONE_NEWUTS, map_line);
}

static int check_nnp(const probe_ctx *c, char *map_line)
{
    (void)map_line;
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ? fail_at(c, P_NNP) : 0;
}

/* Load the real filter and see it deny something harmless (unshare(0) normally succeeds). */
static int check_seccomp(const probe_ctx *c, char *map_line)
{
    (void)map_line;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return fail_at(c, P_NNP);
    struct sock_fprog prog = {.len = (unsigned short)c->bpf_len, .filter = c->bpf};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0) return fail_at(c, P_SECCOMP);
    if (syscall(SYS_unshare, 0) == 0 || errno != EPERM) return fail_at(c, P_FILTER);
    return 0;
}

static int check_rlimits(const probe_ctx *c, char *map_line)
{
    (void)map_line;
    struct rlimit r = {64, 64};
    return setrlimit(RLIMIT_NOFILE, &r) < 0 ? fail_at(c, P_RLIMIT) : 0;
}

/* Run fn in a child; 0 or the errno it failed with, and the step it failed at. */
static int run_check(probe_ctx *c, check_fn fn, int *step)
{
    int p[2];
    *step = 0;
    if (pipe2(p, O_CLOEXEC) < 0) return errno;
    c->step_w = p[1];
    char map_line[64];
    snprintf(map_line, sizeof map_line, "%d %u 1\n", SBX_INNER_ID, (unsigned)geteuid());
    pid_t pid = sbx_clone(0);
    if (pid < 0) {
        int e = errno;
        close(p[0]), close(p[1]);
        return e;
    }
    if (pid == 0) {
        close(p[0]);
        errno = 0;
        _exit(fn(c, map_line));
    }
    close(p[1]);
    int st, rc;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    rc = WIFEXITED(st) ? WEXITSTATUS(st) : EINTR;
    if (read(p[0], step, sizeof *step) != (ssize_t)sizeof *step) *step = 0;
    close(p[0]);
    return rc;
}

/* ---------------------------------------------------------------- the probe -------- */

static int is_root(void)
{
    if (geteuid() != 0) return 0;
    char *status = NULL;
    if (prl_file_read("/proc/self/status", &status, NULL) != PRL_OK) return 0;
    const char *eff = strstr(status, "CapEff:");
    unsigned long long caps = eff ? strtoull(eff + 7, NULL, 16) : 0;
    free(status);
    return (caps >> 21) & 1; /* CAP_SYS_ADMIN */
}

static void record(prl_sandbox_caps *caps, unsigned layer, int err, int step)
{
    if (!err) {
        caps->layers |= layer;
        return;
    }
    const char *what = step > 0 && step < (int)(sizeof probe_steps / sizeof probe_steps[0])
                           ? probe_steps[step]
                           : "probe";
    snprintf(SBX_WHY(caps, layer), sizeof caps->why[0], "%s: %s", what, strerror(err));
}

prl_status prl_sandbox_probe(prl_sandbox_caps *caps)
{
    memset(caps, 0, sizeof *caps);
    probe_ctx c = {.is_root = is_root()};
    caps->is_root = c.is_root;
    snprintf(c.dir, sizeof c.dir, "/tmp/prl-probe.XXXXXX");
    if (!mkdtemp(c.dir))
        return prl_error_set(PRL_ERR_IO, "sandbox probe: mkdtemp: %s", strerror(errno));
    prl_status built = sbx_seccomp_build(0, &c.bpf, &c.bpf_len);
    struct {
        unsigned layer;
        check_fn fn;
    } checks[] = {
        {PRL_SANDBOX_USERNS, check_user},     {PRL_SANDBOX_PIDNS, check_pid},
        {PRL_SANDBOX_NETNS, check_net},       {PRL_SANDBOX_MNTNS, check_mnt},
        {PRL_SANDBOX_IPCNS, check_ipc},       {PRL_SANDBOX_UTSNS, check_uts},
        {PRL_SANDBOX_PROC, check_proc},       {PRL_SANDBOX_NO_NEW_PRIVS, check_nnp},
        {PRL_SANDBOX_RLIMITS, check_rlimits}, {PRL_SANDBOX_SECCOMP, check_seccomp},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        int step = 0, err;
        if (checks[i].layer == PRL_SANDBOX_SECCOMP && built != PRL_OK) {
            snprintf(SBX_WHY(caps, PRL_SANDBOX_SECCOMP), sizeof caps->why[0], "%s",
                     prl_error_message());
            continue;
        }
        err = run_check(&c, checks[i].fn, &step);
        record(caps, checks[i].layer, err, step);
    }
    rmdir(c.dir);
    free(c.bpf);
    /* Derived layers. */
    if (caps->layers & PRL_SANDBOX_MNTNS) caps->layers |= PRL_SANDBOX_TMPFS;
    else
        snprintf(SBX_WHY(caps, PRL_SANDBOX_TMPFS), sizeof caps->why[0],
                 "needs the mount namespace");
    if (caps->layers & PRL_SANDBOX_SECCOMP) caps->layers |= PRL_SANDBOX_SOCKET_FILTER;
    else snprintf(SBX_WHY(caps, PRL_SANDBOX_SOCKET_FILTER), sizeof caps->why[0], "needs seccomp");
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    if (abi > 0) {
        caps->landlock_abi = (int)abi;
        caps->layers |= PRL_SANDBOX_LANDLOCK;
    } else
        snprintf(SBX_WHY(caps, PRL_SANDBOX_LANDLOCK), sizeof caps->why[0],
                 "landlock_create_ruleset: %s", strerror(errno));
    if (caps->is_root) caps->layers |= PRL_SANDBOX_SLOT_UID;
    else
        snprintf(SBX_WHY(caps, PRL_SANDBOX_SLOT_UID), sizeof caps->why[0],
                 "not root: cannot switch to other uids");
    sbx_cgroup_detect(caps);
    return PRL_OK;
}
