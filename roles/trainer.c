/*
** trainer.c — the trainer (`prl role trainer`): takes a step's samples (`train`), runs the GRPO update
** (grpo/) on the policy at the message's version, commits version v+1 as a checkpoint with
** its optimizer state (written under a temporary name, fsynced, renamed: engine/checkpoint.c)
** and announces it with `trained` (docs/pipeline.md).
**
** The trainer keeps no state of its own between steps: every version's checkpoint holds the
** weights, the optimizer and (in state.json) the loss scaler's state, so a restarted trainer
** loads the version it is handed and continues bit for bit. The model computes in the job's
** trainer.precision (docs/grpo.md "Precision and loss scaling"). With --ranks N (trainer.ranks)
** the process is one rank of an MPI group: rank 0 is this trainer, the others follow its
** steps and form the gradients of their share of the micro-batches (the ranks section below).
*/
#include "roles/internal.h"
#include "grpo/grpo.h"
#include "opd/opd.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    prl_dp dp;          /* trainer.ranks > 1: this process's rank in the group */
    prl_grpo_comm comm; /* the group for prl_grpo_train_step (comm.size 1: one process) */
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
    if (t->comm.size > 1) tc->comm = &t->comm;
    return rc;
}

/* ---------------------------------------------------------------- ranks -------------- */
/* trainer.ranks > 1 (docs/scale-out.md "Trainer ranks"): rank 0 is the trainer above; before
** each step it hands the other ranks the command, the job, the `train` message, the policy
** and the loss scaler (and the KL reference), then every rank runs the step on its share of
** the micro-batches (grpo/reduce.h). A rank that fails between collective calls cannot
** leave the others waiting: it ends the group (the launcher starts the trainer again). */

enum { CMD_QUIT = 0, CMD_STEP = 1 };

static prl_status bcast_cmd(trainer *t, int32_t *cmd)
{
    return prl_dp_bcast(&t->dp, cmd, sizeof *cmd);
}

/* What every rank needs for a step, in one order on every rank (rank 0: sends m). */
static prl_status share_step(trainer *t, const prl_bus_msg *m, prl_bus_msg *out, int kl)
{
    char *job = t->dp.rank == 0 ? prl_job_config_to_json(&t->role.job) : NULL;
    if (t->dp.rank == 0 && !job) return prl_error_set(PRL_ERR_NOMEM, "job config text");
    prl_status rc = prl_ranks_bcast_text(&t->dp, &job);
    if (!rc && t->dp.rank != 0) {
        prl_job_config j;
        prl_job_config_default(&j);
        if ((rc = prl_job_config_parse(&j, job, "rank 0's job config")) == PRL_OK) {
            prl_job_config_free(&t->role.job);
            t->role.job = j;
        } else {
            prl_job_config_free(&j);
        }
    }
    free(job);
    if (!rc) rc = prl_ranks_bcast_msg(&t->dp, m, out);
    if (!rc) rc = prl_ranks_bcast_model(&t->dp, &t->model, &t->have_model);
    if (!rc) rc = prl_dp_bcast(&t->dp, &t->scaler, sizeof t->scaler);
    if (!rc && kl) rc = prl_ranks_bcast_model(&t->dp, &t->ref, &t->have_ref);
    return rc;
}

/* Rank 0, before its step: the step to every other rank. */
static prl_status lead_step(trainer *t, const prl_bus_msg *m, const prl_grpo_train_config *tc)
{
    int32_t cmd = CMD_STEP, kl = tc->kl_coef > 0;
    prl_status rc = bcast_cmd(t, &cmd);
    if (!rc) rc = prl_dp_bcast(&t->dp, &kl, sizeof kl);
    if (!rc) rc = share_step(t, m, NULL, kl);
    if (rc) {
        prl_worker_log(&t->role, "ranks: %s: ending the group", prl_error_message());
        prl_dp_abort(&t->dp, 1);
    }
    return rc;
}

/* A rank > 0's model settings of the job: precision, loss scaler config, optimizer (which
** only rank 0 steps, but the step's interface takes one). */
static prl_status follower_setup(trainer *t)
{
    prl_loss_scaler held = t->scaler; /* rank 0's state, received in share_step */
    prl_status rc = prl_grpo_precision_from_job(&t->prec, &t->role.job);
    if (!rc) rc = prl_model_set_precision(&t->model, t->prec.precision);
    if (!rc) rc = prl_loss_scaler_init(&t->scaler, &t->prec.scaler);
    t->scaler = held;
    if (!rc && t->have_ref) rc = prl_model_set_precision(&t->ref, t->prec.precision);
    if (rc || t->have_optim) return rc;
    prl_optim_config oc;
    if ((rc = prl_grpo_optim_config_from_job(&oc, &t->role.job))) return rc;
    if ((rc = prl_optim_init(&t->optim, &t->model, &oc)) == PRL_OK) t->have_optim = 1;
    return rc;
}

/* A rank > 0's step: receive it, then run it with rank 0. */
static prl_status follow_step(trainer *t)
{
    int32_t kl = 0;
    prl_bus_msg m;
    memset(&m, 0, sizeof m);
    prl_status rc = prl_dp_bcast(&t->dp, &kl, sizeof kl);
    if (!rc && t->have_optim) prl_optim_free(&t->optim), t->have_optim = 0; /* sized per model */
    if (!rc) rc = share_step(t, NULL, &m, kl);
    if (!rc) rc = follower_setup(t);
    prl_msg_train x;
    memset(&x, 0, sizeof x);
    if (!rc) rc = decode_train(t, &m, &x);
    prl_bus_msg_free(&m);
    if (rc) { /* rank 0 is about to run the step: it must not wait for this rank */
        prl_worker_log(&t->role, "%s: ending the group", prl_error_message());
        prl_dp_abort(&t->dp, 1);
        return rc;
    }
    prl_grpo_train_config tc;
    rc = prl_grpo_train_config_from_job(&tc, &t->role.job);
    if (!rc && kl) tc.ref = &t->ref;
    if (!rc && t->prec.scaler_on) tc.scaler = &t->scaler;
    tc.comm = &t->comm;
    prl_grpo_step_stats st;
    prl_opd_stats ost;
    memset(&st, 0, sizeof st), memset(&ost, 0, sizeof ost);
    /* a config error here is rank 0's too, before its step: nothing to join */
    if (!rc) rc = run_step(t, &x, &tc, &st, &ost);
    prl_msg_train_free(&x);
    return rc;
}

/* A rank > 0 until rank 0 says quit. Its first line names its host and pid: with
** trainer.hosts the ranks run elsewhere, and this is where a user sees which. */
static prl_status follow(trainer *t)
{
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    prl_worker_log(&t->role, "rank %d of %d: waiting for rank 0's steps (host %s, pid %d)",
                   t->dp.rank, t->dp.size, host, (int)getpid());
    for (;;) {
        int32_t cmd = CMD_QUIT;
        prl_status rc = bcast_cmd(t, &cmd);
        if (rc || cmd == CMD_QUIT) return rc;
        if ((rc = follow_step(t))) prl_worker_log(&t->role, "step failed: %s", prl_error_message());
    }
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
    if (!rc && x.batch.n > 0 && t->comm.size > 1) rc = lead_step(t, m, &tc);
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

/* --ranks N > 1: this process's rank of the group mpirun (or srun) started. */
static prl_status join_group(trainer *t, int ranks)
{
    prl_status rc = prl_dp_init(&t->dp, NULL, NULL);
    if (rc) return prl_error_wrap(rc, "trainer.ranks = %d: ", ranks);
    if (t->dp.size != ranks)
        return prl_error_set(PRL_ERR_ARG,
                             "trainer.ranks = %d but the launcher started %d ranks "
                             "(mpirun -n / srun -n must match --ranks)",
                             ranks, t->dp.size);
    t->comm = (prl_grpo_comm){.rank = t->dp.rank,
                              .size = t->dp.size,
                              .ctx = &t->dp,
                              .send = prl_dp_send,
                              .recv = prl_dp_recv,
                              .bcast = prl_dp_bcast};
    return PRL_OK;
}

/* Rank 0 (or the only process): the bus-facing trainer; its last word to the other ranks
** is quit. */
static prl_status lead(trainer *t, const prl_worker_options *o)
{
    prl_status rc = prl_worker_join(&t->role, "trainer", o);
    if (!rc) rc = prl_worker_serve(&t->role, "train", train, t);
    int32_t cmd = CMD_QUIT;
    if (t->comm.size > 1 && bcast_cmd(t, &cmd))
        prl_worker_log(&t->role, "ranks: quit not sent: %s", prl_error_message());
    if (t->role.ctl) prl_worker_leave(&t->role);
    return rc;
}

prl_status prl_role_trainer_run(const prl_worker_options *o)
{
    trainer t;
    memset(&t, 0, sizeof t);
    t.version = -1;
    t.comm = (prl_grpo_comm){.size = 1};
    prl_status rc = o->ranks > 1 ? join_group(&t, o->ranks) : PRL_OK;
    if (!rc && t.dp.rank > 0) {
        snprintf(t.role.worker, sizeof t.role.worker, "%s.rank%d", o->name, t.dp.rank);
        prl_job_config_default(&t.role.job);
        rc = follow(&t);
        prl_job_config_free(&t.role.job);
    } else if (!rc) {
        rc = lead(&t, o);
    }
    unload(&t);
    if (t.have_ref) prl_model_free(&t.ref);
    prl_dp_finalize(&t.dp);
    return rc;
}
