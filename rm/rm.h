/*
** rm.h — the one public header of rm/: learned rewards. A Bradley–Terry reward model (the
** engine's model with its scalar head, cfg.score_head, trained on preference pairs), a
** generative judge (a policy model asked to grade an answer, its grade parsed from a fixed
** answer form), and the General preference pairs made from the task generator.
**
** A trainer at the level of grpo/, opd/ and sft/ (docs/reward-models.md). An
** answer is always read as the chat its policy saw: the prompt's messages, then the
** assistant's answer, encoded with the reward model's own tokenizer (so a reward model needs
** no knowledge of the policy's ids), and scored at its last token (<|eos|>).
**
** Pairs file (docs/formats.md "Preference pairs"): JSONL, one object per line with "prompt"
** (a string: one user message) or "messages" (the prompt's chat), "chosen" and "rejected"
** (the two answers), optional "margin" (a number >= 0: this pair's m) and any other keys
** (kept, ignored: "id", "kind").
*/
#ifndef PRL_RM_H
#define PRL_RM_H

#include "engine/engine.h"
#include "tasks/tasks.h"

#include <stdio.h>

/* ---------------------------------------------------------------- pairs ------------ */

/* A parsed pairs file: per pair its prompt (chat, owned JSON), its answers and margin. */
typedef struct prl_rm_pair {
    json_t *line; /* the line (owned); msgs and the answers borrow from it */
    prl_chat_message *msgs;
    size_t n_msgs;
    const char *chosen, *rejected;
    double margin;
} prl_rm_pair;

typedef struct prl_rm_pairs {
    prl_rm_pair *p;
    int n;
} prl_rm_pairs;

/* Read a pairs file; PRL_ERR_FORMAT "PATH:LINE: why" on a bad line (nothing is kept). */
prl_status prl_rm_pairs_read(const char *path, prl_rm_pairs *out);
void prl_rm_pairs_free(prl_rm_pairs *p);

/* The General pairs of `prl rm pairs`: n problems of the generator's split (difficulty 0: each
** draws 1..3), each one good answer (its demonstration, which the verifier scores 1) against
** four bad ones, one of each kind — "repeated" (a word of the answer said 5–8 times in a
** row inside it), "off_topic" (the previous problem's good answer), "stuffed" (the
** constraints' and topic's words listed) and "truncated" (the first 30–70 % of its words).
** Draws from (seed, problem, kind). Writes 4·n lines; *written counts them. */
typedef struct prl_rm_pairs_options {
    int n;
    uint64_t seed;
    prl_task_split split;
    int difficulty;
} prl_rm_pairs_options;
prl_status prl_rm_pairs_write(const prl_rm_pairs_options *o, FILE *out, int *written);

/* ---------------------------------------------------------------- reward model ----- */

/* A loaded reward model: one resident model, its tokenizer, its calibration (rm.json). */
typedef struct prl_rm prl_rm;

/* Check checkpoint `dir` as a reward model without loading it (a job's check before start):
** the checkpoint verifies, its config has the score head (architectures
** [*ForSequenceClassification], num_labels 1) and it has a tokenizer.json. Errors start with
** `key` (the job key naming it, "reward.model") and name what is wrong. */
prl_status prl_rm_check(const char *dir, const char *key);
prl_status prl_rm_open(prl_rm **out, const char *dir);
void prl_rm_close(prl_rm *rm);
/* The raw scores r of n answers to one prompt: scores[i] of answers[i]. */
prl_status prl_rm_score(prl_rm *rm, const prl_chat_message *prompt, size_t n_prompt,
                        const char *const *answers, int n, double *scores);
/* The calibration of the reward model: mean and standard deviation of its scores over its
** held-out answers at the end of training (rm.json; 0 and 1 without one). */
void prl_rm_calibration(const prl_rm *rm, double *mean, double *std);

/* ---------------------------------------------------------------- training --------- */

typedef struct prl_rm_train_options {
    const char *data;      /* pairs file */
    const char *eval;      /* held-out pairs file, or NULL: every holdout-th problem's pairs */
    const char *ckpt;      /* start from this checkpoint (its model, tokenizer), or */
    const char *model;     /* a fresh model of this config (random init), with */
    const char *tokenizer; /* this tokenizer.json (NULL: the byte tokenizer) */
    const char *out;       /* checkpoint directory to write (must not exist) */
    int steps, batch;      /* optimizer steps, pairs per step */
    int max_len;           /* tokens per answer's chat (longer chats are cut at the front) */
    double lr, margin;     /* AdamW lr; m of the loss (a pair's own "margin" overrides) */
    int holdout;           /* without eval: pairs whose index / 4 is ≡ 0 mod holdout */
    uint64_t seed;
    FILE *log; /* progress lines (NULL: none) */
} prl_rm_train_options;

/* Defaults: steps 300, batch 8, max_len 256, lr 1e-4, margin 0, holdout 10, seed 1. */
void prl_rm_train_options_default(prl_rm_train_options *o);

typedef struct prl_rm_train_result {
    int n_train, n_eval;
    double eval_accuracy; /* held-out pairs with r_chosen > r_rejected */
    double eval_loss;     /* mean −log σ(r_c − r_r − m) over them */
    double train_accuracy_last;
} prl_rm_train_result;

/* Train: loss per pair −log σ(r_chosen − r_rejected − m), mean over a step's pairs, AdamW;
** pairs drawn in a seeded order. Writes `out` (config with the score head, model.safetensors
** with score.weight, tokenizer.json, rm.json: the options, the held-out accuracy and loss,
** per-kind accuracies and the calibration). */
prl_status prl_rm_train(const prl_rm_train_options *o, prl_rm_train_result *res);

/* ---------------------------------------------------------------- judge ------------ */

/* The default rubric: {prompt} and {answer} are replaced by the prompt's last user message
** and the answer; the judge must reply "Score: N" with N an integer 0..10. */
extern const char prl_judge_default_template[];

typedef struct prl_judge prl_judge;
/* Check a judge checkpoint (verifies, has a tokenizer) and a template (holds {answer});
** errors start with key. */
prl_status prl_judge_check(const char *dir, const char *template_text, const char *key);
prl_status prl_judge_open(prl_judge **out, const char *dir, const char *template_text,
                          int max_new_tokens);
void prl_judge_close(prl_judge *j);
/* Grade one answer (greedy). *parsed = 1 and *score = N/10 when the reply has the form, else
** *parsed = 0 and *score = 0; reply (may be NULL) gets the reply's text, cut to n. */
prl_status prl_judge_score(prl_judge *j, const char *prompt, const char *answer, double *score,
                           int *parsed, char *reply, size_t n);
/* The answer form: the last line of text holding "Score:" is "Score: N" (spaces around N
** allowed, N an integer 0..10, nothing else on the line but a final '.'); 1 and *grade = N
** when it is, else 0. */
int prl_judge_parse(const char *text, int *grade);

#endif /* PRL_RM_H */
