/*
** teacher.c — the teacher side of OPD (opd.h, docs/opd.md): the scoring pass of a `teach`
** item on the expert's train path (log-probs of the student's tokens, and with opd.topk the
** expert's own top-k at each of them), the process's peak memory, and the check of the job's
** teacher checkpoints that runs before any process starts (missing files, another
** vocabulary, another tokenizer — the first differing token named —, each with its file).
** A teacher may be another architecture than the student: only the token ids must agree.
*/
#include "opd/opd.h"

#include "job/job.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- scoring ---------- */

/* Samples [i0, i0 + rows) of t into the rows of bb (T = the longest); only the response
** tokens with mask 1 get a target. */
static prl_batch pack(prl_batch_buf *bb, const prl_grpo_batch *t, int i0, int rows,
                      const size_t *first, uint8_t *train, double temperature)
{
    int T = 1;
    for (int r = 0; r < rows; r++) {
        int len = t->offsets[i0 + r + 1] - t->offsets[i0 + r];
        T = len > T ? len : T;
    }
    for (int r = 0; r < rows; r++) {
        int i = i0 + r, len = t->offsets[i + 1] - t->offsets[i], pl = t->prompt_lens[i];
        for (int p = 0; p < len; p++) train[p] = p >= pl && t->mask[first[i] + p - pl];
        prl_batch_buf_set_row(bb, T, r, t->tokens + t->offsets[i], len, train);
    }
    prl_batch batch = prl_batch_buf_view(bb, rows, T);
    batch.temperature = temperature; /* the student's: lp_T and lp_S of the same tempered family */
    return batch;
}

/* Response token j of sample i is the target of row position pl − 1 + j: copy the rows'
** values of the loss tokens (log-probs, and with topk the top-k) into the flat layout. */
static void rows_out(const prl_grpo_batch *t, const size_t *first, int i0, const prl_batch *batch,
                     const float *lp, const int32_t *ids, const float *klp, int topk, float *out,
                     int32_t *topk_ids, float *topk_lp)
{
    for (int r = 0; r < batch->B; r++) {
        int i = i0 + r, pl = t->prompt_lens[i], len = t->offsets[i + 1] - t->offsets[i] - pl;
        for (int j = 0; j < len; j++) {
            size_t f = first[i] + j, p = (size_t)r * batch->T + pl - 1 + j;
            if (!t->mask[f]) continue;
            out[f] = lp[p];
            for (int k = 0; k < topk; k++)
                topk_ids[f * topk + k] = ids[p * topk + k],
                                    topk_lp[f * topk + k] = klp[p * topk + k];
        }
    }
}

prl_status prl_opd_teacher_score(prl_model *m, const prl_grpo_batch *t, int micro_rows,
                                 double temperature, int topk, float *out, int32_t *topk_ids,
                                 float *topk_lp)
{
    prl_status rc = prl_grpo_batch_check(t);
    if (!rc && (rc = prl_grpo_batch_fits(m, t))) rc = prl_error_wrap(rc, "teacher: ");
    if (rc) return rc;
    if (micro_rows < 1) return prl_error_set(PRL_ERR_ARG, "teacher: micro_rows %d", micro_rows);
    if (!(temperature > 0 && isfinite(temperature)))
        return prl_error_set(PRL_ERR_ARG, "teacher: temperature %g must be > 0", temperature);
    int V = m->cfg.vocab_size, kmax = V < PRL_MAX_EXTRA_TARGETS ? V : PRL_MAX_EXTRA_TARGETS;
    if (topk < 0 || topk > kmax || (topk && (!topk_ids || !topk_lp)))
        return prl_error_set(PRL_ERR_ARG, "teacher: top-k %d (0..%d, with its arrays)", topk, kmax);
    int ctx = m->cfg.max_position_embeddings;
    size_t cells = (size_t)micro_rows * ctx;
    size_t *first = malloc((size_t)t->n * sizeof *first);
    uint8_t *train = malloc((size_t)ctx);
    float *lp = malloc(cells * sizeof *lp);
    int32_t *ids = topk ? malloc(cells * topk * sizeof *ids) : NULL;
    float *klp = topk ? malloc(cells * topk * sizeof *klp) : NULL;
    prl_batch_buf bb;
    memset(&bb, 0, sizeof bb);
    rc = first && train && lp && (!topk || (ids && klp))
             ? prl_batch_buf_init(&bb, micro_rows, ctx)
             : prl_error_set(PRL_ERR_NOMEM, "teacher of %d samples", t->n);
    for (int i = 0, len; !rc && i < t->n; i++) prl_grpo_batch_response(t, i, &first[i], &len);
    memset(out, 0, t->n_response * sizeof *out);
    for (size_t e = 0; e < t->n_response * (size_t)topk; e++) topk_ids[e] = -1, topk_lp[e] = 0;
    for (int i0 = 0; !rc && i0 < t->n; i0 += micro_rows) {
        int rows = t->n - i0 < micro_rows ? t->n - i0 : micro_rows;
        prl_batch batch = pack(&bb, t, i0, rows, first, train, temperature);
        if ((rc = prl_model_logprobs(m, &batch, lp))) break;
        if (topk && (rc = prl_model_topk(m, &batch, topk, ids, klp))) break;
        rows_out(t, first, i0, &batch, lp, ids, klp, topk, out, topk_ids, topk_lp);
    }
    prl_batch_buf_free(&bb);
    free(first), free(train), free(lp), free(ids), free(klp);
    return rc;
}

prl_status prl_opd_teacher_logprobs(prl_model *m, const prl_grpo_batch *t, int micro_rows,
                                    double temperature, float *out)
{
    return prl_opd_teacher_score(m, t, micro_rows, temperature, 0, out, NULL, NULL);
}

uint64_t prl_opd_peak_rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) break;
    fclose(f);
    return kb;
}

/* ---------------------------------------------------------------- the job's teachers */

void prl_opd_teachers_needed(const prl_job_config *j, int need[PRL_OPD_TEACHERS])
{
    for (int i = 0; i < PRL_OPD_TEACHERS; i++) {
        prl_task_domain d;
        need[i] = j->opd_enabled && prl_tasks_domain_parse(prl_opd_teacher_key(i), &d) == PRL_OK &&
                  prl_job_mix_problems(j, d) > 0;
    }
}

/* dir/name exists: else an error naming the key and the file. */
static prl_status need_file(const char *key, const char *dir, const char *name, char *path,
                            size_t n)
{
    struct stat sb;
    snprintf(path, n, "%s/%s", dir, name);
    if (stat(path, &sb))
        return prl_error_set(PRL_ERR_CONFIG,
                             "key '%s': teacher checkpoint %s is missing (not a "
                             "checkpoint directory)",
                             key, path);
    return PRL_OK;
}

/* Teacher and student may be different models (another width, depth, MoE shape or family)
** as long as they read and write the same token ids: the vocabulary sizes agree ... */
static prl_status same_vocab(const char *key, const char *tpath, const char *spath)
{
    prl_config tc, sc;
    prl_status rc = prl_config_load(&tc, tpath);
    if (rc) return prl_error_wrap(rc, "key '%s': teacher %s: ", key, tpath);
    if ((rc = prl_config_load(&sc, spath))) return prl_error_wrap(rc, "model.init: %s: ", spath);
    if (tc.vocab_size != sc.vocab_size)
        return prl_error_set(PRL_ERR_CONFIG,
                             "key '%s': teacher %s has vocab_size %d, the student "
                             "(model.init %s) %d: teacher and student must share the vocabulary",
                             key, tpath, tc.vocab_size, spath, sc.vocab_size);
    return PRL_OK;
}

/* ... and every id is the same token: the first id whose bytes differ is named. */
static prl_status same_tokens(const char *key, const char *tpath, const char *spath)
{
    prl_tokenizer *t = NULL, *s = NULL;
    prl_status rc = prl_tokenizer_load(tpath, &t);
    if (rc) return prl_error_wrap(rc, "key '%s': ", key);
    if ((rc = prl_tokenizer_load(spath, &s))) {
        prl_tokenizer_free(t);
        return prl_error_wrap(rc, "model.init: ");
    }
    int32_t nt = prl_tokenizer_vocab_size(t), ns = prl_tokenizer_vocab_size(s);
    for (int32_t id = 0; rc == PRL_OK && id < (nt > ns ? nt : ns); id++) {
        const uint8_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        int ha = id < nt && prl_tokenizer_token_bytes(t, id, &a, &na) == PRL_OK;
        int hb = id < ns && prl_tokenizer_token_bytes(s, id, &b, &nb) == PRL_OK;
        if (ha == hb && (!ha || (na == nb && !memcmp(a, b, na)))) continue;
        rc = prl_error_set(PRL_ERR_CONFIG,
                           "key '%s': teacher tokenizer %s and the student's (model.init %s) "
                           "differ first at token %d ('%.*s' vs '%.*s'): teacher and student "
                           "must share the tokenizer",
                           key, tpath, spath, (int)id, ha ? (int)(na > 40 ? 40 : na) : 6,
                           ha ? (const char *)a : "(none)", hb ? (int)(nb > 40 ? 40 : nb) : 6,
                           hb ? (const char *)b : "(none)");
    }
    prl_tokenizer_free(t);
    prl_tokenizer_free(s);
    return rc;
}

/* A checkpoint's weights: one model.safetensors or an index of shards. */
static prl_status need_weights(const char *key, const char *dir, char *path, size_t n)
{
    if (need_file(key, dir, "model.safetensors.index.json", path, n) == PRL_OK) return PRL_OK;
    return need_file(key, dir, "model.safetensors", path, n);
}

prl_status prl_opd_check_teachers(const prl_job_config *j)
{
    int need[PRL_OPD_TEACHERS];
    prl_opd_teachers_needed(j, need);
    for (int i = 0; i < PRL_OPD_TEACHERS; i++) {
        if (!need[i]) continue;
        char key[64], tcfg[1200], ttok[1200], tw[1200], scfg[1200], stok[1200];
        const char *dir = j->opd_teachers[i];
        snprintf(key, sizeof key, "opd.teachers.%s", prl_opd_teacher_key(i));
        if (!*dir) return prl_error_set(PRL_ERR_CONFIG, "key '%s' is empty", key);
        prl_status rc = need_file(key, dir, "config.json", tcfg, sizeof tcfg);
        if (!rc) rc = need_weights(key, dir, tw, sizeof tw);
        if (!rc) rc = need_file(key, dir, "tokenizer.json", ttok, sizeof ttok);
        if (!rc) rc = need_file("model.init", j->init, "config.json", scfg, sizeof scfg);
        if (!rc) rc = need_file("model.init", j->init, "tokenizer.json", stok, sizeof stok);
        if (!rc) rc = same_vocab(key, tcfg, scfg);
        if (!rc) rc = same_tokens(key, ttok, stok);
        if (!rc && prl_checkpoint_verify(dir)) /* complete, checksums right (values: at load) */
            rc = prl_error_wrap(PRL_ERR_CONFIG, "key '%s': ", key);
        if (rc) return rc;
    }
    return PRL_OK;
}
