/*
** test_grpo_trainer.c — the GRPO training step (grpo/trainer.c, grpo/batch.c) on the micro model: the train
** message round trip and every malformed case named in its error, a fuzz of the unpacking,
** the first update's ratio of 1 (and a zero train–infer mismatch when the infer log-probs are
** the train path's), no change when every reward in a group is equal, a toy bandit that must
** raise the rewarded token's probability (the sign of the update), a k3 KL pull towards a
** reference model, the mismatch corrections in the step (off: bitwise the plain update; on:
** a different update; masks that take every token: no change; the denominator; bypass mode),
** loss scaling (an fp16 overflow skips the update and backs the scale off; in fp32 a scaled
** update equals the plain one bitwise; the precision keys), GSPO, RLOO and grpo.expert_clip
** in the step (their keys, what each changes and what it must leave bitwise alone), and
** bitwise-identical weights for 1 and 2 threads.
**
** Longer than ~800 lines on purpose: one Check suite per module, whose cases share the
** fixtures and helpers at its top (split by case, they would be repeated or moved to a header
** with one reader).
*/
#include "grpo/grpo.h"

#include "tests/msg_util.h"
#include "job/job.h"
#include "tests/check_util.h"
#include "tests/grpo_util.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ fixtures -------- */

static void adamw(prl_optim *o, const prl_model *m, double lr, double wd)
{
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    oc.lr = lr, oc.weight_decay = wd;
    assert_ok(prl_optim_init(o, m, &oc));
}

/* n samples in groups of 4: prompt of 3 tokens, response of 1 + i % 5 tokens (<= 8 in all,
** the micro context is 12); mask 0 on every third response token; rewards 0/1 by sample. */
static void toy_batch(prl_grpo_batch *b, int n)
{
    size_t tokens = 0, response = 0;
    for (int i = 0; i < n; i++) tokens += 3 + 1 + i % 5, response += 1 + i % 5;
    assert_ok(prl_grpo_batch_init(b, n, tokens, response));
    prl_rng r;
    prl_rng_init(&r, 7, 0, 0, 0, PRL_RNG_TEST);
    size_t t = 0, k = 0;
    for (int i = 0; i < n; i++) {
        int len = 3 + 1 + i % 5;
        b->offsets[i] = (int32_t)t;
        b->prompt_lens[i] = 3;
        b->groups[i] = i / 4;
        b->rewards[i] = (float)((i * 7) % 3 == 0);
        for (int j = 0; j < len; j++) b->tokens[t++] = 10 + (int32_t)(prl_rng_u64(&r) % 54);
        for (int j = 0; j < len - 3; j++, k++) {
            b->logprobs[k] = -1.0f;
            b->mask[k] = j % 3 != 2;
        }
    }
    b->offsets[n] = (int32_t)t;
    assert_ok(prl_grpo_batch_check(b));
}

static void config_1x1(prl_grpo_train_config *c)
{
    prl_grpo_train_config_default(c);
    c->micro_rows = 3; /* several micro-batches per minibatch */
}

/* A model, its AdamW, a toy batch of n samples, a 1×1 config and a copy of the weights. */
typedef struct fixture {
    prl_model m;
    prl_optim o;
    prl_grpo_batch b;
    prl_grpo_train_config c;
    prl_real *before;
} fixture;

static void fixture_init(fixture *f, uint64_t seed, int pure, double lr, double wd, int n)
{
    micro_model(&f->m, seed, pure);
    adamw(&f->o, &f->m, lr, wd);
    toy_batch(&f->b, n);
    config_1x1(&f->c);
    f->before = malloc(f->m.n_params * sizeof *f->before);
    ck_assert_ptr_nonnull(f->before);
    memcpy(f->before, f->m.params, f->m.n_params * sizeof *f->before);
}

/* A malloc'd copy of the model's parameters. */
static prl_real *params_copy(const prl_model *m)
{
    prl_real *copy = malloc(m->n_params * sizeof *copy);
    ck_assert_ptr_nonnull(copy);
    memcpy(copy, m->params, m->n_params * sizeof *copy);
    return copy;
}

static void fixture_free(fixture *f)
{
    free(f->before);
    prl_grpo_batch_free(&f->b);
    prl_optim_free(&f->o);
    prl_model_free(&f->m);
}

/* ------------------------------------------------------------------ the message ----- */

/* A `train` message with its header fields but no count and no frames. */
static void train_header(prl_bus_msg *m)
{
    assert_ok(prl_bus_msg_init(m, prl_msg_spec("train"), "run-test", 1));
    assert_ok(prl_bus_msg_set_uint(m, "lease", 3));
    assert_ok(prl_bus_msg_set_uint(m, "step", 4));
    assert_ok(prl_bus_msg_set_uint(m, "policy_version", 5));
    assert_ok(prl_bus_msg_set_str(m, "path", "ckpt/v000005"));
}

/* A train message of `b` built frame by frame: `skip` is left out, `retype` flips i32 ↔ f32. */
static void make_msg(prl_bus_msg *m, const prl_grpo_batch *b, const char *skip, const char *retype)
{
    train_header(m);
    assert_ok(prl_bus_msg_set_uint(m, "count", (uint64_t)b->n));
    const struct {
        const char *name;
        prl_bus_dtype dt;
        const void *data;
        size_t count;
    } f[] = {{"tokens", PRL_BUS_I32, b->tokens, b->n_tokens},
             {"offsets", PRL_BUS_I32, b->offsets, (size_t)b->n + 1},
             {"prompt_lens", PRL_BUS_I32, b->prompt_lens, (size_t)b->n},
             {"mask", PRL_BUS_U8, b->mask, b->n_response},
             {"rewards", PRL_BUS_F32, b->rewards, (size_t)b->n},
             {"groups", PRL_BUS_I32, b->groups, (size_t)b->n},
             {"logprobs", PRL_BUS_F32, b->logprobs, b->n_response}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (skip && !strcmp(skip, f[i].name)) continue;
        prl_bus_dtype dt = f[i].dt;
        if (retype && !strcmp(retype, f[i].name))
            dt = dt == PRL_BUS_I32 ? PRL_BUS_F32 : PRL_BUS_I32;
        assert_ok(prl_bus_msg_add_frame(m, f[i].name, dt, f[i].data, f[i].count));
    }
}

static void *frame_data(prl_bus_msg *m, const char *name)
{
    const prl_bus_frame *f = prl_bus_msg_frame(m, name);
    ck_assert_ptr_nonnull(f);
    return f->data;
}

START_TEST(test_msg_round_trip)
{
    prl_grpo_batch b, back;
    toy_batch(&b, 9);
    prl_bus_msg m, manual, decoded;
    assert_ok(train_to_msg(&b, NULL, &m));
    make_msg(&manual, &b, NULL, NULL);
    ck_assert(prl_bus_msg_equal(&m, &manual)); /* the frames docs/pipeline.md names */
    /* through the wire codec and back */
    prl_bus_wire w;
    assert_ok(prl_bus_encode(&m, &w));
    assert_ok(prl_bus_decode(prl_msg_registry(), w.parts, w.n, &decoded, NULL, 0));
    assert_ok(train_batch_from_msg(&back, &decoded));
    ck_assert_int_eq(back.n, b.n);
    ck_assert_uint_eq(back.n_tokens, b.n_tokens);
    ck_assert_uint_eq(back.n_response, b.n_response);
    ck_assert_mem_eq(back.tokens, b.tokens, b.n_tokens * sizeof *b.tokens);
    ck_assert_mem_eq(back.offsets, b.offsets, ((size_t)b.n + 1) * sizeof *b.offsets);
    ck_assert_mem_eq(back.prompt_lens, b.prompt_lens, (size_t)b.n * sizeof *b.prompt_lens);
    ck_assert_mem_eq(back.rewards, b.rewards, (size_t)b.n * sizeof *b.rewards);
    ck_assert_mem_eq(back.groups, b.groups, (size_t)b.n * sizeof *b.groups);
    ck_assert_mem_eq(back.logprobs, b.logprobs, b.n_response * sizeof *b.logprobs);
    ck_assert_mem_eq(back.mask, b.mask, b.n_response);
    prl_bus_wire_free(&w);
    prl_bus_msg_free(&decoded), prl_bus_msg_free(&manual), prl_bus_msg_free(&m);
    prl_grpo_batch_free(&back), prl_grpo_batch_free(&b);
}
END_TEST

/* Each malformed case is an error naming the frame (and the sample); the batch is left empty. */
static void expect_bad(prl_bus_msg *m, const char *frame, const char *sample)
{
    prl_grpo_batch out;
    prl_status rc = train_batch_from_msg(&out, m);
    ck_assert_msg(rc != PRL_OK, "accepted a message with a bad '%s'", frame);
    assert_msg_has(frame);
    if (sample) assert_msg_has(sample);
    ck_assert_ptr_null(out.tokens);
    prl_bus_msg_free(m);
}

START_TEST(test_msg_malformed)
{
    prl_grpo_batch b;
    toy_batch(&b, 9);
    prl_bus_msg m;
    make_msg(&m, &b, "groups", NULL);
    expect_bad(&m, "'groups' is missing", NULL);
    make_msg(&m, &b, NULL, "rewards");
    expect_bad(&m, "'rewards' is i32", NULL);
    make_msg(&m, &b, NULL, NULL);
    assert_ok(prl_bus_msg_set_uint(&m, "count", 10)); /* count disagrees with the frames */
    expect_bad(&m, "'offsets' has 10 elements, expected 11", NULL);
    make_msg(&m, &b, NULL, NULL);
    assert_ok(prl_bus_msg_set_uint(&m, "count", 0));
    expect_bad(&m, "count", NULL);
    make_msg(&m, &b, NULL, NULL);
    ((int32_t *)frame_data(&m, "offsets"))[2] = b.offsets[1]; /* sample 1 is empty */
    expect_bad(&m, "offsets", "sample 1");
    make_msg(&m, &b, NULL, NULL);
    ((int32_t *)frame_data(&m, "offsets"))[b.n] += 1; /* more tokens than the frame has */
    expect_bad(&m, "offsets: the last offset", NULL);
    make_msg(&m, &b, NULL, NULL);
    ((int32_t *)frame_data(&m, "prompt_lens"))[2] = b.offsets[3] - b.offsets[2]; /* no response */
    expect_bad(&m, "prompt_lens", "sample 2");
    make_msg(&m, &b, NULL, NULL);
    ((int32_t *)frame_data(&m, "prompt_lens"))[4] = 0;
    expect_bad(&m, "prompt_lens", "sample 4");
    make_msg(&m, &b, NULL, NULL);
    ((uint8_t *)frame_data(&m, "mask"))[b.n_response - 1] = 2;
    expect_bad(&m, "mask", "sample 8");
    make_msg(&m, &b, NULL, NULL);
    ((float *)frame_data(&m, "rewards"))[1] = NAN;
    expect_bad(&m, "rewards", "sample 1");
    make_msg(&m, &b, NULL, NULL);
    ((float *)frame_data(&m, "logprobs"))[0] = INFINITY;
    expect_bad(&m, "logprobs", "sample 0");
    make_msg(&m, &b, NULL, NULL);
    ((float *)frame_data(&m, "logprobs"))[3] = 0.5f; /* not a log-probability */
    expect_bad(&m, "logprobs", "sample 2 response token 0");
    make_msg(&m, &b, NULL, NULL);
    ((int32_t *)frame_data(&m, "tokens"))[b.offsets[3] + 1] = -4;
    expect_bad(&m, "tokens", "sample 3 position 1");
    /* the response lengths and the log-prob count disagree */
    prl_grpo_batch short_b = b;
    short_b.n_response--;
    make_msg(&m, &short_b, NULL, NULL);
    expect_bad(&m, "logprobs", NULL);
    /* a message of another type */
    assert_ok(prl_bus_msg_init(&m, prl_msg_spec("stop"), "run-test", 1));
    expect_bad(&m, "'stop' message", NULL);
    prl_grpo_batch_free(&b);
}
END_TEST

/* Random bytes in random frames and random counts: an error or a valid batch, never a crash. */
START_TEST(test_msg_fuzz)
{
    static const char *names[] = {"tokens", "offsets",  "prompt_lens", "rewards",
                                  "groups", "logprobs", "mask"};
    prl_grpo_batch b;
    toy_batch(&b, 9);
    prl_rng r;
    prl_rng_init(&r, 11, 0, 0, 0, PRL_RNG_TEST);
    int accepted = 0;
    for (int it = 0; it < 4000; it++) {
        prl_bus_msg m;
        make_msg(&m, &b, NULL, NULL);
        int edits = 1 + (int)(prl_rng_u64(&r) % 3);
        for (int e = 0; e < edits; e++) {
            const prl_bus_frame *f = prl_bus_msg_frame(&m, names[prl_rng_u64(&r) % 7]);
            ((uint8_t *)f->data)[prl_rng_u64(&r) % f->bytes] = (uint8_t)prl_rng_u64(&r);
        }
        if (prl_rng_u64(&r) % 8 == 0)
            assert_ok(prl_bus_msg_set_uint(&m, "count", prl_rng_u64(&r) % 12));
        prl_grpo_batch out;
        if (train_batch_from_msg(&out, &m) == PRL_OK) {
            accepted++;
            assert_ok(prl_grpo_batch_check(&out));
            prl_grpo_batch_free(&out);
        }
        prl_bus_msg_free(&m);
    }
    ck_assert_int_gt(accepted, 0); /* e.g. a changed token id or reward is still valid */
    prl_grpo_batch_free(&b);
}
END_TEST

/* ------------------------------------------------------------------ configuration --- */

START_TEST(test_config_from_job)
{
    prl_job_config j;
    assert_ok(prl_job_config_default(&j));
    assert_ok(prl_job_config_set(&j, "grpo.ppo_epochs=2"));
    assert_ok(prl_job_config_set(&j, "grpo.loss_agg=seq-mean-token-mean"));
    assert_ok(prl_job_config_set(&j, "grpo.singleton=drop"));
    assert_ok(prl_job_config_set(&j, "optim.grad_clip=0.5"));
    prl_grpo_train_config c;
    assert_ok(prl_grpo_train_config_from_job(&c, &j));
    ck_assert_int_eq(c.ppo_epochs, 2);
    ck_assert_int_eq(c.loss.agg, PRL_GRPO_AGG_SEQ_MEAN_TOKEN_MEAN);
    ck_assert_int_eq(c.singleton, PRL_GRPO_SINGLETON_DROP);
    ck_assert(c.grad_clip == 0.5 && c.loss.clip_high == 0.28 && c.ref == NULL);
    prl_optim_config oc;
    assert_ok(prl_grpo_optim_config_from_job(&oc, &j));
    ck_assert(oc.grad_clip == 0.5 && oc.lr == j.lr && oc.kind == PRL_OPTIM_ADAMW);
    ck_assert(c.corr.kind == PRL_GRPO_CORR_NONE && c.corr.mode == PRL_GRPO_MODE_DECOUPLED);
    /* the correction keys */
    assert_ok(prl_job_config_set(&j, "grpo.correction.kind=mis"));
    assert_ok(prl_job_config_set(&j, "grpo.correction.level=sequence"));
    assert_ok(prl_job_config_set(&j, "grpo.correction.denominator=kept"));
    assert_ok(prl_job_config_set(&j, "grpo.correction.mis_cap=3"));
    assert_ok(prl_job_config_set(&j, "grpo.correction.strict.icepop_low=0.9"));
    assert_ok(prl_job_config_set(&j, "grpo.correction.pcc_rule=true"));
    assert_ok(prl_job_config_set(&j, "grpo.correction.pcc_threshold=0.95"));
    assert_ok(prl_job_config_set(&j, "grpo.correction.extreme_ratio=4"));
    assert_ok(prl_grpo_train_config_from_job(&c, &j));
    ck_assert(c.corr.kind == PRL_GRPO_CORR_MIS && c.corr.level == PRL_GRPO_LEVEL_SEQUENCE);
    ck_assert(c.corr.denominator == PRL_GRPO_DENOM_KEPT && c.corr.loose.mis_cap == 3);
    ck_assert(c.corr.strict.icepop_low == 0.9 && c.corr.strict.mis_cap == 1.5);
    ck_assert(c.corr.pcc_rule == 1 && c.corr.pcc_threshold == 0.95 && c.corr.extreme_ratio == 4);
    assert_ok(prl_job_config_set(&j, "grpo.correction.kind=none"));
    assert_ok(prl_job_config_set(&j, "grpo.correction.denominator=original"));
    assert_ok(prl_job_config_set(&j, "grpo.correction.mode=bypass"));
    assert_ok(prl_job_config_set(&j, "grpo.correction.bypass_loss=reinforce"));
    assert_ok(prl_grpo_train_config_from_job(&c, &j));
    ck_assert(c.corr.mode == PRL_GRPO_MODE_BYPASS && c.corr.bypass_loss == PRL_GRPO_LOSS_REINFORCE);
    ck_assert(c.loss.kind == PRL_GRPO_LOSS_PPO_CLIP); /* the step picks reinforce itself */
    /* kl_coef > 0 without a reference model: an error naming the key */
    assert_ok(prl_job_config_set(&j, "grpo.kl_coef=0.01"));
    assert_ok(prl_grpo_train_config_from_job(&c, &j));
    fixture f;
    fixture_init(&f, 1, 0, 1e-3, 0, 8);
    ck_assert_int_eq(prl_grpo_train_step(&f.m, &f.o, &f.b, &c, NULL), PRL_ERR_ARG);
    assert_msg_has("grpo.kl_coef");
    c.kl_coef = 0, c.ppo_epochs = 0;
    ck_assert_int_eq(prl_grpo_train_step(&f.m, &f.o, &f.b, &c, NULL), PRL_ERR_CONFIG);
    assert_msg_has("grpo.ppo_epochs");
    /* a sample longer than the context */
    c.ppo_epochs = 1;
    prl_grpo_batch big;
    assert_ok(prl_grpo_batch_init(&big, 1, 13, 10));
    big.offsets[1] = 13, big.prompt_lens[0] = 3;
    for (int t = 0; t < 13; t++) big.tokens[t] = 11;
    for (int t = 0; t < 10; t++) big.logprobs[t] = -1, big.mask[t] = 1;
    ck_assert_int_eq(prl_grpo_train_step(&f.m, &f.o, &big, &c, NULL), PRL_ERR_RANGE);
    assert_msg_has("sample 0 has 13 tokens");
    prl_grpo_batch_free(&big);
    fixture_free(&f);
    prl_job_config_free(&j);
}
END_TEST

/* ------------------------------------------------------------------ the step -------- */

START_TEST(test_first_update_ratio_one)
{
    fixture f;
    fixture_init(&f, 3, 0, 1e-3, 0, 10);
    train_logprobs(&f.m, &f.b); /* infer log-probs = the train path's: no mismatch */
    prl_grpo_step_stats st;
    assert_ok(prl_grpo_train_step(&f.m, &f.o, &f.b, &f.c, &st));
    ck_assert(st.ppo_kl == 0 && st.clipfrac == 0 && st.clipfrac_lower == 0); /* ratio exactly 1 */
    ck_assert(st.mismatch == 0 && st.mismatch_max == 0);
    ck_assert_int_eq(st.updates, 1);
    ck_assert_int_eq(st.samples, 10);
    ck_assert_int_eq(st.groups, 3);
    ck_assert_int_eq(st.singletons, 0);
    ck_assert_int_eq(st.loss_tokens, 24); /* masks 1,2,2,3,4 twice */
    ck_assert_int_eq(st.tokens, (long)f.b.n_tokens);
    ck_assert_double_eq_tol(st.reward_mean, 0.4, 1e-12);
    ck_assert_double_eq_tol(st.accuracy, 0.4, 1e-12);
    ck_assert(st.grad_norm > 0 && isfinite(st.loss));
    ck_assert(memcmp(f.before, f.m.params, f.m.n_params * sizeof *f.before) != 0);
    /* the metrics frame */
    char *json = prl_grpo_step_stats_to_json(&st);
    ck_assert_ptr_nonnull(json);
    ck_assert(strstr(json, "\"ppo_kl\":0.0") && strstr(json, "\"mismatch\":") &&
              strstr(json, "\"loss_tokens\":24"));
    free(json);
    /* a shifted infer log-prob shows in the mismatch; a second epoch moves the ratio */
    f.b.logprobs[0] -= 0.25f;
    f.c.ppo_epochs = 2;
    assert_ok(prl_grpo_train_step(&f.m, &f.o, &f.b, &f.c, &st));
    ck_assert_int_eq(st.updates, 2);
    ck_assert(st.mismatch_max >= 0.2 && st.mismatch > 0);
    ck_assert(st.ppo_kl != 0);
    fixture_free(&f);
}
END_TEST

/* Equal rewards in every group: advantages 0, so with no aux loss and no weight decay the
** gradient is exactly zero and the weights do not move (over 2 epochs × 2 minibatches). */
START_TEST(test_equal_rewards_no_change)
{
    fixture f;
    fixture_init(&f, 5, 1, 1e-2, 0, 12);
    for (int i = 0; i < f.b.n; i++) f.b.rewards[i] = (float)(f.b.groups[i] % 2);
    f.c.ppo_epochs = 2, f.c.minibatches = 2;
    prl_grpo_step_stats st;
    assert_ok(prl_grpo_train_step(&f.m, &f.o, &f.b, &f.c, &st));
    ck_assert_int_eq(st.constant_groups, 3);
    ck_assert(st.grad_norm == 0 && st.loss == 0);
    ck_assert_mem_eq(f.before, f.m.params, f.m.n_params * sizeof *f.before);
    fixture_free(&f);
}
END_TEST

/* p(token | prompt) on the train path. */
static double prob_of(prl_model *m, const int32_t *prompt, int pl, int32_t token)
{
    int32_t seq[16];
    memcpy(seq, prompt, (size_t)pl * sizeof *seq);
    seq[pl] = token;
    prl_batch_buf bb;
    assert_ok(prl_batch_buf_init(&bb, 1, pl + 1));
    prl_batch_buf_set_row(&bb, pl + 1, 0, seq, pl + 1, NULL);
    prl_batch batch = prl_batch_buf_view(&bb, 1, pl + 1);
    float lp[16];
    assert_ok(prl_model_logprobs(m, &batch, lp));
    prl_batch_buf_free(&bb);
    return exp(lp[pl - 1]);
}

enum { BANDIT_PROMPTS = 4, BANDIT_G = 16, BANDIT_PL = 3, BANDIT_RESP = 2, BANDIT_TOKEN = 40 };

/* One step's samples from the infer path: reward 1 when the first response token is
** BANDIT_TOKEN. */
static void bandit_batch(prl_infer *e, int step, prl_grpo_batch *b)
{
    int n = BANDIT_PROMPTS * BANDIT_G;
    int32_t prompts[BANDIT_PROMPTS][BANDIT_PL];
    prl_gen_request req[BANDIT_PROMPTS * BANDIT_G];
    for (int p = 0; p < BANDIT_PROMPTS; p++) {
        prompts[p][0] = PRL_TOKEN_BOS, prompts[p][1] = 20 + p, prompts[p][2] = 30 + p;
        for (int g = 0; g < BANDIT_G; g++)
            req[p * BANDIT_G + g] = (prl_gen_request){.prompt = prompts[p],
                                                      .prompt_len = BANDIT_PL,
                                                      .seq_id = (uint64_t)(p * BANDIT_G + g)};
    }
    prl_sample_params sp;
    prl_sample_params_default(&sp);
    sp.temperature = 1, sp.max_new_tokens = BANDIT_RESP, sp.n_stop_ids = 0, sp.stop_ids = NULL;
    sp.seed = 1000 + (uint64_t)step;
    prl_gen_result res[BANDIT_PROMPTS * BANDIT_G];
    assert_ok(prl_infer_generate(e, req, n, &sp, res, NULL, NULL));
    assert_ok(
        prl_grpo_batch_init(b, n, (size_t)n * (BANDIT_PL + BANDIT_RESP), (size_t)n * BANDIT_RESP));
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(res[i].n, BANDIT_RESP);
        int32_t *t = b->tokens + (size_t)i * (BANDIT_PL + BANDIT_RESP);
        memcpy(t, prompts[i / BANDIT_G], BANDIT_PL * sizeof *t);
        memcpy(t + BANDIT_PL, res[i].tokens, BANDIT_RESP * sizeof *t);
        memcpy(b->logprobs + (size_t)i * BANDIT_RESP, res[i].logprobs, BANDIT_RESP * sizeof(float));
        memset(b->mask + (size_t)i * BANDIT_RESP, 1, BANDIT_RESP);
        b->offsets[i + 1] = (i + 1) * (BANDIT_PL + BANDIT_RESP);
        b->prompt_lens[i] = BANDIT_PL;
        b->groups[i] = i / BANDIT_G;
        b->rewards[i] = res[i].tokens[0] == BANDIT_TOKEN;
        prl_gen_result_free(&res[i]);
    }
}

static double bandit_prob(prl_model *m)
{
    double sum = 0;
    for (int p = 0; p < BANDIT_PROMPTS; p++) {
        int32_t prompt[BANDIT_PL] = {PRL_TOKEN_BOS, 20 + p, 30 + p};
        sum += prob_of(m, prompt, BANDIT_PL, BANDIT_TOKEN);
    }
    return sum / BANDIT_PROMPTS;
}

/* The sign of the update: a few steps on samples drawn from the model raise the probability
** of the rewarded first token (flip the sign of the token weights and this fails). */
START_TEST(test_bandit_raises_rewarded_token)
{
    prl_model m;
    micro_model(&m, 9, 0);
    prl_optim o;
    adamw(&o, &m, 1e-2, 0);
    prl_infer_options io;
    prl_infer_options_default(&io);
    prl_infer *e;
    assert_ok(prl_infer_init(&e, &m, &io));
    prl_grpo_train_config c;
    config_1x1(&c);
    c.micro_rows = 16;
    double p0 = bandit_prob(&m), acc0 = 0, acc_last = 0;
    for (int step = 0; step < 12; step++) {
        prl_grpo_batch b;
        bandit_batch(e, step, &b);
        prl_grpo_step_stats st;
        assert_ok(prl_grpo_train_step(&m, &o, &b, &c, &st));
        ck_assert(st.mismatch < 1e-3); /* the infer path agrees with the train path */
        if (step == 0) acc0 = st.accuracy;
        acc_last = st.accuracy;
        assert_ok(prl_infer_refresh(e));
        prl_grpo_batch_free(&b);
    }
    double p1 = bandit_prob(&m);
    printf("bandit: p(token %d) %.4f -> %.4f, accuracy %.3f -> %.3f\n", BANDIT_TOKEN, p0, p1, acc0,
           acc_last);
    ck_assert_msg(p1 > 3 * p0, "p(rewarded token) %.4f -> %.4f did not rise", p0, p1);
    prl_infer_free(e);
    prl_optim_free(&o), prl_model_free(&m);
}
END_TEST

/* The k3 KL to a reference model: with no policy signal (equal rewards) the steps pull the
** policy towards the reference, so the KL falls. */
START_TEST(test_kl_pulls_to_reference)
{
    fixture f;
    fixture_init(&f, 12, 1, 1e-2, 0, 8);
    prl_model ref;
    micro_model(&ref, 13, 1);
    for (int i = 0; i < f.b.n; i++) f.b.rewards[i] = 1;
    f.c.kl_coef = 1.0, f.c.ref = &ref;
    prl_grpo_step_stats st;
    double first = 0;
    for (int s = 0; s < 6; s++) {
        assert_ok(prl_grpo_train_step(&f.m, &f.o, &f.b, &f.c, &st));
        if (s == 0) first = st.kl;
    }
    printf("kl: %.6f -> %.6f\n", first, st.kl);
    ck_assert(first > 0 && st.kl < 0.5 * first);
    prl_model_free(&ref);
    fixture_free(&f);
}
END_TEST

/* ------------------------------------------------------------------ mismatch correction */

/* How a correction test sets the infer log-probs, from the train path's own. */
enum infer_edit {
    INFER_EXACT,   /* equal: no mismatch */
    INFER_SHIFT,   /* −0.9 (ratio e^0.9 = 2.46), every third token +0.4 (ratio e^−0.4 = 0.67;
                   ** not every other one: the toy batch's advantages cancel on those) */
    INFER_FAR,     /* q = e^−0.001 ≈ 1 for every token: p/q ≈ p ≪ 0.5, binary KL ≫ 0.75 */
    INFER_FIFTH,   /* q = 0.2 for every token: against p ≈ 1/64 the binary KL is about
                   ** 0.2 ln(0.2·64) + 0.8 ln(0.8/(63/64)) = 0.34, between φ 0.1 and 0.75 */
    INFER_ONE_OFF, /* sample 3's tokens +3 (ratio e^−3 = 0.05), the others exact */
    INFER_ONE_UNMASKED,  /* exact, and sample 3's loss mask all 0 */
    INFER_TOKEN_OFF,     /* sample 3's first response token +3, the others exact */
    INFER_TOKEN_UNMASKED /* exact, and the loss mask of sample 3's first response token 0 */
};

static void edit_infer(prl_grpo_batch *b, enum infer_edit e)
{
    size_t first;
    int len;
    prl_grpo_batch_response(b, 3, &first, &len);
    for (size_t k = 0; k < b->n_response; k++) {
        float lp = b->logprobs[k];
        int in3 = k >= first && k < first + (size_t)len;
        if (e == INFER_SHIFT) b->logprobs[k] = k % 3 ? lp - 0.9f : fminf(lp + 0.4f, 0);
        if (e == INFER_FAR) b->logprobs[k] = -0.001f;
        if (e == INFER_FIFTH) b->logprobs[k] = logf(0.2f);
        if (e == INFER_ONE_OFF && in3) b->logprobs[k] = fminf(lp + 3, 0);
        if (e == INFER_ONE_UNMASKED && in3) b->mask[k] = 0;
        if (e == INFER_TOKEN_OFF && k == first) b->logprobs[k] = fminf(lp + 3, 0);
        if (e == INFER_TOKEN_UNMASKED && k == first) b->mask[k] = 0;
    }
}

/* One step (1 epoch × 1 minibatch, no aux loss, no weight decay) of a fresh micro model with
** correction `cc` on the toy batch of 8 with infer log-probs `e`; the weights after it
** (malloc'd), and whether they moved. */
static prl_real *corr_step_agg(const prl_grpo_corr_config *cc, prl_grpo_agg agg, enum infer_edit e,
                               prl_grpo_step_stats *st, int *moved)
{
    fixture f;
    fixture_init(&f, 9, 1, 1e-2, 0, 8);
    train_logprobs(&f.m, &f.b);
    edit_infer(&f.b, e);
    f.c.corr = *cc;
    f.c.loss.agg = agg;
    assert_ok(prl_grpo_train_step(&f.m, &f.o, &f.b, &f.c, st));
    prl_real *copy = params_copy(&f.m);
    *moved = memcmp(f.before, f.m.params, f.m.n_params * sizeof *copy) != 0;
    fixture_free(&f);
    return copy;
}

static prl_real *corr_step(const prl_grpo_corr_config *cc, enum infer_edit e,
                           prl_grpo_step_stats *st, int *moved)
{
    return corr_step_agg(cc, PRL_GRPO_AGG_TOKEN_MEAN, e, st, moved);
}

static size_t n_params(void)
{
    prl_model m;
    micro_model(&m, 9, 1);
    size_t n = m.n_params;
    prl_model_free(&m);
    return n;
}

static prl_grpo_corr_config corr_of(prl_grpo_corr kind)
{
    prl_grpo_corr_config c;
    prl_grpo_corr_config_default(&c);
    c.kind = kind;
    return c;
}

/* Correction `none` is the plain update whatever the other correction keys say, and TIS on
** a batch without mismatch (every weight exactly e^0 = 1) is bitwise the plain update too. */
START_TEST(test_correction_off_unchanged)
{
    size_t bytes = n_params() * sizeof(prl_real);
    prl_grpo_step_stats st;
    int moved;
    prl_grpo_corr_config none = corr_of(PRL_GRPO_CORR_NONE), other = none;
    other.pcc_rule = 1, other.pcc_threshold = 1, other.denominator = PRL_GRPO_DENOM_KEPT;
    other.extreme_ratio = 3, other.strict.kpop_phi = 0.01;
    prl_real *a = corr_step(&none, INFER_SHIFT, &st, &moved);
    ck_assert(moved && st.corr.kind == PRL_GRPO_CORR_NONE && st.corr_masked_frac == 0);
    ck_assert(st.is_weight_mean == 1 && st.is_weight_ess == 1);
    prl_real *b = corr_step(&other, INFER_SHIFT, &st, &moved);
    ck_assert_mem_eq(a, b, bytes);
    ck_assert_int_eq(st.mm.strict, 1); /* the rule fired but no correction applies it */
    prl_grpo_corr_config tis = corr_of(PRL_GRPO_CORR_TIS);
    tis.loose.tis_cap = 1.0;
    free(a), free(b);
    a = corr_step(&none, INFER_EXACT, &st, &moved);
    b = corr_step(&tis, INFER_EXACT, &st, &moved);
    ck_assert_mem_eq(a, b, bytes);
    ck_assert(st.mm.tis_clipfrac == 0 && st.is_weight_max == 1);
    free(a), free(b);
}
END_TEST

/* With a mismatch, TIS (cap 1: every ratio e^0.9 becomes 1, every e^−0.4 stays) changes the
** update; the applied weights are within the cap and TIS masks nothing. */
START_TEST(test_correction_changes_update)
{
    size_t bytes = n_params() * sizeof(prl_real);
    prl_grpo_step_stats st;
    int moved;
    prl_grpo_corr_config none = corr_of(PRL_GRPO_CORR_NONE), tis = corr_of(PRL_GRPO_CORR_TIS);
    tis.loose.tis_cap = 1.0;
    prl_real *a = corr_step(&none, INFER_SHIFT, &st, &moved);
    double plain_loss = st.loss;
    prl_real *b = corr_step(&tis, INFER_SHIFT, &st, &moved);
    ck_assert(moved && memcmp(a, b, bytes) != 0);
    ck_assert(st.corr_masked_frac == 0 && st.is_weight_max <= 1.0 && st.is_weight_min < 0.7);
    ck_assert_msg(st.loss != plain_loss, "loss %.9g plain %.9g", st.loss, plain_loss);
    ck_assert(st.mm.tis_clipfrac > 0.5 && st.mm.tis_clipfrac < 0.8); /* about 2 in 3 tokens */
    char *json = prl_grpo_step_stats_to_json(&st);
    ck_assert_ptr_nonnull(json);
    ck_assert(strstr(json, "\"correction\":\"tis\"") &&
              strstr(json, "\"denominator\":\"original\"") && strstr(json, "\"pcc\":") &&
              strstr(json, "\"kpop_masked_frac\":") && strstr(json, "\"chi2_seq\":") &&
              strstr(json, "\"is_weight_ess\":"));
    free(json);
    free(a), free(b);
}
END_TEST

/* Masks that take every token: no gradient, so (no aux loss, no decay) the weights stay
** bitwise where they were. IcePop: p/q ≈ p < 0.5; KPop: q ≈ 1 against p ≈ 1/64. */
START_TEST(test_correction_masks_all)
{
    prl_grpo_step_stats st;
    int moved;
    const prl_grpo_corr kinds[2] = {PRL_GRPO_CORR_ICEPOP, PRL_GRPO_CORR_KPOP};
    for (int k = 0; k < 2; k++) {
        prl_grpo_corr_config c = corr_of(kinds[k]);
        free(corr_step(&c, INFER_FAR, &st, &moved));
        ck_assert_msg(!moved, "%s moved the weights", prl_grpo_corr_name(kinds[k]));
        ck_assert(st.corr_masked_frac == 1 && st.loss == 0 && st.grad_norm == 0);
        ck_assert(isnan(st.is_weight_ess));
        ck_assert(st.mm.kpop_masked_frac == 1 && st.mm.icepop_masked_frac == 1);
        char *json = prl_grpo_step_stats_to_json(&st); /* undefined is null in run.db */
        ck_assert_ptr_nonnull(json);
        ck_assert(strstr(json, "\"is_weight_ess\":null") &&
                  strstr(json, "\"corr_masked_frac\":1.0"));
        free(json);
    }
    /* and without the mask the same batch moves them */
    prl_grpo_corr_config none = corr_of(PRL_GRPO_CORR_NONE);
    free(corr_step(&none, INFER_FAR, &st, &moved));
    ck_assert(moved);
}
END_TEST

/* rl.md §2.8 with IcePop masking sample 3's 3 loss tokens (ratio e^−3), the other tokens at
** ratio 1 (weight 1). On the first update the ratio is 1, so the token-mean loss is
** Σ_kept L / N: `original` divides by all N loss tokens, `kept` by N − 3, hence
** loss_kept · (N − 3) = loss_original · N. `kept` equals training without sample 3's tokens
** (its loss mask 0) bitwise. With one of sample 3's tokens masked and seq-mean-token-mean,
** `kept` also takes the token out of that sequence's |o_i|: bitwise the run without the
** token's loss mask. */
START_TEST(test_correction_denominator)
{
    size_t bytes = n_params() * sizeof(prl_real);
    prl_grpo_step_stats st;
    int moved;
    prl_grpo_corr_config ice = corr_of(PRL_GRPO_CORR_ICEPOP);
    prl_real *orig = corr_step(&ice, INFER_ONE_OFF, &st, &moved);
    double N = (double)st.loss_tokens, loss_orig = st.loss;
    ck_assert_double_eq_tol(st.corr_masked_frac * N, 3, 1e-9);
    ck_assert_int_eq(st.corr.denominator, PRL_GRPO_DENOM_ORIGINAL);
    ice.denominator = PRL_GRPO_DENOM_KEPT;
    prl_real *kept = corr_step(&ice, INFER_ONE_OFF, &st, &moved);
    ck_assert(loss_orig != 0 && memcmp(orig, kept, bytes) != 0);
    ck_assert_msg(fabs(st.loss * (N - 3) - loss_orig * N) < 1e-6 * fabs(loss_orig * N),
                  "kept %.9g x %g vs original %.9g x %g", st.loss, N - 3, loss_orig, N);
    prl_grpo_corr_config none = corr_of(PRL_GRPO_CORR_NONE);
    prl_real *without = corr_step(&none, INFER_ONE_UNMASKED, &st, &moved);
    ck_assert_mem_eq(kept, without, bytes);
    free(orig), free(kept), free(without);
    const prl_grpo_agg seq_mean = PRL_GRPO_AGG_SEQ_MEAN_TOKEN_MEAN;
    kept = corr_step_agg(&ice, seq_mean, INFER_TOKEN_OFF, &st, &moved);
    ck_assert_double_eq_tol(st.corr_masked_frac * N, 1, 1e-9);
    without = corr_step_agg(&none, seq_mean, INFER_TOKEN_UNMASKED, &st, &moved);
    ck_assert_mem_eq(kept, without, bytes);
    ice.denominator = PRL_GRPO_DENOM_ORIGINAL;
    orig = corr_step_agg(&ice, seq_mean, INFER_TOKEN_OFF, &st, &moved);
    ck_assert(memcmp(orig, without, bytes) != 0);
    free(orig), free(kept), free(without);
}
END_TEST

/* Bypass (rl.md §2.1): the PPO anchor is the rollout's log-probs. Without mismatch it is the
** decoupled update bitwise; with one, the first update's ppo_kl = mean(lp_mu − lp_new) is
** the k1 metric (lp_new = lp_old there). `reinforce` with TIS differs from plain reinforce
** and keeps its weights under the cap. */
START_TEST(test_correction_bypass)
{
    size_t bytes = n_params() * sizeof(prl_real);
    prl_grpo_step_stats st;
    int moved;
    prl_grpo_corr_config dec = corr_of(PRL_GRPO_CORR_NONE), byp = dec;
    byp.mode = PRL_GRPO_MODE_BYPASS;
    prl_real *a = corr_step(&dec, INFER_EXACT, &st, &moved);
    prl_real *b = corr_step(&byp, INFER_EXACT, &st, &moved);
    ck_assert_mem_eq(a, b, bytes);
    free(a), free(b);
    a = corr_step(&dec, INFER_SHIFT, &st, &moved);
    ck_assert(st.ppo_kl == 0);
    b = corr_step(&byp, INFER_SHIFT, &st, &moved);
    ck_assert(memcmp(a, b, bytes) != 0);
    ck_assert_msg(fabs(st.ppo_kl - st.mm.k1) < 1e-6, "ppo_kl %g k1 %g", st.ppo_kl, st.mm.k1);
    free(a), free(b);
    prl_grpo_corr_config rf = byp, rf_tis = byp;
    rf.bypass_loss = rf_tis.bypass_loss = PRL_GRPO_LOSS_REINFORCE;
    rf_tis.kind = PRL_GRPO_CORR_TIS, rf_tis.loose.tis_cap = 1.0;
    a = corr_step(&rf, INFER_SHIFT, &st, &moved);
    ck_assert(moved && st.clipfrac == 0);
    b = corr_step(&rf_tis, INFER_SHIFT, &st, &moved);
    ck_assert(moved && memcmp(a, b, bytes) != 0);
    ck_assert(st.is_weight_max <= 1.0 && st.is_weight_min < 0.7 && st.corr_masked_frac == 0);
    free(a), free(b);
}
END_TEST

/* The PCC rule in the step: KPop with q = 0.2 masks more with the strict φ = 0.1 (chosen
** when the batch PCC < 1: always here, PCC is NaN for a constant q) than with the loose
** 0.75; with the rule off the setting is the loose one. */
START_TEST(test_correction_pcc_rule)
{
    size_t bytes = n_params() * sizeof(prl_real);
    prl_grpo_step_stats st;
    int moved;
    prl_grpo_corr_config kp = corr_of(PRL_GRPO_CORR_KPOP);
    prl_real *off = corr_step(&kp, INFER_FIFTH, &st, &moved);
    double loose = st.corr_masked_frac;
    ck_assert_msg(st.mm.strict == 0 && isnan(st.mm.pcc), "strict %d pcc %g", st.mm.strict,
                  st.mm.pcc);
    kp.pcc_rule = 1;
    prl_real *strict = corr_step(&kp, INFER_FIFTH, &st, &moved);
    ck_assert_msg(st.mm.strict == 1, "strict %d pcc %.9g loose masked %g now %g", st.mm.strict,
                  st.mm.pcc, loose, st.corr_masked_frac);
    ck_assert(memcmp(off, strict, bytes) != 0);
    ck_assert_msg(st.corr_masked_frac > loose, "strict %g vs loose %g", st.corr_masked_frac, loose);
    ck_assert(st.corr_masked_frac == st.mm.kpop_masked_frac); /* the metric uses the same setting */
    free(off), free(strict);
    /* a threshold of −1 that the shifted batch's PCC (defined there) meets: loose, bitwise the
    ** rule-off step */
    kp.pcc_rule = 0;
    off = corr_step(&kp, INFER_SHIFT, &st, &moved);
    ck_assert(st.mm.pcc > -1 && st.mm.pcc < 1);
    kp.pcc_rule = 1, kp.pcc_threshold = -1;
    prl_real *never = corr_step(&kp, INFER_SHIFT, &st, &moved);
    ck_assert(st.mm.strict == 0);
    ck_assert_mem_eq(off, never, bytes);
    free(off), free(never);
}
END_TEST

/* Two steps of 2 epochs × 2 minibatches; a malloc'd copy of the parameters. */
static prl_real *two_steps(int threads)
{
    assert_ok(prl_blas_init(threads));
    fixture f;
    fixture_init(&f, 21, 0, 1e-2, 0.1, 10);
    f.c.ppo_epochs = 2, f.c.minibatches = 2;
    for (int s = 0; s < 2; s++) assert_ok(prl_grpo_train_step(&f.m, &f.o, &f.b, &f.c, NULL));
    prl_real *copy = params_copy(&f.m);
    fixture_free(&f);
    return copy;
}

/* ------------------------------------------------------------------ loss scaling ---- */

/* rl.md §4.3 in the step, fp16 train path: an injected huge scale overflows fp16 in the
** backward → the update is skipped (weights bitwise unchanged, the optimizer's step count not
** advanced), the scale backs off, the next step applies; metrics say so. */
START_TEST(test_loss_scale_overflow_skips)
{
    fixture f;
    fixture_init(&f, 5, 0, 1e-3, 0, 8);
    assert_ok(prl_model_set_precision(&f.m, PRL_PRECISION_FP16));
    prl_loss_scaler_config sc;
    assert_ok(prl_loss_scaler_config_preset(&sc, "torch"));
    sc.init_scale = 0x1p40, sc.backoff_factor = 0x1p-30; /* one back-off to 2^10 */
    prl_loss_scaler scaler;
    assert_ok(prl_loss_scaler_init(&scaler, &sc));
    f.c.scaler = &scaler;
    prl_grpo_step_stats st;
    assert_ok(prl_grpo_train_step(&f.m, &f.o, &f.b, &f.c, &st));
    ck_assert_int_eq(st.skipped, 1);
    ck_assert_int_eq(st.updates, 0);
    ck_assert_mem_eq(f.before, f.m.params, f.m.n_params * sizeof *f.before);
    ck_assert_int_eq(f.o.step, 0);
    ck_assert(scaler.scale == 0x1p10 && st.loss_scale == 0x1p10);
    ck_assert(st.scaler_on && st.skipped_total == 1 && isfinite(st.loss));
    char *json = prl_grpo_step_stats_to_json(&st);
    ck_assert_ptr_nonnull(json);
    ck_assert_msg(strstr(json, "\"loss_scale\":1024.0") && strstr(json, "\"overflow\":1") &&
                      strstr(json, "\"skipped\":1") && strstr(json, "\"skipped_total\":1"),
                  "%s", json);
    free(json);
    assert_ok(prl_grpo_train_step(&f.m, &f.o, &f.b, &f.c, &st));
    ck_assert_int_eq(st.skipped, 0);
    ck_assert_int_eq(st.updates, 1);
    ck_assert_int_eq(f.o.step, 1);
    ck_assert(memcmp(f.before, f.m.params, f.m.n_params * sizeof *f.before) != 0);
    ck_assert(scaler.scale == 0x1p10 && st.skipped_total == 1 && st.grad_norm > 0);
    json = prl_grpo_step_stats_to_json(&st);
    ck_assert_msg(strstr(json, "\"overflow\":0"), "%s", json);
    free(json);
    fixture_free(&f);
}
END_TEST

/* In fp32 a power-of-two scale is exact both ways, so the scaled step must equal the plain
** one bitwise — which holds only if the clip sees the UNSCALED gradients (rl.md §4.3 order);
** a tiny grad_clip makes the clip bite. Without a scaler the metrics carry no scale keys. */
START_TEST(test_loss_scale_fp32_exact)
{
    fixture a, b;
    fixture_init(&a, 9, 0, 1e-3, 0, 8);
    fixture_init(&b, 9, 0, 1e-3, 0, 8);
    a.c.grad_clip = b.c.grad_clip = 1e-3;
    prl_loss_scaler_config sc;
    assert_ok(prl_loss_scaler_config_preset(&sc, "torch"));
    prl_loss_scaler scaler;
    assert_ok(prl_loss_scaler_init(&scaler, &sc));
    b.c.scaler = &scaler;
    prl_grpo_step_stats sa, sb;
    assert_ok(prl_grpo_train_step(&a.m, &a.o, &a.b, &a.c, &sa));
    assert_ok(prl_grpo_train_step(&b.m, &b.o, &b.b, &b.c, &sb));
    ck_assert(sb.skipped == 0 && sb.loss_scale == 65536 && sa.grad_norm > 1e-3);
    ck_assert_msg(sa.grad_norm == sb.grad_norm, "grad norm %.17g vs %.17g", sa.grad_norm,
                  sb.grad_norm);
    ck_assert_mem_eq(a.m.params, b.m.params, a.m.n_params * sizeof *a.m.params);
    char *json = prl_grpo_step_stats_to_json(&sa);
    ck_assert(json && !strstr(json, "loss_scale"));
    free(json);
    fixture_free(&a), fixture_free(&b);
}
END_TEST

/* trainer.precision and trainer.loss_scale.*: defaults, the auto rule, presets, overrides,
** the scaler's state through state.json, and errors that name the key. */
START_TEST(test_precision_from_job)
{
    prl_job_config j;
    assert_ok(prl_job_config_default(&j));
    prl_grpo_precision p;
    assert_ok(prl_grpo_precision_from_job(&p, &j));
    ck_assert(p.precision == PRL_PRECISION_FP32 && !p.scaler_on);
    ck_assert(p.scaler.kind == PRL_SCALER_TORCH && p.scaler.init_scale == 65536 &&
              p.scaler.growth_interval == 2000 && p.scaler.backoff_factor == 0.5 &&
              p.scaler.growth_factor == 2);
    static const char *const tp[] = {"fp32", "bf16", "fp16"};
    static const char *const rp[] = {"fp32",    "bf16",         "fp16",
                                     "aligned", "aligned-bf16", "aligned-fp16"};
    for (int a = 0; a < 3; a++) /* every train precision with every rollout precision */
        for (int r = 0; r < 6; r++) {
            char s1[64], s2[64];
            snprintf(s1, sizeof s1, "trainer.precision=%s", tp[a]);
            snprintf(s2, sizeof s2, "rollout.precision=%s", rp[r]);
            assert_ok(prl_job_config_set(&j, s1));
            assert_ok(prl_job_config_set(&j, s2));
            assert_ok(prl_grpo_precision_from_job(&p, &j));
            ck_assert_int_eq(p.precision, a);
            ck_assert_int_eq(p.scaler_on, a == 2); /* auto: on for fp16 only */
        }
    assert_ok(prl_job_config_set(&j, "trainer.precision=bf16"));
    assert_ok(prl_job_config_set(&j, "trainer.loss_scale.enabled=on"));
    assert_ok(prl_job_config_set(&j, "trainer.loss_scale.preset=verl_fsdp"));
    assert_ok(prl_grpo_precision_from_job(&p, &j));
    ck_assert(p.scaler_on && p.scaler.growth_interval == 400 && p.scaler.kind == PRL_SCALER_TORCH);
    assert_ok(prl_job_config_set(&j, "trainer.precision=fp16"));
    assert_ok(prl_job_config_set(&j, "trainer.loss_scale.enabled=off"));
    assert_ok(prl_job_config_set(&j, "trainer.loss_scale.preset=verl_megatron"));
    assert_ok(prl_job_config_set(&j, "trainer.loss_scale.hysteresis=3"));
    assert_ok(prl_job_config_set(&j, "trainer.loss_scale.growth_interval=50"));
    assert_ok(prl_grpo_precision_from_job(&p, &j));
    ck_assert(!p.scaler_on && p.scaler.kind == PRL_SCALER_MEGATRON && p.scaler.init_scale == 32768);
    ck_assert(p.scaler.min_scale == 1 && p.scaler.hysteresis == 3 &&
              p.scaler.growth_interval == 50);
    /* the scaler's state survives state.json */
    prl_loss_scaler s1, s2;
    assert_ok(prl_loss_scaler_init(&s1, &p.scaler));
    prl_loss_scaler_update(&s1, 1), prl_loss_scaler_update(&s1, 0);
    char text[300], st[200];
    prl_grpo_scaler_state_format(&s1, st, sizeof st);
    snprintf(text, sizeof text, "{\"run\": \"x\", \"loss_scaler\": %s}", st);
    assert_ok(prl_loss_scaler_init(&s2, &p.scaler));
    assert_ok(prl_grpo_scaler_state_parse(&s2, text));
    ck_assert(s2.scale == s1.scale && s2.growth_tracker == 1 && s2.hysteresis_tracker == 2 &&
              s2.steps == 2 && s2.skipped == 1);
    /* ... through a checkpoint, as the trainer role writes and reads it */
    fixture f;
    fixture_init(&f, 2, 0, 1e-3, 0, 4);
    char dir[] = "/tmp/prl_scaler_ckpt_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char ck[64], *back = NULL;
    snprintf(ck, sizeof ck, "%s/v1", dir);
    assert_ok(prl_checkpoint_save(&f.m, &f.o, text, NULL, ck));
    assert_ok(prl_loss_scaler_init(&s2, &p.scaler));
    assert_ok(prl_checkpoint_load_optim(&f.o, &f.m, ck, &back));
    assert_ok(prl_grpo_scaler_state_parse(&s2, back));
    ck_assert(s2.scale == s1.scale && s2.steps == 2 && s2.skipped == 1);
    free(back);
    check_remove_tree(dir);
    fixture_free(&f);
    prl_grpo_scaler_state_format(NULL, st, sizeof st);
    ck_assert_str_eq(st, "null");
    assert_ok(prl_grpo_scaler_state_parse(&s2, "{\"loss_scaler\": null}"));
    ck_assert_int_eq(prl_grpo_scaler_state_parse(&s2, "{\"loss_scaler\": {\"scale\": -1}}"),
                     PRL_ERR_FORMAT);
    assert_msg_has("loss_scaler");
    /* errors name the key */
    ck_assert_int_eq(prl_job_config_set(&j, "trainer.precision=fp8"), PRL_ERR_CONFIG);
    assert_msg_has("trainer.precision");
    ck_assert_int_eq(prl_job_config_set(&j, "trainer.loss_scale.enabled=maybe"), PRL_ERR_CONFIG);
    assert_msg_has("trainer.loss_scale.enabled");
    ck_assert_int_eq(prl_job_config_set(&j, "trainer.loss_scale.preset=apex"), PRL_ERR_CONFIG);
    assert_msg_has("trainer.loss_scale.preset");
    ck_assert_int_eq(prl_job_config_set(&j, "trainer.loss_scale.backoff_factor=1.5"),
                     PRL_ERR_CONFIG);
    assert_msg_has("trainer.loss_scale.backoff_factor");
    ck_assert_int_eq(prl_job_config_set(&j, "trainer.loss_scale.growth_factor=0.5"),
                     PRL_ERR_CONFIG);
    assert_msg_has("trainer.loss_scale.growth_factor");
    assert_ok(
        prl_job_config_set(&j, "trainer.loss_scale.growth_factor=0")); /* a failed set stays */
    ck_assert_int_eq(prl_job_config_set(&j, "trainer.loss_scale.init=-1"), PRL_ERR_CONFIG);
    assert_msg_has("trainer.loss_scale.init");
    assert_ok(prl_job_config_set(&j, "trainer.loss_scale.min_scale=1e6")); /* > 32768 */
    ck_assert_int_eq(prl_grpo_precision_from_job(&p, &j), PRL_ERR_CONFIG);
    assert_msg_has("trainer.loss_scale");
    assert_msg_has("min_scale");
    prl_job_config_free(&j);
}
END_TEST

/* grpo.algorithm, grpo.advantage and grpo.expert_clip: the keys, their defaults and the
** cross-key rule (gspo needs a ratio: not with bypass_loss = reinforce), named by key. */
START_TEST(test_algos_from_job)
{
    prl_job_config j;
    assert_ok(prl_job_config_default(&j));
    prl_grpo_train_config c;
    prl_optim_config oc;
    assert_ok(prl_grpo_train_config_from_job(&c, &j));
    assert_ok(prl_grpo_optim_config_from_job(&oc, &j));
    ck_assert(c.loss.ratio == PRL_GRPO_RATIO_TOKEN && c.baseline == PRL_GRPO_BASELINE_GROUP);
    ck_assert(oc.expert_clip == 0);
    assert_ok(prl_job_config_set(&j, "grpo.algorithm=gspo"));
    assert_ok(prl_job_config_set(&j, "grpo.advantage=rloo"));
    assert_ok(prl_job_config_set(&j, "grpo.expert_clip=0.25"));
    assert_ok(prl_grpo_train_config_from_job(&c, &j));
    assert_ok(prl_grpo_optim_config_from_job(&oc, &j));
    ck_assert(c.loss.ratio == PRL_GRPO_RATIO_SEQUENCE && c.baseline == PRL_GRPO_BASELINE_RLOO);
    ck_assert(oc.expert_clip == 0.25);
    static const char *const bad[][2] = {{"grpo.algorithm=gpso", "grpo.algorithm"},
                                         {"grpo.advantage=loo", "grpo.advantage"},
                                         {"grpo.expert_clip=-1", "grpo.expert_clip"}};
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(prl_job_config_set(&j, bad[i][0]), PRL_ERR_CONFIG);
        assert_msg_has(bad[i][1]);
    }
    const char *bypass[] = {"grpo.correction.mode=bypass", "grpo.correction.bypass_loss=reinforce"};
    ck_assert_int_eq(prl_job_config_set_all(&j, bypass, 2), PRL_ERR_CONFIG);
    assert_msg_has("'grpo.algorithm' = gspo");
    /* the struct rule for callers that build the config by hand */
    c.corr.mode = PRL_GRPO_MODE_BYPASS, c.corr.bypass_loss = PRL_GRPO_LOSS_REINFORCE;
    ck_assert_int_eq(prl_grpo_train_config_check(&c), PRL_ERR_CONFIG);
    assert_msg_has("grpo.algorithm = gspo");
    prl_job_config_free(&j);
}
END_TEST

/* One step of a fresh pure micro model (seed 9, lr 1e-2) on the toy batch of 12 whose infer
** log-probs are the train path's, after `edit` changes the config; the weights after it
** (malloc'd) and the stats. */
static prl_real *algo_step(void (*edit)(prl_grpo_train_config *, prl_optim *),
                           prl_grpo_step_stats *st)
{
    fixture f;
    fixture_init(&f, 9, 1, 1e-2, 0, 12);
    train_logprobs(&f.m, &f.b);
    if (edit) edit(&f.c, &f.o);
    assert_ok(prl_grpo_train_step(&f.m, &f.o, &f.b, &f.c, st));
    prl_real *copy = params_copy(&f.m);
    fixture_free(&f);
    return copy;
}

static void edit_gspo(prl_grpo_train_config *c, prl_optim *o)
{
    (void)o;
    c->loss.ratio = PRL_GRPO_RATIO_SEQUENCE;
}
static void edit_epochs(prl_grpo_train_config *c, prl_optim *o)
{
    (void)o;
    c->ppo_epochs = 2, c->minibatches = 2;
}
static void edit_gspo_epochs(prl_grpo_train_config *c, prl_optim *o)
{
    edit_gspo(c, o), edit_epochs(c, o);
}
static void edit_gspo_seq_mean(prl_grpo_train_config *c, prl_optim *o)
{
    edit_gspo(c, o);
    c->loss.agg = PRL_GRPO_AGG_SEQ_MEAN_TOKEN_MEAN;
}
static void edit_seq_mean(prl_grpo_train_config *c, prl_optim *o)
{
    (void)o;
    c->loss.agg = PRL_GRPO_AGG_SEQ_MEAN_TOKEN_MEAN;
}
static void edit_none(prl_grpo_train_config *c, prl_optim *o)
{
    (void)o;
    c->adv_norm = PRL_GRPO_NORM_NONE;
}
static void edit_rloo(prl_grpo_train_config *c, prl_optim *o)
{
    (void)o;
    c->adv_norm = PRL_GRPO_NORM_NONE, c->baseline = PRL_GRPO_BASELINE_RLOO;
}
static void edit_expert_tiny(prl_grpo_train_config *c, prl_optim *o)
{
    (void)c;
    o->cfg.expert_clip = 1e-7;
}
static void edit_expert_huge(prl_grpo_train_config *c, prl_optim *o)
{
    (void)c;
    o->cfg.expert_clip = 1e9;
}

/* GSPO in the step: one on-policy update (s = r = 1) is bitwise GRPO's in token-mean and in
** seq-mean-token-mean; with 2 epochs × 2 minibatches the later updates see s ≠ 1 and the
** sequence ratio gives another update than the token ratio. */
START_TEST(test_gspo_step)
{
    size_t bytes = n_params() * sizeof(prl_real);
    prl_grpo_step_stats sg, ss;
    prl_real *grpo = algo_step(NULL, &sg), *gspo = algo_step(edit_gspo, &ss);
    ck_assert_mem_eq(grpo, gspo, bytes);
    free(grpo), free(gspo);
    grpo = algo_step(edit_seq_mean, &sg), gspo = algo_step(edit_gspo_seq_mean, &ss);
    ck_assert_mem_eq(grpo, gspo, bytes);
    free(grpo), free(gspo);
    grpo = algo_step(edit_epochs, &sg), gspo = algo_step(edit_gspo_epochs, &ss);
    ck_assert_int_eq(ss.updates, 4);
    ck_assert(ss.ppo_kl != 0 && isfinite(ss.loss));
    ck_assert(memcmp(grpo, gspo, bytes) != 0);
    free(grpo), free(gspo);
}
END_TEST

/* RLOO in the step: groups of 4 with 0/1 rewards, adv_norm none: every advantage is
** 4/3 of Dr.GRPO's (r − mean), so the extremes scale by 4/3 exactly. */
START_TEST(test_rloo_step)
{
    prl_grpo_step_stats sg, sr;
    prl_real *a = algo_step(edit_none, &sg), *b = algo_step(edit_rloo, &sr);
    ck_assert(sg.adv_max > 0 && sg.adv_min < 0);
    ck_assert_double_eq_tol(sr.adv_max, sg.adv_max * 4 / 3, 1e-12);
    ck_assert_double_eq_tol(sr.adv_min, sg.adv_min * 4 / 3, 1e-12);
    ck_assert(memcmp(a, b, n_params() * sizeof(prl_real)) != 0);
    free(a), free(b);
}
END_TEST

/* grpo.expert_clip in the step: a bound no expert reaches is bitwise the plain update (and
** reports 0 clipped); a tiny one clips the routed experts (counted, in the metrics) and
** changes the update; off, the metrics have no experts_clipped key. */
START_TEST(test_expert_clip_step)
{
    size_t bytes = n_params() * sizeof(prl_real);
    prl_grpo_step_stats s0, sh, st;
    prl_real *plain = algo_step(NULL, &s0), *huge = algo_step(edit_expert_huge, &sh),
             *tiny = algo_step(edit_expert_tiny, &st);
    ck_assert_mem_eq(plain, huge, bytes);
    ck_assert(sh.expert_clip_on && sh.experts_clipped == 0 && !s0.expert_clip_on);
    ck_assert(st.experts_clipped > 0);
    ck_assert(memcmp(plain, tiny, bytes) != 0);
    char *json = prl_grpo_step_stats_to_json(&st), *off = prl_grpo_step_stats_to_json(&s0);
    ck_assert(strstr(json, "\"experts_clipped\":") && !strstr(off, "experts_clipped"));
    free(json), free(off);
    free(plain), free(huge), free(tiny);
}
END_TEST

START_TEST(test_determinism_across_threads)
{
    prl_model m;
    micro_model(&m, 21, 0);
    size_t n = m.n_params;
    prl_model_free(&m);
    prl_real *a = two_steps(1), *b = two_steps(2), *c = two_steps(2);
    ck_assert_mem_eq(a, b, n * sizeof *a);
    ck_assert_mem_eq(b, c, n * sizeof *a);
    free(a), free(b), free(c);
    assert_ok(prl_blas_init(0));
}
END_TEST

int main(void)
{
    if (prl_blas_init(0) != PRL_OK) return 1;
    Suite *s = suite_create("grpo_trainer");
    TCase *tc = tcase_create("trainer");
    tcase_add_test(tc, test_msg_round_trip);
    tcase_add_test(tc, test_msg_malformed);
    tcase_add_test(tc, test_msg_fuzz);
    tcase_add_test(tc, test_config_from_job);
    tcase_add_test(tc, test_first_update_ratio_one);
    tcase_add_test(tc, test_equal_rewards_no_change);
    tcase_add_test(tc, test_bandit_raises_rewarded_token);
    tcase_add_test(tc, test_kl_pulls_to_reference);
    tcase_add_test(tc, test_correction_off_unchanged);
    tcase_add_test(tc, test_correction_changes_update);
    tcase_add_test(tc, test_correction_masks_all);
    tcase_add_test(tc, test_correction_denominator);
    tcase_add_test(tc, test_correction_bypass);
    tcase_add_test(tc, test_correction_pcc_rule);
    tcase_add_test(tc, test_loss_scale_overflow_skips);
    tcase_add_test(tc, test_loss_scale_fp32_exact);
    tcase_add_test(tc, test_precision_from_job);
    tcase_add_test(tc, test_algos_from_job);
    tcase_add_test(tc, test_gspo_step);
    tcase_add_test(tc, test_rloo_step);
    tcase_add_test(tc, test_expert_clip_step);
    tcase_add_test(tc, test_determinism_across_threads);
    suite_add_tcase(s, tc);
    return check_run(s);
}
