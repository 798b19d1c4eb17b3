/*
** test_grpo_reduce.c — the fixed-tree gradient sum over data-parallel ranks (grpo/reduce.c)
** with R ranks simulated by threads over in-memory queues: for every M (leaves) and R the sum
** is bitwise the one-process sum, equals an independent evaluation of the tree (and not a
** left fold, which the leaves are chosen to tell apart), the leaf records arrive in leaf
** order and the counts add up; a leaf that fails on any rank fails rank 0 naming the rank,
** with no rank left waiting; the post-update broadcast carries rank 0's weights or failure.
*/
#include "grpo/reduce.h"

#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { N = 257, MAX_R = 5, MAX_MSGS = 256 };

/* ---------------------------------------------------------------- fake ranks ------- */

typedef struct msg {
    void *data;
    size_t bytes;
} msg;

typedef struct queue { /* messages from one rank to another, in order */
    msg m[MAX_MSGS];
    int head, tail;
} queue;

typedef struct group {
    int R;
    queue q[MAX_R][MAX_R]; /* q[from][to] */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} group;

typedef struct rank_ctx {
    group *g;
    int rank;
} rank_ctx;

static prl_status fake_send(void *ctx, int to, const void *data, size_t bytes)
{
    rank_ctx *c = ctx;
    pthread_mutex_lock(&c->g->mu);
    queue *q = &c->g->q[c->rank][to];
    ck_assert_int_lt(q->tail, MAX_MSGS);
    q->m[q->tail].data = malloc(bytes ? bytes : 1);
    memcpy(q->m[q->tail].data, data, bytes);
    q->m[q->tail++].bytes = bytes;
    pthread_cond_broadcast(&c->g->cv);
    pthread_mutex_unlock(&c->g->mu);
    return PRL_OK;
}

static prl_status fake_recv(void *ctx, int from, void *data, size_t bytes)
{
    rank_ctx *c = ctx;
    pthread_mutex_lock(&c->g->mu);
    queue *q = &c->g->q[from][c->rank];
    while (q->head == q->tail) pthread_cond_wait(&c->g->cv, &c->g->mu);
    msg m = q->m[q->head++];
    pthread_mutex_unlock(&c->g->mu);
    ck_assert_uint_eq(m.bytes, bytes); /* the two sides agree on every size */
    memcpy(data, m.data, bytes);
    free(m.data);
    return PRL_OK;
}

static prl_status fake_bcast(void *ctx, void *data, size_t bytes)
{
    rank_ctx *c = ctx;
    if (c->rank != 0) return fake_recv(ctx, 0, data, bytes);
    for (int r = 1; r < c->g->R; r++) fake_send(ctx, r, data, bytes);
    return PRL_OK;
}

static group *group_new(int R)
{
    group *g = calloc(1, sizeof *g);
    g->R = R;
    pthread_mutex_init(&g->mu, NULL), pthread_cond_init(&g->cv, NULL);
    return g;
}

static void group_free(group *g)
{
    for (int a = 0; a < g->R; a++) /* every message sent was received */
        for (int b = 0; b < g->R; b++) ck_assert_int_eq(g->q[a][b].head, g->q[a][b].tail);
    pthread_mutex_destroy(&g->mu), pthread_cond_destroy(&g->cv);
    free(g);
}

/* ---------------------------------------------------------------- leaves ----------- */

/* Leaf j's gradient: magnitudes spread over 2^±20, so the order of the additions shows in
** the bits; its record is j·10 + 1; fail_leaf fails. */
typedef struct leaf_ctx {
    int fail_leaf;
} leaf_ctx;

static float leaf_value(int j, size_t i)
{
    uint64_t h =
        (uint64_t)(j + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(i + 7) * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 29;
    int e = (int)(h % 41) - 20;
    float v = (float)((h >> 20) % 100000) / 100000.0f + 0.1f;
    return ((h >> 7) & 1 ? -v : v) * (float)ldexp(1.0, e);
}

static prl_status leaf(void *ctx, int j, prl_real *grad, void *record)
{
    leaf_ctx *l = ctx;
    if (j == l->fail_leaf) return prl_error_set(PRL_ERR_NUMERIC, "leaf %d failed", j);
    for (size_t i = 0; i < N; i++) grad[i] = leaf_value(j, i);
    *(int *)record = j * 10 + 1;
    return PRL_OK;
}

/* The tree, evaluated independently of reduce.c. */
static void tree_ref(int lo, int hi, prl_real *out)
{
    if (hi - lo == 1) {
        for (size_t i = 0; i < N; i++) out[i] = leaf_value(lo, i);
        return;
    }
    int mid = lo + (hi - lo) / 2;
    prl_real right[N];
    tree_ref(lo, mid, out), tree_ref(mid, hi, right);
    for (size_t i = 0; i < N; i++) out[i] = out[i] + right[i];
}

/* ---------------------------------------------------------------- one run ---------- */

typedef struct rank_run {
    group *g;
    int rank, M, fail_leaf;
    prl_real out[N];
    int records[64];
    double counts[3];
    prl_status rc;
    char err[256];
} rank_run;

static void *rank_main(void *p)
{
    rank_run *r = p;
    rank_ctx c = {.g = r->g, .rank = r->rank};
    prl_grpo_comm comm = {.rank = r->rank,
                          .size = r->g->R,
                          .ctx = &c,
                          .send = fake_send,
                          .recv = fake_recv,
                          .bcast = fake_bcast};
    leaf_ctx l = {.fail_leaf = r->fail_leaf};
    for (int k = 0; k < 3; k++) r->counts[k] = r->rank + k; /* each rank's tallies */
    prl_grpo_reduce red = {.M = r->M,
                           .n = N,
                           .record_bytes = sizeof(int),
                           .counts = r->counts,
                           .n_counts = r->g->R > 1 ? 3 : 0,
                           .comm = r->g->R > 1 ? &comm : NULL,
                           .leaf = leaf,
                           .ctx = &l};
    r->rc = prl_grpo_reduce_run(&red, r->out, r->records);
    if (r->rc) snprintf(r->err, sizeof r->err, "%s", prl_error_message());
    return NULL;
}

/* M leaves over R ranks; rank 0's run into *r0 (returned by value: small). */
static void run_group(int M, int R, int fail_leaf, rank_run *r0)
{
    group *g = group_new(R);
    rank_run *runs = calloc((size_t)R, sizeof *runs);
    pthread_t th[MAX_R];
    for (int r = 0; r < R; r++) {
        runs[r] = (rank_run){.g = g, .rank = r, .M = M, .fail_leaf = fail_leaf};
        pthread_create(&th[r], NULL, rank_main, &runs[r]);
    }
    for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
    *r0 = runs[0];
    free(runs);
    group_free(g);
}

START_TEST(test_sum_independent_of_ranks)
{
    for (int M = 1; M <= 9; M++) {
        prl_real want[N], fold[N];
        tree_ref(0, M, want);
        for (size_t i = 0; i < N; i++) {
            fold[i] = leaf_value(0, i);
            for (int j = 1; j < M; j++) fold[i] = fold[i] + leaf_value(j, i);
        }
        if (M >= 3) ck_assert(memcmp(want, fold, sizeof want) != 0); /* the order shows */
        for (int R = 1; R <= MAX_R; R++) {
            rank_run r0;
            run_group(M, R, -1, &r0);
            ck_assert_msg(r0.rc == PRL_OK, "M %d R %d: %s", M, R, r0.err);
            ck_assert_msg(memcmp(r0.out, want, sizeof want) == 0, "M %d R %d: sum differs", M, R);
            for (int j = 0; j < M; j++) ck_assert_int_eq(r0.records[j], j * 10 + 1);
            if (R > 1) /* rank 0's own tallies plus every other rank's */
                for (int k = 0; k < 3; k++)
                    ck_assert_double_eq(r0.counts[k], (double)R * (R - 1) / 2 + (double)R * k);
        }
    }
}
END_TEST

START_TEST(test_failed_leaf_names_rank)
{
    /* M 6 over 4 ranks: shares [0,1) [1,3) [3,4) [4,6); leaf 3 is rank 2's */
    rank_run r0;
    run_group(6, 4, 3, &r0);
    ck_assert_int_eq(r0.rc, PRL_ERR_NUMERIC);
    ck_assert_msg(strstr(r0.err, "rank 2: leaf 3 failed"), "%s", r0.err);
    run_group(6, 4, 0, &r0); /* rank 0's own leaf */
    ck_assert_int_eq(r0.rc, PRL_ERR_NUMERIC);
    ck_assert_msg(strstr(r0.err, "leaf 0 failed"), "%s", r0.err);
    run_group(2, 4, -1, &r0); /* more ranks than leaves: the idle ones send only status */
    ck_assert_int_eq(r0.rc, PRL_OK);
}
END_TEST

START_TEST(test_shares)
{
    int want[] = {0, 1, 3, 4, 6};
    for (int r = 0; r <= 4; r++) ck_assert_int_eq(prl_grpo_share_first(6, 4, r), want[r]);
    ck_assert_int_eq(prl_grpo_share_first(2, 4, 1), 0); /* rank 0 idle: M < R */
}
END_TEST

/* The post-update broadcast: rank 0's weights and scaler on every rank; its failure too. */
typedef struct bcast_run {
    group *g;
    int rank;
    prl_status rank0_rc, rc;
    prl_model m;
    prl_loss_scaler s;
} bcast_run;

static void *bcast_main(void *p)
{
    bcast_run *b = p;
    rank_ctx c = {.g = b->g, .rank = b->rank};
    prl_grpo_comm comm = {.rank = b->rank,
                          .size = b->g->R,
                          .ctx = &c,
                          .send = fake_send,
                          .recv = fake_recv,
                          .bcast = fake_bcast};
    b->rc = prl_grpo_reduce_bcast_model(&comm, &b->m, &b->s, b->rank ? PRL_OK : b->rank0_rc);
    return NULL;
}

START_TEST(test_bcast_model)
{
    prl_config cfg;
    ck_assert_int_eq(prl_config_load(&cfg, PRL_SOURCE_DIR "/configs/models/tiny.json"), PRL_OK);
    for (int fail = 0; fail <= 1; fail++) {
        group *g = group_new(3);
        bcast_run b[3];
        pthread_t th[3];
        for (int r = 0; r < 3; r++) {
            b[r] = (bcast_run){.g = g, .rank = r, .rank0_rc = fail ? PRL_ERR_NUMERIC : PRL_OK};
            ck_assert_int_eq(prl_model_init(&b[r].m, &cfg), PRL_OK);
            prl_model_init_weights(&b[r].m, (uint64_t)r + 1); /* different until the broadcast */
            b[r].s.scale = r + 1;
        }
        if (fail) prl_error_set(PRL_ERR_NUMERIC, "the loss is nan");
        for (int r = 0; r < 3; r++) pthread_create(&th[r], NULL, bcast_main, &b[r]);
        for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
        for (int r = 1; r < 3; r++) {
            ck_assert_int_eq(b[r].rc, fail ? PRL_ERR_NUMERIC : PRL_OK);
            int same = !memcmp(b[r].m.params, b[0].m.params, b[0].m.n_params * sizeof(prl_real));
            ck_assert_int_eq(same, !fail);
            ck_assert(b[r].s.scale == (fail ? r + 1 : 1));
        }
        ck_assert_int_eq(b[0].rc, fail ? PRL_ERR_NUMERIC : PRL_OK);
        for (int r = 0; r < 3; r++) prl_model_free(&b[r].m);
        group_free(g);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grpo_reduce");
    TCase *tc = tcase_create("reduce");
    tcase_add_test(tc, test_shares);
    tcase_add_test(tc, test_sum_independent_of_ranks);
    tcase_add_test(tc, test_failed_leaf_names_rank);
    tcase_add_test(tc, test_bcast_model);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
