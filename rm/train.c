/*
** train.c — Bradley–Terry training of a reward model (`prl rm train`): the policy's model with
** a scalar head, loss −log σ(r_chosen − r_rejected − m) per pair, mean over a step's pairs,
** AdamW; then the held-out accuracy (r_chosen > r_rejected), loss, accuracy per pair kind and
** the calibration (mean, std of the held-out scores), saved with the checkpoint.
**
** Gradient of one pair's loss ℓ = softplus(−Δ), Δ = r_c − r_r − m: ∂ℓ/∂r_c = −σ(−Δ),
** ∂ℓ/∂r_r = σ(−Δ); the step's mean divides by its pairs. They enter the engine as the
** batch's score_weights (rows 2i, 2i + 1: chosen and rejected of pair i).
*/
#include "rm/rm_int.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void prl_rm_train_options_default(prl_rm_train_options *o)
{
    memset(o, 0, sizeof *o);
    o->steps = 300, o->batch = 8, o->max_len = 256;
    o->lr = 1e-4, o->margin = 0, o->holdout = 10, o->seed = 1;
}

/* The pairs encoded: ids of chosen (2i) and rejected (2i + 1) and their pair's margin. */
typedef struct encoded {
    int32_t **ids;
    int *lens;
    double *margin;
    char (*kind)[24]; /* the pair's "kind" (copied: the lines are freed after encoding) */
    int n;            /* pairs */
} encoded;

static void encoded_free(encoded *e)
{
    for (int i = 0; e->ids && i < 2 * e->n; i++) free(e->ids[i]);
    free(e->ids), free(e->lens), free(e->margin), free(e->kind);
    memset(e, 0, sizeof *e);
}

/* Encode pairs[i] for i in [0, n) with keep(i) (NULL: all). */
static prl_status encode_pairs(const prl_rm_pairs *ps, const prl_tokenizer *tok, int max_len,
                               double margin, int holdout, int want_eval, encoded *e)
{
    memset(e, 0, sizeof *e);
    e->ids = calloc((size_t)2 * ps->n, sizeof *e->ids);
    e->lens = calloc((size_t)2 * ps->n, sizeof *e->lens);
    e->margin = calloc((size_t)ps->n, sizeof *e->margin);
    e->kind = calloc((size_t)ps->n, sizeof *e->kind);
    if (!e->ids || !e->lens || !e->margin || !e->kind) {
        encoded_free(e);
        return prl_error_set(PRL_ERR_NOMEM, "encoded pairs");
    }
    prl_status rc = PRL_OK;
    for (int i = 0; !rc && i < ps->n; i++) {
        /* holdout: whole problems (4 pairs each in prl rm pairs' order) go to one side */
        if (holdout > 0 && ((i / 4) % holdout == 0) != want_eval) continue;
        const prl_rm_pair *p = &ps->p[i];
        int k = e->n++;
        rc = rm__encode(tok, p->msgs, p->n_msgs, p->chosen, max_len, &e->ids[2 * k],
                        &e->lens[2 * k]);
        if (!rc)
            rc = rm__encode(tok, p->msgs, p->n_msgs, p->rejected, max_len, &e->ids[2 * k + 1],
                            &e->lens[2 * k + 1]);
        e->margin[k] = p->margin >= 0 ? p->margin : margin;
        const char *kind = json_string_value(json_object_get(p->line, "kind"));
        snprintf(e->kind[k], sizeof e->kind[k], "%s", kind ? kind : "");
    }
    if (rc) encoded_free(e);
    return rc;
}

static double softplus(double x) { return x > 30 ? x : log1p(exp(x)); }
static double sigmoid(double x) { return 1 / (1 + exp(-x)); }

/* One optimizer step on pairs order[from, from + P). Returns the step's mean loss/accuracy. */
static prl_status train_step(prl_model *m, prl_optim *opt, const encoded *e, const int *order,
                             int P, double *loss, double *acc)
{
    int32_t **ids = malloc((size_t)2 * P * sizeof *ids);
    int *lens = malloc((size_t)2 * P * sizeof *lens);
    float *sw = malloc((size_t)2 * P * sizeof *sw);
    int T = 1;
    prl_status rc = ids && lens && sw ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "rm step");
    for (int i = 0; !rc && i < P; i++)
        for (int j = 0; j < 2; j++) {
            ids[2 * i + j] = e->ids[2 * order[i] + j];
            lens[2 * i + j] = e->lens[2 * order[i] + j];
            T = lens[2 * i + j] > T ? lens[2 * i + j] : T;
        }
    int32_t *tokens = rc ? NULL : calloc((size_t)2 * P * T, sizeof *tokens);
    if (!rc && !tokens) rc = prl_error_set(PRL_ERR_NOMEM, "rm step");
    for (int r = 0; !rc && r < 2 * P; r++)
        memcpy(tokens + (size_t)r * T, ids[r], (size_t)lens[r] * sizeof *tokens);
    prl_batch b = {.B = 2 * P, .T = T, .tokens = tokens, .lens = lens, .temperature = 1};
    if (!rc) rc = prl_model_forward(m, &b, NULL, NULL);
    double l = 0, a = 0;
    for (int i = 0; !rc && i < P; i++) {
        const prl_real *s = prl_model_scores(m);
        double d = (double)s[2 * i] - (double)s[2 * i + 1] - e->margin[order[i]];
        l += softplus(-d), a += s[2 * i] > s[2 * i + 1];
        double g = sigmoid(-d) / P;
        sw[2 * i] = (float)-g, sw[2 * i + 1] = (float)g;
    }
    b.score_weights = sw;
    if (!rc) {
        prl_model_zero_grad(m);
        rc = prl_model_backward(m, &b);
    }
    prl_optim_stats st;
    if (!rc) rc = prl_optim_step(opt, m, &st);
    *loss = l / P, *acc = a / P;
    free(ids), free(lens), free(sw), free(tokens);
    return rc;
}

/* Per-kind held-out accuracy, as a JSON object (kinds in order of first appearance). */
typedef struct kind_acc {
    const char *name[16];
    int n[16], ok[16], k;
} kind_acc;

static void kind_add(kind_acc *ka, const char *name, int ok)
{
    int i = 0;
    while (i < ka->k && strcmp(ka->name[i], name)) i++;
    if (i == ka->k) {
        if (ka->k == 16) return;
        ka->name[ka->k++] = name;
    }
    ka->n[i]++, ka->ok[i] += ok;
}

/* Score every held-out pair (16 chats a forward) into res and the calibration. */
static prl_status evaluate(prl_model *m, const encoded *e, prl_rm_train_result *res, kind_acc *ka,
                           double *mean, double *std)
{
    double *s = malloc((size_t)2 * e->n * sizeof *s + 8);
    if (!s) return prl_error_set(PRL_ERR_NOMEM, "rm eval");
    prl_status rc = PRL_OK;
    for (int r = 0; !rc && r < 2 * e->n; r += 16) {
        int B = 2 * e->n - r < 16 ? 2 * e->n - r : 16;
        rc = rm__forward(m, e->ids + r, e->lens + r, B, s + r);
    }
    double ok = 0, loss = 0, sum = 0, sq = 0;
    for (int i = 0; !rc && i < e->n; i++) {
        int good = s[2 * i] > s[2 * i + 1];
        ok += good;
        loss += softplus(-(s[2 * i] - s[2 * i + 1] - e->margin[i]));
        kind_add(ka, e->kind[i], good);
        sum += s[2 * i] + s[2 * i + 1];
    }
    double mu = e->n ? sum / (2 * e->n) : 0;
    for (int r = 0; !rc && r < 2 * e->n; r++) sq += (s[r] - mu) * (s[r] - mu);
    res->eval_accuracy = e->n ? ok / e->n : 0;
    res->eval_loss = e->n ? loss / e->n : 0;
    *mean = mu, *std = e->n ? sqrt(sq / (2 * e->n)) : 1;
    free(s);
    return rc;
}

/* The model to train: the checkpoint's (its config with the score head added) or a fresh
** one of the config; score.weight drawn as every matrix is when the checkpoint lacks it. */
static prl_status build_model(const prl_rm_train_options *o, prl_model *m, prl_tokenizer **tok)
{
    char path[4200];
    prl_config cfg;
    snprintf(path, sizeof path, "%s/config.json", o->ckpt ? o->ckpt : "");
    prl_status rc = prl_config_load(&cfg, o->ckpt ? path : o->model);
    if (rc) return rc;
    cfg.score_head = 1;
    if ((rc = prl_model_init(m, &cfg))) return rc;
    prl_model_init_weights(m, o->seed);
    if (o->ckpt) {
        int n_new = 0;
        rc = prl_checkpoint_load_weights(m, o->ckpt, &n_new);
        snprintf(path, sizeof path, "%s/tokenizer.json", o->ckpt);
        if (!rc && access(path, R_OK) != 0)
            rc = prl_error_set(PRL_ERR_ARG, "--ckpt %s has no tokenizer.json", o->ckpt);
        if (!rc) rc = prl_tokenizer_load(path, tok);
    } else {
        rc = o->tokenizer ? prl_tokenizer_load(o->tokenizer, tok) : prl_tokenizer_init_bytes(tok);
        if (!rc && prl_tokenizer_vocab_size(*tok) > cfg.vocab_size)
            rc = prl_error_set(PRL_ERR_ARG, "the tokenizer's %d ids do not fit vocab_size %d",
                               prl_tokenizer_vocab_size(*tok), cfg.vocab_size);
    }
    if (rc) {
        prl_model_free(m);
        prl_tokenizer_free(*tok);
        *tok = NULL;
    }
    return rc;
}

/* state.json's "reward_model": what was trained on, how it did, its calibration. */
static char *state_json(const prl_rm_train_options *o, const prl_rm_train_result *res,
                        const kind_acc *ka, double mean, double std)
{
    json_t *kinds = json_object();
    for (int i = 0; i < ka->k; i++)
        json_object_set_new(kinds, ka->name[i][0] ? ka->name[i] : "none",
                            json_real((double)ka->ok[i] / ka->n[i]));
    json_t *opts =
        json_pack("{s:s, s:s?, s:s?, s:s?, s:i, s:i, s:i, s:f, s:f, s:i, s:I}", "data", o->data,
                  "eval", o->eval, "ckpt", o->ckpt, "model", o->model, "steps", o->steps, "batch",
                  o->batch, "max_len", o->max_len, "lr", o->lr, "margin", o->margin, "holdout",
                  o->eval ? 0 : o->holdout, "seed", (json_int_t)o->seed);
    json_t *st = json_pack("{s:{s:i, s:i, s:f, s:f, s:o, s:f, s:f, s:o}}", "reward_model",
                           "train_pairs", res->n_train, "eval_pairs", res->n_eval, "eval_accuracy",
                           res->eval_accuracy, "eval_loss", res->eval_loss, "eval_accuracy_by_kind",
                           kinds, "mean", mean, "std", std, "options", opts);
    char *text = st ? json_dumps(st, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(st);
    return text;
}

static prl_status check_options(const prl_rm_train_options *o)
{
    if (!o->data || !o->out) return prl_error_set(PRL_ERR_ARG, "--data and --out are required");
    if (!o->ckpt == !o->model)
        return prl_error_set(PRL_ERR_ARG, "give --ckpt DIR or --model CONFIG");
    if (o->tokenizer && o->ckpt)
        return prl_error_set(PRL_ERR_ARG, "--tokenizer goes with --model (a --ckpt has its own)");
    if (o->steps < 1 || o->batch < 1 || o->max_len < 2)
        return prl_error_set(PRL_ERR_ARG, "--steps and --batch must be >= 1, --max-len >= 2");
    if (!(o->lr > 0) || !(o->margin >= 0) || o->holdout < 0)
        return prl_error_set(PRL_ERR_ARG, "--lr must be > 0, --margin >= 0, --holdout >= 0");
    if (access(o->out, F_OK) == 0)
        return prl_error_set(PRL_ERR_ARG, "--out %s exists (nothing is overwritten)", o->out);
    return PRL_OK;
}

/* Read and encode the training and held-out pairs. */
static prl_status load_data(const prl_rm_train_options *o, const prl_tokenizer *tok, int max_len,
                            encoded *tr, encoded *ev)
{
    prl_rm_pairs ps, pe;
    prl_status rc = prl_rm_pairs_read(o->data, &ps);
    if (rc) return rc;
    int split = o->eval ? 0 : o->holdout;
    rc = encode_pairs(&ps, tok, max_len, o->margin, split, 0, tr);
    if (!rc && o->eval) {
        if (!(rc = prl_rm_pairs_read(o->eval, &pe))) {
            rc = encode_pairs(&pe, tok, max_len, o->margin, 0, 1, ev);
            prl_rm_pairs_free(&pe);
        }
    } else if (!rc) {
        rc = encode_pairs(&ps, tok, max_len, o->margin, split, 1, ev);
    }
    prl_rm_pairs_free(&ps);
    if (!rc && (tr->n == 0 || ev->n == 0))
        rc = prl_error_set(PRL_ERR_ARG, "%d training and %d held-out pairs: both must be > 0",
                           tr->n, ev->n);
    if (rc) encoded_free(tr), encoded_free(ev);
    return rc;
}

/* A seeded permutation of [0, n) for epoch `epoch` (Fisher–Yates). */
static void shuffle(int *order, int n, uint64_t seed, int epoch)
{
    prl_rng r;
    prl_rng_init(&r, seed, (uint64_t)epoch, 0, 0, PRL_RNG_SHUFFLE);
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(prl_rng_u64(&r) % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j], order[j] = t;
    }
}

static prl_status train_loop(const prl_rm_train_options *o, prl_model *m, const encoded *tr,
                             prl_rm_train_result *res)
{
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    oc.kind = PRL_OPTIM_ADAMW, oc.lr = o->lr, oc.grad_clip = 1.0, oc.weight_decay = 0;
    oc.total_steps = o->steps;
    prl_optim opt;
    prl_status rc = prl_optim_init(&opt, m, &oc);
    if (rc) return rc;
    int P = o->batch < tr->n ? o->batch : tr->n, *order = malloc((size_t)tr->n * sizeof *order);
    if (!order) rc = prl_error_set(PRL_ERR_NOMEM, "rm order");
    double wl = 0, wa = 0;
    for (int step = 0, at = tr->n, epoch = 0; !rc && step < o->steps; step++) {
        if (at + P > tr->n) shuffle(order, tr->n, o->seed, epoch++), at = 0;
        double l, a;
        rc = train_step(m, &opt, tr, order + at, P, &l, &a);
        at += P, wl += l, wa += a;
        if (!rc && o->log && ((step + 1) % 25 == 0 || step + 1 == o->steps)) {
            int k = (step + 1) % 25 ? (step + 1) % 25 : 25;
            fprintf(o->log, "rm step %d/%d  loss %.4f  pair accuracy %.3f\n", step + 1, o->steps,
                    wl / k, wa / k);
            fflush(o->log);
            res->train_accuracy_last = wa / k;
            wl = wa = 0;
        }
    }
    free(order);
    prl_optim_free(&opt);
    return rc;
}

prl_status prl_rm_train(const prl_rm_train_options *o, prl_rm_train_result *res)
{
    memset(res, 0, sizeof *res);
    prl_status rc = check_options(o);
    if (rc) return rc;
    prl_model m;
    prl_tokenizer *tok = NULL;
    if ((rc = build_model(o, &m, &tok))) return rc;
    int max_len =
        o->max_len < m.cfg.max_position_embeddings ? o->max_len : m.cfg.max_position_embeddings;
    encoded tr, ev;
    if ((rc = load_data(o, tok, max_len, &tr, &ev))) {
        prl_model_free(&m);
        prl_tokenizer_free(tok);
        return rc;
    }
    res->n_train = tr.n, res->n_eval = ev.n;
    if (o->log)
        fprintf(o->log, "rm: %d training pairs, %d held out; %d steps of %d pairs\n", tr.n, ev.n,
                o->steps, o->batch);
    rc = train_loop(o, &m, &tr, res);
    kind_acc ka = {0};
    double mean = 0, std = 1;
    if (!rc) rc = evaluate(&m, &ev, res, &ka, &mean, &std);
    char *st = rc ? NULL : state_json(o, res, &ka, mean, std);
    if (!rc && !st) rc = prl_error_set(PRL_ERR_NOMEM, "rm state");
    if (!rc) rc = prl_checkpoint_save(&m, NULL, st, tok, o->out);
    if (!rc && o->log) {
        fprintf(o->log, "rm: held-out pair accuracy %.4f (%d pairs), loss %.4f", res->eval_accuracy,
                ev.n, res->eval_loss);
        for (int i = 0; i < ka.k; i++)
            fprintf(o->log, "%s %s %.3f", i ? "," : ";", ka.name[i][0] ? ka.name[i] : "none",
                    (double)ka.ok[i] / ka.n[i]);
        fprintf(o->log, "\n");
    }
    free(st);
    encoded_free(&tr), encoded_free(&ev);
    prl_model_free(&m);
    prl_tokenizer_free(tok);
    return rc;
}
