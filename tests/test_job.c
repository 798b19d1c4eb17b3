/*
** test_job.c — the job configuration: defaults validate, JSON and --set overrides apply, and
** every kind of bad input fails naming the key (unknown key with a suggestion, wrong type,
** out of range, bad choice, B·G = 0, a negative clip, cross-key rules), before anything runs.
** The SFT recipe (job/recipe.h) goes through the same key table: nested sections, errors.
*/
#include "job/job.h"
#include "job/recipe.h"
#include "tests/check_util.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

static void expect_error(const char *json, const char *needle)
{
    prl_job_config c;
    ck_assert_int_eq(prl_job_config_default(&c), PRL_OK);
    ck_assert_int_eq(prl_job_config_parse(&c, json, "job.json"), PRL_ERR_CONFIG);
    ck_assert_msg(strstr(prl_error_message(), needle), "%s: got '%s', want '%s'", json,
                  prl_error_message(), needle);
    prl_job_config_free(&c);
}

/* bus.* (docs/scale-out.md "Several hosts"): a tcp:// endpoint; off loopback only with
** bus.allow_remote and then with bus.keys; empty worker pools only with bus.bind. */
static void expect_bus(const char *const *sets, int n, prl_status want, const char *msg)
{
    prl_job_config c;
    prl_job_config_default(&c);
    prl_status rc = prl_job_config_set_all(&c, sets, n); /* validated once, after all */
    ck_assert_int_eq(rc, want);
    if (msg) ck_assert_msg(strstr(prl_error_message(), msg), "%s", prl_error_message());
    prl_job_config_free(&c);
}

START_TEST(test_bus_keys)
{
    const char *a[] = {"bus.bind=\"ipc:///tmp/x\""};
    expect_bus(a, 1, PRL_ERR_CONFIG, "must be tcp://HOST:PORT");
    const char *b[] = {"bus.bind=\"tcp://10.0.0.1:5599\""};
    expect_bus(b, 1, PRL_ERR_CONFIG, "bus.allow_remote");
    const char *c[] = {"bus.allow_remote=true", "bus.bind=\"tcp://10.0.0.1:5599\""};
    expect_bus(c, 2, PRL_ERR_CONFIG, "bus.keys");
    const char *d[] = {"bus.allow_remote=true", "bus.keys=k", "bus.bind=\"tcp://10.0.0.1:5599\""};
    expect_bus(d, 3, PRL_OK, NULL);
    const char *e[] = {"bus.bind=\"tcp://127.0.0.1:5599\"", "rollout.workers=0",
                       "reward.workers=0"};
    expect_bus(e, 3, PRL_OK, NULL);
    const char *f[] = {"rollout.workers=0"};
    expect_bus(f, 1, PRL_ERR_CONFIG, "'rollout.workers' = 0 needs bus.bind");
    const char *g[] = {"reward.workers=0"};
    expect_bus(g, 1, PRL_ERR_CONFIG, "'reward.workers' = 0 needs bus.bind");
}
END_TEST

START_TEST(test_trainer_hosts)
{
    /* trainer.hosts (docs/job.md): mpirun's --host list, slots for every rank, one of
    ** trainer.hosts / trainer.hostfile, and only with ranks to place */
    const char *ok[] = {"trainer.ranks=4", "trainer.hosts=\"a:2,b.example-1:2\""};
    expect_bus(ok, 2, PRL_OK, NULL);
    const char *bare[] = {"trainer.ranks=2", "trainer.hosts=\"a,b\""};
    expect_bus(bare, 2, PRL_OK, NULL);
    const char *few[] = {"trainer.ranks=4", "trainer.hosts=\"a:2,b\""};
    expect_bus(few, 2, PRL_ERR_CONFIG, "gives 3 slots for trainer.ranks = 4");
    const char *one[] = {"trainer.hosts=\"a:1,b:1\""};
    expect_bus(one, 1, PRL_ERR_CONFIG, "needs trainer.ranks > 1 (it is 1)");
    const char *both[] = {"trainer.ranks=2", "trainer.hosts=\"a:2\"", "trainer.hostfile=\"h\""};
    expect_bus(both, 3, PRL_ERR_CONFIG, "both place the trainer ranks");
    const char *name[] = {"trainer.ranks=2", "trainer.hosts=\"a:1,b c:1\""};
    expect_bus(name, 2, PRL_ERR_CONFIG, "'b c' is not a host name");
    const char *empty[] = {"trainer.ranks=2", "trainer.hosts=\"a,,b\""};
    expect_bus(empty, 2, PRL_ERR_CONFIG, "',' is not a host name");
    const char *slots[] = {"trainer.ranks=2", "trainer.hosts=\"a:0,b:2\""};
    expect_bus(slots, 2, PRL_ERR_CONFIG, "the slots after 'a' must be a count");
    const char *junk[] = {"trainer.ranks=2", "trainer.hosts=\"a:2x\""};
    expect_bus(junk, 2, PRL_ERR_CONFIG, "the slots after 'a' must be a count");
    const char *comma[] = {"trainer.ranks=2", "trainer.hosts=\"a:2,\""};
    expect_bus(comma, 2, PRL_ERR_CONFIG, "ends with ','");
    const char *file[] = {"trainer.ranks=1", "trainer.hostfile=\"h\""};
    expect_bus(file, 2, PRL_ERR_CONFIG, "'trainer.hostfile' places trainer ranks");
}
END_TEST

START_TEST(test_defaults_and_overrides)
{
    prl_job_config c;
    ck_assert_int_eq(prl_job_config_default(&c), PRL_OK);
    ck_assert_int_eq(prl_job_config_check(&c, "defaults"), PRL_OK);
    ck_assert_str_eq(c.loss_agg, "token-mean");
    ck_assert(c.clip_high == 0.28 && c.group_size == 8);
    ck_assert_int_eq(prl_job_config_parse(&c,
                                          "{\"rollout\": {\"group_size\": 4, \"temperature\": 0.7},"
                                          " \"task\": {\"domain\": \"coding\"}}",
                                          "job.json"),
                     PRL_OK);
    ck_assert_int_eq(c.group_size, 4);
    ck_assert(c.temperature == 0.7);
    ck_assert_str_eq(c.domain, "coding");
    ck_assert_int_eq(c.batch_prompts, 8); /* untouched keys keep their values */
    ck_assert_int_eq(prl_job_config_set(&c, "grpo.clip_high=0.3"), PRL_OK);
    ck_assert_int_eq(prl_job_config_set(&c, "controller.mode=async"), PRL_OK); /* bare word */
    ck_assert_int_eq(prl_job_config_set(&c, "controller.dynamic_sampling=true"), PRL_OK);
    ck_assert(c.clip_high == 0.3 && c.dynamic_sampling == 1);
    ck_assert_str_eq(c.mode, "async");
    /* round trip through JSON */
    char *text = prl_job_config_to_json(&c);
    prl_job_config d;
    ck_assert_int_eq(prl_job_config_default(&d), PRL_OK);
    ck_assert_int_eq(prl_job_config_parse(&d, text, "round trip"), PRL_OK);
    char *text2 = prl_job_config_to_json(&d);
    ck_assert_str_eq(text, text2);
    free(text), free(text2);
    prl_job_config_free(&d);
    prl_job_config_free(&c);
}
END_TEST

START_TEST(test_errors_name_the_key)
{
    expect_error("{\"grpo\": {\"clip_hgih\": 0.3}}",
                 "unknown key 'grpo.clip_hgih' (did you mean 'grpo.clip_high'?)");
    expect_error("{\"seed\": 3}", "unknown key 'seed'");
    expect_error("{\"rollout\": {\"group_size\": \"8\"}}",
                 "key 'rollout.group_size' must be an integer");
    expect_error("{\"rollout\": {\"group_size\": 2.5}}",
                 "key 'rollout.group_size' must be an integer");
    expect_error("{\"rollout\": {\"group_size\": 0}}",
                 "key 'rollout.group_size' = 0 is out of range");
    expect_error("{\"rollout\": {\"batch_prompts\": 0}}", "rollout.batch_prompts");
    expect_error("{\"grpo\": {\"clip_low\": -0.2}}", "key 'grpo.clip_low' = -0.2 is out of range");
    expect_error("{\"grpo\": {\"clip_c\": 0.5}}", "key 'grpo.clip_c' = 0.5 must be > 1");
    expect_error("{\"grpo\": {\"loss_agg\": \"token-avg\"}}",
                 "'token-avg' is not one of token-mean|");
    expect_error("{\"grpo\": {\"loss_agg\": \"seq-mean-token-sum-norm\"}}",
                 "grpo.loss_scale_factor");
    expect_error("{\"controller\": {\"heartbeat_seconds\": 90}}", "controller.heartbeat_seconds");
    expect_error("{\"optim\": {\"lr\": \"fast\"}}", "key 'optim.lr' must be a number");
    expect_error("{\"optim\": {\"schedule\": \"linear\"}}",
                 "'linear' is not one of cosine|constant");
    expect_error("{\"optim\": {\"warmup\": 50, \"decay_steps\": 50}}",
                 "key 'optim.decay_steps' = 50 must exceed");
    expect_error("{\"optim\": {\"min_lr_ratio\": 2}}",
                 "key 'optim.min_lr_ratio' = 2 is out of range");
    expect_error("{\"controller\": {\"dynamic_sampling\": 1}}", "must be true or false");
    expect_error("{\"rollout\": 3}", "'rollout' must be an object of keys");
    expect_error("[1, 2]", "must be a JSON object");
    expect_error("{\"rollout\": {\"group_size\": 4,}}", "job.json:1: invalid JSON");
    expect_error("{\"rollout\": {\"top_p\": 1, \"top_p\": 0.5}}", "invalid JSON");
    prl_job_config c;
    ck_assert_int_eq(prl_job_config_default(&c), PRL_OK);
    ck_assert_int_eq(prl_job_config_set(&c, "grpo.clip=0.3"), PRL_ERR_CONFIG);
    ck_assert(strstr(prl_error_message(), "--set: unknown key 'grpo.clip'"));
    ck_assert_int_eq(prl_job_config_set(&c, "rollout.group_size"), PRL_ERR_CONFIG);
    ck_assert(strstr(prl_error_message(), "expected key=value"));
    ck_assert_int_eq(prl_job_config_set(&c, "rollout.group_size=-1"), PRL_ERR_CONFIG);
    ck_assert_int_eq(prl_job_config_load(&c, "/nonexistent/job.json"), PRL_ERR_IO);
    prl_job_config_free(&c);
}
END_TEST

/* controller.max_rejected: default 10, at least 1; like controller.steps it may change on
** --resume (a run failed at the bound continues with a higher one), unlike optim.lr. */
START_TEST(test_max_rejected_and_resume)
{
    prl_job_config c;
    ck_assert_int_eq(prl_job_config_default(&c), PRL_OK);
    ck_assert_int_eq(c.max_rejected, 10);
    char *then = prl_job_config_to_json(&c);
    ck_assert_int_eq(prl_job_config_set(&c, "controller.max_rejected=100"), PRL_OK);
    ck_assert_int_eq(prl_job_config_set(&c, "controller.steps=500"), PRL_OK);
    char *now = prl_job_config_to_json(&c);
    ck_assert_int_eq(prl_job_config_same_run(then, now, "r", "job.json"), PRL_OK);
    free(now);
    ck_assert_int_eq(prl_job_config_set(&c, "optim.lr=1e-3"), PRL_OK);
    now = prl_job_config_to_json(&c);
    ck_assert_int_eq(prl_job_config_same_run(then, now, "r", "job.json"), PRL_ERR_CONFIG);
    ck_assert(strstr(prl_error_message(), "controller.max_rejected"));
    free(now), free(then);
    prl_job_config_free(&c);
    expect_error("{\"controller\": {\"max_rejected\": 0}}",
                 "key 'controller.max_rejected' = 0 is out of range");
}
END_TEST

/* task.mix.<domain>: each domain's train problems of a mixed prompt set, rounded; a share
** with one domain, or shares that leave no problem, fail naming the key; a domain with no
** problems needs no OPD teacher. */
START_TEST(test_task_mix)
{
    prl_job_config c;
    ck_assert_int_eq(prl_job_config_default(&c), PRL_OK);
    ck_assert_int_eq(prl_job_mix_problems(&c, PRL_TASK_REASONING), 2000); /* the default domain */
    ck_assert_int_eq(prl_job_mix_problems(&c, PRL_TASK_CODING), 0);
    ck_assert_int_eq(
        prl_job_config_parse(&c,
                             "{\"task\": {\"domain\": \"mixed\", \"train_problems\": 10,"
                             " \"mix\": {\"coding\": 2.5, \"agent\": 0.04, \"general\": 0.05}}}",
                             "job.json"),
        PRL_OK);
    ck_assert_int_eq(prl_job_mix_problems(&c, PRL_TASK_REASONING), 10);
    ck_assert_int_eq(prl_job_mix_problems(&c, PRL_TASK_GENERAL), 1); /* 0.5 rounds away from 0 */
    ck_assert_int_eq(prl_job_mix_problems(&c, PRL_TASK_AGENT), 0);
    ck_assert_int_eq(prl_job_mix_problems(&c, PRL_TASK_CODING), 25);
    /* agent has no problems: no agent teacher needed; coding has some: its teacher is */
    ck_assert_int_eq(prl_job_config_set(&c, "opd.teachers.reasoning=r"), PRL_OK);
    ck_assert_int_eq(prl_job_config_set(&c, "opd.teachers.general=g"), PRL_OK);
    ck_assert_int_eq(prl_job_config_set(&c, "opd.enabled=true"), PRL_ERR_CONFIG);
    ck_assert(strstr(prl_error_message(), "key 'opd.teachers.coding' is empty"));
    ck_assert_int_eq(prl_job_config_set(&c, "opd.teachers.coding=c"), PRL_OK);
    ck_assert_int_eq(prl_job_config_set(&c, "opd.enabled=true"), PRL_OK);
    /* opd.revisit draws by teacher KL: it needs OPD, and sync mode to be deterministic */
    ck_assert(c.opd_revisit == 0 && c.opd_revisit_power == 1);
    ck_assert_int_eq(prl_job_config_set(&c, "opd.revisit=0.5"), PRL_OK);
    ck_assert_int_eq(prl_job_config_set(&c, "controller.mode=async"), PRL_ERR_CONFIG);
    ck_assert(strstr(prl_error_message(), "key 'opd.revisit' = 0.5 needs controller.mode = sync"));
    ck_assert_int_eq(prl_job_config_set(&c, "opd.enabled=false"), PRL_ERR_CONFIG);
    ck_assert(strstr(prl_error_message(), "key 'opd.revisit' = 0.5 needs opd.enabled"));
    ck_assert_int_eq(prl_job_config_set(&c, "opd.revisit=0.95"), PRL_ERR_CONFIG);
    prl_job_config_free(&c);
    expect_error(
        "{\"task\": {\"domain\": \"coding\", \"mix\": {\"coding\": 2}}}",
        "key 'task.mix.coding' = 2 applies only to task.domain = mixed (this job's is coding)");
    expect_error(
        "{\"task\": {\"domain\": \"mixed\", \"train_problems\": 4, \"mix\": {\"reasoning\": 0.1, "
        "\"general\": 0, \"agent\": 0, \"coding\": 0}}}",
        "key 'task.mix.*': task.train_problems = 4 times every domain's share rounds to 0");
    expect_error("{\"task\": {\"mix\": {\"coding\": -1}}}",
                 "key 'task.mix.coding' = -1 is out of range");
    expect_error("{\"task\": {\"mix\": {\"code\": 1}}}",
                 "unknown key 'task.mix.code' (did you mean 'task.mix.coding'?)");
}
END_TEST

/* task.source / task.path / task.eval_*, reward.program (a list of strings kept as JSON) and
** reward.network: defaults, a round trip, and every rule named in its error. */
START_TEST(test_prompt_file_and_program_keys)
{
    prl_job_config c;
    ck_assert_int_eq(prl_job_config_default(&c), PRL_OK);
    ck_assert_str_eq(c.task_source, "generate");
    ck_assert(!prl_job_has_reward_program(&c) && c.eval_every == 0 && c.eval_samples == 1);
    ck_assert_int_eq(prl_job_config_parse(&c,
                                          "{\"task\": {\"source\": \"file\", \"path\": \"p.jsonl\","
                                          " \"eval_every\": 5}, \"reward\": {\"program\": "
                                          "[\"python3\", \"r.py\"], \"network\": true}}",
                                          "job.json"),
                     PRL_OK);
    ck_assert(prl_job_has_reward_program(&c));
    ck_assert_str_eq(c.reward_program, "[\"python3\",\"r.py\"]"); /* compact JSON */
    char *text = prl_job_config_to_json(&c); /* the list goes back out as a list */
    prl_job_config d;
    ck_assert_int_eq(prl_job_config_default(&d), PRL_OK);
    ck_assert_int_eq(prl_job_config_parse(&d, text, "round trip"), PRL_OK);
    ck_assert_str_eq(d.reward_program, c.reward_program);
    ck_assert_str_eq(d.task_path, "p.jsonl");
    free(text);
    prl_job_config_free(&d);
    ck_assert_int_eq(prl_job_config_set(&c, "opd.enabled=true"), PRL_ERR_CONFIG);
    ck_assert(strstr(prl_error_message(), "key 'opd.enabled' needs task.source = generate"));
    prl_job_config_free(&c);
    expect_error("{\"task\": {\"source\": \"file\"}}", "key 'task.path' is empty");
    expect_error("{\"task\": {\"path\": \"p.jsonl\"}}",
                 "key 'task.path' = p.jsonl needs task.source = file");
    expect_error("{\"task\": {\"source\": \"files\"}}", "'files' is not one of generate|file");
    expect_error("{\"task\": {\"eval_samples\": 0}}",
                 "key 'task.eval_samples' = 0 is out of range");
    expect_error("{\"reward\": {\"program\": \"python3 r.py\"}}",
                 "key 'reward.program' must be an array");
    expect_error("{\"reward\": {\"program\": [\"python3\", \"\"]}}",
                 "key 'reward.program': entry 1 must be a non-empty string");
    expect_error("{\"reward\": {\"network\": true}}", "key 'reward.network' needs reward.program");
    /* keys tied by a rule are set together on the command line, in either order: the rule is
    ** checked after the last override, not after each */
    const char *file_sets[][2] = {{"task.source=file", "task.path=p.jsonl"},
                                  {"task.path=p.jsonl", "task.source=file"}};
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(prl_job_config_default(&c), PRL_OK);
        ck_assert_int_eq(prl_job_config_set(&c, file_sets[k][0]), PRL_ERR_CONFIG); /* alone */
        ck_assert_int_eq(prl_job_config_set_all(&c, file_sets[k], 2), PRL_OK);
        ck_assert_str_eq(c.task_path, "p.jsonl");
        prl_job_config_free(&c);
    }
    ck_assert_int_eq(prl_job_config_default(&c), PRL_OK);
    ck_assert_int_eq(prl_job_config_set_all(&c, file_sets[0], 1), PRL_ERR_CONFIG);
    ck_assert(strstr(prl_error_message(), "key 'task.path' is empty"));
    prl_job_config_free(&c);
}
END_TEST

/* reward.model / reward.judge: defaults, values, and every cross-key rule named in its error
** (the checkpoints themselves are checked by prl run: tests/test_rm.c). */
START_TEST(test_learned_reward_keys)
{
    prl_job_config c;
    ck_assert_int_eq(prl_job_config_default(&c), PRL_OK);
    ck_assert_str_eq(c.reward_model, "");
    ck_assert_str_eq(c.reward_judge, "");
    ck_assert(c.reward_model_weight == 0.5 && c.reward_judge_weight == 0.5 &&
              !c.reward_model_normalize && c.reward_judge_tokens == 16);
    ck_assert_int_eq(prl_job_config_parse(&c,
                                          "{\"reward\": {\"model\": \"runs/rm\", \"model_weight\": "
                                          "0.3, \"model_normalize\": true, \"judge\": \"runs/j\", "
                                          "\"judge_weight\": 0.2, \"judge_template\": "
                                          "\"Rate {answer}\"}}",
                                          "job.json"),
                     PRL_OK);
    ck_assert_str_eq(c.reward_model, "runs/rm");
    ck_assert(c.reward_model_weight == 0.3 && c.reward_model_normalize &&
              c.reward_judge_weight == 0.2);
    prl_job_config_free(&c);
    expect_error("{\"reward\": {\"model\": \"runs/rm\", \"program\": [\"python3\", \"r.py\"]}}",
                 "key 'reward.model' mixes into the verifiers' score");
    expect_error("{\"reward\": {\"model\": \"a\", \"judge\": \"b\", \"model_weight\": 0.7, "
                 "\"judge_weight\": 0.5}}",
                 "keys 'reward.model_weight' + 'reward.judge_weight' = 1.2 must be <= 1");
    expect_error("{\"reward\": {\"judge_template\": \"x {answer}\"}}",
                 "key 'reward.judge_template' needs reward.judge");
    expect_error("{\"reward\": {\"model_weight\": 1.5}}", "key 'reward.model_weight' = 1.5");
    expect_error("{\"reward\": {\"modle\": \"x\"}}", "did you mean 'reward.model'");
}
END_TEST

/* grpo.correction.*: nested keys and defaults, and every cross-key rule named in its error. */
START_TEST(test_correction_keys)
{
    prl_job_config c;
    ck_assert_int_eq(prl_job_config_default(&c), PRL_OK);
    ck_assert_str_eq(c.corr_kind, "none");
    ck_assert_str_eq(c.corr_denominator, "original");
    ck_assert(c.kpop_phi == 0.75 && c.icepop_low == 0.5 && c.icepop_high == 5 && c.tis_cap == 2);
    ck_assert(c.strict_kpop_phi == 0.1 && c.pcc_rule == 0 && c.pcc_threshold == 0.99);
    ck_assert_int_eq(prl_job_config_parse(&c,
                                          "{\"grpo\": {\"correction\": {\"kind\": \"kpop\", "
                                          "\"kpop_phi\": 2.0, \"pcc_rule\": true, \"strict\": "
                                          "{\"kpop_phi\": 0.5}}}}",
                                          "job.json"),
                     PRL_OK);
    ck_assert_str_eq(c.corr_kind, "kpop");
    ck_assert(c.kpop_phi == 2.0 && c.strict_kpop_phi == 0.5 && c.pcc_rule == 1);
    /* bypass + reinforce + TIS, set one key at a time in a valid order */
    ck_assert_int_eq(prl_job_config_set(&c, "grpo.correction.kind=none"), PRL_OK);
    ck_assert_int_eq(prl_job_config_set(&c, "grpo.correction.mode=bypass"), PRL_OK);
    ck_assert_int_eq(prl_job_config_set(&c, "grpo.correction.bypass_loss=reinforce"), PRL_OK);
    ck_assert_int_eq(prl_job_config_set(&c, "grpo.correction.kind=tis"), PRL_OK);
    prl_job_config_free(&c);
    expect_error("{\"grpo\": {\"correction\": {\"kind\": \"tis2\"}}}",
                 "key 'grpo.correction.kind': 'tis2' is not one of none|tis|mis|icepop|kpop");
    expect_error("{\"grpo\": {\"correction\": {\"kpop_pih\": 1}}}",
                 "did you mean 'grpo.correction.kpop_phi'?");
    expect_error("{\"grpo\": {\"correction\": {\"kpop_phi\": 0}}}",
                 "key 'grpo.correction.kpop_phi' = 0 is out of range");
    expect_error("{\"grpo\": {\"correction\": {\"pcc_threshold\": 1.5}}}",
                 "key 'grpo.correction.pcc_threshold' = 1.5 is out of range");
    expect_error("{\"grpo\": {\"correction\": {\"extreme_ratio\": 1}}}",
                 "key 'grpo.correction.extreme_ratio' = 1 is out of range");
    expect_error("{\"grpo\": {\"correction\": {\"kind\": \"kpop\", \"level\": \"sequence\"}}}",
                 "key 'grpo.correction.level' = sequence");
    expect_error(
        "{\"grpo\": {\"correction\": {\"bypass_loss\": \"reinforce\"}}}",
        "key 'grpo.correction.bypass_loss' = reinforce needs grpo.correction.mode = bypass");
    expect_error("{\"grpo\": {\"correction\": {\"kind\": \"kpop\", \"mode\": \"bypass\", "
                 "\"bypass_loss\": \"reinforce\"}}}",
                 "key 'grpo.correction.kind' = kpop needs");
    expect_error("{\"grpo\": {\"correction\": {\"kind\": \"icepop\", \"mode\": \"bypass\"}}}",
                 "key 'grpo.correction.kind' = icepop with mode = bypass");
    expect_error("{\"grpo\": {\"correction\": {\"mode\": \"bypass\", \"denominator\": \"kept\"}}}",
                 "key 'grpo.correction.denominator' = kept needs");
    expect_error("{\"grpo\": {\"correction\": {\"icepop_low\": 6}}}",
                 "key 'grpo.correction.icepop_low' must be <=");
    expect_error("{\"grpo\": {\"correction\": {\"pcc_rule\": true, \"strict\": {\"tis_cap\": 3}}}}",
                 "key 'grpo.correction.strict.*'");
}
END_TEST

static void expect_recipe_error(const char *json, const char *needle)
{
    prl_sft_recipe r;
    ck_assert_int_eq(prl_sft_recipe_default(&r), PRL_OK);
    ck_assert_int_eq(prl_sft_recipe_parse(&r, json, "recipe.json"), PRL_ERR_CONFIG);
    ck_assert_msg(strstr(prl_error_message(), needle), "%s: got '%s', want '%s'", json,
                  prl_error_message(), needle);
    prl_sft_recipe_free(&r);
}

START_TEST(test_sft_recipe)
{
    prl_sft_recipe r;
    ck_assert_int_eq(prl_sft_recipe_default(&r), PRL_OK);
    ck_assert_int_eq(prl_sft_recipe_parse(&r,
                                          "{\"demos\": {\"agent\": {\"d2\": 7}, \"coding\": "
                                          "{\"d3\": 5}}, \"sft\": {\"steps\": 50}}",
                                          "r.json"),
                     PRL_OK);
    ck_assert_int_eq(r.demos[2][1], 7); /* agent, difficulty 2 */
    ck_assert_int_eq(r.demos[3][2], 5);
    ck_assert_int_eq(r.demos[0][0], 0);
    ck_assert_int_eq(r.steps, 50);
    ck_assert_str_eq(r.dir, "runs/sft-base");
    ck_assert(r.special_tokens == 1 && r.vocab_size == 4096);
    char *text = prl_sft_recipe_to_json(&r);
    ck_assert(strstr(text, "\"agent\": {\n      \"d1\": 0,\n      \"d2\": 7"));
    prl_sft_recipe q;
    ck_assert_int_eq(prl_sft_recipe_default(&q), PRL_OK);
    ck_assert_int_eq(prl_sft_recipe_parse(&q, text, "round trip"), PRL_OK);
    char *text2 = prl_sft_recipe_to_json(&q);
    ck_assert_str_eq(text, text2);
    free(text), free(text2);
    prl_sft_recipe_free(&q);
    prl_sft_recipe_free(&r);
    expect_recipe_error("{\"demos\": {\"agent\": {\"d4\": 1}}}",
                        "unknown key 'demos.agent.d4' (did you mean");
    expect_recipe_error("{\"demos\": {\"agent\": 3}}", "'demos.agent' must be an object of keys");
    expect_recipe_error("{\"demos\": {\"agent\": {\"d1\": -1}}}",
                        "key 'demos.agent.d1' = -1 is out of range");
    expect_recipe_error("{\"sft\": {\"steps\": 9}}", "no demonstrations");
    expect_recipe_error("{\"demos\": {\"general\": {\"d1\": 9}}, \"sft\": {\"warmup\": 300}}",
                        "sft.warmup");
    expect_recipe_error(
        "{\"demos\": {\"general\": {\"d1\": 9}}, \"sft\": {\"optimizer\": \"sgd\"}}",
        "key 'sft.optimizer': 'sgd' is not one of adamw|muon");
    expect_recipe_error("{\"tokenizer\": {\"special_tokens\": 1}}",
                        "key 'tokenizer.special_tokens' must be true or false");
    /* post-hoc sparsification keys (configs/dsa-convert.json) */
    expect_recipe_error("{\"demos\": {\"general\": {\"d1\": 9}}, \"dsa\": {\"warmup_steps\": -1}}",
                        "key 'dsa.warmup_steps' = -1 is out of range");
    prl_sft_recipe c;
    ck_assert_int_eq(prl_sft_recipe_default(&c), PRL_OK);
    ck_assert_int_eq(prl_sft_recipe_load(&c, PRL_SOURCE_DIR "/configs/dsa-convert.json"), PRL_OK);
    ck_assert_str_eq(c.init_from, "runs/sft-base/ckpt");
    ck_assert(c.dsa_warmup_steps > 0 && c.dsa_warmup_lr > 0);
    prl_sft_recipe_free(&c);
    expect_recipe_error("{\"steps\": 3}", "unknown key 'steps'");
}
END_TEST

/* run.name becomes runs/NAME/: a path, an empty or multi-line name is refused naming the key
** and the rule (issue 28 finding 5: "../../x" wrote the run outside --runs). */
START_TEST(test_run_name_is_a_name)
{
    static const char *const bad[][2] = {
        {"\"../../x\"", "= \"../../x\" starts with '.'"},
        {"\"a/b\"", "= \"a/b\": character 2 is '/'"},
        {"\"\"", "= \"\" has 0 characters"},
        {"\"a\\nb\"", "= \"a\\x0ab\": character 2 is byte 0x0a"},
        {"\".hidden\"", "starts with '.'"},
        {"\"x y\"", "character 2 is ' '"},
        {"\"caf\\u00e9\"", "character 4 is byte 0xc3"},
    };
    char json[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(json, sizeof json, "{\"run\": {\"name\": %s}}", bad[i][0]);
        expect_error(json, "job.json: key 'run.name'");
        expect_error(json, bad[i][1]);
        expect_error(json, "a name is 1 to 100 of A-Z a-z 0-9 . _ -");
    }
    char long_name[PRL_JOB_NAME_MAX + 2];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[PRL_JOB_NAME_MAX + 1] = 0;
    snprintf(json, sizeof json, "{\"run\": {\"name\": \"%s\"}}", long_name);
    expect_error(json, "has 101 characters");
    prl_job_config c;
    ck_assert_int_eq(prl_job_config_default(&c), PRL_OK);
    long_name[PRL_JOB_NAME_MAX] = 0; /* 100: the longest allowed */
    snprintf(json, sizeof json, "{\"run\": {\"name\": \"%s\"}}", long_name);
    assert_ok(prl_job_config_parse(&c, json, "job.json"));
    assert_ok(prl_job_config_set(&c, "run.name=Coding-r2_v1.5"));
    ck_assert_int_eq(prl_job_config_set(&c, "run.name=../x"), PRL_ERR_CONFIG);
    assert_msg_has("--set: key 'run.name' = \"../x\"");
    prl_job_config_free(&c);
    expect_recipe_error("{\"demos\": {\"general\": {\"d1\": 9}}, \"run\": {\"name\": \"../sft\"}}",
                        "key 'run.name' = \"../sft\"");
    expect_recipe_error("{\"demos\": {\"general\": {\"d1\": 9}}, \"run\": {\"name\": \"\"}}",
                        "key 'run.name' = \"\" has 0");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("job");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_defaults_and_overrides);
    tcase_add_test(tc, test_errors_name_the_key);
    tcase_add_test(tc, test_learned_reward_keys);
    tcase_add_test(tc, test_max_rejected_and_resume);
    tcase_add_test(tc, test_correction_keys);
    tcase_add_test(tc, test_task_mix);
    tcase_add_test(tc, test_prompt_file_and_program_keys);
    tcase_add_test(tc, test_sft_recipe);
    tcase_add_test(tc, test_run_name_is_a_name);
    tcase_add_test(tc, test_bus_keys);
    tcase_add_test(tc, test_trainer_hosts);
    suite_add_tcase(s, tc);
    return check_run(s);
}
