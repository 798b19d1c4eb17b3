/*
** child.c — the code that runs inside the sandbox: its init (C2) and the program (C3).
**
** Both are forked from a possibly multithreaded supervisor, so only system calls are made
** here: no malloc, no stdio, no locks, and raw syscall() where a glibc wrapper would act on
** "all threads" (set*id); every path and string was prepared by the supervisor in the
** sbx_spawn struct. Order follows spec/sandbox.md §3.0:
**
**   C2 (pid 1 of the new pid namespace, or a subreaper without one): die with the
**      supervisor, close foreign fds (another slot's pipes must not leak here), wait for
**      "go" (uid maps written, cgroups attached), build the root (tmpfs, read-only /usr,
**      /etc basics, /dev, tmpfs work and temp dirs, the program file, fresh /proc,
**      pivot_root, root read-only), bring up loopback, set the hostname, fork C3, then reap
**      everything. When C3 ends C2 reports its status and exits, and the kernel kills what
**      is left of the pid namespace; without one C2 first kills its remaining children.
**   C3: setsid, stdio onto the pipes, all other fds closed, rlimits, capabilities dropped,
**      slot uid/gid, no_new_privs, death signal, Landlock, seccomp (last), execve; in a warm
**      run (sp->enter, zygote_main.c) the zygote's interpreter instead of execve.
**
** A failing step sends {step, errno} on the report pipe and exits 127; the supervisor turns
** it into a sandbox_error naming the step. The report pipe is close-on-exec, so once the
** program runs it cannot write there.
*/
#include "sandbox/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* Landlock constants newer than Debian 12's headers (Linux 6.1 uapi). */
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif
#define SBX_LANDLOCK_NET_BIND_TCP (1ULL << 0)
#define SBX_LANDLOCK_NET_CONNECT_TCP (1ULL << 1)
#define SBX_LANDLOCK_SCOPE_ABSTRACT_UNIX (1ULL << 0)
#define SBX_LANDLOCK_SCOPE_SIGNAL (1ULL << 1)

/* The ruleset attribute as of ABI 6; its size tells the kernel which fields we know. */
struct sbx_landlock_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net; /* ABI >= 4 */
    uint64_t scoped;             /* ABI >= 6 */
};

static const char *const step_names[] = {
    [SBX_STEP_SYNC] = "waiting for the supervisor",
    [SBX_STEP_FSID] = "setfsuid/setfsgid",
    [SBX_STEP_PRIVATE] = "making / private",
    [SBX_STEP_ROOT_TMPFS] = "mounting the tmpfs root",
    [SBX_STEP_ROOT_DIRS] = "creating the root's directories",
    [SBX_STEP_BIND_USR] = "binding /usr read-only",
    [SBX_STEP_ETC] = "writing /etc",
    [SBX_STEP_DEV] = "building /dev",
    [SBX_STEP_WORK_TMPFS] = "mounting the work and temp tmpfs",
    [SBX_STEP_PROGRAM] = "writing the program file",
    [SBX_STEP_PROC] = "mounting /proc",
    [SBX_STEP_PIVOT] = "pivot_root",
    [SBX_STEP_ROOT_RO] = "remounting / read-only",
    [SBX_STEP_LOOPBACK] = "bringing up loopback",
    [SBX_STEP_HOSTNAME] = "sethostname",
    [SBX_STEP_FORK] = "forking the program",
    [SBX_STEP_FDS] = "setting up fds",
    [SBX_STEP_CHDIR] = "chdir to the work dir",
    [SBX_STEP_RLIMIT] = "setrlimit",
    [SBX_STEP_CAPS] = "dropping capabilities",
    [SBX_STEP_SETID] = "switching to the slot uid/gid",
    [SBX_STEP_NNP] = "no_new_privs",
    [SBX_STEP_LANDLOCK] = "Landlock",
    [SBX_STEP_SECCOMP] = "loading seccomp",
    [SBX_STEP_EXEC] = "execve of the interpreter",
    [SBX_STEP_SUBREAPER] = "becoming a subreaper",
    [SBX_STEP_CGROUP] = "joining the slot's cgroups",
    [SBX_STEP_CHILDREN] = "opening /proc/thread-self/children (without a pid namespace the tree is "
                          "killed through it)",
};

const char *sbx_step_name(int step)
{
    if (step > 0 && step < (int)(sizeof step_names / sizeof step_names[0]) && step_names[step])
        return step_names[step];
    return "unknown step";
}

pid_t sbx_clone(unsigned long flags)
{
    /* x86-64 argument order: flags, stack, parent_tid, child_tid, tls. A NULL stack makes
    ** the child continue on a copy of ours, like fork. */
    return (pid_t)syscall(SYS_clone, flags | SIGCHLD, NULL, NULL, NULL, 0UL);
}

/* ---------------------------------------------------------------- helpers ---------- */

static void report(int fd, const sbx_report *r)
{
    while (write(fd, r, sizeof *r) < 0 && errno == EINTR) {
    }
}

static void fail(const sbx_spawn *sp, int step) __attribute__((noreturn));
static void fail(const sbx_spawn *sp, int step)
{
    sbx_report r = {.kind = SBX_REPORT_SETUP_FAILED, .step = step, .err = errno};
    report(sp->report_w, &r);
    _exit(127);
}

#define CHECK(sp, step, expr)                                                                      \
    do {                                                                                           \
        if ((expr) < 0) fail((sp), (step));                                                        \
    } while (0)

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int write_file(const char *path, const char *data, size_t n, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) return -1;
    int rc = write_all(fd, data, n);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

static int close_range_raw(unsigned lo, unsigned hi)
{
    if (lo > hi) return 0;
    if (syscall(SYS_close_range, lo, hi, 0) == 0) return 0;
    if (errno != ENOSYS) return -1;
    /* Before Linux 5.9: close one by one up to the fd limit. */
    struct rlimit r;
    unsigned max =
        getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_max < 1048576 ? (unsigned)r.rlim_max : 1048576;
    for (unsigned fd = lo; fd <= hi && fd < max; fd++) close((int)fd);
    return 0;
}

/* Close every fd >= 3 except those in keep[0..n) (n small; any order). */
static int keep_only(const int *keep, int n)
{
    int k[16];
    if (n > 16) n = 16;
    for (int i = 0; i < n; i++) k[i] = keep[i];
    for (int i = 1; i < n; i++) /* insertion sort */
        for (int j = i; j > 0 && k[j - 1] > k[j]; j--) {
            int t = k[j];
            k[j] = k[j - 1];
            k[j - 1] = t;
        }
    unsigned lo = 3;
    for (int i = 0; i < n; i++) {
        if (k[i] < 3) continue;
        if ((unsigned)k[i] > lo && close_range_raw(lo, (unsigned)k[i] - 1) < 0) return -1;
        lo = (unsigned)k[i] + 1;
    }
    return close_range_raw(lo, ~0U);
}

static void reset_signals(void)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP) sigaction(s, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* ---------------------------------------------------------------- the root --------- */

/* Bind src onto dst read-only. The remount must repeat the flags the source mount has
** locked (atime, noexec; in a user namespace changing them gives EPERM). */
static int bind_ro(const char *src, const char *dst)
{
    if (mount(src, dst, NULL, MS_BIND, NULL) < 0) return -1;
    struct statvfs v;
    if (statvfs(src, &v) < 0) return -1;
    unsigned long keep = 0;
    if (v.f_flag & ST_NOEXEC) keep |= MS_NOEXEC;
    if (v.f_flag & ST_NOATIME) keep |= MS_NOATIME;
    if (v.f_flag & ST_NODIRATIME) keep |= MS_NODIRATIME;
    if (v.f_flag & ST_RELATIME) keep |= MS_RELATIME;
    return mount(NULL, dst, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | keep,
                 NULL);
}

static int bind_dev(const char *name, const char *host)
{
    int fd = open(name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    close(fd);
    return mount(host, name, NULL, MS_BIND, NULL);
}

static void build_dev(const sbx_spawn *sp)
{
    CHECK(sp, SBX_STEP_DEV,
          mount("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, sp->tmpfs_opts[3]));
    static const char *const nodes[][2] = {{"dev/null", "/dev/null"},
                                           {"dev/zero", "/dev/zero"},
                                           {"dev/full", "/dev/full"},
                                           {"dev/random", "/dev/random"},
                                           {"dev/urandom", "/dev/urandom"}};
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++)
        CHECK(sp, SBX_STEP_DEV, bind_dev(nodes[i][0], nodes[i][1]));
    CHECK(sp, SBX_STEP_DEV, symlink("/proc/self/fd", "dev/fd"));
    CHECK(sp, SBX_STEP_DEV, symlink("/proc/self/fd/0", "dev/stdin"));
    CHECK(sp, SBX_STEP_DEV, symlink("/proc/self/fd/1", "dev/stdout"));
    CHECK(sp, SBX_STEP_DEV, symlink("/proc/self/fd/2", "dev/stderr"));
    CHECK(sp, SBX_STEP_DEV, mkdir("dev/shm", 01777));
    CHECK(sp, SBX_STEP_DEV,
          mount("tmpfs", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, sp->tmpfs_opts[2]));
    CHECK(sp, SBX_STEP_DEV,
          mount(NULL, "dev", NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC,
                sp->tmpfs_opts[3]));
}

/* The tmpfs root R (host path slot->root, private to this mount namespace): /usr read-only,
** bin/lib/lib64/sbin as symlinks (Debian is usr-merged), a tiny /etc, /dev, the work dir
** /sandbox and /tmp as size-limited tmpfs, a fresh /proc; then pivot_root into it. */
static void build_root(const sbx_spawn *sp)
{
    CHECK(sp, SBX_STEP_PRIVATE, mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL));
    CHECK(sp, SBX_STEP_ROOT_TMPFS,
          mount("tmpfs", sp->slot->root, "tmpfs", MS_NOSUID | MS_NODEV, sp->tmpfs_opts[0]));
    CHECK(sp, SBX_STEP_ROOT_TMPFS, chdir(sp->slot->root));
    static const char *const dirs[] = {"usr", "etc", "dev", "proc", "sandbox", "tmp"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
        CHECK(sp, SBX_STEP_ROOT_DIRS, mkdir(dirs[i], 0755));
    static const char *const links[][2] = {{"usr/bin", "bin"},
                                           {"usr/lib", "lib"},
                                           {"usr/lib64", "lib64"},
                                           {"usr/sbin", "sbin"}};
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++)
        CHECK(sp, SBX_STEP_ROOT_DIRS, symlink(links[i][0], links[i][1]));
    CHECK(sp, SBX_STEP_BIND_USR, bind_ro("/usr", "usr"));
    CHECK(sp, SBX_STEP_ETC, write_file("etc/passwd", sp->passwd, strlen(sp->passwd), 0644));
    CHECK(sp, SBX_STEP_ETC, write_file("etc/group", sp->group, strlen(sp->group), 0644));
    if (access("/etc/ld.so.cache", R_OK) == 0) { /* else the loader searches the default dirs */
        CHECK(sp, SBX_STEP_ETC, write_file("etc/ld.so.cache", "", 0, 0644));
        CHECK(sp, SBX_STEP_ETC, bind_ro("/etc/ld.so.cache", "etc/ld.so.cache"));
    }
    build_dev(sp);
    CHECK(sp, SBX_STEP_WORK_TMPFS,
          mount("tmpfs", "sandbox", "tmpfs", MS_NOSUID | MS_NODEV, sp->tmpfs_opts[1]));
    CHECK(sp, SBX_STEP_WORK_TMPFS,
          mount("tmpfs", "tmp", "tmpfs", MS_NOSUID | MS_NODEV, sp->tmpfs_opts[2]));
    CHECK(sp, SBX_STEP_PROGRAM, chdir("sandbox"));
    CHECK(sp, SBX_STEP_PROGRAM, write_file(sp->program_name, sp->program, sp->program_len, 0644));
    CHECK(sp, SBX_STEP_PROGRAM, chdir(".."));
    if (sp->layers & PRL_SANDBOX_PROC)
        CHECK(sp, SBX_STEP_PROC,
              mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2"));
    /* Pivot onto the current directory and detach the old root stacked on top of it. */
    CHECK(sp, SBX_STEP_PIVOT, (int)syscall(SYS_pivot_root, ".", "."));
    CHECK(sp, SBX_STEP_PIVOT, umount2(".", MNT_DETACH));
    CHECK(sp, SBX_STEP_PIVOT, chdir("/"));
    CHECK(sp, SBX_STEP_ROOT_RO,
          mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL));
}

int sbx_loopback_up(void)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, "lo", 3);
    ifr.ifr_flags = IFF_UP | IFF_RUNNING;
    int rc = ioctl(s, SIOCSIFFLAGS, &ifr);
    close(s);
    return rc;
}

/* ---------------------------------------------------------------- the program ------ */

static int set_limit(int res, uint64_t v, int cpu)
{
    struct rlimit cur, nl;
    if (getrlimit(res, &cur) < 0) return -1;
    /* Never above the current hard limit (raising it fails; SandboxFusion #70). */
    rlim_t lim = (cur.rlim_max == RLIM_INFINITY || v < cur.rlim_max) ? (rlim_t)v : cur.rlim_max;
    nl.rlim_cur = nl.rlim_max = lim;
    /* CPU: hard = soft + 1, so SIGXCPU comes first and SIGKILL one second later. */
    if (cpu && (cur.rlim_max == RLIM_INFINITY || lim < cur.rlim_max)) nl.rlim_max = lim + 1;
    return setrlimit(res, &nl);
}

static void set_rlimits(const sbx_spawn *sp)
{
    const prl_sandbox_limits *l = &sp->lim;
    uint64_t cpu = (uint64_t)l->cpu_seconds;
    if ((double)cpu < l->cpu_seconds) cpu++;
    CHECK(sp, SBX_STEP_RLIMIT, set_limit(RLIMIT_CPU, cpu, 1));
    CHECK(sp, SBX_STEP_RLIMIT, set_limit(RLIMIT_FSIZE, l->file_size_bytes, 0));
    CHECK(sp, SBX_STEP_RLIMIT, set_limit(RLIMIT_NOFILE, (uint64_t)l->open_files, 0));
    CHECK(sp, SBX_STEP_RLIMIT, set_limit(RLIMIT_CORE, 0, 0));
    CHECK(sp, SBX_STEP_RLIMIT, set_limit(RLIMIT_MEMLOCK, 64 << 10, 0));
    CHECK(sp, SBX_STEP_RLIMIT, set_limit(RLIMIT_MSGQUEUE, 64 << 10, 0));
    CHECK(sp, SBX_STEP_RLIMIT, set_limit(RLIMIT_SIGPENDING, 1024, 0));
    /* Without a memory cgroup the address space is the only memory bound (per process). */
    if (!(sp->layers & PRL_SANDBOX_CGROUP_MEMORY))
        CHECK(sp, SBX_STEP_RLIMIT, set_limit(RLIMIT_AS, l->memory_bytes, 0));
    /* NPROC counts all tasks of the real uid: meaningful only with a uid of our own. */
    if (sp->layers & PRL_SANDBOX_SLOT_UID)
        CHECK(sp, SBX_STEP_RLIMIT, set_limit(RLIMIT_NPROC, (uint64_t)l->processes, 0));
}

/* Drop the bounding and ambient sets while we still may (CAP_SETPCAP). */
static void drop_bounding(const sbx_spawn *sp)
{
    if (!sp->sb->caps.is_root && !(sp->layers & PRL_SANDBOX_USERNS)) return; /* none to drop */
    for (int c = 0; c <= sp->sb->cap_last_cap; c++)
        if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL) fail(sp, SBX_STEP_CAPS);
    CHECK(sp, SBX_STEP_CAPS, prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0));
}

static void switch_ids(const sbx_spawn *sp)
{
    const sbx_slot *s = sp->slot;
    int own_ids = (sp->layers & (PRL_SANDBOX_SLOT_UID | PRL_SANDBOX_USERNS)) != 0;
    if (!own_ids) return; /* not root, no user namespace: we run as ourselves */
    /* setgroups is refused in a user namespace whose setgroups file says "deny" (the
    ** unprivileged case); then the supplementary groups are already our own. */
    /* Raw system calls: glibc's wrappers would try to apply the change to every thread of
    ** the supervisor, which glibc still believes exist here, and wait for them forever. */
    if (sp->sb->caps.is_root) CHECK(sp, SBX_STEP_SETID, (int)syscall(SYS_setgroups, 0, NULL));
    CHECK(sp, SBX_STEP_SETID, (int)syscall(SYS_setresgid, s->prog_gid, s->prog_gid, s->prog_gid));
    CHECK(sp, SBX_STEP_SETID, (int)syscall(SYS_setresuid, s->prog_uid, s->prog_uid, s->prog_uid));
}

/* Empty permitted/effective/inheritable sets. Needed in a user namespace, where going from
** an unmapped uid to the inner uid does not clear them the way leaving uid 0 does. */
static void clear_caps(const sbx_spawn *sp)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct d[2];
    memset(d, 0, sizeof d);
    CHECK(sp, SBX_STEP_CAPS, (int)syscall(SYS_capset, &h, d));
}

static int landlock_rule(int ruleset, const char *path, uint64_t access)
{
    struct landlock_path_beneath_attr a = {.allowed_access = access};
    a.parent_fd = open(path, O_PATH | O_CLOEXEC);
    if (a.parent_fd < 0) return errno == ENOENT ? 0 : -1;
    int rc = (int)syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &a, 0);
    int e = errno;
    close(a.parent_fd);
    errno = e;
    return rc;
}

/* Writes only beneath the work and temp dirs (and to /dev/null & co.); reads stay free.
** ABI >= 4 without a net namespace: no TCP bind/connect, unless the sandbox offers the host's
** network. ABI >= 6: no signals to and no abstract unix sockets of processes outside it. */
static void apply_landlock(const sbx_spawn *sp)
{
    int abi = sp->sb->caps.landlock_abi;
    uint64_t dir_rights = LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_REMOVE_DIR |
                          LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_CHAR |
                          LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
                          LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO |
                          LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SYM;
    uint64_t file_rights = LANDLOCK_ACCESS_FS_WRITE_FILE;
    if (abi >= 2) dir_rights |= LANDLOCK_ACCESS_FS_REFER;
    if (abi >= 3)
        dir_rights |= LANDLOCK_ACCESS_FS_TRUNCATE, file_rights |= LANDLOCK_ACCESS_FS_TRUNCATE;
    struct sbx_landlock_attr attr = {.handled_access_fs = dir_rights};
    size_t size = sizeof attr.handled_access_fs;
    if (abi >= 4) {
        size += sizeof attr.handled_access_net;
        if (!(sp->layers & PRL_SANDBOX_NETNS) && !sp->sb->network)
            attr.handled_access_net = SBX_LANDLOCK_NET_BIND_TCP | SBX_LANDLOCK_NET_CONNECT_TCP;
    }
    if (abi >= 6) {
        size += sizeof attr.scoped;
        attr.scoped = SBX_LANDLOCK_SCOPE_ABSTRACT_UNIX | SBX_LANDLOCK_SCOPE_SIGNAL;
    }
    int rs = (int)syscall(SYS_landlock_create_ruleset, &attr, size, 0);
    CHECK(sp, SBX_STEP_LANDLOCK, rs);
    for (int i = 0; i < 3 && sp->rw_dirs[i]; i++)
        CHECK(sp, SBX_STEP_LANDLOCK, landlock_rule(rs, sp->rw_dirs[i], dir_rights));
    static const char *const files[] = {"/dev/null", "/dev/zero", "/dev/full"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        CHECK(sp, SBX_STEP_LANDLOCK, landlock_rule(rs, files[i], file_rights));
    CHECK(sp, SBX_STEP_LANDLOCK, (int)syscall(SYS_landlock_restrict_self, rs, 0));
    close(rs);
}

static void exec_program(const sbx_spawn *sp) __attribute__((noreturn));
static void exec_program(const sbx_spawn *sp)
{
    CHECK(sp, SBX_STEP_FDS, setsid());
    CHECK(sp, SBX_STEP_FDS, dup2(sp->in_r, 0));
    CHECK(sp, SBX_STEP_FDS, dup2(sp->out_w, 1));
    CHECK(sp, SBX_STEP_FDS, dup2(sp->err_w, 2));
    int keep = sp->report_w;
    CHECK(sp, SBX_STEP_FDS, keep_only(&keep, 1)); /* the program sees exactly 0, 1, 2 */
    CHECK(sp, SBX_STEP_CHDIR, chdir(sp->workdir));
    umask(077);
    if (sp->layers & PRL_SANDBOX_RLIMITS) set_rlimits(sp);
    drop_bounding(sp);
    switch_ids(sp);
    clear_caps(sp);
    if (sp->layers & PRL_SANDBOX_NO_NEW_PRIVS)
        CHECK(sp, SBX_STEP_NNP, prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
    /* After the uid switch, which clears the death signal. */
    CHECK(sp, SBX_STEP_FDS, prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0));
    if (sp->layers & PRL_SANDBOX_LANDLOCK) apply_landlock(sp);
    if (sp->layers & PRL_SANDBOX_SECCOMP) {
        struct sock_fprog prog = {.len = (unsigned short)sp->sb->bpf_len, .filter = sp->sb->bpf};
        CHECK(sp, SBX_STEP_SECCOMP, prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0));
    }
    if (sp->enter) {         /* warm: the zygote's interpreter instead of a fresh one */
        close(sp->report_w); /* what the close-on-exec of execve would do */
        sp->enter(sp);
    }
    execve(sp->argv[0], (char *const *)sp->argv, (char *const *)sp->envp);
    fail(sp, SBX_STEP_EXEC);
}

/* ---------------------------------------------------------------- init ------------- */

static volatile sig_atomic_t sweep_requested;

static void on_sweep_signal(int sig)
{
    (void)sig;
    sweep_requested = 1;
}

/* Without a pid namespace: SIGKILL our children until there are none. Orphans of the
** program re-parent to us (we are a subreaper), so killing direct children repeatedly
** reaches the whole tree; a direct child's pid cannot be reused before we reap it, so no
** kill ever hits a stranger. `children` is our /proc/thread-self/children, opened at the
** start (later the root is gone, and in a user namespace our changed fsuid may not open
** it); pread at offset 0 makes the kernel list the children afresh. */
static void sweep(int children)
{
    for (int round = 0; round < 100000; round++) {
        char buf[4096];
        ssize_t n = children >= 0 ? pread(children, buf, sizeof buf - 1, 0) : -1;
        buf[n > 0 ? n : 0] = 0;
        for (char *p = buf; *p;) {
            long pid = 0;
            while (*p == ' ' || *p == '\n') p++;
            while (*p >= '0' && *p <= '9') pid = pid * 10 + (*p++ - '0');
            if (pid > 0) kill((pid_t)pid, SIGKILL);
            else if (*p) p++;
        }
        /* Reap one (blocking) so the loop follows the tree down; stop when none is left. */
        if (waitpid(-1, NULL, __WALL) < 0 && errno == ECHILD) return;
    }
}

void sbx_child_init(const sbx_spawn *sp)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    int keep[5 + SBX_CG_MAX_FDS] = {sp->sync_r, sp->report_w, sp->in_r, sp->out_w, sp->err_w};
    for (int i = 0; i < sp->n_cg_fds; i++) keep[5 + i] = sp->cg_fds[i];
    if (keep_only(keep, 5 + sp->n_cg_fds) < 0) fail(sp, SBX_STEP_FDS);
    reset_signals();
    char go;
    if (read(sp->sync_r, &go, 1) != 1) _exit(1); /* the supervisor gave up on us */
    close(sp->sync_r);
    int children = -1;
    if (!(sp->layers & PRL_SANDBOX_PIDNS))
        CHECK(sp, SBX_STEP_CHILDREN,
              children = open("/proc/thread-self/children", O_RDONLY | O_CLOEXEC));
    /* Join the slot's v1 groups before anything else, so all that follows is inside. */
    for (int i = 0; i < sp->n_cg_fds; i++) {
        if (write(sp->cg_fds[i], "0", 1) != 1) fail(sp, SBX_STEP_CGROUP);
        close(sp->cg_fds[i]);
    }
    if (sp->layers & PRL_SANDBOX_USERNS) {
        /* Files we create must belong to a uid mapped in this namespace. */
        syscall(SYS_setfsgid, sp->slot->prog_gid);
        syscall(SYS_setfsuid, sp->slot->prog_uid);
        if ((unsigned)syscall(SYS_setfsuid, (uid_t)-1) != sp->slot->prog_uid)
            fail(sp, SBX_STEP_FSID);
    }
    CHECK(sp, SBX_STEP_SUBREAPER, prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0));
    if (sp->layers & PRL_SANDBOX_MNTNS) build_root(sp);
    if (sp->layers & PRL_SANDBOX_NETNS) CHECK(sp, SBX_STEP_LOOPBACK, sbx_loopback_up());
    if (sp->layers & PRL_SANDBOX_UTSNS) CHECK(sp, SBX_STEP_HOSTNAME, sethostname("sandbox", 7));
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sweep_signal;
    sigaction(SIGUSR1, &sa, NULL); /* no SA_RESTART: wait4 returns EINTR */
    pid_t c3 = sbx_clone(0);
    if (c3 < 0) fail(sp, SBX_STEP_FORK);
    if (c3 == 0) exec_program(sp);
    close(sp->in_r);
    close(sp->out_w);
    close(sp->err_w);
    for (;;) {
        int st;
        struct rusage ru;
        pid_t p = wait4(-1, &st, __WALL, &ru);
        if (p == c3) {
            sbx_report r = {.kind = SBX_REPORT_EXITED, .status = st, .maxrss_kb = ru.ru_maxrss};
            report(sp->report_w, &r);
            /* In a pid namespace our exit kills everything left; otherwise we do it. */
            if (!(sp->layers & PRL_SANDBOX_PIDNS)) sweep(children);
            _exit(0);
        }
        if (p < 0 && errno == EINTR && sweep_requested) {
            sweep(children);
            _exit(0);
        }
        if (p < 0 && errno == ECHILD) _exit(0);
    }
}
