/*
** recipe.c — the SFT base recipe's key table and its cross-key rules (recipe.h,
** docs/recipes.md).
*/
#include "job/recipe.h"
#include "job/job.h"
#include "job/keys.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define F(field) offsetof(prl_sft_recipe, field)
#define DEMOS(dom, d, name, def)                                                                   \
    {                                                                                              \
        "demos." dom ".d" #d, PRL_KEY_INT, F(demos[name][d - 1]), 0, 1e6, def, NULL                \
    }

static const prl_key_spec keys[] = {
    {"run.name", PRL_KEY_STR, F(name), 0, 0, "\"sft-base\"", NULL},
    {"run.dir", PRL_KEY_STR, F(dir), 0, 0, "\"runs/sft-base\"", NULL},
    {"run.seed", PRL_KEY_U64, F(seed), 0, 1e18, "1", NULL},
    {"model.config", PRL_KEY_STR, F(model_config), 0, 0, "\"configs/models/tiny.json\"", NULL},
    {"model.init_from", PRL_KEY_STR, F(init_from), 0, 0, "\"\"", NULL},
    {"dsa.warmup_steps", PRL_KEY_INT, F(dsa_warmup_steps), 0, 1e8, "0", NULL},
    {"dsa.warmup_lr", PRL_KEY_REAL, F(dsa_warmup_lr), 1e-12, 10, "1e-3", NULL},
    {"dsa.dense_steps", PRL_KEY_INT, F(dsa_dense_steps), 0, 1e8, "0", NULL},
    {"tokenizer.vocab_size", PRL_KEY_INT, F(vocab_size), 272, 1 << 20, "4096", NULL},
    {"tokenizer.special_tokens", PRL_KEY_BOOL, F(special_tokens), 0, 1, "true", NULL},
    DEMOS("reasoning", 1, 0, "0"),
    DEMOS("reasoning", 2, 0, "0"),
    DEMOS("reasoning", 3, 0, "0"),
    DEMOS("general", 1, 1, "0"),
    DEMOS("general", 2, 1, "0"),
    DEMOS("general", 3, 1, "0"),
    DEMOS("agent", 1, 2, "0"),
    DEMOS("agent", 2, 2, "0"),
    DEMOS("agent", 3, 2, "0"),
    DEMOS("coding", 1, 3, "0"),
    DEMOS("coding", 2, 3, "0"),
    DEMOS("coding", 3, 3, "0"),
    {"demos.error_rate", PRL_KEY_REAL, F(error_rate), 0, 1, "0", NULL},
    {"demos.tool_rate", PRL_KEY_REAL, F(tool_rate), -1, 1, "-1", NULL},
    {"demos.think_rate", PRL_KEY_REAL, F(think_rate), -1, 1, "-1", NULL},
    {"sft.steps", PRL_KEY_INT, F(steps), 1, 1e8, "200", NULL},
    {"sft.batch", PRL_KEY_INT, F(batch), 1, 4096, "16", NULL},
    {"sft.seq", PRL_KEY_INT, F(seq), 2, 1 << 20, "256", NULL},
    {"sft.accum", PRL_KEY_INT, F(accum), 1, 4096, "1", NULL},
    {"sft.group", PRL_KEY_INT, F(group), 0, 1 << 20, "32", NULL},
    {"sft.pack", PRL_KEY_BOOL, F(pack), 0, 1, "false", NULL},
    {"sft.optimizer", PRL_KEY_STR, F(optimizer), 0, 0, "\"adamw\"", "adamw|muon"},
    {"sft.lr", PRL_KEY_REAL, F(lr), 1e-12, 10, "3e-3", NULL},
    {"sft.schedule", PRL_KEY_STR, F(schedule), 0, 0, "\"cosine\"", "cosine|constant"},
    {"sft.warmup", PRL_KEY_INT, F(warmup), 0, 1e8, "20", NULL},
    {"sft.min_lr_ratio", PRL_KEY_REAL, F(min_lr_ratio), 0, 1, "0.1", NULL},
    {"sft.weight_decay", PRL_KEY_REAL, F(weight_decay), 0, 10, "0.1", NULL},
    {"sft.grad_clip", PRL_KEY_REAL, F(grad_clip), 0, 1e9, "1.0", NULL},
    {"sft.expert_clip", PRL_KEY_REAL, F(expert_clip), 0, 1e9, "0", NULL},
    {"sft.mask_errors", PRL_KEY_BOOL, F(mask_errors), 0, 1, "false", NULL},
};
static prl_status check(const void *r, const char *source)
{
    return prl_sft_recipe_check(r, source);
}
static const prl_key_table table = {keys, sizeof keys / sizeof keys[0], sizeof(prl_sft_recipe),
                                    check};

prl_status prl_sft_recipe_default(prl_sft_recipe *r) { return prl_keys_default(&table, r); }
void prl_sft_recipe_free(prl_sft_recipe *r) { prl_keys_free(&table, r); }
prl_status prl_sft_recipe_parse(prl_sft_recipe *r, const char *json_text, const char *source)
{
    return prl_keys_parse(&table, r, json_text, source);
}
prl_status prl_sft_recipe_load(prl_sft_recipe *r, const char *path)
{
    return prl_keys_load(&table, r, path);
}
char *prl_sft_recipe_to_json(const prl_sft_recipe *r) { return prl_keys_to_json(&table, r); }

prl_status prl_sft_recipe_check(const prl_sft_recipe *r, const char *source)
{
    long total = 0;
    for (int d = 0; d < PRL_RECIPE_DOMAINS; d++)
        for (int k = 0; k < PRL_RECIPE_LEVELS; k++) total += r->demos[d][k];
    if (total == 0)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'demos': no demonstrations (every "
                             "demos.<domain>.d<k> is 0)",
                             source);
    if (r->warmup >= r->steps)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'sft.warmup' = %d must be below sft.steps "
                             "= %d",
                             source, r->warmup, r->steps);
    if (r->dsa_dense_steps > 0 && r->dsa_dense_steps >= r->steps)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'dsa.dense_steps' = %d must be below "
                             "sft.steps = %d (the sparse stage needs a step)",
                             source, r->dsa_dense_steps, r->steps);
    if (r->pack && r->group > 0)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'sft.pack' needs sft.group = 0 (it is %d): packed rows are "
                             "seq wide",
                             source, r->group);
    if (!*r->dir)
        return prl_error_set(PRL_ERR_CONFIG, "%s: key 'run.dir' must not be empty", source);
    return prl_job_name_check(source, "run.name", r->name);
}
