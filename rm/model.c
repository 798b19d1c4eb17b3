/*
** model.c — a reward model at work: the checks before a job starts, loading one resident
** model with its tokenizer and calibration, encoding an answer as its chat, and scoring
** answers on the train path (the score head's value at each chat's last token).
*/
#include "rm/rm_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct prl_rm {
    prl_model m;
    prl_tokenizer *tok;
    double mean, std; /* calibration (state.json "reward_model") */
    int max_len;
};

prl_status rm__encode(const prl_tokenizer *tok, const prl_chat_message *prompt, size_t n_prompt,
                      const char *answer, int max_len, int32_t **ids, int *n)
{
    prl_chat_message *msgs = malloc((n_prompt + 1) * sizeof *msgs);
    if (!msgs) return prl_error_set(PRL_ERR_NOMEM, "reward model input");
    memcpy(msgs, prompt, n_prompt * sizeof *msgs);
    msgs[n_prompt] = (prl_chat_message){"assistant", answer};
    size_t len = 0;
    prl_status rc = prl_tokenizer_encode_chat(tok, msgs, n_prompt + 1, 0, ids, NULL, &len);
    free(msgs);
    if (rc) return rc;
    if ((int)len > max_len) { /* keep the end: the answer and the token the score is read at */
        memmove(*ids, *ids + (len - (size_t)max_len), (size_t)max_len * sizeof **ids);
        len = (size_t)max_len;
    }
    *n = (int)len;
    return PRL_OK;
}

prl_status rm__forward(prl_model *m, int32_t *const *ids, const int *lens, int B, double *scores)
{
    int T = 1;
    for (int i = 0; i < B; i++) T = lens[i] > T ? lens[i] : T;
    int32_t *tokens = calloc((size_t)B * T, sizeof *tokens), *len32 = malloc((size_t)B * 4);
    prl_status rc = tokens && len32 ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "reward model batch");
    for (int i = 0; !rc && i < B; i++) {
        memcpy(tokens + (size_t)i * T, ids[i], (size_t)lens[i] * sizeof *tokens);
        len32[i] = lens[i];
    }
    prl_batch b = {.B = B, .T = T, .tokens = tokens, .lens = len32, .temperature = 1};
    if (!rc) rc = prl_model_logprobs(m, &b, NULL);
    for (int i = 0; !rc && i < B; i++) scores[i] = prl_model_scores(m)[i];
    free(tokens), free(len32);
    return rc;
}

static prl_status need_file(const char *dir, const char *name, const char *key)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (access(path, R_OK) == 0) return PRL_OK;
    return prl_error_set(PRL_ERR_CONFIG, "%s: %s has no %s", key, dir, name);
}

prl_status prl_rm_check(const char *dir, const char *key)
{
    prl_status rc = need_file(dir, "config.json", key);
    if (!rc) rc = need_file(dir, "tokenizer.json", key);
    if (rc) return rc;
    if ((rc = prl_checkpoint_verify(dir))) return prl_error_wrap(rc, "%s: %s: ", key, dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    prl_config cfg;
    if ((rc = prl_config_load(&cfg, path))) return prl_error_wrap(rc, "%s: ", key);
    if (!cfg.score_head)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: %s is not a reward model: its config.json has no score head "
                             "(architectures [\"...ForSequenceClassification\"], num_labels 1; "
                             "make one with prl rm train)",
                             key, dir);
    return PRL_OK;
}

/* The calibration saved by prl rm train in state.json ("run": {"reward_model": {"mean",
** "std", "options": {"max_len"}}}). */
static void read_calibration(prl_rm *rm, const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/state.json", dir);
    json_error_t je;
    json_t *st = json_load_file(path, 0, &je);
    json_t *r = json_object_get(json_object_get(st, "run"), "reward_model"); /* save's "run" */
    rm->mean = json_number_value(json_object_get(r, "mean"));
    rm->std = json_number_value(json_object_get(r, "std"));
    if (!(rm->std > 0)) rm->mean = 0, rm->std = 1;
    json_t *ml = json_object_get(json_object_get(r, "options"), "max_len");
    rm->max_len = json_is_integer(ml) ? (int)json_integer_value(ml) : 256;
    json_decref(st);
}

prl_status prl_rm_open(prl_rm **out, const char *dir)
{
    *out = NULL;
    prl_status rc = prl_rm_check(dir, "reward model");
    if (rc) return rc;
    prl_rm *rm = calloc(1, sizeof *rm);
    if (!rm) return prl_error_set(PRL_ERR_NOMEM, "reward model");
    if ((rc = prl_checkpoint_load_tokenizer(&rm->m, dir, &rm->tok))) {
        free(rm);
        return rc;
    }
    read_calibration(rm, dir);
    if (rm->max_len > rm->m.cfg.max_position_embeddings)
        rm->max_len = rm->m.cfg.max_position_embeddings;
    *out = rm;
    return PRL_OK;
}

void prl_rm_close(prl_rm *rm)
{
    if (!rm) return;
    prl_model_free(&rm->m);
    prl_tokenizer_free(rm->tok);
    free(rm);
}

void prl_rm_calibration(const prl_rm *rm, double *mean, double *std)
{
    *mean = rm->mean;
    *std = rm->std;
}

prl_status prl_rm_score(prl_rm *rm, const prl_chat_message *prompt, size_t n_prompt,
                        const char *const *answers, int n, double *scores)
{
    int32_t **ids = calloc((size_t)n, sizeof *ids);
    int *lens = calloc((size_t)n, sizeof *lens);
    prl_status rc = ids && lens ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "reward model scores");
    for (int i = 0; !rc && i < n; i++)
        rc = rm__encode(rm->tok, prompt, n_prompt, answers[i], rm->max_len, &ids[i], &lens[i]);
    if (!rc) rc = rm__forward(&rm->m, ids, lens, n, scores);
    for (int i = 0; ids && i < n; i++) free(ids[i]);
    free(ids), free(lens);
    return rc;
}
