/*
** test_roles_fuzz.c — 10,000 random and mutated messages sent to each role's socket: real
** `prl role ...` processes (PRL_BIN) over ipc:// in one fresh temp dir (docs/pipeline.md
** "Robustness").
**
**   - controller: `prl role controller --run DIR` with a small init checkpoint; DEALER
**     sockets with random identities and with the identities of workers that said hello
**     (rollout-0 holds a real lease), so the semantic checks run, not only the codec. Sent:
**     random parts, mutations of valid messages of every type, and well-formed messages with
**     wrong semantics (unknown lease, wrong step, result without its frames, `trained` for a
**     step not in flight, wrong run, huge counts, ...). Every decodable message the
**     controller does not act on must get an `error` naming the problem (ref = its id) and a
**     "rejected message" log line; every undecodable one a "dropped message" line with a
**     reason. Then: still alive, a new worker's hello gets a welcome, valid results of the
**     leased work are taken (a `score` goes to the reward worker) and a valid `scored` too;
**     the train lease's `trained` is refused for a checkpoint outside the run's ckpt/ and
**     for weights that do not match the announced checksum, and taken when both are right.
**   - rollout, reward, trainer, teacher: the test is the controller (a ROUTER), welcomes the role,
**     then sends it random parts, mutations of valid messages of every type and of its work
**     type (`work`, `score`, `train`, `teach`), and work items with one thing wrong. Each decodable
**     work item gets an `error` (the role's refuse) or its answer; each other message is
**     logged as ignored; each undecodable one as dropped. Then one valid item must get the
**     right answer and `stop` must end the role with status 0.
**
** The temp dir is made with mkdtemp under /tmp and removed with nftw (no symlinks
** followed) only if its name has the expected prefix.
**
** Longer than ~800 lines on purpose: one Check suite per module, whose cases share the
** fixtures and helpers at its top (split by case, they would be repeated or moved to a header
** with one reader).
*/
#include "bus/bus.h"
#include "engine/model.h"
#include "tests/bus_fuzz.h"
#include "tests/check_util.h"

#include <check.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

enum { N_RANDOM = 5000, N_MUTATED = 5000, G = 2 };
#define RUN "run-1" /* the run name of bus_fuzz.c's make_msg: its messages reach the semantics */

static char dir[64], base_ckpt[128], run_dir[128], job_json[1024], task_json[4096];
/* the bus keys (docs/protocol.md): beside the fake controllers' sockets, and the run's */
static prl_bus_secret dir_key, run_key;

/* ---------------------------------------------------------------- helpers ---------- */

static uint64_t rnd(prl_rng *r, uint64_t n) { return prl_rng_u64(r) % n; }

/* Start `prl ARGV...` with PRL_THREADS=1, stdout and stderr appended to `log`; it is killed
** when the test's process ends. */
static pid_t spawn(const char *log, const char *const *argv)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test's process takes its role along */
        setenv("PRL_THREADS", "1", 1);
        execv(PRL_BIN, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static void assert_alive(pid_t pid, const char *who)
{
    int st = 0;
    ck_assert_msg(waitpid(pid, &st, WNOHANG) == 0, "%s died (status 0x%x)", who, st);
}

/* Wait up to timeout_s for pid to exit; its status, or SIGKILL and a failure. */
static int wait_exit(pid_t pid, double timeout_s)
{
    double t0 = prl_now();
    int st = 0;
    while (prl_now() - t0 < timeout_s) {
        if (waitpid(pid, &st, WNOHANG) == pid) return st;
        usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    ck_abort_msg("process %d did not exit within %.0f s", (int)pid, timeout_s);
    return -1;
}

/* Lines of `log` containing `what`; with need_reason each must go on with a non-empty
** reason after ": ". */
/* Lines of `what` in the log, those the rate limit held back included: a "held back: N more
** 'KIND' lines" line counts N (bus.h, prl_bus_log_limit). */
static int count_lines(const char *log, const char *what, const char *kind, int need_reason)
{
    FILE *f = fopen(log, "r");
    ck_assert_ptr_nonnull(f);
    static const char tail[] = "' lines (at most one a second";
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        const char *h = strstr(line, "held back: ");
        unsigned long long k;
        char got[64];
        if (h && sscanf(h, "held back: %llu more '%63[^']", &k, got) == 2 && strstr(h, tail)) {
            if (!strcmp(got, kind)) n += (int)k;
            continue;
        }
        const char *p = strstr(line, what);
        if (!p) continue;
        n++;
        const char *r = need_reason ? strstr(p + strlen(what), ": ") : NULL;
        ck_assert_msg(!need_reason || (r && r[2] != '\n' && r[2] != 0), "no reason: %s", line);
    }
    fclose(f);
    return n;
}

static void wc_send(void *zs, const prl_bus_peer *to, const wcopy *c)
{
    if (to) ck_assert_int_ge(zmq_send(zs, to->id, to->len, ZMQ_SNDMORE), 0);
    for (int i = 0; i < c->n; i++)
        ck_assert_int_ge(zmq_send(zs, c->buf[i], c->len[i], i + 1 < c->n ? ZMQ_SNDMORE : 0), 0);
}

static void set_u(prl_bus_msg *m, const char *k, uint64_t v)
{
    ck_assert_msg(prl_bus_msg_set_uint(m, k, v) == PRL_OK, "%s: %s", k, prl_error_message());
}

static void set_s(prl_bus_msg *m, const char *k, const char *v)
{
    ck_assert_msg(prl_bus_msg_set_str(m, k, v) == PRL_OK, "%s: %s", k, prl_error_message());
}

static void add_f(prl_bus_msg *m, const char *name, prl_bus_dtype d, const void *p, size_t n)
{
    ck_assert_msg(prl_bus_msg_add_frame(m, name, d, p, n) == PRL_OK, "%s: %s", name,
                  prl_error_message());
}

static void add_text(prl_bus_msg *m, const char *name, const char *text)
{
    add_f(m, name, PRL_BUS_BYTES, text, strlen(text));
}

static uint64_t get_u(const prl_bus_msg *m, const char *k)
{
    uint64_t v = 0;
    ck_assert_msg(prl_bus_msg_get_uint(m, k, &v) == PRL_OK, "'%s' has no %s", m->type, k);
    return v;
}

typedef struct tally {
    int sent, codec, refused, ignored, accepted, log_only, stops;
} tally;

static void print_tally(const char *role, const tally *t)
{
    fprintf(stderr,
            "roles_fuzz %-10s %d sent: %d rejected by the codec (logged), %d rejected by "
            "the role with an error reply, %d ignored with a log line, %d rejected with a "
            "log line only, %d accepted; %d valid stops not sent\n",
            role, t->sent, t->codec, t->refused, t->ignored, t->log_only, t->accepted, t->stops);
}

/* The it-th fuzz message: random parts first, then mutations of valid messages of every
** type and of `seed`'s messages (the role's own items, mostly with one thing wrong), and
** seed messages as they are. keep_semantics: a mutated seed message that still decodes is
** replaced by the seed itself (the controller's seeds are exactly wrong; a mutation could
** make one right). */
typedef void (*seed_fn)(void *ctx, prl_rng *r, prl_bus_msg *m);

static void fuzz_make(prl_rng *r, int it, seed_fn seed, void *ctx, int keep_semantics, wcopy *c)
{
    memset(c, 0, sizeof *c);
    if (it < N_RANDOM) {
        c->n = 1 + (int)rnd(r, PRL_BUS_MAX_PARTS + 3);
        for (int i = 0; i < c->n; i++) random_part(r, c, i);
        return;
    }
    prl_bus_msg m;
    int kind = (int)rnd(r, 3);
    if (kind == 0) {
        const char *type = prl_msg_registry()->types[rnd(r, (uint64_t)prl_msg_registry()->n)]->type;
        make_msg(&m, type, r, (int)rnd(r, 2), (int)rnd(r, 3));
    } else {
        seed(ctx, r, &m);
    }
    wc_from_msg(c, &m);
    if (kind != 2) {
        mutate(r, c, (int)rnd(r, MUTATION_KINDS));
        prl_bus_msg d;
        if (kind == 1 && keep_semantics && wc_decode(c, &d, NULL, 0) == PRL_OK) {
            prl_bus_msg_free(&d);
            wc_free(c);
            wc_from_msg(c, &m);
        }
    }
    prl_bus_msg_free(&m);
}

/* ---------------------------------------------------------------- workers ---------- */

/* The items a worker role takes, with defect `k` (0: none). */
static void work_item(prl_rng *r, prl_bus_msg *m, int k)
{
    ck_assert_int_eq(prl_bus_msg_init(m, prl_msg_spec("work"), RUN, rnd(r, 100000)), PRL_OK);
    set_u(m, "lease", 1 + rnd(r, 1000));
    set_u(m, "step", rnd(r, 50));
    set_u(m, "prompt", rnd(r, 8));
    set_u(m, "sample", k == 9 ? (uint64_t)1 << 40 : 0);
    set_u(m, "policy_version", 0);
    if (k != 10) set_u(m, "count", k == 1 ? 0 : k == 2 ? 5000 : G);
    char nowhere[160];
    snprintf(nowhere, sizeof nowhere, "%s/nowhere", dir);
    if (k != 11) set_s(m, "path", k == 3 ? nowhere : k == 4 ? dir : base_ckpt);
    if (k == 8) {
        int32_t x[3] = {1, 2, 3};
        add_f(m, "task", PRL_BUS_I32, x, 3);
    } else if (k == 12) {
        add_f(m, "task", PRL_BUS_BYTES, "{\"id\": \"x\0\"}", 12);
    } else if (k != 5) {
        add_text(m, "task", k == 6 ? "not json" : k == 7 ? "[1, 2]" : k == 13 ? "{}" : task_json);
    }
}

/* Defect k of n for a seed item: 0 (none) once in 40. */
static int defect(prl_rng *r, int n) { return rnd(r, 40) ? 1 + (int)rnd(r, (uint64_t)n) : 0; }

static void work_seed(void *ctx, prl_rng *r, prl_bus_msg *m)
{
    (void)ctx;
    work_item(r, m, defect(r, 13));
}

static void score_item(prl_rng *r, prl_bus_msg *m, int k)
{
    ck_assert_int_eq(prl_bus_msg_init(m, prl_msg_spec("score"), RUN, rnd(r, 100000)), PRL_OK);
    set_u(m, "lease", 1 + rnd(r, 1000));
    set_u(m, "step", rnd(r, 50));
    set_u(m, "prompt", rnd(r, 8));
    set_u(m, "sample", rnd(r, G));
    static const char *const tasks[] = {NULL,
                                        "not json",
                                        "{}",
                                        NULL,
                                        NULL,
                                        NULL,
                                        NULL,
                                        "{\"id\": \"x\", \"domain\": \"coding\"}",
                                        "{\"id\": \"x\", \"domain\": \"nope\", \"messages\": []}",
                                        NULL,
                                        NULL,
                                        NULL};
    static const char *const turns[] = {
        "[{\"role\": \"assistant\", \"content\": \"- rain\\n- more rain\\n- puddles\"}]",
        NULL,
        NULL,
        "not json",
        "{}",
        "[1, 2]",
        "[{\"role\": \"assistant\"}]",
        NULL,
        NULL,
        "[]",
        "[{\"role\": 7, \"content\": []}]",
        NULL};
    add_text(m, "task", tasks[k] ? tasks[k] : task_json);
    if (k == 11) { /* 200 KB of content */
        size_t n = 200000;
        char *big = malloc(n + 64);
        strcpy(big, "[{\"role\": \"assistant\", \"content\": \"");
        size_t at = strlen(big);
        memset(big + at, 'a', n);
        strcpy(big + at + n, "\"}]");
        add_text(m, "turns", big);
        free(big);
    } else {
        add_text(m, "turns", turns[k] ? turns[k] : turns[0]);
    }
}

static void score_seed(void *ctx, prl_rng *r, prl_bus_msg *m)
{
    (void)ctx;
    score_item(r, m, defect(r, 11));
}

/* Two samples of one group: 3 prompt and 3 response tokens each. */
static void train_item(prl_rng *r, prl_bus_msg *m, int k)
{
    ck_assert_int_eq(prl_bus_msg_init(m, prl_msg_spec("train"), RUN, rnd(r, 100000)), PRL_OK);
    char nowhere[160];
    snprintf(nowhere, sizeof nowhere, "%s/nowhere", dir);
    set_u(m, "lease", 1 + rnd(r, 1000));
    set_u(m, "step", rnd(r, 50));
    set_u(m, "policy_version", k == 10 ? 5 : k == 11 ? (uint64_t)1 << 40 : 0);
    set_s(m, "path", k == 9 ? nowhere : base_ckpt);
    set_u(m, "count", k == 1 ? 0 : k == 2 ? (uint64_t)1 << 40 : 2);
    int32_t tok[12], off[3] = {0, 6, 12}, plen[2] = {3, 3}, grp[2] = {0, 0};
    float rew[2] = {0, 1}, lp[6];
    uint8_t mask[6];
    for (int i = 0; i < 12; i++) tok[i] = 5 + (int32_t)rnd(r, 200);
    for (int i = 0; i < 6; i++) lp[i] = -0.5f - (float)rnd(r, 3), mask[i] = 1;
    if (k == 3) off[1] = 13;
    if (k == 4) tok[4] = 100000;
    if (k == 5) tok[2] = -3;
    if (k == 6) plen[1] = 9;
    if (k == 7) rew[0] = NAN;
    if (k == 8) lp[1] = INFINITY;

    add_f(m, "tokens", PRL_BUS_I32, tok, 12);
    add_f(m, "offsets", PRL_BUS_I32, off, 3);
    add_f(m, "prompt_lens", PRL_BUS_I32, plen, 2);
    add_f(m, "rewards", PRL_BUS_F32, rew, 2);
    add_f(m, "groups", PRL_BUS_I32, grp, k == 13 ? 1 : 2);
    add_f(m, "logprobs", PRL_BUS_F32, lp, 6);
    add_f(m, "mask", PRL_BUS_U8, mask, k == 12 ? 5 : 6);
}

static void train_seed(void *ctx, prl_rng *r, prl_bus_msg *m)
{
    (void)ctx;
    train_item(r, m, defect(r, 13));
}

typedef struct role_case {
    const char *role, *work, *answer;
    seed_fn seed;
    void (*item)(prl_rng *r, prl_bus_msg *m, int k);
} role_case;

/* Check an answer to item `w`: the same lease, and its content. */
/* A `teach` item (OPD, docs/opd.md): two samples of 6 tokens; k > 0 puts one thing wrong. */
static void teach_item(prl_rng *r, prl_bus_msg *m, int k)
{
    ck_assert_int_eq(prl_bus_msg_init(m, prl_msg_spec("teach"), RUN, rnd(r, 100000)), PRL_OK);
    char nowhere[160];
    snprintf(nowhere, sizeof nowhere, "%s/nowhere", dir);
    set_u(m, "lease", 1 + rnd(r, 1000));
    set_u(m, "step", rnd(r, 50));
    set_s(m, "teacher", k == 7 ? "chess" : "coding");
    set_s(m, "path", k == 8 ? nowhere : base_ckpt);
    set_u(m, "count", k == 1 ? 0 : k == 2 ? (uint64_t)1 << 40 : 2);
    int32_t tok[12], off[3] = {0, 6, 12}, plen[2] = {3, 3};
    uint8_t mask[6];
    for (int i = 0; i < 12; i++) tok[i] = 5 + (int32_t)rnd(r, 200);
    for (int i = 0; i < 6; i++) mask[i] = i != 4;
    if (k == 3) off[1] = 13;
    if (k == 4) tok[4] = 100000;
    if (k == 5) tok[2] = -3;
    if (k == 6) plen[1] = 9;
    if (k == 9) mask[2] = 2;
    add_f(m, "tokens", PRL_BUS_I32, tok, 12);
    add_f(m, "offsets", PRL_BUS_I32, off, 3);
    add_f(m, "prompt_lens", PRL_BUS_I32, plen, 2);
    add_f(m, "mask", PRL_BUS_U8, mask, k == 10 ? 5 : 6);
}

static void teach_seed(void *ctx, prl_rng *r, prl_bus_msg *m)
{
    (void)ctx;
    teach_item(r, m, defect(r, 10));
}

static void check_answer(const role_case *rc, const prl_bus_msg *w, const prl_bus_msg *a)
{
    ck_assert_str_eq(a->type, rc->answer);
    ck_assert_uint_eq(get_u(a, "lease"), get_u(w, "lease"));
    ck_assert_uint_eq(get_u(a, "step"), get_u(w, "step"));
    if (!strcmp(rc->role, "rollout")) {
        uint64_t plen = get_u(a, "prompt_len");
        const prl_bus_frame *tok = prl_bus_msg_frame(a, "tokens"),
                            *lp = prl_bus_msg_frame(a, "logprobs");
        ck_assert_uint_gt(tok->count, plen);
        ck_assert_uint_eq(lp->count, tok->count - plen);
        ck_assert_ptr_nonnull(prl_bus_msg_frame(a, "meta"));
    } else if (!strcmp(rc->role, "teacher")) { /* one log-prob per response token, 0 off the mask */
        const prl_bus_frame *lp = prl_bus_msg_frame(a, "logprobs");
        ck_assert_uint_eq(lp->count, 6);
        const float *v = lp->data;
        for (int i = 0; i < 6; i++) ck_assert(i == 4 ? v[i] == 0 : (isfinite(v[i]) && v[i] <= 0));
        ck_assert_uint_gt(get_u(a, "peak_rss_kb"), 0);
    } else if (!strcmp(rc->role, "reward")) {
        const prl_bus_frame *d = prl_bus_msg_frame(a, "detail");
        json_t *j = json_loadb(d->data, d->bytes, 0, NULL);
        double s = json_number_value(json_object_get(j, "score"));
        ck_assert_msg(json_is_number(json_object_get(j, "score")) && s >= 0 && s <= 1,
                      "detail %.*s", (int)d->bytes, (const char *)d->data);
        json_decref(j);
    } else {
        const char *path = NULL;
        ck_assert_uint_eq(get_u(a, "version"), get_u(w, "policy_version") + 1);
        ck_assert_int_eq(prl_bus_msg_get_str(a, "path", &path), PRL_OK);
        char f[1200];
        snprintf(f, sizeof f, "%s/model.safetensors", path);
        ck_assert_msg(access(f, R_OK) == 0, "no checkpoint at %s", path);
        const prl_bus_frame *mt = prl_bus_msg_frame(a, "metrics");
        json_t *j = json_loadb(mt->data, mt->bytes, 0, NULL);
        ck_assert(json_is_object(j));
        json_decref(j);
    }
}

static pid_t role_pid; /* the worker under test */

/* A message from the role, skipping its hellos and heartbeats; 0 on timeout. The role must
** stay alive while we wait. */
static int role_recv(prl_bus_socket *s, int timeout_ms, prl_bus_msg *m)
{
    double end = prl_now() + timeout_ms / 1000.0;
    for (;;) {
        int left = (int)((end - prl_now()) * 1000), got = 0;
        ck_assert_int_eq(prl_bus_recv(s,
                                      left > 500 ? 500
                                      : left > 0 ? left
                                                 : 0,
                                      m, NULL, &got),
                         PRL_OK);
        if (!got && left > 500) {
            assert_alive(role_pid, "the role");
            continue;
        }
        if (!got) return 0;
        if (strcmp(m->type, "heartbeat") && strcmp(m->type, "hello")) return 1;
        prl_bus_msg_free(m);
    }
}

/* After sending work item w: an `error` naming it, or its answer(s). Returns 1 if answered. */
static int await_item(const role_case *rc, prl_bus_socket *s, const prl_bus_msg *w, tally *t)
{
    uint64_t want = 1, got = 0;
    if (!strcmp(rc->role, "rollout")) prl_bus_msg_get_uint(w, "count", &want);
    for (;;) {
        prl_bus_msg a;
        ck_assert_msg(role_recv(s, 60000, &a), "no answer to a valid '%s' within 60 s", w->type);
        if (!strcmp(a.type, "error") && got == 0) {
            const char *why = NULL;
            ck_assert_int_eq(prl_bus_msg_get_str(&a, "reason", &why), PRL_OK);
            ck_assert_uint_eq(get_u(&a, "ref"), get_u(w, "id"));
            ck_assert_uint_eq(get_u(&a, "lease"), get_u(w, "lease"));
            prl_bus_msg_free(&a);
            t->refused++;
            return 0;
        }
        check_answer(rc, w, &a);
        prl_bus_msg_free(&a);
        if (++got == want) {
            t->accepted++;
            return 1;
        }
    }
}

static void run_role(const role_case *rc)
{
    char ep[160], log[128], name[32], sock[128];
    snprintf(sock, sizeof sock, "%s/%s.sock", dir, rc->role);
    snprintf(ep, sizeof ep, "ipc://%s", sock);
    snprintf(log, sizeof log, "%s/%s.log", dir, rc->role);
    snprintf(name, sizeof name, "%s-0", rc->role);
    prl_bus_socket *s = NULL;
    prl_bus_socket_options o;
    prl_bus_socket_options_default(&o);
    o.registry = prl_msg_registry(), o.secret = dir_key.hex;
    o.bind = 1, o.name = "fake-controller";
    ck_assert_int_eq(prl_bus_socket_open(&s, PRL_BUS_ROUTER, ep, &o), PRL_OK);
    const char *argv[] = {"prl", "role", rc->role, "--connect", ep, "--name", name, NULL};
    pid_t pid = spawn(log, argv);
    role_pid = pid;

    /* hello -> welcome */
    prl_bus_msg m;
    prl_bus_peer peer;
    int got = 0;
    double t0 = prl_now();
    do {
        ck_assert_int_eq(prl_bus_recv(s, 1000, &m, &peer, &got), PRL_OK);
        if (got && strcmp(m.type, "hello")) prl_bus_msg_free(&m), got = 0;
    } while (!got && prl_now() - t0 < 30);
    ck_assert_msg(got, "%s said no hello", rc->role);
    prl_bus_msg_free(&m);
    ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("welcome"), RUN, 1), PRL_OK);
    set_s(&m, "run_dir", run_dir);
    set_u(&m, "seed", 7);
    add_text(&m, "config", job_json);
    ck_assert_int_eq(prl_bus_send(s, &peer, &m), PRL_OK);
    prl_bus_msg_free(&m);

    prl_rng r;
    prl_rng_init(&r, 23, (uint64_t)rc->role[0], 0, 0, PRL_RNG_TEST);
    tally t = {0};
    double tf = prl_now();
    for (int it = 0; it < N_RANDOM + N_MUTATED; it++) {
        wcopy c;
        fuzz_make(&r, it, rc->seed, NULL, 0, &c);
        int valid = wc_decode(&c, &m, NULL, 0) == PRL_OK;
        if (c.n == 0 || (valid && !strcmp(m.type, "stop"))) {
            t.stops += valid;
        } else {
            wc_send(prl_bus_socket_raw(s), &peer, &c);
            t.sent++;
            if (!valid) t.codec++;
            else if (!strcmp(m.type, rc->work)) await_item(rc, s, &m, &t);
            else t.ignored++;
            prl_bus_msg x; /* nothing else may come back */
            if (role_recv(s, 0, &x)) ck_abort_msg("unexpected '%s' from %s", x.type, rc->role);
        }
        if (valid) prl_bus_msg_free(&m);
        wc_free(&c);
    }
    double fuzz_s = prl_now() - tf;
    assert_alive(pid, rc->role);

    /* still working: one valid item gets the right answer */
    rc->item(&r, &m, 0);
    ck_assert_int_eq(prl_bus_send(s, &peer, &m), PRL_OK);
    tally final = {0};
    ck_assert_msg(await_item(rc, s, &m, &final), "the valid %s after the fuzz was refused", m.type);
    prl_bus_msg_free(&m);

    /* stop ends it */
    ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("stop"), RUN, 2), PRL_OK);
    ck_assert_int_eq(prl_bus_send(s, &peer, &m), PRL_OK);
    prl_bus_msg_free(&m);
    int st = wait_exit(pid, 30);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s exit status 0x%x", rc->role, st);
    prl_bus_socket_free(s);
    unlink(sock);

    print_tally(rc->role, &t);
    fprintf(stderr, "roles_fuzz %-10s fuzz took %.1f s\n", rc->role, fuzz_s);
    ck_assert_int_ge(t.sent, 9000);
    ck_assert_int_gt(t.refused, 1000);
    ck_assert_int_gt(t.accepted, 10);
    ck_assert_int_eq(count_lines(log, "dropped message", "dropped message", 1), t.codec);
    ck_assert_int_eq(count_lines(log, "] cannot ", "", 1), t.refused);
    ck_assert_int_eq(count_lines(log, "] ignored a '", "ignored message", 0) +
                         count_lines(log, "] controller: ", "controller error", 0),
                     t.ignored);
}

START_TEST(test_rollout_fuzz)
{
    role_case rc = {"rollout", "work", "result", work_seed, work_item};
    run_role(&rc);
}
END_TEST

START_TEST(test_reward_fuzz)
{
    role_case rc = {"reward", "score", "scored", score_seed, score_item};
    run_role(&rc);
}
END_TEST

START_TEST(test_teacher_fuzz)
{
    role_case rc = {"teacher", "teach", "taught", teach_seed, teach_item};
    run_role(&rc);
}
END_TEST

START_TEST(test_trainer_fuzz)
{
    role_case rc = {"trainer", "train", "trained", train_seed, train_item};
    run_role(&rc);
}
END_TEST

/* ---------------------------------------------------------------- controller ------- */

enum { ROLLOUT, REWARD, TRAINER, N_WORKERS = 3, N_SOCKS = 6 };
static const char *const worker_names[] = {"rollout-0", "reward-0", "trainer-0"};

typedef struct csock {
    prl_bus_socket *s;
    char id[32];
    int worker; /* said hello */
} csock;

typedef struct cstate {
    csock k[N_SOCKS];
    uint64_t lease, step, prompt; /* rollout-0's work */
    uint64_t score_lease, score_sample;
    int have_score;
    int from; /* the sender of the message being made */
} cstate;

/* The next message on k that is not a lease handed to our workers (those are recorded). */
static int ctl_recv(cstate *S, csock *k, int timeout_ms, prl_bus_msg *m)
{
    double end = prl_now() + timeout_ms / 1000.0;
    for (;;) {
        int left = (int)((end - prl_now()) * 1000), got = 0;
        ck_assert_int_eq(prl_bus_recv(k->s, left > 0 ? left : 0, m, NULL, &got), PRL_OK);
        if (!got) return 0;
        if (!strcmp(m->type, "work") && k == &S->k[ROLLOUT]) {
            S->lease = get_u(m, "lease"), S->step = get_u(m, "step"),
            S->prompt = get_u(m, "prompt");
        } else if (!strcmp(m->type, "score") && k == &S->k[REWARD]) {
            S->score_lease = get_u(m, "lease"), S->score_sample = get_u(m, "sample");
            S->have_score = 1;
        } else {
            return 1;
        }
        prl_bus_msg_free(m);
    }
}

/* The next score lease to reward-0 (within 5 s), nothing else. */
static void await_score(cstate *S, const char *after)
{
    prl_bus_msg m;
    for (double t0 = prl_now(); !S->have_score && prl_now() - t0 < 5;)
        if (ctl_recv(S, &S->k[REWARD], 100, &m)) ck_abort_msg("after %s: a '%s'", after, m.type);
    ck_assert_msg(S->have_score, "no score lease after %s", after);
}

/* A result of rollout-0's work item, right in every respect. */
static void good_result(const cstate *S, prl_bus_msg *m, uint64_t sample, uint64_t id)
{
    ck_assert_int_eq(prl_bus_msg_init(m, prl_msg_spec("result"), RUN, id), PRL_OK);
    set_u(m, "lease", S->lease);
    set_u(m, "step", S->step);
    set_u(m, "prompt", S->prompt);
    set_u(m, "sample", sample);
    set_u(m, "policy_version", 0);
    set_u(m, "prompt_len", 3);
    int32_t tok[5] = {4, 9, 17, 30, 2};
    float lp[2] = {-0.7f, -1.2f};
    uint8_t mask[2] = {1, 1};
    add_f(m, "tokens", PRL_BUS_I32, tok, 5);
    add_f(m, "logprobs", PRL_BUS_F32, lp, 2);
    add_f(m, "mask", PRL_BUS_U8, mask, 2);
    add_text(m, "meta",
             "{\"turns\": [{\"role\": \"assistant\", \"content\": \"- a\\n- b\\n- c\"}]}");
}

/* A result with defect k (1..14): well-formed, wrong in one respect. */
static void bad_result(const cstate *S, prl_rng *r, prl_bus_msg *m, int k)
{
    uint64_t id = rnd(r, 100000);
    ck_assert_int_eq(prl_bus_msg_init(m, prl_msg_spec("result"), k == 10 ? "run-2" : RUN, id),
                     PRL_OK);
    set_u(m, "lease", k == 1 ? S->lease + 1 + rnd(r, 1000) : S->lease);
    set_u(m, "step", k == 2 ? S->step + 1 + rnd(r, 5) : S->step);
    set_u(m, "prompt", k == 13 ? S->prompt + 100 + rnd(r, 100) : S->prompt);
    set_u(m, "sample", k == 6 ? G + rnd(r, 1000) : rnd(r, G));
    set_u(m, "policy_version", k == 5 ? 1 + rnd(r, 100) : 0);
    if (k != 14) set_u(m, "prompt_len", k == 3 ? (uint64_t)INT64_MAX : k == 4 ? 0 : 3);
    size_t n = k == 11 && rnd(r, 20) == 0 ? (1u << 20) + 8 : 5; /* huge: 4 MiB of tokens */
    int32_t *tok = calloc(n, sizeof *tok);
    for (size_t i = 0; i < n; i++) tok[i] = (int32_t)rnd(r, 300);
    if (k == 9) tok[rnd(r, 5)] = -1 - (int32_t)rnd(r, 1000);
    float lp[3] = {-0.7f, k == 7 ? 0.5f : -1.2f, -0.1f};
    uint8_t mask[2] = {1, k == 8 ? 2 : 1};
    add_f(m, "tokens", PRL_BUS_I32, tok, n);
    free(tok);
    add_f(m, "logprobs", PRL_BUS_F32, lp, k == 12 ? 3 : 2);
    if (k == 15) return; /* a result without its mask and meta frames */
    add_f(m, "mask", PRL_BUS_U8, mask, 2);
    add_text(m, "meta",
             k == 11 && n == 5 ? "not json"
                               : "{\"turns\": [{\"role\": \"assistant\", \"content\": \"x\"}]}");
}

/* Well-formed messages with wrong semantics, and their sender. */
static void ctl_seed(void *ctx, prl_rng *r, prl_bus_msg *m)
{
    cstate *S = ctx;
    int k = (int)rnd(r, 22);
    S->from = ROLLOUT;
    if (k >= 1 && k <= 15) {
        bad_result(S, r, m, k);
        return;
    }
    if (k == 16) { /* a valid result from the wrong role */
        good_result(S, m, rnd(r, G), rnd(r, 100000));
        S->from = REWARD;
        return;
    }
    if (k == 0 || k == 17) { /* a score for a sample not generated (or not leased to it) */
        S->from = REWARD;
        ck_assert_int_eq(prl_bus_msg_init(m, prl_msg_spec("scored"), RUN, rnd(r, 100000)), PRL_OK);
        set_u(m, "lease", k == 0 ? S->lease : 1 + rnd(r, 50));
        set_u(m, "step", S->step);
        set_u(m, "prompt", S->prompt);
        set_u(m, "sample", rnd(r, G + 2));
        set_u(m, "score_us", 10);
        add_text(m, "detail", "{\"score\": 1}");
        return;
    }
    if (k == 18 || k == 19) { /* trained for the step in flight's numbers, but no train is leased */
        S->from = TRAINER;
        ck_assert_int_eq(prl_bus_msg_init(m, prl_msg_spec("trained"), RUN, rnd(r, 100000)), PRL_OK);
        set_u(m, "lease", k == 18 ? S->lease : rnd(r, 50));
        set_u(m, "step", k == 18 ? S->step : S->step + rnd(r, 4));
        set_u(m, "version", k == 18 ? S->step + 1 : rnd(r, 4));
        set_s(m, "path", base_ckpt); /* a real directory */
        ck_assert_int_eq(prl_bus_msg_set_hex64(m, "ckpt_checksum", prl_rng_u64(r)), PRL_OK);
        set_u(m, "train_us", 5);
        add_text(m, "metrics", "{}");
        return;
    }
    /* hello: another worker's name, an unknown role, or a heartbeat for nobody */
    S->from = N_WORKERS + (int)rnd(r, N_SOCKS - N_WORKERS);
    if (k == 21) {
        ck_assert_int_eq(prl_bus_msg_init(m, prl_msg_spec("heartbeat"), RUN, rnd(r, 100000)),
                         PRL_OK);
        set_s(m, "worker", "nobody-7");
        return;
    }
    ck_assert_int_eq(prl_bus_msg_init(m, prl_msg_spec("hello"), "-", rnd(r, 100000)), PRL_OK);
    set_s(m, "role", k == 20 ? "judge" : "rollout");
    set_s(m, "worker", k == 20 ? S->k[S->from].id : worker_names[rnd(r, N_WORKERS)]);
}

/* What the controller must do with valid message m from k: 1 reply with an error, 0 accept
** (or, *log_only, reject with a log line only: a heartbeat's socket reads nothing). */
static int ctl_expect_reply(const cstate *S, const csock *k, const prl_bus_msg *m, int *log_only)
{
    const char *run = NULL, *name = NULL;
    *log_only = 0;
    if (!strcmp(m->type, "heartbeat")) {
        prl_bus_msg_get_str(m, "worker", &name);
        int known = 0;
        for (int i = 0; i < N_SOCKS; i++) known |= S->k[i].worker && !strcmp(S->k[i].id, name);
        *log_only = !known;
        return 0;
    }
    if (!strcmp(m->type, "hello") || !k->worker) return 1;
    prl_bus_msg_get_str(m, "run", &run);
    if (strcmp(run, RUN)) return 1;
    return strcmp(m->type, "error") && strcmp(m->type, "ack");
}

static void hello(cstate *S, csock *k, const char *role)
{
    prl_bus_msg m;
    ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("hello"), "-", 1), PRL_OK);
    set_s(&m, "role", role);
    set_s(&m, "worker", k->id);
    ck_assert_int_eq(prl_bus_send(k->s, NULL, &m), PRL_OK);
    prl_bus_msg_free(&m);
    ck_assert_msg(ctl_recv(S, k, 10000, &m), "no welcome for %s", k->id);
    ck_assert_str_eq(m.type, "welcome");
    prl_bus_msg_free(&m);
    k->worker = 1;
}

static void sock_open(csock *k, const char *ep, const char *id)
{
    prl_bus_socket_options o;
    prl_bus_socket_options_default(&o);
    o.registry = prl_msg_registry(), o.secret = run_key.hex;
    snprintf(k->id, sizeof k->id, "%s", id);
    o.identity = k->id, o.name = k->id;
    ck_assert_int_eq(prl_bus_socket_open(&k->s, PRL_BUS_DEALER, ep, &o), PRL_OK);
}

/* A valid `scored` for reward-0's score lease. */
static void send_good_score(cstate *S, uint64_t id)
{
    prl_bus_msg m;
    ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("scored"), RUN, id), PRL_OK);
    set_u(&m, "lease", S->score_lease);
    set_u(&m, "step", S->step);
    set_u(&m, "prompt", S->prompt);
    set_u(&m, "sample", S->score_sample);
    set_u(&m, "score_us", 10);
    add_text(&m, "detail", "{\"score\": 1, \"flags\": 0}");
    ck_assert_int_eq(prl_bus_send(S->k[REWARD].s, NULL, &m), PRL_OK);
    prl_bus_msg_free(&m);
    S->have_score = 0;
}

/* Send `trained` for the train lease with `path` and `sum`; the controller's answer must be
** an error naming `want` (and the train leased again: *train becomes the new lease), or
** (want NULL) nothing. */
static void send_trained(cstate *S, prl_bus_msg *train, const char *path, uint64_t sum, uint64_t id,
                         const char *want)
{
    prl_bus_msg m;
    ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("trained"), RUN, id), PRL_OK);
    set_u(&m, "lease", get_u(train, "lease"));
    set_u(&m, "step", get_u(train, "step"));
    set_u(&m, "version", get_u(train, "policy_version") + 1);
    set_s(&m, "path", path);
    ck_assert_int_eq(prl_bus_msg_set_hex64(&m, "ckpt_checksum", sum), PRL_OK);
    set_u(&m, "train_us", 5);
    add_text(&m, "metrics", "{}");
    ck_assert_int_eq(prl_bus_send(S->k[TRAINER].s, NULL, &m), PRL_OK);
    prl_bus_msg_free(&m);
    int got = ctl_recv(S, &S->k[TRAINER], want ? 5000 : 500, &m);
    if (!want) {
        ck_assert_msg(!got, "a right checkpoint was answered with '%s'", m.type);
        return;
    }
    ck_assert_msg(got, "a trained naming %s was accepted", path);
    const char *why = NULL;
    ck_assert_str_eq(m.type, "error");
    ck_assert_int_eq(prl_bus_msg_get_str(&m, "reason", &why), PRL_OK);
    ck_assert_msg(strstr(why, want), "reason '%s' does not name '%s'", why, want);
    prl_bus_msg_free(&m);
    ck_assert_msg(ctl_recv(S, &S->k[TRAINER], 5000, &m), "the refused train was not leased again");
    ck_assert_str_eq(m.type, "train");
    prl_bus_msg_free(train);
    *train = m;
}

/* The step's scores are given until the train lease comes; then a checkpoint outside the
** run's ckpt/, one whose weights do not match the announced checksum, and the right one.
** Returns the errors it caused. */
static int trained_checks(cstate *S)
{
    prl_bus_msg train;
    int got = 0;
    for (double t0 = prl_now(); !got && prl_now() - t0 < 20;) {
        if (S->have_score) send_good_score(S, 900300 + (uint64_t)(prl_now() * 10) % 1000);
        ctl_recv(S, &S->k[REWARD], 50, &train) ? ck_abort_msg("a '%s' to reward-0", train.type)
                                               : (void)0;
        got = ctl_recv(S, &S->k[TRAINER], 50, &train);
    }
    ck_assert_msg(got, "no train lease after every sample was scored");
    ck_assert_str_eq(train.type, "train");
    char want[200], cmd[600];
    snprintf(want, sizeof want, "%s/ckpt/v%06llu", run_dir,
             (unsigned long long)get_u(&train, "policy_version") + 1);
    send_trained(S, &train, base_ckpt, 1, 900400, "not the run's ckpt/vNNNNNN");
    snprintf(cmd, sizeof cmd, "cp -r %s %s", base_ckpt, want);
    ck_assert_int_eq(system(cmd), 0);
    uint64_t sum = 0;
    ck_assert_int_eq(prl_checkpoint_weights_hash(want, 0, &sum), PRL_OK);
    send_trained(S, &train, want, sum ^ 1, 900401, "do not match the checksum announced");
    send_trained(S, &train, want, sum, 900402, NULL);
    prl_bus_msg_free(&train);
    return 2;
}

START_TEST(test_controller_fuzz)
{
    char path[200], ep[200], log[128];
    snprintf(path, sizeof path, "%s/job.json", run_dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(job_json, f);
    fclose(f);
    snprintf(ep, sizeof ep, "ipc://%s/control.sock", run_dir);
    snprintf(log, sizeof log, "%s/controller.log", dir);
    const char *argv[] = {"prl", "role", "controller", "--run", run_dir, NULL};
    pid_t pid = spawn(log, argv);

    cstate S0, *S = &S0;
    memset(S, 0, sizeof *S);
    prl_rng r;
    prl_rng_init(&r, 29, 0, 0, 0, PRL_RNG_TEST);
    for (int i = 0; i < N_SOCKS; i++) {
        char id[32];
        snprintf(id, sizeof id, "fz%08llx", (unsigned long long)rnd(&r, 1ull << 32));
        sock_open(&S->k[i], ep, i < N_WORKERS ? worker_names[i] : id);
    }
    static const char *const roles[] = {"rollout", "reward", "trainer"};
    for (int i = 0; i < N_WORKERS; i++) hello(S, &S->k[i], roles[i]);
    prl_bus_msg m;
    ck_assert_msg(!ctl_recv(S, &S->k[ROLLOUT], 5000, &m), "unexpected '%s'", m.type);
    ck_assert_msg(S->lease, "rollout-0 got no work");

    tally t = {0};
    double tf = prl_now();
    for (int it = 0; it < N_RANDOM + N_MUTATED; it++) {
        wcopy c;
        S->from = (int)rnd(&r, N_SOCKS);
        fuzz_make(&r, it, ctl_seed, S, 1, &c);
        csock *k = &S->k[S->from];
        int valid = wc_decode(&c, &m, NULL, 0) == PRL_OK;
        if (c.n == 0) {
            wc_free(&c);
            continue;
        }
        wc_send(prl_bus_socket_raw(k->s), NULL, &c);
        wc_free(&c);
        t.sent++;
        if (!valid) {
            t.codec++;
            continue;
        }
        int log_only = 0;
        if (!ctl_expect_reply(S, k, &m, &log_only)) {
            t.accepted += !log_only, t.log_only += log_only;
        } else {
            prl_bus_msg e;
            ck_assert_msg(ctl_recv(S, k, 5000, &e), "a '%s' from %s was accepted silently", m.type,
                          k->id);
            const char *why = NULL;
            ck_assert_msg(!strcmp(e.type, "error"), "a '%s' answers a '%s'", e.type, m.type);
            ck_assert_int_eq(prl_bus_msg_get_str(&e, "reason", &why), PRL_OK);
            ck_assert_uint_eq(get_u(&e, "ref"), get_u(&m, "id"));
            prl_bus_msg_free(&e);
            t.refused++;
        }
        prl_bus_msg_free(&m);
    }
    double fuzz_s = prl_now() - tf;
    for (int i = 0; i < N_SOCKS; i++) /* nothing else came back */
        if (ctl_recv(S, &S->k[i], 200, &m))
            ck_abort_msg("unexpected '%s' to %s", m.type, S->k[i].id);
    ck_assert_msg(!S->have_score, "a result was accepted during the fuzz");
    assert_alive(pid, "the controller");

    /* a new worker is welcomed */
    csock fresh;
    sock_open(&fresh, ep, "rollout-1");
    hello(S, &fresh, "rollout");
    ck_assert_int_eq(ctl_recv(S, &S->k[ROLLOUT], 300, &m), 0); /* its newest lease */
    /* rollout-0's work is taken: both results, then the score goes to reward-0 and is taken */
    for (uint64_t j = 0; j < G; j++) {
        good_result(S, &m, j, 900000 + j);
        ck_assert_int_eq(prl_bus_send(S->k[ROLLOUT].s, NULL, &m), PRL_OK);
        prl_bus_msg_free(&m);
    }
    await_score(S, "two valid results");
    S->have_score = 0;
    for (int bad = 0; bad < 3; bad++) { /* another lease, or the right one from another worker */
        csock *k = bad == 2 ? &S->k[TRAINER] : &S->k[REWARD];
        ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("scored"), RUN, 900200 + (uint64_t)bad),
                         PRL_OK);
        set_u(&m, "lease", bad == 0 ? S->score_lease + 1 : bad == 1 ? S->lease : S->score_lease);
        set_u(&m, "step", S->step);
        set_u(&m, "prompt", S->prompt);
        set_u(&m, "sample", S->score_sample);
        set_u(&m, "score_us", 10);
        add_text(&m, "detail", "{\"score\": 1}");
        ck_assert_int_eq(prl_bus_send(k->s, NULL, &m), PRL_OK);
        prl_bus_msg_free(&m);
        ck_assert_msg(ctl_recv(S, k, 5000, &m), "a scored with the wrong lease was accepted");
        ck_assert_str_eq(m.type, "error");
        ck_assert_uint_eq(get_u(&m, "ref"), 900200 + (uint64_t)bad);
        prl_bus_msg_free(&m);
        t.refused++;
    }
    ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("scored"), RUN, 900100), PRL_OK);
    set_u(&m, "lease", S->score_lease);
    set_u(&m, "step", S->step);
    set_u(&m, "prompt", S->prompt);
    set_u(&m, "sample", S->score_sample);
    set_u(&m, "score_us", 10);
    add_text(&m, "detail", "{\"score\": 1, \"flags\": 0}");
    ck_assert_int_eq(prl_bus_send(S->k[REWARD].s, NULL, &m), PRL_OK);
    prl_bus_msg_free(&m);
    await_score(S, "a valid scored");
    for (int i = 0; i < N_SOCKS; i++)
        if (ctl_recv(S, &S->k[i], 0, &m)) ck_abort_msg("unexpected '%s' to %s", m.type, S->k[i].id);
    assert_alive(pid, "the controller");
    t.refused += trained_checks(S);

    kill(pid, SIGTERM);
    int st = wait_exit(pid, 30);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 3, "controller exit status 0x%x", st);
    for (int i = 0; i < N_SOCKS; i++) prl_bus_socket_free(S->k[i].s);
    prl_bus_socket_free(fresh.s);

    print_tally("controller", &t);
    fprintf(stderr, "roles_fuzz %-10s fuzz took %.1f s\n", "controller", fuzz_s);
    ck_assert_int_ge(t.sent, 9000);
    ck_assert_int_gt(t.refused, 2000);
    ck_assert_int_eq(count_lines(log, "dropped message", "dropped message", 1), t.codec);
    ck_assert_int_eq(count_lines(log, "rejected message", "rejected message", 1),
                     t.refused + t.log_only);
}
END_TEST

/* ---------------------------------------------------------------- setup ------------ */

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc) fprintf(stderr, "setup failed (%d): %s\n", rc, cmd);
    return rc;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb, (void)flag, (void)f;
    return remove(p);
}

static void tree_remove(void)
{
    if (!strncmp(dir, "/tmp/prl-rfz-", 13) && !strchr(dir + 13, '/'))
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A small checkpoint with a tokenizer (demos -> tokenizer -> prl init), one general task,
** the job config and the run directory. */
static int setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/prl-rfz-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    snprintf(base_ckpt, sizeof base_ckpt, "%s/base", dir);
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    json_t *cfg = json_load_file(PRL_SOURCE_DIR "/configs/models/micro.json", 0, NULL);
    char cfg_path[128];
    snprintf(cfg_path, sizeof cfg_path, "%s/small.json", dir);
    if (!cfg || json_object_set_new(cfg, "vocab_size", json_integer(320)) ||
        json_object_set_new(cfg, "max_position_embeddings", json_integer(512)) ||
        json_dump_file(cfg, cfg_path, 0))
        return 1;
    json_decref(cfg);
    if (sh("%s tasks demos --domain general --n 60 --seed 1 --out %s/demos.jsonl 2>/dev/null",
           PRL_BIN, dir) ||
        sh("%s tokenizer train --data %s/demos.jsonl --vocab 300 --out %s/tok.json 2>/dev/null",
           PRL_BIN, dir, dir) ||
        sh("%s init --model %s --tokenizer %s/tok.json --seed 3 --out %s 2>/dev/null", PRL_BIN,
           cfg_path, dir, base_ckpt) ||
        sh("%s tasks generate --domain general --n 1 --out %s/task.jsonl 2>/dev/null", PRL_BIN,
           dir))
        return 1;
    char task_path[128];
    snprintf(task_path, sizeof task_path, "%s/task.jsonl", dir);
    FILE *f = fopen(task_path, "r");
    if (!f || !fgets(task_json, sizeof task_json, f)) return 1;
    fclose(f);
    task_json[strcspn(task_json, "\n")] = 0;
    char ckpt[160];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", run_dir);
    if (mkdir(run_dir, 0700) || mkdir(ckpt, 0700)) return 1;
    char key[160];
    snprintf(key, sizeof key, "%s/bus.key", dir);
    if (prl_bus_key_ensure(key, &dir_key)) return 1;
    snprintf(key, sizeof key, "%s/bus.key", run_dir);
    if (prl_bus_key_ensure(key, &run_key)) return 1;
    snprintf(
        job_json, sizeof job_json,
        "{\"run\": {\"name\": \"%s\", \"seed\": 7}, \"model\": {\"init\": \"%s\"}, "
        "\"task\": {\"domain\": \"general\", \"train_problems\": 8}, "
        "\"rollout\": {\"batch_prompts\": 1, \"group_size\": %d, \"max_new_tokens\": 8}, "
        "\"optim\": {\"lr\": 1e-4}, \"controller\": {\"steps\": 3, \"heartbeat_seconds\": 0.2, "
        "\"lease_seconds\": 600, \"max_rejected\": 1000000000}}", /* garbage must not end it */
        RUN, base_ckpt, G);
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (setup()) {
        tree_remove();
        return 1;
    }
    Suite *s = suite_create("roles_fuzz");
    static const char *const names[] = {"controller", "rollout", "reward", "trainer", "teacher"};
    const TTest *tests[] = {test_controller_fuzz, test_rollout_fuzz, test_reward_fuzz,
                            test_trainer_fuzz, test_teacher_fuzz};
    for (int i = 0; i < 5; i++) {
        TCase *tc = tcase_create(names[i]);
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, tests[i]);
        suite_add_tcase(s, tc);
    }
    int failed = check_run(s);
    if (!getenv("KEEP")) tree_remove();
    else fprintf(stderr, "kept %s\n", dir);
    return failed;
}
