/*
** export.c — a checkpoint as a Hugging Face model directory (`prl export`).
**
** Writes what any HF loader reads: config.json (the model's keys, torch_dtype set to the
** exported dtype), the weights in BF16 or F32 as model.safetensors or, when they exceed the
** shard size, as model-0000k-of-0000n.safetensors shards with model.safetensors.index.json,
** the router biases under DeepSeek-V3's name (mlp.gate.e_score_correction_bias), and the
** source's tokenizer files unchanged. Every shard carries prl's checksum unless asked not to
** (HF loaders ignore metadata). Like a checkpoint save, the directory is built under a temporary name and moved
** into place with one rename that never replaces an existing directory.
*/
#include "engine/checkpoint_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One tensor to export: a parameter or a router bias, as float32 values. */
typedef struct export_item {
    char name[128];
    int ndim;
    int64_t shape[3];
    size_t numel;
    const prl_real *src;
} export_item;

/* round to nearest even; NaN stays a (quiet) NaN */
static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static size_t item_bytes(const export_item *it, prl_dtype dtype)
{
    return it->numel * prl_dtype_size(dtype);
}

static int collect_items(const prl_model *m, export_item **out)
{
    int n = m->n_tensors + m->n_moe_all;
    export_item *it = calloc((size_t)n + 1, sizeof *it);
    if (!it) return -1;
    for (int i = 0; i < m->n_tensors; i++) {
        const prl_param_info *p = &m->tensors[i];
        snprintf(it[i].name, sizeof it[i].name, "%s", p->name);
        it[i].ndim = p->ndim;
        memcpy(it[i].shape, p->shape, sizeof p->shape);
        it[i].numel = p->numel;
        it[i].src = m->params + p->offset;
    }
    for (int i = 0; i < m->n_moe_all; i++) { /* trunk, then MTP layers */
        export_item *b = &it[m->n_tensors + i];
        snprintf(b->name, sizeof b->name, "model.layers.%d.mlp.gate.e_score_correction_bias",
                 prl_config_moe_layer(&m->cfg, i));
        b->ndim = 1;
        b->shape[0] = m->cfg.n_routed_experts;
        b->numel = (size_t)m->cfg.n_routed_experts;
        b->src = m->router_bias + (size_t)i * m->cfg.n_routed_experts;
    }
    *out = it;
    return n;
}

/* The bytes of one tensor in the exported dtype (malloc'd). */
static void *convert(const export_item *it, prl_dtype dtype)
{
    void *buf = malloc(item_bytes(it, dtype) + 1);
    if (!buf) return NULL;
    for (size_t i = 0; i < it->numel; i++) {
        float f = (float)it->src[i];
        if (dtype == PRL_DTYPE_BF16) ((uint16_t *)buf)[i] = f32_to_bf16(f);
        else ((float *)buf)[i] = f;
    }
    return buf;
}

static prl_status write_shard(const export_item *it, int lo, int hi, prl_dtype dtype, int checksum,
                              const char *path)
{
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    void **bufs = calloc((size_t)(hi - lo) + 1, sizeof *bufs);
    prl_status rc = bufs ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "%s", path);
    for (int i = lo; rc == PRL_OK && i < hi; i++) {
        if (!(bufs[i - lo] = convert(&it[i], dtype))) rc = prl_error_set(PRL_ERR_NOMEM, "%s", path);
        else
            rc = prl_safetensors_writer_add(&w, it[i].name, dtype, it[i].shape, it[i].ndim,
                                            bufs[i - lo]);
    }
    uint8_t *bytes = NULL;
    size_t len = 0;
    if (rc == PRL_OK) rc = prl_safetensors_writer_set_metadata(&w, "format", "pt");
    if (rc == PRL_OK && checksum) rc = prl_safetensors_writer_to_memory(&w, &bytes, &len);
    char sum[32];
    if (rc == PRL_OK && checksum) {
        snprintf(sum, sizeof sum, "%016" PRIx64, ckpt_data_checksum(bytes, len));
        rc = prl_safetensors_writer_set_metadata(&w, "prl_checksum", sum);
    }
    free(bytes);
    if (rc == PRL_OK) rc = prl_safetensors_writer_save(&w, path);
    for (int i = lo; bufs && i < hi; i++) free(bufs[i - lo]);
    free(bufs);
    prl_safetensors_writer_free(&w);
    return rc;
}

/* Greedy shards in tensor order: a shard closes before the tensor that would pass `limit`
** (a tensor larger than the limit gets a shard of its own). starts[k] is shard k's first
** tensor; returns the number of shards. */
static int plan_shards(const export_item *it, int n, prl_dtype dtype, size_t limit, int *starts)
{
    int k = 0;
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        size_t b = item_bytes(&it[i], dtype);
        if (i == 0 || (used > 0 && used + b > limit)) starts[k++] = i, used = 0;
        used += b;
    }
    starts[k] = n;
    return k;
}

/* dir/file = root as indented JSON (root is consumed), fsynced. */
static prl_status write_json(json_t *root, size_t flags, const char *dir, const char *file)
{
    char *text = json_dumps(root, JSON_INDENT(2) | flags), *path = ckpt_path_join(dir, file);
    json_decref(root);
    prl_status rc = text && path ? prl_file_write_sync(path, text, strlen(text))
                                 : prl_error_set(PRL_ERR_NOMEM, "%s/%s", dir, file);
    free(text);
    free(path);
    return rc;
}

static prl_status write_index(const export_item *it, const int *starts, int n_shards,
                              prl_dtype dtype, const char *dir)
{
    json_t *map = json_object();
    size_t total = 0;
    char file[64];
    for (int k = 0; k < n_shards; k++) {
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
        for (int i = starts[k]; i < starts[k + 1]; i++) {
            json_object_set_new(map, it[i].name, json_string(file));
            total += item_bytes(&it[i], dtype);
        }
    }
    json_t *root =
        json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", map);
    return write_json(root, JSON_SORT_KEYS, dir, "model.safetensors.index.json");
}

static prl_status write_weights(const prl_model *m, const prl_export_options *o, const char *dir)
{
    export_item *it = NULL;
    int n = collect_items(m, &it);
    int *starts = n >= 0 ? calloc((size_t)n + 2, sizeof *starts) : NULL;
    if (!starts) {
        free(it);
        return prl_error_set(PRL_ERR_NOMEM, "exporting %s", dir);
    }
    prl_dtype dtype = o->dtype;
    int n_shards = plan_shards(it, n, dtype, o->shard_bytes, starts);
    char file[64];
    prl_status rc = PRL_OK;
    for (int k = 0; rc == PRL_OK && k < n_shards; k++) {
        if (n_shards == 1) snprintf(file, sizeof file, "model.safetensors");
        else snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
        char *path = ckpt_path_join(dir, file);
        rc = path ? write_shard(it, starts[k], starts[k + 1], dtype, !o->no_checksum, path)
                  : prl_error_set(PRL_ERR_NOMEM, "%s", dir);
        free(path);
    }
    if (rc == PRL_OK && n_shards > 1) rc = write_index(it, starts, n_shards, dtype, dir);
    free(starts);
    free(it);
    return rc;
}

/* config.json with torch_dtype naming the exported dtype. */
static prl_status write_config(const prl_model *m, prl_dtype dtype, const char *dir)
{
    char *text = prl_config_to_json(&m->cfg);
    json_t *root = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    if (!root) return prl_error_set(PRL_ERR_NOMEM, "config.json");
    json_object_set_new(root, "torch_dtype",
                        json_string(dtype == PRL_DTYPE_BF16 ? "bfloat16" : "float32"));
    return write_json(root, JSON_PRESERVE_ORDER, dir, "config.json");
}

/* The source's tokenizer files, byte for byte. */
static prl_status copy_tokenizer_files(const char *src, const char *dir)
{
    static const char *files[] = {"tokenizer.json", "tokenizer_config.json",
                                  "special_tokens_map.json", "generation_config.json"};
    prl_status rc = PRL_OK;
    for (size_t i = 0; rc == PRL_OK && i < sizeof files / sizeof files[0]; i++) {
        char *from = ckpt_path_join(src, files[i]), *to = ckpt_path_join(dir, files[i]);
        char *text = NULL;
        size_t len = 0;
        if (!from || !to) rc = prl_error_set(PRL_ERR_NOMEM, "%s", dir);
        else if (access(from, F_OK) == 0 && (rc = prl_file_read(from, &text, &len)) == PRL_OK)
            rc = prl_file_write_sync(to, text, len);
        free(text);
        free(from);
        free(to);
    }
    return rc;
}

prl_status prl_checkpoint_export(const prl_model *m, const char *src_dir, const char *out,
                                 const prl_export_options *o)
{
    if (o->dtype != PRL_DTYPE_BF16 && o->dtype != PRL_DTYPE_F32)
        return prl_error_set(PRL_ERR_ARG, "export: dtype %s (choose BF16 or F32)",
                             prl_dtype_name(o->dtype) ? prl_dtype_name(o->dtype) : "?");
    if (o->shard_bytes == 0) return prl_error_set(PRL_ERR_ARG, "export: shard size 0");
    if (access(out, F_OK) == 0)
        return prl_error_set(PRL_ERR_ARG, "export: %s exists (choose a new directory)", out);
    char tmp[4200];
    if (strlen(out) > 3000) return prl_error_set(PRL_ERR_ARG, "export: path too long: %s", out);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
    if (mkdir(tmp, 0755) != 0)
        return prl_error_set(PRL_ERR_IO, "export: cannot create %s: %s", tmp, strerror(errno));
    prl_status rc = write_config(m, o->dtype, tmp);
    if (rc == PRL_OK) rc = write_weights(m, o, tmp);
    if (rc == PRL_OK && src_dir) rc = copy_tokenizer_files(src_dir, tmp);
    if (rc == PRL_OK) rc = prl_file_sync_dir(tmp);
    if (rc == PRL_OK && renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_NOREPLACE) != 0)
        rc = prl_error_set(PRL_ERR_IO, "export: cannot move %s into place: %s", out,
                           strerror(errno));
    if (rc) {
        ckpt_remove_flat_dir(tmp); /* created by this call: nothing of the user's is in it */
        return prl_error_wrap(rc, "exporting %s: ", out);
    }
    return prl_file_sync_parent(out);
}
