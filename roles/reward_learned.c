/*
** reward_learned.c — learned rewards in the reward worker (roles.h; docs/rewards.md "Reward
** models"): reward.model (a Bradley–Terry reward model, one resident model per worker, scored
** on the train path) and reward.judge (a generative judge on the infer path) mixed with the
** verifiers' rule score:
**
**     score = (1 − wm − wj)·rule + wm·σ(r̃) + wj·judge,   r̃ = (r − μ)/s with
**             reward.model_normalize (μ, s: the reward model's held-out calibration), else r
**
** and 0 whenever the rule says so (a required check failed: a gate, the monitors, an answer
** cut off). A judge reply without its answer form is a grade of 0, the flag judge_unparsed
** and a count in the worker's log — never an error.
*/
#include "roles/internal.h"
#include "rm/rm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct prl_reward_learned {
    prl_rm *rm;
    prl_judge *judge;
    double wm, wj;
    int normalize;
    uint64_t judged, unparsed;
};

prl_status prl_reward_learned_check(const prl_job_config *job)
{
    prl_status rc = PRL_OK;
    if (*job->reward_model) rc = prl_rm_check(job->reward_model, "key 'reward.model'");
    if (!rc && *job->reward_judge)
        rc = prl_judge_check(job->reward_judge,
                             *job->reward_judge_template ? job->reward_judge_template : NULL,
                             "key 'reward.judge'");
    return rc;
}

prl_status prl_reward_learned_open(prl_reward_learned **out, const prl_job_config *job)
{
    *out = NULL;
    if (!*job->reward_model && !*job->reward_judge) return PRL_OK;
    prl_reward_learned *l = calloc(1, sizeof *l);
    if (!l) return prl_error_set(PRL_ERR_NOMEM, "learned rewards");
    prl_status rc = prl_reward_learned_check(job);
    if (!rc && *job->reward_model) {
        l->wm = job->reward_model_weight, l->normalize = job->reward_model_normalize;
        rc = prl_rm_open(&l->rm, job->reward_model);
    }
    if (!rc && *job->reward_judge) {
        l->wj = job->reward_judge_weight;
        rc = prl_judge_open(&l->judge, job->reward_judge,
                            *job->reward_judge_template ? job->reward_judge_template : NULL,
                            job->reward_judge_tokens);
    }
    if (rc) {
        prl_reward_learned_close(l);
        return rc;
    }
    *out = l;
    return PRL_OK;
}

void prl_reward_learned_close(prl_reward_learned *l)
{
    if (!l) return;
    prl_rm_close(l->rm);
    prl_judge_close(l->judge);
    free(l);
}

void prl_reward_learned_counts(const prl_reward_learned *l, uint64_t *judged, uint64_t *unparsed)
{
    *judged = l ? l->judged : 0;
    *unparsed = l ? l->unparsed : 0;
}

static int required_failed(const prl_reward_result *res)
{
    for (int i = 0; i < res->n_checks; i++)
        if (res->checks[i].required && !res->checks[i].passed) return 1;
    return 0;
}

static double sigmoid(double x) { return 1 / (1 + exp(-x)); }

/* The reward model's σ(r̃) of the answer, and its check. */
static prl_status model_part(prl_reward_learned *l, const prl_chat_message *prompt, size_t n,
                             const char *answer, prl_reward_result *res, double *part)
{
    double r;
    prl_status rc = prl_rm_score(l->rm, prompt, n, &answer, 1, &r);
    if (rc) return rc;
    double mu = 0, sd = 1;
    if (l->normalize) prl_rm_calibration(l->rm, &mu, &sd);
    *part = sigmoid((r - mu) / sd);
    if (res->n_checks < PRL_REWARD_MAX_CHECKS) {
        prl_reward_check *c = &res->checks[res->n_checks++];
        snprintf(c->name, sizeof c->name, "reward_model");
        c->passed = 1, c->weight = 0, c->required = 0;
        snprintf(c->detail, sizeof c->detail, "r = %.4f, sigmoid%s = %.4f, weight %.2f", r,
                 l->normalize ? "((r - mean) / std)" : "(r)", *part, l->wm);
    }
    return PRL_OK;
}

/* The judge's grade of the answer, and its check. */
static prl_status judge_part(prl_reward_learned *l, const char *prompt, const char *answer,
                             prl_reward_result *res, double *part)
{
    char reply[120];
    int parsed;
    prl_status rc = prl_judge_score(l->judge, prompt, answer, part, &parsed, reply, sizeof reply);
    if (rc) return rc;
    l->judged++;
    if (!parsed) l->unparsed++, res->flags |= PRL_REWARD_JUDGE_UNPARSED;
    for (char *p = reply; *p; p++)
        if (*p == '\n' || *p == '\t') *p = ' ';
    if (res->n_checks < PRL_REWARD_MAX_CHECKS) {
        prl_reward_check *c = &res->checks[res->n_checks++];
        snprintf(c->name, sizeof c->name, "judge");
        c->passed = parsed, c->weight = 0, c->required = 0;
        snprintf(c->detail, sizeof c->detail, "%s %.2f, weight %.2f: '%.100s'",
                 parsed ? "grade" : "unparseable reply, grade", *part, l->wj, reply);
    }
    return PRL_OK;
}

prl_status prl_reward_learned_mix(prl_reward_learned *l, const char *task_json,
                                  const prl_chat_message *turns, size_t n_turns,
                                  prl_reward_result *res, double *rule)
{
    *rule = res->score;
    if (!l || required_failed(res)) return PRL_OK; /* gates and monitors: 0 stays 0 */
    const char *answer = "";
    for (size_t i = 0; i < n_turns; i++)
        if (turns[i].role && !strcmp(turns[i].role, "assistant")) answer = turns[i].content;
    json_error_t je;
    json_t *task = json_loads(task_json, 0, &je);
    prl_chat_message *prompt = NULL;
    size_t n = 0;
    prl_status rc = task
                        ? prl_chat_from_json(json_object_get(task, "messages"), "task", &prompt, &n)
                        : prl_error_set(PRL_ERR_FORMAT, "task: invalid JSON: %s", je.text);
    double pm = 0, pj = 0;
    if (!rc && l->rm) rc = model_part(l, prompt, n, answer, res, &pm);
    const char *user = "";
    for (size_t i = 0; !rc && i < n; i++)
        if (!strcmp(prompt[i].role, "user")) user = prompt[i].content;
    if (!rc && l->judge) rc = judge_part(l, user, answer, res, &pj);
    double wm = l->rm ? l->wm : 0, wj = l->judge ? l->wj : 0;
    if (!rc) res->score = (1 - wm - wj) * *rule + wm * pm + wj * pj;
    free(prompt);
    json_decref(task);
    return rc;
}
