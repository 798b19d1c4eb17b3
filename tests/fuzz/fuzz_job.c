/*
** fuzz_job.c — the configuration files through the one key table: a job config
** (prl_job_config_parse over the defaults, then validation) and an SFT recipe.
*/
#include "job/job.h"
#include "job/recipe.h"
#include "tests/fuzz/fuzz.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    prl_job_config c;
    if (prl_job_config_default(&c) == PRL_OK) {
        if (prl_job_config_parse(&c, text, "fuzz") == PRL_OK) free(prl_job_config_to_json(&c));
        prl_job_config_free(&c);
    }
    prl_sft_recipe r;
    if (prl_sft_recipe_default(&r) == PRL_OK) {
        if (prl_sft_recipe_parse(&r, text, "fuzz") == PRL_OK) free(prl_sft_recipe_to_json(&r));
        prl_sft_recipe_free(&r);
    }
    free(text);
    return 0;
}
