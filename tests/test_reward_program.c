/*
** test_reward_program.c — Check tests for reward programs (roles/reward_program.c): the
** protocol of docs/rewards.md "Reward programs" with real programs in the sandbox — good
** replies with a breakdown, every kind of bad reply (recorded on the sample, the program
** kept), a program that dies mid-request and one that hangs (restarted, the request asked
** again and answered), one that never starts (an error after 3 tries), programs in Perl and
** Node, and the config checks.
*/
#include "roles/roles.h"

#include "tests/check_util.h"
#include <unistd.h>

static char dir[] = "/tmp/prl-reward-program-XXXXXX";

static void setup(void) { ck_assert_ptr_nonnull(mkdtemp(dir)); }
static void teardown(void)
{
    check_remove_tree(dir);
    strcpy(dir, "/tmp/prl-reward-program-XXXXXX");
}

/* The program's body: reads requests, n = how many it has seen, answers per "mode". */
static const char PROGRAM[] =
    "import json, sys, time, os\n"
    "n = 0\n"
    "for line in sys.stdin:\n"
    "    n += 1\n"
    "    req = json.loads(line)\n"
    "    mode = req['metadata'].get('mode', 'good')\n"
    "    if mode == 'die2' and n == 2: os._exit(3)\n"
    "    if mode == 'hang2' and n == 2: time.sleep(30)\n"
    "    out = {'good': {'score': 0.75, 'breakdown': {'len': len(req['completion']), "
    "'ok': True}},\n"
    "           'die2': {'score': 1}, 'hang2': {'score': 1},\n"
    "           'range': {'score': 1.5}, 'noscore': {'points': 1},\n"
    "           'string': {'score': '1'}, 'breakdown': {'score': 0.5, 'breakdown': [1]},\n"
    "           'nan': None, 'text': None, 'list': [1]}[mode]\n"
    "    if mode == 'nan': sys.stdout.write('{\"score\": NaN}\\n')\n"
    "    elif mode == 'text': sys.stdout.write('hello\\n')\n"
    "    else: sys.stdout.write(json.dumps(out) + '\\n')\n"
    "    sys.stdout.flush()\n";

/* A job whose reward.program runs `body` (written to dir/name), with reward.timeout t. */
static void job_with(prl_job_config *job, const char *name, const char *body, double t)
{
    char path[600], set[800];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(body, f);
    fclose(f);
    assert_ok(prl_job_config_default(job));
    snprintf(set, sizeof set, "reward.program=[\"python3\", \"%s\"]", path);
    assert_ok(prl_job_config_set(job, set));
    snprintf(set, sizeof set, "reward.timeout=%g", t);
    assert_ok(prl_job_config_set(job, set));
}

static char *request(const char *mode)
{
    static char buf[300];
    snprintf(buf, sizeof buf,
             "{\"prompt\": \"2+2?\", \"completion\": \"Answer: 4\", \"completion_ids\": [1, 2], "
             "\"metadata\": {\"mode\": \"%s\"}}",
             mode);
    return buf;
}

static const prl_reward_check *check_named(const prl_reward_result *r, const char *name)
{
    for (int i = 0; i < r->n_checks; i++)
        if (!strcmp(r->checks[i].name, name)) return &r->checks[i];
    ck_abort_msg("no check '%s'", name);
    return NULL;
}

START_TEST(test_good_reply_and_breakdown)
{
    prl_job_config job;
    job_with(&job, "r.py", PROGRAM, 5);
    assert_ok(prl_reward_program_check(&job));
    prl_reward_program *p;
    assert_ok(prl_reward_program_open(&p, &job, 0));
    prl_reward_result r;
    for (int i = 0; i < 3; i++) { /* one process answers them all */
        assert_ok(prl_reward_program_score(p, request("good"), &r));
        ck_assert_double_eq(r.score, 0.75);
        ck_assert(check_named(&r, "reward_program")->passed);
        ck_assert_str_eq(check_named(&r, "len")->detail, "9");
        ck_assert(check_named(&r, "ok")->passed);
    }
    ck_assert_uint_eq(prl_reward_program_restarts(p), 0);
    prl_reward_program_close(p);
    prl_job_config_free(&job);
}
END_TEST

static const char *const bad_modes[] = {"range", "noscore", "string", "breakdown",
                                        "nan",   "list",    "text"};

START_TEST(test_bad_reply_is_recorded)
{
    prl_job_config job;
    job_with(&job, "r.py", PROGRAM, 5);
    prl_reward_program *p;
    assert_ok(prl_reward_program_open(&p, &job, 0));
    prl_reward_result r;
    assert_ok(prl_reward_program_score(p, request(bad_modes[_i]), &r));
    ck_assert_double_eq(r.score, 0);
    ck_assert(r.flags & PRL_REWARD_EXEC_ERROR);
    const prl_reward_check *c = check_named(&r, "reward_program");
    ck_assert(!c->passed);
    ck_assert_msg(strstr(c->detail, "bad reply") != NULL, "detail: %s", c->detail);
    /* the program is kept: the next good request is answered without a restart */
    assert_ok(prl_reward_program_score(p, request("good"), &r));
    ck_assert_double_eq(r.score, 0.75);
    ck_assert_uint_eq(prl_reward_program_restarts(p), 0);
    prl_reward_program_close(p);
    prl_job_config_free(&job);
}
END_TEST

/* Dies (die2) or hangs past reward.timeout (hang2) on its second request: restarted, the
** request asked again (the fresh process's first) and answered. */
START_TEST(test_dies_or_hangs_then_restarts)
{
    const char *mode = _i ? "hang2" : "die2";
    prl_job_config job;
    job_with(&job, "r.py", PROGRAM, 1.0);
    prl_reward_program *p;
    assert_ok(prl_reward_program_open(&p, &job, 0));
    prl_reward_result r;
    assert_ok(prl_reward_program_score(p, request(mode), &r));
    ck_assert_uint_eq(prl_reward_program_restarts(p), 0);
    double t0 = prl_now();
    assert_ok(prl_reward_program_score(p, request(mode), &r));
    ck_assert_double_eq(r.score, 1);
    ck_assert_uint_eq(prl_reward_program_restarts(p), 1);
    if (_i) ck_assert_double_ge(prl_now() - t0, 1.0); /* it waited for the timeout */
    prl_reward_program_close(p);
    prl_job_config_free(&job);
}
END_TEST

START_TEST(test_never_answers_is_an_error)
{
    prl_job_config job;
    job_with(&job, "r.py", "import sys\nsys.stdin.readline()\nraise ValueError('it broke')\n", 1.0);
    prl_reward_program *p;
    assert_ok(prl_reward_program_open(&p, &job, 0));
    prl_reward_result r;
    ck_assert_int_ne(prl_reward_program_score(p, request("good"), &r), PRL_OK);
    assert_msg_has("3 tries");
    assert_msg_has("stderr: ValueError: it broke"); /* the reason reaches the sample's detail */
    ck_assert_uint_eq(prl_reward_program_restarts(p), 3);
    prl_reward_program_close(p);
    prl_job_config_free(&job);
}
END_TEST

START_TEST(test_config_checks)
{
    prl_job_config job;
    job_with(&job, "r.py", PROGRAM, 1.0);
    assert_ok(prl_job_config_set(&job, "reward.program=[\"no-such-interpreter\", \"r.js\"]"));
    ck_assert_int_eq(prl_reward_program_check(&job), PRL_ERR_CONFIG);
    assert_msg_has("not an executable file under /usr");
    assert_ok(prl_job_config_set(&job, "reward.program=[\"/tmp/../usr/bin/perl\", \"r.pl\"]"));
    ck_assert_int_eq(prl_reward_program_check(&job), PRL_ERR_CONFIG);
    assert_msg_has("/tmp/../usr/bin/perl");
    assert_ok(prl_job_config_set(&job, "reward.program=[\"python3\", \"/nonexistent.py\"]"));
    ck_assert_int_eq(prl_reward_program_check(&job), PRL_ERR_CONFIG);
    assert_msg_has("/nonexistent.py");
    assert_ok(prl_job_config_set(&job, "reward.program=[\"python3\"]"));
    ck_assert_int_eq(prl_reward_program_check(&job), PRL_ERR_CONFIG);
    assert_msg_has("[INTERPRETER, SCRIPT]");
    ck_assert_int_eq(prl_job_config_set(&job, "reward.program=[\"python3\", 3]"), PRL_ERR_CONFIG);
    assert_msg_has("reward.program");
    assert_ok(prl_job_config_set(&job, "reward.program=[]"));
    ck_assert_int_eq(prl_job_config_set(&job, "reward.network=true"), PRL_ERR_CONFIG);
    assert_msg_has("'reward.network' needs reward.program");
    prl_job_config_free(&job);
}
END_TEST

/* Any interpreter under /usr: the same protocol from a Perl program (Debian's perl-base is
** always there) and, when Node is installed, from a Node one. */
START_TEST(test_other_languages)
{
    static const char *const progs[2][3] = {
        {"perl", "r.pl",
         "$| = 1;\nwhile (my $l = <STDIN>) { print \"{\\\"score\\\": 0.25}\\n\"; }\n"},
        {"node", "r.js",
         "const rl = require('readline').createInterface({input: process.stdin});\n"
         "rl.on('line', (l) => { const q = JSON.parse(l);\n"
         "  process.stdout.write(JSON.stringify({score: q.completion.length / 100}) + '\\n'); "
         "});\n"}};
    const char *which = progs[_i][0];
    char bin[64];
    snprintf(bin, sizeof bin, "/usr/bin/%s", which);
    if (_i == 1 && access(bin, X_OK)) {
        fprintf(stderr, "test_other_languages: no %s here, Node case not run\n", bin);
        return;
    }
    prl_job_config job;
    job_with(&job, progs[_i][1], progs[_i][2], 10);
    char set[800];
    snprintf(set, sizeof set, "reward.program=[\"%s\", \"%s/%s\"]", which, dir, progs[_i][1]);
    assert_ok(prl_job_config_set(&job, set));
    assert_ok(prl_reward_program_check(&job));
    prl_reward_program *p;
    assert_ok(prl_reward_program_open(&p, &job, 0));
    prl_reward_result r;
    for (int i = 0; i < 2; i++) {
        assert_ok(prl_reward_program_score(p, request("good"), &r));
        ck_assert_double_eq_tol(r.score, _i ? 0.09 : 0.25, 1e-12);
    }
    ck_assert_uint_eq(prl_reward_program_restarts(p), 0);
    prl_reward_program_close(p);
    prl_job_config_free(&job);
}
END_TEST

static Suite *reward_program_suite(void)
{
    Suite *s = suite_create("reward_program");
    TCase *tc = tcase_create("protocol");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_good_reply_and_breakdown);
    tcase_add_loop_test(tc, test_bad_reply_is_recorded, 0,
                        (int)(sizeof bad_modes / sizeof bad_modes[0]));
    tcase_add_loop_test(tc, test_dies_or_hangs_then_restarts, 0, 2);
    tcase_add_test(tc, test_never_answers_is_an_error);
    tcase_add_test(tc, test_config_checks);
    tcase_add_loop_test(tc, test_other_languages, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return check_run(reward_program_suite()); }
