/*
** test_sft.c — sft/'s trainer loop: its progress reports. A run cut into chunks (checkpoint
** saves) reports one elapsed time and one ETA across the chunks, not one per chunk; every
** step is reported, the ones a progress line prints marked.
*/
#include "sft/sft.h"
#include "tests/check_util.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *micro_config =
    "{\"vocab_size\": 64, \"hidden_size\": 16, \"num_hidden_layers\": 1,"
    " \"num_attention_heads\": 2, \"q_lora_rank\": 8, \"kv_lora_rank\": 8,"
    " \"qk_nope_head_dim\": 4, \"qk_rope_head_dim\": 4, \"v_head_dim\": 4,"
    " \"first_k_dense_replace\": 1, \"intermediate_size\": 32,"
    " \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8,"
    " \"n_shared_experts\": 1, \"max_position_embeddings\": 32}";

enum { N_EXAMPLES = 8, EXAMPLE_LEN = 12, MAX_REPORTS = 16 };

typedef struct reports {
    prl_sft_progress p[MAX_REPORTS];
    int n;
} reports;

static void record(void *user, const prl_sft_progress *p)
{
    reports *r = user;
    ck_assert_int_lt(r->n, MAX_REPORTS);
    r->p[r->n++] = *p;
}

/* N_EXAMPLES fixed sequences, every token but the first trained. */
static void toy_data(prl_sft_data *d)
{
    d->n = N_EXAMPLES;
    d->ex = calloc(N_EXAMPLES, sizeof *d->ex);
    for (int i = 0; i < N_EXAMPLES; i++) {
        prl_sft_example *e = &d->ex[i];
        e->n = EXAMPLE_LEN;
        e->ids = malloc(EXAMPLE_LEN * sizeof *e->ids);
        e->mask = malloc(EXAMPLE_LEN);
        for (int t = 0; t < EXAMPLE_LEN; t++) {
            e->ids[t] = (int32_t)((7 * i + 3 * t + 1) % 64);
            e->mask[t] = t > 0;
        }
        d->n_tokens += EXAMPLE_LEN, d->n_loss_tokens += EXAMPLE_LEN - 1;
    }
}

/* Four steps as two chunks of two, as `prl sft --save-every 2 --steps 4` runs them, in a run
** said to have begun 100 s ago: both chunks report the whole run's steps, elapsed time and
** remaining steps. */
START_TEST(test_progress_spans_chunks)
{
    prl_config cfg;
    prl_model m;
    prl_optim o;
    prl_optim_config oc;
    prl_sft_data d = {0};
    assert_ok(prl_config_parse(&cfg, micro_config, "micro"));
    assert_ok(prl_model_init(&m, &cfg));
    prl_model_init_weights(&m, 1);
    prl_optim_config_default(&oc);
    assert_ok(prl_optim_init(&o, &m, &oc));
    toy_data(&d);
    reports r = {.n = 0};
    prl_sft_config c = {.batch = 2,
                        .seq = EXAMPLE_LEN,
                        .steps = 2,
                        .accum = 1,
                        .seed = 1,
                        .log_every = 1,
                        .run_last = 4,
                        .run_first = 0,
                        .run_start_s = prl_now() - 100};
    assert_ok(prl_sft_train(&m, &o, &d, &c, record, &r));
    assert_ok(prl_sft_train(&m, &o, &d, &c, record, &r));
    ck_assert_int_eq(r.n, 4);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(r.p[i].step, i + 1);
        ck_assert_int_eq(r.p[i].steps, 4);
        ck_assert_msg(r.p[i].elapsed_s >= 100, "step %d: elapsed %g restarted", i + 1,
                      r.p[i].elapsed_s);
        /* elapsed / done × remaining: 3, 1, 1/3 and 0 times the time so far */
        double want = r.p[i].elapsed_s / (i + 1) * (3 - i);
        ck_assert_msg(fabs(r.p[i].eta_s - want) <= 1e-6 * want, "step %d: eta %g, want %g", i + 1,
                      r.p[i].eta_s, want);
    }
    /* without run_start_s the call is the whole run: its own steps, from its own start */
    c.run_start_s = 0, c.run_last = 0;
    r.n = 0;
    assert_ok(prl_sft_train(&m, &o, &d, &c, record, &r));
    ck_assert_int_eq(r.n, 2);
    ck_assert_int_eq(r.p[1].step, 6);
    ck_assert_int_eq(r.p[1].steps, 6);
    ck_assert(r.p[1].elapsed_s < 100);
    ck_assert(r.p[1].eta_s == 0);
    /* every step is reported (metrics files want them all); log_line marks every log_every-th
    ** and the last */
    c.log_every = 2, c.steps = 3;
    r.n = 0;
    assert_ok(prl_sft_train(&m, &o, &d, &c, record, &r));
    ck_assert_int_eq(r.n, 3);
    ck_assert_int_eq(r.p[0].log_line, 0);
    ck_assert_int_eq(r.p[1].log_line, 1);
    ck_assert_int_eq(r.p[2].log_line, 1);
    prl_sft_data_free(&d);
    prl_optim_free(&o);
    prl_model_free(&m);
}
END_TEST

int main(void)
{
    if (prl_blas_init(1) != PRL_OK) return 1;
    Suite *s = suite_create("sft");
    TCase *tc = tcase_create("progress");
    tcase_add_test(tc, test_progress_spans_chunks);
    suite_add_tcase(s, tc);
    return check_run(s);
}
