/*
** recipe.h — the SFT base recipe (configs/sft-base.json, docs/recipes.md): which demos to
** generate (per domain and difficulty), the tokenizer, the model config and the SFT
** hyper-parameters, as one JSON file validated through the key table of job/keys.h.
**
** `prl sft --config FILE` runs it: demos -> tokenizer -> SFT into <run.dir>/ckpt, and
** records the resolved recipe and its hash in <run.dir> so that a second run with the same
** recipe is a no-op. Ownership: the struct owns its strings (prl_sft_recipe_free).
*/
#ifndef PRL_JOB_RECIPE_H
#define PRL_JOB_RECIPE_H

#include "engine/engine.h"

enum { PRL_RECIPE_DOMAINS = 4, PRL_RECIPE_LEVELS = 3 };

typedef struct prl_sft_recipe {
    /* run */
    char *name, *dir;
    uint64_t seed; /* demos, init and data order */
    /* model */
    char *model_config; /* a config.json path */
    char *init_from;    /* "" or a checkpoint whose weights start the run (its
                                    ** model plus, in model_config, new DSA layers) */
    /* dsa: post-hoc sparsification (docs/recipes.md) */
    int dsa_warmup_steps; /* indexer warm-up steps before sft.steps (0 = none) */
    double dsa_warmup_lr; /* their AdamW learning rate (constant) */
    int dsa_dense_steps;  /* from scratch: the first N of sft.steps in the dense stage */
    /* tokenizer */
    int vocab_size;     /* BPE vocabulary trained on the demos (<= model vocab) */
    int special_tokens; /* demos' <|tool_call|> ... strings encode as special ids */
    /* demos: problems per [domain][difficulty - 1]; domains in prl_task_domain order */
    int demos[PRL_RECIPE_DOMAINS][PRL_RECIPE_LEVELS];
    double error_rate, tool_rate; /* tool_rate < 0: the reasoning default per difficulty */
    double think_rate; /* < 0: no modes (the demos of old); in [0, 1]: the share of think demos,
                       ** the rest no-think ones (docs/recipes.md "Modes") */
    /* sft */
    int steps, batch, seq, accum, group, warmup;
    int pack;        /* sft.pack: packed rows (prl_sft_config.pack; needs sft.group 0) */
    int mask_errors; /* mask the assistant turns the environment rejected (docs/recipes.md) */
    char *optimizer, *schedule;
    double lr, min_lr_ratio, weight_decay, grad_clip, expert_clip;
} prl_sft_recipe;

prl_status prl_sft_recipe_default(prl_sft_recipe *r);
void prl_sft_recipe_free(prl_sft_recipe *r);
/* Apply a JSON object text over *r (absent keys keep their values), then check it; errors
** name `source` and the key. */
prl_status prl_sft_recipe_parse(prl_sft_recipe *r, const char *json_text, const char *source);
prl_status prl_sft_recipe_load(prl_sft_recipe *r, const char *path);
/* Cross-key rules: at least one demo, seq >= 2, warmup and dsa.dense_steps below steps. */
prl_status prl_sft_recipe_check(const prl_sft_recipe *r, const char *source);
/* The resolved recipe as JSON text (malloc'd, every key, table order). */
char *prl_sft_recipe_to_json(const prl_sft_recipe *r);

#endif /* PRL_JOB_RECIPE_H */
