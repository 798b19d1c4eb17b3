/*
** fuzz_seeds.c — writes the binary seed corpora of tests/fuzz/corpus/ (run by hand when a
** format changes; the text seeds, prompts and job configs, are kept as files): one valid
** message of every bus type (fuzz_bus's framing), safetensors files of every float dtype
** with metadata, and a trained tokenizer.json. Usage: fuzz_seeds CORPUS_DIR
*/
#include "bus/bus.h"
#include "engine/engine.h"
#include "roles/msg/msg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what)
{
    fprintf(stderr, "fuzz_seeds: %s: %s\n", what, prl_error_message());
    return 1;
}

/* A message of type t with its required fields and frames, written in fuzz_bus's framing. */
static int bus_seed(const prl_bus_type_spec *t, const char *dir)
{
    prl_bus_msg m;
    if (prl_bus_msg_init(&m, t, "run-1", 7)) return fail(t->type);
    for (int i = 0; i < PRL_BUS_SPEC_FIELDS && t->fields[i].name; i++) {
        const prl_bus_field_spec *f = &t->fields[i];
        if (f->kind == PRL_BUS_FIELD_UINT) prl_bus_msg_set_uint(&m, f->name, 3);
        else if (f->kind == PRL_BUS_FIELD_STR) prl_bus_msg_set_str(&m, f->name, "x-1");
        else prl_bus_msg_set_hex64(&m, f->name, 0x0123456789abcdefull);
    }
    const float values[3] = {1.0f, -2.5f, 0.0f};
    for (int i = 0; i < PRL_BUS_SPEC_FRAMES && t->frames[i].name; i++)
        prl_bus_msg_add_frame(&m, t->frames[i].name, t->frames[i].dtype, values, 3);
    prl_bus_wire w;
    if (prl_bus_encode(&m, &w)) return fail(t->type);
    char path[1024];
    snprintf(path, sizeof path, "%s/bus/%s", dir, t->type);
    FILE *f = fopen(path, "wb");
    if (!f) return fail(path);
    for (int i = 0; i < w.n; i++) {
        unsigned char len[2] = {(unsigned char)(w.parts[i].len & 255),
                                (unsigned char)(w.parts[i].len >> 8)};
        fwrite(len, 1, 2, f);
        fwrite(w.parts[i].data, 1, w.parts[i].len, f);
    }
    fclose(f);
    prl_bus_wire_free(&w);
    prl_bus_msg_free(&m);
    return 0;
}

/* Two tensors of dtype d (2x3 and a scalar) and a checksum-like metadata entry. */
static int safetensors_seed(prl_dtype d, const char *name, const char *dir)
{
    unsigned char data[6 * 8];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(0x3c + i % 7);
    int64_t shape[2] = {2, 3};
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    char path[1024];
    snprintf(path, sizeof path, "%s/safetensors/%s.safetensors", dir, name);
    prl_status rc = prl_safetensors_writer_add(&w, "model.layers.0.mlp.weight", d, shape, 2, data);
    if (!rc) rc = prl_safetensors_writer_add(&w, "scale", d, shape, 0, data);
    if (!rc) rc = prl_safetensors_writer_set_metadata(&w, "prl_checksum", "0123456789abcdef");
    if (!rc) rc = prl_safetensors_writer_save(&w, path);
    prl_safetensors_writer_free(&w);
    return rc ? fail(path) : 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) return fprintf(stderr, "usage: fuzz_seeds CORPUS_DIR\n"), 2;
    const char *dir = argv[1];
    const prl_bus_registry *reg = prl_msg_registry();
    for (int i = 0; i < reg->n; i++)
        if (bus_seed(reg->types[i], dir)) return 1;
    const struct {
        prl_dtype d;
        const char *name;
    } dtypes[] = {{PRL_DTYPE_F32, "f32"},
                  {PRL_DTYPE_F64, "f64"},
                  {PRL_DTYPE_F16, "f16"},
                  {PRL_DTYPE_BF16, "bf16"},
                  {PRL_DTYPE_F8_E4M3, "f8_e4m3"}};
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (safetensors_seed(dtypes[i].d, dtypes[i].name, dir)) return 1;
    const char *texts[] = {"What is 12 + 30? The answer is 42.", "Hello, world! hello again.",
                           "def f(x):\n    return x + 1\n"};
    prl_tokenizer *tok;
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer/prl-bpe.json", dir);
    if (prl_tokenizer_train(texts, NULL, 3, 300, &tok) || prl_tokenizer_save(tok, path))
        return fail(path);
    prl_tokenizer_free(tok);
    printf("fuzz_seeds: %d bus messages, %zu safetensors files, 1 tokenizer in %s\n", reg->n,
           sizeof dtypes / sizeof *dtypes, dir);
    return 0;
}
