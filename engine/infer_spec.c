/*
** infer_spec.c — self-speculative decoding on the infer path: per step the MTP modules draft
** tokens, one trunk pass verifies them for every slot together, the acceptance rules of
** spec_decode.c decide, and every per-sequence cache rolls back to the accepted length. The
** maths is docs/infer.md "Speculative decoding".
*/
#include "engine/infer_int.h"
#include "engine/spec_decode.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ self-speculative decoding */

/* docs/infer.md "Speculative decoding". Per step and active slot: D' ≤ spec_drafts drafts
** from the MTP modules (module k at the slot's last position, its input h^{k−1} and the
** token k places ahead, the k-th draft d_k ~ q_k), one trunk pass over [last, d_1..d_D'] for
** every slot together (the verify), the acceptance rule of spec_decode.c, then a rollback of
** every per-sequence cache to the accepted length.
**
** Rollback. Every per-sequence cache is indexed by absolute position and keeps
** spec_spare_rows() rows beyond what its window reads: the KV latent + rope-key caches
** (whole context, or a ring of W + D rows for a sliding-window layer), the three ModAttn conv
** histories (k − 1 + D inputs), the MTP layers' own KV caches. A verify pass of D + 1 rows
** therefore never overwrites a row the accepted prefix still needs, and rolling a sequence
** back is setting its length (slot_rollback): rows past it are dead and are rewritten when
** those positions are fed again. A new per-sequence cache joins by being position-indexed
** the same way; for the DSA indexer key cache (whole context) that is all it needs. */

/* Hidden state h^k (k = 0: the trunk's h⁰) of position i in slot s. */
static float *slot_hidden(const prl_infer *e, const slot_state *st, int k, int i)
{
    return st->hid + ((size_t)k * e->opt.max_len + (size_t)i) * e->d;
}

/* Roll slot s back to `len` fed positions: every cache is position-indexed with spare rows
** (above), so the trunk caches (KV latent + rope key, SWA rings, ModAttn conv histories —
** and a DSA indexer key cache) need only the length; the MTP layers' final rows are capped. */
static void slot_rollback(prl_infer *e, int s, int len)
{
    slot_state *st = &e->slots[s];
    st->len = len;
    for (int k = 0; k < e->Lm; k++) st->mtp_len[k] = st->mtp_len[k] < len ? st->mtp_len[k] : len;
}

/* Keep the prompt's tokens and trunk states (rb.x after infer__forward_rows) for the MTP modules. */
void infer__spec_admit(prl_infer *e, int slot, const int32_t *prompt, int P)
{
    slot_state *st = &e->slots[slot];
    if (e->Lm == 0) return;
    memcpy(st->toks, prompt, (size_t)P * sizeof *st->toks);
    memcpy(slot_hidden(e, st, 0, 0), e->rb.x, (size_t)P * e->d * sizeof(float));
    memset(st->mtp_len, 0, (size_t)e->Lm * sizeof *st->mtp_len);
}

static void mtp_rows(prl_infer *e, int k, int R, const int *head_rows, int n_head);

/* The MTP modules' part of the prefill: module k = 1..D on the prompt positions whose token k
** ahead is in the prompt (i < P − k), without the head, so their cache rows and h^k are
** final before the first step — which then runs k rows per module, as every later step
** does. Prefill work, so it runs with the trunk's prefill (and is timed with it), even when
** the first token already ended the sequence. Nothing for teacher forcing (no drafts). */
void infer__spec_prefill(gen_state *g, int slot)
{
    prl_infer *e = g->e;
    rows_buf *b = &e->rb;
    slot_state *st = &e->slots[slot];
    const prl_gen_request *q = &g->reqs[st->req];
    int P = q->prompt_len;
    if (e->Lm == 0 || q->forced) return;
    for (int k = 1; k <= e->opt.spec_drafts && P - k > 0; k++) {
        int R = P - k; /* <= P rows: the prefill's own row count fits the buffer */
        for (int i = 0; i < R; i++) {
            b->tok[i] = st->toks[i + k], b->slot[i] = slot, b->pos[i] = i, b->req[i] = st->req;
            memcpy(b->x + (size_t)i * e->d, slot_hidden(e, st, k - 1, i),
                   (size_t)e->d * sizeof(float));
        }
        mtp_rows(e, k, R, NULL, 0);
        for (int i = 0; i < R; i++)
            memcpy(slot_hidden(e, st, k, i), b->x + (size_t)i * e->d, (size_t)e->d * sizeof(float));
        st->mtp_len[k - 1] = R;
    }
}

/* MTP module k (1-based) on R rows: rb.tok holds t_{i+k}, rb.x holds h^{k−1}; afterwards rb.x
** holds h^k and rb.logits rows 0..n_head−1 (stride V) the module's logits (shared head) of
** rows head_rows[]: only the row a draft is drawn from needs them — the other rows only fill
** the module's KV cache and h^k, and the head is the module's largest matrix (V × d). With
** spec_draft_vocab = S the head covers ids [0, S) and the rest of each row is −∞, so the
** draft and its distribution q (what the acceptance rule needs) never leave the shortlist. */
static void mtp_rows(prl_infer *e, int k, int R, const int *head_rows, int n_head)
{
    rows_buf *b = &e->rb;
    int l = e->L + k - 1, d = e->d;
    const layer_w *w = &e->lw[l];
    double eps = e->m->cfg.rms_norm_eps;
    infer__rows_begin(e, R);
    for (int r = 0; r < R; r++)
        memcpy(b->mtp_e + (size_t)r * d, e->embed + (size_t)b->tok[r] * d,
               (size_t)d * sizeof(float));
    /* prl_mtp_input_forward's ops and rounding points, with eh_proj through the infer path's
    ** pre-packed linear (the train path's matmul packs the 2d × d weight on every call) */
    prl_rmsnorm_forward(b->mtp_cat, b->mtp_rstd, b->mtp_e, w->enorm, R, d, d, 2 * d, eps);
    prl_rmsnorm_forward(b->mtp_cat + d, b->mtp_rstd + R, b->x, w->hnorm, R, d, d, 2 * d, eps);
    infer__act_round(e, b->mtp_cat, (size_t)R * 2 * d);
    infer__linear(e, b->x, b->mtp_cat, R, &w->eh_proj);
    infer__layer_rows(e, l, R);
    /* A hook sees the head on every row, as the train path's `mtp.logits` has it (with the
    ** rows' request and position from prl_infer_hook_rows); decoding needs only head_rows. */
    int all = e->hook != NULL, n = all ? R : n_head;
    for (int i = 0; i < n; i++) /* the head's rows, gathered (mtp_h is free again) */
        memcpy(b->mtp_h + (size_t)i * d, b->x + (size_t)(all ? i : head_rows[i]) * d,
               (size_t)d * sizeof(float));
    prl_rmsnorm_forward(b->ln, b->rstd, b->mtp_h, w->sh_norm, n, d, d, d, eps);
    infer__act_round(e, b->ln, (size_t)n * d);
    const lin *head = w->draft_head.w ? &w->draft_head : w->sh_head;
    int S = head->out, V = e->V;
    infer__linear(e, b->logits, b->ln, n, head);
    for (int i = n - 1; i >= 0 && S < V; i--) { /* rows of S → rows of V, last first */
        float *row = b->logits + (size_t)i * V;
        memmove(row, b->logits + (size_t)i * S, (size_t)S * sizeof *row);
        for (int j = S; j < V; j++) row[j] = -INFINITY;
    }
    if (all) {
        infer__emit(e, l, "mtp.logits", b->logits, R,
                    V);                  /* the train path's name for the same rows */
        for (int i = 0; i < n_head; i++) /* rows 0..n_head−1 are head_rows' logits again */
            memmove(b->logits + (size_t)i * V, b->logits + (size_t)head_rows[i] * V,
                    (size_t)V * sizeof(float));
    }
}

/* Drafts a step may take for the slot: none for teacher forcing; never past the context or
** the new-token budget (the emitted tokens are the drafts accepted plus one). */
static int spec_budget(const gen_state *g, int s)
{
    const prl_infer *e = g->e;
    const slot_state *st = &e->slots[s];
    const prl_gen_request *q = &g->reqs[st->req];
    int n = e->opt.spec_drafts, room = e->opt.max_len - 1 - st->len;
    int left = g->sp->max_new_tokens - g->res[st->req].n - 1;
    if (q->forced) return 0;
    n = room < n ? room : n;
    return left < n ? (left > 0 ? left : 0) : n;
}

/* The sampler's distribution of a logits row as a probability vector over the vocabulary
** (zeros outside the top-k/top-p set): what sampling draws from, for p and q alike. */
static void probs_row(double *w, const float *logits, const gen_state *g)
{
    int V = g->e->V, n = infer__sample_weights_fast(g->cands, logits, V, g->sp);
    double total = 0;
    for (int i = 0; i < n; i++) total += g->cands[i].w;
    memset(w, 0, (size_t)V * sizeof *w);
    for (int i = 0; i < n; i++) w[g->cands[i].id] = g->cands[i].w / total;
}

/* A draft from the module's logits row: its argmax (greedy) or a draw from q_k (kept for the
** acceptance test), seeded from (seed, sequence, position of the draft, DRAFT). */
static int32_t draw_draft(gen_state *g, int s, int k, const float *logits)
{
    slot_state *st = &g->e->slots[s];
    if (g->sp->temperature == 0)
        return (int32_t)infer__sample_row(logits, g->e->V, g->sp, NULL, g->cands);
    double *q = st->q + (size_t)(k - 1) * g->e->V;
    probs_row(q, logits, g);
    prl_rng rng;
    prl_rng_init(&rng, g->sp->seed, g->reqs[st->req].seq_id, (uint64_t)(st->len + k), 0,
                 PRL_RNG_DRAFT);
    return (int32_t)prl_spec_draw(q, g->e->V, &rng);
}

/* Token at position j of slot s during a step: the sequence up to `last` (position len),
** then this step's drafts. */
static int32_t step_token(const slot_state *st, int j)
{
    return j <= st->len ? st->toks[j] : st->draft[j - st->len - 1];
}

/* Run module k on `rows` (slots n_slots of `slots`, each from its mtp_len[k−1] to len − 1),
** keep h^k, draw the slot's k-th draft from its last row. */
static void draft_flush(gen_state *g, int k, const int *slots, int n_slots, int R)
{
    prl_infer *e = g->e;
    rows_buf *b = &e->rb;
    int last[4096] = {
        0}; /* max_batch <= 4096 (prl_infer_init); zeroed: gcc cannot see n_slots >= 1 */
    for (int i = 0, r = 0; i < n_slots; i++) { /* each slot's rows end at position len − 1 */
        const slot_state *st = &e->slots[slots[i]];
        r += st->len - st->mtp_len[k - 1];
        last[i] = r - 1;
    }
    mtp_rows(e, k, R, last, n_slots);
    for (int r = 0; r < R; r++) {
        slot_state *st = &e->slots[b->slot[r]];
        memcpy(slot_hidden(e, st, k, b->pos[r]), b->x + (size_t)r * e->d,
               (size_t)e->d * sizeof(float));
    }
    for (int i = 0; i < n_slots; i++) {
        slot_state *st = &e->slots[slots[i]];
        st->draft[k - 1] = draw_draft(g, slots[i], k, b->logits + (size_t)i * e->V);
        /* rows with t_{i+k} final (i + k <= len) are final; the rest are redone next step */
        int fin = st->len - k + 1;
        st->mtp_len[k - 1] = fin > st->mtp_len[k - 1] ? fin : st->mtp_len[k - 1];
    }
}

/* The k-th drafts of every slot with nd[s] >= k, in batches that fit the rows buffer. */
static void draft_pass(gen_state *g, int k, const int *nd)
{
    prl_infer *e = g->e;
    rows_buf *b = &e->rb;
    int slots[4096], n_slots = 0, R = 0;
    for (int s = 0; s < e->opt.max_batch; s++) {
        slot_state *st = &e->slots[s];
        if (st->req < 0 || nd[s] < k) continue;
        int m = st->mtp_len[k - 1], rows = st->len - m;
        if (R + rows > b->cap) draft_flush(g, k, slots, n_slots, R), n_slots = 0, R = 0;
        for (int i = m; i < st->len; i++, R++) {
            b->tok[R] = step_token(st, i + k), b->slot[R] = s, b->pos[R] = i, b->req[R] = st->req;
            memcpy(b->x + (size_t)R * e->d, slot_hidden(e, st, k - 1, i),
                   (size_t)e->d * sizeof(float));
        }
        slots[n_slots++] = s;
    }
    if (R > 0) draft_flush(g, k, slots, n_slots, R);
}

/* Accept or reject slot s's drafts against its verify rows [r0, r0 + nd] and record the
** emitted tokens; returns how many; *stopped when the sequence ended. */
static int spec_accept(gen_state *g, int s, int r0, int nd, int *stopped)
{
    prl_infer *e = g->e;
    slot_state *st = &e->slots[s];
    int V = e->V, len0 = st->len, n_emit;
    int32_t out[PRL_MAX_LAYERS + 1], best[PRL_MAX_LAYERS + 1];
    const float *logits = e->rb.logits + (size_t)r0 * V;
    if (g->sp->temperature == 0) {
        for (int j = 0; j <= nd; j++)
            best[j] = (int32_t)infer__sample_row(logits + (size_t)j * V, V, g->sp, NULL, g->cands);
        n_emit = prl_spec_accept_greedy(out, st->draft, best, nd);
    } else {
        prl_rng rng[PRL_MAX_LAYERS + 1];
        uint64_t seq = g->reqs[st->req].seq_id;
        for (int j = 0; j <= nd; j++) {
            probs_row(e->spec_p + (size_t)j * V, logits + (size_t)j * V, g);
            prl_rng_init(&rng[j], g->sp->seed, seq, (uint64_t)(len0 + 1 + j), 0, PRL_RNG_ACCEPT);
        }
        n_emit = prl_spec_accept_sample(out, st->draft, st->q, e->spec_p, V, nd, rng);
    }
    e->spec.drafted += nd, e->spec.accepted += n_emit - 1, e->spec.emitted += n_emit;
    e->spec.steps++;
    *stopped = 0;
    int j = 0;
    while (j < n_emit && !*stopped) { /* token j follows the verify row of position len0 + j */
        st->len = len0 + 1 + j;
        *stopped = infer__record_token(g, s, out[j], logits + (size_t)j * V);
        j++;
    }
    slot_rollback(e, s, st->len); /* the rows past the last emitted token's are dead */
    return j;
}

/* One speculative step for every active slot: drafts, one verify pass, acceptance. */
prl_status infer__spec_step(gen_state *g, int *finished, long *tokens)
{
    prl_infer *e = g->e;
    rows_buf *b = &e->rb;
    int nd[4096], first[4096], R = 0;
    PRL_ASSERT(e->opt.max_batch <= 4096 && e->opt.spec_drafts <= PRL_MAX_LAYERS);
    double t0 = prl_now();
    for (int s = 0; s < e->opt.max_batch; s++) nd[s] = e->slots[s].req >= 0 ? spec_budget(g, s) : 0;
    for (int k = 1; k <= e->opt.spec_drafts; k++) draft_pass(g, k, nd);
    double t1 = prl_now();
    for (int s = 0; s < e->opt.max_batch; s++) {
        slot_state *st = &e->slots[s];
        if (st->req < 0) continue;
        first[s] = R;
        for (int j = 0; j <= nd[s]; j++, R++)
            b->tok[R] = step_token(st, st->len + j), b->slot[R] = s, b->pos[R] = st->len + j,
            b->req[R] = st->req;
    }
    if (R == 0) return PRL_OK;
    infer__forward_rows(e, R);
    for (int r = 0; r < R; r++) /* h⁰ of every fed row (dead ones are overwritten later) */
        memcpy(slot_hidden(e, &e->slots[b->slot[r]], 0, b->pos[r]), b->x + (size_t)r * e->d,
               (size_t)e->d * sizeof(float));
    double t2 = prl_now();
    e->spec.draft_s += t1 - t0, e->spec.verify_s += t2 - t1;
    for (int s = 0; s < e->opt.max_batch; s++) {
        if (e->slots[s].req < 0) continue;
        int stopped;
        *tokens += spec_accept(g, s, first[s], nd[s], &stopped);
        if (stopped) {
            prl_status rc = infer__finish(g, s);
            if (rc) return rc;
            (*finished)++;
        }
    }
    e->spec.accept_s += prl_now() - t2;
    return PRL_OK;
}
