/*
** test_pack.c — packed sequences on the float train path (docs/model.md "Packed sequences"):
** several conversations in one row (prl_batch.pos) give the logits, losses, routes, expert
** counts and parameter gradients of the same conversations one per row, with every block of
** configs/models/micro-pangu.json on (MLA, DSA, SWA, sinks, ModAttn, MoE, mHC, sandwich and
** block post-norms, MTP); bad positions are refused, naming the position. SFT with packing
** (prl_sft_config.pack): rows of whole-length examples train bitwise as unpacked rows, and a
** run cut into chunks (a resume) packs the same rows as one uncut run.
**
** The two batches are equal up to float32 round-off, not bitwise: a sequence that starts
** at column 7 of a packed row meets the GEMM and vector blocking at other offsets than at
** column 0 of its own row, so sums group differently. The bounds below are far above the
** measured differences (printed) and far below what any masking error gives.
*/
#include "engine/engine.h"
#include "sft/sft.h"
#include "tests/check_util.h"
#include "tests/model_util.h"

#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#ifndef PRL_SOURCE_DIR
#define PRL_SOURCE_DIR "."
#endif

enum { T = 12, N_SEQ = 6, PACKED_ROWS = 3 };

/* Six conversations of 5, 7, 4, 3, 5, 6 tokens; packed greedily into rows of 12: [5 7],
** [4 3 5], [6] (the last row padded). */
static const int seq_len_of[N_SEQ] = {5, 7, 4, 3, 5, 6};
static const int seq_row[N_SEQ] = {0, 0, 1, 1, 1, 2}, seq_col[N_SEQ] = {0, 5, 0, 4, 7, 0};

typedef struct batches {
    int32_t tok[N_SEQ * T], tgt[N_SEQ * T], lens[N_SEQ];
    float w[N_SEQ * T];
    int32_t ptok[PACKED_ROWS * T], ptgt[PACKED_ROWS * T], plens[PACKED_ROWS];
    int32_t pos[PACKED_ROWS * T];
    float pw[PACKED_ROWS * T];
    prl_batch one, packed;
} batches;

/* Flat index of conversation q's token i in the unpacked and the packed layout. */
static int at_one(int q, int i) { return q * T + i; }
static int at_packed(int q, int i) { return seq_row[q] * T + seq_col[q] + i; }

static void make_batches(batches *bt, int V)
{
    prl_rng r;
    prl_rng_init(&r, 11, 0, 0, 0, PRL_RNG_TEST);
    memset(bt, 0, offsetof(batches, one));
    for (int i = 0; i < PACKED_ROWS * T; i++) bt->pos[i] = -1, bt->ptgt[i] = -1;
    for (int i = 0; i < N_SEQ * T; i++) bt->tgt[i] = -1;
    for (int q = 0; q < N_SEQ; q++) {
        int n = seq_len_of[q];
        bt->lens[q] = n;
        for (int i = 0; i < n; i++) {
            int32_t id = (int32_t)(prl_rng_u64(&r) % (uint64_t)V);
            bt->tok[at_one(q, i)] = bt->ptok[at_packed(q, i)] = id;
            bt->pos[at_packed(q, i)] = i;
        }
        for (int i = 0; i + 1 < n; i++) { /* next token, some positions untrained */
            int32_t y = i % 4 == 2 ? -1 : bt->tok[at_one(q, i + 1)];
            float w = y >= 0 ? (float)(-(1 + 0.25 * (i % 3)) / 20) : 0;
            bt->tgt[at_one(q, i)] = bt->ptgt[at_packed(q, i)] = y;
            bt->w[at_one(q, i)] = bt->pw[at_packed(q, i)] = w;
        }
    }
    bt->plens[0] = bt->plens[1] = T, bt->plens[2] = seq_len_of[5];
    bt->one = (prl_batch){.B = N_SEQ,
                          .T = T,
                          .tokens = bt->tok,
                          .lens = bt->lens,
                          .targets = bt->tgt,
                          .weights = bt->w,
                          .temperature = 0.9,
                          .with_mtp = 1};
    bt->packed = bt->one;
    bt->packed.B = PACKED_ROWS, bt->packed.tokens = bt->ptok, bt->packed.lens = bt->plens;
    bt->packed.targets = bt->ptgt, bt->packed.weights = bt->pw, bt->packed.pos = bt->pos;
}

/* The model of configs/models/micro-pangu.json with both auxiliary MoE losses and the bias
** update on, weights drawn so that every block does something. */
static void micro_pangu(prl_model *m)
{
    prl_config cfg;
    ck_assert_msg(prl_config_load(&cfg, PRL_SOURCE_DIR "/configs/models/micro-pangu.json") ==
                      PRL_OK,
                  "%s", prl_error_message());
    ck_assert(cfg.n_dsa_layers == 1 && cfg.n_swa_layers == 2 && cfg.param_sink_number == 2 &&
              cfg.use_mome && cfg.use_mhc && cfg.num_nextn_predict_layers == 1);
    cfg.initializer_range = 0.3;
    cfg.balance_loss_alpha = 0.05, cfg.router_z_loss_coef = 0.01, cfg.bias_update_rate = 0.01;
    ck_assert_int_eq(prl_model_init(m, &cfg), PRL_OK);
    prl_model_init_weights(m, 7);
    test_model_sharpen(m, 1);
}

typedef struct run_out {
    prl_forward_stats st;
    float *logp;
    prl_real *logits, *grads;
    int32_t *routes;
    double *counts;
    uint8_t *sel; /* the DSA layer's selection */
} run_out;

static void run(prl_model *m, const prl_batch *b, run_out *o)
{
    size_t N = (size_t)b->B * b->T, V = (size_t)m->cfg.vocab_size, K = 2;
    size_t nc = (size_t)m->n_moe_all * m->cfg.n_routed_experts;
    memset(m->expert_counts, 0, nc * sizeof *m->expert_counts);
    o->logp = malloc(N * sizeof *o->logp);
    prl_model_zero_grad(m);
    ck_assert_msg(prl_model_forward(m, b, o->logp, &o->st) == PRL_OK, "%s", prl_error_message());
    ck_assert_msg(prl_model_backward(m, b) == PRL_OK, "%s", prl_error_message());
    o->logits = malloc(N * V * sizeof *o->logits);
    memcpy(o->logits, prl_model_logits(m), N * V * sizeof *o->logits);
    o->grads = malloc(m->n_params * sizeof *o->grads);
    memcpy(o->grads, m->grads, m->n_params * sizeof *o->grads);
    o->routes = malloc((size_t)m->n_moe * N * K * sizeof *o->routes);
    memcpy(o->routes, prl_model_routes(m), (size_t)m->n_moe * N * K * sizeof *o->routes);
    o->counts = malloc(nc * sizeof *o->counts);
    memcpy(o->counts, m->expert_counts, nc * sizeof *o->counts);
    o->sel = malloc(N * b->T);
    memcpy(o->sel, prl_model_dsa_selection(m, m->cfg.dsa_layers[0]), N * b->T);
}

static void run_free(run_out *o)
{
    free(o->logp), free(o->logits), free(o->grads), free(o->routes), free(o->counts), free(o->sel);
}

/* |a − b| relative to max(1e-3, |a|) */
static double rel(double a, double b) { return fabs(a - b) / fmax(1e-3, fabs(a)); }

START_TEST(test_packed_equals_one_per_row)
{
    prl_model m;
    micro_pangu(&m);
    batches bt;
    make_batches(&bt, m.cfg.vocab_size);
    run_out one, pk;
    run(&m, &bt.one, &one);
    run(&m, &bt.packed, &pk);
    int V = m.cfg.vocab_size, K = 2, NO = N_SEQ * T, NP = PACKED_ROWS * T;
    double logit_err = 0, logit_max = 0, logp_err = 0;
    for (int q = 0; q < N_SEQ; q++)
        for (int i = 0; i < seq_len_of[q]; i++) {
            const prl_real *a = one.logits + (size_t)at_one(q, i) * V,
                           *b = pk.logits + (size_t)at_packed(q, i) * V;
            for (int v = 0; v < V; v++) {
                logit_err = fmax(logit_err, fabs(a[v] - b[v]));
                logit_max = fmax(logit_max, fabs(a[v]));
            }
            logp_err = fmax(logp_err, fabs(one.logp[at_one(q, i)] - pk.logp[at_packed(q, i)]));
            for (int l = 0; l < m.n_moe; l++) /* the same experts for every token */
                for (int k = 0; k < K; k++)
                    ck_assert_int_eq(one.routes[((size_t)l * NO + at_one(q, i)) * K + k],
                                     pk.routes[((size_t)l * NP + at_packed(q, i)) * K + k]);
            for (int s = 0; s <= i; s++) /* the same DSA selection, inside the sequence */
                ck_assert_int_eq(one.sel[(size_t)at_one(q, i) * T + s],
                                 pk.sel[(size_t)at_packed(q, i) * T + seq_col[q] + s]);
            for (int s = 0; s < T; s++) /* and nothing of another sequence */
                if (s < seq_col[q] || s > seq_col[q] + i)
                    ck_assert_int_eq(pk.sel[(size_t)at_packed(q, i) * T + s], 0);
        }
    for (int i = 0; i < m.n_moe_all * m.cfg.n_routed_experts; i++)
        ck_assert_double_eq(one.counts[i], pk.counts[i]);
    ck_assert_int_eq(one.st.n_targets, pk.st.n_targets);
    double loss_err =
        fmax(fmax(rel(one.st.loss, pk.st.loss), rel(one.st.lm_loss, pk.st.lm_loss)),
             fmax(rel(one.st.mtp_loss, pk.st.mtp_loss), rel(one.st.index_loss, pk.st.index_loss)));
    loss_err = fmax(loss_err, fmax(rel(one.st.balance_loss, pk.st.balance_loss),
                                   rel(one.st.z_loss, pk.st.z_loss)));
    ck_assert(one.st.mtp_loss != 0 && one.st.index_loss > 0 && one.st.balance_loss > 0);
    /* every tensor's gradient, relative to the tensor's largest */
    double grad_err = 0;
    for (int i = 0; i < m.n_tensors; i++) {
        const prl_param_info *p = &m.tensors[i];
        double mx = 0, err = 0;
        for (size_t j = p->offset; j < p->offset + p->numel; j++) {
            mx = fmax(mx, fabs(one.grads[j]));
            err = fmax(err, fabs(one.grads[j] - pk.grads[j]));
        }
        ck_assert_msg(mx > 0, "%s has no gradient", p->name);
        ck_assert_msg(err / mx < 1e-4, "%s: packed gradient differs by %.3g of %.3g", p->name, err,
                      mx);
        grad_err = fmax(grad_err, err / mx);
    }
    fprintf(stderr,
            "packed vs one per row: logits max |diff| %.3g (of %.3g), log-probs %.3g, losses rel "
            "%.3g, gradients rel %.3g (worst tensor)\n",
            logit_err, logit_max, logp_err, loss_err, grad_err);
    ck_assert_double_lt(logit_err / logit_max, 1e-5);
    ck_assert_double_lt(logp_err, 1e-4);
    ck_assert_double_lt(loss_err, 1e-5);
    run_free(&one), run_free(&pk);
    prl_model_free(&m);
}
END_TEST

/* The control: the same rows without their positions are one causal sequence per row, and
** then the logits do differ (the test above would catch a path that ignores pos). */
START_TEST(test_packing_changes_unpacked_rows)
{
    prl_model m;
    micro_pangu(&m);
    batches bt;
    make_batches(&bt, m.cfg.vocab_size);
    prl_batch flat = bt.packed;
    flat.pos = NULL;
    for (int i = 0; i < PACKED_ROWS * T; i++) /* padding inside a row: nothing to pack here */
        ck_assert(bt.pos[i] >= 0 || i >= 2 * T + seq_len_of[5]);
    run_out pk, fl;
    run(&m, &bt.packed, &pk);
    run(&m, &flat, &fl);
    int V = m.cfg.vocab_size, q = 1; /* the second sequence of row 0 */
    double diff = 0;
    for (int i = 0; i < seq_len_of[q] * V; i++)
        diff = fmax(diff, fabs(pk.logits[(size_t)at_packed(q, 0) * V + i] -
                               fl.logits[(size_t)at_packed(q, 0) * V + i]));
    ck_assert_double_gt(diff, 1e-2);
    run_free(&pk), run_free(&fl);
    prl_model_free(&m);
}
END_TEST

/* Positions other than −1, 0 or the previous + 1 are refused, naming the row and position. */
START_TEST(test_bad_positions_refused)
{
    prl_model m;
    micro_pangu(&m);
    batches bt;
    make_batches(&bt, m.cfg.vocab_size);
    static const struct {
        int at;
        int32_t v;
    } bad[] = {{3, 7}, {5, 2}, {0, 1}, {14, -2}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int32_t keep = bt.pos[bad[k].at];
        bt.pos[bad[k].at] = bad[k].v;
        ck_assert_int_eq(prl_model_forward(&m, &bt.packed, NULL, NULL), PRL_ERR_RANGE);
        char want[64];
        snprintf(want, sizeof want, "sequence %d position %d: packed position %d", bad[k].at / T,
                 bad[k].at % T, bad[k].v);
        ck_assert_msg(strstr(prl_error_message(), want), "%s", prl_error_message());
        bt.pos[bad[k].at] = keep;
    }
    /* a padding position between two sequences is fine, and so is one past a row's length */
    bt.pos[4] = -1, bt.ptgt[3] = -1, bt.pw[3] = 0;
    bt.pos[2 * T + 9] = 42;
    ck_assert_msg(prl_model_forward(&m, &bt.packed, NULL, NULL) == PRL_OK, "%s",
                  prl_error_message());
    prl_model_free(&m);
}
END_TEST

/* ------------------------------------------------------------------ SFT ------------- */

/* Examples of the given lengths (ids from a fixed formula, every token but the first trained). */
static void sft_data(prl_sft_data *d, const int *lens, int n)
{
    memset(d, 0, sizeof *d);
    d->n = n;
    d->ex = calloc((size_t)n, sizeof *d->ex);
    for (int i = 0; i < n; i++) {
        prl_sft_example *e = &d->ex[i];
        e->n = lens[i];
        e->ids = malloc((size_t)e->n * sizeof *e->ids);
        e->mask = malloc((size_t)e->n);
        for (int t = 0; t < e->n; t++) {
            e->ids[t] = (int32_t)((7 * i + 3 * t + 1) % 64);
            e->mask[t] = t > 0;
        }
        d->n_tokens += (size_t)e->n, d->n_loss_tokens += (size_t)e->n - 1;
    }
}

/* The weights after `steps` SFT steps of micro-pangu from a fixed init, run as chunks of
** `chunk` steps (a resumed run), with or without packing (malloc'd copy). */
static prl_real *sft_weights(const prl_sft_data *d, int pack, int steps, int chunk)
{
    prl_model m;
    micro_pangu(&m);
    prl_optim o;
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    oc.lr = 1e-3;
    assert_ok(prl_optim_init(&o, &m, &oc));
    prl_sft_config c = {.batch = 2, .seq = T, .accum = 2, .seed = 3, .log_every = 1, .pack = pack};
    for (int done = 0; done < steps; done += chunk) {
        c.steps = chunk;
        assert_ok(prl_sft_train(&m, &o, d, &c, NULL, NULL));
    }
    prl_real *w = malloc(m.n_params * sizeof *w);
    memcpy(w, m.params, m.n_params * sizeof *w);
    prl_optim_free(&o);
    prl_model_free(&m);
    return w;
}

static size_t n_params_micro(void)
{
    prl_model m;
    micro_pangu(&m);
    size_t n = m.n_params;
    prl_model_free(&m);
    return n;
}

/* Whole-length examples: one per row either way, so packing is the unpacked run bit for bit
** (every packed path reduces to the unpacked one when a row holds one sequence). */
START_TEST(test_sft_pack_full_rows_bitwise)
{
    int lens[8];
    for (int i = 0; i < 8; i++) lens[i] = T;
    prl_sft_data d;
    sft_data(&d, lens, 8);
    prl_real *a = sft_weights(&d, 0, 3, 3), *b = sft_weights(&d, 1, 3, 3);
    ck_assert(memcmp(a, b, n_params_micro() * sizeof *a) == 0);
    free(a), free(b);
    prl_sft_data_free(&d);
}
END_TEST

/* Examples of mixed lengths: packing changes the run (rows hold several examples), a run cut
** into chunks of 1 and 2 steps packs the same rows as the uncut one (bitwise), and an
** example longer than a row is cut to the row. */
START_TEST(test_sft_pack_resume_and_mixed_lengths)
{
    static const int lens[11] = {5, 7, 4, 3, 12, 6, 2, 9, 3, 15, 8};
    prl_sft_data d;
    sft_data(&d, lens, 11);
    size_t n = n_params_micro();
    prl_real *whole = sft_weights(&d, 1, 4, 4), *ones = sft_weights(&d, 1, 4, 1),
             *twos = sft_weights(&d, 1, 4, 2), *unpacked = sft_weights(&d, 0, 4, 4);
    ck_assert(memcmp(whole, ones, n * sizeof *whole) == 0);
    ck_assert(memcmp(whole, twos, n * sizeof *whole) == 0);
    ck_assert(memcmp(whole, unpacked, n * sizeof *whole) != 0);
    for (size_t i = 0; i < n; i++) ck_assert(isfinite(whole[i]));
    free(whole), free(ones), free(twos), free(unpacked);
    prl_sft_data_free(&d);
}
END_TEST

/* Packing and length grouping are exclusive: refused, naming both. */
START_TEST(test_sft_pack_with_group_refused)
{
    int lens[2] = {5, 6};
    prl_sft_data d;
    sft_data(&d, lens, 2);
    prl_model m;
    micro_pangu(&m);
    prl_optim o;
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    assert_ok(prl_optim_init(&o, &m, &oc));
    prl_sft_config c =
        {.batch = 1, .seq = T, .steps = 1, .accum = 1, .log_every = 1, .pack = 1, .group = 4};
    ck_assert_int_eq(prl_sft_train(&m, &o, &d, &c, NULL, NULL), PRL_ERR_ARG);
    assert_msg_has("packing needs group 0");
    ck_assert_int_eq(o.step, 0);
    prl_optim_free(&o);
    prl_model_free(&m);
    prl_sft_data_free(&d);
}
END_TEST

int main(void)
{
    if (prl_blas_init(1) != PRL_OK) return 1;
    Suite *s = suite_create("pack");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_packed_equals_one_per_row);
    tcase_add_test(tc, test_packing_changes_unpacked_rows);
    tcase_add_test(tc, test_bad_positions_refused);
    tcase_add_test(tc, test_sft_pack_full_rows_bitwise);
    tcase_add_test(tc, test_sft_pack_resume_and_mixed_lengths);
    tcase_add_test(tc, test_sft_pack_with_group_refused);
    suite_add_tcase(s, tc);
    return check_run(s);
}
