/*
** batch.c — owned buffers behind a prl_batch and the packing of one sequence into a row
** (model.h): the layout every trainer (sft/, grpo/) feeds to the train path.
**
** Row layout: position t holds token t and predicts token t + 1; positions past the
** sequence are <|pad|> with no target (the model ignores t >= lens[b]).
*/
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

prl_status prl_batch_buf_init(prl_batch_buf *bb, int rows, int cols)
{
    memset(bb, 0, sizeof *bb);
    if (rows < 1 || cols < 1)
        return prl_error_set(PRL_ERR_ARG, "batch buffer of %d x %d positions", rows, cols);
    size_t n = (size_t)rows * (size_t)cols;
    bb->rows = rows, bb->cols = cols;
    bb->tokens = malloc(n * sizeof *bb->tokens);
    bb->targets = malloc(n * sizeof *bb->targets);
    bb->lens = malloc((size_t)rows * sizeof *bb->lens);
    bb->weights = calloc(n, sizeof *bb->weights);
    if (!bb->tokens || !bb->targets || !bb->lens || !bb->weights) {
        prl_batch_buf_free(bb);
        return prl_error_set(PRL_ERR_NOMEM, "batch buffer of %d x %d positions", rows, cols);
    }
    return PRL_OK;
}

void prl_batch_buf_free(prl_batch_buf *bb)
{
    if (!bb) return;
    free(bb->tokens);
    free(bb->targets);
    free(bb->lens);
    free(bb->weights);
    memset(bb, 0, sizeof *bb);
}

int prl_batch_buf_set_row(prl_batch_buf *bb, int T, int i, const int32_t *ids, int n,
                          const uint8_t *train)
{
    PRL_ASSERT(i >= 0 && i < bb->rows && T >= 1 &&
               (size_t)(i + 1) * T <= (size_t)bb->rows * bb->cols);
    PRL_ASSERT(n >= 0 && n <= T);
    int trained = 0;
    bb->lens[i] = n;
    for (int t = 0; t < T; t++) {
        size_t idx = (size_t)i * T + t;
        /* padding is never a target (and attends nowhere that counts): any valid id does, and
        ** id 0 exists in every vocabulary, prl's <|pad|> or an imported tokenizer's */
        bb->tokens[idx] = t < n ? ids[t] : PRL_TOKEN_PAD;
        int on = t + 1 < n && (!train || train[t + 1]);
        bb->targets[idx] = on ? ids[t + 1] : -1;
        bb->weights[idx] = 0;
        trained += on;
    }
    return trained;
}

prl_batch prl_batch_buf_view(const prl_batch_buf *bb, int B, int T)
{
    PRL_ASSERT(B >= 1 && B <= bb->rows && T >= 1 && (size_t)B * T <= (size_t)bb->rows * bb->cols);
    return (prl_batch){.B = B,
                       .T = T,
                       .tokens = bb->tokens,
                       .lens = bb->lens,
                       .targets = bb->targets,
                       .weights = bb->weights,
                       .temperature = 1};
}
