/*
** infer_forward.c — the infer path's forward over a set of rows (tokens at positions of
** sequences in cache slots): MLA attention with the per-sequence caches (absorbed or naive
** form, sliding-window rings, parameter sinks, ModAttn convs, the DSA indexer), the dense FFN
** and the MoE with route capture, the residual glue (mHC sites, sandwich and block post-
** norms), and the trunk driver infer__forward_rows(). Every kernel computes a row from that
** row's inputs alone, in a fixed order (infer.c).
*/
#include "engine/infer_int.h"
#include "engine/dsa.h"
#include "engine/mhc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ attention ------- */

/* Cache rows of position `pos` of the sequence in `slot`: row pos of the whole-context
** cache, or row pos mod W of a sliding-window layer's ring. */
static float *lat_row(const prl_infer *e, int l, int slot, int pos)
{
    const layer_w *w = &e->lw[l];
    return e->cache_lat + w->lat_off + ((size_t)slot * w->cap + pos % w->cap) * e->lat;
}

static float *kv_row(const prl_infer *e, int l, int slot, int pos)
{
    const layer_w *w = &e->lw[l];
    return e->cache_kv + w->kv_off + ((size_t)slot * w->cap + pos % w->cap) * e->H * e->dkv;
}

/* A ring layer keeps only W cache rows, so during a call its keys come from two places: the
** rows of this call (rows_buf, written to the ring only after every row has attended) and
** the ring (older positions). NULL: a position the ring no longer holds; no row of the call
** can see it. */
static int is_ring(const prl_infer *e, int l) { return e->lw[l].cap < e->opt.max_len; }

static const float *key_row(const prl_infer *e, int l, int slot, int q, int naive)
{
    const rows_buf *b = &e->rb;
    int f = b->first_pos[slot];
    if (q >= f) {
        size_t r = (size_t)(b->first_row[slot] + q - f);
        return naive ? b->kvx + r * e->H * e->dkv : b->lat + r * e->lat;
    }
    if (q < f - e->lw[l].cap) return NULL;
    return naive ? kv_row(e, l, slot, q) : lat_row(e, l, slot, q);
}

typedef struct att_ctx {
    prl_infer *e;
    int l, R;
    int *run_start, *run_rows; /* naive: row chunks of one sequence at consecutive positions */
    int n_runs;
    int groups; /* absorbed: head groups a row (tasks R·groups) */
} att_ctx;

/* The selected positions of a DSA row's mask over positions [0, n), in increasing order;
** returns how many. */
static int sel_list(int32_t *idx, const uint8_t *sel, int n)
{
    int c = 0;
    for (int s = 0; s < n; s++)
        if (sel[s]) idx[c++] = s;
    return c;
}

/* Naive form: the train path's prl_attention_rows on the cached per-head keys and values
** (gathered in position order for a ring layer) and the layer's sinks. */
static void naive_task(void *p, int t)
{
    att_ctx *c = p;
    prl_infer *e = c->e;
    rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[c->l];
    int run = t / e->H, h = t % e->H, r0 = c->run_start[run], rows = c->run_rows[run];
    int slot = b->slot[r0], p0 = b->pos[r0], p1 = p0 + rows, ldS = e->ns + e->opt.max_len;
    float *S = e->att_scratch + e->att_scratch_per_thread * (size_t)prl_pool_worker();
    prl_attn_keys kk = {.window = w->window, .ns = e->ns, .scale = e->attn_scale};
    if (e->ns > 0) {
        kk.sk = w->sink_kv + (size_t)h * e->dkv, kk.ldsk = e->H * e->dkv;
        kk.skr = w->sink_lat + e->rkv, kk.ldskr = e->lat;
    }
    if (!is_ring(e, c->l)) {
        kk.k = kv_row(e, c->l, slot, 0) + (size_t)h * e->dkv, kk.ldk = e->H * e->dkv;
        kk.kr = lat_row(e, c->l, slot, 0) + e->rkv, kk.ldkr = e->lat;
    } else { /* keys [k0, p1) in position order: [k_nope | v | k_r] per row */
        int wk = e->dkv + e->dr;
        float *g = S + (size_t)PRL_ATT_BLOCK * ldS;
        kk.k0 = prl_attention_key_start(p0, w->window);
        for (int q = kk.k0; q < p1; q++) {
            const float *kv = key_row(e, c->l, slot, q, 1), *lat = key_row(e, c->l, slot, q, 0);
            float *dst = g + (size_t)(q - kk.k0) * wk;
            if (!kv) {
                memset(dst, 0, (size_t)wk * sizeof *dst);
                continue;
            }
            memcpy(dst, kv + (size_t)h * e->dkv, (size_t)e->dkv * sizeof *dst);
            memcpy(dst + e->dkv, lat + e->rkv, (size_t)e->dr * sizeof *dst);
        }
        kk.k = g, kk.ldk = wk, kk.kr = g + e->dkv, kk.ldkr = wk;
    }
    if (w->dsa_sparse) { /* row by row over each row's selected keys (DSA layers never ring) */
        int32_t *idx = (int32_t *)(S + (size_t)PRL_ATT_BLOCK * ldS);
        for (int r = r0; r < r0 + rows; r++) {
            int n = sel_list(idx, b->dsel + (size_t)r * e->opt.max_len, b->pos[r] + 1);
            prl_attention_row_sparse(b->o + (size_t)r * e->H * e->dv + (size_t)h * e->dv, S,
                                     S + e->ns, b->q + (size_t)r * e->H * e->dq + (size_t)h * e->dq,
                                     &kk, idx, n, e->dn, e->dr, e->dv);
        }
        return;
    }
    prl_attention_rows(b->o + (size_t)r0 * e->H * e->dv + (size_t)h * e->dv, e->H * e->dv, S,
                       S + e->ns, ldS, b->q + (size_t)r0 * e->H * e->dq + (size_t)h * e->dq,
                       e->H * e->dq, &kk, p0, p1, e->dn, e->dr, e->dv);
}

/* y[i] += a·x[i] (8 lanes at a time; each element's operations are the same either way). */
static void axpy(float *restrict y, float a, const float *restrict x, int n)
{
    int i = 0;
    v8f va = {a, a, a, a, a, a, a, a};
    for (; i + 8 <= n; i += 8) {
        v8f u, v;
        memcpy(&u, x + i, sizeof u);
        memcpy(&v, y + i, sizeof v);
        v = v + va * u;
        memcpy(y + i, &v, sizeof v);
    }
    for (; i < n; i++) y[i] = y[i] + a * x[i];
}

/* The sinks' part of an absorbed row, merged exactly into the tokens' part (docs/model.md,
** "two-part softmax"): per head, the sink scores' max m_A, sum l_A and normalised latent
** output o_A, then o = (l_A e^{m_A−m} o_A + l_B e^{m_B−m} o_B) / (l_A e^{m_A−m} + l_B e^{m_B−m})
** with m = max(m_A, m_B), where the tokens' part (m_B, l_B, o_B) is already in `ov`. */
static void merge_sinks_head(const prl_infer *e, const layer_w *w, const float *qa, float *ov,
                             const float *mB, const float *lB, float *Ss, float *oA, float scale,
                             int h)
{
    int ns = e->ns, lat = e->lat, rkv = e->rkv;
    float *S = Ss + (size_t)h * ns, *o = oA + (size_t)h * rkv, mA, lA = 0;
    infer__dots(S, qa + (size_t)h * lat, w->sink_lat, lat, ns, lat);
    mA = scale * S[0];
    for (int i = 0; i < ns; i++) S[i] = scale * S[i], mA = S[i] > mA ? S[i] : mA;
    memset(o, 0, (size_t)rkv * sizeof *o);
    for (int i = 0; i < ns; i++) {
        lA += (S[i] = prl_expf(S[i] - mA));
        axpy(o, S[i], w->sink_lat + (size_t)i * lat, rkv);
    }
    float m = mA > mB[h] ? mA : mB[h];
    float a = lA * prl_expf(mA - m), bb = lB[h] * prl_expf(mB[h] - m), inv = 1 / (a + bb);
    float *out = ov + (size_t)h * rkv;
    for (int i = 0; i < rkv; i++) out[i] = (a * (o[i] / lA) + bb * out[i]) * inv;
}

static void merge_sinks(const prl_infer *e, const layer_w *w, const float *qa, float *ov,
                        const float *mB, const float *lB, float *Ss, float *oA, float scale)
{
    for (int h = 0; h < e->H; h++) merge_sinks_head(e, w, qa, ov, mB, lB, Ss, oA, scale, h);
}

/* Head h's query absorbs W_UK: qh[rkv] = W_UK_hᵀ·q_nope (W8A8: W_UK in BF16, fp32 while
** calibrating). The reference and the fast absorbed paths both call this: the same bits. */
static void absorbed_uk(const prl_infer *e, const layer_w *w, int h, float *qh, const float *qn)
{
    int rkv = e->rkv;
    if (w->uk_bf && !e->calibrating)
        prl_bf16_dots(prl_q8_kernel_active(), qh, qn, &w->uk_bf[h], 0, rkv);
    else infer__dots(qh, qn, w->wuk_t + (size_t)h * rkv * e->dn, e->dn, rkv, e->dn);
}

/* Head h's output from its latent result: oh[dv] = W_UV_h·ov_h (W8A8: W_UV in BF16, fp32
** while calibrating); shared by both absorbed paths like absorbed_uk. */
static void absorbed_uv(const prl_infer *e, const layer_w *w, int h, float *oh, const float *ovh)
{
    int rkv = e->rkv;
    if (w->uv_bf && !e->calibrating)
        prl_bf16_dots(prl_q8_kernel_active(), oh, ovh, &w->uv_bf[h], 0, e->dv);
    else infer__dots(oh, ovh, w->wkv_b.w + ((size_t)h * e->dkv + e->dn) * rkv, rkv, e->dv, rkv);
}

/* The absorbed row's softmax over its n keys S[h][0..n) (normalised in place; row pos_j =
** idx[j], or j when idx is NULL), weighted sum of the latent rows, sinks, and W_UV. */
static void absorbed_finish(const prl_infer *e, const layer_w *w, int r, const float *qa,
                            const float *cache, float *S, const int32_t *idx, int n, float *ov,
                            float *Ss, float *oA, float *mB, float *lB)
{
    const rows_buf *b = &e->rb;
    int H = e->H, L = e->opt.max_len, lat = e->lat, rkv = e->rkv;
    float scale = (float)e->attn_scale;
    for (int h = 0; h < H; h++) { /* softmax, normalised in place */
        float *Sh = S + (size_t)h * L, mx = -INFINITY, sum = 0;
        for (int s = 0; s < n; s++) Sh[s] = scale * Sh[s], mx = Sh[s] > mx ? Sh[s] : mx;
        for (int s = 0; s < n; s++) sum += (Sh[s] = prl_expf(Sh[s] - mx));
        float inv = 1 / sum;
        for (int s = 0; s < n; s++) Sh[s] *= inv;
        mB[h] = mx, lB[h] = sum;
    }
    memset(ov, 0, (size_t)H * rkv * sizeof *ov);
    for (int s = 0; s < n; s++)
        for (int h = 0; h < H; h++)
            axpy(ov + (size_t)h * rkv, S[(size_t)h * L + s],
                 cache + (size_t)(idx ? idx[s] : s) * lat, rkv);
    if (e->ns > 0) merge_sinks(e, w, qa, ov, mB, lB, Ss, oA, scale);
    infer__act_round(e, ov, (size_t)H * rkv);
    for (int h = 0; h < H; h++) {
        absorbed_uv(e, w, h, b->o + (size_t)r * H * e->dv + (size_t)h * e->dv,
                    ov + (size_t)h * rkv);
    }
}

/* A DSA row of the sparse stage in the absorbed form: scores, softmax and weighted sum over
** its selected tokens only (cache = the slot's rows from position 0; idx scratch for the
** list). The masked form's dropped terms were exact zeros (exp → 0, then +0 and 0·x), so
** the result has its bits. */
static void sparse_absorbed(const prl_infer *e, const layer_w *w, int r, const float *qa,
                            const float *cache, float *S, float *ov, float *Ss, float *oA,
                            float *mB, float *lB, int32_t *idx)
{
    const rows_buf *b = &e->rb;
    int H = e->H, L = e->opt.max_len, lat = e->lat;
    int n = sel_list(idx, b->dsel + (size_t)r * L, b->pos[r] + 1);
    for (int j = 0; j < n; j++) /* one key per tile: each score is the 4-key tile's bits */
        for (int h0 = 0; h0 < H; h0 += 2)
            infer__gemv_tile(qa + (size_t)h0 * lat, lat, H - h0 < 2 ? H - h0 : 2,
                             cache + (size_t)idx[j] * lat, lat, 1, lat, S + (size_t)h0 * L + j, L);
    absorbed_finish(e, w, r, qa, cache, S, idx, n, ov, Ss, oA, mB, lB);
}

/* Absorbed form for one row, all heads together: each query absorbs W_UK, the scores and the
** weighted sums run on the shared latent rows [c_kv; k_r] (every cache row is read once for
** all heads; a ring layer's window is first gathered in position order), the sinks are
** merged in, and W_UV maps each head's result back to d_v. */
static void absorbed_task(void *p, int r)
{
    att_ctx *c = p;
    prl_infer *e = c->e;
    rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[c->l];
    int H = e->H, L = e->opt.max_len, lat = e->lat, rkv = e->rkv, pos = b->pos[r];
    int lo = w->window > 0 && pos - w->window + 1 > 0 ? pos - w->window + 1 : 0, n = pos + 1 - lo;
    float *S = e->att_scratch + e->att_scratch_per_thread * (size_t)prl_pool_worker();
    float *qa = S + (size_t)H * L, *ov = qa + (size_t)H * lat, *Ss = ov + (size_t)H * rkv;
    float *oA = Ss + (size_t)H * e->ns, *mB = oA + (size_t)H * rkv, *lB = mB + H, *g = lB + H;
    const float *q = b->q + (size_t)r * H * e->dq;
    for (int h = 0; h < H; h++) {
        absorbed_uk(e, w, h, qa + (size_t)h * lat, q + (size_t)h * e->dq);
        memcpy(qa + (size_t)h * lat + rkv, q + (size_t)h * e->dq + e->dn,
               (size_t)e->dr * sizeof *qa);
    }
    infer__act_round(e, qa, (size_t)H * lat);
    const float *cache = lat_row(e, c->l, b->slot[r], lo);
    if (w->dsa_sparse) { /* only the selected tokens (lo = 0: DSA layers never slide) */
        sparse_absorbed(e, w, r, qa, cache, S, ov, Ss, oA, mB, lB, (int32_t *)g);
        return;
    }
    if (is_ring(e, c->l)) {
        for (int s = 0; s < n; s++)
            memcpy(g + (size_t)s * lat, key_row(e, c->l, b->slot[r], lo + s, 0),
                   (size_t)lat * sizeof *g);
        cache = g;
    }
    /* S[h][s] = qa_h · cache_s in 2-head × 4-key tiles */
    for (int s0 = 0; s0 < n; s0 += 4)
        for (int h0 = 0; h0 < H; h0 += 2)
            infer__gemv_tile(qa + (size_t)h0 * lat, lat, H - h0 < 2 ? H - h0 : 2,
                             cache + (size_t)s0 * lat, lat, n - s0 < 4 ? n - s0 : 4, lat,
                             S + (size_t)h0 * L + s0, L);
    absorbed_finish(e, w, r, qa, cache, S, NULL, n, ov, Ss, oA, mB, lB);
}

/* The absorbed query of head h of row r (scratch layout of absorbed_task). */
static void absorbed_query(const prl_infer *e, const layer_w *w, int r, int h, float *qa)
{
    int lat = e->lat, rkv = e->rkv;
    float *qh = qa + (size_t)h * lat;
    const float *q = e->rb.q + (size_t)r * e->H * e->dq + (size_t)h * e->dq;
    absorbed_uk(e, w, h, qh, q);
    memcpy(qh + rkv, q + e->dn, (size_t)e->dr * sizeof *qh);
    infer__act_round(e, qh, (size_t)lat);
}

/* Heads [h0, h1) of row r in the absorbed form over n cache rows from `cache`, with the
** thread's scratch S. Every step of the reference absorbed_task is per head (the absorbed
** query, its scores, softmax, weighted sum, sinks, W_UV), so heads apart give the same
** bits; the fast kernels (infer_absorbed.c) keep them too. */
static void absorbed_heads(const prl_infer *e, const layer_w *w, int r, int h0, int h1,
                           const float *cache, int n, float *S)
{
    int H = e->H, L = e->opt.max_len, lat = e->lat, rkv = e->rkv;
    float *qa = S + (size_t)H * L, *ov = qa + (size_t)H * lat, *Ss = ov + (size_t)H * rkv;
    float *oA = Ss + (size_t)H * e->ns, *mB = oA + (size_t)H * rkv, *lB = mB + H;
    float scale = (float)e->attn_scale;
    for (int h = h0; h < h1; h++) absorbed_query(e, w, r, h, qa);
    infer__absorbed_scores(S + (size_t)h0 * L, L, qa + (size_t)h0 * lat, h1 - h0, cache, lat, n);
    for (int h = h0; h < h1; h++) {
        float *Sh = S + (size_t)h * L, *oh = ov + (size_t)h * rkv;
        infer__absorbed_softmax(Sh, n, scale, &mB[h], &lB[h]);
        infer__absorbed_wsum(oh, Sh, cache, lat, rkv, n);
        if (e->ns > 0) merge_sinks_head(e, w, qa, ov, mB, lB, Ss, oA, scale, h);
        infer__act_round(e, oh, (size_t)rkv);
        absorbed_uv(e, w, h, e->rb.o + (size_t)r * H * e->dv + (size_t)h * e->dv, oh);
    }
}

/* The absorbed form split into head groups: task t is group t mod G of row t / G (G =
** c->groups). A group's heads read the row's cache one after another, so after the first
** it comes from this core's L2; several groups a row put a decode row's heads on every
** thread (batch 1 has one row). Heads are independent, so G never changes a bit. */
static void absorbed_group_task(void *p, int t)
{
    att_ctx *c = p;
    prl_infer *e = c->e;
    const rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[c->l];
    int H = e->H, L = e->opt.max_len, lat = e->lat, G = c->groups, r = t / G, gi = t % G;
    int pos = b->pos[r];
    int lo = w->window > 0 && pos - w->window + 1 > 0 ? pos - w->window + 1 : 0, n = pos + 1 - lo;
    float *S = e->att_scratch + e->att_scratch_per_thread * (size_t)prl_pool_worker();
    float *g = S + (size_t)H * (L + lat + 2 * e->rkv + e->ns + 2); /* past absorbed_head's */
    const float *cache = lat_row(e, c->l, b->slot[r], lo);
    if (is_ring(e, c->l)) { /* the window in position order */
        for (int s = 0; s < n; s++)
            memcpy(g + (size_t)s * lat, key_row(e, c->l, b->slot[r], lo + s, 0),
                   (size_t)lat * sizeof *g);
        cache = g;
    }
    absorbed_heads(e, w, r, gi * H / G, (gi + 1) * H / G, cache, n, S);
}

/* Rows of one sequence at consecutive positions form a run, cut into query blocks. */
static int build_runs(const rows_buf *b, int R, int *start, int *rows)
{
    int n = 0;
    for (int r = 0; r < R;) {
        int r1 = r + 1;
        while (r1 < R && r1 - r < PRL_ATT_BLOCK && b->slot[r1] == b->slot[r] &&
               b->pos[r1] == b->pos[r1 - 1] + 1)
            r1++;
        start[n] = r, rows[n] = r1 - r, n++;
        r = r1;
    }
    return n;
}

/* ModAttn conv `which` of layer l over this call's R rows: y = z + conv(z) (input row r at
** z + r·ldz), by the train path's prl_conv_row. Inputs before a slot's first row in the call
** come from its state, none before position 0. The state is a history of conv_hist inputs
** per slot indexed by position (row q mod conv_hist): k − 1 rows, plus the speculative
** spare rows, so a rollback to an earlier length finds its k − 1 inputs (docs/infer.md). */
static void conv_rows(prl_infer *e, int l, int which, float *y, const float *z, int ldz, int R)
{
    rows_buf *b = &e->rb;
    int k = e->ck, C = infer__conv_channels(e, which), hist = e->conv_hist;
    float *state = e->lw[l].conv_state[which];
    const float *x[16];
    /* the input at position q of the slot's sequence, NULL before position 0 */
#define CONV_IN(s, q)                                                                              \
    ((q) < 0                  ? NULL                                                               \
     : (q) >= b->first_pos[s] ? z + (size_t)(b->first_row[s] + (q)-b->first_pos[s]) * ldz          \
                              : state + ((size_t)(s)*hist + (size_t)(q) % hist) * C)
    for (int r = 0; r < R; r++) {
        int s = b->slot[r];
        for (int j = 0; j < k; j++) x[j] = CONV_IN(s, b->pos[r] - (k - 1) + j);
        prl_conv_row(y + (size_t)r * C, x, e->lw[l].conv_w[which], C, k);
    }
    infer__act_round(e, y, (size_t)R * C);
    for (int r = 0; r < R; r++) /* the call's inputs join the history after every read, in
                                   ** position order: a slot keeps its last hist inputs */
        memcpy(state + ((size_t)b->slot[r] * hist + (size_t)b->pos[r] % hist) * C,
               z + (size_t)r * ldz, (size_t)C * sizeof(float));
#undef CONV_IN
}

/* This call's keys of layer l into the cache (a ring keeps the last W positions). */
static void write_cache(prl_infer *e, int l, int R)
{
    rows_buf *b = &e->rb;
    for (int r = 0; r < R; r++) {
        memcpy(lat_row(e, l, b->slot[r], b->pos[r]), b->lat + (size_t)r * e->lat,
               (size_t)e->lat * sizeof(float));
        if (e->opt.mla == PRL_MLA_NAIVE)
            memcpy(kv_row(e, l, b->slot[r], b->pos[r]), b->kvx + (size_t)r * e->H * e->dkv,
                   (size_t)e->H * e->dkv * sizeof(float));
    }
}

/* The DSA indexer of layer l for this call's rows (ln and cq ready): each row's indexer key
** into the cache, then, in the sparse stage, each row's top-k over the cached keys of its
** sequence (positions 0..pos, this call's rows included) into rb.dsel — with the train
** path's ops (dsa.c), so the aligned preset selects the same tokens bit for bit. */
static void indexer_rows(prl_infer *e, int l, int R)
{
    rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[l];
    int HI = e->HI, dI = e->dI, L = e->opt.max_len;
    infer__linear(e, b->iq, b->cq, R, &w->ix_wq_b);
    prl_rope_at(b->iq, e->rope_cos, e->rope_sin, b->pos, R, HI, dI, 0, HI * dI, e->dr, 0);
    infer__act_round(e, b->iq, (size_t)R * HI * dI);
    infer__linear(e, b->ikz, b->ln, R, &w->ix_wk);
    prl_rmsnorm_forward(b->ik, b->rstd, b->ikz, w->ix_k_norm, R, dI, dI, dI, PRL_LATENT_NORM_EPS);
    prl_rope_at(b->ik, e->rope_cos, e->rope_sin, b->pos, R, 1, dI, 0, dI, e->dr, 0);
    infer__act_round(e, b->ik, (size_t)R * dI);
    infer__linear(e, b->iw, b->ln, R, &w->ix_wproj);
    float hs = (float)(1.0 / sqrt((double)HI));
    for (size_t i = 0; i < (size_t)R * HI; i++) b->iw[i] *= hs;
    infer__act_round(e, b->iw, (size_t)R * HI);
    for (int r = 0; r < R; r++)
        memcpy(e->cache_idx + w->idx_off + ((size_t)b->slot[r] * L + b->pos[r]) * dI,
               b->ik + (size_t)r * dI, (size_t)dI * sizeof(float));
    if (!w->dsa_sparse) return;
    for (int r = 0; r < R; r++) {
        int n = b->pos[r] + 1;
        prl_dsa_score_row(b->iscore, b->iq + (size_t)r * HI * dI, b->iw + (size_t)r * HI,
                          e->cache_idx + w->idx_off + (size_t)b->slot[r] * L * dI, dI, n, HI, dI);
        infer__act_round(e, b->iscore,
                         (size_t)n); /* the scores are a stored op output: the top-k reads them */
        prl_dsa_select_row(b->dsel + (size_t)r * L, b->iscore, n, e->m->cfg.index_topk);
    }
}

/* ln (R, d) → tmp (R, d): MLA with the cache. A whole-context layer writes the new keys into
** the cache first, so a prefill row sees the earlier rows of its own call there; a ring layer
** reads them from the call's rows and writes them after attending. */
static void attention(prl_infer *e, int l, int R)
{
    rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[l];
    int H = e->H;
    const float *ckv_in = b->kva, *o_out = b->o;
    int ckv_stride = e->lat, ck = e->ck && l < e->L; /* MTP layers have no convs */
    /* the query's first linear (its latent, or the heads) and the KV latent, both of ln:
    ** one parallel region */
    infer_lin_job first[2] = {{e->rq > 0 ? b->zq : b->q, b->ln, R, e->rq > 0 ? &w->wq_a : &w->wq_b},
                              {b->kva, b->ln, R, &w->wkv_a}};
    infer__linear_many(e, first, 2);
    if (e->rq > 0) { /* the query latent */
        const float *zq = b->zq;
        if (ck) { /* ModAttn: before the query and latent norms, after the heads */
            conv_rows(e, l, CONV_Q, b->zqc, b->zq, e->rq, R);
            zq = b->zqc;
        }
        prl_rmsnorm_forward(b->cq, b->rstd, zq, w->q_norm, R, e->rq, e->rq, e->rq,
                            PRL_LATENT_NORM_EPS);
        infer__act_round(e, b->cq, (size_t)R * e->rq);
        infer__linear(e, b->q, b->cq, R, &w->wq_b);
    }
    prl_rope_at(b->q, e->rope_cos, e->rope_sin, b->pos, R, H, e->dq, e->dn, H * e->dq, e->dr,
                e->m->cfg.rope_interleave);
    infer__act_round(e, b->q, (size_t)R * H * e->dq);
    infer__fault(e, l, "attn.q", b->q, (size_t)R * H * e->dq);
    if (ck) {
        conv_rows(e, l, CONV_KV, b->kvc, b->kva, e->lat, R);
        ckv_in = b->kvc, ckv_stride = e->rkv;
    }
    prl_rmsnorm_forward(b->ckv, b->rstd, ckv_in, w->kv_norm, R, e->rkv, ckv_stride, e->rkv,
                        PRL_LATENT_NORM_EPS);
    infer__act_round(e, b->ckv, (size_t)R * e->rkv);
    infer__fault(e, l, "attn.kv_latent", b->ckv, (size_t)R * e->rkv);
    for (int r = 0; r < R; r++)
        memcpy(b->kr + (size_t)r * e->dr, b->kva + (size_t)r * e->lat + e->rkv,
               (size_t)e->dr * sizeof(float));
    prl_rope_at(b->kr, e->rope_cos, e->rope_sin, b->pos, R, 1, e->dr, 0, e->dr, e->dr,
                e->m->cfg.rope_interleave);
    infer__act_round(e, b->kr, (size_t)R * e->dr);
    for (int r = 0; r < R; r++) {
        float *row = b->lat + (size_t)r * e->lat;
        memcpy(row, b->ckv + (size_t)r * e->rkv, (size_t)e->rkv * sizeof(float));
        memcpy(row + e->rkv, b->kr + (size_t)r * e->dr, (size_t)e->dr * sizeof(float));
    }
    if (e->opt.mla == PRL_MLA_NAIVE) infer__linear(e, b->kvx, b->ckv, R, &w->wkv_b);
    if (w->dsa) indexer_rows(e, l, R);
    int ring = is_ring(e, l);
    if (!ring) write_cache(e, l, R);
    att_ctx c = {.e = e, .l = l, .R = R};
    int keys = w->window > 0 && w->window < b->pos[R - 1] + 1 ? w->window : b->pos[R - 1] + 1;
    if (e->opt.mla == PRL_MLA_NAIVE) {
        int *runs = malloc(2 * (size_t)R * sizeof *runs);
        PRL_ASSERT(runs != NULL);
        c.run_start = runs, c.run_rows = runs + R;
        c.n_runs = build_runs(b, R, c.run_start, c.run_rows);
        infer__run_tasks(c.n_runs * H, naive_task, &c,
                         (double)R * H * (keys + e->ns) * (e->dq + e->dv));
        free(runs);
    } else {
        double macs = (double)R * H * (keys + e->ns) * (2 * e->lat);
        if (w->dsa_sparse || e->absorbed_ref) /* a DSA row's selected keys: per row */
            infer__run_tasks(R, absorbed_task, &c, macs);
        else { /* rows a task, or a row's heads over the threads when rows are fewer */
            int th = prl_pool_threads() > 0 ? prl_pool_threads() : 1;
            c.groups = R >= th ? 1 : (th + R - 1) / R < H ? (th + R - 1) / R : H;
            infer__run_tasks(R * c.groups, absorbed_group_task, &c, macs);
        }
    }
    if (ring) write_cache(e, l, R);
    infer__act_round(e, b->o, (size_t)R * H * e->dv);
    if (ck) {
        conv_rows(e, l, CONV_O, b->oc, b->o, H * e->dv, R);
        o_out = b->oc;
    }
    infer__linear(e, b->tmp, o_out, R, &w->wo);
    infer__fault(e, l, "attn.out", b->tmp, (size_t)R * e->d);
    infer__emit(e, l, "attn.q", b->q, R, H * e->dq);
    infer__emit(e, l, "attn.kv_latent", b->ckv, R, e->rkv);
    infer__emit(e, l, "attn.out", b->tmp, R, e->d);
}

/* ------------------------------------------------------------------ FFN / MoE ------- */

/* out (R, d) = SwiGLU of in with stacked gate/up `w13` and down `w2`. */
static void swiglu(prl_infer *e, float *out, const float *in, int R, const lin *w13, const lin *w2)
{
    rows_buf *b = &e->rb;
    int F = w13->out / 2;
    infer__linear(e, b->a13, in, R, w13);
    prl_silu_mul_forward(b->h, b->a13, R, F);
    infer__act_round(e, b->h, (size_t)R * F);
    infer__linear(e, out, b->h, R, w2);
}

/* The shared expert on ln into tmp (zeros without one) and each routed expert x on its rows
** xg[off[x], off[x + 1]) into yg: every up-projection in one parallel region, every
** down-projection in another (two pool hand-offs, not two per expert), each linear and
** SwiGLU the same ops as one expert at a time. */
static void experts_ffn(prl_infer *e, const layer_w *w, int R)
{
    rows_buf *b = &e->rb;
    int E = e->E, d = e->d, F = w->w13.out / 2, nj = 0;
    const int32_t *off = b->offsets;
    infer_lin_job *up = e->lin_jobs, *down = e->lin_jobs + E + 1;
    if (e->sde > 0) {
        up[nj] = (infer_lin_job){b->a13, b->ln, R, &w->w13};
        down[nj++] = (infer_lin_job){b->tmp, b->h, R, &w->w2};
    } else {
        memset(b->tmp, 0, (size_t)R * d * sizeof(float));
    }
    for (int x = 0; x < E; x++) {
        int n = off[x + 1] - off[x];
        if (!n) continue;
        float *a13 = b->ea13 + (size_t)off[x] * 2 * e->de, *h = b->eh + (size_t)off[x] * e->de;
        up[nj] = (infer_lin_job){a13, b->xg + (size_t)off[x] * d, n, &w->e13[x]};
        down[nj++] = (infer_lin_job){b->yg + (size_t)off[x] * d, h, n, &w->e2[x]};
    }
    infer__linear_many(e, up, nj);
    if (e->sde > 0) {
        prl_silu_mul_forward(b->h, b->a13, R, F);
        infer__act_round(e, b->h, (size_t)R * F);
    }
    int routed = off[E]; /* the experts' rows are contiguous, in expert order */
    prl_silu_mul_forward(b->eh, b->ea13, routed, e->de);
    infer__act_round(e, b->eh, (size_t)routed * e->de);
    infer__linear_many(e, down, nj);
}

/* ln (R, d) → tmp (R, d) = shared(ln) + Σ_k g_k·expert_k(ln), routes recorded per row. */
static void moe(prl_infer *e, int l, int R)
{
    rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[l];
    int E = e->E, K = e->K, d = e->d;
    infer__linear(e, b->z, b->ln, R, &w->router);
    infer__fault(e, l, "moe.router_logits", b->z, (size_t)R * E);
    const prl_real *bias = e->m->router_bias + (size_t)w->moe * E;
    for (int r = 0; r < R; r++) {
        prl_moe_gate_forward_grouped(b->sel + (size_t)r * K, b->g + (size_t)r * K,
                                     b->s + (size_t)r * E, b->z + (size_t)r * E, bias, NULL, E, K,
                                     e->m->cfg.n_group, e->m->cfg.topk_group,
                                     e->m->cfg.norm_topk_prob, e->m->cfg.routed_scaling_factor);
        if (w->moe >= e->n_moe) continue; /* an MTP layer: its routes are not recorded */
        int32_t *dst = e->slots[b->slot[r]].routes + ((size_t)b->pos[r] * e->n_moe + w->moe) * K;
        memcpy(dst, b->sel + (size_t)r * K, (size_t)K * sizeof *dst);
    }
    /* group (row, slot) pairs by expert, rows in order */
    int32_t *off = b->offsets;
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int i = 0; i < R * K; i++) off[b->sel[i] + 1]++;
    for (int x = 0; x < E; x++) off[x + 1] += off[x];
    for (int x = 0, cursor; x < E; x++) {
        cursor = off[x];
        for (int i = 0; i < R * K; i++)
            if (b->sel[i] == x) b->gpos[i] = cursor, b->token_of[cursor++] = i / K;
    }
    for (int q = 0; q < R * K; q++)
        memcpy(b->xg + (size_t)q * d, b->ln + (size_t)b->token_of[q] * d,
               (size_t)d * sizeof(float));
    experts_ffn(e, w, R);
    for (int r = 0; r < R; r++) { /* slots in order, as the train path adds them */
        float *out = b->tmp + (size_t)r * d;
        for (int k = 0; k < K; k++) {
            float g = b->g[r * K + k];
            const float *y = b->yg + (size_t)b->gpos[r * K + k] * d;
            for (int i = 0; i < d; i++) out[i] += g * y[i];
        }
    }
    infer__act_round(e, b->tmp, (size_t)R * d);
    infer__fault(e, l, "moe.out", b->tmp, (size_t)R * d);
    infer__emit(e, l, "moe.router_logits", b->z, R, E);
    infer__emit(e, l, "moe.out", b->tmp, R, d);
}

/* ------------------------------------------------------------------ forward --------- */

static void residual_add(const prl_infer *e, float *x, const float *y, int R)
{
    size_t n = (size_t)R * e->d;
    for (size_t i = 0; i < n; i++) x[i] = x[i] + y[i];
    infer__act_round(e, x, n);
}

/* ------------------------------------------------------------------ residual glue --- */

/* The train path's residual glue (model_residual.c, model__site_enter / model__site_leave) on
** R rows, with the same ops: mHC sites on the streams rb.xs, sandwich norms, block post-norms;
** rb.x is the sublayer input (with mHC) or the plain residual. */

static prl_mhc_shape rows_shape(const prl_infer *e, int R, int full)
{
    return (prl_mhc_shape){.N = R,
                           .n = e->n_streams,
                           .d = e->d,
                           .it = e->m->cfg.mhc_recur_norm,
                           .full = full};
}

/* A site's coefficients from the streams (φ through the infer path's linear). */
static void hc_coefficients(prl_infer *e, int R, const lin *phi, const float *gamma,
                            const float *alpha, const float *beta, int full)
{
    rows_buf *b = &e->rb;
    prl_mhc_shape sh = rows_shape(e, R, full);
    int nd = e->n_streams * e->d;
    prl_rmsnorm_forward(b->hn, b->hrstd, b->xs, gamma, R, nd, nd, nd, e->m->cfg.rms_norm_eps);
    infer__act_round(e, b->hn, (size_t)R * nd);
    infer__linear(e, b->hm, b->hn, R, phi);
    prl_mhc_coef_forward(b->pre, b->post, b->hS, b->hm, alpha, beta, sh);
    prl_mhc_pre_forward(b->x, b->xs, b->pre, sh);
    infer__act_round(e, b->x, (size_t)R * e->d);
}

static void hc_enter(prl_infer *e, int l, int site, int R)
{
    const layer_w *w = &e->lw[l];
    if (e->m->cfg.use_mhc && l < e->L) /* MTP layers keep the plain residual */
        hc_coefficients(e, R, &w->hc_phi[site], w->hc_gamma[site], w->hc_alpha[site],
                        w->hc_beta[site], 1);
}

/* tmp (the sublayer's output) back into the residual. */
static void hc_leave(prl_infer *e, int l, int site, int R)
{
    rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[l];
    const prl_config *c = &e->m->cfg;
    int d = e->d, S = e->n_streams * d;
    if (c->sandwich_norm) { /* in place: each row's sum is taken before it is overwritten */
        prl_rmsnorm_forward(b->tmp, b->rstd, b->tmp, site ? w->ln_pm : w->ln_pa, R, d, d, d,
                            c->rms_norm_eps);
        infer__act_round(e, b->tmp, (size_t)R * d);
    }
    int mhc = c->use_mhc && l < e->L;
    float *stream = mhc ? b->xs : b->x;
    if (mhc) {
        prl_mhc_shape sh = rows_shape(e, R, 1);
        int ns = prl_mhc_states(sh), n2 = sh.n * sh.n;
        prl_mhc_post_forward(b->xs2, b->tmp, b->xs, b->post, b->hS + (size_t)(ns - 1) * n2, ns * n2,
                             sh);
        float *t = b->xs;
        b->xs = b->xs2, b->xs2 = t;
        stream = b->xs;
        infer__act_round(e, stream, (size_t)R * S);
    } else {
        residual_add(e, b->x, b->tmp, R);
    }
    if (site == 1 && w->ln_bp) {
        prl_rmsnorm_forward(stream, b->rstd, stream, w->ln_bp, R, S, S, S, c->rms_norm_eps);
        infer__act_round(e, stream, (size_t)R * S);
    }
}

/* Rows rb.tok/slot/pos[0, R) through the model; leaves rb.logits [R, V]. */
/* Each slot's first row in the call and its position (a slot's rows are consecutive). */
void infer__rows_begin(prl_infer *e, int R)
{
    rows_buf *b = &e->rb;
    for (int r = R - 1; r >= 0; r--)
        b->first_row[b->slot[r]] = r, b->first_pos[b->slot[r]] = b->pos[r];
}

/* Decoder layer l on R rows: rb.x (or the streams rb.xs) in, out. */
void infer__layer_rows(prl_infer *e, int l, int R)
{
    rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[l];
    int d = e->d;
    hc_enter(e, l, 0, R);
    prl_rmsnorm_forward(b->ln, b->rstd, b->x, w->ln1, R, d, d, d, e->m->cfg.rms_norm_eps);
    infer__act_round(e, b->ln, (size_t)R * d);
    attention(e, l, R);
    hc_leave(e, l, 0, R);
    hc_enter(e, l, 1, R);
    prl_rmsnorm_forward(b->ln, b->rstd, b->x, w->ln2, R, d, d, d, e->m->cfg.rms_norm_eps);
    infer__act_round(e, b->ln, (size_t)R * d);
    if (w->moe >= 0) {
        moe(e, l, R);
    } else {
        swiglu(e, b->tmp, b->ln, R, &w->w13, &w->w2);
        infer__fault(e, l, "mlp.out", b->tmp, (size_t)R * d);
        infer__emit(e, l, "mlp.out", b->tmp, R, d);
    }
    hc_leave(e, l, 1, R);
}

/* The trunk on R rows (tokens rb.tok at rb.pos of slots rb.slot): logits into rb.logits; rb.x
** keeps h⁰, the merged hidden state before the final norm (the MTP modules' input). */
void infer__forward_rows(prl_infer *e, int R)
{
    rows_buf *b = &e->rb;
    int d = e->d;
    infer__rows_begin(e, R);
    for (int r = 0; r < R; r++)
        memcpy(b->x + (size_t)r * d, e->embed + (size_t)b->tok[r] * d, (size_t)d * sizeof(float));
    for (int r = 0; r < R && e->m->cfg.use_mhc; r++) /* every stream starts as the embedding */
        for (int i = 0; i < e->n_streams; i++)
            memcpy(b->xs + ((size_t)r * e->n_streams + i) * d, b->x + (size_t)r * d,
                   (size_t)d * sizeof(float));
    for (int l = 0; l < e->L; l++) infer__layer_rows(e, l, R);
    if (e->m->cfg.use_mhc) /* the merge head */
        hc_coefficients(e, R, &e->merge_phi, e->merge_gamma, e->merge_alpha, e->merge_beta, 0);
    prl_rmsnorm_forward(b->ln, b->rstd, b->x, e->norm, R, d, d, d, e->m->cfg.rms_norm_eps);
    infer__act_round(e, b->ln, (size_t)R * d);
    infer__linear(e, b->logits, b->ln, R, &e->head);
    infer__fault(e, -1, "final.logits", b->logits, (size_t)R * e->V);
    infer__emit(e, -1, "final.logits", b->logits, R, e->V);
}

/* ------------------------------------------------------------------ shared prefill -- */

/* n floats of each of slot src's and dst's regions of a per-slot array (stride floats a slot) */
static void copy_region(float *base, size_t stride, int dst, int src, size_t n)
{
    memcpy(base + (size_t)dst * stride, base + (size_t)src * stride, n * sizeof(float));
}

void infer__slot_copy(prl_infer *e, int dst, int src, int P)
{
    if (dst == src) return;
    for (int l = 0; l < e->L + e->Lm; l++) {
        const layer_w *w = &e->lw[l];
        /* positions < cap sit at rows [0, P); a ring past its size holds all cap rows */
        size_t rows = (size_t)(P < w->cap ? P : w->cap);
        copy_region(e->cache_lat + w->lat_off, (size_t)w->cap * e->lat, dst, src, rows * e->lat);
        if (e->opt.mla == PRL_MLA_NAIVE) {
            size_t row = (size_t)e->H * e->dkv;
            copy_region(e->cache_kv + w->kv_off, (size_t)w->cap * row, dst, src, rows * row);
        }
        if (w->dsa)
            copy_region(e->cache_idx + w->idx_off, w->slot_idx_floats, dst, src, (size_t)P * e->dI);
        for (int i = 0; e->ck && i < 3 && w->conv_state[i]; i++) {
            size_t n = (size_t)e->conv_hist * infer__conv_channels(e, i);
            copy_region(w->conv_state[i], n, dst, src, n);
        }
    }
    size_t n_ids = (size_t)P * e->n_moe * e->K;
    memcpy(e->slots[dst].routes, e->slots[src].routes, n_ids * sizeof(int32_t));
}
