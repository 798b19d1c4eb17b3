/*
** infer.h — the infer path: KV-cached, batched decoding with sampling (part of engine.h;
** include that).
**
** The infer path is a second implementation of the model, built the way rollout engines are:
** prefill plus incremental decode over a per-sequence cache, MLA in the absorbed form (the
** cache holds only the normalised latent c_kv and the rotated shared key k_r per token and
** layer), pre-packed weights (or dot-product "GEMV" order), optional bf16/fp16 rounding.
** Each way it differs from the train path is a switch (prl_infer_options), so a consistency
** checker can turn them one at a time; the preset "aligned" turns all of them to the train
** path's choices and its log-probs then equal the train path's bitwise (docs/infer.md).
**
** Every kernel is batch-invariant: a sequence's tokens and log-probs never depend on which
** other sequences share its batch, its slot, or the thread count. Sampling draws come from
** (seed, sequence id, position), so a seeded sequence samples the same tokens in any batch.
**
** Ownership: a prl_infer borrows the model (which must outlive it and not change while it
** is used; call prl_infer_refresh after changing the weights). Results are caller-owned
** (prl_gen_result_free).
*/
#ifndef PRL_INFER_H
#define PRL_INFER_H

typedef enum prl_mla_form {
    PRL_MLA_ABSORBED = 0, /* W_UK folded into the query, W_UV applied after attention */
    PRL_MLA_NAIVE = 1     /* per-head keys and values expanded and cached, as in training */
} prl_mla_form;

typedef enum prl_matmul_kind {
    PRL_MATMUL_GEMV = 0, /* each output one 8-lane dot product (decode-style order) */
    PRL_MATMUL_GEMM = 1, /* the train path's GEMM (gemm.c) on pre-packed weights */
    PRL_MATMUL_BLAS = 2  /* OpenBLAS sgemm: fast but batch-variant (a comparison knob) */
} prl_matmul_kind;

/* W8A8 module kinds (prl_infer_options.w8a8 is a mask of them; the preset "w8a8" sets all):
** INT8 q_b_proj (or a direct q_proj), o_proj, dense MLP, routed experts; BF16 weights for the
** other large linears (q_a, kv_a, router gate, shared experts, indexer, LM head). One kind
** alone is how `prl diagnose --sweep` attributes the mismatch to it. */
enum {
    PRL_W8A8_Q_B = 1,
    PRL_W8A8_O_PROJ = 2,
    PRL_W8A8_DENSE_MLP = 4,
    PRL_W8A8_ROUTED = 8,
    PRL_W8A8_BF16_REST = 16,
    PRL_W8A8_ALL = 31
};

typedef struct prl_w8a8_smooth prl_w8a8_smooth; /* SmoothQuant factors (prl_w8a8_calibrate) */

typedef struct prl_infer_options {
    prl_precision precision;
    prl_mla_form mla;
    prl_matmul_kind matmul;
    int max_batch; /* sequences decoded together (default 16) */
    int max_len;   /* context per sequence, prompt + generated (default max_position_embeddings) */
    int spec_drafts;       /* self-speculative decoding with this many MTP drafts per step (0 = off;
                     ** at most num_nextn_predict_layers); docs/infer.md */
    int spec_draft_vocab;  /* > 0: the drafts' head covers token ids [0, this) only (a cheaper
                          ** draft, FR-Spec style; the verify keeps the whole vocabulary, so
                          ** the output is unchanged); 0 = the whole vocabulary */
    int no_shared_prefill; /* 1: every request prefills its own prompt (the comparison knob).
                           ** By default a request whose prompt equals the one admitted just
                           ** before it, in the same admission round, copies that slot's
                           ** caches instead (a GRPO group's G samples prefill once; the
                           ** output is bitwise the same; docs/infer.md) */
    int w8a8; /* != 0: W8A8 rollouts, a mask of PRL_W8A8_* (preset "w8a8": all; precision
              ** fp32): INT8 o_proj, q_b_proj, dense
              ** MLP and routed experts (per-channel weights, per-token activations, optional
              ** SmoothQuant factors from prl_infer_calibrate); q_a, kv_a, the router, shared
              ** experts, indexer and LM head in BF16 weights; kv_b, mHC, MTP, norms and the
              ** embedding fp32; activations fp32 (docs/w8a8.md) */
    const prl_w8a8_smooth *smooth; /* W8A8: SmoothQuant factors of the INT8 linears (borrowed;
                                   ** NULL = none), from prl_w8a8_calibrate on this model */
} prl_infer_options;

/* Speculative decoding counters since prl_infer_init: drafts proposed and accepted (the
** acceptance rate is accepted / drafted), sequence steps (one sequence's verify rows in one
** pass) and the tokens they emitted (emitted / steps = tokens per sequence and step). The
** profile (plain decoding too): decode passes (one step of every active sequence) and their
** wall time, of which the MTP drafts, the verify forward and the acceptance (sampling, log-
** probs, stops, rollback) — where a speculative pass's time goes (docs/infer.md). */
typedef struct prl_spec_stats {
    long prefills, shared_prefills; /* prompts admitted, and those that copied a twin's caches */
    long drafted, accepted, steps, emitted;
    long passes;
    double pass_s, draft_s, verify_s, accept_s;
} prl_spec_stats;

/* fp32, absorbed, GEMM (pre-packed), batch 16, full context. */
void prl_infer_options_default(prl_infer_options *o);
/* "fp32" | "bf16" | "fp16" (absorbed MLA, the GEMM, that precision) or "aligned" (fp32,
** naive MLA, the train path's GEMM), "aligned-bf16" / "aligned-fp16" (the same in bf16 /
** fp16: bitwise the train path at that precision), "w8a8" (fp32 + w8a8 = 1). Unknown names
** are PRL_ERR_ARG naming the choices. */
prl_status prl_infer_options_preset(prl_infer_options *o, const char *name);
/* Parse the knob values used by the CLI: precision "fp32|bf16|fp16|w8a8", mla "absorbed|naive",
** matmul "gemv|gemm|blas". NULL leaves a field unchanged. */
prl_status prl_infer_options_set(prl_infer_options *o, const char *precision, const char *mla,
                                 const char *matmul);
/* "precision=fp32 mla=absorbed matmul=gemm" */
void prl_infer_options_describe(const prl_infer_options *o, char *out, size_t n);

typedef struct prl_infer prl_infer;

prl_status prl_infer_init(prl_infer **out, const prl_model *m, const prl_infer_options *o);
void prl_infer_free(prl_infer *e);
/* Re-read the model's weights (after an optimizer step or a load). */
prl_status prl_infer_refresh(prl_infer *e);
/* Bytes of KV cache per token of context in the whole-context (not sliding-window) layers:
** (kv_lora_rank + qk_rope_head_dim) × those layers × 4 in the absorbed form; the naive form
** also caches H·(d_nope + d_v) per layer. A sliding-window layer keeps a ring of W rows per
** sequence, so its share stops growing at W tokens. */
size_t prl_infer_kv_bytes_per_token(const prl_infer *e);
/* Bytes of KV cache one sequence holds at a context of n_tokens (every layer, rings included). */
size_t prl_infer_kv_bytes(const prl_infer *e, int n_tokens);
/* The KV caches of one slot (sequence) as prl_infer_init allocated them: whole-context
** layers (causal and DSA: max_len rows of latent + rope key, and per-head keys and values in
** the naive form), the DSA layers' indexer keys (max_len × index_head_dim), and the
** sliding-window layers' rings (W rows, plus spare rows for speculative decoding; max_len
** when that is smaller). An engine with max_len = n thus shows the memory of an n-token
** context. MTP layers count when speculative decoding is on (they have caches then). */
typedef struct prl_kv_alloc {
    size_t full, index, ring;  /* bytes */
    int n_full, n_dsa, n_ring; /* layers */
} prl_kv_alloc;
prl_kv_alloc prl_infer_kv_alloc(const prl_infer *e);
const prl_infer_options *prl_infer_get_options(const prl_infer *e);
prl_spec_stats prl_infer_spec_stats(const prl_infer *e);

/* Tensor hooks with the train path's names (L3.attn.q, L3.attn.kv_latent, L3.attn.out,
** L3.mlp.out, L3.moe.router_logits, L3.moe.out, final.logits; L6.mtp.logits for the drafts
** of the MTP module on layer 6 during speculative decoding). Rows are the tokens of one
** prefill or decode call; prl_infer_hook_rows gives, during a hook call, each row's request
** index and position. */
void prl_infer_set_hook(prl_infer *e, prl_tensor_hook hook, void *user);
void prl_infer_hook_rows(const prl_infer *e, const int32_t **request, const int32_t **pos);

/* Test-only fault injection, for checking a consistency checker (prl diagnose): the output of
** op `name` (a hook name: "L3.attn.out", "L1.moe.router_logits", "final.logits", ...) is
** scaled by (1 + rel) where it is produced, before any later op reads it, so the error
** propagates as a real kernel bug's would. NULL clears it. An unknown op or rel 0 is
** PRL_ERR_ARG. prl_infer_init also takes one from the environment, PRL_INFER_FAULT=NAME:REL
** (a bad value fails the init, naming the variable). Never set it in a real run. */
prl_status prl_infer_set_fault(prl_infer *e, const char *name, double rel);
/* The active fault's op name, or NULL. */
const char *prl_infer_fault(const prl_infer *e);

/* ---------------------------------------------------------------- generation ------- */

typedef struct prl_sample_params {
    double temperature;      /* 0 = greedy (argmax, ties to the lower id); > 0 samples */
    int top_k;               /* keep the k most likely tokens (0 = off) */
    double top_p;            /* keep the smallest set with probability >= top_p (1 = off) */
    uint64_t seed;           /* draws seeded from (seed, request seq_id, position) */
    int max_new_tokens;      /* > 0 */
    const int32_t *stop_ids; /* tokens that end a sequence (kept as its last token) */
    int n_stop_ids;
    const char *const *stop_strings; /* texts that end a sequence once decoded output has one */
    int n_stop_strings;
    const struct prl_tokenizer *tok; /* needed for stop_strings */
    int vocab_limit; /* > 0: only ids below it are drawn (a tokenizer smaller than the
                            ** model's vocabulary); log-probs stay over the whole vocabulary */
} prl_sample_params;

/* Greedy, 256 new tokens, stop on <|eos|>. */
void prl_sample_params_default(prl_sample_params *p);
/* Errors name the bad value: temperature < 0 or not finite, top_k < 0, top_p not in (0, 1],
** max_new_tokens < 1, stop strings without a tokenizer. */
prl_status prl_sample_params_check(const prl_sample_params *p, int vocab_size);

typedef struct prl_gen_request {
    const int32_t *prompt; /* >= 1 token, borrowed */
    int prompt_len;
    uint64_t seq_id;       /* identifies the sequence for seeding (e.g. prompt·G + sample) */
    const int32_t *forced; /* optional: score these tokens instead of sampling (teacher forcing) */
    int n_forced;
} prl_gen_request;

typedef enum prl_stop_reason {
    PRL_STOP_TOKEN = 0,   /* a stop id (EOS) */
    PRL_STOP_LENGTH = 1,  /* max_new_tokens */
    PRL_STOP_STRING = 2,  /* a stop string */
    PRL_STOP_CONTEXT = 3, /* the context (max_len) is full */
    PRL_STOP_FORCED = 4   /* all forced tokens scored */
} prl_stop_reason;
const char *prl_stop_reason_name(prl_stop_reason r);

typedef struct prl_gen_result {
    int32_t *tokens; /* [n] generated (or forced) tokens */
    float *logprobs; /* [n] log-prob of each under softmax(logits / τ) over the whole
                            ** vocabulary (τ = temperature, or 1 when greedy) */
    int n;
    float *prompt_logprobs; /* [prompt_len]: [0] = 0, [i] = log p(prompt[i] | prompt[<i]) */
    int prompt_len;
    uint8_t *routes; /* compact routes (prl_routes_pack) of every token fed through the
                            ** model, prompt then generated: [n_route_tokens][n_moe][K] */
    size_t routes_bytes;
    int n_route_tokens; /* prompt_len + n - 1 (the last token is never fed) */
    prl_stop_reason stop;
} prl_gen_result;
void prl_gen_result_free(prl_gen_result *r);

/* Progress: called after each decode step with finished requests and tokens generated so far.
** During the call, results[i].n and results[i].tokens / logprobs [0, n) hold what request i
** has generated so far (a streaming server reads them; its routes come when it finishes). */
typedef void (*prl_gen_progress)(void *user, int finished, int total, long tokens);

/* Run n requests with continuous batching: up to max_batch sequences decode together, a
** finished one leaves and the next request is prefilled into its slot. results[i] answers
** reqs[i]. A prompt that does not fit the context is PRL_ERR_RANGE naming the request. */
prl_status prl_infer_generate(prl_infer *e, const prl_gen_request *reqs, int n,
                              const prl_sample_params *sp, prl_gen_result *results,
                              prl_gen_progress progress, void *user);

/* SmoothQuant calibration (docs/w8a8.md): the prompts are prefilled with every linear
** in fp32 while each INT8 linear's inputs are recorded (per-channel max |x| over all rows, and
** up to 64 rows); then per linear the migration strength α ∈ {0, .25, .5, .75, 1} — or no
** smoothing — with the least output MSE against fp32 on those rows is kept: s_j = max|X_j|^α /
** max|W_j|^(1−α), the weights quantized as W·diag(s), the activations divided by s. `o` is
** the W8A8 configuration to calibrate (its w8a8 mask says which linears). The report: */
typedef struct prl_w8a8_calib {
    int linears, smoothed;        /* INT8 linears seen (with rows), of which smoothing helped */
    int alpha_count[5];           /* how many chose each α (0, .25, .5, .75, 1) */
    double mse_plain, mse_smooth; /* summed over the linears: output MSE without / with */
} prl_w8a8_calib;
prl_status prl_w8a8_calibrate(prl_w8a8_smooth **out, const prl_model *m, const prl_infer_options *o,
                              const prl_gen_request *prompts, int n, prl_w8a8_calib *report);
void prl_w8a8_smooth_free(prl_w8a8_smooth *s);

/* ---------------------------------------------------------------- routes ----------- */

/* The compact route form: one byte per expert id when n_routed_experts <= 256, else two
** (little-endian). Returns bytes written (n_ids × width). */
int prl_routes_width(int n_experts);
size_t prl_routes_pack(uint8_t *out, const int32_t *ids, size_t n_ids, int n_experts);
/* Inverse; ids outside [0, n_experts) are PRL_ERR_FORMAT naming the entry. */
prl_status prl_routes_unpack(int32_t *ids, const uint8_t *in, size_t n_ids, int n_experts);

#endif /* PRL_INFER_H */
