/*
** launcher.c — `prl run`'s launcher (roles.h, docs/pipeline.md): every role of a run as a
** child process of the same binary (`prl role ...`) over ipc:// sockets in the run
** directory, each one's log in logs/NAME.log, supervised until the controller finishes.
**
** A role that dies is started again (the controller hands its work out again), at most
** RESTARTS_PER_MINUTE times a minute; Ctrl-C or SIGTERM stops every role and leaves the run
** resumable. With trainer.ranks > 1 the trainer child is mpirun (or srun) and its ranks: a
** rank that dies ends the group, which the launcher sees as the trainer dying. A launcher that dies takes its roles with it (PR_SET_PDEATHSIG).
*/
#include "roles/roles.h"
#include "roles/controller/controller.h"
#include "dp/dp.h"
#include "sandbox/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

enum { MAX_CHILDREN = 152, RESTARTS_PER_MINUTE = 10 };

/* Not prl_role_install_signals: the launcher leaves SIGPIPE alone, so that its children
** (and the programs the sandbox runs) start with the default disposition. */
static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

enum { MAX_ARGS = 40 };

typedef struct child {
    char name[64];
    char *argv[MAX_ARGS];
    int search_path; /* argv[0] is a program on PATH (mpirun, srun), not this binary */
    int n_args;
    pid_t pid;
    double started;
    int restarts;
    double window_start;
} child;

typedef struct launcher {
    const char *run_dir;
    child c[MAX_CHILDREN];
    int n;
    char control_ep[1100];
    char sandbox_ep[1100];
} launcher;

static void add_child(launcher *L, const char *name, const char *const *args)
{
    child *c = &L->c[L->n++];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->argv[c->n_args++] = strdup("prl");
    for (int i = 0; args[i] && c->n_args < MAX_ARGS - 1; i++)
        c->argv[c->n_args++] = strdup(args[i]);
    c->argv[c->n_args] = NULL;
}

/* fork + exec /proc/self/exe; stdout/stderr to logs/NAME.log (the controller's stdout, its
** progress lines, stays on the terminal). */
static int start_child(launcher *L, child *c)
{
    char log[1200];
    snprintf(log, sizeof log, "%s/logs/%s.log", L->run_dir, c->name);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "prl run: cannot open %s: %s\n", log, strerror(errno));
        return -1;
    }
    fflush(stdout), fflush(stderr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        close(fd);
        fprintf(stderr, "prl run: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        signal(SIGINT, SIG_IGN); /* the launcher stops its children with SIGTERM */
        /* a launcher that dies (even by SIGKILL) takes its roles with it: they stop as on
        ** Ctrl-C and the run stays resumable, instead of running on unsupervised */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1);
        if (strcmp(c->name, "controller")) dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        if (c->search_path) execvp(c->argv[0], c->argv);
        else execv("/proc/self/exe", c->argv);
        fprintf(stderr, "exec %s: %s\n", c->search_path ? c->argv[0] : "/proc/self/exe",
                strerror(errno));
        _exit(127);
    }
    close(fd);
    c->pid = pid, c->started = prl_now();
    return 0;
}

static child *child_of(launcher *L, pid_t pid)
{
    for (int i = 0; i < L->n; i++)
        if (L->c[i].pid == pid) return &L->c[i];
    return NULL;
}

static void describe_exit(int status, char *out, size_t n)
{
    if (WIFSIGNALED(status)) snprintf(out, n, "killed by signal %d", WTERMSIG(status));
    else if (WEXITSTATUS(status) == PRL_ROLE_SIGNALED_EXIT)
        snprintf(out, n, "stopped by SIGTERM or SIGINT, exit code %d", WEXITSTATUS(status));
    else snprintf(out, n, "exit code %d", WEXITSTATUS(status));
}

/* SIGTERM every child, wait up to `grace` seconds, then SIGKILL the rest. */
static void stop_all(launcher *L, double grace)
{
    for (int i = 0; i < L->n; i++)
        if (L->c[i].pid > 0) kill(L->c[i].pid, SIGTERM);
    double t_end = prl_now() + grace;
    for (;;) {
        int alive = 0;
        for (int i = 0; i < L->n; i++) {
            if (L->c[i].pid <= 0) continue;
            int st;
            pid_t r = waitpid(L->c[i].pid, &st, WNOHANG);
            if (r == L->c[i].pid || (r < 0 && errno == ECHILD)) L->c[i].pid = 0;
            else alive++;
        }
        if (!alive) return;
        if (prl_now() > t_end) {
            for (int i = 0; i < L->n; i++)
                if (L->c[i].pid > 0) kill(L->c[i].pid, SIGKILL);
            t_end = prl_now() + 5;
        }
        usleep(50000);
    }
}

/* The last line of a role's log, to say why it died (lines of dashes, mpirun's box around
** its messages, are skipped). */
static void last_log_line(const launcher *L, const char *name, char *out, size_t n)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/logs/%s.log", L->run_dir, name);
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[1024];
    while (fgets(line, sizeof line, f))
        if (line[0] != '\n' && strspn(line, "-\n") < strlen(line)) { /* not mpirun's rules */
            size_t k = strnlen(line, n - 1);
            memcpy(out, line, k);
            out[k] = 0;
        }
    fclose(f);
    size_t k = strlen(out);
    if (k && out[k - 1] == '\n') out[k - 1] = 0;
}

/* Supervise until the controller finishes (0), a signal stops the run (130) or a role keeps
** dying (1). */
static int supervise(launcher *L)
{
    for (;;) {
        if (interrupted) {
            fprintf(stderr,
                    "\nprl run: stopping every role (the run can be resumed with "
                    "`prl run --resume %s`)\n",
                    L->run_dir);
            stop_all(L, 10);
            return 130;
        }
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) {
            usleep(100000);
            continue;
        }
        child *c = child_of(L, pid);
        if (!c) continue;
        c->pid = 0;
        if (!strcmp(c->name, "controller") && WIFEXITED(status) &&
            (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == PRL_RUN_FAILED_EXIT)) {
            stop_all(L, 10);
            if (WEXITSTATUS(status) == 0) return 0;
            char last[512];
            last_log_line(L, "controller", last, sizeof last);
            fprintf(stderr, "prl run: the run failed: %s\n", last);
            return 1;
        }
        /* a worker the controller told to stop is done; the sandbox service has no end of
        ** its own: while the run goes on it is needed, however it stopped */
        int service = !strcmp(c->name, "sandbox");
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !service) {
            fprintf(stderr, "prl run: %s finished\n", c->name);
            continue;
        }
        char why[64], last[512];
        describe_exit(status, why, sizeof why);
        if (service && WIFEXITED(status) && WEXITSTATUS(status) == 0)
            snprintf(why, sizeof why, "stopped while the run goes on");
        last_log_line(L, c->name, last, sizeof last);
        fprintf(stderr, "prl run: %s died (%s)%s%s: starting it again\n", c->name, why,
                last[0] ? "; its log ends with: " : "", last);
        double now = prl_now();
        if (now - c->window_start > 60) c->window_start = now, c->restarts = 0;
        if (++c->restarts > RESTARTS_PER_MINUTE) {
            fprintf(stderr,
                    "prl run: %s died %d times within a minute: stopping the run (see "
                    "%s/logs/%s.log)\n",
                    c->name, c->restarts, L->run_dir, c->name);
            stop_all(L, 10);
            return 1;
        }
        usleep(200000); /* a moment before the restart: a crash loop must not spin */
        if (start_child(L, c)) {
            stop_all(L, 10);
            return 1;
        }
    }
}

/* srun under SLURM (SLURM_JOB_ID set) or with trainer.launcher = srun, else mpirun. */
static const char *ranks_program(const prl_job_config *job)
{
    if (!strcmp(job->trainer_launcher, "auto")) return getenv("SLURM_JOB_ID") ? "srun" : "mpirun";
    return job->trainer_launcher;
}

/* Is `prog` an executable on PATH? */
static int on_path(const char *prog)
{
    const char *path = getenv("PATH");
    char dir[1024], file[1200];
    while (path && *path) {
        size_t n = strcspn(path, ":");
        snprintf(dir, sizeof dir, "%.*s", (int)n, path);
        snprintf(file, sizeof file, "%s/%s", dir[0] ? dir : ".", prog);
        if (access(file, X_OK) == 0) return 1;
        path += n + (path[n] == ':');
    }
    return 0;
}

prl_status prl_launcher_check(const prl_job_config *job)
{
    if (job->sandbox_warm && prl_sandbox_warm_check())
        return prl_error_wrap(PRL_ERR_CONFIG, "sandbox.warm = true");
    if (job->trainer_ranks <= 1) return PRL_OK;
    if (!prl_dp_available())
        return prl_error_set(PRL_ERR_CONFIG,
                             "trainer.ranks = %d: this prl was built without MPI (install "
                             "libopenmpi-dev and openmpi-bin, then rebuild)",
                             job->trainer_ranks);
    const char *prog = ranks_program(job);
    if (!on_path(prog))
        return prl_error_set(PRL_ERR_CONFIG, "trainer.ranks = %d needs %s on PATH (%s)",
                             job->trainer_ranks, prog,
                             strcmp(prog, "srun") ? "Debian: openmpi-bin" : "SLURM");
    return prl_rank_hosts_check(job, prog);
}

/* The trainer: one process, or (trainer.ranks = N > 1) N ranks under mpirun or srun, each
** running `prl role trainer --ranks N` with its share of the threads. mpirun: as root it
** needs --allow-run-as-root; --oversubscribe lets N exceed the cores; --bind-to none leaves
** scheduling to the kernel on a machine the roles share; trainer.hosts / trainer.hostfile
** place the ranks (--host / --hostfile; OMPI_MCA_* from the environment reach mpirun as
** they are). srun: --kill-on-bad-exit, so a
** dead rank ends the step on every rank as mpirun does. */
static void add_trainer(launcher *L, const prl_job_config *job, int threads)
{
    int R = job->trainer_ranks;
    int th = job->trainer_threads ? job->trainer_threads : threads;
    if (R > 1 && th == 0 && !getenv("PRL_THREADS")) { /* all CPUs, shared by the ranks */
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        th = cpus / R > 1 ? (int)(cpus / R) : 1;
    }
    char ths[16], ranks[16], exe[1024];
    snprintf(ths, sizeof ths, "%d", th);
    snprintf(ranks, sizeof ranks, "%d", R);
    const char *role[] = {"role",      "trainer", "--connect", L->control_ep, "--name", "trainer-0",
                          "--threads", ths,       "--ranks",   ranks,         NULL};
    if (R <= 1) {
        role[8] = NULL;
        add_child(L, "trainer-0", role);
        return;
    }
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    const char *prog = ranks_program(job), *a[MAX_ARGS];
    int k = 0;
    a[k++] = "-n", a[k++] = ranks;
    if (!strcmp(prog, "srun")) a[k++] = "--kill-on-bad-exit=1";
    else {
        if (getuid() == 0) a[k++] = "--allow-run-as-root";
        a[k++] = "--oversubscribe", a[k++] = "--bind-to", a[k++] = "none";
        k += prl_rank_hosts_args(job, a + k); /* trainer.hosts / trainer.hostfile */
    }
    a[k++] = exe;
    for (int i = 0; role[i]; i++) a[k++] = role[i];
    a[k] = NULL;
    add_child(L, "trainer-0", a);
    child *c = &L->c[L->n - 1];
    free(c->argv[0]);
    c->argv[0] = strdup(prog), c->search_path = 1;
}

/* Threads of the trainer and of each rollout worker: the job's trainer.threads and
** rollout.threads, else --threads (0: PRL_THREADS or all CPUs, decided by the role). */
static void build_roles(launcher *L, const prl_job_config *job, int threads)
{
    char rth[16];
    snprintf(rth, sizeof rth, "%d", job->rollout_threads ? job->rollout_threads : threads);
    const char *ctl[] = {"role", "controller", "--run", L->run_dir, NULL};
    add_child(L, "controller", ctl);
    char slots[16];
    snprintf(slots, sizeof slots, "%d", job->sandbox_slots);
    /* --warm comes last: without it the NULL there ends the list */
    const char *sb[] = {"role",
                        "sandbox",
                        "--bind",
                        L->sandbox_ep,
                        "--slots",
                        slots,
                        job->sandbox_warm ? "--warm" : NULL,
                        NULL};
    add_child(L, "sandbox", sb);
    add_trainer(L, job, threads);
    int gateway = !strcmp(job->rollout_source, "gateway");
    char groups[16];
    snprintf(groups, sizeof groups, "%d",
             job->gateway_groups ? job->gateway_groups : job->batch_prompts);
    const char *gwa[] = {"role",    "gateway", "--connect", L->control_ep, "--name", "gateway-0",
                         "--slots", groups,    "--threads", rth,           NULL};
    if (gateway) add_child(L, "gateway-0", gwa); /* outside agents play the rollouts */
    for (int i = 0; !gateway && i < job->rollout_workers; i++) {
        char name[32];
        snprintf(name, sizeof name, "rollout-%d", i);
        const char *a[] = {"role",      "rollout", "--connect", L->control_ep, "--name", name,
                           "--threads", rth,       "--sandbox", L->sandbox_ep, NULL};
        add_child(L, name, a);
    }
    char tth[16]; /* OPD: the teacher pool (docs/opd.md) */
    snprintf(tth, sizeof tth, "%d", job->teacher_threads ? job->teacher_threads : threads);
    for (int i = 0; job->opd_enabled && i < job->teacher_workers; i++) {
        char name[32];
        snprintf(name, sizeof name, "teacher-%d", i);
        const char *a[] = {"role", "teacher",   "--connect", L->control_ep, "--name",
                           name,   "--threads", tth,         NULL};
        add_child(L, name, a);
    }
    for (int i = 0; i < job->reward_workers; i++) {
        char name[32];
        snprintf(name, sizeof name, "reward-%d", i);
        const char *a[] = {"role", "reward",    "--connect",   L->control_ep, "--name",
                           name,   "--sandbox", L->sandbox_ep, NULL};
        add_child(L, name, a);
    }
}

static void announce(const char *run_dir, const prl_job_config *job)
{
    if (job->opd_enabled)
        fprintf(stderr,
                "prl run: %s: on-policy distillation (%s prompts), %d steps of %d prompts "
                "x %d samples, %s mode; %d rollout + %d reward + %d teacher workers, "
                "trainer, sandbox; logs in %s/logs/\n",
                run_dir, job->domain, job->steps, job->batch_prompts, job->group_size, job->mode,
                job->rollout_workers, job->reward_workers, job->teacher_workers, run_dir);
    else if (!strcmp(job->rollout_source, "gateway"))
        fprintf(stderr,
                "prl run: %s: %s%s expert, %d steps of %d prompts x %d samples, %s mode; "
                "episodes played by outside agents through the gateway (address in "
                "%s/gateway.addr), %d reward workers, trainer, sandbox; logs in %s/logs/\n",
                run_dir, strcmp(job->task_source, "file") ? job->domain : "prompt file ",
                strcmp(job->task_source, "file") ? "" : job->task_path, job->steps,
                job->batch_prompts, job->group_size, job->mode, run_dir, job->reward_workers,
                run_dir);
    else
        fprintf(stderr,
                "prl run: %s: %s%s expert, %d steps of %d prompts x %d samples, %s mode; "
                "%d rollout + %d reward workers, trainer, sandbox; logs in %s/logs/\n",
                run_dir, strcmp(job->task_source, "file") ? job->domain : "prompt file ",
                strcmp(job->task_source, "file") ? "" : job->task_path, job->steps,
                job->batch_prompts, job->group_size, job->mode, job->rollout_workers,
                job->reward_workers, run_dir);
}

prl_status prl_launcher_lock(const char *run_dir, int *fd)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/lock", run_dir);
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0) return prl_error_set(PRL_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        char holder[32] = "";
        ssize_t k = pread(*fd, holder, sizeof holder - 1, 0);
        holder[k > 0 ? k : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        close(*fd);
        *fd = -1;
        if (e != EWOULDBLOCK)
            return prl_error_set(PRL_ERR_IO, "cannot lock %s: %s", path, strerror(e));
        return prl_error_set(PRL_ERR_ARG,
                             "%s is in use: another prl run (pid %s) holds %s; stop it first",
                             run_dir, holder[0] ? holder : "?", path);
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(*fd, 0) || pwrite(*fd, pid, (size_t)n, 0) != n) {
        int e = errno;
        close(*fd);
        *fd = -1;
        return prl_error_set(PRL_ERR_IO, "cannot write %s: %s", path, strerror(e));
    }
    return PRL_OK;
}

int prl_launcher_run(const char *run_dir, const prl_job_config *job, int threads)
{
    launcher L0, *L = &L0;
    memset(L, 0, sizeof *L);
    L->run_dir = run_dir;
    if (prl_controller_endpoint(run_dir, "control.sock", L->control_ep, sizeof L->control_ep) ||
        prl_controller_endpoint(run_dir, "sandbox.sock", L->sandbox_ep, sizeof L->sandbox_ep)) {
        fprintf(stderr, "prl run: %s\n", prl_error_message());
        return 1;
    }
    build_roles(L, job, threads);
    announce(run_dir, job);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int code = 0;
    for (int i = 0; i < L->n && !code; i++)
        if (start_child(L, &L->c[i])) code = 1;
    if (code) stop_all(L, 5);
    else code = supervise(L);
    for (int i = 0; i < L->n; i++)
        for (int j = 0; j < L->c[i].n_args; j++) free(L->c[i].argv[j]);
    return code;
}
