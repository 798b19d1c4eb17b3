/*
** sandbox.h — the one public header of sandbox/: run untrusted programs (python3, sh) in
** isolation, with limits, and report what happened as a structured result.
**
** What it is for: the reward workers run model-written programs to score them. A run takes
** a program text and stdin, runs it under CPU/wall/memory/output/process/file limits in a
** throwaway environment, kills the whole process tree at the end, and returns a status, the
** exit code or signal, capped stdout/stderr, CPU and wall time, peak memory and the isolation
** layers that were really active. The verdict (comparing outputs) is the caller's business,
** outside the sandbox.
**
** How it isolates (docs/sandbox.md has the details): every layer is detected once at start-up
** (prl_sandbox_probe) and used when present — user, pid, net, mount, ipc and uts namespaces;
** a fresh /proc; a tmpfs root with read-only binds of /usr and private size-limited tmpfs work
** and temp dirs; Landlock write rules; a seccomp deny list; no_new_privs; rlimits; cgroup v1
** memory/pids/cpu (or v2 where it has controllers) and a cgroup kill; a distinct uid per slot.
** When a layer is missing the fallbacks of shared/spec/sandbox.md §3.13 take over, and the
** result says which layers were active. A layer that is configured but fails to set up makes
** the run a sandbox_error; it is never silently skipped.
**
** Slots: a sandbox has N slots. Runs in different slots may proceed concurrently from
** different threads (each slot has its own uid, cgroups, work dirs and namespaces); one slot
** runs one program at a time (a second concurrent call on the same slot is refused).
**
** Error model and ownership: functions return a prl_status (engine/engine.h) and set
** prl_error_message(). The caller owns every struct it passes in; pointers inside a request
** are borrowed for the duration of the call. A result owns its heap buffers (stdout,
** stderr) until prl_sandbox_result_free. prl_sandbox_init allocates the handle, which
** prl_sandbox_free releases (NULL is accepted).
**
** The same runs offered over the bus, the sandbox service and its client, are a process of
** the pipeline: roles/sandbox_service.c and roles/sandbox_client.c (roles/roles.h).
*/
#ifndef PRL_SANDBOX_H
#define PRL_SANDBOX_H

#include "engine/engine.h"

#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- layers ----------- */

/* Isolation layers. A probe reports the ones that work on this host; a result reports the
** ones that were active in that run. */
typedef enum prl_sandbox_layer {
    PRL_SANDBOX_USERNS = 1u << 0,  /* user namespace; the program's uid maps to the slot uid */
    PRL_SANDBOX_PIDNS = 1u << 1,   /* pid namespace; its init's death kills the whole tree */
    PRL_SANDBOX_NETNS = 1u << 2,   /* net namespace with a private loopback only */
    PRL_SANDBOX_MNTNS = 1u << 3,   /* mount namespace: tmpfs root, read-only binds, pivot_root */
    PRL_SANDBOX_IPCNS = 1u << 4,   /* ipc namespace */
    PRL_SANDBOX_UTSNS = 1u << 5,   /* uts namespace (hostname "sandbox") */
    PRL_SANDBOX_PROC = 1u << 6,    /* a fresh /proc of the pid namespace (hidepid=2) */
    PRL_SANDBOX_TMPFS = 1u << 7,   /* private size-limited tmpfs work dir and temp dir */
    PRL_SANDBOX_SECCOMP = 1u << 8, /* seccomp deny list; other syscall ABIs are killed */
    PRL_SANDBOX_SOCKET_FILTER = 1u << 9, /* no netns: seccomp allows AF_UNIX sockets only */
    PRL_SANDBOX_NO_NEW_PRIVS = 1u << 10, /* PR_SET_NO_NEW_PRIVS, capabilities dropped */
    PRL_SANDBOX_RLIMITS = 1u << 11,      /* CPU, file size, open files, core, (AS, NPROC) rlimits */
    PRL_SANDBOX_LANDLOCK = 1u << 12,     /* writes allowed only beneath the work and temp dirs */
    PRL_SANDBOX_CGROUP_MEMORY = 1u << 13, /* memory limit on the whole tree, OOM kill detected */
    PRL_SANDBOX_CGROUP_PIDS = 1u << 14,   /* task limit on the whole tree */
    PRL_SANDBOX_CGROUP_CPU = 1u << 15,  /* one CPU of quota per slot, CPU time of the whole tree */
    PRL_SANDBOX_CGROUP_KILL = 1u << 16, /* kill the slot's cgroup (v2 cgroup.kill or v1 freezer) */
    PRL_SANDBOX_SLOT_UID = 1u << 17     /* a distinct, non-root uid per slot */
} prl_sandbox_layer;

enum { PRL_SANDBOX_N_LAYERS = 18 };
#define PRL_SANDBOX_ALL_LAYERS ((1u << PRL_SANDBOX_N_LAYERS) - 1u)

/* Short name of one layer bit ("netns", "cgroup_memory"); "?" for anything else. */
const char *prl_sandbox_layer_name(unsigned layer);

/* What this host supports. Filled by prl_sandbox_probe; plain data, copyable. */
typedef struct prl_sandbox_caps {
    unsigned layers;           /* PRL_SANDBOX_* bits that work here */
    int is_root;               /* effective uid 0 with CAP_SYS_ADMIN */
    int landlock_abi;          /* 0 = no Landlock */
    int cgroup_version;        /* 1: v1 controllers, 2: v2 controllers, 0: none usable */
    char cgroup_kill_kind[16]; /* "cgroup.kill", "freezer" or "" */
    /* Parent cgroup directories the slot groups are created under ("" = not usable). */
    char cg_memory[256], cg_pids[256], cg_cpu[256], cg_cpuacct[256], cg_freezer[256];
    char cg_unified[256];  /* v2 parent (limits when cgroup_version == 2, else kill only) */
    char cgroup_note[320]; /* why v2 controllers are not used, when there is a v2 tree */
    char why[PRL_SANDBOX_N_LAYERS][160]; /* why a layer is missing ("" when present) */
} prl_sandbox_caps;

/* Detect the layers that work on this host, each in a throwaway child process. Slow-ish
** (tens of ms): call once at start-up and pass the result to prl_sandbox_init. Never fails
** as a whole; a missing layer is recorded with its reason in caps->why. */
prl_status prl_sandbox_probe(prl_sandbox_caps *caps);

/* ---------------------------------------------------------------- limits ----------- */

typedef struct prl_sandbox_limits {
    double cpu_seconds;       /* RLIMIT_CPU of each process (rounded up): SIGXCPU → timeout */
    double wall_seconds;      /* wall-clock limit of the run: the tree is killed → timeout */
    uint64_t memory_bytes;    /* memory of the whole tree (cgroup), else RLIMIT_AS per process */
    uint64_t output_bytes;    /* bytes kept per stream (stdout, stderr); the rest is counted */
    int output_kill;          /* 1: kill the tree when a stream passes the cap → output_limit */
    int processes;            /* tasks (processes + threads) of the program's tree */
    int open_files;           /* RLIMIT_NOFILE */
    uint64_t file_size_bytes; /* RLIMIT_FSIZE: largest file the program may write */
    uint64_t disk_bytes;      /* size of the tmpfs work dir and of the tmpfs temp dir (each) */
} prl_sandbox_limits;

/* Defaults: cpu 11 s, wall 10 s, memory 1 GiB, output 1 MiB per stream (truncate, keep
** draining), 64 processes, 64 open files, file size 16 MiB, disk 64 MiB. */
void prl_sandbox_limits_default(prl_sandbox_limits *lim);
/* Check a limits struct: PRL_ERR_ARG naming the first bad field, or PRL_OK. Values above
** the maxima (docs/sandbox.md) are clamped down in place, not refused. */
prl_status prl_sandbox_limits_check(prl_sandbox_limits *lim);

/* ---------------------------------------------------------------- policy ----------- */

/* What a sandbox using `layers` (prl_sandbox_layers) enforces, for reports (prl sandbox
** probe): plain data, its pointers into static tables. */
typedef struct prl_sandbox_policy {
    const char *mode;            /* "namespaces" (pid, net and mount) or "fallback" */
    char namespaces_missing[64]; /* "net mount": the namespaces a fallback lacks ("" if none) */
    int seccomp;                 /* 0: no seccomp layer, the lists below are not enforced */
    const char *families[4];     /* socket families a program may create ("AF_UNIX", ...); */
    int n_families;              /*   every other one is refused with EPERM */
    const char *const *refused;  /* system calls refused outright (EPERM) */
    size_t n_refused;
    const char *const (*conditional)[2]; /* {calls, when}: refused with some arguments only */
    size_t n_conditional;
    prl_sandbox_limits defaults; /* prl_sandbox_limits_default */
    prl_sandbox_limits maxima;   /* requests above are clamped; file_size_bytes 0: no maximum */
} prl_sandbox_policy;

void prl_sandbox_policy_get(unsigned layers, prl_sandbox_policy *p);

/* ---------------------------------------------------------------- sandbox ---------- */

typedef struct prl_sandbox prl_sandbox; /* opaque handle */

/* Options of prl_sandbox_init; every string and the caps are copied, so they need to live
** only for the duration of the init call. */
typedef struct prl_sandbox_options {
    int slots;                    /* concurrent slots, 1..256 (default 1) */
    const char *base_dir;         /* host dir for per-slot mount points and fallback work dirs,
                                searchable by others (0711); NULL: a fresh mkdtemp dir under
                                /tmp, removed by free */
    const prl_sandbox_caps *caps; /* probed layers (copied); NULL: probe now */
    unsigned disable;             /* layers not to use even when available (tests, debugging) */
    unsigned uid_base;            /* slot s runs as uid/gid uid_base + s (default 10000); distinct
                                sandboxes on one host need disjoint uid ranges */
    const char *python3;          /* interpreter, must live under /usr (default /usr/bin/python3) */
    const char *sh;               /* shell (default /bin/sh) */
    const char *interpreter;      /* lang "interpreter": another language's interpreter (e.g.
                                     /usr/bin/node), an absolute path under /usr (NULL: none) */
    int network; /* 1: the program may use the host's network: no net namespace, AF_INET and
                    AF_INET6 sockets allowed, no Landlock TCP rules (every other family stays
                    refused); 0: none (a private loopback, or no inet sockets at all) */
    int warm;    /* 1: python3 programs start from a pre-started interpreter per slot (a zygote:
                 python initialised once, site imports done, outside the sandbox) that clones
                 each run's sandbox init, every layer applied as in a cold run; 0: each run
                 execs python3 (the reference). The thread calling prl_sandbox_init, or the
                 one whose run restarts a dead zygote, must outlive the sandbox's runs. */
    const char *zygote; /* warm: the zygote executable (NULL: the installed or built one) */
} prl_sandbox_options;

void prl_sandbox_options_default(prl_sandbox_options *opt);

/* Create a sandbox with opt->slots slots: per-slot directories, cgroups and the seccomp
** program. *sb is NULL on failure. Not thread-safe against itself; create once. */
/* PRL_OK when warm runs can start here (prl-sandbox-zygote is built or installed); else an
** error naming what is missing — for `prl run --check` of `sandbox.warm`. */
prl_status prl_sandbox_warm_check(void);

prl_status prl_sandbox_init(prl_sandbox **sb, const prl_sandbox_options *opt);
/* Remove the slot cgroups and directories and free the handle. No run may be in progress. */
void prl_sandbox_free(prl_sandbox *sb);
/* The layers this sandbox uses in every run (caps minus disabled, with dependencies). */
unsigned prl_sandbox_layers(const prl_sandbox *sb);
int prl_sandbox_slots(const prl_sandbox *sb);
/* The host uid slot `slot` runs as (the outside uid when a user namespace is used). */
unsigned prl_sandbox_slot_uid(const prl_sandbox *sb, int slot);

/* ---------------------------------------------------------------- runs ------------- */

typedef struct prl_sandbox_request {
    const char *lang;    /* "python3", "sh", or "interpreter" (options.interpreter) */
    const char *program; /* program text (borrowed; no NUL bytes), program_len bytes */
    size_t program_len;
    const char *stdin_data; /* bytes fed to the program's stdin, then EOF (NULL: empty) */
    size_t stdin_len;
    prl_sandbox_limits limits;
    /* An interactive run (a long-lived program the caller talks to, as a reward program):
    ** with own_stdio the program's stdin and stdout are the caller's pipe ends stdin_fd and
    ** stdout_fd (duplicated; the caller keeps and closes its own) instead of stdin_data and
    ** the captured stdout, and the call returns when the program ends. `cancel`, when another
    ** thread sets *cancel non-zero, kills the run within 0.1 s (status timeout). */
    int own_stdio;
    int stdin_fd, stdout_fd;
    const int *cancel; /* read atomically; NULL: none */
} prl_sandbox_request;

typedef enum prl_sandbox_status {
    PRL_SANDBOX_STATUS_OK = 0,        /* exited with code 0 */
    PRL_SANDBOX_STATUS_RUNTIME_ERROR, /* non-zero exit, or killed by a signal of its own making */
    PRL_SANDBOX_STATUS_TIMEOUT,       /* wall limit reached (tree killed) or SIGXCPU */
    PRL_SANDBOX_STATUS_MEMORY_LIMIT,  /* the cgroup OOM killer fired in the run's tree */
    PRL_SANDBOX_STATUS_OUTPUT_LIMIT,  /* SIGXFSZ, or the output cap with output_kill */
    PRL_SANDBOX_STATUS_KILLED,        /* killed for a forbidden syscall or ABI (SIGSYS) */
    PRL_SANDBOX_STATUS_SANDBOX_ERROR  /* bad request or infrastructure failure: do not score */
} prl_sandbox_status;

/* "ok", "runtime_error", "timeout", "memory_limit", "output_limit", "killed",
** "sandbox_error". */
const char *prl_sandbox_status_name(prl_sandbox_status status);

typedef struct prl_sandbox_result {
    prl_sandbox_status status;
    char reason[512];              /* one line saying why (the error message for sandbox_error) */
    int exit_code;                 /* exit code, or 128 + signal when killed; -1 if never started */
    int signal;                    /* terminating signal of the program, 0 if it exited */
    char *out, *err;               /* captured stdout/stderr, NUL-terminated, owned by the result */
    size_t out_len, err_len;       /* bytes kept (<= limits.output_bytes) */
    uint64_t out_total, err_total; /* bytes the program wrote to each stream */
    int out_truncated, err_truncated;
    double wall_seconds;         /* from the start of the sandbox to the program's end */
    double cpu_seconds;          /* user + system time of the whole tree */
    uint64_t peak_memory_bytes;  /* cgroup peak above the run's start, else largest RSS */
    int peak_memory_from_cgroup; /* 1: cgroup peak (whole tree), 0: largest process RSS */
    unsigned layers;             /* PRL_SANDBOX_* layers active in this run */
    int cgroup_version;          /* 1 or 2 when cgroup limits were active, else 0 */
    int slot;
    unsigned uid;              /* host uid the program ran as */
    int warm;                  /* 1: started from the slot's zygote (options.warm) */
    prl_sandbox_limits limits; /* the effective (checked, clamped) limits */
} prl_sandbox_result;

/* Run one program in `slot` and fill *res (which the caller then frees with
** prl_sandbox_result_free). Safe to call concurrently from several threads with different
** slots. Returns PRL_OK when the program ran (whatever its status); on a bad request or an
** infrastructure failure returns a negative prl_status and also fills *res with status
** sandbox_error and the message in res->reason. The next run of the slot starts clean
** either way. */
prl_status prl_sandbox_run(prl_sandbox *sb, int slot, const prl_sandbox_request *req,
                           prl_sandbox_result *res);
/* Free the result's buffers and zero it. Accepts a zeroed result. */
void prl_sandbox_result_free(prl_sandbox_result *res);

/* The result as a JSON text (docs/sandbox.md "Result JSON"); malloc'd, the caller frees it.
** NULL on allocation failure. `indent` 0 gives one line. */
char *prl_sandbox_result_to_json(const prl_sandbox_result *res, int indent);
/* The probe as JSON: available and used layers, why each missing one is missing, cgroup
** version and kill mechanism, Landlock ABI, and the policy of `used` (caller frees). `used`
** is prl_sandbox_layers() of a sandbox, or the available layers. */
char *prl_sandbox_caps_to_json(const prl_sandbox_caps *caps, unsigned used, int indent);

#endif /* PRL_SANDBOX_H */
