/*
** safetensors.h — reading and writing Hugging Face safetensors files.
**
** Layout: an 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the data
** buffer. The reader validates everything the reference implementation validates plus
** the project rules (docs/formats.md "safetensors"); the writer produces files that are
** byte-identical to the reference writer and replaces its target atomically.
**
** This header is part of engine/engine.h, which declares prl_status before including it;
** include engine/engine.h, not this file.
*/
#ifndef PRL_SAFETENSORS_H
#define PRL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#ifndef PRL_ENGINE_H
#error "include engine/engine.h, which declares prl_status, instead of engine/safetensors.h"
#endif

/* ---------------------------------------------------------------- dtypes ----------- */

/* Element types in the order of the reference enum. The order is part of the format:
** the writer sorts tensors by it (descending), so never reorder or insert. */
typedef enum prl_dtype {
    PRL_DTYPE_BOOL,
    PRL_DTYPE_U8,
    PRL_DTYPE_I8,
    PRL_DTYPE_F8_E5M2,
    PRL_DTYPE_F8_E4M3,
    PRL_DTYPE_I16,
    PRL_DTYPE_U16,
    PRL_DTYPE_F16,
    PRL_DTYPE_BF16,
    PRL_DTYPE_I32,
    PRL_DTYPE_U32,
    PRL_DTYPE_F32,
    PRL_DTYPE_F64,
    PRL_DTYPE_I64,
    PRL_DTYPE_U64,
    PRL_DTYPE_COUNT
} prl_dtype;

/* "F32" etc.; NULL for a value outside the enum. */
const char *prl_dtype_name(prl_dtype dtype);
/* Bytes per element (1, 2, 4 or 8); 0 for a value outside the enum. */
size_t prl_dtype_size(prl_dtype dtype);
/* The dtype called `name` (exact, case-sensitive), or PRL_DTYPE_COUNT if there is none. */
prl_dtype prl_dtype_from_name(const char *name);

/* ---------------------------------------------------------------- reader ----------- */

#define PRL_SAFETENSORS_MAX_DIMS 8              /* project rule */
#define PRL_SAFETENSORS_MAX_HEADER 100000000ULL /* reference MAX_HEADER_SIZE */

/* One tensor of a parsed file. Everything points into the prl_safetensors it came from
** and is valid until prl_safetensors_free. */
typedef struct prl_safetensors_tensor {
    const char *name; /* [A-Za-z0-9._-]+ */
    prl_dtype dtype;
    int ndim;                                /* 0 = scalar (one element) */
    int64_t shape[PRL_SAFETENSORS_MAX_DIMS]; /* shape[0..ndim-1], each >= 0 */
    size_t numel;                            /* product of shape (1 for a scalar) */
    size_t nbytes;                           /* numel * prl_dtype_size(dtype) */
    uint64_t begin, end;                     /* data_offsets, relative to the data buffer */
    const void *data;                        /* the bytes; little-endian, maybe unaligned */
} prl_safetensors_tensor;

/* A parsed, fully validated file. Read-only for the caller: the fields are public so
** that iteration is a plain loop, e.g.
**     for (size_t i = 0; i < st.n_tensors; i++) use(&st.tensors[i]); */
typedef struct prl_safetensors {
    char *label;          /* path or caller's label, used in error messages */
    const uint8_t *bytes; /* the whole file */
    size_t size;          /* its length */
    uint64_t header_len;  /* N */
    size_t n_tensors;
    prl_safetensors_tensor *tensors; /* in file order: ascending data_offsets; tensors with
                                     ** equal offsets (empty ones) in header order */
    size_t *by_name;                 /* indices into tensors, names ascending (for find) */
    size_t n_metadata;
    char **metadata_keys; /* __metadata__ entries in header order */
    char **metadata_values;
    void *map; /* mmap'd region owned by this struct, or NULL */
    size_t map_len;
} prl_safetensors;

/* Parse and validate `len` bytes at `buf` as a safetensors file. `label` (may be NULL,
** then "<memory>") names the buffer in error messages and is copied.
** Ownership: `buf` is BORROWED — tensor data pointers point into it, so it must outlive
** `*st`; everything else (names, metadata, indexes) is owned by `*st`.
** On success *st must be released with prl_safetensors_free. On failure returns a negative
** status (PRL_ERR_FORMAT for a malformed file, PRL_ERR_NOMEM) with a message naming the
** label, the tensor or field and the problem, and leaves *st zeroed (free is a no-op). */
prl_status prl_safetensors_parse(prl_safetensors *st, const void *buf, size_t len,
                                 const char *label);

/* Map the file at `path` read-only and parse it as prl_safetensors_parse does. *st owns
** the mapping and unmaps it in prl_safetensors_free. Errors: PRL_ERR_IO (open, stat, not a
** regular file, mmap), plus those of prl_safetensors_parse. Do not truncate the file while
** it is open (mmap semantics); prl writes files by atomic rename, so this does not happen
** to its own files. */
prl_status prl_safetensors_open(prl_safetensors *st, const char *path);

/* Release everything *st owns and zero it. Accepts NULL; idempotent. */
void prl_safetensors_free(prl_safetensors *st);

/* The tensor called `name`, or NULL if the file has none (no error message is set).
** O(log n). The pointer is owned by *st. */
const prl_safetensors_tensor *prl_safetensors_find(const prl_safetensors *st, const char *name);

/* The __metadata__ value stored under `key`, or NULL if absent. Owned by *st. */
const char *prl_safetensors_metadata(const prl_safetensors *st, const char *key);

/* Copy tensor `name` into `out` as float, converting from F32, F64 (rounded to nearest),
** F16, BF16 or F8_E4M3 (e4m3fn; all three exact; block scales are the caller's). The tensor's shape must equal expect_shape[0..expect_ndim-1]
** (expect_ndim = 0 for a scalar). `out` is caller-owned with room for the product of the
** expected shape. Errors: PRL_ERR_FORMAT if the tensor is missing or its shape differs
** (the message names the tensor and both shapes), PRL_ERR_UNSUPPORTED for another dtype,
** PRL_ERR_ARG for a bad expected shape. */
prl_status prl_safetensors_read_f32(const prl_safetensors *st, const char *name,
                                    const int64_t *expect_shape, int expect_ndim, float *out);
/* The same into double (every conversion exact). */
prl_status prl_safetensors_read_f64(const prl_safetensors *st, const char *name,
                                    const int64_t *expect_shape, int expect_ndim, double *out);

/* Drop the pages that lie wholly inside tensor t's bytes from this process's memory
** (madvise DONTNEED on a mapped file; a later read faults them in again from the page
** cache); t NULL: the whole file. A loader that converts tensor by tensor calls it after
** each one, so the mapped file never adds more than one tensor to the resident set. No-op
** for a parsed buffer. */
void prl_safetensors_release(const prl_safetensors *st, const prl_safetensors_tensor *t);

/* ---------------------------------------------------------------- writer ----------- */

/* A tensor queued for writing. The writer owns `name`; `data` is the caller's. */
typedef struct prl_safetensors_wtensor {
    char *name;
    prl_dtype dtype;
    int ndim;
    int64_t shape[PRL_SAFETENSORS_MAX_DIMS];
    size_t nbytes;
    const void *data; /* little-endian element bytes, row-major; NULL only if nbytes == 0 */
} prl_safetensors_wtensor;

/* Collects tensors and metadata, then writes them in the reference writer's layout.
** Fields are private to safetensors_write.c. */
typedef struct prl_safetensors_writer {
    size_t n_tensors, cap_tensors;
    prl_safetensors_wtensor *tensors;
    size_t n_metadata, cap_metadata;
    char **metadata_keys;
    char **metadata_values;
} prl_safetensors_writer;

/* Start an empty writer. */
void prl_safetensors_writer_init(prl_safetensors_writer *w);
/* Release what the writer owns (names, metadata copies, arrays; never tensor data) and
** leave it empty as after init. Accepts NULL; idempotent. */
void prl_safetensors_writer_free(prl_safetensors_writer *w);

/* Queue tensor `name` (copied) of `dtype` and shape[0..ndim-1] (copied; ndim 0 = scalar)
** whose nbytes = prod(shape) * dtype size bytes are at `data`. `data` is BORROWED: it is
** read only when the file is produced, so it must stay valid and unchanged until then.
** Errors (PRL_ERR_ARG, message names the tensor): invalid name (empty, a byte outside
** [A-Za-z0-9._-], or "__metadata__"), a name already queued, unknown dtype, ndim outside
** 0..8, a negative dimension, a size that overflows, NULL data with nbytes > 0. */
prl_status prl_safetensors_writer_add(prl_safetensors_writer *w, const char *name, prl_dtype dtype,
                                      const int64_t *shape, int ndim, const void *data);

/* Set __metadata__[key] = value (both copied; a later call with the same key replaces the
** value). Both must be valid UTF-8 (PRL_ERR_ARG otherwise). __metadata__ is written only
** when at least one key is set; keys are written sorted byte-wise. */
prl_status prl_safetensors_writer_set_metadata(prl_safetensors_writer *w, const char *key,
                                               const char *value);

/* Produce the whole file in memory. On success *out (caller-owned, release with free())
** holds *out_len bytes. Errors: PRL_ERR_NOMEM, PRL_ERR_RANGE (header above the reader's
** 100,000,000-byte limit or total size overflow). */
prl_status prl_safetensors_writer_to_memory(const prl_safetensors_writer *w, uint8_t **out,
                                            size_t *out_len);

/* Write the file to `path` atomically: write "<path>.tmp.<pid>", fflush, fsync, rename over
** `path`, fsync the directory (a file system that cannot sync directories, EINVAL/ENOTSUP,
** is not an error). Readers see the old file or the complete new one, never a partial one.
** On any failure (PRL_ERR_IO naming the file and the strerror, PRL_ERR_NOMEM, PRL_ERR_RANGE)
** the temporary file is removed and no file is left under `path` that was not there
** before. Every failure up to the rename leaves an existing `path` untouched; the only
** later failure, the directory fsync, cannot undo the rename, so a pre-existing `path` then
** holds the complete new file. */
prl_status prl_safetensors_writer_save(const prl_safetensors_writer *w, const char *path);

#endif /* PRL_SAFETENSORS_H */
