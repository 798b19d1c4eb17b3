/*
** judge.c — the generative judge: a checkpoint with a tokenizer reads a rubric prompt (the
** template with {prompt} and {answer} filled in), answers greedily on the infer path, and its
** grade is parsed from the fixed form "Score: N" (N = 0..10, the score is N / 10). A reply
** without the form is a grade of 0 that the caller counts, never an error.
*/
#include "rm/rm.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char prl_judge_default_template[] =
    "Grade the answer to the instruction below from 0 (ignores it, repeats words, is cut off) "
    "to 10 (follows every instruction, reads naturally).\n\nInstruction: {prompt}\n\nAnswer: "
    "{answer}\n\nReply with one line: Score: N";

struct prl_judge {
    prl_model m;
    prl_tokenizer *tok;
    prl_infer *e;
    char *template_text;
    int max_new_tokens;
};

prl_status prl_judge_check(const char *dir, const char *template_text, const char *key)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, R_OK) != 0)
        return prl_error_set(PRL_ERR_CONFIG, "%s: %s has no tokenizer.json", key, dir);
    prl_status rc = prl_checkpoint_verify(dir);
    if (rc) return prl_error_wrap(rc, "%s: %s: ", key, dir);
    if (template_text && !strstr(template_text, "{answer}"))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: the judge's template has no {answer} (the text to grade)", key);
    return PRL_OK;
}

prl_status prl_judge_open(prl_judge **out, const char *dir, const char *template_text,
                          int max_new_tokens)
{
    *out = NULL;
    prl_status rc = prl_judge_check(dir, template_text, "reward.judge");
    if (rc) return rc;
    prl_judge *j = calloc(1, sizeof *j);
    if (!j) return prl_error_set(PRL_ERR_NOMEM, "judge");
    j->max_new_tokens = max_new_tokens > 0 ? max_new_tokens : 16;
    j->template_text = strdup(template_text ? template_text : prl_judge_default_template);
    prl_infer_options io;
    prl_infer_options_default(&io);
    if (!j->template_text) rc = prl_error_set(PRL_ERR_NOMEM, "judge");
    if (!rc) rc = prl_checkpoint_load_tokenizer(&j->m, dir, &j->tok);
    if (!rc) rc = prl_infer_init(&j->e, &j->m, &io);
    if (rc) {
        prl_judge_close(j);
        return rc;
    }
    *out = j;
    return PRL_OK;
}

void prl_judge_close(prl_judge *j)
{
    if (!j) return;
    prl_infer_free(j->e);
    if (j->tok) prl_model_free(&j->m); /* loaded (the tokenizer comes with the model) */
    prl_tokenizer_free(j->tok);
    free(j->template_text);
    free(j);
}

/* The template with every {prompt} and {answer} replaced (malloc'd). */
static char *fill(const char *tpl, const char *prompt, const char *answer)
{
    size_t cap = strlen(tpl) + 1, n = 0;
    for (const char *p = tpl; (p = strchr(p, '{')) != NULL; p++)
        cap += strlen(prompt) + strlen(answer);
    char *out = malloc(cap);
    if (!out) return NULL;
    for (const char *p = tpl; *p;) {
        const char *v = !strncmp(p, "{prompt}", 8)   ? prompt
                        : !strncmp(p, "{answer}", 8) ? answer
                                                     : NULL;
        if (v) {
            memcpy(out + n, v, strlen(v));
            n += strlen(v), p += 8;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = 0;
    return out;
}

int prl_judge_parse(const char *text, int *grade)
{
    const char *line = NULL;
    for (const char *p = text; (p = strstr(p, "Score:")) != NULL; p++) line = p;
    if (!line) return 0;
    const char *p = line + 6;
    while (*p == ' ') p++;
    if (!isdigit((unsigned char)*p)) return 0;
    int v = 0, digits = 0;
    while (isdigit((unsigned char)*p) && digits < 3) v = 10 * v + (*p++ - '0'), digits++;
    if (*p == '.') p++;
    while (*p == ' ' || *p == '\t' || *p == '\r') p++;
    if ((*p && *p != '\n') || v > 10) return 0;
    *grade = v;
    return 1;
}

prl_status prl_judge_score(prl_judge *j, const char *prompt, const char *answer, double *score,
                           int *parsed, char *reply, size_t n)
{
    *score = 0, *parsed = 0;
    if (reply && n) reply[0] = 0;
    char *text = fill(j->template_text, prompt, answer);
    if (!text) return prl_error_set(PRL_ERR_NOMEM, "judge prompt");
    prl_chat_message msg = {"user", text};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    prl_status rc = prl_tokenizer_encode_chat_prompt(j->tok, &msg, 1, 0, &ids, &n_ids);
    free(text);
    if (rc) return rc;
    int ctx = j->m.cfg.max_position_embeddings - j->max_new_tokens;
    int start = (int)n_ids > ctx ? (int)n_ids - ctx : 0; /* a long prompt: keep its end */
    int32_t stop[2];
    prl_sample_params sp;
    prl_sample_params_default(&sp);
    sp.max_new_tokens = j->max_new_tokens;
    sp.n_stop_ids = prl_tokenizer_stop_ids(j->tok, stop), sp.stop_ids = stop;
    sp.vocab_limit = prl_tokenizer_vocab_size(j->tok);
    prl_gen_request q = {.prompt = ids + start, .prompt_len = (int)n_ids - start};
    prl_gen_result r;
    rc = prl_infer_generate(j->e, &q, 1, &sp, &r, NULL, NULL);
    free(ids);
    if (rc) return rc;
    char *out = NULL;
    size_t len = 0;
    rc = prl_tokenizer_decode(j->tok, r.tokens, (size_t)r.n, 0, &out, &len);
    prl_gen_result_free(&r);
    if (rc) return rc;
    int grade = 0;
    *parsed = prl_judge_parse(out, &grade);
    *score = *parsed ? grade / 10.0 : 0;
    if (reply && n) snprintf(reply, n, "%s", out);
    free(out);
    return PRL_OK;
}
