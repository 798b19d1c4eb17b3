/*
** demo.c — the SFT demo data: short arithmetic question/answer chats.
**
** Each answer is a function of its question, so a model can fit the data exactly; that
** makes the demo a clean check that the train path learns (loss → 0) and is reproducible.
*/
#include "tasks/tasks.h"

#include <jansson.h>
#include <stdlib.h>

static json_t *message(const char *role, const char *content)
{
    return json_pack("{s:s, s:s}", "role", role, "content", content);
}

prl_status prl_tasks_write_demo(FILE *out, int n, uint64_t seed)
{
    if (n < 0) return prl_error_set(PRL_ERR_ARG, "demo: n = %d must be >= 0", n);
    static const char ops[3] = {'+', '-', '*'};
    for (int i = 0; i < n; i++) {
        prl_rng r;
        prl_rng_init(&r, seed, (uint64_t)i, 0, 0, PRL_RNG_TASK);
        int a = (int)(prl_rng_u64(&r) % 100), b = (int)(prl_rng_u64(&r) % 100);
        char op = ops[prl_rng_u64(&r) % 3];
        long v = op == '+' ? a + b : op == '-' ? a - b : (long)a * b;
        char q[96], ans[96];
        snprintf(q, sizeof q, "What is %d %c %d?", a, op, b);
        snprintf(ans, sizeof ans, "%d %c %d = %ld. The answer is %ld.", a, op, b, v, v);
        json_t *msgs = json_array();
        json_array_append_new(msgs, message("user", q));
        json_array_append_new(msgs, message("assistant", ans));
        json_t *line = json_pack("{s:o, s:s, s:i}", "messages", msgs, "domain", "demo", "id", i);
        char *text = json_dumps(line, JSON_COMPACT);
        json_decref(line);
        if (!text) return prl_error_set(PRL_ERR_NOMEM, "demo line %d", i);
        int ok = fprintf(out, "%s\n", text) > 0;
        free(text);
        if (!ok) return prl_error_set(PRL_ERR_IO, "demo: write failed at line %d", i);
    }
    return PRL_OK;
}
