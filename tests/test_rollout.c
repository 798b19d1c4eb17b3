/*
** test_rollout.c — rollout/ on a random tiny model with the byte tokenizer: the episode layout
** (prompt unmasked, sampled tokens masked in with their log-probs), token-in/token-out (the
** aligned infer path's log-probs of the episode equal the train path's scoring of the episode
** sequence, bitwise), determinism across batch sizes, scoring by the verifiers, and errors.
*/
#include "rollout/rollout.h"
#include "tests/check_util.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#ifndef PRL_SOURCE_DIR
#define PRL_SOURCE_DIR "."
#endif

static prl_model model;
static prl_tokenizer *tok;

static void setup(void)
{
    if (model.params) return;
    prl_config c;
    ck_assert_int_eq(prl_config_load(&c, PRL_SOURCE_DIR "/configs/models/tiny.json"), PRL_OK);
    c.vocab_size = PRL_TOKENIZER_N_BASE; /* the byte tokenizer's vocabulary */
    ck_assert_int_eq(prl_model_init(&model, &c), PRL_OK);
    prl_model_init_weights(&model, 5);
    ck_assert_int_eq(prl_tokenizer_init_bytes(&tok), PRL_OK);
}

enum { N = 6 };

static json_t *tasks[N];

static prl_status keep(void *user, json_t *line)
{
    int *k = user;
    tasks[(*k)++] = json_incref(line);
    return PRL_OK;
}

static void make_tasks(prl_task_domain d)
{
    prl_tasks_config tc;
    prl_tasks_config_default(&tc, d);
    tc.n = N, tc.seed = 3, tc.split = PRL_SPLIT_EVAL;
    int k = 0;
    ck_assert_int_eq(prl_tasks_generate(&tc, keep, &k), PRL_OK);
    ck_assert_int_eq(k, N);
}

static void drop_tasks(void)
{
    for (int i = 0; i < N; i++) json_decref(tasks[i]);
}

static prl_infer *engine(const char *preset, int batch)
{
    prl_infer_options o;
    ck_assert_int_eq(prl_infer_options_preset(&o, preset), PRL_OK);
    o.max_batch = batch;
    prl_infer *e;
    ck_assert_int_eq(prl_infer_init(&e, &model, &o), PRL_OK);
    return e;
}

static prl_rollout_config config(void)
{
    prl_rollout_config c;
    prl_rollout_config_default(&c);
    c.sampling.temperature = 1.0, c.sampling.seed = 9, c.sampling.max_new_tokens = 24;
    static const int32_t stops[] = {PRL_TOKEN_END, PRL_TOKEN_EOS};
    c.sampling.stop_ids = stops, c.sampling.n_stop_ids = 2;
    return c;
}

START_TEST(test_layout_and_token_in_token_out)
{
    setup();
    const prl_task_domain domains[] = {PRL_TASK_GENERAL, PRL_TASK_AGENT};
    for (int di = 0; di < 2; di++) {
        make_tasks(domains[di]);
        prl_infer *e = engine("aligned", 4);
        uint64_t ids[N];
        for (int i = 0; i < N; i++) ids[i] = 100 + (uint64_t)i;
        prl_rollout_config c = config();
        prl_episode ep[N];
        ck_assert_msg(prl_rollout_run(e, tok, tasks, ids, N, &c, NULL, ep) == PRL_OK, "%s",
                      prl_error_message());
        for (int i = 0; i < N; i++) {
            prl_episode *p = &ep[i];
            ck_assert_int_ge(p->turns, 1);
            ck_assert_int_gt(p->n, p->prompt_len);
            ck_assert_int_eq(p->ids[p->prompt_len - 1], PRL_TOKEN_ASSISTANT);
            int sampled = 0;
            for (int t = 0; t < p->n; t++) {
                if (t < p->prompt_len) ck_assert(p->mask[t] == 0 && p->logprobs[t] == 0);
                sampled += p->mask[t];
            }
            ck_assert_int_ge(sampled, 1);
            ck_assert(p->reward >= 0 && p->reward <= 1);
            ck_assert_int_eq(p->n_msgs >= 1, 1);
            ck_assert_str_eq(p->msgs[0].role, "assistant");
            /* the train path scores the episode's sequence: equal log-probs at sampled tokens */
            int32_t *tgt = malloc((size_t)p->n * sizeof *tgt), len = p->n;
            for (int t = 0; t < p->n; t++) tgt[t] = t + 1 < p->n ? p->ids[t + 1] : -1;
            float *lp = malloc((size_t)p->n * sizeof *lp);
            prl_batch b = {.B = 1,
                           .T = p->n,
                           .tokens = p->ids,
                           .lens = &len,
                           .targets = tgt,
                           .temperature = 1.0};
            ck_assert_int_eq(prl_model_logprobs(&model, &b, lp), PRL_OK);
            for (int t = 1; t < p->n; t++)
                if (p->mask[t])
                    ck_assert_msg(!memcmp(&lp[t - 1], &p->logprobs[t], sizeof(float)),
                                  "%s episode %d token %d: train %g, infer %g",
                                  prl_tasks_domain_name(domains[di]), i, t, lp[t - 1],
                                  p->logprobs[t]);
            free(tgt), free(lp);
        }
        /* the same episodes with another batch size */
        prl_infer *e1 = engine("aligned", 1);
        prl_episode ep1[N];
        ck_assert_int_eq(prl_rollout_run(e1, tok, tasks, ids, N, &c, NULL, ep1), PRL_OK);
        for (int i = 0; i < N; i++) {
            ck_assert_int_eq(ep1[i].n, ep[i].n);
            ck_assert(!memcmp(ep1[i].ids, ep[i].ids, (size_t)ep[i].n * sizeof(int32_t)));
            ck_assert(ep1[i].reward == ep[i].reward);
            prl_episode_free(&ep1[i]);
            prl_episode_free(&ep[i]);
        }
        prl_infer_free(e1);
        prl_infer_free(e);
        drop_tasks();
    }
}
END_TEST

START_TEST(test_errors)
{
    setup();
    make_tasks(PRL_TASK_GENERAL);
    prl_infer *e = engine("fp32", 2);
    uint64_t ids[N] = {0};
    prl_rollout_config c = config();
    prl_episode ep[N];
    c.max_turns = 0;
    ck_assert_int_eq(prl_rollout_run(e, tok, tasks, ids, N, &c, NULL, ep), PRL_ERR_ARG);
    c = config();
    json_object_set_new(tasks[2], "domain", json_string("poetry"));
    ck_assert_int_eq(prl_rollout_run(e, tok, tasks, ids, N, &c, NULL, ep), PRL_ERR_FORMAT);
    ck_assert_msg(strstr(prl_error_message(), "task 2"), "%s", prl_error_message());
    prl_infer_free(e);
    drop_tasks();
}
END_TEST

/* A re-prefill that routes differently from the first pass (as another prefill kernel
** would; this engine's prefill and decode route alike): from the first pass that feeds a
** request from position 0 again — the second round — the router bias pulls every MoE layer
** to expert 0. The infer path reads the bias live. */
typedef struct drift_ctx {
    prl_infer *e;
    prl_model *m;
    int max_pos[64]; /* per request index of a round */
    int drifted;
} drift_ctx;

static int drift_hook(void *user, const char *name, const prl_real *data, int ndim,
                      const int64_t *shape)
{
    (void)data, (void)ndim;
    drift_ctx *c = user;
    if (c->drifted || strcmp(name, "L0.attn.q") != 0) return 0; /* before any MoE layer */
    const int32_t *req, *pos;
    prl_infer_hook_rows(c->e, &req, &pos);
    for (int64_t r = 0; r < shape[0]; r++) {
        if (pos[r] == 0 && c->max_pos[req[r]] > 0) c->drifted = 1;
        if (pos[r] > c->max_pos[req[r]]) c->max_pos[req[r]] = pos[r];
    }
    int E = c->m->cfg.n_routed_experts;
    for (int i = 0; c->drifted && i < c->m->n_moe; i++) c->m->router_bias[(size_t)i * E] = 10;
    return 0;
}

/* Play the tasks on `tm` with the drift hook armed afresh (bias 0). */
static void play_drifting(prl_model *tm, prl_infer *e, const uint64_t *ids,
                          const prl_rollout_config *c, prl_episode *out)
{
    static drift_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.e = e, ctx.m = tm;
    memset(tm->router_bias, 0,
           (size_t)tm->n_moe * tm->cfg.n_routed_experts * sizeof *tm->router_bias);
    prl_infer_set_hook(e, drift_hook, &ctx);
    ck_assert_int_eq(prl_rollout_run(e, tok, tasks, ids, N, c, NULL, out), PRL_OK);
}

/* Cached R3 (rl.md §3.5): multi-turn agent episodes (every token a stop id, so each turn is
** one token, and the environment answers each) whose later rounds re-prefill with other routes
** (drift_hook). With cached_routes the record of a 3-turn episode starts with the record of its
** first turn alone, byte for byte (first-seen, never overwritten); without, those rows are the
** last re-prefill's and differ. Both cover every fed position; caching changes no token. */
START_TEST(test_cached_routes)
{
    setup();
    make_tasks(PRL_TASK_AGENT);
    /* a model that opens a tool call at once: every embedding carries a large component 0
    ** and only <|tool_call|>'s head row reads it; the turn "<|tool_call|>" is a malformed
    ** call, so the environment answers and the episode goes on */
    prl_model tm;
    ck_assert_int_eq(prl_model_init(&tm, &model.cfg), PRL_OK);
    memcpy(tm.params, model.params, model.n_params * sizeof *tm.params);
    const prl_param_info *emb = prl_model_find(&tm, "model.embed_tokens.weight");
    const prl_param_info *head = prl_model_find(&tm, "lm_head.weight");
    ck_assert(emb && head);
    int d = tm.cfg.hidden_size;
    for (int v = 0; v < tm.cfg.vocab_size; v++) {
        tm.params[emb->offset + (size_t)v * d] = 4.0f;
        tm.params[head->offset + (size_t)v * d] = v == PRL_TOKEN_TOOL_CALL ? 1.0f : 0.0f;
    }
    uint64_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = 200 + (uint64_t)i;
    static int32_t stops[PRL_TOKENIZER_N_BASE];
    for (int t = 0; t < PRL_TOKENIZER_N_BASE; t++) stops[t] = t;
    prl_rollout_config c = config();
    c.sampling.stop_ids = stops, c.sampling.n_stop_ids = PRL_TOKENIZER_N_BASE;
    prl_episode one[N], cached[N], plain[N];
    const char *presets[2] = {"bf16", "fp32"};
    for (int k = 0; k < 2; k++) {
        prl_infer_options o;
        ck_assert_int_eq(prl_infer_options_preset(&o, presets[k]), PRL_OK);
        o.max_batch = 4;
        prl_infer *e;
        ck_assert_int_eq(prl_infer_init(&e, &tm, &o), PRL_OK);
        c.max_turns = 1, c.cached_routes = 1;
        play_drifting(&tm, e, ids, &c, one);
        c.max_turns = 3;
        play_drifting(&tm, e, ids, &c, cached);
        c.cached_routes = 0;
        play_drifting(&tm, e, ids, &c, plain);
        int multi = 0, drift = 0;
        for (int i = 0; i < N; i++) {
            ck_assert_int_eq(cached[i].n, plain[i].n);
            ck_assert(!memcmp(cached[i].ids, plain[i].ids, (size_t)plain[i].n * sizeof(int32_t)));
            ck_assert_int_eq(cached[i].n_route_tokens, plain[i].n_route_tokens);
            ck_assert_uint_eq(cached[i].routes_bytes, plain[i].routes_bytes);
            ck_assert_int_le(cached[i].n_route_tokens, cached[i].n - 1);
            ck_assert_int_ge(cached[i].n_route_tokens, one[i].n_route_tokens);
            ck_assert(!memcmp(cached[i].routes, one[i].routes, one[i].routes_bytes));
            multi += cached[i].turns >= 2;
            drift += memcmp(plain[i].routes, one[i].routes, one[i].routes_bytes) != 0;
            prl_episode_free(&one[i]), prl_episode_free(&cached[i]), prl_episode_free(&plain[i]);
        }
        ck_assert_int_eq(multi, N);
        ck_assert_int_eq(drift, N); /* the re-prefill moved every first turn's routes */
        prl_infer_free(e);
    }
    prl_model_free(&tm);
    drop_tasks();
}
END_TEST

int main(void)
{
    if (prl_blas_init(2) != PRL_OK) return 1;
    Suite *s = suite_create("rollout");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_layout_and_token_in_token_out);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_cached_routes);
    suite_add_tcase(s, tc);
    int failed = check_run_mode(s, CK_NOFORK); /* the tests share one loaded model */
    prl_tokenizer_free(tok);
    prl_model_free(&model);
    return failed;
}
