/*
** sandbox.c — the sandbox handle: options, limits, slots (uids, directories, cgroups), the
** seccomp program, and the names of layers and statuses.
**
** Which layers a sandbox uses is decided once here, from the probe minus what the caller
** disabled, closed under the dependencies between layers (a fresh /proc needs pid and mount
** namespaces, seccomp and Landlock need no_new_privs, ...). Every run then uses exactly that
** set or fails with sandbox_error: a layer is never dropped silently per run.
**
** Warm sandboxes (options.warm) also start one zygote per slot here (zygote.c) and stop
** them in prl_sandbox_free.
*/
#include "sandbox/internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- names ------------ */

static const char *const layer_names[PRL_SANDBOX_N_LAYERS] = {
    "userns",   "pidns",         "netns",       "mntns",         "ipcns",        "utsns",
    "proc",     "tmpfs",         "seccomp",     "socket_filter", "no_new_privs", "rlimits",
    "landlock", "cgroup_memory", "cgroup_pids", "cgroup_cpu",    "cgroup_kill",  "slot_uid",
};

const char *prl_sandbox_layer_name(unsigned layer)
{
    for (int i = 0; i < PRL_SANDBOX_N_LAYERS; i++)
        if (layer == 1u << i) return layer_names[i];
    return "?";
}

const char *prl_sandbox_status_name(prl_sandbox_status status)
{
    switch (status) {
    case PRL_SANDBOX_STATUS_OK: return "ok";
    case PRL_SANDBOX_STATUS_RUNTIME_ERROR: return "runtime_error";
    case PRL_SANDBOX_STATUS_TIMEOUT: return "timeout";
    case PRL_SANDBOX_STATUS_MEMORY_LIMIT: return "memory_limit";
    case PRL_SANDBOX_STATUS_OUTPUT_LIMIT: return "output_limit";
    case PRL_SANDBOX_STATUS_KILLED: return "killed";
    case PRL_SANDBOX_STATUS_SANDBOX_ERROR: return "sandbox_error";
    }
    return "sandbox_error";
}

/* ---------------------------------------------------------------- limits ----------- */

#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)

void prl_sandbox_limits_default(prl_sandbox_limits *lim)
{
    *lim = (prl_sandbox_limits){
        .cpu_seconds = 11,
        .wall_seconds = 10,
        .memory_bytes = GIB,
        .output_bytes = MIB,
        .output_kill = 0,
        .processes = 64,
        .open_files = 64,
        .file_size_bytes = 16 * MIB,
        .disk_bytes = 64 * MIB,
    };
}

/* Maxima: a request above them is clamped (the result shows the effective limits). */
static const double max_seconds = 3600;
static const uint64_t max_memory = 64 * GIB, max_output = 256 * MIB, max_disk = 16 * GIB;
static const int max_processes = 4096, max_files = 65536;

prl_status prl_sandbox_limits_check(prl_sandbox_limits *l)
{
    if (!(l->cpu_seconds > 0) || isinf(l->cpu_seconds))
        return prl_error_set(PRL_ERR_ARG, "limit cpu_seconds must be a positive number, got %g",
                             l->cpu_seconds);
    if (!(l->wall_seconds >= 0.001) || isinf(l->wall_seconds))
        return prl_error_set(PRL_ERR_ARG, "limit wall_seconds must be >= 0.001, got %g",
                             l->wall_seconds);
    if (l->memory_bytes < 16 * MIB)
        return prl_error_set(PRL_ERR_ARG, "limit memory_bytes must be >= 16 MiB, got %llu",
                             (unsigned long long)l->memory_bytes);
    if (l->processes < 1)
        return prl_error_set(PRL_ERR_ARG, "limit processes must be >= 1, got %d", l->processes);
    if (l->open_files < 8)
        return prl_error_set(PRL_ERR_ARG, "limit open_files must be >= 8, got %d", l->open_files);
    if (l->disk_bytes < MIB)
        return prl_error_set(PRL_ERR_ARG, "limit disk_bytes must be >= 1 MiB, got %llu",
                             (unsigned long long)l->disk_bytes);
    if (l->output_kill != 0 && l->output_kill != 1)
        return prl_error_set(PRL_ERR_ARG, "limit output_kill must be 0 or 1, got %d",
                             l->output_kill);
    if (l->cpu_seconds > max_seconds) l->cpu_seconds = max_seconds;
    if (l->wall_seconds > max_seconds) l->wall_seconds = max_seconds;
    if (l->memory_bytes > max_memory) l->memory_bytes = max_memory;
    if (l->output_bytes > max_output) l->output_bytes = max_output;
    if (l->processes > max_processes) l->processes = max_processes;
    if (l->open_files > max_files) l->open_files = max_files;
    if (l->disk_bytes > max_disk) l->disk_bytes = max_disk;
    return PRL_OK;
}

/* ---------------------------------------------------------------- policy ----------- */

void prl_sandbox_policy_get(unsigned layers, prl_sandbox_policy *p)
{
    memset(p, 0, sizeof *p);
    static const struct {
        unsigned layer;
        const char *name;
    } ns[] = {{PRL_SANDBOX_USERNS, "user"}, {PRL_SANDBOX_PIDNS, "pid"}, {PRL_SANDBOX_NETNS, "net"},
              {PRL_SANDBOX_MNTNS, "mount"}, {PRL_SANDBOX_IPCNS, "ipc"}, {PRL_SANDBOX_UTSNS, "uts"}};
    size_t used = 0;
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        if (!(layers & ns[i].layer))
            used +=
                (size_t)snprintf(p->namespaces_missing + used, sizeof p->namespaces_missing - used,
                                 "%s%s", used ? " " : "", ns[i].name);
    unsigned core = PRL_SANDBOX_PIDNS | PRL_SANDBOX_NETNS | PRL_SANDBOX_MNTNS;
    p->mode = (layers & core) == core ? "namespaces" : "fallback";
    sbx_seccomp_policy(layers, p);
    prl_sandbox_limits_default(&p->defaults);
    p->maxima = (prl_sandbox_limits){.cpu_seconds = max_seconds,
                                     .wall_seconds = max_seconds,
                                     .memory_bytes = max_memory,
                                     .output_bytes = max_output,
                                     .output_kill = 1,
                                     .processes = max_processes,
                                     .open_files = max_files,
                                     .file_size_bytes = 0,
                                     .disk_bytes = max_disk};
}

/* ---------------------------------------------------------------- options ---------- */

void prl_sandbox_options_default(prl_sandbox_options *opt)
{
    *opt = (prl_sandbox_options){.slots = 1,
                                 .uid_base = 10000,
                                 .python3 = "/usr/bin/python3",
                                 .sh = "/bin/sh"};
}

/* Close the layer set under its dependencies: drop what cannot work without another layer,
** add what comes with one. */
static unsigned resolve_layers(unsigned l, const prl_sandbox_caps *caps)
{
    if (!(l & PRL_SANDBOX_TMPFS)) l &= ~PRL_SANDBOX_MNTNS; /* the tmpfs root is the mount ns */
    if (!(l & PRL_SANDBOX_MNTNS)) l &= ~PRL_SANDBOX_TMPFS;
    if (!(l & PRL_SANDBOX_PIDNS) || !(l & PRL_SANDBOX_MNTNS)) l &= ~PRL_SANDBOX_PROC;
    if (!(l & PRL_SANDBOX_NO_NEW_PRIVS)) l &= ~(PRL_SANDBOX_SECCOMP | PRL_SANDBOX_LANDLOCK);
    if (!(l & PRL_SANDBOX_SECCOMP) || (l & PRL_SANDBOX_NETNS)) l &= ~PRL_SANDBOX_SOCKET_FILTER;
    /* Without root every namespace hangs off the user namespace. */
    if (!caps->is_root && !(l & PRL_SANDBOX_USERNS))
        l &= ~(PRL_SANDBOX_PIDNS | PRL_SANDBOX_NETNS | PRL_SANDBOX_MNTNS | PRL_SANDBOX_IPCNS |
               PRL_SANDBOX_UTSNS | PRL_SANDBOX_PROC | PRL_SANDBOX_TMPFS);
    return l;
}

/* ---------------------------------------------------------------- slots ------------ */

static prl_status slot_init(prl_sandbox *sb, sbx_slot *s, int index)
{
    s->index = index;
    atomic_init(&s->busy, 0);
    s->zygote_sock = -1;
    if (sb->layers & PRL_SANDBOX_SLOT_UID) {
        s->host_uid = s->host_gid = sb->uid_base + (unsigned)index;
    } else {
        s->host_uid = (unsigned)geteuid();
        s->host_gid = (unsigned)getegid();
    }
    int userns = (sb->layers & PRL_SANDBOX_USERNS) != 0;
    s->prog_uid = userns ? SBX_INNER_ID : s->host_uid;
    s->prog_gid = userns ? SBX_INNER_ID : s->host_gid;
    if (snprintf(s->root, sizeof s->root, "%s/slot%d", sb->base_dir, index) >=
            (int)sizeof s->root ||
        snprintf(s->work, sizeof s->work, "%s/slot%d.work", sb->base_dir, index) >=
            (int)sizeof s->work ||
        snprintf(s->tmp, sizeof s->tmp, "%s/slot%d.tmp", sb->base_dir, index) >= (int)sizeof s->tmp)
        return prl_error_set(PRL_ERR_ARG, "sandbox: base_dir is too long: %s", sb->base_dir);
    if (mkdir(s->root, 0755) != 0 && errno != EEXIST)
        return prl_error_set(PRL_ERR_IO, "sandbox: mkdir %s: %s", s->root, strerror(errno));
    char group[96];
    snprintf(group, sizeof group, "%s/slot%d", sb->cg_group, index);
    return sbx_cgroup_create(&s->cg, &sb->caps, sb->layers, group);
}

static prl_status make_base_dir(prl_sandbox *sb, const char *base_dir)
{
    if (base_dir) {
        if (strlen(base_dir) + 32 >= sizeof sb->base_dir)
            return prl_error_set(PRL_ERR_ARG, "sandbox: base_dir is too long: %s", base_dir);
        snprintf(sb->base_dir, sizeof sb->base_dir, "%s", base_dir);
        prl_status rc = sbx_mkdirs(sb->base_dir, 0711);
        struct stat st;
        if (rc == PRL_OK && stat(sb->base_dir, &st) != 0)
            rc = prl_error_set(PRL_ERR_IO, "sandbox: stat %s: %s", sb->base_dir, strerror(errno));
        /* The init of a user namespace (and slot uids) must be able to pass through it. */
        if (rc == PRL_OK && (st.st_mode & 0001) == 0)
            rc =
                prl_error_set(PRL_ERR_ARG,
                              "sandbox: base_dir %s must be searchable by others (e.g. mode 0711): "
                              "the sandbox's user namespace and slot uids pass through it",
                              sb->base_dir);
        return rc;
    }
    snprintf(sb->base_dir, sizeof sb->base_dir, "/tmp/prl-sandbox.XXXXXX");
    if (!mkdtemp(sb->base_dir))
        return prl_error_set(PRL_ERR_IO, "sandbox: mkdtemp %s: %s", sb->base_dir, strerror(errno));
    sb->own_base_dir = 1;
    /* Slot uids must be able to reach their work dirs in the no-mount-namespace fallback. */
    if (chmod(sb->base_dir, 0711) != 0)
        return prl_error_set(PRL_ERR_IO, "sandbox: chmod %s: %s", sb->base_dir, strerror(errno));
    return PRL_OK;
}

static int read_cap_last_cap(void)
{
    FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "r");
    int v = 40; /* CAP_CHECKPOINT_RESTORE, the last one Linux 6.x knows */
    if (f) {
        if (fscanf(f, "%d", &v) != 1) v = 40;
        fclose(f);
    }
    return v;
}

static prl_status copy_path(char *dst, size_t n, const char *src, const char *what)
{
    if (!src || src[0] != '/' || strlen(src) >= n)
        return prl_error_set(PRL_ERR_ARG, "sandbox: %s must be an absolute path, got '%s'", what,
                             src ? src : "(null)");
    snprintf(dst, n, "%s", src);
    return PRL_OK;
}

/* Another language's interpreter: under /usr (the sandbox shows /usr read-only, nothing else
** of the host), without "..", an executable file. */
static prl_status check_interpreter(prl_sandbox *sb, const char *path)
{
    prl_status rc = copy_path(sb->interpreter, sizeof sb->interpreter, path, "interpreter");
    struct stat st;
    if (!rc && (strncmp(path, "/usr/", 5) || strstr(path, "/../") || stat(path, &st) ||
                !S_ISREG(st.st_mode) || !(st.st_mode & S_IXOTH)))
        rc = prl_error_set(PRL_ERR_ARG,
                           "sandbox: interpreter '%s' must be an executable file under /usr", path);
    if (rc) sb->interpreter[0] = 0;
    return rc;
}

/* The zygote executable: the given one, else the installed one, else the one of the build;
** NULL with the error set when there is none. */
static const char *zygote_path(const char *path)
{
#ifdef PRL_SANDBOX_ZYGOTE_INSTALLED
    if (!path && access(PRL_SANDBOX_ZYGOTE_INSTALLED, X_OK) == 0)
        path = PRL_SANDBOX_ZYGOTE_INSTALLED;
    if (!path && access(PRL_SANDBOX_ZYGOTE_BUILT, X_OK) == 0) path = PRL_SANDBOX_ZYGOTE_BUILT;
    if (!path)
        prl_error_set(PRL_ERR_ARG,
                      "sandbox: warm runs need prl-sandbox-zygote, which was not "
                      "built or installed (neither %s nor %s exists)",
                      PRL_SANDBOX_ZYGOTE_INSTALLED, PRL_SANDBOX_ZYGOTE_BUILT);
#else
    if (!path)
        prl_error_set(PRL_ERR_ARG, "sandbox: warm runs need prl-sandbox-zygote, which this build "
                                   "was configured without (install libpython3-dev, rebuild)");
#endif
    if (path && access(path, X_OK) != 0) {
        prl_error_set(PRL_ERR_ARG, "sandbox: zygote %s: %s", path, strerror(errno));
        return NULL;
    }
    return path;
}

prl_status prl_sandbox_warm_check(void)
{
    return zygote_path(NULL) ? PRL_OK : PRL_ERR_ARG; /* the error set names what is missing */
}

static prl_status find_zygote(prl_sandbox *sb, const char *path)
{
    path = zygote_path(path);
    if (!path) return PRL_ERR_ARG;
    return copy_path(sb->zygote, sizeof sb->zygote, path, "zygote");
}

/* Warm: a zygote per slot, started now so that the first runs do not pay for it. */
static prl_status start_warm(prl_sandbox *sb, const char *zygote)
{
    prl_status rc = find_zygote(sb, zygote);
    sb->warm = rc == PRL_OK;
    for (int i = 0; rc == PRL_OK && i < sb->n_slots; i++) rc = sbx_zygote_start(sb, &sb->slots[i]);
    return rc;
}

prl_status prl_sandbox_init(prl_sandbox **out, const prl_sandbox_options *opt)
{
    *out = NULL;
    prl_sandbox_options def;
    prl_sandbox_options_default(&def);
    if (!opt) opt = &def;
    if (opt->slots < 1 || opt->slots > 256)
        return prl_error_set(PRL_ERR_ARG, "sandbox: slots must be in 1..256, got %d", opt->slots);
    prl_sandbox *sb = calloc(1, sizeof *sb);
    if (!sb) return prl_error_set(PRL_ERR_NOMEM, "sandbox: allocating the handle");
    prl_status rc = PRL_OK;
    if (opt->caps) sb->caps = *opt->caps;
    else rc = prl_sandbox_probe(&sb->caps);
    sb->uid_base = opt->uid_base ? opt->uid_base : def.uid_base;
    if (rc == PRL_OK)
        rc = copy_path(sb->python3, sizeof sb->python3, opt->python3 ? opt->python3 : def.python3,
                       "python3");
    if (rc == PRL_OK) rc = copy_path(sb->sh, sizeof sb->sh, opt->sh ? opt->sh : def.sh, "sh");
    if (rc == PRL_OK && opt->interpreter) rc = check_interpreter(sb, opt->interpreter);
    if (rc) {
        free(sb);
        return rc;
    }
    /* The host's network: neither the namespace nor the filter that stands in for it. */
    unsigned disable = opt->disable;
    if (opt->network) disable |= PRL_SANDBOX_NETNS | PRL_SANDBOX_SOCKET_FILTER;
    sb->network = opt->network != 0;
    sb->layers = resolve_layers(sb->caps.layers & ~disable, &sb->caps);
    sb->cap_last_cap = read_cap_last_cap();
    static atomic_int counter;
    snprintf(sb->cg_group, sizeof sb->cg_group, "prl-sandbox.%ld.%d", (long)getpid(),
             atomic_fetch_add(&counter, 1));
    if (sb->layers & PRL_SANDBOX_SECCOMP)
        rc = sbx_seccomp_build((sb->layers & PRL_SANDBOX_SOCKET_FILTER) != 0, &sb->bpf,
                               &sb->bpf_len);
    if (rc == PRL_OK) rc = make_base_dir(sb, opt->base_dir);
    if (rc == PRL_OK) {
        sbx_cgroup_sweep_stale(&sb->caps);
        sb->slots = calloc((size_t)opt->slots, sizeof *sb->slots);
        if (!sb->slots)
            rc = prl_error_set(PRL_ERR_NOMEM, "sandbox: allocating %d slots", opt->slots);
    }
    for (int i = 0; rc == PRL_OK && i < opt->slots; i++) {
        rc = slot_init(sb, &sb->slots[i], i);
        sb->n_slots = i + 1; /* so free() cleans up the partly made slot too */
    }
    if (rc == PRL_OK && opt->warm) rc = start_warm(sb, opt->zygote);
    if (rc) {
        prl_sandbox_free(sb);
        return rc;
    }
    *out = sb;
    return PRL_OK;
}

void prl_sandbox_free(prl_sandbox *sb)
{
    if (!sb) return;
    for (int i = 0; i < sb->n_slots; i++) {
        sbx_slot *s = &sb->slots[i];
        sbx_zygote_stop(s);
        sbx_cgroup_remove(&s->cg);
        rmdir(s->root);
        rmdir(s->work);
        rmdir(s->tmp);
    }
    if (sb->own_base_dir) rmdir(sb->base_dir);
    free(sb->slots);
    free(sb->bpf);
    free(sb);
}

unsigned prl_sandbox_layers(const prl_sandbox *sb) { return sb->layers; }
int prl_sandbox_slots(const prl_sandbox *sb) { return sb->n_slots; }

unsigned prl_sandbox_slot_uid(const prl_sandbox *sb, int slot)
{
    return slot >= 0 && slot < sb->n_slots ? sb->slots[slot].host_uid : (unsigned)-1;
}

void prl_sandbox_result_free(prl_sandbox_result *res)
{
    if (!res) return;
    free(res->out);
    free(res->err);
    memset(res, 0, sizeof *res);
}
