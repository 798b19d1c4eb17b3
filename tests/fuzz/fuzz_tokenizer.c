/*
** fuzz_tokenizer.c — tokenizer.json loading (prl's own format and imported Hugging Face
** files: normalizers, pre-tokenizer regexes, decoders, templates), then a round of encode
** and decode with what loaded.
*/
#include "engine/engine.h"
#include "tests/fuzz/fuzz.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    prl_tokenizer *tok = NULL;
    if (prl_tokenizer_load(path, &tok) == PRL_OK) {
        static const char text[] = "Hello, world! 12 + 345 = 357\n<|end|> caf\xc3\xa9 \xe2\x82\xac";
        int32_t *ids = NULL;
        size_t n = 0;
        if (prl_tokenizer_encode(tok, text, sizeof text - 1, PRL_TOKENIZER_SPECIAL, &ids, &n) ==
            PRL_OK) {
            char *back = NULL;
            size_t len = 0;
            if (prl_tokenizer_decode(tok, ids, n, 0, &back, &len) == PRL_OK) free(back);
        }
        free(ids);
        prl_tokenizer_free(tok);
    }
    close(fd);
    return 0;
}
