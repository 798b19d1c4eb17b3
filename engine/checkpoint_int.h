/*
** checkpoint_int.h — private to checkpoint.c, weights.c and export.c: the weights of a
** checkpoint directory as one name space over its safetensors files.
**
** A directory holds either one model.safetensors or shards listed by
** model.safetensors.index.json (Hugging Face layout). ckpt_weights opens whichever is there,
** checks the index against the shards, and reads tensors by name into the engine's reals,
** converting F32/F64/F16/BF16 and F8_E4M3 with its block scales (`<name>_scale_inv`). Each
** tensor read is marked used, so the loader can name the first tensor nothing asked for.
** Include engine/engine.h from outside; the API is engine/model.h (checkpoints).
*/
#ifndef PRL_CHECKPOINT_INT_H
#define PRL_CHECKPOINT_INT_H

#include "engine/engine.h"

/* One safetensors file of the directory. */
typedef struct ckpt_shard {
    char *path;         /* dir/file, for messages */
    prl_safetensors st; /* mapped; tensors released page by page as they are read */
    uint8_t *used;      /* [st.n_tensors] in st.tensors order: read (or accounted for) */
} ckpt_shard;

typedef struct ckpt_weights {
    char *source; /* "DIR/model.safetensors" or "DIR/model.safetensors.index.json" */
    int n_shards;
    ckpt_shard *shards;
    int block[2]; /* F8 block size: quantization_config.weight_block_size, else 128×128 */
} ckpt_weights;

/* Check the prl_checksum in st's metadata against its data section. Absent: an error when
** `required` (prl's own optimizer files), else accepted (an imported file). */
prl_status ckpt_verify_checksum(const prl_safetensors *st, int required);
/* The checksum prl stores: over the data section of a whole safetensors file. */
uint64_t ckpt_data_checksum(const uint8_t *bytes, size_t size);

/* Tensor `name` of st into out as prl_real (read_f32 or read_f64 by the build). */
prl_status ckpt_read_real(const prl_safetensors *st, const char *name, const int64_t *shape,
                          int ndim, prl_real *out);
/* Every x[0..n) finite, else PRL_ERR_NUMERIC naming the file, the tensor and the element. */
prl_status ckpt_check_finite(const char *file, const char *name, const prl_real *x, size_t n);
/* dir + "/" + file, malloc'd (NULL when out of memory). */
char *ckpt_path_join(const char *dir, const char *file);
/* Remove a flat directory this process created (its files, then it). */
void ckpt_remove_flat_dir(const char *path);

/* Open the weights of `dir` (config.json beside them gives the F8 block size). Both a
** model.safetensors and an index is an error (which one is meant?); so is neither. The index
** must name plain file names in dir; every tensor it maps must be in the shard it names and
** every tensor of a shard must be mapped to that shard. A shard with a prl_checksum in its
** metadata is verified; one without (an imported file) is taken as it is. */
prl_status ckpt_weights_open(ckpt_weights *w, const char *dir);
void ckpt_weights_close(ckpt_weights *w);

/* The tensor called `name` and its shard, or NULL (no error set). */
const prl_safetensors_tensor *ckpt_weights_find(const ckpt_weights *w, const char *name,
                                                ckpt_shard **shard);

/* Read tensor `name` of shape[0..ndim) into out: converted to prl_real, an F8_E4M3 tensor
** multiplied by its block scales, every value checked finite. Marks it (and its scales)
** used and releases its pages. Errors name the tensor and its file. */
prl_status ckpt_weights_read(ckpt_weights *w, const char *name, const int64_t *shape, int ndim,
                             prl_real *out);

/* Mark `name` used without reading it (a tensor the loader accounts for otherwise). */
void ckpt_weights_mark(ckpt_weights *w, const char *name);

/* The first tensor nothing read or marked is an error naming it and its file. */
prl_status ckpt_weights_check_used(const ckpt_weights *w);

#endif /* PRL_CHECKPOINT_INT_H */
