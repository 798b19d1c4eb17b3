/*
** test_sandbox_service.c — integration tests of the sandbox service: real `prl role
** sandbox` processes (PRL_BIN) bound at ipc:// sockets in a fresh temp dir, driven by the
** client of roles/sandbox_client.c and by raw DEALER sockets.
**
**   - exec round trips: ok, runtime_error, timeout, stdin echo (binary, byte-exact), sh;
**   - requests the service refuses with an `error` naming the field (lang, wall_ms, program);
**   - kill -9 of the service while a request is in flight, then a restart: the client's
**     re-send gets the right answer;
**   - against a fake ROUTER: a reply with another ref is ignored; with no answer at all the
**     client re-sends until its deadline and then names the endpoint;
**   - 10,000 random and 10,000 mutated messages (tests/bus_fuzz.c): the service survives,
**     answers a valid exec afterwards, logs one drop with a reason per invalid message, and
**     stops on a `stop` message with the same count in its final line.
**
** The temp dir holds only the socket and the service's log; it is removed file by file
** (no recursive delete), so nothing outside it can be touched.
*/
#include "bus/bus.h"
#include "roles/roles.h"
#include "tests/bus_fuzz.h"
#include "tests/check_util.h"

#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

/* ---------------------------------------------------------------- helpers ---------- */

static char dir[64], endpoint[160], log_path[128], sock_path[128], key_path[128];
static prl_bus_secret secret; /* the run's bus key: the service serves only those who show it */

static void env_init(void)
{
    snprintf(dir, sizeof dir, "/tmp/prl-svc-test-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(sock_path, sizeof sock_path, "%s/sandbox.sock", dir);
    snprintf(endpoint, sizeof endpoint, "ipc://%s", sock_path);
    snprintf(log_path, sizeof log_path, "%s/service.log", dir);
    snprintf(key_path, sizeof key_path, "%s/bus.key", dir);
    ck_assert_int_eq(prl_bus_key_ensure(key_path, &secret), PRL_OK);
}

static void env_done(void)
{
    unlink(sock_path);
    unlink(log_path);
    unlink(key_path);
    rmdir(dir);
}

/* Start `prl role sandbox` with 2 slots, its stderr appended to the log. */
static pid_t service_start(void)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) dup2(fd, 2);
        execl(PRL_BIN, "prl", "role", "sandbox", "--bind", endpoint, "--slots", "2", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* SIGTERM, then the exit status must be PRL_ROLE_SIGNALED_EXIT (3: a clean stop by a signal,
** which the launcher restarts; a `stop` message gives 0, below). */
static void service_stop(pid_t pid)
{
    int st = 0;
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == PRL_ROLE_SIGNALED_EXIT,
                  "service exit status 0x%x", st);
}

static prl_sandbox_client *client_open(double margin_s)
{
    prl_sandbox_client *c = NULL;
    ck_assert_msg(prl_sandbox_client_open(&c, endpoint, "test", secret.hex) == PRL_OK, "%s",
                  prl_error_message());
    prl_sandbox_client_set_timing(c, margin_s, 30);
    return c;
}

/* Run and expect status, exit code, stdout and stderr exactly. */
static void expect_exec(prl_sandbox_client *c, const char *lang, const char *program,
                        const char *in, size_t in_len, double wall, prl_sandbox_status status,
                        int code, const char *out, size_t out_len, const char *err)
{
    prl_sandbox_result r;
    prl_status rc = prl_sandbox_client_exec(c, lang, program, in, in_len, wall, &r);
    ck_assert_msg(rc == PRL_OK, "exec: %s", prl_error_message());
    ck_assert_msg(r.status == status, "status %s, want %s (%s; stderr %s)",
                  prl_sandbox_status_name(r.status), prl_sandbox_status_name(status), r.reason,
                  r.err);
    if (code >= 0) ck_assert_int_eq(r.exit_code, code);
    if (out) {
        ck_assert_uint_eq(r.out_len, out_len);
        ck_assert(memcmp(r.out, out, out_len) == 0);
    }
    if (err) ck_assert_str_eq(r.err, err);
    prl_sandbox_result_free(&r);
}

/* ---------------------------------------------------------------- round trips ------ */

START_TEST(test_exec_roundtrip)
{
    env_init();
    pid_t pid = service_start();
    prl_sandbox_client *c = client_open(5);
    expect_exec(c, "python3", "print('hello')", NULL, 0, 5, PRL_SANDBOX_STATUS_OK, 0, "hello\n", 6,
                "");
    expect_exec(c, "python3", "import sys\nsys.stderr.write('bad\\n')\nsys.exit(3)\n", NULL, 0, 5,
                PRL_SANDBOX_STATUS_RUNTIME_ERROR, 3, "", 0, "bad\n");
    double t0 = prl_now();
    expect_exec(c, "python3", "while True: pass\n", NULL, 0, 0.5, PRL_SANDBOX_STATUS_TIMEOUT, 137,
                "", 0, NULL);
    ck_assert_double_lt(prl_now() - t0, 4.0);
    /* stdin echo: every byte value, 64 KiB, comes back unchanged */
    size_t n = 65536;
    char *in = malloc(n);
    for (size_t i = 0; i < n; i++) in[i] = (char)(i * 7 + i / 256);
    expect_exec(c, "python3", "import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read())\n", in,
                n, 5, PRL_SANDBOX_STATUS_OK, 0, in, n, "");
    free(in);
    expect_exec(c, "sh", "read x; echo \"got $x\"", "line\n", 5, 5, PRL_SANDBOX_STATUS_OK, 0,
                "got line\n", 9, "");
    ck_assert_uint_eq(prl_sandbox_client_resends(c), 0);
    prl_sandbox_client_free(c);
    service_stop(pid);
    env_done();
}
END_TEST

static int count_log_lines(const char *what, int need_reason);

/* A client without the run's key, or with another run's, gets no answer at all: libzmq
** closes its connection at the handshake, and the service logs the refusal. */
START_TEST(test_unknown_client_refused)
{
    env_init();
    pid_t pid = service_start();
    prl_bus_secret other;
    char other_path[160];
    snprintf(other_path, sizeof other_path, "%s/other.key", dir);
    ck_assert_int_eq(prl_bus_key_ensure(other_path, &other), PRL_OK);
    const char *keys[] = {NULL, other.hex};
    for (int i = 0; i < 2; i++) {
        prl_sandbox_client *c = NULL;
        ck_assert_int_eq(prl_sandbox_client_open(&c, endpoint, "intruder", keys[i]), PRL_OK);
        prl_sandbox_client_set_timing(c, 0.5, 2);
        prl_sandbox_result r;
        ck_assert_int_ne(prl_sandbox_client_exec(c, "python3", "print(1)", NULL, 0, 1, &r), PRL_OK);
        prl_sandbox_client_free(c);
    }
    prl_sandbox_client *c = client_open(5); /* the run's own workers are served meanwhile */
    expect_exec(c, "python3", "print('ok')", NULL, 0, 5, PRL_SANDBOX_STATUS_OK, 0, "ok\n", 3, "");
    prl_sandbox_client_free(c);
    service_stop(pid);
    ck_assert_int_ge(count_log_lines("refused a connection", 0), 2);
    ck_assert_int_ge(count_log_lines("did not present a key", 0), 1);
    ck_assert_int_ge(count_log_lines("user 'worker' with a wrong key", 0), 1);
    unlink(other_path);
    env_done();
}
END_TEST

/* Another host's workers (docs/scale-out.md "Several hosts"): a service bound to tcp:// with a
** CURVE keypair serves a client whose key is on its allow-list, and refuses (and logs) one
** whose key is not. CURVE runs on loopback here: the mechanism is the same off it. */
START_TEST(test_curve_service)
{
    env_init();
    char skeys[160], wkeys[160], other[160], allow[160], tcp[64], spub[PRL_BUS_CURVE_Z85 + 1];
    snprintf(skeys, sizeof skeys, "%s/svc", dir);
    snprintf(wkeys, sizeof wkeys, "%s/worker", dir);
    snprintf(other, sizeof other, "%s/other", dir);
    snprintf(allow, sizeof allow, "%s/authorized_keys", dir);
    snprintf(tcp, sizeof tcp, "tcp://127.0.0.1:%d", 20000 + (int)(getpid() % 20000));
    prl_bus_curve_keypair sk, wk, ok;
    const char *dirs[] = {skeys, wkeys, other};
    prl_bus_curve_keypair *kps[] = {&sk, &wk, &ok};
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(mkdir(dirs[i], 0700), 0);
        ck_assert_msg(prl_bus_curve_generate(dirs[i], kps[i]) == PRL_OK, "%s", prl_error_message());
    }
    ck_assert_int_ne(prl_bus_curve_generate(wkeys, NULL), PRL_OK); /* never replaced */
    FILE *f = fopen(allow, "w");
    fprintf(f, "# the workers of host B\n%s  worker\n", wk.public_z85);
    fclose(f);
    snprintf(spub, sizeof spub, "%s", sk.public_z85);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) dup2(fd, 2);
        execl(PRL_BIN, "prl", "role", "sandbox", "--bind", tcp, "--curve-keys", skeys,
              "--authorized-keys", allow, (char *)NULL);
        _exit(127);
    }
    prl_sandbox_client *c = NULL;
    ck_assert_int_eq(prl_sandbox_client_open_curve(&c, tcp, "intruder", &ok, spub), PRL_OK);
    prl_sandbox_client_set_timing(c, 0.5, 2);
    prl_sandbox_result r;
    ck_assert_int_ne(prl_sandbox_client_exec(c, "python3", "print(1)", NULL, 0, 1, &r), PRL_OK);
    prl_sandbox_client_free(c);
    ck_assert_int_eq(prl_sandbox_client_open_curve(&c, tcp, "worker", &wk, spub), PRL_OK);
    prl_sandbox_client_set_timing(c, 5, 30);
    expect_exec(c, "python3", "print('far')", NULL, 0, 5, PRL_SANDBOX_STATUS_OK, 0, "far\n", 4, "");
    prl_sandbox_client_free(c);
    service_stop(pid);
    char line[200];
    snprintf(line, sizeof line, "CURVE key %s is not on the allow-list", ok.public_z85);
    ck_assert_int_ge(count_log_lines(line, 0), 1);
    /* a PLAIN client is refused on its own side: off loopback needs CURVE */
    ck_assert_int_ne(prl_sandbox_client_open(&c, "tcp://10.1.2.3:5600", "plain", secret.hex),
                     PRL_OK);
    for (int i = 0; i < 3; i++) {
        char p[200];
        snprintf(p, sizeof p, "%s/public.key", dirs[i]), unlink(p);
        snprintf(p, sizeof p, "%s/secret.key", dirs[i]), unlink(p);
        rmdir(dirs[i]);
    }
    unlink(allow);
    env_done();
}
END_TEST

/* A raw exec from a DEALER; the reply must be an `error` whose reason contains `want`. */
static void expect_refused(prl_bus_socket *s, uint64_t id, const char *lang, uint64_t wall_ms,
                           const char *prog, size_t prog_len, const char *want)
{
    prl_bus_msg m;
    ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("exec"), "run-t", id), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_set_str(&m, "lang", lang), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_set_uint(&m, "wall_ms", wall_ms), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_add_frame(&m, "program", PRL_BUS_BYTES, prog, prog_len), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_add_frame(&m, "stdin", PRL_BUS_BYTES, NULL, 0), PRL_OK);
    ck_assert_int_eq(prl_bus_send(s, NULL, &m), PRL_OK);
    prl_bus_msg_free(&m);
    int got = 0;
    ck_assert_int_eq(prl_bus_recv(s, 10000, &m, NULL, &got), PRL_OK);
    ck_assert_msg(got, "no answer to a bad exec (%s)", want);
    ck_assert_str_eq(m.type, "error");
    const char *reason = NULL;
    uint64_t ref = 0;
    ck_assert_int_eq(prl_bus_msg_get_str(&m, "reason", &reason), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_get_uint(&m, "ref", &ref), PRL_OK);
    ck_assert_uint_eq(ref, id);
    ck_assert_msg(strstr(reason, want), "reason '%s' does not name '%s'", reason, want);
    prl_bus_msg_free(&m);
}

START_TEST(test_bad_requests)
{
    env_init();
    pid_t pid = service_start();
    prl_bus_socket *s = NULL;
    prl_bus_socket_options o;
    prl_bus_socket_options_default(&o);
    o.registry = prl_msg_registry(), o.secret = secret.hex;
    ck_assert_int_eq(prl_bus_socket_open(&s, PRL_BUS_DEALER, endpoint, &o), PRL_OK);
    expect_refused(s, 1, "ruby", 1000, "puts 1", 6, "'lang'");
    expect_refused(s, 2, "python3", 0, "print(1)", 8, "'wall_ms'");
    expect_refused(s, 3, "python3", PRL_MSG_EXEC_MAX_WALL_MS + 1ull, "print(1)", 8, "'wall_ms'");
    expect_refused(s, 4, "python3", 1000, "", 0, "'program'");
    expect_refused(s, 5, "python3", 1000, "print(1)\0x", 10, "'program'");
    prl_bus_socket_free(s);
    /* the client reports a refusal as PRL_ERR_ARG with the service's reason */
    prl_sandbox_client *c = client_open(5);
    prl_sandbox_result r;
    ck_assert_int_eq(prl_sandbox_client_exec(c, "ruby", "puts 1", NULL, 0, 1, &r), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "'lang'"));
    prl_sandbox_client_free(c);
    service_stop(pid);
    env_done();
}
END_TEST

/* ---------------------------------------------------------------- kill -9 ---------- */

typedef struct exec_job {
    prl_sandbox_client *c;
    prl_status rc;
    char msg[512]; /* the error message is per thread: keep it for the test's thread */
    prl_sandbox_result r;
} exec_job;

static void *exec_thread(void *p)
{
    exec_job *j = p;
    j->rc = prl_sandbox_client_exec(j->c, "python3", "import time\ntime.sleep(1)\nprint('slept')\n",
                                    NULL, 0, 3, &j->r);
    snprintf(j->msg, sizeof j->msg, "%s", prl_error_message());
    return NULL;
}

START_TEST(test_kill9_and_restart)
{
    env_init();
    pid_t pid = service_start();
    prl_sandbox_client *c = client_open(1); /* one try: 3 s + 1 s */
    expect_exec(c, "python3", "print(1)", NULL, 0, 5, PRL_SANDBOX_STATUS_OK, 0, "1\n", 2,
                ""); /* it is up */
    exec_job j = {.c = c};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, exec_thread, &j), 0);
    nanosleep(&(struct timespec){0, 400000000}, NULL); /* the program is sleeping now */
    int st = 0;
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    pid = service_start();
    pthread_join(th, NULL);
    ck_assert_msg(j.rc == PRL_OK, "exec across a kill -9: %s", j.msg);
    ck_assert_int_eq(j.r.status, PRL_SANDBOX_STATUS_OK);
    ck_assert_str_eq(j.r.out, "slept\n");
    ck_assert_uint_ge(prl_sandbox_client_resends(c), 1);
    fprintf(stderr, "kill -9: answered after %llu re-send(s)\n",
            (unsigned long long)prl_sandbox_client_resends(c));
    prl_sandbox_result_free(&j.r);
    prl_sandbox_client_free(c);
    service_stop(pid);
    env_done();
}
END_TEST

/* ---------------------------------------------------------------- fake service ----- */

/* A ROUTER in a thread standing in for the service: answers the first exec with a reply
** whose ref is wrong (stdout "wrong"), then with the right one (stdout "right"); with
** `silent` it never answers. */
typedef struct fake {
    prl_bus_socket *s;
    int silent, served;
} fake;

static void fake_reply(fake *f, const prl_bus_peer *to, uint64_t ref, const char *out)
{
    prl_bus_msg m;
    ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("exec_result"), "fake", 7), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_set_uint(&m, "ref", ref), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_set_str(&m, "status", "ok"), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_set_uint(&m, "exit_code", 0), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_set_uint(&m, "wall_us", 1), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_add_frame(&m, "stdout", PRL_BUS_BYTES, out, strlen(out)), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_add_frame(&m, "stderr", PRL_BUS_BYTES, NULL, 0), PRL_OK);
    ck_assert_int_eq(prl_bus_send(f->s, to, &m), PRL_OK);
    prl_bus_msg_free(&m);
}

static void *fake_main(void *p)
{
    fake *f = p;
    prl_bus_msg m;
    prl_bus_peer from;
    int got = 0;
    ck_assert_int_eq(prl_bus_recv(f->s, 10000, &m, &from, &got), PRL_OK);
    if (!got) return NULL;
    f->served++;
    uint64_t id = 0;
    ck_assert_int_eq(prl_bus_msg_get_uint(&m, "id", &id), PRL_OK);
    prl_bus_msg_free(&m);
    if (f->silent) return NULL;
    fake_reply(f, &from, id + 1000, "wrong");
    fake_reply(f, &from, id, "right");
    return NULL;
}

/* Bind the fake's ROUTER at the test endpoint and start its thread. */
static pthread_t fake_start(fake *f)
{
    prl_bus_socket_options o;
    prl_bus_socket_options_default(&o);
    o.registry = prl_msg_registry(), o.secret = secret.hex; /* as the service asks */
    o.bind = 1;
    ck_assert_int_eq(prl_bus_socket_open(&f->s, PRL_BUS_ROUTER, endpoint, &o), PRL_OK);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, fake_main, f), 0);
    return th;
}

static void fake_join(fake *f, pthread_t th)
{
    pthread_join(th, NULL);
    prl_bus_socket_free(f->s);
}

START_TEST(test_client_ignores_other_refs)
{
    env_init();
    fake f = {0};
    pthread_t th = fake_start(&f);
    prl_sandbox_client *c = client_open(2);
    expect_exec(c, "python3", "print(1)", NULL, 0, 1, PRL_SANDBOX_STATUS_OK, 0, "right", 5, "");
    fake_join(&f, th);
    prl_sandbox_client_free(c);
    env_done();
}
END_TEST

START_TEST(test_client_deadline)
{
    env_init();
    fake f = {.silent = 1};
    pthread_t th = fake_start(&f);
    prl_sandbox_client *c = client_open(0.2);
    prl_sandbox_client_set_timing(c, 0.2, 1.5); /* tries of 0.3 s, 1.5 s in all */
    prl_sandbox_result r;
    double t0 = prl_now();
    ck_assert_int_eq(prl_sandbox_client_exec(c, "python3", "print(1)", NULL, 0, 0.1, &r),
                     PRL_ERR_IO);
    double took = prl_now() - t0;
    ck_assert_msg(strstr(prl_error_message(), endpoint), "error does not name the endpoint: %s",
                  prl_error_message());
    ck_assert_double_ge(took, 1.4);
    ck_assert_double_lt(took, 3.0);
    ck_assert_uint_ge(prl_sandbox_client_resends(c), 3);
    fake_join(&f, th);
    ck_assert_int_eq(f.served, 1);
    prl_sandbox_client_free(c);
    env_done();
}
END_TEST

/* ---------------------------------------------------------------- fuzz ------------- */

static void wc_send(void *zs, const wcopy *c)
{
    for (int i = 0; i < c->n; i++)
        ck_assert_int_ge(zmq_send(zs, c->buf[i], c->len[i], i + 1 < c->n ? ZMQ_SNDMORE : 0), 0);
}

typedef struct fuzz_count {
    int sent, invalid, valid, replies;
} fuzz_count;

/* Take the `error` replies waiting (up to timeout_ms for the first). */
static void take_replies(prl_bus_socket *s, fuzz_count *f, int timeout_ms)
{
    for (;;) {
        prl_bus_msg m;
        int got = 0;
        ck_assert_int_eq(prl_bus_recv(s, timeout_ms, &m, NULL, &got), PRL_OK);
        if (!got) return;
        const char *reason = NULL;
        ck_assert_str_eq(m.type, "error");
        ck_assert_int_eq(prl_bus_msg_get_str(&m, "reason", &reason), PRL_OK);
        f->replies++;
        prl_bus_msg_free(&m);
        timeout_ms = 0;
    }
}

/* Send c unless it is a valid `stop`; count what the service must do with it. */
static void fuzz_send(prl_bus_socket *s, const wcopy *c, fuzz_count *f)
{
    prl_bus_msg m;
    int valid = wc_decode(c, &m, NULL, 0) == PRL_OK;
    int is_stop = valid && strcmp(m.type, "stop") == 0;
    if (valid) prl_bus_msg_free(&m);
    if (c->n == 0 || is_stop) return;
    wc_send(prl_bus_socket_raw(s), c);
    f->sent++;
    if (valid) f->valid++;
    else f->invalid++;
    take_replies(s, f, 0);
}

/* Lines of the log containing `what`; with need_reason each must go on with a non-empty
** reason after ": ". Lines the rate limit held back count too: "held back: N more 'WHAT'
** lines" counts N (bus.h, prl_bus_log_limit). */
static int count_log_lines(const char *what, int need_reason)
{
    FILE *f = fopen(log_path, "r");
    ck_assert_ptr_nonnull(f);
    char line[2048], held[160];
    snprintf(held, sizeof held, "more '%s' lines (at most one a second", what);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        const char *h = strstr(line, "held back: ");
        unsigned long long k;
        if (h && strstr(h, held) && sscanf(h, "held back: %llu", &k) == 1) {
            n += (int)k;
            continue;
        }
        if (!strstr(line, what)) continue;
        n++;
        if (!need_reason) continue;
        const char *r = strstr(line, what) + strlen(what);
        r = strstr(r, ": ");
        ck_assert_msg(r && r[2] != '\n' && r[2] != 0, "a drop without a reason: %s", line);
    }
    fclose(f);
    return n;
}

START_TEST(test_fuzz_messages)
{
    env_init();
    pid_t pid = service_start();
    prl_bus_socket *s = NULL;
    prl_bus_socket_options o;
    prl_bus_socket_options_default(&o);
    o.registry = prl_msg_registry(), o.secret = secret.hex;
    ck_assert_int_eq(prl_bus_socket_open(&s, PRL_BUS_DEALER, endpoint, &o), PRL_OK);
    prl_rng r;
    prl_rng_init(&r, 11, 0, 0, 0, PRL_RNG_TEST);
    fuzz_count f = {0};
    for (int it = 0; it < 10000; it++) { /* random parts */
        wcopy c;
        memset(&c, 0, sizeof c);
        c.n = 1 + (int)(prl_rng_u64(&r) % (PRL_BUS_MAX_PARTS + 3));
        for (int i = 0; i < c.n; i++) random_part(&r, &c, i);
        fuzz_send(s, &c, &f);
        wc_free(&c);
    }
    for (int it = 0; it < 10000; it++) { /* mutated valid messages of every type */
        prl_bus_msg orig;
        const char *type =
            prl_msg_registry()->types[prl_rng_u64(&r) % (uint64_t)prl_msg_registry()->n]->type;
        make_msg(&orig, type, &r, (int)(prl_rng_u64(&r) % 2), (int)(prl_rng_u64(&r) % 3));
        wcopy c;
        wc_from_msg(&c, &orig);
        mutate(&r, &c, (int)(prl_rng_u64(&r) % MUTATION_KINDS));
        fuzz_send(s, &c, &f);
        wc_free(&c);
        prl_bus_msg_free(&orig);
    }
    double t0 = prl_now();
    while (f.replies < f.valid && prl_now() - t0 < 20) take_replies(s, &f, 200);
    fprintf(stderr,
            "fuzz: %d messages sent, %d invalid, %d valid (all refused), %d error replies\n",
            f.sent, f.invalid, f.valid, f.replies);
    ck_assert_int_eq(f.replies, f.valid);
    ck_assert_int_gt(f.invalid, 15000);

    /* still serving */
    prl_sandbox_client *c = client_open(5);
    expect_exec(c, "python3", "print('alive')", NULL, 0, 5, PRL_SANDBOX_STATUS_OK, 0, "alive\n", 6,
                "");
    prl_sandbox_client_free(c);

    /* a worker's stop is refused (only the launcher may stop it, and it uses a signal) */
    prl_bus_msg stop, m;
    ck_assert_int_eq(prl_bus_msg_init(&stop, prl_msg_spec("stop"), "run-t", 99), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_set_str(&stop, "reason", "test over"), PRL_OK);
    ck_assert_int_eq(prl_bus_send(s, NULL, &stop), PRL_OK);
    prl_bus_msg_free(&stop);
    int got = 0;
    ck_assert_int_eq(prl_bus_recv(s, 5000, &m, NULL, &got), PRL_OK);
    ck_assert_msg(got, "no answer to a worker's stop");
    const char *reason = "";
    ck_assert_str_eq(m.type, "error");
    ck_assert_int_eq(prl_bus_msg_get_str(&m, "reason", &reason), PRL_OK);
    ck_assert_msg(strstr(reason, "only the launcher may stop"), "%s", reason);
    prl_bus_msg_free(&m);
    c = client_open(5);
    expect_exec(c, "python3", "print('alive')", NULL, 0, 5, PRL_SANDBOX_STATUS_OK, 0, "alive\n", 6,
                "");
    prl_sandbox_client_free(c);
    prl_bus_socket_free(s);
    service_stop(pid);
    ck_assert_int_eq(count_log_lines("stop message refused: it came from user 'worker'", 0), 1);
    ck_assert_int_eq(count_log_lines("dropped message", 1), f.invalid);
    char want[64];
    snprintf(want, sizeof want, "refused, %d dropped", f.invalid);
    ck_assert_int_eq(count_log_lines(want, 0), 1);
    env_done();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sandbox_service");
    TCase *tc = tcase_create("service");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_exec_roundtrip);
    tcase_add_test(tc, test_bad_requests);
    tcase_add_test(tc, test_unknown_client_refused);
    tcase_add_test(tc, test_curve_service);
    tcase_add_test(tc, test_kill9_and_restart);
    tcase_add_test(tc, test_client_ignores_other_refs);
    tcase_add_test(tc, test_client_deadline);
    tcase_add_test(tc, test_fuzz_messages);
    suite_add_tcase(s, tc);
    return check_run(s);
}
