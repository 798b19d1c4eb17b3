/*
** test_diagnose.c — prl diagnose's measures and drivers (diagnose/):
**   the statistics against hand-computed values (max abs, relative L2, PCC merged over
**   chunks, histogram bins, routing overlap);
**   aligned mode: zero divergence in every op, log-prob and route;
**   a fault injected into one op of the infer path (prl_infer_set_fault) is named first, with
**   every earlier op still bitwise equal — in aligned mode at threshold 0 and in the default
**   fp32 mode above its natural mismatch;
**   the sweep's attribution (precision and MLA form add mismatch, batch and threads none);
**   external dumps (written here from the train path's own hooks): zero divergence, a
**   perturbed tensor named first, wrong tokens and missing files named;
**   bad sequences named; the JSON and HTML outputs;
**   `prl diagnose --run` on a run.db written here with the store API (latest step, --step, --n).
*/
#include "diagnose/diagnose.h"
#include "store/store.h"
#include "tests/check_util.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef PRL_SOURCE_DIR
#define PRL_SOURCE_DIR "."
#endif

static prl_model model;

/* tiny.json with a short context, a sharpened head (clear winners, as test_infer) and a
** non-trivial router bias. */
static void load_tiny(void)
{
    if (model.params) return;
    ck_assert_int_eq(prl_blas_init(1), PRL_OK);
    prl_config c;
    ck_assert_int_eq(prl_config_load(&c, PRL_SOURCE_DIR "/configs/models/tiny.json"), PRL_OK);
    c.max_position_embeddings = 64;
    ck_assert_int_eq(prl_model_init(&model, &c), PRL_OK);
    prl_model_init_weights(&model, 11);
    const prl_param_info *head = prl_model_find(&model, "lm_head.weight");
    for (size_t i = 0; i < head->numel; i++) model.params[head->offset + i] *= 40;
    for (int i = 0; i < model.n_moe * c.n_routed_experts; i++)
        model.router_bias[i] = (float)(0.01 * ((i * 7) % 5 - 2));
}

enum { NSEQ = 3, SEQ_MAX = 40 };
static int32_t seq_tokens[NSEQ][SEQ_MAX];
static prl_diag_seq seqs[NSEQ];

static void make_seqs(void)
{
    static const int lens[NSEQ] = {23, 37, 30}, prompts[NSEQ] = {5, 1, 12};
    static const char *labels[NSEQ] = {"s0", "s1", "s2"};
    for (int i = 0; i < NSEQ; i++) {
        prl_rng rng;
        prl_rng_init(&rng, 5, (uint64_t)i, 0, 0, PRL_RNG_TEST);
        for (int t = 0; t < lens[i]; t++)
            seq_tokens[i][t] = 16 + (int32_t)(prl_rng_u64(&rng) % 4000);
        seqs[i] = (prl_diag_seq){.tokens = seq_tokens[i],
                                 .n = lens[i],
                                 .prompt_len = prompts[i],
                                 .label = labels[i]};
    }
}

static void setup(void)
{
    load_tiny();
    make_seqs();
}

static prl_infer_options preset(const char *name, int batch)
{
    prl_infer_options o;
    ck_assert_int_eq(prl_infer_options_preset(&o, name), PRL_OK);
    o.max_batch = batch;
    return o;
}

static const prl_diag_op *find_op(const prl_diag_report *r, const char *name)
{
    for (int i = 0; i < r->n_ops; i++)
        if (!strcmp(r->ops[i].name, name)) return &r->ops[i];
    return NULL;
}

/* ------------------------------------------------------------------ statistics ------ */

START_TEST(test_op_stats_by_hand)
{
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
    prl_diag_op whole = {0}, split = {0};
    prl_diag_op_add(&whole, a, b, 4);
    prl_diag_op_add(&split, a, b, 1); /* the co-moment merge must give the one-chunk answer */
    prl_diag_op_add(&split, a + 1, b + 1, 3);
    /* means 2.5 and 2.75; Σdadb = 6.5, Σda² = 5, Σdb² = 8.75 */
    double pcc = 6.5 / sqrt(5 * 8.75);
    ck_assert_double_eq_tol(prl_diag_op_pcc(&whole), pcc, 1e-15);
    ck_assert_double_eq_tol(prl_diag_op_pcc(&split), pcc, 1e-15);
    ck_assert_double_eq(whole.max_abs, 1);
    ck_assert_double_eq_tol(prl_diag_op_rel_l2(&whole), 1 / sqrt(39.0),
                            1e-12); /* + 1e-12 in the denominator */
    ck_assert_double_eq_tol(prl_diag_op_rel_l2(&split), 1 / sqrt(39.0), 1e-12);
    ck_assert_uint_eq(split.count, 4);

    prl_diag_op same = {0};
    prl_diag_op_add(&same, a, a, 4);
    ck_assert_double_eq(prl_diag_op_pcc(&same), 1);
    ck_assert_double_eq(prl_diag_op_rel_l2(&same), 0);

    float x[2] = {1, NAN}, y[2] = {1, 2};
    prl_diag_op bad = {0};
    prl_diag_op_add(&bad, x, y, 2);
    ck_assert_uint_eq(bad.nonfinite, 1);
    ck_assert(isinf(prl_diag_op_rel_l2(&bad)));
}
END_TEST

START_TEST(test_histogram_bins)
{
    ck_assert_int_eq(prl_diag_hist_bin(0), 0);
    ck_assert_int_eq(prl_diag_hist_bin(1e-9), 1);
    ck_assert_int_eq(prl_diag_hist_bin(1e-7), 1);
    ck_assert_int_eq(prl_diag_hist_bin(1.5e-7), 2);
    ck_assert_int_eq(prl_diag_hist_bin(3e-3), 6);
    ck_assert_int_eq(prl_diag_hist_bin(1), 8);
    ck_assert_int_eq(prl_diag_hist_bin(1.01), 9);
    ck_assert_int_eq(prl_diag_hist_bin(NAN), 9);
    ck_assert_double_eq(prl_diag_hist_edge(1), 1e-7);
    ck_assert_str_eq(prl_diag_hist_label(9), ">1");

    prl_diag_logprob s = {0};
    float lt[3] = {-1, -2, -3}, lo[3] = {-1, -2.5f, -3.001f};
    prl_diag_logprob_add(&s, lt, lo, 3);
    ck_assert_int_eq(s.n, 3);
    ck_assert_int_eq(s.hist[0], 1);
    ck_assert_int_eq(s.hist[8], 1);             /* 0.5 */
    ck_assert_int_eq(s.hist[5] + s.hist[6], 1); /* ~1e-3 (float rounding decides the side) */
    ck_assert_double_eq_tol(s.max_abs, 0.5, 1e-12);
}
END_TEST

START_TEST(test_routing_overlap_by_hand)
{
    int32_t a[2][2] = {{0, 1}, {2, 3}}, b[2][2] = {{1, 0}, {2, 4}};
    prl_diag_routing r = {0};
    prl_diag_routing_add(&r, &a[0][0], 2, &b[0][0], 2, 2, 2);
    ck_assert_int_eq(r.tokens, 2);
    ck_assert_double_eq_tol(r.sum_overlap / r.tokens, 0.75, 1e-15); /* (1 + 1/2) / 2 */
    ck_assert_int_eq(r.differ, 1); /* slot order is not a difference */
}
END_TEST

/* ------------------------------------------------------------------ infer side ------ */

START_TEST(test_aligned_reports_zero_everywhere)
{
    prl_infer_options o = preset("aligned", 2); /* sequences 0 and 1 decode together */
    prl_diag_report r;
    assert_ok(prl_diag_compare_infer(&model, &o, 0, seqs, NSEQ, 0, 1.0, &r));
    /* 1 dense layer (q, kv_latent, attn.out, mlp.out) + 5 MoE layers (+ router, moe.out) + logits */
    ck_assert_int_eq(r.n_ops, 4 + 5 * 5 + 1);
    ck_assert_str_eq(r.ops[0].name, "L0.attn.q");
    ck_assert_str_eq(r.ops[r.n_ops - 1].name, "final.logits");
    ck_assert_int_eq(r.first, -1);
    for (int i = 0; i < r.n_ops; i++) {
        ck_assert_msg(r.ops[i].count > 0 && !r.ops[i].missing, "%s not compared", r.ops[i].name);
        ck_assert_msg(r.ops[i].max_abs == 0, "%s differs by %g", r.ops[i].name, r.ops[i].max_abs);
    }
    long resp = 0;
    for (int i = 0; i < NSEQ; i++) resp += seqs[i].n - seqs[i].prompt_len;
    ck_assert_int_eq(r.lp.n, resp);
    ck_assert_int_eq(r.lp.hist[0], resp);
    ck_assert_double_eq(r.lp.max_abs, 0);
    ck_assert_int_eq(r.n_routing, 5);
    for (int i = 0; i < r.n_routing; i++) {
        ck_assert_int_eq(r.routing[i].layer, i + 1);
        ck_assert_int_eq(r.routing[i].tokens, 23 - 1 + 37 - 1 + 30 - 1);
        ck_assert_int_eq(r.routing[i].differ, 0);
        ck_assert_double_eq(r.routing[i].sum_overlap, (double)r.routing[i].tokens);
    }
    prl_diag_report_free(&r);
}
END_TEST

/* With PRL_INFER_FAULT naming `op`, the report's first divergent op is `op`. */
static void expect_first(const char *preset_name, const char *op, double rel, double threshold)
{
    char env[96];
    snprintf(env, sizeof env, "%s:%g", op, rel);
    setenv("PRL_INFER_FAULT", env, 1);
    prl_infer_options o = preset(preset_name, 3);
    prl_diag_report r;
    prl_status rc = prl_diag_compare_infer(&model, &o, 0, seqs, NSEQ, threshold, 1.0, &r);
    unsetenv("PRL_INFER_FAULT");
    assert_ok(rc);
    ck_assert_str_eq(r.fault, op);
    ck_assert_msg(r.first >= 0, "%s %s: nothing diverges", preset_name, op);
    ck_assert_msg(!strcmp(r.ops[r.first].name, op), "%s: fault in %s, first divergent %s",
                  preset_name, op, r.ops[r.first].name);
    if (!strcmp(preset_name, "aligned"))
        for (int i = 0; i < r.first; i++)
            ck_assert_msg(r.ops[i].max_abs == 0, "%s before the fault differs", r.ops[i].name);
    prl_diag_report_free(&r);
}

START_TEST(test_fault_named_first_aligned)
{
    static const char *ops[] = {"L0.attn.q",
                                "L0.attn.kv_latent",
                                "L0.mlp.out",
                                "L1.attn.out",
                                "L2.moe.router_logits",
                                "L3.attn.kv_latent",
                                "L4.moe.out",
                                "L5.attn.q",
                                "final.logits"};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        expect_first("aligned", ops[i], 1e-3, 0);
}
END_TEST

START_TEST(test_fault_named_first_fp32)
{
    /* the default fp32 mode differs by ~1e-6 everywhere (absorbed MLA); a 1% fault is above */
    expect_first("fp32", "L2.attn.out", 1e-2, 1e-3);
    expect_first("fp32", "L3.moe.router_logits", 1e-2, 1e-3);
}
END_TEST

START_TEST(test_fault_without_fault_fp32_is_clean)
{
    prl_infer_options o = preset("fp32", 3);
    prl_diag_report r;
    assert_ok(prl_diag_compare_infer(&model, &o, 0, seqs, NSEQ, 1e-3, 1.0, &r));
    ck_assert_int_eq(r.first, -1);
    ck_assert_str_eq(r.fault, "");
    /* the absorbed form re-associates attention: L0.attn.out differs, L0.attn.q does not */
    ck_assert_double_eq(find_op(&r, "L0.attn.q")->max_abs, 0);
    ck_assert(find_op(&r, "L0.attn.out")->max_abs > 0);
    ck_assert(r.lp.sum_abs / r.lp.n < 1e-4);
    prl_diag_report_free(&r);
}
END_TEST

START_TEST(test_fault_bad_names)
{
    prl_infer_options o = preset("aligned", 1);
    prl_infer *e = NULL;
    assert_ok(prl_infer_init(&e, &model, &o));
    ck_assert_int_eq(prl_infer_set_fault(e, "L1.mlp.out", 0.1), PRL_ERR_ARG); /* L1 is MoE */
    assert_msg_has("L1.mlp.out");
    ck_assert_int_eq(prl_infer_set_fault(e, "L6.attn.q", 0.1), PRL_ERR_ARG);
    ck_assert_int_eq(prl_infer_set_fault(e, "L0.attn.k", 0.1), PRL_ERR_ARG);
    ck_assert_int_eq(prl_infer_set_fault(e, "L0.attn.q", 0), PRL_ERR_ARG);
    assert_ok(prl_infer_set_fault(e, "L0.mlp.out", 0.1));
    ck_assert_str_eq(prl_infer_fault(e), "L0.mlp.out");
    assert_ok(prl_infer_set_fault(e, NULL, 0));
    ck_assert_ptr_null(prl_infer_fault(e));
    prl_infer_free(e);
    setenv("PRL_INFER_FAULT", "L0.attn.q", 1);
    ck_assert_int_eq(prl_infer_init(&e, &model, &o), PRL_ERR_ARG);
    assert_msg_has("PRL_INFER_FAULT");
    unsetenv("PRL_INFER_FAULT");
}
END_TEST

START_TEST(test_sweep_attribution)
{
    prl_infer_options o = preset("aligned", 3);
    prl_diag_sweep s;
    assert_ok(prl_diag_sweep_run(&model, &o, 1, seqs, NSEQ, 1.0, &s));
    /* baseline, precision bf16/fp16, mla absorbed, matmul gemv/blas, batch 1, threads 2 */
    ck_assert_int_eq(s.n, 8);
    ck_assert_str_eq(s.rows[0].knob, "baseline");
    ck_assert_double_eq(s.rows[0].mean_abs, 0); /* aligned: the control */
    for (int i = 1; i < s.n; i++) {
        const prl_diag_sweep_row *w = &s.rows[i];
        ck_assert_double_eq(w->delta, w->mean_abs - s.rows[0].mean_abs);
        if (!strcmp(w->knob, "batch") || !strcmp(w->knob, "threads"))
            ck_assert_msg(w->mean_abs == 0, "%s=%s adds %g", w->knob, w->value, w->mean_abs);
        if (!strcmp(w->knob, "precision") || !strcmp(w->knob, "mla"))
            ck_assert_msg(w->mean_abs > 0, "%s=%s adds nothing", w->knob, w->value);
    }
    ck_assert_int_eq(prl_pool_threads(), 1); /* restored */
    prl_diag_sweep_free(&s);
}
END_TEST

START_TEST(test_bad_sequences_named)
{
    int32_t toks[4] = {1, 2, 5000, 3};
    prl_diag_seq s = {.tokens = toks, .n = 4, .prompt_len = 1, .label = "bad.jsonl:7"};
    ck_assert_int_eq(prl_diag_check_seqs(&model, &s, 1), PRL_ERR_RANGE);
    assert_msg_has("bad.jsonl:7");
    assert_msg_has("token id 5000 at position 2");
    toks[2] = 4;
    s.prompt_len = 4;
    ck_assert_int_eq(prl_diag_check_seqs(&model, &s, 1), PRL_ERR_RANGE);
    assert_msg_has("prompt length 4");
    int32_t longer[65] = {0};
    prl_diag_seq l = {.tokens = longer, .n = 65, .prompt_len = 1, .label = "long"};
    ck_assert_int_eq(prl_diag_check_seqs(&model, &l, 1), PRL_ERR_RANGE);
    assert_msg_has("exceed the context");
    prl_infer_options o = preset("fp32", 1);
    prl_diag_report r;
    ck_assert_int_eq(prl_diag_compare_infer(&model, &o, 0, &l, 1, 0, 1.0, &r), PRL_ERR_RANGE);
}
END_TEST

/* ------------------------------------------------------------------ external -------- */

/* A dump of the train path's own hook tensors, as an external engine would write it. */
typedef struct dump_ctx {
    prl_safetensors_writer w;
    float *bufs[64];
    int n;
    const char *perturb; /* scale this op by 1.01 in the dump */
} dump_ctx;

static int dump_hook(void *user, const char *name, const prl_real *data, int ndim,
                     const int64_t *shape)
{
    dump_ctx *d = user;
    size_t n = (size_t)shape[0] * shape[1];
    float *copy = malloc(n * sizeof *copy);
    ck_assert_ptr_nonnull(copy);
    for (size_t i = 0; i < n; i++)
        copy[i] = data[i] * (d->perturb && !strcmp(name, d->perturb) ? 1.01f : 1);
    d->bufs[d->n++] = copy;
    ck_assert_int_eq(prl_safetensors_writer_add(&d->w, name, PRL_DTYPE_F32, shape, ndim, copy),
                     PRL_OK);
    return 0;
}

static void write_dump(const char *dir, const char *perturb, int32_t token0_delta)
{
    for (int i = 0; i < NSEQ; i++) {
        dump_ctx d = {.perturb = perturb};
        prl_safetensors_writer_init(&d.w);
        const prl_diag_seq *s = &seqs[i];
        int32_t targets[SEQ_MAX], toks[SEQ_MAX];
        for (int t = 0; t < s->n; t++) targets[t] = t + 1 < s->n ? s->tokens[t + 1] : -1;
        memcpy(toks, s->tokens, (size_t)s->n * sizeof *toks);
        prl_batch b = {.B = 1,
                       .T = s->n,
                       .tokens = s->tokens,
                       .targets = targets,
                       .temperature = 1};
        float lp[SEQ_MAX];
        prl_model_set_hook(&model, dump_hook, &d);
        assert_ok(prl_model_logprobs(&model, &b, lp));
        prl_model_set_hook(&model, NULL, NULL);
        const int32_t *routes = prl_model_routes(&model);
        int K = model.cfg.num_experts_per_tok;
        int32_t rt[5][SEQ_MAX * 2];
        char names[5][32];
        for (int m = 0; m < model.n_moe; m++) {
            memcpy(rt[m], routes + (size_t)m * s->n * K, (size_t)s->n * K * sizeof(int32_t));
            snprintf(names[m], sizeof names[m], "L%d.moe.routes", m + 1);
            int64_t shp[2] = {s->n, K};
            assert_ok(prl_safetensors_writer_add(&d.w, names[m], PRL_DTYPE_I32, shp, 2, rt[m]));
        }
        toks[0] += token0_delta;
        int64_t tshape[1] = {s->n};
        assert_ok(prl_safetensors_writer_add(&d.w, "tokens", PRL_DTYPE_I32, tshape, 1, toks));
        char path[512];
        snprintf(path, sizeof path, "%s/seq-%d.safetensors", dir, i);
        assert_ok(prl_safetensors_writer_save(&d.w, path));
        prl_safetensors_writer_free(&d.w);
        for (int j = 0; j < d.n; j++) free(d.bufs[j]);
    }
}

START_TEST(test_external_dump)
{
    char dir[] = "/tmp/prl-diag-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    write_dump(dir, NULL, 0);
    prl_diag_report r;
    assert_ok(prl_diag_compare_external(&model, dir, seqs, NSEQ, 0, 1.0, &r));
    ck_assert_int_eq(r.first, -1);
    ck_assert_int_eq(r.n_ops, 30);
    for (int i = 0; i < r.n_ops; i++) ck_assert(r.ops[i].max_abs == 0 && r.ops[i].count > 0);
    ck_assert_int_eq(r.n_routing, 5);
    ck_assert_int_eq(r.routing[0].differ, 0);
    ck_assert_int_eq(r.lp.hist[0], r.lp.n); /* log-probs from the dump's logits: the same */
    ck_assert(r.lp.n > 0);
    prl_diag_report_free(&r);

    write_dump(dir, "L2.attn.kv_latent", 0);
    assert_ok(prl_diag_compare_external(&model, dir, seqs, NSEQ, 1e-3, 1.0, &r));
    ck_assert_int_ge(r.first, 0);
    ck_assert_str_eq(r.ops[r.first].name, "L2.attn.kv_latent");
    prl_diag_report_free(&r);

    write_dump(dir, NULL, 1);
    ck_assert_int_eq(prl_diag_compare_external(&model, dir, seqs, NSEQ, 0, 1.0, &r),
                     PRL_ERR_FORMAT);
    assert_msg_has("seq-0.safetensors: token 0");

    char path[512];
    snprintf(path, sizeof path, "%s/seq-2.safetensors", dir);
    unlink(path);
    write_dump(dir, NULL, 0);
    unlink(path);
    ck_assert_int_ne(prl_diag_compare_external(&model, dir, seqs, NSEQ, 0, 1.0, &r), PRL_OK);
    assert_msg_has("seq-2.safetensors");
    assert_msg_has("s2");
    for (int i = 0; i < NSEQ; i++) {
        snprintf(path, sizeof path, "%s/seq-%d.safetensors", dir, i);
        unlink(path);
    }
    rmdir(dir);
}
END_TEST

/* ------------------------------------------------------------------ --run ----------- */

#ifdef PRL_BIN
/* `prl diagnose ARGS --json` (stderr dropped) parsed; NULL when it failed. */
static json_t *run_prl(const char *args, const char *env)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s PRL_THREADS=1 %s diagnose %s --json 2>/dev/null", env ? env : "",
             PRL_BIN, args);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    json_error_t err;
    json_t *j = json_loadf(p, 0, &err);
    int st = pclose(p);
    if (st != 0) json_decref(j), j = NULL;
    if (!j) fprintf(stderr, "%s: exit %d\n", cmd, st);
    return j;
}

/* runs/demo/run.db: step 1 holds sequence 2, step 2 holds sequences 0 and 1. */
static void write_run(const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/runs", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/runs/demo", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/runs/demo/run.db", dir);
    prl_store *db;
    int64_t run;
    assert_ok(prl_store_open(path, &db));
    assert_ok(prl_store_run_create(db, "demo", "{}", 1, &run));
    static const char *ids[NSEQ] = {"p0", "p1", "p2"};
    static const int steps[NSEQ] = {2, 2, 1};
    float lp[SEQ_MAX] = {0};
    for (int i = 0; i < NSEQ; i++) {
        prl_store_prompt p = {.run = run,
                              .prompt_id = ids[i],
                              .domain = "reasoning",
                              .split = "train",
                              .task = "{}",
                              .difficulty = 1};
        assert_ok(prl_store_prompt_put(db, &p));
        prl_store_sample s = {.run = run,
                              .step = steps[i],
                              .prompt_id = ids[i],
                              .sample_index = 0,
                              .tokens = seqs[i].tokens,
                              .n_tokens = seqs[i].n,
                              .prompt_len = seqs[i].prompt_len,
                              .logprobs = lp,
                              .worker = "rollout-0"};
        assert_ok(prl_store_sample_put(db, &s, NULL));
    }
    prl_store_close(db);
}

START_TEST(test_cli_run_samples)
{
    char dir[] = "/tmp/prl-diag-run-XXXXXX", ck[600], args[2048];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(ck, sizeof ck, "%s/ck", dir);
    assert_ok(prl_checkpoint_save(&model, NULL, NULL, NULL, ck));
    write_run(dir);
    snprintf(args, sizeof args, "--ckpt %s --run %s/runs/demo --precision aligned --threshold 0",
             ck, dir);
    json_t *j = run_prl(args, NULL);
    ck_assert_msg(j != NULL, "prl diagnose %s failed", args);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "sequences")),
                     2); /* the latest step: 2 */
    ck_assert_int_eq(json_integer_value(json_object_get(j, "tokens")), seqs[0].n + seqs[1].n);
    ck_assert(json_is_null(json_object_get(j, "first_divergent")));
    json_t *lp = json_object_get(j, "logprob");
    ck_assert_int_eq(json_integer_value(json_object_get(lp, "tokens")),
                     seqs[0].n - seqs[0].prompt_len + seqs[1].n - seqs[1].prompt_len);
    ck_assert_double_eq(json_real_value(json_object_get(lp, "max_abs")), 0);
    json_decref(j);

    j = run_prl(args, "PRL_INFER_FAULT=L1.attn.q:0.001");
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(
        json_string_value(json_object_get(json_object_get(j, "first_divergent"), "name")),
        "L1.attn.q");
    json_decref(j);

    snprintf(args, sizeof args, "--ckpt %s --run %s/runs/demo --step 1", ck, dir);
    j = run_prl(args, NULL);
    ck_assert_ptr_nonnull(j);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "tokens")), seqs[2].n);
    json_decref(j);
    snprintf(args, sizeof args, "--ckpt %s --run %s/runs/demo --n 1", ck, dir);
    j = run_prl(args, NULL);
    ck_assert_ptr_nonnull(j);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "tokens")), seqs[0].n); /* p0 first */
    json_decref(j);
    snprintf(args, sizeof args, "--ckpt %s --run %s/runs/demo --step 7", ck, dir);
    ck_assert_ptr_null(run_prl(args, NULL)); /* no samples at step 7: an error */
    check_remove_tree(dir);
}
END_TEST
#endif

/* ------------------------------------------------------------------ output ---------- */

START_TEST(test_json_and_html)
{
    setenv("PRL_INFER_FAULT", "L1.moe.out:0.01", 1);
    prl_infer_options o = preset("aligned", 3);
    prl_diag_report r;
    prl_status rc = prl_diag_compare_infer(&model, &o, 0, seqs, NSEQ, 0, 1.0, &r);
    unsetenv("PRL_INFER_FAULT");
    assert_ok(rc);
    json_t *j = prl_diag_to_json(&r, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(j, "schema")), "prl.diagnose/1");
    json_t *first = json_object_get(j, "first_divergent");
    ck_assert_str_eq(json_string_value(json_object_get(first, "name")), "L1.moe.out");
    ck_assert_int_eq(json_integer_value(json_object_get(first, "layer")), 1);
    ck_assert_str_eq(json_string_value(json_object_get(first, "op")), "moe.out");
    ck_assert_int_eq(json_array_size(json_object_get(j, "ops")), 30);
    ck_assert_int_eq(json_array_size(json_object_get(j, "routing")), 5);
    ck_assert_int_eq(json_array_size(json_object_get(json_object_get(j, "logprob"), "histogram")),
                     PRL_DIAG_HIST_BINS);
    ck_assert(json_is_null(json_object_get(j, "sweep")));
    json_decref(j);

    char path[] = "/tmp/prl-diag-html-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    assert_ok(prl_diag_write_html(path, &r, NULL));
    char *text = NULL;
    assert_ok(prl_file_read(path, &text, NULL));
    ck_assert_ptr_nonnull(strstr(text, "<svg"));
    ck_assert_ptr_nonnull(strstr(text, "First divergent op"));
    ck_assert_ptr_nonnull(strstr(text, "<b>L1.moe.out</b>"));
    ck_assert_ptr_null(
        strstr(text, "http://www.w3.org/1999")); /* no external resources but the SVG ns */
    free(text);
    unlink(path);
    prl_diag_report_free(&r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("diagnose");
    TCase *t = tcase_create("stats");
    tcase_add_test(t, test_op_stats_by_hand);
    tcase_add_test(t, test_histogram_bins);
    tcase_add_test(t, test_routing_overlap_by_hand);
    suite_add_tcase(s, t);
    t = tcase_create("infer");
    tcase_add_checked_fixture(t, setup, NULL);
    tcase_set_timeout(t, 300);
    tcase_add_test(t, test_aligned_reports_zero_everywhere);
    tcase_add_test(t, test_fault_named_first_aligned);
    tcase_add_test(t, test_fault_named_first_fp32);
    tcase_add_test(t, test_fault_without_fault_fp32_is_clean);
    tcase_add_test(t, test_fault_bad_names);
    tcase_add_test(t, test_sweep_attribution);
    tcase_add_test(t, test_bad_sequences_named);
    tcase_add_test(t, test_external_dump);
    tcase_add_test(t, test_json_and_html);
#ifdef PRL_BIN
    tcase_add_test(t, test_cli_run_samples);
#endif
    suite_add_tcase(s, t);
    int rc = check_run(s);
    prl_model_free(&model);
    return rc;
}
