/*
** test_sft_mask.c — masked erroneous steps in SFT data (sft.h, docs/formats.md "Masked
** steps"): an Agent demonstration whose first call the environment rejects keeps that turn's
** tokens as context with mask 0 and trains the recovery after it; steps a user marks
** ("mask": true, a tool reply's "error": true) are masked the same; bad marks are errors
** naming the line; without marks or --mask-errors the masks are today's.
*/
#include "sft/sft.h"
#include "tasks/tasks.h"
#include "tests/check_util.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[64];

static void write_file(const char *text)
{
    snprintf(path, sizeof path, "/tmp/prl_sft_mask_%d.jsonl", (int)getpid());
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_ge(fputs(text, f), 0);
    ck_assert_int_eq(fclose(f), 0);
}

static prl_status load(prl_sft_data *d, const prl_tokenizer *tok, unsigned flags)
{
    return prl_sft_data_load(d, path, tok, 4096, PRL_TOKENIZER_SPECIAL | flags);
}

/* Tokens of the chat made of the first k messages (bos .. eos), as the loader encodes them. */
static size_t prefix_len(const prl_tokenizer *tok, json_t *msgs, size_t k)
{
    prl_chat_message *cm = calloc(k + 1, sizeof *cm);
    for (size_t i = 0; i < k; i++) {
        cm[i].role = json_string_value(json_object_get(json_array_get(msgs, i), "role"));
        cm[i].content = json_string_value(json_object_get(json_array_get(msgs, i), "content"));
    }
    int32_t *ids = NULL;
    size_t n = 0;
    assert_ok(prl_tokenizer_encode_chat(tok, cm, k, PRL_TOKENIZER_SPECIAL, &ids, NULL, &n));
    free(ids), free(cm);
    return n;
}

/* Mask sum over the content and end token of message k (positions [start, end)). */
static void span_of(const prl_tokenizer *tok, json_t *msgs, size_t k, size_t *start, size_t *end)
{
    /* the chat of messages [0, k) is bos, turns, eos: message k's role token takes the eos's
    ** place and its content follows; the chat of [0, k] ends with message k's end, then eos */
    *start = prefix_len(tok, msgs, k);
    *end = prefix_len(tok, msgs, k + 1) - 1;
}

static int sum(const uint8_t *m, size_t a, size_t b)
{
    int s = 0;
    for (size_t i = a; i < b; i++) s += m[i];
    return s;
}

typedef struct first_malformed {
    json_t *line;
} first_malformed;

static prl_status keep_malformed(void *user, json_t *line)
{
    first_malformed *f = user;
    const char *kind = json_string_value(json_object_get(line, "demo_error"));
    if (!f->line && kind && !strcmp(kind, "malformed_call")) f->line = json_incref(line);
    return PRL_OK;
}

/* A generated Agent demonstration with a malformed first call: the env answers "error: ...",
** so with PRL_SFT_MASK_ERRORS that turn is masked (kept as context) and the correct call, the
** rest of the episode and the answer keep mask 1; without the flag nothing changes. */
START_TEST(test_rejected_step_masked)
{
    prl_tasks_config c;
    prl_tasks_config_default(&c, PRL_TASK_AGENT);
    c.n = 40, c.demos = 1, c.error_rate = 1.0, c.seed = 7, c.difficulty = 2;
    first_malformed f = {0};
    assert_ok(prl_tasks_generate(&c, keep_malformed, &f));
    ck_assert_ptr_nonnull(f.line);
    json_t *msgs = json_object_get(f.line, "messages");
    /* system, user, assistant (malformed), tool (error), assistant (the correct call), ... */
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(msgs, 2), "role")),
                     "assistant");
    const char *obs = json_string_value(json_object_get(json_array_get(msgs, 3), "content"));
    ck_assert_msg(!strncmp(obs, "error: ", 7), "observation '%s'", obs);
    char *text = json_dumps(f.line, JSON_COMPACT);
    size_t tl = strlen(text);
    text = realloc(text, tl + 2);
    memcpy(text + tl, "\n", 2);
    write_file(text);
    free(text);

    prl_tokenizer *tok;
    assert_ok(prl_tokenizer_init_bytes(&tok));
    prl_sft_data plain, masked;
    assert_ok(load(&plain, tok, 0));
    assert_ok(load(&masked, tok, PRL_SFT_MASK_ERRORS));
    ck_assert_int_eq(plain.n_masked_steps, 0);
    ck_assert_int_eq(masked.n_masked_steps, 1);
    const prl_sft_example *p = &plain.ex[0], *m = &masked.ex[0];
    ck_assert_int_eq(p->n, m->n);
    ck_assert_mem_eq(p->ids, m->ids, (size_t)p->n * sizeof *p->ids); /* the same context */
    size_t a, b, ra, rb;
    span_of(tok, msgs, 2, &a, &b);   /* the rejected turn */
    span_of(tok, msgs, 4, &ra, &rb); /* the recovery */
    ck_assert_uint_gt(b, a + 2);
    ck_assert_int_eq(sum(p->mask, a, b), (int)(b - a)); /* trained on today */
    ck_assert_int_eq(sum(m->mask, a, b), 0);            /* masked */
    ck_assert_int_eq(sum(m->mask, ra, rb), (int)(rb - ra));
    for (size_t i = 0; i < (size_t)m->n; i++)
        if (i < a || i >= b) ck_assert_int_eq(m->mask[i], p->mask[i]);
    ck_assert_uint_eq(masked.n_loss_tokens, plain.n_loss_tokens - (b - a));
    prl_sft_data_free(&plain);
    prl_sft_data_free(&masked);
    prl_tokenizer_free(tok);
    json_decref(f.line);
    unlink(path);
}
END_TEST

/* A user's dataset: "mask": true on an assistant message, or "error": true on the tool reply
** after one, masks that turn whatever the flags; the recovery is trained. */
START_TEST(test_user_marked_steps)
{
    write_file(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
        "\"content\": \"bad call\", \"mask\": true}, {\"role\": \"tool\", \"content\": \"no\"}, "
        "{\"role\": \"assistant\", \"content\": \"good call\"}]}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
        "\"content\": \"bad call\"}, {\"role\": \"tool\", \"content\": \"no\", \"error\": true}, "
        "{\"role\": \"assistant\", \"content\": \"good call\", \"mask\": false}]}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
        "\"content\": \"bad call\"}, {\"role\": \"tool\", \"content\": \"error: no\"}, "
        "{\"role\": \"assistant\", \"content\": \"good call\"}]}\n");
    prl_tokenizer *tok;
    assert_ok(prl_tokenizer_init_bytes(&tok));
    prl_sft_data d;
    assert_ok(load(&d, tok, 0)); /* no --mask-errors: the third line's "error: " is not a mark */
    ck_assert_int_eq(d.n, 3);
    ck_assert_int_eq(d.n_masked_steps, 2);
    /* <|bos|> <|user|> q <|end|> <|assistant|> "bad call" <|end|> <|tool|> "no" <|end|>
    ** <|assistant|> "good call" <|end|> <|eos|> */
    size_t bad = 5;
    for (int e = 0; e < 3; e++) {
        const prl_sft_example *x = &d.ex[e];
        size_t good = bad + 8 + 1 + 1 + (e == 2 ? 9 : 2) + 1 + 1; /* past the tool reply */
        ck_assert_int_eq(x->ids[bad], 16 + 'b');
        ck_assert_int_eq(x->ids[good], 16 + 'g');
        ck_assert_int_eq(sum(x->mask, bad, bad + 9), (e == 2 ? 9 : 0)); /* "bad call" <|end|> */
        ck_assert_int_eq(sum(x->mask, good, good + 10), 10);            /* "good call" <|end|> */
        ck_assert_int_eq(x->mask[x->n - 1], 1);                         /* <|eos|> */
    }
    prl_sft_data_free(&d);
    assert_ok(load(&d, tok, PRL_SFT_MASK_ERRORS)); /* now the environment's words count */
    ck_assert_int_eq(d.n_masked_steps, 3);
    ck_assert_int_eq(sum(d.ex[2].mask, bad, bad + 9), 0);
    prl_sft_data_free(&d);
    prl_tokenizer_free(tok);
    unlink(path);
}
END_TEST

/* Marks that are not booleans, or on a role they cannot mark, are errors naming the line;
** nothing is loaded. */
START_TEST(test_bad_marks)
{
    static const char *const lines[] = {
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
        "\"content\": \"a\", \"mask\": \"yes\"}]}\n",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\", \"mask\": true}, {\"role\": "
        "\"assistant\", \"content\": \"a\"}]}\n",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
        "\"content\": \"a\", \"error\": true}]}\n",
    };
    prl_tokenizer *tok;
    assert_ok(prl_tokenizer_init_bytes(&tok));
    for (int i = 0; i < 3; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, "
                 "{\"role\": \"assistant\", \"content\": \"a\"}]}\n%s",
                 lines[i]);
        write_file(text);
        prl_sft_data d;
        ck_assert_int_eq(load(&d, tok, 0), PRL_ERR_FORMAT);
        assert_msg_has(":2: message ");
        assert_msg_has(i == 2 ? "\"error\"" : "\"mask\"");
        ck_assert_int_eq(d.n, 0);
        ck_assert_ptr_null(d.ex);
    }
    prl_tokenizer_free(tok);
    unlink(path);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sft_mask");
    TCase *tc = tcase_create("mask");
    tcase_add_test(tc, test_rejected_step_masked);
    tcase_add_test(tc, test_user_marked_steps);
    tcase_add_test(tc, test_bad_marks);
    suite_add_tcase(s, tc);
    return check_run(s);
}
