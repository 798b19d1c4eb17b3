/*
** infer_int.h — private to the infer path's sources (engine/infer*.c, see infer.c): the
** engine's state (struct prl_infer, its layers' weights, row buffers and cache slots), the
** state of one prl_infer_generate call, and the few functions one part calls in another.
** Include engine/engine.h from outside; the infer path's API is engine/infer.h.
*/
#ifndef PRL_INFER_INT_H
#define PRL_INFER_INT_H

#include "engine/ops.h"
#include "engine/quant.h"

#ifdef PRL_REAL_DOUBLE
#error "the infer path is float-only (build it in prl_model, not prl_model64)"
#endif

/* ------------------------------------------------------------------ state ----------- */

/* How a linear's weights are held: fp32 (packed for the GEMM kind), or, in W8A8 mode, INT8
** (the report's split) or BF16 (the other large linears; docs/w8a8.md). */
enum { LIN_F32 = 0, LIN_Q8 = 1, LIN_BF16 = 2 };

/* A linear layer out = x·wᵀ, w [out, in] (with a packed copy for the GEMM kind). w is the
** model's fp32 tensor whatever the kind (the absorbed attention and the drafts read it). */
typedef struct lin {
    const float *w;
    int out, in;
    prl_packed_b pk;
    int kind;
    prl_q8w q8;    /* LIN_Q8 */
    prl_bf16w bf;  /* LIN_BF16 */
    float *smooth; /* LIN_Q8: SmoothQuant factors [in] (owned; kept across refreshes), or NULL */
    float alpha;   /* the migration strength they were searched at (-1: none) */
    struct lin_calib *cal; /* during prl_w8a8_calibrate: its recorded inputs */
} lin;

typedef struct layer_w {
    int moe; /* MoE index, -1 for a dense layer */
    const float *ln1, *q_norm, *kv_norm, *ln2;
    lin wq_a, wq_b, wkv_a, wkv_b, wo;
    lin w13, w2; /* dense FFN, or the shared experts; gate/up stacked */
    lin router;
    lin *e13, *e2;                /* [E] routed experts, gate/up stacked */
    float *wuk_t;                 /* absorbed form: [H][rkv][dn] = W_UK_hᵀ per head */
    prl_bf16w *uk_bf, *uv_bf;     /* W8A8 (BF16 bit): per head W_UK_hᵀ [rkv, dn] and W_UV_h
                                  ** [dv, rkv] in BF16 for the absorbed form, else NULL */
    int window;                   /* 0 = causal, W = sliding window (docs/model.md) */
    int cap;                      /* cache rows per slot: max_len, or W for a ring */
    size_t lat_off, kv_off;       /* the layer's part of cache_lat / cache_kv */
    size_t slot_kv_floats;        /* floats one slot holds in cache_lat (+ cache_kv, naive) */
    size_t slot_idx_floats;       /* floats one slot holds in cache_idx (DSA layers) */
    float *sink_lat;              /* [ns][rkv + dr]: normed sink latent, then k_pe */
    float *sink_kv;               /* [ns][H·dkv]: per-head sink [k_nope | v] (naive) */
    const float *conv_w[3];       /* ModAttn kernels [C, k]: query, latent, heads */
    int dsa;                      /* 1: a DSA layer (indexer below; never a ring) */
    int dsa_sparse;               /* its attention reads only the selected tokens */
    lin ix_wq_b, ix_wk, ix_wproj; /* the lightning indexer (docs/model.md, DSA) */
    const float *ix_k_norm;
    size_t idx_off;       /* the layer's part of cache_idx */
    float *conv_state[3]; /* per slot the k−1 latest inputs of each conv [k−1][C] */
    const float *ln_pa, *ln_pm, *ln_bp; /* sandwich post-norms, block post-norm (or NULL) */
    lin hc_phi[2];                      /* mHC sites attention, FFN: phi, and below γ, α, β */
    const float *hc_gamma[2], *hc_alpha[2], *hc_beta[2];
    const float *enorm, *hnorm, *sh_norm; /* MTP layer: input norms, shared_head.norm */
    lin eh_proj, own_head;                /* MTP layer: eh_proj, its own shared_head.head */
    const lin *sh_head;                   /* own_head, or the trunk's lm_head */
    lin draft_head;                       /* spec_draft_vocab: sh_head's first rows (w NULL: off) */
} layer_w;

enum { CONV_Q, CONV_KV, CONV_O };

/* Buffers of one infer__forward_rows call, sized for `cap` rows. */
typedef struct rows_buf {
    int cap;
    int32_t *tok, *slot, *pos, *req;
    float *x, *ln, *rstd, *zq, *cq, *q, *kva, *ckv, *kr, *lat, *kvx, *o, *tmp, *a13, *h;
    int32_t *first_row, *first_pos; /* [max_batch]: a slot's first row in the call, its position */
    float *zqc, *kvc, *oc;          /* ModAttn outputs */
    float *z, *s, *g;
    int32_t *sel, *offsets, *gpos, *token_of;
    float *xg, *ea13, *eh, *yg, *logits;
    float *iq, *ikz, *ik, *iw, *iscore; /* DSA indexer: qI, x·wkᵀ, kI, head weights; scores */
    uint8_t *dsel;                      /* [cap][max_len] each row's DSA selection */
    float *xs, *xs2, *hn, *hrstd, *hm, *pre, *post, *hS; /* mHC streams [cap, n·d], a site's
                                                            coefficients (engine/mhc.h) */
    float *mtp_e, *mtp_h, *mtp_cat, *mtp_rstd; /* MTP input op: Emb rows, h^{k−1} rows, [cap, 2d],
                                                ** rstd of both norms [2·cap] */
} rows_buf;

/* A cache slot's generation state. */
typedef struct slot_state {
    int req;         /* request index, -1 when free */
    int len;         /* tokens in the cache */
    int32_t last;    /* the token to feed next */
    int32_t *routes; /* [max_len][n_moe][K] */
    /* speculative decoding only (docs/infer.md): */
    int32_t *toks;  /* [max_len + D + 1] the sequence: prompt, generated, then `last` */
    float *hid;     /* [1 + Lm][max_len][d]: h⁰ (trunk) and h^k (MTP k) per position */
    int *mtp_len;   /* [Lm] positions MTP layer k has final cache rows for */
    int32_t *draft; /* [D] this step's drafts */
    double *q;      /* [D][V] their draft distributions (sampling) */
} slot_state;

struct prl_infer {
    const prl_model *m;
    prl_infer_options opt;
    int V, d, L, H, rq, rkv, dn, dr, dv, dq, dkv, I, E, K, de, sde, n_moe, lat, ns, ck, HI, dI;
    double attn_scale; /* the attention softmax scale (prl_config_softmax_scale) */
    float *wcopy;      /* rounded weights (bf16/fp16), NULL in fp32 */
    layer_w *lw;
    const float *embed, *norm;
    lin head;
    float *rope_cos, *rope_sin;     /* [max_len][dr/2] */
    float *cache_lat;               /* per layer [max_batch][cap][rkv+dr]: c_kv then k_r */
    float *cache_kv;                /* naive: per layer [max_batch][cap][H·dkv] */
    float *cache_idx;               /* DSA layers: [max_batch][max_len][dI] indexer keys */
    float *att_scratch;             /* per pool thread */
    struct infer_lin_job *lin_jobs; /* 2·(E + 1): an MoE layer's up and down linears */
    size_t att_scratch_per_thread;
    int att_threads;
    int absorbed_ref; /* tests: the reference absorbed kernel (one task a row, scalar loops) */
    rows_buf rb;
    slot_state *slots;
    prl_tensor_hook hook;
    void *hook_user;
    int n_streams; /* mHC streams (1 = the plain residual) */
    lin merge_phi; /* mHC merge head */
    const float *merge_gamma, *merge_alpha, *merge_beta, *ones;
    float *ones_buf;     /* γ = 1 without mhc_use_gamma */
    char fault_name[64]; /* test-only fault (prl_infer_set_fault): "" = none */
    double fault_rel;
    int Lm;              /* MTP layers bound (speculative decoding on), after the L */
    int conv_hist;       /* inputs a conv history keeps per slot: k − 1 + spare rows */
    double *spec_p;      /* [D + 1][V] one slot's verify distributions */
    prl_spec_stats spec; /* counters since init */
    int8_t *q8x;         /* W8A8: the INT8 linears' quantized inputs of one call or set */
    float *q8s;          /* and their per-row scales */
    size_t q8x_cap, q8s_cap;
    int calibrating; /* prl_w8a8_calibrate: every linear fp32, INT8 inputs recorded */
};

/* Activation rounding at an op's output (no-op in fp32). */
static inline void infer__act_round(const prl_infer *e, float *x, size_t n)
{
    prl_round_floats(e->opt.precision, x, n);
}

/* Channels of the three ModAttn convs: the query latent, the KV latent, the heads' output. */
static inline int infer__conv_channels(const prl_infer *e, int which)
{
    return which == CONV_Q ? e->rq : which == CONV_KV ? e->rkv : e->H * e->dv;
}

/* ------------------------------------------------------------------ infer.c --------- */

/* The tensor hook's call for op `what` of `layer` (-1: a model-level op) on rows × cols. */
void infer__emit(const prl_infer *e, int layer, const char *what, const float *data, int rows,
                 int cols);
/* The test-only fault (prl_infer_set_fault) at op `what` of `layer`, on x[0..n). */
void infer__fault(const prl_infer *e, int layer, const char *what, float *x, size_t n);

/* ------------------------------------------------------------------ infer_matmul.c -- */

typedef float v8f __attribute__((vector_size(32))); /* 8 float lanes (GCC vector extension) */

/* y[r][o] = x_r·w_o for r < nr (<= 2), o < no (<= 4) in GEMV order (infer__choose_gemv sets
** the pointer). */
typedef void (*gemv_tile_fn)(const float *x, int ldx, int nr, const float *w, int ldw, int no,
                             int n, float *y, int ldy);
extern gemv_tile_fn infer__gemv_tile;
extern int infer__gemv_fma; /* 1: the GEMV kernels are the FMA ones */
/* Pick the dot-product kernels for this CPU (once; prl_infer_init calls it). */
void infer__choose_gemv(void);
/* y[o] = x·w_o for o < no, w_o = w + o·ldw, 8 at a time. */
void infer__dots(float *y, const float *x, const float *w, int ldw, int no, int n);
/* fn(ctx, t) for t < n on the pool, or inline when `macs` is too little work to wake it. */
void infer__run_tasks(int n, void (*fn)(void *, int), void *ctx, double macs);
/* y[R, out] = x[R, in]·wᵀ in the engine's matmul kind, rounded to the precision. */
void infer__linear(const prl_infer *e, float *y, const float *x, int R, const lin *L);
/* One linear of a set: y[R, out] = x[R, in]·wᵀ. */
typedef struct infer_lin_job {
    float *y; /* (the struct tag is named in prl_infer above) */
    const float *x;
    int R;
    const lin *L;
} infer_lin_job;
/* infer__linear on each of n independent jobs (no job reads another's output), in one
** parallel region: the same bits, fewer pool hand-offs. */
void infer__linear_many(const prl_infer *e, const infer_lin_job *jobs, int n);

/* ------------------------------------------------------------------ infer_absorbed.c */

/* Whether the fast kernels below run (the CPU has AVX2 and FMA, row kernels on); otherwise
** they run the reference loops. Either way each gives the reference loops' bits. */
int infer__absorbed_fast_ok(void);
/* S[j·ldS + s] = q_j·c_s (q_j = q + j·lat, c_s = c + s·lat) for heads j < nh, keys s < n,
** each the GEMV-order dot over lat elements. */
void infer__absorbed_scores(float *S, int ldS, const float *q, int nh, const float *c, int lat,
                            int n);
/* Softmax of scale·S[0..n) in place (normalised); *mx, *sum: its max and sum of weights. */
void infer__absorbed_softmax(float *S, int n, float scale, float *mx, float *sum);
/* out[0..w) = Σ_{s<n} p[s]·c_s[0..w) (c_s = c + s·ld) in key order, multiply then add. */
void infer__absorbed_wsum(float *out, const float *p, const float *c, int ld, int w, int n);
/* ------------------------------------------------------------------ infer_quant.c --- */

/* The inputs a calibration records for one INT8 linear. */
typedef struct lin_calib {
    float *amax; /* [in] max |x_j| over every row seen */
    float *rows; /* [CALIB_ROWS][in] the first rows seen */
    int n;       /* rows kept */
} lin_calib;
enum { CALIB_ROWS = 64 };
/* Record rows x[R, in] for L (calibration only). */
void infer__calib_record(const lin *L, const float *x, int R);
/* The linears W8A8 may hold in INT8 (whatever the mask) in a fixed order (trunk then MTP
** layers; per layer q_b, o_proj, dense MLP up/down or each routed expert's up/down): n of
** them into out (NULL: just count). */
int infer__q8_linears(prl_infer *e, lin **out);
/* Apply the table's factors to the INT8 linears (prl_infer_init; a mismatched table is
** PRL_ERR_ARG). */
prl_status infer__apply_smooth(prl_infer *e, const prl_w8a8_smooth *s);
/* fp32 y[R, out] = x·wᵀ by GEMV-order dots (the calibration's reference path). */
void infer__linear_f32_dots(float *y, const float *x, int R, const lin *L);

/* ------------------------------------------------------------------ infer_forward.c - */

/* Each slot's first row in the call and its position (rb.slot/pos[0, R) set). */
void infer__rows_begin(prl_infer *e, int R);
/* Decoder layer l (a trunk or an MTP layer) on R rows: rb.x (or the streams rb.xs) in, out. */
void infer__layer_rows(prl_infer *e, int l, int R);
/* The trunk on rows rb.tok/slot/pos/req[0, R): logits into rb.logits, h⁰ left in rb.x. */
void infer__forward_rows(prl_infer *e, int R);
/* Make slot dst hold what slot src holds after a prefill of P tokens (and nothing since):
** every layer's cache rows of positions [0, P) (a ring: the rows it keeps), DSA indexer
** keys, ModAttn conv histories, the routes of the P positions. */
void infer__slot_copy(prl_infer *e, int dst, int src, int P);

/* ------------------------------------------------------------------ infer_sample.c -- */

typedef struct cand {
    double w;
    int id;
} cand;

/* The candidates for τ > 0 (weights, top-k/top-p applied, sorted when restricted); returns
** how many. */
int infer__sample_weights(cand *cs, const float *logits, int V, const prl_sample_params *sp);
/* The same candidates by selection instead of a full sort (the decode step's form). */
int infer__sample_weights_fast(cand *cs, const float *logits, int V, const prl_sample_params *sp);
/* A token from a logits row (greedy when τ = 0, else a draw with rng); cs: V scratch entries. */
int infer__sample_row(const float *logits, int V, const prl_sample_params *sp, prl_rng *rng,
                      cand *cs);
/* The same token as infer__sample_row, faster (the decode step's form). */
int infer__sample_row_fast(const float *logits, int V, const prl_sample_params *sp, prl_rng *rng,
                           cand *cs);
/* log p(y) under softmax(logits/τ) over the whole vocabulary. */
float infer__logprob(const float *logits, int V, int y, double tau);

/* ------------------------------------------------------------------ infer_generate.c  */

/* One prl_infer_generate call. */
typedef struct gen_state {
    prl_infer *e;
    const prl_gen_request *reqs;
    const prl_sample_params *sp;
    prl_gen_result *res;
    int cap_new; /* per-request capacity of tokens/logprobs */
    cand *cands; /* V scratch entries per pool thread (the first: the calling thread's) */
    int32_t *text_ids;
    /* shared prefill: the request admitted last in this admission round (-1: none, or a
    ** decode step ran since), its slot and the logits of its prompt's last position */
    int twin_req, twin_slot;
    float *twin_logits;
    int32_t *draw_y; /* a decode step's tokens and log-probs, one per row (max_batch) */
    float *draw_lp;
} gen_state;

/* Record token y of the request in `slot` (drawn from `logits`) and decide whether the
** sequence stops; returns 1 if it stopped. */
int infer__record_token(gen_state *g, int slot, int32_t y, const float *logits);
/* The same with y's log-prob already computed. */
int infer__record_token_lp(gen_state *g, int slot, int32_t y, float logprob);
/* Pack the slot's routes into its result and free the slot. */
prl_status infer__finish(gen_state *g, int slot);

/* ------------------------------------------------------------------ infer_spec.c ---- */

/* A prompt just prefilled into `slot` (trunk states in rb.x): kept for the MTP modules. */
void infer__spec_admit(prl_infer *e, int slot, const int32_t *prompt, int P);
/* The MTP modules' part of the prefill of the request in `slot`. */
void infer__spec_prefill(gen_state *g, int slot);
/* One speculative step for every active slot: drafts, one verify pass, acceptance. */
prl_status infer__spec_step(gen_state *g, int *finished, long *tokens);

#endif /* PRL_INFER_INT_H */
