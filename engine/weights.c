/*
** weights.c — a checkpoint directory's weights as one name space (checkpoint_int.h).
**
** Hugging Face checkpoints come as one model.safetensors or as shards named by
** model.safetensors.index.json, in F32, BF16, F16 or F8_E4M3 with 128×128 block scales
** (DeepSeek-V3). Files are mapped, never read whole: a tensor is converted into the model's
** flat buffer and its pages are released at once, so loading a bf16 checkpoint needs little
** more resident memory than the fp32 weights themselves (`prl bench load` measures it).
*/
#include "engine/checkpoint_int.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char SINGLE[] = "model.safetensors";
static const char INDEX[] = "model.safetensors.index.json";

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

char *ckpt_path_join(const char *dir, const char *file)
{
    size_t n = strlen(dir) + strlen(file) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, file);
    return p;
}

/* Add dir/file as a shard (once); *k gets its index. */
static prl_status add_shard(ckpt_weights *w, const char *dir, const char *file, int *k)
{
    char *path = ckpt_path_join(dir, file);
    if (!path) return prl_error_set(PRL_ERR_NOMEM, "%s", w->source);
    for (*k = 0; *k < w->n_shards; (*k)++)
        if (!strcmp(w->shards[*k].path, path)) return free(path), PRL_OK;
    if (!file_exists(path)) {
        free(path);
        return prl_error_set(PRL_ERR_FORMAT, "%s names shard '%s', which does not exist", w->source,
                             file);
    }
    ckpt_shard *grown = realloc(w->shards, (size_t)(w->n_shards + 1) * sizeof *grown);
    if (!grown) return free(path), prl_error_set(PRL_ERR_NOMEM, "%s", w->source);
    w->shards = grown;
    ckpt_shard *s = &w->shards[w->n_shards++]; /* counted now: close frees what it holds */
    memset(s, 0, sizeof *s);
    s->path = path;
    prl_status rc = prl_safetensors_open(&s->st, path);
    if (rc) return rc;
    if (!(s->used = calloc(s->st.n_tensors + 1, 1)))
        return prl_error_set(PRL_ERR_NOMEM, "%s", path);
    if ((rc = ckpt_verify_checksum(&s->st, 0))) return rc;
    prl_safetensors_release(&s->st, NULL); /* the checksum touched every page */
    return PRL_OK;
}

/* A shard name from an index: a plain file name in the directory, nothing that walks out. */
static int plain_file_name(const char *f)
{
    return *f && !strchr(f, '/') && strcmp(f, ".") && strcmp(f, "..");
}

/* Every tensor the index maps must be in the shard it names. */
static prl_status open_mapped(ckpt_weights *w, const char *dir, json_t *map)
{
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v)
    {
        const char *file = json_string_value(v);
        if (!file || !plain_file_name(file))
            return prl_error_set(PRL_ERR_FORMAT,
                                 "%s: weight_map['%s'] must be a file name in the checkpoint "
                                 "directory",
                                 w->source, name);
        int k;
        prl_status rc = add_shard(w, dir, file, &k);
        if (rc) return rc;
        if (!prl_safetensors_find(&w->shards[k].st, name))
            return prl_error_set(PRL_ERR_FORMAT,
                                 "%s maps tensor '%s' to %s, which does not hold it", w->source,
                                 name, w->shards[k].path);
    }
    return PRL_OK;
}

/* ... and every tensor of a shard must be mapped to that shard. */
static prl_status check_unmapped(const ckpt_weights *w, const char *dir, json_t *map)
{
    for (int k = 0; k < w->n_shards; k++) {
        const prl_safetensors *st = &w->shards[k].st;
        const char *file = w->shards[k].path + strlen(dir) + 1;
        for (size_t i = 0; i < st->n_tensors; i++) {
            const char *mapped = json_string_value(json_object_get(map, st->tensors[i].name));
            if (!mapped || strcmp(mapped, file) != 0)
                return prl_error_set(PRL_ERR_FORMAT, "%s: tensor '%s' of %s is %s", w->source,
                                     st->tensors[i].name, w->shards[k].path,
                                     mapped ? "mapped to another shard" : "not in the index");
        }
    }
    return PRL_OK;
}

static prl_status open_index(ckpt_weights *w, const char *dir)
{
    json_error_t err;
    json_t *root = json_load_file(w->source, JSON_REJECT_DUPLICATES, &err);
    if (!root) return prl_error_set(PRL_ERR_FORMAT, "%s:%d: %s", w->source, err.line, err.text);
    json_t *map = json_object_get(root, "weight_map");
    prl_status rc = PRL_OK;
    if (!json_is_object(map) || json_object_size(map) == 0)
        rc = prl_error_set(PRL_ERR_FORMAT, "%s: no \"weight_map\" object", w->source);
    if (rc == PRL_OK) rc = open_mapped(w, dir, map);
    if (rc == PRL_OK) rc = check_unmapped(w, dir, map);
    json_decref(root);
    return rc;
}

/* quantization_config of config.json: only DeepSeek's block-wise fp8 is read. */
static prl_status read_block_size(ckpt_weights *w, const char *dir)
{
    w->block[0] = w->block[1] = 128;
    char *path = ckpt_path_join(dir, "config.json");
    if (!path) return prl_error_set(PRL_ERR_NOMEM, "config.json");
    json_t *root = json_load_file(path, 0, NULL);
    json_t *q = json_object_get(root, "quantization_config");
    prl_status rc = PRL_OK;
    if (json_is_object(q)) {
        const char *method = json_string_value(json_object_get(q, "quant_method"));
        json_t *bs = json_object_get(q, "weight_block_size");
        if (!method || strcmp(method, "fp8") != 0)
            rc = prl_error_set(PRL_ERR_UNSUPPORTED,
                               "%s: quantization_config.quant_method '%s' is not supported "
                               "(block-wise \"fp8\" is)",
                               path, method ? method : "(none)");
        else if (bs &&
                 !(json_array_size(bs) == 2 && json_integer_value(json_array_get(bs, 0)) > 0 &&
                   json_integer_value(json_array_get(bs, 1)) > 0))
            rc = prl_error_set(PRL_ERR_FORMAT,
                               "%s: quantization_config.weight_block_size must be [rows, cols]",
                               path);
        else if (bs) {
            w->block[0] = (int)json_integer_value(json_array_get(bs, 0));
            w->block[1] = (int)json_integer_value(json_array_get(bs, 1));
        }
    }
    json_decref(root);
    free(path);
    return rc;
}

prl_status ckpt_weights_open(ckpt_weights *w, const char *dir)
{
    memset(w, 0, sizeof *w);
    char *single = ckpt_path_join(dir, SINGLE), *index = ckpt_path_join(dir, INDEX);
    if (!single || !index) {
        free(single);
        free(index);
        return prl_error_set(PRL_ERR_NOMEM, "%s", dir);
    }
    int has_single = file_exists(single), has_index = file_exists(index);
    w->source = has_index ? index : single;
    free(has_index ? single : index);
    prl_status rc = PRL_OK;
    int k;
    if (has_single && has_index)
        rc = prl_error_set(PRL_ERR_FORMAT, "%s holds both %s and %s: keep one", dir, SINGLE, INDEX);
    else if (!has_single && !has_index)
        rc = prl_error_set(PRL_ERR_IO, "%s: no %s and no %s", dir, SINGLE, INDEX);
    if (rc == PRL_OK) rc = read_block_size(w, dir);
    if (rc == PRL_OK) rc = has_index ? open_index(w, dir) : add_shard(w, dir, SINGLE, &k);
    if (rc) ckpt_weights_close(w);
    return rc;
}

void ckpt_weights_close(ckpt_weights *w)
{
    for (int i = 0; i < w->n_shards; i++) {
        prl_safetensors_free(&w->shards[i].st);
        free(w->shards[i].used);
        free(w->shards[i].path);
    }
    free(w->shards);
    free(w->source);
    memset(w, 0, sizeof *w);
}

const prl_safetensors_tensor *ckpt_weights_find(const ckpt_weights *w, const char *name,
                                                ckpt_shard **shard)
{
    for (int i = 0; i < w->n_shards; i++) {
        const prl_safetensors_tensor *t = prl_safetensors_find(&w->shards[i].st, name);
        if (t) {
            if (shard) *shard = &w->shards[i];
            return t;
        }
    }
    return NULL;
}

static void mark(ckpt_shard *s, const prl_safetensors_tensor *t) { s->used[t - s->st.tensors] = 1; }

void ckpt_weights_mark(ckpt_weights *w, const char *name)
{
    ckpt_shard *s;
    const prl_safetensors_tensor *t = ckpt_weights_find(w, name, &s);
    if (t) mark(s, t);
}

prl_status ckpt_read_real(const prl_safetensors *st, const char *name, const int64_t *shape,
                          int ndim, prl_real *out)
{
#ifdef PRL_REAL_DOUBLE
    return prl_safetensors_read_f64(st, name, shape, ndim, out);
#else
    return prl_safetensors_read_f32(st, name, shape, ndim, out);
#endif
}

/* out[R×C] *= scale[⌈R/br⌉ × ⌈C/bc⌉] block by block (DeepSeek-V3's weight_scale_inv: the
** stored e4m3 values times it give the weight). */
static prl_status apply_block_scales(ckpt_weights *w, const char *name, const ckpt_shard *ws,
                                     const int64_t *shape, int ndim, prl_real *out)
{
    char sname[160];
    snprintf(sname, sizeof sname, "%s_scale_inv", name);
    ckpt_shard *ss;
    const prl_safetensors_tensor *t = ckpt_weights_find(w, sname, &ss);
    if (ndim != 2)
        return prl_error_set(PRL_ERR_UNSUPPORTED, "%s: F8_E4M3 tensor '%s' is not a matrix",
                             ws->path, name);
    if (!t)
        return prl_error_set(PRL_ERR_FORMAT, "%s: F8_E4M3 tensor '%s' has no '%s'", ws->path, name,
                             sname);
    int64_t R = shape[0], C = shape[1], br = w->block[0], bc = w->block[1];
    int64_t sshape[2] = {(R + br - 1) / br, (C + bc - 1) / bc};
    prl_real *scale = malloc((size_t)(sshape[0] * sshape[1]) * sizeof *scale + 1);
    if (!scale) return prl_error_set(PRL_ERR_NOMEM, "%s: %s", ss->path, sname);
    prl_status rc = ckpt_read_real(&ss->st, sname, sshape, 2, scale);
    if (rc) {
        free(scale);
        return prl_error_wrap(rc, "%s (%d×%d blocks): ", ss->path, (int)br, (int)bc);
    }
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) out[r * C + c] *= scale[(r / br) * sshape[1] + c / bc];
    free(scale);
    mark(ss, t);
    return PRL_OK;
}

prl_status ckpt_check_finite(const char *file, const char *name, const prl_real *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return prl_error_set(PRL_ERR_NUMERIC, "%s: tensor '%s' has %s at element %zu", file,
                                 name, isnan(x[i]) ? "a NaN" : "an infinity", i);
    return PRL_OK;
}

prl_status ckpt_weights_read(ckpt_weights *w, const char *name, const int64_t *shape, int ndim,
                             prl_real *out)
{
    ckpt_shard *s;
    const prl_safetensors_tensor *t = ckpt_weights_find(w, name, &s);
    if (!t)
        return prl_error_set(PRL_ERR_FORMAT, "%s: tensor '%s' is missing (the config needs it)",
                             w->source, name);
    prl_status rc = ckpt_read_real(&s->st, name, shape, ndim, out);
    if (rc == PRL_OK && t->dtype == PRL_DTYPE_F8_E4M3)
        rc = apply_block_scales(w, name, s, shape, ndim, out);
    if (rc == PRL_OK) rc = ckpt_check_finite(s->path, name, out, t->numel);
    prl_safetensors_release(&s->st, t);
    if (rc == PRL_OK) mark(s, t);
    return rc;
}

prl_status ckpt_weights_check_used(const ckpt_weights *w)
{
    for (int k = 0; k < w->n_shards; k++)
        for (size_t i = 0; i < w->shards[k].st.n_tensors; i++)
            if (!w->shards[k].used[i])
                return prl_error_set(PRL_ERR_FORMAT,
                                     "%s: unexpected tensor '%s' (not in this model's config)",
                                     w->shards[k].path, w->shards[k].st.tensors[i].name);
    return PRL_OK;
}

prl_status prl_checkpoint_weights_hash(const char *dir, uint64_t seed, uint64_t *hash)
{
    ckpt_weights w;
    prl_status rc = ckpt_weights_open(&w, dir);
    if (rc) return rc;
    uint64_t h = seed;
    for (int k = 0; k < w.n_shards; k++) {
        h = prl_checksum64(w.shards[k].st.bytes, w.shards[k].st.size, h);
        prl_safetensors_release(&w.shards[k].st, NULL);
    }
    ckpt_weights_close(&w);
    *hash = h;
    return PRL_OK;
}
