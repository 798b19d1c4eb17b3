/*
** test_sandbox_warm.c — Check tests for the warm path of sandbox/ (options.warm: a zygote per
** slot): one program cannot leave anything for the next, the layers and the program's view
** are those of a cold run, and cold and warm give identical results (status, exit code,
** signal, stdout, stderr; and the Coding verifier's scores) on the task catalogue's Coding
** problems and on programs that exercise the interpreter's start and exit.
**
** The attack catalogue itself runs warm too: test_sandbox under PRL_TEST_WARM=1 (ctest
** test_sandbox_warm).
*/
#include "reward/reward.h"
#include "sandbox/sandbox.h"
#include "tasks/tasks.h"
#include "tests/check_util.h"

#include <check.h>
#include <dirent.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static prl_sandbox_caps caps;

static prl_sandbox *make(int warm, unsigned uid_base)
{
    prl_sandbox_options o;
    prl_sandbox_options_default(&o);
    o.caps = &caps;
    o.warm = warm;
    o.uid_base = uid_base;
    prl_sandbox *sb = NULL;
    prl_status rc = prl_sandbox_init(&sb, &o);
    ck_assert_msg(rc == PRL_OK, "prl_sandbox_init: %s", prl_error_message());
    return sb;
}

static void run_in(prl_sandbox *sb, const char *prog, const char *in, double wall,
                   prl_sandbox_result *res)
{
    prl_sandbox_request req = {.lang = "python3",
                               .program = prog,
                               .program_len = strlen(prog),
                               .stdin_data = in,
                               .stdin_len = in ? strlen(in) : 0};
    prl_sandbox_limits_default(&req.limits);
    req.limits.wall_seconds = wall;
    prl_status rc = prl_sandbox_run(sb, 0, &req, res);
    ck_assert_msg(rc == PRL_OK, "run failed: %s", prl_error_message());
}

/* Everything of a result that a verifier may read, equal in both. */
static void assert_same(const prl_sandbox_result *c, const prl_sandbox_result *w, const char *what)
{
    ck_assert_msg(w->warm == 1 && c->warm == 0, "%s: warm flags %d/%d", what, c->warm, w->warm);
    ck_assert_msg(c->status == w->status && c->exit_code == w->exit_code && c->signal == w->signal,
                  "%s: cold %s %d sig %d (%s), warm %s %d sig %d (%s)", what,
                  prl_sandbox_status_name(c->status), c->exit_code, c->signal, c->reason,
                  prl_sandbox_status_name(w->status), w->exit_code, w->signal, w->reason);
    ck_assert_msg(c->out_len == w->out_len && !memcmp(c->out, w->out, c->out_len) &&
                      c->out_total == w->out_total,
                  "%s: stdout differs:\ncold: %.400s\nwarm: %.400s", what, c->out, w->out);
    ck_assert_msg(c->err_len == w->err_len && !memcmp(c->err, w->err, c->err_len),
                  "%s: stderr differs:\ncold: %.600s\nwarm: %.600s", what, c->err, w->err);
    ck_assert_uint_eq(c->layers, w->layers);
}

static void compare(prl_sandbox *cold, prl_sandbox *warm, const char *prog, const char *in,
                    double wall, const char *what)
{
    prl_sandbox_result c, w;
    run_in(cold, prog, in, wall, &c);
    run_in(warm, prog, in, wall, &w);
    assert_same(&c, &w, what);
    prl_sandbox_result_free(&c);
    prl_sandbox_result_free(&w);
}

/* ---------------------------------------------------------------- nothing carried -- */

/* Leaves everything it can: module and builtins mutations, sys.path and sys.modules
** entries, environment variables, files in every writable dir, an inheritable fd, a pipe,
** a sleeping thread, a setsid'd child, a bound abstract unix socket, a seeded random. */
static const char leaver[] =
    "import os, sys, builtins, json, threading, time, socket, random\n"
    "builtins.LEAK = 1\njson.LEAK = 1\nos.sep_leak = 1\nsys.modules['leak_mod'] = json\n"
    "sys.path.append('/leak')\nos.environ['LEAK'] = '1'\nos.putenv('LEAK2', '1')\n"
    "for d in ('/tmp', '/sandbox', '/dev/shm'):\n"
    "    open(d + '/leak', 'w').write('x')\n"
    "fd = os.open('/sandbox/leak', os.O_RDONLY)\nos.set_inheritable(fd, True)\n"
    "r, w = os.pipe()\nos.set_inheritable(w, True)\n"
    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    "if os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n"
    "s = socket.socket(socket.AF_UNIX)\ns.bind('\\0prl-leak')\ns.listen()\n"
    "random.seed(5)\nsys.stdout.write('left\\n')\n";

/* Reports what it finds; a fresh interpreter prints the same in a cold and a warm run. */
static const char finder[] =
    "import sys\nmods = sorted(sys.modules)\n"
    "import os, builtins, threading, socket\n"
    "print(hasattr(builtins, 'LEAK'), hasattr(os, 'sep_leak'), 'leak_mod' in mods,\n"
    "      '/leak' in sys.path, 'json' in mods, 'random' in mods)\n"
    "print(os.environ.get('LEAK'), os.environ.get('LEAK2'), len(os.environ))\n"
    "print(sorted(os.listdir('/tmp')), sorted(os.listdir('/sandbox')),\n"
    "      sorted(os.listdir('/dev/shm')))\n"
    "print(sorted(os.listdir('/proc/self/fd')))\n"
    "print(threading.active_count(), sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
    "s = socket.socket(socket.AF_UNIX)\ns.bind('\\0prl-leak')\nprint('bound')\n"
    "print(mods)\n";

START_TEST(test_warm_nothing_carried)
{
    prl_sandbox *cold = make(0, 47000), *warm = make(1, 47100);
    prl_sandbox_result a, b, c;
    run_in(warm, leaver, NULL, 5, &a);
    ck_assert_msg(a.status == PRL_SANDBOX_STATUS_OK && !strcmp(a.out, "left\n"),
                  "the leaving program: %s %s %s", prl_sandbox_status_name(a.status), a.out, a.err);
    run_in(warm, finder, NULL, 5, &b); /* same slot, right after */
    run_in(cold, finder, NULL, 5, &c);
    ck_assert_msg(b.status == PRL_SANDBOX_STATUS_OK, "finder: %s", b.err);
    ck_assert_msg(!strncmp(b.out, "False False False False False False\nNone None ", 46),
                  "a mutation was carried over: %s", b.out);
    const char *rest = strchr(strchr(b.out, '\n') + 1, '\n') + 1;
    ck_assert_msg(!strncmp(rest, "[] ['main.py'] []\n['0', '1', '2', '3']\n1 ['2']\nbound\n", 50),
                  "files, fds, threads or processes were carried over: %s", rest);
    assert_same(&c, &b, "the finder after a leaving program");
    prl_sandbox_result_free(&a);
    prl_sandbox_result_free(&b);
    prl_sandbox_result_free(&c);
    prl_sandbox_free(cold);
    prl_sandbox_free(warm);
}
END_TEST

/* The program's own view of its isolation: ids, capabilities, seccomp, no_new_privs, the
** mount table, limits, namespaces' contents, hostname. */
START_TEST(test_warm_same_view_as_cold)
{
    prl_sandbox *cold = make(0, 47200), *warm = make(1, 47300);
    static const char view[] =
        "import os, resource, socket\n"
        "st = open('/proc/self/status').read().splitlines()\n"
        "print([l for l in st if l.split(':')[0] in ('Uid', 'Gid', 'Groups', 'CapInh', 'CapPrm',\n"
        "      'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp', 'Seccomp_filters')])\n"
        "print(sorted(l.split()[4] + ' ' + l.split()[5] for l in open('/proc/self/mountinfo')))\n"
        "for r in ('CPU', 'FSIZE', 'NOFILE', 'CORE', 'MEMLOCK', 'NPROC', 'AS', 'SIGPENDING'):\n"
        "    print(r, resource.getrlimit(getattr(resource, 'RLIMIT_' + r)))\n"
        "print(socket.gethostname(), os.getcwd(), oct(os.umask(0)), os.getpid(), os.getppid())\n"
        "print(os.listdir('/sys') if os.path.exists('/sys') else 'no /sys', os.listdir('/'))\n"
        "import time\nif os.fork() == 0:\n    os._exit(0)\ntime.sleep(0.1)\n"
        "print([open('/proc/%s/stat' % p).read().split()[1:3] for p in "
        "sorted(os.listdir('/proc'))\n"
        "       if p.isdigit()], os.stat('/proc/self').st_uid)\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\n"
        "except OSError as e:\n    print('net', e.errno)\n"
        "import signal\nprint([signal.getsignal(s) for s in (signal.SIGPIPE, signal.SIGXFSZ,\n"
        "      signal.SIGUSR1, signal.SIGTERM)], signal.pthread_sigmask(signal.SIG_BLOCK, []))\n";
    compare(cold, warm, view, NULL, 5, "the program's view");
    prl_sandbox_free(cold);
    prl_sandbox_free(warm);
}
END_TEST

/* Start, exit and error paths of the interpreter: exceptions, exit codes, atexit, __del__
** at shutdown, unflushed files on the std streams, stdin read twice, a timeout, output caps,
** a signal, writes past RLIMIT_FSIZE, a forbidden syscall. */
START_TEST(test_warm_same_results_edge_programs)
{
    prl_sandbox *cold = make(0, 47400), *warm = make(1, 47500);
    static const char *const progs[] = {
        "print(1)\n",
        "raise ValueError('x')\n",
        "import sys\nsys.exit(3)\n",
        "import sys\nsys.exit('a message')\n",
        "import os\nprint('lost?', end='')\nos._exit(4)\n",
        "import atexit\natexit.register(lambda: print('at exit'))\nprint('main')\n",
        "class A:\n    def __del__(self): print('del')\na = A()\nprint('made')\n",
        "f = open('/dev/stdout', 'w')\nf.write('unflushed')\n",
        "import sys\nprint(sys.stdin.read().upper())\nprint(repr(sys.stdin.read()))\n",
        "x = input()\ny = input()\nprint(int(x) + int(y))\n",
        "while True: pass\n",
        "import sys\nsys.stdout.write('y' * 3000000)\n",
        "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
        "import os, signal\nos.kill(os.getpid(), signal.SIGUSR1)\nprint('alive')\n",
        "f = open('/tmp/big', 'wb')\nf.write(b'0' * (20 << 20))\n",
        "import ctypes\nprint(ctypes.CDLL(None).syscall(101, 0, 0, 0, 0))\n", /* ptrace */
        "import sys\nprint(sys.argv, sys.flags, sys.orig_argv, sys.executable, sys.path)\n",
        "def f(n): return f(n + 1)\nf(0)\n",
        "print(open(__file__).read()[:20], __name__, __spec__, __builtins__)\n",
        "import "
        "sys\nsys.stderr.write('é\\n')\nprint('\\u2603')\nsys.stdout.buffer.write(b'\\xff')\n",
    };
    for (size_t i = 0; i < sizeof progs / sizeof progs[0]; i++) {
        char what[32];
        snprintf(what, sizeof what, "edge program %zu", i);
        compare(cold, warm, progs[i], "3\n4\n", 1.0, what);
    }
    prl_sandbox_free(cold);
    prl_sandbox_free(warm);
}
END_TEST

/* Our children named prl-sandbox-zyg (the zygotes); kills them when `kill_them`. */
static int zygotes(int kill_them)
{
    int n = 0;
    DIR *d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int pid = atoi(e->d_name);
        if (pid <= 0) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t got = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[got] = 0;
        char *close_paren = strrchr(buf, ')');
        int ppid = 0;
        if (!strstr(buf, "(prl-sandbox-zyg)") || !close_paren ||
            sscanf(close_paren + 2, "%*c %d", &ppid) != 1 || ppid != getpid())
            continue;
        n++;
        if (kill_them) kill(pid, SIGKILL);
    }
    closedir(d);
    return n;
}

/* A zygote killed from outside is started again by the slot's next run. */
START_TEST(test_warm_zygote_restarted)
{
    prl_sandbox *warm = make(1, 47800);
    ck_assert_int_eq(zygotes(0), 1);
    ck_assert_int_eq(zygotes(1), 1);
    usleep(100000);
    prl_sandbox_result r;
    run_in(warm, "print(6 * 7)\n", NULL, 5, &r);
    ck_assert_msg(r.status == PRL_SANDBOX_STATUS_OK && !strcmp(r.out, "42\n") && r.warm,
                  "after the kill: %s %s", prl_sandbox_status_name(r.status), r.reason);
    prl_sandbox_result_free(&r);
    ck_assert_int_eq(zygotes(0), 1);
    prl_sandbox_free(warm);
    ck_assert_int_eq(zygotes(0), 0); /* free stops (and reaps) it */
}
END_TEST

/* ---------------------------------------------------------------- the catalogue ---- */

typedef struct logged_exec {
    prl_sandbox *sb;
    prl_sandbox_result log[512];
    int n;
} logged_exec;

static const char *exec_status(prl_sandbox_status s)
{
    switch (s) {
    case PRL_SANDBOX_STATUS_OK: return "ok";
    case PRL_SANDBOX_STATUS_RUNTIME_ERROR: return "runtime_error";
    case PRL_SANDBOX_STATUS_TIMEOUT: return "timeout";
    case PRL_SANDBOX_STATUS_OUTPUT_LIMIT: return "output_limit";
    case PRL_SANDBOX_STATUS_KILLED: return "violation";
    default: return "error";
    }
}

/* A verifier's executor that keeps every sandbox result it returns. */
static prl_status logged_run(void *ctx, const prl_reward_exec_request *req,
                             prl_reward_exec_result *res)
{
    logged_exec *x = ctx;
    ck_assert_int_lt(x->n, 512);
    prl_sandbox_result *r = &x->log[x->n++];
    run_in(x->sb, req->program, req->stdin_data, req->wall_s, r);
    snprintf(res->status, sizeof res->status, "%s", exec_status(r->status));
    res->exit_code = r->exit_code;
    res->stdout_data = strdup(r->out), res->stdout_len = r->out_len;
    res->stderr_data = strdup(r->err), res->stderr_len = r->err_len;
    return PRL_OK;
}

static prl_status collect(void *user, json_t *line)
{
    json_array_append(user, line);
    return PRL_OK;
}

/* Every difficulty's Coding problems with demonstrations, half of them mistaken: cold and
** warm give the same score and checks, from the same run results. */
START_TEST(test_warm_same_results_task_catalogue)
{
    static logged_exec cold, warm;
    cold.sb = make(0, 47600), warm.sb = make(1, 47700);
    cold.n = warm.n = 0;
    prl_reward_exec ce = {logged_run, &cold, 2.0}, we = {logged_run, &warm, 2.0};
    int lines = 0;
    for (int d = 1; d <= 3; d++) {
        prl_tasks_config c;
        prl_tasks_config_default(&c, PRL_TASK_CODING);
        c.difficulty = d, c.n = 5, c.seed = 29, c.demos = 1, c.error_rate = 0.5;
        json_t *all = json_array();
        assert_ok(prl_tasks_generate(&c, collect, all));
        size_t i;
        json_t *line;
        json_array_foreach(all, i, line)
        {
            char *text = json_dumps(line, JSON_COMPACT);
            prl_reward_result rc, rw;
            assert_ok(prl_reward_score_line(text, &ce, &rc));
            assert_ok(prl_reward_score_line(text, &we, &rw));
            ck_assert_msg(!memcmp(&rc.score, &rw.score, sizeof rc.score) &&
                              rc.n_checks == rw.n_checks && rc.flags == rw.flags,
                          "line %d: cold score %.17g, warm %.17g", lines, rc.score, rw.score);
            for (int k = 0; k < rc.n_checks; k++)
                ck_assert_msg(rc.checks[k].passed == rw.checks[k].passed &&
                                  !strcmp(rc.checks[k].detail, rw.checks[k].detail),
                              "line %d check %s differs", lines, rc.checks[k].name);
            free(text);
            lines++;
        }
        json_decref(all);
    }
    ck_assert_int_eq(cold.n, warm.n);
    ck_assert_int_ge(cold.n, 15 * 5); /* every test of every problem ran */
    for (int i = 0; i < cold.n; i++) {
        char what[32];
        snprintf(what, sizeof what, "catalogue run %d", i);
        assert_same(&cold.log[i], &warm.log[i], what);
        prl_sandbox_result_free(&cold.log[i]);
        prl_sandbox_result_free(&warm.log[i]);
    }
    fprintf(stderr, "task catalogue: %d Coding lines, %d runs each way, identical\n", lines,
            cold.n);
    prl_sandbox_free(cold.sb);
    prl_sandbox_free(warm.sb);
}
END_TEST

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "NOT CHECKED: the warm sandbox tests need root (slot uids, cgroups)\n");
        return 77;
    }
    if (prl_sandbox_probe(&caps) != PRL_OK) {
        fprintf(stderr, "probe: %s\n", prl_error_message());
        return 1;
    }
    const TTest *const tests[] = {
        test_warm_nothing_carried,
        test_warm_same_view_as_cold,
        test_warm_same_results_edge_programs,
        test_warm_same_results_task_catalogue,
        test_warm_zygote_restarted,
    };
    Suite *s = suite_create("sandbox_warm");
    TCase *tc = tcase_create("warm");
    tcase_set_timeout(tc, 300);
    check_add_tests(tc, tests, sizeof tests / sizeof tests[0]);
    suite_add_tcase(s, tc);
    return check_run(s);
}
