/*
** bench_controller.c — `prl bench controller`: how many leases one controller hands out per
** second, and at what CPU, with N simulated workers (docs/scale-out.md "Several hosts": the
** planning figure for hundreds of hosts).
**
** A real controller (`prl role controller`, a child process, run.db and all) runs a GRPO job
** of a tiny random policy; the workers are simulated in this process, one thread polling one
** socket each: rollout workers answer `work` with fixed token results at once, reward workers
** answer `score` with alternating rewards (so dynamic sampling keeps every group), the one
** trainer answers `train` with a hard link of the initial weights as the next version. So
** everything the controller does per lease is real (decode, checks, run.db writes, steps,
** versions) and nothing else costs time. Printed: leases handed out per second by kind,
** steps per second, the controller's CPU (from /proc/PID/stat) and CPU per lease.
*/
#include "cli/bench.h"
#include "bus/bus.h"
#include "job/job.h"
#include "roles/msg/msg.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

enum { MAX_SIM = 256 };

typedef struct sim_worker {
    char name[32];
    const char *role;
    prl_bus_socket *s;
    double last_beat;
} sim_worker;

typedef struct sim {
    char dir[256], init[300];
    sim_worker w[MAX_SIM];
    int n;
    prl_bus_secret secret;
    uint64_t next_id, init_sum;
    uint64_t work, score, train, errors;
    int measuring;
} sim;

/* The run directory: a tiny random policy (model.init) and the job. */
static prl_status make_run(sim *S)
{
    snprintf(S->init, sizeof S->init, "%s/init", S->dir);
    prl_config cfg;
    prl_model m;
    char path[400];
    snprintf(path, sizeof path, "%s/configs/models/tiny.json", PRL_SOURCE_DIR);
    prl_status rc = prl_config_load(&cfg, path);
    if (!rc) rc = prl_model_init(&m, &cfg);
    if (rc) return rc;
    prl_model_init_weights(&m, 1);
    rc = prl_checkpoint_save(&m, NULL, NULL, NULL, S->init);
    prl_model_free(&m);
    if (!rc) rc = prl_checkpoint_weights_hash(S->init, 0, &S->init_sum);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/job.json", S->dir);
    FILE *f = fopen(path, "w");
    if (!f) return prl_error_set(PRL_ERR_IO, "%s: %s", path, strerror(errno));
    fprintf(f,
            "{\"run\": {\"name\": \"bench\", \"seed\": 1}, \"model\": {\"init\": \"%s\"},\n"
            " \"task\": {\"domain\": \"general\", \"train_problems\": 4096},\n"
            " \"rollout\": {\"batch_prompts\": 8, \"group_size\": 8},\n"
            " \"controller\": {\"steps\": 1000000, \"heartbeat_seconds\": 1, "
            "\"lease_seconds\": 30}}\n",
            S->init);
    fclose(f);
    return PRL_OK;
}

static pid_t start_controller(const sim *S)
{
    char log[400];
    snprintf(log, sizeof log, "%s/controller.log", S->dir);
    fflush(stdout), fflush(stderr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* a bench stopped by a signal removes the folder (bench_tmpdir): the controller goes too */
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(127);
        FILE *f = freopen(log, "w", stderr);
        if (f) dup2(fileno(stderr), STDOUT_FILENO);
        execl("/proc/self/exe", "prl", "role", "controller", "--run", S->dir, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* utime + stime of pid in seconds. */
static double cpu_seconds(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    /* fields after the command: state ppid pgrp session tty tpgid flags minflt cminflt
    ** majflt cmajflt utime stime */
    if (p) sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st);
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static prl_status send_msg(sim_worker *w, prl_bus_msg *m)
{
    prl_status rc = prl_bus_send(w->s, NULL, m);
    prl_bus_msg_free(m);
    return rc;
}

/* A rollout item: `count` results of 2 prompt and 6 response tokens. */
static prl_status on_work(sim *S, sim_worker *w, const prl_bus_msg *m)
{
    uint64_t lease, step, prompt, sample, count, version;
    if (prl_bus_msg_get_uint(m, "lease", &lease) || prl_bus_msg_get_uint(m, "step", &step) ||
        prl_bus_msg_get_uint(m, "prompt", &prompt) || prl_bus_msg_get_uint(m, "sample", &sample) ||
        prl_bus_msg_get_uint(m, "count", &count) ||
        prl_bus_msg_get_uint(m, "policy_version", &version))
        return prl_error_set(PRL_ERR_FORMAT, "work without its fields");
    S->work += S->measuring;
    int32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float lp[6] = {-1, -1, -1, -1, -1, -1};
    uint8_t mask[6] = {1, 1, 1, 1, 1, 1};
    json_t *turns = json_pack("[{s:s,s:s}]", "role", "assistant", "content", "x");
    prl_status rc = turns ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "turns");
    for (uint64_t i = 0; !rc && i < count; i++) {
        prl_msg_result x = {.lease = lease,
                            .step = step,
                            .prompt = prompt,
                            .sample = sample + i,
                            .policy_version = version,
                            .prompt_len = 2,
                            .gen_us = 1,
                            .tokens = tokens,
                            .n_tokens = 8,
                            .logprobs = lp,
                            .mask = mask,
                            .turns = turns,
                            .turns_played = 1};
        prl_bus_msg out;
        rc = prl_msg_result_encode(&x, "bench", ++S->next_id, &out);
        if (!rc) rc = send_msg(w, &out);
    }
    json_decref(turns);
    return rc;
}

static prl_status on_score(sim *S, sim_worker *w, const prl_bus_msg *m)
{
    uint64_t lease, step, prompt, sample;
    if (prl_bus_msg_get_uint(m, "lease", &lease) || prl_bus_msg_get_uint(m, "step", &step) ||
        prl_bus_msg_get_uint(m, "prompt", &prompt) || prl_bus_msg_get_uint(m, "sample", &sample))
        return prl_error_set(PRL_ERR_FORMAT, "score without its fields");
    S->score += S->measuring;
    prl_msg_scored x = {.lease = lease,
                        .step = step,
                        .prompt = prompt,
                        .sample = sample,
                        .score_us = 1,
                        .detail = sample % 2 ? "{\"score\": 1}" : "{\"score\": 0}"};
    prl_bus_msg out;
    prl_status rc = prl_msg_scored_encode(&x, "bench", ++S->next_id, &out);
    return rc ? rc : send_msg(w, &out);
}

/* The next version: a directory of hard links to the initial weights. */
static prl_status on_train(sim *S, sim_worker *w, const prl_bus_msg *m)
{
    uint64_t lease, step, version;
    if (prl_bus_msg_get_uint(m, "lease", &lease) || prl_bus_msg_get_uint(m, "step", &step) ||
        prl_bus_msg_get_uint(m, "policy_version", &version))
        return prl_error_set(PRL_ERR_FORMAT, "train without its fields");
    S->train += S->measuring;
    char dir[600], from[700], to[700];
    prl_job_ckpt_dir(S->dir, (int64_t)version + 1, dir, sizeof dir);
    if (mkdir(dir, 0755) && errno != EEXIST)
        return prl_error_set(PRL_ERR_IO, "%s: %s", dir, strerror(errno));
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/%s", S->init, files[i]);
        snprintf(to, sizeof to, "%s/%s", dir, files[i]);
        if (link(from, to) && errno != EEXIST)
            return prl_error_set(PRL_ERR_IO, "link %s: %s", to, strerror(errno));
    }
    prl_msg_trained x = {.lease = lease,
                         .step = step,
                         .version = version + 1,
                         .path = dir,
                         .ckpt_checksum = S->init_sum,
                         .train_us = 1,
                         .metrics = "{}"};
    prl_bus_msg out;
    prl_status rc = prl_msg_trained_encode(&x, "bench", ++S->next_id, &out);
    return rc ? rc : send_msg(w, &out);
}

static prl_status hello(sim *S, sim_worker *w)
{
    prl_msg_hello h = {.role = w->role, .worker = w->name, .pid = (uint64_t)getpid()};
    prl_bus_msg m;
    prl_status rc = prl_msg_hello_encode(&h, "-", ++S->next_id, &m);
    return rc ? rc : send_msg(w, &m);
}

static prl_status open_workers(sim *S, int n, const char *ep)
{
    int rollouts = n / 2, trainers = 1;
    for (int i = 0; i < n; i++) {
        sim_worker *w = &S->w[S->n++];
        w->role = i < rollouts ? "rollout" : i < n - trainers ? "reward" : "trainer";
        snprintf(w->name, sizeof w->name, "%s-%d", w->role, i);
        prl_bus_socket_options o;
        prl_bus_socket_options_default(&o);
        o.identity = w->name, o.name = w->name, o.registry = prl_msg_registry();
        o.secret = S->secret.hex;
        prl_status rc = prl_bus_socket_open(&w->s, PRL_BUS_DEALER, ep, &o);
        if (!rc) rc = hello(S, w);
        if (rc) return rc;
    }
    return PRL_OK;
}

static prl_status serve_one(sim *S, sim_worker *w)
{
    prl_bus_msg m;
    int got = 0;
    prl_status rc = prl_bus_recv(w->s, 0, &m, NULL, &got);
    if (rc || !got) return rc;
    if (!strcmp(m.type, "work")) rc = on_work(S, w, &m);
    else if (!strcmp(m.type, "score")) rc = on_score(S, w, &m);
    else if (!strcmp(m.type, "train")) rc = on_train(S, w, &m);
    else if (!strcmp(m.type, "error")) S->errors++;
    else if (!strcmp(m.type, "stop")) rc = prl_error_set(PRL_ERR_IO, "the controller stopped");
    prl_bus_msg_free(&m);
    return rc;
}

/* Poll every socket until t_end; heartbeats from idle workers once a second. */
static prl_status serve(sim *S, double t_end)
{
    zmq_pollitem_t items[MAX_SIM];
    for (int i = 0; i < S->n; i++)
        items[i] = (zmq_pollitem_t){prl_bus_socket_raw(S->w[i].s), 0, ZMQ_POLLIN, 0};
    prl_status rc = PRL_OK;
    while (!rc && prl_now() < t_end) {
        if (zmq_poll(items, S->n, 20) < 0 && zmq_errno() != EINTR)
            return prl_error_set(PRL_ERR_IO, "poll: %s", zmq_strerror(zmq_errno()));
        double now = prl_now();
        for (int i = 0; !rc && i < S->n; i++) {
            sim_worker *w = &S->w[i];
            if (items[i].revents & ZMQ_POLLIN) rc = serve_one(S, w);
            if (!rc && now - w->last_beat > 1.0) {
                prl_msg_heartbeat hb = {.worker = w->name};
                prl_bus_msg m;
                w->last_beat = now;
                if (!prl_msg_heartbeat_encode(&hb, "bench", ++S->next_id, &m)) rc = send_msg(w, &m);
            }
        }
    }
    return rc;
}

static void print_result(const sim *S, int workers, double secs, double ctl_cpu, double own_cpu,
                         int json)
{
    double leases = (double)(S->work + S->score + S->train);
    double per_s = leases / secs, cpu_share = ctl_cpu / secs;
    double us_per_lease = leases > 0 ? 1e6 * ctl_cpu / leases : 0;
    if (json) {
        printf("{\"workers\": %d, \"seconds\": %.1f, \"leases_per_s\": %.1f, \"work_per_s\": %.1f, "
               "\"score_per_s\": %.1f, \"train_per_s\": %.2f, \"controller_cpu\": %.3f, "
               "\"controller_cpu_us_per_lease\": %.1f, \"bench_cpu\": %.3f, \"errors\": %llu}\n",
               workers, secs, per_s, (double)S->work / secs, (double)S->score / secs,
               (double)S->train / secs, cpu_share, us_per_lease, own_cpu / secs,
               (unsigned long long)S->errors);
        return;
    }
    printf(
        "prl bench controller: %d simulated workers (%d rollout, %d reward, 1 trainer), %.1f s\n",
        workers, workers / 2, workers - workers / 2 - 1, secs);
    printf("  leases handed out   %.1f /s  (work %.1f, score %.1f, train %.2f = steps/s)\n", per_s,
           (double)S->work / secs, (double)S->score / secs, (double)S->train / secs);
    printf("  controller CPU      %.1f %% of one core, %.1f us per lease\n", 100 * cpu_share,
           us_per_lease);
    printf("  simulated workers   %.1f %% of one core (this process)\n", 100 * own_cpu / secs);
    if (us_per_lease > 0)
        printf("  one core of controller: at most ~%.0f leases/s\n", 1e6 / us_per_lease);
    printf("  errors from the controller: %llu\n", (unsigned long long)S->errors);
}

int cmd_bench_controller(int argc, char **argv)
{
    int workers = 64, json = 0;
    double seconds = 10;
    cli_opt opts[] = {
        {"workers", OPT_INT, &workers, "N", "simulated workers, 3..256 (default 64)", 0, 0},
        {"seconds", OPT_DOUBLE, &seconds, "S", "measured seconds (default 10; 60 for the docs)", 0,
         0},
        {"json", OPT_FLAG, &json, NULL, "print one JSON object", 0, 0},
        {0}};
    int pr = cli_parse(argc, argv, 3, opts, "prl bench controller [--workers N] [--seconds S]",
                       "A real controller with N simulated workers that answer at once: leases "
                       "handed out per second and the controller's CPU (docs/pipeline.md).",
                       NULL, 0, NULL);
    if (pr) return pr == CLI_HELP ? 0 : 2;
    if (workers < 3 || workers > MAX_SIM || !(seconds > 0 && seconds <= 3600))
        return cli_failf("bench controller", 2,
                         "--workers must be 3..%d and --seconds in (0, 3600]", MAX_SIM);
    static sim S0;
    sim *S = &S0;
    const char *tmp = bench_tmpdir("controller");
    if (!tmp) return cli_fail("bench controller");
    snprintf(S->dir, sizeof S->dir, "%s", tmp);
    prl_status rc = make_run(S);
    pid_t ctl = rc ? -1 : start_controller(S);
    char key[400], ep[400];
    snprintf(key, sizeof key, "%.250s/bus.key", S->dir);
    snprintf(ep, sizeof ep, "ipc://%.250s/control.sock", S->dir);
    for (int i = 0; !rc && i < 300 && access(ep + 6, F_OK); i++) usleep(20000);
    if (!rc && ctl < 0) rc = prl_error_set(PRL_ERR_IO, "fork: %s", strerror(errno));
    if (!rc) rc = prl_bus_key_load(key, &S->secret);
    if (!rc) rc = open_workers(S, workers, ep);
    if (!rc) rc = serve(S, prl_now() + 2.0); /* warm-up: every worker joined, steps going */
    double c0 = rc ? 0 : cpu_seconds(ctl), o0 = cpu_seconds(getpid()), t0 = prl_now();
    S->measuring = 1;
    if (!rc) rc = serve(S, t0 + seconds);
    double secs = prl_now() - t0, c1 = rc ? 0 : cpu_seconds(ctl), o1 = cpu_seconds(getpid());
    if (ctl > 0) kill(ctl, SIGTERM);
    for (int i = 0; i < S->n; i++) prl_bus_socket_free(S->w[i].s);
    if (ctl > 0) waitpid(ctl, NULL, 0);
    if (!rc) print_result(S, workers, secs, c1 - c0, o1 - o0, json);
    if (rc) {
        fprintf(stderr, "prl bench controller: %s\n", prl_error_message());
        bench_tmpdir_keep(); /* the controller's log stays for a look */
    }
    prl_bus_shutdown();
    return rc ? 1 : 0;
}
