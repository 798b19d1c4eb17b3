/*
** fuzz_safetensors.c — the safetensors reader (prl_safetensors_parse), then every tensor it
** accepts read back as float (the dtype conversions), as the checkpoint loader does.
*/
#include "engine/engine.h"
#include "tests/fuzz/fuzz.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    prl_safetensors st;
    if (prl_safetensors_parse(&st, data, size, "fuzz") != PRL_OK) return 0;
    for (size_t i = 0; i < st.n_tensors; i++) {
        const prl_safetensors_tensor *t = &st.tensors[i];
        size_t count = 1;
        for (int d = 0; d < t->ndim; d++) count *= (size_t)t->shape[d];
        if (count > (1u << 20)) continue; /* the data section bounds it; keep runs fast */
        float *out = malloc(count * sizeof *out + 1);
        if (out) prl_safetensors_read_f32(&st, t->name, t->shape, t->ndim, out);
        free(out);
    }
    prl_safetensors_metadata(&st, "prl_checksum");
    prl_safetensors_free(&st);
    return 0;
}
