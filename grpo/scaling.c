/*
** scaling.c — the trainer's arithmetic precision and dynamic loss scaling, from the job's
** trainer.precision and trainer.loss_scale.* keys (docs/job.md), and the scaler's state in a
** checkpoint's state.json, so a restarted trainer continues with the same scale (the
** trainer keeps no state of its own between steps).
**
** The scaling itself (the order of rl.md §4.3 inside an update) is in trainer.c; the rules
** of the scale (torch, megatron, presets) are the engine's (prl_loss_scaler_*, optim.c).
*/
#include "grpo/grpo.h"

#include "job/job.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

prl_status prl_grpo_precision_from_job(prl_grpo_precision *p, const prl_job_config *j)
{
    memset(p, 0, sizeof *p);
    prl_status rc = prl_precision_parse(&p->precision, j->trainer_precision);
    if (rc) return prl_error_wrap(rc, "key 'trainer.precision': ");
    p->scaler_on = !strcmp(j->ls_enabled, "on") ||
                   (!strcmp(j->ls_enabled, "auto") && p->precision == PRL_PRECISION_FP16);
    rc = prl_loss_scaler_config_preset(&p->scaler, j->ls_preset);
    if (rc) return prl_error_wrap(rc, "key 'trainer.loss_scale.preset': ");
    /* 0 keeps the preset's constant */
    if (j->ls_init > 0) p->scaler.init_scale = j->ls_init;
    if (j->ls_growth_factor > 0) p->scaler.growth_factor = j->ls_growth_factor;
    if (j->ls_backoff_factor > 0) p->scaler.backoff_factor = j->ls_backoff_factor;
    if (j->ls_growth_interval > 0) p->scaler.growth_interval = j->ls_growth_interval;
    if (j->ls_hysteresis > 0) p->scaler.hysteresis = j->ls_hysteresis;
    if (j->ls_min_scale > 0) p->scaler.min_scale = j->ls_min_scale;
    prl_loss_scaler probe; /* the scaler's own range rules, named by key */
    rc = prl_loss_scaler_init(&probe, &p->scaler);
    return rc ? prl_error_wrap(rc, "keys 'trainer.loss_scale.*': ") : PRL_OK;
}

int prl_grpo_scaler_state_format(const prl_loss_scaler *s, char *out, size_t n)
{
    if (!s) return snprintf(out, n, "null");
    return snprintf(out, n,
                    "{\"scale\": %.17g, \"growth_tracker\": %d, \"hysteresis_tracker\": "
                    "%d, \"steps\": %ld, \"skipped\": %ld}",
                    s->scale, s->growth_tracker, s->hysteresis_tracker, s->steps, s->skipped);
}

prl_status prl_grpo_scaler_state_parse(prl_loss_scaler *s, const char *state_json)
{
    if (!state_json) return PRL_OK;
    json_error_t je;
    json_t *root = json_loads(state_json, 0, &je);
    if (!root) return prl_error_set(PRL_ERR_FORMAT, "state.json: %s (line %d)", je.text, je.line);
    json_t *o = json_object_get(root, "loss_scaler");
    prl_status rc = PRL_OK;
    if (o && !json_is_null(o)) { /* null: the run had no scaler */
        json_t *scale = json_object_get(o, "scale"), *g = json_object_get(o, "growth_tracker");
        json_t *h = json_object_get(o, "hysteresis_tracker"), *st = json_object_get(o, "steps");
        json_t *sk = json_object_get(o, "skipped");
        double v = json_is_number(scale) ? json_number_value(scale) : NAN;
        if (!(v > 0 && isfinite(v)) || !json_is_integer(g) || !json_is_integer(h) ||
            !json_is_integer(st) || !json_is_integer(sk) || json_integer_value(g) < 0 ||
            json_integer_value(sk) < 0 || json_integer_value(sk) > json_integer_value(st))
            rc = prl_error_set(PRL_ERR_FORMAT,
                               "state.json: 'loss_scaler' needs a finite scale > 0 "
                               "and integers growth_tracker, hysteresis_tracker, steps, skipped "
                               "(0 <= skipped <= steps)");
        else {
            s->scale = v;
            s->growth_tracker = (int)json_integer_value(g);
            s->hysteresis_tracker = (int)json_integer_value(h);
            s->steps = (long)json_integer_value(st);
            s->skipped = (long)json_integer_value(sk);
        }
    }
    json_decref(root);
    return rc;
}
