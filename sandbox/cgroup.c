/*
** cgroup.c — the slot cgroups: detection, creation, per-run limits and counters, attaching
** the sandbox, killing everything in it, removal.
**
** Layout: under the supervisor's own cgroup of each hierarchy (so outer limits still apply
** and sibling groups are left alone) a group "prl-sandbox.<pid>.<n>" with one child per
** slot. cgroup v1 (the target machine): memory, pids, cpu (quota of one CPU per slot),
** cpuacct (CPU time of the tree) and freezer; the slot groups are reused from run to run —
** the peak is reset and the counters are read as differences. cgroup v2 with controllers:
** the limits go to a fresh per-run child of the slot group (v2 counters cannot be reset).
** Killing uses v2 cgroup.kill when the unified tree allows it (it works even when v2 has no
** controllers, as on the target machine), else the v1 freezer: freeze, SIGKILL each task,
** thaw.
*/
#include "sandbox/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- file helpers ----- */

static int write_knob(const char *dir, const char *name, const char *value)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    size_t n = strlen(value);
    ssize_t w = write(fd, value, n);
    int e = w == (ssize_t)n ? 0 : (w < 0 ? -errno : -EIO);
    close(fd);
    return e;
}

static int read_knob(const char *dir, const char *name, char *buf, size_t cap)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    ssize_t n = read(fd, buf, cap - 1);
    int e = n < 0 ? -errno : 0;
    close(fd);
    buf[n > 0 ? n : 0] = 0;
    return e;
}

static int read_u64(const char *dir, const char *name, uint64_t *v)
{
    char buf[64];
    int e = read_knob(dir, name, buf, sizeof buf);
    if (e) return e;
    *v = strtoull(buf, NULL, 10);
    return 0;
}

/* The value of "key N" in a flat-keyed file (memory.oom_control, pids.events, cpu.stat). */
static int read_keyed(const char *dir, const char *name, const char *key, uint64_t *v)
{
    char buf[4096];
    int e = read_knob(dir, name, buf, sizeof buf);
    if (e) return e;
    size_t kl = strlen(key);
    for (char *line = buf; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (!strncmp(line, key, kl) && line[kl] == ' ') {
            *v = strtoull(line + kl + 1, NULL, 10);
            return 0;
        }
    return -ENOENT;
}

static int exists(const char *dir, const char *name)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* ---------------------------------------------------------------- detection -------- */

/* The directory of our own cgroup in the hierarchy mounted at `mnt` (mount root `root`). */
static int own_dir(char *out, size_t n, const char *mnt, const char *root, const char *own)
{
    size_t rl = strlen(root);
    if (rl > 1 && !strncmp(own, root, rl)) own += rl; /* mounted below a cgroup namespace */
    if (!strcmp(own, "/")) own = "";
    return snprintf(out, n, "%s%s", mnt, own) < (int)n;
}

/* Our cgroup path in the v1 hierarchy that has `ctrl` ("0::" line for v2 when ctrl is ""). */
static int own_path(const char *cgroup_file, const char *ctrl, char *out, size_t n)
{
    for (const char *line = cgroup_file; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        const char *c1 = memchr(line, ':', len);
        const char *c2 = c1 ? memchr(c1 + 1, ':', len - (size_t)(c1 + 1 - line)) : NULL;
        if (c2) {
            size_t cl = (size_t)(c2 - c1 - 1);
            int match = 0;
            if (!*ctrl) match = cl == 0 && !strncmp(line, "0:", 2);
            else
                for (const char *p = c1 + 1; p < c2;) {
                    const char *comma = memchr(p, ',', (size_t)(c2 - p));
                    size_t tl = comma ? (size_t)(comma - p) : (size_t)(c2 - p);
                    if (tl == strlen(ctrl) && !strncmp(p, ctrl, tl)) match = 1;
                    p = comma ? comma + 1 : c2;
                }
            if (match) {
                snprintf(out, n, "%.*s", (int)(len - (size_t)(c2 + 1 - line)), c2 + 1);
                return 1;
            }
        }
        line = end ? end + 1 : NULL;
    }
    return 0;
}

/* Find the mount of the v1 hierarchy with `ctrl` (or the v2 one when ctrl is "") in
** mountinfo; fill mount point and mount root. */
static int find_mount(const char *mountinfo, const char *ctrl, char *mnt, char *root, size_t n)
{
    char line[4096];
    for (const char *p = mountinfo; p && *p;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        snprintf(line, sizeof line, "%.*s", (int)len, p);
        p = end ? end + 1 : NULL;
        char *sep = strstr(line, " - ");
        if (!sep) continue;
        char fstype[32], source[64], opts[1024], r[1024], m[1024];
        if (sscanf(sep + 3, "%31s %63s %1023s", fstype, source, opts) != 3) continue;
        if (sscanf(line, "%*s %*s %*s %1023s %1023s", r, m) != 2) continue;
        int hit = 0;
        if (!*ctrl) hit = !strcmp(fstype, "cgroup2");
        else if (!strcmp(fstype, "cgroup"))
            for (char *tok = strtok(opts, ","); tok; tok = strtok(NULL, ","))
                if (!strcmp(tok, ctrl)) hit = 1;
        if (hit) {
            snprintf(mnt, n, "%s", m);
            snprintf(root, n, "%s", r);
            return 1;
        }
    }
    return 0;
}

/* Try mkdir + a knob + rmdir under `parent`; 0 or -errno. */
static int trial(const char *parent, const char *knob, const char *value)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/prl-probe.%ld", parent, (long)getpid());
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -errno;
    int e = 0;
    char buf[64];
    if (knob && value && !*value) e = exists(dir, knob) ? 0 : -ENOENT;
    else if (knob) e = value ? write_knob(dir, knob, value) : read_knob(dir, knob, buf, sizeof buf);
    if (rmdir(dir) != 0 && !e) e = -errno;
    return e;
}

/* Record why a layer is missing (the first reason wins). */
static void set_why(prl_sandbox_caps *caps, unsigned layer, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_why(prl_sandbox_caps *caps, unsigned layer, const char *fmt, ...)
{
    char *why = SBX_WHY(caps, layer);
    if (why[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof caps->why[0], fmt, ap);
    va_end(ap);
}

/* v1: find and test each controller's parent directory. */
static void detect_v1(prl_sandbox_caps *caps, const char *mountinfo, const char *cgroups)
{
    struct {
        const char *ctrl, *knob, *value;
        char *dst;
    } c[] = {
        {"memory", "memory.limit_in_bytes", "1073741824", caps->cg_memory},
        {"pids", "pids.max", "64", caps->cg_pids},
        {"cpu", "cpu.cfs_quota_us", "100000", caps->cg_cpu},
        {"cpuacct", "cpuacct.usage", NULL, caps->cg_cpuacct},
        {"freezer", "freezer.state", NULL, caps->cg_freezer},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char mnt[1024], root[1024], own[1024], dir[sizeof caps->cg_memory];
        c[i].dst[0] = 0;
        if (!find_mount(mountinfo, c[i].ctrl, mnt, root, sizeof mnt) ||
            !own_path(cgroups, c[i].ctrl, own, sizeof own))
            continue;
        int e = own_dir(dir, sizeof dir, mnt, root, own) ? trial(dir, c[i].knob, c[i].value)
                                                         : -ENAMETOOLONG;
        if (e == 0) memcpy(c[i].dst, dir, sizeof dir);
        else {
            unsigned layer = i == 0   ? PRL_SANDBOX_CGROUP_MEMORY
                             : i == 1 ? PRL_SANDBOX_CGROUP_PIDS
                             : i < 4  ? PRL_SANDBOX_CGROUP_CPU
                                      : PRL_SANDBOX_CGROUP_KILL;
            set_why(caps, layer, "cgroup v1 %s: trial group in %s: %s", c[i].ctrl, dir,
                    strerror(-e));
        }
    }
}

/* v2: the unified tree; controllers usable only if the parent can delegate them. */
static void detect_v2(prl_sandbox_caps *caps, const char *mountinfo, const char *cgroups,
                      int *v2_limits)
{
    char mnt[1024], root[1024], own[1024], dir[sizeof caps->cg_unified];
    *v2_limits = 0;
    caps->cg_unified[0] = 0;
    if (!find_mount(mountinfo, "", mnt, root, sizeof mnt) ||
        !own_path(cgroups, "", own, sizeof own))
        return;
    int e = own_dir(dir, sizeof dir, mnt, root, own) ? trial(dir, "cgroup.kill", "") /* 5.14+ */
                                                     : -ENAMETOOLONG;
    if (e) {
        set_why(caps, PRL_SANDBOX_CGROUP_KILL, "cgroup v2 trial group in %s: %s", dir,
                strerror(-e));
        return;
    }
    memcpy(caps->cg_unified, dir, sizeof dir);
    char ctl[512];
    if (read_knob(dir, "cgroup.controllers", ctl, sizeof ctl) != 0) return;
    if (!strstr(ctl, "memory") || !strstr(ctl, "pids") || !strstr(ctl, "cpu")) {
        ctl[strcspn(ctl, "\n")] = 0;
        snprintf(caps->cgroup_note, sizeof caps->cgroup_note,
                 "cgroup v2 at %.150s has the controllers [%.100s] only", dir, ctl);
        return;
    }
    /* Enabling fails (EBUSY) when our own cgroup holds processes and is not the root. */
    e = write_knob(dir, "cgroup.subtree_control", "+memory +pids +cpu");
    if (e)
        snprintf(caps->cgroup_note, sizeof caps->cgroup_note,
                 "cgroup v2 at %.150s: enabling memory, pids, cpu: %.100s", dir, strerror(-e));
    else *v2_limits = 1;
}

void sbx_cgroup_detect(prl_sandbox_caps *caps)
{
    char *mountinfo = NULL, *cgroups = NULL;
    caps->cgroup_version = 0;
    caps->cgroup_kill_kind[0] = 0;
    if (prl_file_read("/proc/self/mountinfo", &mountinfo, NULL) ||
        prl_file_read("/proc/self/cgroup", &cgroups, NULL)) {
        set_why(caps, PRL_SANDBOX_CGROUP_MEMORY, "%s", prl_error_message());
        free(mountinfo);
        return;
    }
    int v2_limits;
    detect_v2(caps, mountinfo, cgroups, &v2_limits);
    if (v2_limits) {
        caps->cgroup_version = 2;
        caps->layers |=
            PRL_SANDBOX_CGROUP_MEMORY | PRL_SANDBOX_CGROUP_PIDS | PRL_SANDBOX_CGROUP_CPU;
        caps->cg_memory[0] = caps->cg_pids[0] = caps->cg_cpu[0] = caps->cg_cpuacct[0] = 0;
        caps->cg_freezer[0] = 0;
    } else {
        detect_v1(caps, mountinfo, cgroups);
        if (caps->cg_memory[0]) caps->layers |= PRL_SANDBOX_CGROUP_MEMORY;
        if (caps->cg_pids[0]) caps->layers |= PRL_SANDBOX_CGROUP_PIDS;
        if (caps->cg_cpu[0] && caps->cg_cpuacct[0]) caps->layers |= PRL_SANDBOX_CGROUP_CPU;
        if (caps->layers &
            (PRL_SANDBOX_CGROUP_MEMORY | PRL_SANDBOX_CGROUP_PIDS | PRL_SANDBOX_CGROUP_CPU))
            caps->cgroup_version = 1;
    }
    /* With v1 limits the freezer is preferred: the sandbox init joins v1 groups itself, by
    ** thread, which skips the global lock (an RCU grace period, ~10 ms) that moving a
    ** process into a v2 group costs on every run. */
    if (caps->cgroup_version == 1 && caps->cg_freezer[0])
        snprintf(caps->cgroup_kill_kind, sizeof caps->cgroup_kill_kind, "freezer");
    else if (caps->cg_unified[0])
        snprintf(caps->cgroup_kill_kind, sizeof caps->cgroup_kill_kind, "cgroup.kill");
    else if (caps->cg_freezer[0])
        snprintf(caps->cgroup_kill_kind, sizeof caps->cgroup_kill_kind, "freezer");
    if (caps->cgroup_kill_kind[0]) caps->layers |= PRL_SANDBOX_CGROUP_KILL;
    else set_why(caps, PRL_SANDBOX_CGROUP_KILL, "no usable cgroup.kill or v1 freezer");
    free(mountinfo);
    free(cgroups);
}

/* ---------------------------------------------------------------- slot groups ------ */

static prl_status make_group(char *dst, const char *parent, const char *group)
{
    dst[0] = 0;
    if (!parent[0]) return PRL_OK;
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", parent, group) >= (int)sizeof path)
        return prl_error_set(PRL_ERR_ARG, "cgroup path too long under %s", parent);
    /* The per-sandbox level first, then the slot. */
    char *slash = strrchr(path, '/');
    *slash = 0;
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return prl_error_set(PRL_ERR_IO, "cgroup: mkdir %s: %s", path, strerror(errno));
    *slash = '/';
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return prl_error_set(PRL_ERR_IO, "cgroup: mkdir %s: %s", path, strerror(errno));
    snprintf(dst, PATH_MAX, "%s", path);
    return PRL_OK;
}

static prl_status knob_error(const char *dir, const char *name, const char *value, int e)
{
    return prl_error_set(PRL_ERR_IO, "cgroup: writing '%s' to %s/%s: %s", value, dir, name,
                         strerror(-e));
}

prl_status sbx_cgroup_create(sbx_cgroup *cg, const prl_sandbox_caps *caps, unsigned layers,
                             const char *group)
{
    memset(cg, 0, sizeof *cg);
    int v1 = caps->cgroup_version == 1;
    cg->v2 =
        caps->cgroup_version == 2 &&
        (layers & (PRL_SANDBOX_CGROUP_MEMORY | PRL_SANDBOX_CGROUP_PIDS | PRL_SANDBOX_CGROUP_CPU));
    cg->kill_v2 =
        (layers & PRL_SANDBOX_CGROUP_KILL) && !strcmp(caps->cgroup_kill_kind, "cgroup.kill");
    prl_status rc = PRL_OK;
    if (v1 && (layers & PRL_SANDBOX_CGROUP_MEMORY))
        rc = make_group(cg->memory, caps->cg_memory, group);
    if (!rc && v1 && (layers & PRL_SANDBOX_CGROUP_PIDS))
        rc = make_group(cg->pids, caps->cg_pids, group);
    if (!rc && v1 && (layers & PRL_SANDBOX_CGROUP_CPU))
        rc = make_group(cg->cpu, caps->cg_cpu, group);
    if (!rc && v1 && (layers & PRL_SANDBOX_CGROUP_CPU))
        rc = make_group(cg->cpuacct, caps->cg_cpuacct, group);
    if (!rc && (layers & PRL_SANDBOX_CGROUP_KILL) && !cg->kill_v2)
        rc = make_group(cg->freezer, caps->cg_freezer, group);
    if (!rc && (cg->v2 || cg->kill_v2)) rc = make_group(cg->unified, caps->cg_unified, group);
    int e = 0;
    /* One CPU per slot: a multi-threaded burn cannot starve the other slots. */
    if (!rc && cg->cpu[0] && (e = write_knob(cg->cpu, "cpu.cfs_period_us", "100000")) == 0)
        e = write_knob(cg->cpu, "cpu.cfs_quota_us", "100000");
    if (!rc && e) rc = knob_error(cg->cpu, "cpu.cfs_quota_us", "100000", e);
    if (!rc && cg->v2) {
        /* Delegate the controllers down to the per-run groups. */
        char level[PATH_MAX];
        snprintf(level, sizeof level, "%s", cg->unified);
        *strrchr(level, '/') = 0;
        if ((e = write_knob(level, "cgroup.subtree_control", "+memory +pids +cpu")) == 0)
            e = write_knob(cg->unified, "cgroup.subtree_control", "+memory +pids +cpu");
        if (e) rc = knob_error(cg->unified, "cgroup.subtree_control", "+memory +pids +cpu", e);
    }
    return rc;
}

static prl_status set_v1_memory(sbx_cgroup *cg, uint64_t limit)
{
    if (!cg->memory[0] || cg->memory_limit == limit) return PRL_OK;
    char v[32];
    snprintf(v, sizeof v, "%llu", (unsigned long long)limit);
    int memsw = exists(cg->memory, "memory.memsw.limit_in_bytes");
    /* memsw must stay >= the memory limit at every step: lift it, set memory, set memsw. */
    int e = memsw ? write_knob(cg->memory, "memory.memsw.limit_in_bytes", "-1") : 0;
    if (!e) e = write_knob(cg->memory, "memory.limit_in_bytes", v);
    if (!e && memsw) e = write_knob(cg->memory, "memory.memsw.limit_in_bytes", v);
    if (e) return knob_error(cg->memory, "memory.limit_in_bytes", v, e);
    cg->memory_limit = limit;
    return PRL_OK;
}

static prl_status make_v2_run_group(sbx_cgroup *cg, const prl_sandbox_limits *lim)
{
    if (snprintf(cg->run, sizeof cg->run, "%s/run", cg->unified) >= (int)sizeof cg->run)
        return prl_error_set(PRL_ERR_ARG, "cgroup path too long: %s/run", cg->unified);
    if (mkdir(cg->run, 0755) != 0 && errno != EEXIST)
        return prl_error_set(PRL_ERR_IO, "cgroup: mkdir %s: %s", cg->run, strerror(errno));
    char mem[32], pids[32];
    snprintf(mem, sizeof mem, "%llu", (unsigned long long)lim->memory_bytes);
    snprintf(pids, sizeof pids, "%d", lim->processes + 1);
    struct {
        const char *name, *value;
    } k[] = {
        {"memory.max", mem},
        {"memory.swap.max", "0"},
        {"pids.max", pids},
        {"cpu.max", "100000 100000"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        int e = write_knob(cg->run, k[i].name, k[i].value);
        if (e && !(e == -ENOENT && !strcmp(k[i].name, "memory.swap.max")))
            return knob_error(cg->run, k[i].name, k[i].value, e);
    }
    return PRL_OK;
}

prl_status sbx_cgroup_prepare(sbx_cgroup *cg, unsigned layers, const prl_sandbox_limits *lim,
                              sbx_cg_stats *start)
{
    memset(start, 0, sizeof *start);
    if (!sbx_cgroup_empty(cg) && sbx_cgroup_kill(cg) < 0)
        return prl_error_set(PRL_ERR_IO,
                             "cgroup: the slot's group still has tasks that cannot be killed");
    if (cg->v2) {
        prl_status rc = make_v2_run_group(cg, lim);
        if (rc) return rc;
        sbx_cgroup_stats(cg, layers, start);
        return PRL_OK;
    }
    prl_status rc = set_v1_memory(cg, lim->memory_bytes);
    if (rc) return rc;
    if (cg->pids[0] && cg->pids_max != lim->processes + 1) {
        /* +1: the sandbox's init lives in the group too. */
        char v[32];
        snprintf(v, sizeof v, "%d", lim->processes + 1);
        int e = write_knob(cg->pids, "pids.max", v);
        if (e) return knob_error(cg->pids, "pids.max", v, e);
        cg->pids_max = lim->processes + 1;
    }
    /* Peak := current usage, so the run's peak is measured from here. */
    if (cg->memory[0]) {
        int e = write_knob(cg->memory, "memory.max_usage_in_bytes", "0");
        if (e) return knob_error(cg->memory, "memory.max_usage_in_bytes", "0", e);
    }
    sbx_cgroup_stats(cg, layers, start);
    return PRL_OK;
}

prl_status sbx_cgroup_open_tasks(const sbx_cgroup *cg, int fds[SBX_CG_MAX_FDS], int *n)
{
    *n = 0;
    const char *dirs[] = {cg->memory, cg->pids, cg->cpu, cg->cpuacct, cg->freezer};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        if (!dirs[i][0]) continue;
        char path[PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/tasks", dirs[i]);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            while (*n > 0) close(fds[--*n]);
            return prl_error_set(PRL_ERR_IO, "cgroup: open %s: %s", path, strerror(e));
        }
        fds[(*n)++] = fd;
    }
    return PRL_OK;
}

prl_status sbx_cgroup_attach(const sbx_cgroup *cg, pid_t pid)
{
    const char *dir = cg->v2 ? cg->run : cg->unified;
    if (!dir[0]) return PRL_OK;
    char v[32];
    snprintf(v, sizeof v, "%ld", (long)pid);
    int e = write_knob(dir, "cgroup.procs", v);
    return e ? knob_error(dir, "cgroup.procs", v, e) : PRL_OK;
}

static int v2_populated(const char *dir)
{
    uint64_t v = 0;
    return read_keyed(dir, "cgroup.events", "populated", &v) == 0 && v != 0;
}

static int v1_populated(const char *dir)
{
    char buf[16];
    return read_knob(dir, "cgroup.procs", buf, sizeof buf) == 0 && buf[0] != 0;
}

int sbx_cgroup_empty(const sbx_cgroup *cg)
{
    if (cg->unified[0] && v2_populated(cg->unified)) return 0;
    const char *dirs[] = {cg->memory, cg->pids, cg->cpu, cg->cpuacct, cg->freezer};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
        if (dirs[i][0] && v1_populated(dirs[i])) return 0;
    return 1;
}

/* v1 freezer: freeze (no task can fork or run), SIGKILL every task but `spare`, thaw so
** they die. */
static int freezer_kill(const char *dir, pid_t spare)
{
    int killed = 0;
    write_knob(dir, "freezer.state", "FROZEN");
    char state[32] = "";
    for (int i = 0; i < 100 && strncmp(state, "FROZEN", 6) != 0; i++) {
        if (read_knob(dir, "freezer.state", state, sizeof state) != 0) break;
        if (strncmp(state, "FROZEN", 6) != 0) sleep_ms(2);
    }
    char *procs = NULL, path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/cgroup.procs", dir);
    if (prl_file_read(path, &procs, NULL) == PRL_OK) {
        for (char *p = procs; *p;) {
            char *end;
            long pid = strtol(p, &end, 10);
            if (end == p) break;
            if (pid > 0 && pid != (long)spare && kill((pid_t)pid, SIGKILL) == 0) killed++;
            p = end;
        }
        free(procs);
    }
    write_knob(dir, "freezer.state", "THAWED");
    return killed;
}

int sbx_cgroup_kill(const sbx_cgroup *cg)
{
    int found = !sbx_cgroup_empty(cg);
    if (!found) return 0;
    if (cg->kill_v2 && cg->unified[0]) write_knob(cg->unified, "cgroup.kill", "1");
    else if (cg->freezer[0]) freezer_kill(cg->freezer, 0);
    else return -1;                 /* no way to kill by group */
    for (int i = 0; i < 500; i++) { /* dying tasks leave within ms; allow 1 s */
        if (sbx_cgroup_empty(cg)) return found;
        if (!cg->kill_v2 && cg->freezer[0] && i % 50 == 49) freezer_kill(cg->freezer, 0);
        sleep_ms(2);
    }
    return -1;
}

int sbx_cgroup_kill_but(const sbx_cgroup *cg, pid_t spare)
{
    if (!cg->freezer[0]) return -1;
    return freezer_kill(cg->freezer, spare);
}

void sbx_cgroup_stats(const sbx_cgroup *cg, unsigned layers, sbx_cg_stats *s)
{
    (void)layers;
    if (cg->v2) {
        const char *d = cg->run;
        read_keyed(d, "memory.events", "oom_kill", &s->oom_kills);
        read_keyed(d, "pids.events", "max", &s->pids_refused);
        uint64_t usec = 0;
        if (read_keyed(d, "cpu.stat", "usage_usec", &usec) == 0)
            s->cpu_ns = usec * 1000, s->have_cpu = 1;
        read_u64(d, "memory.current", &s->mem_usage);
        s->have_peak = read_u64(d, "memory.peak", &s->mem_peak) == 0;
        return;
    }
    if (cg->memory[0]) {
        read_keyed(cg->memory, "memory.oom_control", "oom_kill", &s->oom_kills);
        read_u64(cg->memory, "memory.usage_in_bytes", &s->mem_usage);
        s->have_peak = read_u64(cg->memory, "memory.max_usage_in_bytes", &s->mem_peak) == 0;
    }
    if (cg->pids[0]) read_keyed(cg->pids, "pids.events", "max", &s->pids_refused);
    if (cg->cpuacct[0]) s->have_cpu = read_u64(cg->cpuacct, "cpuacct.usage", &s->cpu_ns) == 0;
}

void sbx_cgroup_finish(sbx_cgroup *cg)
{
    if (cg->v2 && cg->run[0]) rmdir(cg->run);
}

void sbx_cgroup_remove(sbx_cgroup *cg)
{
    sbx_cgroup_kill(cg);
    sbx_cgroup_finish(cg);
    char *dirs[] = {cg->memory, cg->pids, cg->cpu, cg->cpuacct, cg->freezer, cg->unified};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        if (!dirs[i][0]) continue;
        rmdir(dirs[i]);
        char *slash = strrchr(dirs[i], '/');
        *slash = 0;
        rmdir(dirs[i]); /* the per-sandbox level, once its last slot is gone */
        dirs[i][0] = 0;
    }
}

/* ---------------------------------------------------------------- stale groups ----- */

static void remove_stale(const char *parent)
{
    DIR *d = opendir(parent);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid = 0;
        if (sscanf(e->d_name, "prl-sandbox.%ld.", &pid) != 1 || pid <= 0) continue;
        if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", parent, e->d_name);
        DIR *s = opendir(path);
        struct dirent *se;
        while (s && (se = readdir(s)) != NULL) {
            if (strncmp(se->d_name, "slot", 4) != 0) continue;
            char sp[PATH_MAX + 300], rp[PATH_MAX + 310];
            snprintf(sp, sizeof sp, "%s/%s", path, se->d_name);
            snprintf(rp, sizeof rp, "%s/run", sp);
            rmdir(rp);
            rmdir(sp);
        }
        if (s) closedir(s);
        rmdir(path);
    }
    closedir(d);
}

void sbx_cgroup_sweep_stale(const prl_sandbox_caps *caps)
{
    const char *parents[] = {caps->cg_memory,  caps->cg_pids,    caps->cg_cpu,
                             caps->cg_cpuacct, caps->cg_freezer, caps->cg_unified};
    for (size_t i = 0; i < sizeof parents / sizeof parents[0]; i++)
        if (parents[i][0]) remove_stale(parents[i]);
}
