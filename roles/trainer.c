/*
** trainer.c — the trainer (`prl role trainer`): takes a step's samples (`train`), runs the GRPO update
** (grpo/) on the policy at the message's version, commits version v+1 as a checkpoint with
** its optimizer state (written under a temporary name, fsynced, renamed: engine/checkpoint.c)
** and announces it with `trained` (docs/pipeline.md).
**
** The trainer keeps no state of its own between steps: every version's checkpoint holds the
** weights, the optimizer and (in state.json) the loss scaler's state, so a restarted trainer
** loads the version it is handed and continues bit for bit. The model computes in the job's
** trainer.precision (docs/grpo.md "Precision and loss scaling").
*/
#include "roles/internal.h"
#include "grpo/grpo.h"
#include "opd/opd.h"

#include <stdlib.h>
#include <string.h>

typedef struct trainer {
    prl_worker role;
    prl_model model;
    prl_optim optim;
    prl_tokenizer *tok;
    prl_model ref;           /* the KL reference (grpo.kl_coef > 0): the run's init policy */
    prl_grpo_precision prec; /* trainer.precision and trainer.loss_scale.* */
    prl_loss_scaler scaler;  /* the scale of the version held (used when prec.scaler_on) */
    int have_model, have_optim, have_ref;
    int64_t version; /* version held (-1: none) */
    char path[1200];
} trainer;

static void unload(trainer *t)
{
    if (t->have_optim) prl_optim_free(&t->optim);
    if (t->have_model) prl_model_free(&t->model);
    prl_tokenizer_free(t->tok);
    t->tok = NULL, t->have_model = t->have_optim = 0, t->version = -1;
}

/* The policy of version v: weights, tokenizer and, past version 0, the optimizer state. */
static prl_status load_version(trainer *t, int64_t v, const char *path)
{
    if (t->version == v && !strcmp(t->path, path)) return PRL_OK;
    unload(t);
    prl_status rc = prl_checkpoint_load_tokenizer(&t->model, path, &t->tok);
    if (rc) return rc;
    t->have_model = 1;
    if ((rc = prl_grpo_precision_from_job(&t->prec, &t->role.job)) ||
        (rc = prl_model_set_precision(&t->model, t->prec.precision)) ||
        (rc = prl_loss_scaler_init(&t->scaler, &t->prec.scaler)))
        return rc;
    prl_optim_config oc;
    if ((rc = prl_grpo_optim_config_from_job(&oc, &t->role.job))) return rc;
    if ((rc = prl_optim_init(&t->optim, &t->model, &oc))) return rc;
    t->have_optim = 1;
    /* version 0 is the init checkpoint: its optimizer and scaler (if any) were another job's */
    char *state = NULL;
    if (v > 0 && (rc = prl_checkpoint_load_optim(&t->optim, &t->model, path, &state))) return rc;
    rc = prl_grpo_scaler_state_parse(&t->scaler, state);
    free(state);
    if (rc) return prl_error_wrap(rc, "%s: ", path);
    t->version = v;
    snprintf(t->path, sizeof t->path, "%s", path);
    prl_worker_log(&t->role, "holding policy version %lld (%s)", (long long)v, path);
    return PRL_OK;
}

/* The step's metrics JSON (malloc'd): grpo's, plus the OPD keys with opd.enabled. */
static char *step_metrics(const prl_grpo_step_stats *st, const prl_opd_stats *ost, int opd)
{
    char *text = prl_grpo_step_stats_to_json(st);
    if (!text || !opd) return text;
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    free(text);
    if (!o) return NULL;
    prl_opd_stats_json(o, ost);
    text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return text;
}

/* One step: GRPO, or with opd.enabled the OPD step on the message's teacher frames. */
static prl_status run_step(trainer *t, const prl_msg_train *x, const prl_grpo_train_config *tc,
                           prl_grpo_step_stats *st, prl_opd_stats *ost)
{
    if (!x->has_teachers) return prl_grpo_train_step(&t->model, &t->optim, &x->batch, tc, st);
    prl_opd_config oc;
    prl_status rc = prl_opd_config_from_job(&oc, &t->role.job);
    if (rc) return rc;
    return prl_opd_train_step(&t->model, &t->optim, &x->batch, &x->teachers, &oc, tc, st, ost);
}

/* The train message of m: with opd.enabled its teacher frames (opd.topk of them) too. */
static prl_status decode_train(const trainer *t, const prl_bus_msg *m, prl_msg_train *x)
{
    memset(x, 0, sizeof *x);
    int topk = -1;
    if (t->role.job.opd_enabled) {
        prl_opd_config oc;
        prl_status rc = prl_opd_config_from_job(&oc, &t->role.job);
        if (rc) return rc;
        topk = oc.topk;
    }
    return prl_msg_train_decode(m, topk, x);
}

/* The training configuration of the step: the job's, the KL reference, the loss scaler. */
static prl_status step_config(trainer *t, prl_grpo_train_config *tc)
{
    prl_status rc = prl_grpo_train_config_from_job(tc, &t->role.job);
    if (!rc && tc->kl_coef > 0 && !t->have_ref) {
        if ((rc = prl_checkpoint_load(&t->ref, t->role.job.init)) == PRL_OK) t->have_ref = 1;
        else rc = prl_error_wrap(rc, "grpo.kl_coef > 0 needs the reference policy (model.init): ");
    }
    if (!rc && tc->kl_coef > 0) tc->ref = &t->ref;
    if (!rc && tc->kl_coef > 0) rc = prl_model_set_precision(&t->ref, t->prec.precision);
    if (!rc && t->prec.scaler_on) tc->scaler = &t->scaler;
    return rc;
}

/* Announce version v+1 at dir with the step's metrics. */
static prl_status send_trained(trainer *t, const prl_msg_train *x, const char *dir, double t0,
                               const prl_grpo_step_stats *st, const prl_opd_stats *ost)
{
    uint64_t sum = 0; /* of the files as saved: the controller checks the same bytes */
    prl_status rc = prl_checkpoint_weights_hash(dir, 0, &sum);
    if (rc) return rc;
    char *metrics = step_metrics(st, ost, t->role.job.opd_enabled);
    if (!metrics) return prl_error_set(PRL_ERR_NOMEM, "metrics");
    prl_msg_trained out = {.lease = x->lease,
                           .step = x->step,
                           .version = x->policy_version + 1,
                           .path = dir,
                           .ckpt_checksum = sum,
                           .train_us = (uint64_t)((prl_now() - t0) * 1e6),
                           .metrics = metrics};
    prl_bus_msg m;
    rc = prl_msg_trained_encode(&out, t->role.run, ++t->role.next_id, &m);
    free(metrics);
    return rc ? rc : prl_worker_send(&t->role, &m);
}

static prl_status train(void *ctx, prl_worker *role, const prl_bus_msg *m)
{
    trainer *t = ctx;
    (void)role;
    double t0 = prl_now();
    prl_msg_train x;
    prl_status rc = decode_train(t, m, &x);
    if (!rc) rc = load_version(t, (int64_t)x.policy_version, x.path);
    prl_grpo_train_config tc;
    if (!rc) rc = step_config(t, &tc);
    prl_grpo_step_stats st;
    prl_opd_stats ost;
    memset(&st, 0, sizeof st), memset(&ost, 0, sizeof ost);
    if (!rc && x.batch.n > 0) rc = run_step(t, &x, &tc, &st, &ost);
    char dir[1200], state[600], scaler[200];
    prl_job_ckpt_dir(t->role.run_dir, (int64_t)x.policy_version + 1, dir, sizeof dir);
    prl_grpo_scaler_state_format(t->prec.scaler_on ? &t->scaler : NULL, scaler, sizeof scaler);
    snprintf(state, sizeof state,
             "{\"run\": \"%s\", \"version\": %llu, \"step\": %llu, "
             "\"loss_scaler\": %s}",
             t->role.run, (unsigned long long)x.policy_version + 1, (unsigned long long)x.step,
             scaler);
    if (!rc) rc = prl_checkpoint_save(&t->model, &t->optim, state, t->tok, dir);
    if (rc) {
        unload(t); /* the weights may be half-updated: reload before the next try */
        prl_msg_train_free(&x);
        return rc;
    }
    t->version = (int64_t)x.policy_version + 1;
    snprintf(t->path, sizeof t->path, "%s", dir);
    rc = send_trained(t, &x, dir, t0, &st, &ost);
    if (!rc)
        prl_worker_log(&t->role,
                       "step %llu: version %llu, %d samples, loss %.4f, reward %.3f, %.1f s",
                       (unsigned long long)x.step, (unsigned long long)x.policy_version + 1,
                       st.samples, st.loss, st.reward_mean, prl_now() - t0);
    prl_msg_train_free(&x);
    return rc;
}

prl_status prl_role_trainer_run(const prl_worker_options *o)
{
    trainer t;
    memset(&t, 0, sizeof t);
    t.version = -1;
    prl_status rc = prl_worker_join(&t.role, "trainer", o);
    if (rc) return rc;
    rc = prl_worker_serve(&t.role, "train", train, &t);
    unload(&t);
    if (t.have_ref) prl_model_free(&t.ref);
    prl_worker_leave(&t.role);
    return rc;
}
