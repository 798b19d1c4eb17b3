/*
** internal.h — private declarations shared by the files of sandbox/ (never included
** outside it). Names are sbx_*; the public API is sandbox.h.
**
** Files: sandbox.c (handle, slots, limits, names), probe.c (layer detection), cgroup.c
** (slot cgroups), seccomp.c (the deny list as a BPF program), child.c (the code that runs
** inside the sandbox: init and program), run.c (the supervisor side of a run), hostdir.c
** (host directories: fallback work dirs, safe recursive removal), result.c (JSON), zygote.c
** (the warm path's supervisor side) and zygote_main.c (prl-sandbox-zygote, the warm path's
** pre-started python3).
*/
#ifndef PRL_SANDBOX_INTERNAL_H
#define PRL_SANDBOX_INTERNAL_H

#include "sandbox/sandbox.h"

#include <limits.h>
#include <linux/filter.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/types.h>

/* The reason slot of one layer bit in caps->why. */
#define SBX_WHY(caps, layer) ((caps)->why[__builtin_ctz(layer)])

/* Inside a user namespace the program runs as this uid/gid (mapped to the slot's host ids). */
enum { SBX_INNER_ID = 1000 };

/* ---------------------------------------------------------------- cgroups ---------- */

/* The cgroup directories of one slot ("" when that controller is not used). */
typedef struct sbx_cgroup {
    char memory[PATH_MAX], pids[PATH_MAX], cpu[PATH_MAX], cpuacct[PATH_MAX];
    char freezer[PATH_MAX], unified[PATH_MAX];
    char run[PATH_MAX];    /* v2 with controllers: the per-run group under `unified` */
    int v2;                /* limits live in a v2 group (per-run child of `unified`) */
    int kill_v2;           /* kill with cgroup.kill in `unified` (else freezer) */
    uint64_t memory_limit; /* v1 limit currently written (0 = none yet) */
    int pids_max;          /* v1 pids.max currently written (0 = none yet) */
} sbx_cgroup;

/* Counters read at the start and at the end of a run. */
typedef struct sbx_cg_stats {
    uint64_t oom_kills;    /* memory.oom_control oom_kill / memory.events oom_kill */
    uint64_t pids_refused; /* pids.events max */
    uint64_t cpu_ns;       /* cpuacct.usage / cpu.stat usage_usec*1000 */
    uint64_t mem_usage;    /* usage at the start (v1: peak is reset to it) */
    uint64_t mem_peak;     /* max usage since the start */
    int have_cpu, have_peak;
} sbx_cg_stats;

prl_status sbx_cgroup_create(sbx_cgroup *cg, const prl_sandbox_caps *caps, unsigned layers,
                             const char *group);
/* Set the run's limits, make sure the group is empty (killing leftovers) and read the
** starting counters. */
prl_status sbx_cgroup_prepare(sbx_cgroup *cg, unsigned layers, const prl_sandbox_limits *lim,
                              sbx_cg_stats *start);
/* v1: open the slot's "tasks" files; the sandbox init writes "0" to each to move itself,
** by thread, which needs no global lock (the supervisor writing its pid to cgroup.procs
** waits for an RCU grace period, ~10 ms, about every other run). */
enum { SBX_CG_MAX_FDS = 5 };
prl_status sbx_cgroup_open_tasks(const sbx_cgroup *cg, int fds[SBX_CG_MAX_FDS], int *n);
/* v2 groups (limits or cgroup.kill): the supervisor moves the init by pid. */
prl_status sbx_cgroup_attach(const sbx_cgroup *cg, pid_t pid);
/* Kill every task in the slot's groups and wait (bounded) until they are empty. Returns the
** number of tasks that were found alive, or -1 if the groups could not be emptied. */
int sbx_cgroup_kill(const sbx_cgroup *cg);
/* v1 freezer only: kill every task but `spare` (the sandbox init, which without a pid
** namespace must outlive the others to reap them: their orphans would go to the host's
** init). -1 when there is no freezer group. */
int sbx_cgroup_kill_but(const sbx_cgroup *cg, pid_t spare);
int sbx_cgroup_empty(const sbx_cgroup *cg);
void sbx_cgroup_stats(const sbx_cgroup *cg, unsigned layers, sbx_cg_stats *end);
/* End of a run: v2 removes the per-run group. */
void sbx_cgroup_finish(sbx_cgroup *cg);
void sbx_cgroup_remove(sbx_cgroup *cg);
/* Remove groups of earlier prl processes that died without cleaning up. */
void sbx_cgroup_sweep_stale(const prl_sandbox_caps *caps);
/* Find the parent directories for each controller (used by the probe). */
void sbx_cgroup_detect(prl_sandbox_caps *caps);

/* ---------------------------------------------------------------- seccomp ---------- */

/* Build the deny-list filter as a BPF program; *prog is malloc'd. Socket families: AF_UNIX,
** AF_INET, AF_INET6 (for a net namespace), or with socket_filter AF_UNIX only. */
prl_status sbx_seccomp_build(int socket_filter, struct sock_filter **prog, size_t *n);
/* The filter's part of prl_sandbox_policy_get: seccomp, families, refused, conditional. */
void sbx_seccomp_policy(unsigned layers, prl_sandbox_policy *p);

/* ---------------------------------------------------------------- host dirs -------- */

/* Remove everything beneath the directory `dirfd` without following symlinks (the
** directory itself stays), entering only subdirectories owned by `owner` on the same file
** system. Returns 0 or -errno of the first failure. */
int sbx_remove_tree_at(int dirfd, uid_t owner);
/* mkdir -p with mode for the last component. */
prl_status sbx_mkdirs(const char *path, mode_t mode);

/* ---------------------------------------------------------------- the handle ------- */

typedef struct sbx_slot {
    int index;
    unsigned host_uid, host_gid; /* ids outside (slot uid, or our own when not root) */
    unsigned prog_uid, prog_gid; /* ids the program has in its own view */
    atomic_int busy;
    pid_t zygote_pid;    /* warm: the slot's pre-started interpreter (0: not running) */
    int zygote_sock;     /* warm: its control socket (-1: none) */
    char root[PATH_MAX]; /* host mount point of the tmpfs root (mount namespace) */
    char work[PATH_MAX], tmp[PATH_MAX]; /* fallback work and temp dirs (no mount namespace) */
    sbx_cgroup cg;
} sbx_slot;

struct prl_sandbox {
    prl_sandbox_caps caps;
    unsigned layers; /* used in every run */
    int n_slots;
    sbx_slot *slots;
    char base_dir[PATH_MAX];
    int own_base_dir; /* created by init, removed by free */
    char python3[PATH_MAX], sh[PATH_MAX];
    char interpreter[PATH_MAX]; /* "" when the sandbox has none */
    int network;                /* options.network: the host's network is offered */
    struct sock_filter *bpf;    /* seccomp program (malloc'd) */
    size_t bpf_len;
    int cap_last_cap;
    unsigned uid_base;
    char cg_group[64];     /* "prl-sandbox.<pid>.<n>" */
    int warm;              /* options.warm: python3 programs start from the slot's zygote */
    char zygote[PATH_MAX]; /* the zygote executable (warm) */
};

/* ---------------------------------------------------------------- the child -------- */

/* Records the sandbox sends to the supervisor on the report pipe. */
enum { SBX_REPORT_SETUP_FAILED = 1, SBX_REPORT_EXITED = 2 };
typedef struct sbx_report {
    int32_t kind;
    int32_t step;      /* SETUP_FAILED: the sbx_step that failed */
    int32_t err;       /* SETUP_FAILED: errno */
    int32_t status;    /* EXITED: wait status of the program */
    int64_t maxrss_kb; /* EXITED: the program's largest RSS */
} sbx_report;

/* Setup steps, named in sandbox_error messages. */
typedef enum sbx_step {
    SBX_STEP_SYNC = 1,
    SBX_STEP_FSID,
    SBX_STEP_PRIVATE,
    SBX_STEP_ROOT_TMPFS,
    SBX_STEP_ROOT_DIRS,
    SBX_STEP_BIND_USR,
    SBX_STEP_ETC,
    SBX_STEP_DEV,
    SBX_STEP_WORK_TMPFS,
    SBX_STEP_PROGRAM,
    SBX_STEP_PROC,
    SBX_STEP_PIVOT,
    SBX_STEP_ROOT_RO,
    SBX_STEP_LOOPBACK,
    SBX_STEP_HOSTNAME,
    SBX_STEP_FORK,
    SBX_STEP_FDS,
    SBX_STEP_CHDIR,
    SBX_STEP_RLIMIT,
    SBX_STEP_CAPS,
    SBX_STEP_SETID,
    SBX_STEP_NNP,
    SBX_STEP_LANDLOCK,
    SBX_STEP_SECCOMP,
    SBX_STEP_EXEC,
    SBX_STEP_SUBREAPER,
    SBX_STEP_CGROUP,
    SBX_STEP_CHILDREN
} sbx_step;
const char *sbx_step_name(int step);

/* Everything the sandbox's processes need, prepared by the supervisor before the clone so
** that the child never allocates (it is forked from a multithreaded process). */
typedef struct sbx_spawn sbx_spawn;
struct sbx_spawn {
    const prl_sandbox *sb;
    const sbx_slot *slot;
    unsigned layers;
    prl_sandbox_limits lim;
    int sync_r, report_w, in_r, out_w, err_w; /* the child's pipe ends */
    int cg_fds[SBX_CG_MAX_FDS], n_cg_fds;     /* v1 "tasks" files the init joins */
    const char *program;
    size_t program_len;
    const char *program_name; /* "main.py" / "main.sh" */
    const char *argv[8];
    const char *envp[12];
    char env_buf[4][PATH_MAX + 16]; /* storage for HOME=, TMPDIR=, ... */
    char tmpfs_opts[4][128];        /* mount options: root, work, tmp and /dev/shm, /dev */
    const char *rw_dirs[4];         /* Landlock: dirs the program may write beneath (NULL-ended) */
    char passwd[256], group[128];   /* /etc/passwd and /etc/group of the sandbox */
    const char *workdir;            /* the program's cwd */
    /* Warm runs (zygote_main.c): instead of execve the program continues in the zygote's
    ** pre-started interpreter, with the zygote's signal dispositions (NSIG entries). */
    void (*enter)(const sbx_spawn *sp);
    const struct sigaction *signals;
};

/* Fill *sp for a run of req in slot s (run.c); prog_path receives the program's path. */
void sbx_build_spawn(const prl_sandbox *sb, const sbx_slot *s, const prl_sandbox_request *req,
                     const prl_sandbox_limits *lim, sbx_spawn *sp, char *prog_path, size_t prog_n);

/* The sandbox init (pid 1 of the pid namespace when there is one). Never returns. */
void sbx_child_init(const sbx_spawn *sp) __attribute__((noreturn));

/* Bring up "lo" in the current net namespace (SIOCSIFFLAGS); 0 or -1 with errno. */
int sbx_loopback_up(void);

/* Raw fork-like clone with namespace flags (no glibc fork handlers: the child only makes
** system calls). Returns the pid, 0 in the child, -1 on error. */
pid_t sbx_clone(unsigned long flags);

/* ---------------------------------------------------------------- the warm path ---- */

/* zygote.c, the supervisor side of a slot's zygote (zygote_main.c): a python3 interpreter
** started once per slot, outside the sandbox, that clones a fresh sandbox init per run. */
typedef struct sbx_zyg_hello {
    uint32_t magic, size; /* SBX_ZYG_MAGIC, sizeof(sbx_zyg_hello) */
    prl_sandbox sb;       /* copied; pointers are fixed up by the zygote */
    sbx_slot slot;
    uint64_t bpf_len; /* then bpf_len struct sock_filter */
} sbx_zyg_hello;
typedef struct sbx_zyg_run {
    uint32_t magic, n_fds; /* fds (SCM_RIGHTS): sync_r, report_w, in_r, out_w, err_w, cg... */
    uint64_t clone_flags;
    prl_sandbox_limits lim;
    uint64_t program_len; /* then the program's bytes */
} sbx_zyg_run;
typedef struct sbx_zyg_reply {
    int32_t pid; /* the sandbox init's pid (a child of the supervisor), or -errno */
    char msg[256];
} sbx_zyg_reply;
enum { SBX_ZYG_MAGIC = 0x7a79676f, SBX_ZYG_FD = 3 };

/* Start the slot's zygote if it is not running (the calling thread becomes the parent of
** every sandbox init it clones: it must outlive the runs, as their death signal follows it). */
prl_status sbx_zygote_start(const prl_sandbox *sb, sbx_slot *s);
/* Have the zygote clone the sandbox init of sp with `flags`; returns its pid, or -1 with the
** error set. */
pid_t sbx_zygote_spawn(const prl_sandbox *sb, sbx_slot *s, const sbx_spawn *sp,
                       unsigned long flags);
void sbx_zygote_stop(sbx_slot *s);

/* Read exactly n bytes from fd (retrying EINTR): 0, or -1 on an error or an early end. Shared
** by the zygote's two sides (zygote.c, zygote_main.c). */
int sandbox__read_all(int fd, void *p, size_t n);

#endif /* PRL_SANDBOX_INTERNAL_H */
