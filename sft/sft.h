/*
** sft.h — the one public header of sft/: supervised fine-tuning on chat JSONL.
**
** A trainer at the level of grpo/ and opd/: it reads chat-format JSONL (one
** {"messages": [{"role", "content"}, ...]} object per line; other keys are carried
** metadata and ignored), encodes it with the chat template of the tokenizer (loss on
** assistant tokens only), batches it in a seeded order and runs the engine's train path.
** Every draw is seeded from (seed, epoch, purpose), so a run is reproducible bit for bit,
** whatever the thread count.
*/
#ifndef PRL_SFT_H
#define PRL_SFT_H

#include "engine/engine.h"

typedef struct prl_sft_example {
    int32_t *ids;  /* owned */
    uint8_t *mask; /* owned; 1 where the token is trained on */
    int n;         /* tokens (after truncation) */
} prl_sft_example;

typedef struct prl_sft_data {
    prl_sft_example *ex; /* owned */
    int n;
    size_t n_tokens, n_loss_tokens;
    int n_truncated;    /* examples cut to max_len */
    int n_masked_steps; /* assistant turns kept as context with mask 0 (prl_sft_data_load) */
} prl_sft_data;

/* prl_sft_data_load flag (beside the tokenizer's): mask the assistant turns the environment
** rejected, located from its own feedback: the tool reply right after the turn starts with
** "error: " (the Agent environment's and the python tool's rejections). */
enum { PRL_SFT_MASK_ERRORS = 1u << 8 };

/* All message contents of a chat JSONL file, for training a tokenizer (caller frees each
** string and the array). Errors name the file and line. */
prl_status prl_sft_read_texts(const char *path, char ***texts, size_t *n_texts);
/* Load and encode a chat JSONL file. Lines longer than max_len tokens are truncated (and
** counted); an example without any trained token is an error naming the line. flags: 0, or
** PRL_TOKENIZER_SPECIAL for trusted demonstrations whose special-token strings
** (<|tool_call|> ...) become their ids, as the model emits them at rollout, and/or
** PRL_SFT_MASK_ERRORS. Whatever the flags, an assistant message with "mask": true, or one
** followed by a tool message with "error": true, keeps its tokens as context with mask 0
** (docs/formats.md "Masked steps"); the recovery after it is trained as usual. */
prl_status prl_sft_data_load(prl_sft_data *d, const char *path, const prl_tokenizer *tok,
                             int max_len, unsigned flags);
void prl_sft_data_free(prl_sft_data *d);

typedef struct prl_sft_config {
    int batch;     /* sequences per micro-batch */
    int seq;       /* positions per sequence at most (longer examples were truncated at load) */
    int steps;     /* optimizer steps */
    int accum;     /* micro-batches per step (gradient accumulation) */
    uint64_t seed; /* data order */
    int log_every; /* progress callback period in steps (>= 1) */
    int group;     /* 0: every micro-batch is seq wide. G >= 1: each epoch's shuffled order
                     ** is cut into windows of G*batch examples, each window sorted by length
                     ** and its batches shuffled, and a micro-batch is only as wide as its
                     ** longest example (rounded up to 8): fewer padding positions computed */
    int pack;      /* 1 (group 0 only): packed rows — the examples in the seeded order, each
                     ** appended to the current row of seq positions while it fits, else to the
                     ** next; batch rows per micro-batch; each example attends only to itself
                     ** (prl_batch.pos, docs/model.md "Packed sequences") */
    prl_loss_scaler *scaler; /* borrowed dynamic loss scaler (fp16 training), or NULL: each
                     ** step backpropagates scale × the loss and is skipped on an overflow
                     ** (rl.md §4.3 order; prl_optim_step_scaled) */
    int64_t run_last;        /* the progress line's "of N" when this call is one chunk of a longer
                     ** run (checkpoint saves, DSA stages); 0: this call's last step */
    double run_start_s;      /* with chunks: prl_now() when the run began, and run_first the */
    int64_t run_first;       /* step it began at, so elapsed and ETA span the whole run (saves
                     ** included); run_start_s 0: this call alone */
} prl_sft_config;

typedef struct prl_sft_progress {
    int step, steps;
    double loss; /* token-mean cross-entropy of this step (the LM loss) */
    double balance_loss, z_loss;
    double mtp_loss;   /* λ/D·Σ_k of the MTP modules' token-mean cross-entropies (0 = none) */
    double index_loss; /* DSA indexer KL (docs/model.md; 0 without DSA layers) */
    double lr, grad_norm;
    double tokens_per_s; /* trained + context tokens per second, this step */
    int tokens;          /* those tokens (the rows' real positions, padding excluded) */
    double elapsed_s, eta_s;
    double loss_scale; /* with a scaler: the scale after this step (else 0) */
    long skipped;      /* with a scaler: steps skipped for an overflow so far */
    int log_line;      /* 1 on the steps a progress line prints: every log_every and the last */
} prl_sft_progress;

typedef void (*prl_sft_progress_fn)(void *user, const prl_sft_progress *p);

/* Train `m` with optimizer `o` on `d` for c->steps steps, starting at step o->step (so a
** resumed run continues its data order; a step skipped by the loss scaler is retried with
** the same data, as o->step does not advance). The model computes in its own precision
** (prl_model_set_precision). Calls `progress` after every step (a metrics file wants them
** all), with log_line set every log_every steps and after the last. */
prl_status prl_sft_train(prl_model *m, prl_optim *o, const prl_sft_data *d, const prl_sft_config *c,
                         prl_sft_progress_fn progress, void *user);

#endif /* PRL_SFT_H */
