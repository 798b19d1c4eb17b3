/*
** checkpoint.c — saving and loading checkpoint directories.
**
** Layout (Hugging Face style): config.json, model.safetensors (F32, HF tensor names, a
** checksum of the data section in the metadata), optionally tokenizer.json, with an
** optimizer optimizer.safetensors (m.<name>, v.<name>, step in the metadata), and with an
** optimizer or a run state state.json. A save builds the whole directory under
** "<dir>.tmp.<pid>", fsyncs every file and the directory, then swaps it into place with one
** atomic rename (renameat2 RENAME_EXCHANGE when <dir> exists), so <dir> always holds one
** complete checkpoint.
*/
#include "engine/checkpoint_int.h"
#include "engine/ops.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

enum { CHECKPOINT_FORMAT = 1 };

/* out = dir + "/" + file, or an error if it does not fit. */
static prl_status join_path(char *out, size_t n, const char *dir, const char *file)
{
    int k = snprintf(out, n, "%s/%s", dir, file);
    if (k < 0 || (size_t)k >= n)
        return prl_error_set(PRL_ERR_ARG, "path too long: %s/%s", dir, file);
    return PRL_OK;
}

static void parent_dir(const char *path, char *out, size_t n)
{
    snprintf(out, n, "%s", path);
    char *slash = strrchr(out, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == out) out[1] = 0;
    else *slash = 0;
}

/* Remove a flat directory (files only) — the temporary or replaced checkpoint. */
void ckpt_remove_flat_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char buf[4096];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(buf, sizeof buf, "%s/%s", path, e->d_name);
        unlink(buf);
    }
    closedir(d);
    rmdir(path);
}

/* The files prl_checkpoint_save writes: nothing else is removed from a stale temporary. */
static const char *const SAVE_FILES[] = {"config.json", "model.safetensors",
                                         "optimizer.safetensors", "state.json", "tokenizer.json"};

/* NAME.tmp.PID with PID all digits: *pid gets it. */
static int stale_tmp_name(const char *name, long *pid)
{
    const char *t = NULL; /* the last ".tmp." */
    for (const char *p = strstr(name, ".tmp."); p; p = strstr(p + 1, ".tmp.")) t = p;
    if (!t || t == name) return 0;
    t += 5;
    char *end;
    errno = 0;
    *pid = strtol(t, &end, 10);
    return *t >= '0' && *t <= '9' && !*end && !errno && *pid > 0;
}

static int process_alive(long pid) { return kill((pid_t)pid, 0) == 0 || errno == EPERM; }

static int save_file_name(const char *name)
{
    for (size_t i = 0; i < sizeof SAVE_FILES / sizeof SAVE_FILES[0]; i++)
        if (!strcmp(name, SAVE_FILES[i])) return 1;
    return 0;
}

/* Every entry of dir is a regular file a save writes (checked before anything is removed). */
static int only_save_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    struct stat sb;
    char p[4400];
    int ok = 1;
    while (ok && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        ok = save_file_name(e->d_name) && !lstat(p, &sb) && S_ISREG(sb.st_mode);
    }
    closedir(d);
    return ok;
}

prl_status prl_checkpoint_clean_stale(const char *parent, int *removed)
{
    *removed = 0;
    DIR *d = opendir(parent);
    if (!d) return prl_error_set(PRL_ERR_IO, "cannot read %s: %s", parent, strerror(errno));
    prl_status rc = PRL_OK;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        long pid;
        struct stat sb;
        if (!stale_tmp_name(e->d_name, &pid)) continue;
        snprintf(path, sizeof path, "%s/%s", parent, e->d_name);
        if (lstat(path, &sb) || !S_ISDIR(sb.st_mode) || process_alive(pid)) continue;
        if (!only_save_files(path)) {
            if (!rc)
                rc = prl_error_set(PRL_ERR_IO,
                                   "%s: left in place: it holds something a checkpoint save "
                                   "does not write",
                                   path);
            continue;
        }
        ckpt_remove_flat_dir(path);
        (*removed)++;
    }
    closedir(d);
    return rc;
}

/* Parameters as float32 (a copy in the double build, the live buffer otherwise). */
static const float *as_f32(const prl_real *src, size_t n, float **owned)
{
#ifdef PRL_REAL_DOUBLE
    *owned = malloc(n * sizeof(float) + 1);
    if (!*owned) return NULL;
    for (size_t i = 0; i < n; i++) (*owned)[i] = (float)src[i];
    return *owned;
#else
    (void)n;
    *owned = NULL;
    return src;
#endif
}

/* The selection bias of MoE row moe_idx (trunk, then MTP layers), as its family names it:
** DeepSeek's router buffer `mlp.gate.e_score_correction_bias`, openPangu's
** `mlp.e_score_correction.bias`. */
static void bias_name(char *out, size_t n, const prl_model *m, int moe_idx)
{
    snprintf(out, n, "model.layers.%d.mlp.%s", prl_config_moe_layer(&m->cfg, moe_idx),
             prl_config_is_deepseek(&m->cfg) ? "gate.e_score_correction_bias"
                                             : "e_score_correction.bias");
}

uint64_t ckpt_data_checksum(const uint8_t *bytes, size_t size)
{
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)bytes[i] << (8 * i);
    return prl_checksum64(bytes + 8 + hlen, size - 8 - hlen, 0);
}

/* Write tensors (name → data) to path with a checksum of the data section in the metadata. */
static prl_status save_tensors(prl_safetensors_writer *w, const char *path, const char *step)
{
    prl_status rc;
    uint8_t *bytes = NULL;
    size_t len = 0;
    /* The checksum covers the data section, which metadata does not change, so compute it
    ** on a first rendering and then render the final file. */
    if ((rc = prl_safetensors_writer_set_metadata(w, "format", "pt"))) return rc;
    if (step && (rc = prl_safetensors_writer_set_metadata(w, "step", step))) return rc;
    if ((rc = prl_safetensors_writer_to_memory(w, &bytes, &len))) return rc;
    char sum[32];
    snprintf(sum, sizeof sum, "%016" PRIx64, ckpt_data_checksum(bytes, len));
    free(bytes);
    if ((rc = prl_safetensors_writer_set_metadata(w, "prl_checksum", sum))) return rc;
    return prl_safetensors_writer_save(w, path);
}

static prl_status save_model_file(const prl_model *m, const char *path)
{
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    float *owned = NULL, *bias_owned = NULL;
    const float *data = as_f32(m->params, m->n_params, &owned);
    size_t nb = (size_t)m->n_moe_all * m->cfg.n_routed_experts;
    const float *bias = as_f32(m->router_bias, nb, &bias_owned);
    prl_status rc = (data && bias) ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "saving %s", path);
    for (int i = 0; rc == PRL_OK && i < m->n_tensors; i++) {
        const prl_param_info *p = &m->tensors[i];
        rc = prl_safetensors_writer_add(&w, p->name, PRL_DTYPE_F32, p->shape, p->ndim,
                                        data + p->offset);
    }
    char name[96];
    for (int i = 0; rc == PRL_OK && i < m->n_moe_all; i++) {
        int64_t shape[1] = {m->cfg.n_routed_experts};
        bias_name(name, sizeof name, m, i);
        rc = prl_safetensors_writer_add(&w, name, PRL_DTYPE_F32, shape, 1,
                                        bias + (size_t)i * m->cfg.n_routed_experts);
    }
    if (rc == PRL_OK) rc = save_tensors(&w, path, NULL);
    prl_safetensors_writer_free(&w);
    free(owned);
    free(bias_owned);
    return rc;
}

static prl_status save_optim_file(const prl_model *m, const prl_optim *o, const char *path)
{
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    float *m_owned = NULL, *v_owned = NULL;
    const float *mm = as_f32(o->m, o->n_params, &m_owned),
                *vv = as_f32(o->v, o->n_params, &v_owned);
    prl_status rc = (mm && vv) ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "saving %s", path);
    char(*names)[100] = calloc((size_t)m->n_tensors * 2, sizeof *names);
    if (!names && rc == PRL_OK) rc = prl_error_set(PRL_ERR_NOMEM, "saving %s", path);
    for (int i = 0; rc == PRL_OK && i < m->n_tensors; i++) {
        const prl_param_info *p = &m->tensors[i];
        snprintf(names[2 * i], 100, "m.%s", p->name);
        snprintf(names[2 * i + 1], 100, "v.%s", p->name);
        rc = prl_safetensors_writer_add(&w, names[2 * i], PRL_DTYPE_F32, p->shape, p->ndim,
                                        mm + p->offset);
        if (rc == PRL_OK)
            rc = prl_safetensors_writer_add(&w, names[2 * i + 1], PRL_DTYPE_F32, p->shape, p->ndim,
                                            vv + p->offset);
    }
    char step[32];
    snprintf(step, sizeof step, "%lld", (long long)o->step);
    if (rc == PRL_OK) rc = save_tensors(&w, path, step);
    prl_safetensors_writer_free(&w);
    free(names);
    free(m_owned);
    free(v_owned);
    return rc;
}

static prl_status save_state(const prl_optim *o, const char *state_json, const char *path)
{
    json_t *user = NULL;
    if (state_json) {
        json_error_t err;
        user = json_loads(state_json, 0, &err);
        if (!user) return prl_error_set(PRL_ERR_ARG, "run state is not valid JSON: %s", err.text);
    }
    json_t *root = json_pack("{s:i, s:I, s:o}", "format", CHECKPOINT_FORMAT, "step",
                             (json_int_t)(o ? o->step : 0), "run", user ? user : json_object());
    char *text = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    prl_status rc = prl_file_write_sync(path, text, strlen(text));
    free(text);
    return rc;
}

static prl_status write_checkpoint_files(const prl_model *m, const prl_optim *o,
                                         const char *state_json, const prl_tokenizer *tok,
                                         const char *tmp)
{
    char path[4096];
    prl_status rc;
    char *config = prl_config_to_json(&m->cfg);
    if ((rc = join_path(path, sizeof path, tmp, "config.json"))) return rc;
    rc = config ? prl_file_write_sync(path, config, strlen(config))
                : prl_error_set(PRL_ERR_NOMEM, "config.json");
    free(config);
    if (rc) return rc;
    if ((rc = join_path(path, sizeof path, tmp, "model.safetensors"))) return rc;
    if ((rc = save_model_file(m, path))) return rc;
    if (tok) {
        if ((rc = join_path(path, sizeof path, tmp, "tokenizer.json"))) return rc;
        if ((rc = prl_tokenizer_save(tok, path))) return rc;
    }
    if (o) {
        if ((rc = join_path(path, sizeof path, tmp, "optimizer.safetensors"))) return rc;
        if ((rc = save_optim_file(m, o, path))) return rc;
    }
    if (o || state_json) {
        if ((rc = join_path(path, sizeof path, tmp, "state.json"))) return rc;
        if ((rc = save_state(o, state_json, path))) return rc;
    }
    return prl_file_sync_dir(tmp);
}

/* The files a save writes: only a directory holding nothing else may be replaced. */
static int is_checkpoint_file(const char *name)
{
    static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json",
                                        "optimizer.safetensors", "state.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++)
        if (!strcmp(name, files[i])) return 1;
    return 0;
}

/* PRL_OK when `dir` is absent, or a directory that a save may replace: empty or holding
** checkpoint files only. Anything else (a user's file, a subfolder) refuses the save before
** anything is written, so the swap can never take a user's files away. */
static prl_status check_replaceable(const char *dir)
{
    struct stat sb;
    if (lstat(dir, &sb) != 0) return PRL_OK;
    if (!S_ISDIR(sb.st_mode))
        return prl_error_set(PRL_ERR_IO, "%s exists and is not a directory", dir);
    DIR *d = opendir(dir);
    if (!d) return prl_error_set(PRL_ERR_IO, "cannot read %s: %s", dir, strerror(errno));
    prl_status rc = PRL_OK;
    char path[4096];
    struct dirent *e;
    while (rc == PRL_OK && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!is_checkpoint_file(e->d_name) || lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            rc = prl_error_set(PRL_ERR_IO,
                               "%s is not a checkpoint directory (it holds %s): refusing to "
                               "replace it; choose a new directory",
                               dir, e->d_name);
    }
    closedir(d);
    return rc;
}

prl_status prl_checkpoint_save(const prl_model *m, const prl_optim *o, const char *state_json,
                               const prl_tokenizer *tok, const char *dir)
{
    char tmp[4096], parent[4096];
    if (strlen(dir) > 3000) return prl_error_set(PRL_ERR_ARG, "checkpoint path too long: %s", dir);
    prl_status rc = check_replaceable(dir);
    if (rc) return rc;
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", dir, (int)getpid());
    ckpt_remove_flat_dir(tmp);
    if (mkdir(tmp, 0755) != 0)
        return prl_error_set(PRL_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    rc = write_checkpoint_files(m, o, state_json, tok, tmp);
    if (rc) {
        ckpt_remove_flat_dir(tmp);
        return prl_error_wrap(rc, "saving checkpoint %s: ", dir);
    }
    struct stat sb;
    int exists = stat(dir, &sb) == 0;
    int r = exists ? renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) : rename(tmp, dir);
    if (r != 0) {
        int e = errno;
        ckpt_remove_flat_dir(tmp);
        return prl_error_set(PRL_ERR_IO, "cannot move %s into place: %s", dir, strerror(e));
    }
    if (exists) ckpt_remove_flat_dir(tmp); /* now holds the previous checkpoint */
    parent_dir(dir, parent, sizeof parent);
    return prl_file_sync_dir(parent);
}

/* ------------------------------------------------------------------ loading --------- */

prl_status ckpt_verify_checksum(const prl_safetensors *st, int required)
{
    const char *want = prl_safetensors_metadata(st, "prl_checksum");
    if (!want && !required) return PRL_OK; /* an imported file: its tensors are still checked */
    if (!want)
        return prl_error_set(PRL_ERR_FORMAT, "%s: no prl_checksum in the metadata", st->label);
    char got[32];
    snprintf(got, sizeof got, "%016" PRIx64, ckpt_data_checksum(st->bytes, st->size));
    if (strcmp(got, want) != 0)
        return prl_error_set(PRL_ERR_CHECKSUM,
                             "%s: checksum mismatch (stored %s, computed %s): "
                             "the file is corrupt or was modified",
                             st->label, want, got);
    return PRL_OK;
}

static int same_bytes(const prl_safetensors_tensor *a, const prl_safetensors_tensor *b)
{
    return a->dtype == b->dtype && a->nbytes == b->nbytes && !memcmp(a->data, b->data, a->nbytes);
}

/* An MTP layer's copy of a trunk tensor (DeepSeek-V3 stores model.layers.61.embed_tokens and
** shared_head.head): prl shares the trunk's, so a copy must be byte-identical to it. */
static prl_status mark_shared_copy(ckpt_weights *w, const char *copy, const char *trunk)
{
    ckpt_shard *s;
    const prl_safetensors_tensor *c = ckpt_weights_find(w, copy, &s),
                                 *t = ckpt_weights_find(w, trunk, NULL);
    if (!c) return PRL_OK;
    if (!t || !same_bytes(c, t))
        return prl_error_set(PRL_ERR_FORMAT,
                             "%s: tensor '%s' differs from '%s', which this model's MTP layer "
                             "shares",
                             s->path, copy, trunk);
    ckpt_weights_mark(w, copy);
    return PRL_OK;
}

/* Tensors of a Hugging Face file that are not parameters: derived rope buffers, the MTP
** layers' copies of shared tensors. */
static prl_status mark_non_params(const prl_model *m, ckpt_weights *w)
{
    char name[128];
    for (int k = 0; k < w->n_shards; k++)
        for (size_t i = 0; i < w->shards[k].st.n_tensors; i++) {
            const char *n = w->shards[k].st.tensors[i].name;
            size_t len = strlen(n), tail = strlen(".rotary_emb.inv_freq");
            if (len > tail && !strcmp(n + len - tail, ".rotary_emb.inv_freq"))
                w->shards[k].used[i] = 1;
        }
    int L = m->cfg.num_hidden_layers;
    prl_status rc = PRL_OK;
    for (int l = L; rc == PRL_OK && l < L + m->cfg.num_nextn_predict_layers; l++) {
        snprintf(name, sizeof name, "model.layers.%d.embed_tokens.weight", l);
        rc = mark_shared_copy(w, name, "model.embed_tokens.weight");
        snprintf(name, sizeof name, "model.layers.%d.shared_head.head.weight", l);
        if (rc == PRL_OK && !prl_model_find(m, name))
            rc = mark_shared_copy(w, name, "lm_head.weight");
    }
    return rc;
}

static prl_status load_bias(prl_model *m, ckpt_weights *w)
{
    int E = m->cfg.n_routed_experts;
    for (int i = 0; i < m->n_moe_all; i++) { /* the MTP layers' rows too */
        int l = prl_config_moe_layer(&m->cfg, i);
        char names[3][96];
        snprintf(names[0], sizeof names[0], "model.layers.%d.mlp.e_score_correction.bias", l);
        snprintf(names[1], sizeof names[1], "model.layers.%d.mlp.gate.e_score_correction_bias", l);
        snprintf(names[2], sizeof names[2], "model.layers.%d.mlp.e_score_correction_bias", l);
        int64_t shape[1] = {E};
        for (int k = 0; k < 3; k++)
            if (ckpt_weights_find(w, names[k], NULL)) {
                prl_status rc =
                    ckpt_weights_read(w, names[k], shape, 1, m->router_bias + (size_t)i * E);
                if (rc) return rc;
                break;
            }
    }
    return PRL_OK;
}

/* Read every parameter of m from w; with `keep_new`, a DSA indexer, MTP module or score head
** the file lacks keeps its init and is counted in *n_new (adding blocks to a trained model,
** or a reward model's head to a policy). */
static prl_status load_params(prl_model *m, ckpt_weights *w, int keep_new, int *n_new)
{
    int fresh = 0;
    prl_status rc = mark_non_params(m, w);
    for (int i = 0; rc == PRL_OK && i < m->n_tensors; i++) {
        const prl_param_info *p = &m->tensors[i];
        int added = p->kind == PRL_PARAM_INDEXER || p->kind == PRL_PARAM_SCORE ||
                    p->layer >= m->cfg.num_hidden_layers;
        if (keep_new && added && !ckpt_weights_find(w, p->name, NULL)) {
            fresh++;
            continue;
        }
        rc = ckpt_weights_read(w, p->name, p->shape, p->ndim, m->params + p->offset);
    }
    if (rc == PRL_OK) rc = load_bias(m, w);
    if (rc == PRL_OK) rc = ckpt_weights_check_used(w);
    if (n_new) *n_new = fresh;
    return rc;
}

prl_status prl_checkpoint_load_tokenizer(prl_model *m, const char *dir, prl_tokenizer **tok)
{
    *tok = NULL;
    prl_status rc = prl_checkpoint_load(m, dir);
    if (rc) return rc;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, F_OK) == 0 && (rc = prl_tokenizer_load(path, tok))) prl_model_free(m);
    return rc;
}

/* A checkpoint's config.json and its weight files (every shard's checksum checked). */
static prl_status open_checkpoint(const char *dir, prl_config *cfg, ckpt_weights *w)
{
    char path[4096];
    prl_status rc = join_path(path, sizeof path, dir, "config.json");
    if (!rc) rc = prl_config_load(cfg, path);
    return rc ? rc : ckpt_weights_open(w, dir);
}

prl_status prl_checkpoint_load(prl_model *m, const char *dir)
{
    prl_config cfg;
    ckpt_weights w;
    prl_status rc = open_checkpoint(dir, &cfg, &w);
    if (rc) return rc;
    if ((rc = prl_model_init(m, &cfg)) == PRL_OK && (rc = load_params(m, &w, 0, NULL)))
        prl_model_free(m);
    ckpt_weights_close(&w);
    return rc;
}

/* The optional files of a checkpoint: optimizer.safetensors, state.json, tokenizer.json. */
static prl_status verify_extras(const char *dir)
{
    char path[4096];
    prl_status rc = join_path(path, sizeof path, dir, "optimizer.safetensors");
    if (!rc && access(path, F_OK) == 0) {
        prl_safetensors st;
        if ((rc = prl_safetensors_open(&st, path))) return rc;
        rc = ckpt_verify_checksum(&st, 1);
        prl_safetensors_free(&st);
    }
    if (!rc) rc = join_path(path, sizeof path, dir, "state.json");
    if (!rc && access(path, F_OK) == 0) {
        json_error_t err;
        json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
        if (!json_is_object(json_object_get(root, "run")))
            rc = prl_error_set(PRL_ERR_FORMAT, "%s: not a prl state file%s%s", path,
                               root ? "" : ": ", root ? "" : err.text);
        json_decref(root);
    }
    if (!rc) rc = join_path(path, sizeof path, dir, "tokenizer.json");
    if (!rc && access(path, F_OK) == 0) {
        prl_tokenizer *tok = NULL;
        rc = prl_tokenizer_load(path, &tok);
        prl_tokenizer_free(tok);
    }
    return rc;
}

prl_status prl_checkpoint_verify(const char *dir)
{
    prl_config cfg;
    ckpt_weights w;
    prl_status rc = open_checkpoint(dir, &cfg, &w);
    if (rc) return rc;
    ckpt_weights_close(&w);
    return verify_extras(dir);
}

prl_status prl_checkpoint_load_weights(prl_model *m, const char *dir, int *n_new)
{
    ckpt_weights w;
    prl_status rc = ckpt_weights_open(&w, dir);
    if (rc) return rc;
    int fresh = 0;
    rc = load_params(m, &w, 1, &fresh);
    ckpt_weights_close(&w);
    if (rc == PRL_OK && n_new) *n_new = fresh;
    return rc;
}

prl_status prl_checkpoint_load_optim(prl_optim *o, const prl_model *m, const char *dir,
                                     char **state_json)
{
    char path[4096], name[100];
    prl_status rc;
    if ((rc = join_path(path, sizeof path, dir, "optimizer.safetensors"))) return rc;
    prl_safetensors st;
    if ((rc = prl_safetensors_open(&st, path))) return rc;
    rc = ckpt_verify_checksum(&st, 1);
    if (rc == PRL_OK && st.n_tensors != 2 * (size_t)m->n_tensors)
        rc = prl_error_set(PRL_ERR_FORMAT, "%s: %zu tensors, expected %d", path, st.n_tensors,
                           2 * m->n_tensors);
    for (int i = 0; rc == PRL_OK && i < m->n_tensors; i++) {
        const prl_param_info *p = &m->tensors[i];
        size_t n = p->numel;
        snprintf(name, sizeof name, "m.%s", p->name);
        rc = ckpt_read_real(&st, name, p->shape, p->ndim, o->m + p->offset);
        if (rc == PRL_OK) rc = ckpt_check_finite(path, name, o->m + p->offset, n);
        snprintf(name, sizeof name, "v.%s", p->name);
        if (rc == PRL_OK) rc = ckpt_read_real(&st, name, p->shape, p->ndim, o->v + p->offset);
        if (rc == PRL_OK) rc = ckpt_check_finite(path, name, o->v + p->offset, n);
    }
    const char *step = prl_safetensors_metadata(&st, "step");
    char *end = NULL;
    long long s = step ? strtoll(step, &end, 10) : -1;
    if (rc == PRL_OK && (!step || *end || s < 0))
        rc = prl_error_set(PRL_ERR_FORMAT, "%s: missing or bad 'step' metadata", path);
    if (rc == PRL_OK) o->step = s;
    prl_safetensors_free(&st);
    if (rc || !state_json) return rc;
    if ((rc = join_path(path, sizeof path, dir, "state.json"))) return rc;
    char *text;
    if ((rc = prl_file_read(path, &text, NULL))) return rc;
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    free(text);
    json_t *run = root ? json_object_get(root, "run") : NULL;
    if (!run) {
        json_decref(root);
        return prl_error_set(PRL_ERR_FORMAT, "%s: not a prl state file", path);
    }
    *state_json = json_dumps(run, JSON_COMPACT);
    json_decref(root);
    return PRL_OK;
}
