/*
** general.c — the General verifier: one check of weight 1 per constraint of the task, on the
** last assistant turn, so the score is the fraction of constraints met (partial credit); and,
** when the task lists its topic's words, a required check that the answer is about the topic
** (the score is 0 when it is not); then the degenerate-text monitor (monitor.c), whose
** findings score 0 too.
**
** Text model: a word is a maximal run of [A-Za-z0-9']; words compare case-insensitively; a
** sentence is a stretch of text holding a word, ended by a run of . ! ? or by the end; a
** bullet is a non-empty line starting with "- ". The constraint types and their JSON
** parameters are listed in docs/tasks.md.
*/
#include "reward/reward_int.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { MAX_RUN = 4 /* on_topic: words in a row */ };

typedef reward__text text;

static int word_char(char c) { return isalnum((unsigned char)c) || c == '\''; }

/* How often w occurs among the first n words. */
static int count_in(const text *t, const char *w, int n)
{
    int c = 0;
    for (int i = 0; i < n; i++) c += strcasecmp(t->words[i], w) == 0;
    return c;
}

static int count_word(const text *t, const char *w) { return count_in(t, w, t->n_words); }

static int first_index(const text *t, const char *w)
{
    for (int i = 0; i < t->n_words; i++)
        if (!strcasecmp(t->words[i], w)) return i;
    return -1;
}

static int count_sentences(const char *s)
{
    int n = 0, open = 0;
    for (const char *p = s; *p; p++) {
        if (word_char(*p)) open = 1;
        else if ((*p == '.' || *p == '!' || *p == '?') && open) n++, open = 0;
    }
    return n + open;
}

/* Non-empty lines; *all_bullets = every one starts with "- ". */
static int count_lines(const char *s, int *all_bullets)
{
    int n = 0;
    *all_bullets = 1;
    for (const char *p = s; *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        size_t i = 0;
        while (i < len && isspace((unsigned char)p[i])) i++;
        if (i < len) {
            n++;
            if (len - i < 2 || p[i] != '-' || p[i + 1] != ' ') *all_bullets = 0;
        }
        p += len + (e != NULL);
    }
    return n;
}

static int has_letters(const char *s, int upper)
{
    for (const char *p = s; *p; p++)
        if (upper ? isupper((unsigned char)*p) : islower((unsigned char)*p)) return 1;
    return 0;
}

static int quoted(const char *s)
{
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) n--;
    return n >= 2 && s[0] == '"' && s[n - 1] == '"';
}

/* A string or integer field of a constraint; reports a malformed task. */
static prl_status field_str(const json_t *c, const char *key, int i, const char **v)
{
    *v = json_string_value(json_object_get(c, key));
    return *v && **v ? PRL_OK
                     : prl_error_set(PRL_ERR_FORMAT,
                                     "general task: constraint %d "
                                     "needs a string \"%s\"",
                                     i, key);
}

static prl_status field_int(const json_t *c, const char *key, int i, int *v)
{
    json_t *x = json_object_get(c, key);
    *v = (int)json_integer_value(x);
    return json_is_integer(x) ? PRL_OK
                              : prl_error_set(PRL_ERR_FORMAT,
                                              "general task: constraint "
                                              "%d needs an integer \"%s\"",
                                              i, key);
}

static prl_status check_count(const json_t *c, int i, const text *t, prl_reward_result *out)
{
    const char *rel;
    int n;
    prl_status rc = field_str(c, "relation", i, &rel);
    if (!rc) rc = field_int(c, "n", i, &n);
    if (rc) return rc;
    int w = t->n_words;
    int ok = !strcmp(rel, "exactly")    ? w == n
             : !strcmp(rel, "at_most")  ? w <= n
             : !strcmp(rel, "at_least") ? w >= n
                                        : -1;
    if (ok < 0)
        return prl_error_set(PRL_ERR_FORMAT,
                             "general task: constraint %d: unknown relation "
                             "'%s' (exactly, at_most, at_least)",
                             i, rel);
    reward__check(out, "word_count", ok, 1, 0, "%s %d words, got %d", rel, n, w);
    return PRL_OK;
}

static prl_status check_one(const json_t *c, int i, const text *t, prl_reward_result *out)
{
    const char *type, *w = NULL, *w2 = NULL;
    int n = 0, got;
    prl_status rc = field_str(c, "type", i, &type);
    if (rc) return rc;
    if (!strcmp(type, "word_count")) return check_count(c, i, t, out);
    if (!strcmp(type, "case")) {
        if ((rc = field_str(c, "value", i, &w))) return rc;
        int upper = !strcmp(w, "upper");
        if (!upper && strcmp(w, "lower"))
            return prl_error_set(PRL_ERR_FORMAT,
                                 "general task: constraint %d: case must be upper or lower", i);
        int ok = has_letters(t->s, upper) && !has_letters(t->s, !upper);
        reward__check(out, "case", ok, 1, 0, "only %s-case letters%s", w, ok ? "" : ": not so");
    } else if (!strcmp(type, "sentence_count")) {
        if ((rc = field_int(c, "n", i, &n))) return rc;
        got = count_sentences(t->s);
        reward__check(out, "sentence_count", got == n, 1, 0, "exactly %d sentences, got %d", n,
                      got);
    } else if (!strcmp(type, "bullets")) {
        int all;
        if ((rc = field_int(c, "n", i, &n))) return rc;
        got = count_lines(t->s, &all);
        reward__check(out, "bullets", all && got == n, 1, 0,
                      "%d lines starting with '- ', got %d "
                      "lines%s",
                      n, got, all ? "" : " (not all bullets)");
    } else if (!strcmp(type, "quoted")) {
        int ok = quoted(t->s);
        reward__check(out, "quoted", ok, 1, 0, "wrapped in double quotes%s", ok ? "" : ": not so");
    } else if (!strcmp(type, "order")) {
        if ((rc = field_str(c, "first", i, &w)) || (rc = field_str(c, "second", i, &w2))) return rc;
        int a = first_index(t, w), b = first_index(t, w2);
        reward__check(out, "order", a >= 0 && b >= 0 && a < b, 1, 0,
                      "'%s' (word %d) before '%s' "
                      "(word %d)",
                      w, a + 1, w2, b + 1);
    } else {
        static const char *const word_types[] = {"word_repeat", "include", "forbid", "start",
                                                 "end"};
        int known = 0;
        for (int k = 0; k < 5; k++) known |= !strcmp(type, word_types[k]);
        if (!known)
            return prl_error_set(PRL_ERR_FORMAT, "general task: constraint %d: unknown type '%s'",
                                 i, type);
        if ((rc = field_str(c, "word", i, &w))) return rc;
        got = count_word(t, w);
        if (!strcmp(type, "word_repeat")) {
            if ((rc = field_int(c, "n", i, &n))) return rc;
            reward__check(out, "word_repeat", got == n, 1, 0, "'%s' exactly %d times, got %d", w, n,
                          got);
        } else if (!strcmp(type, "include")) {
            reward__check(out, "include", got > 0, 1, 0, "'%s' used %d times", w, got);
        } else if (!strcmp(type, "forbid")) {
            reward__check(out, "forbid", got == 0, 1, 0, "'%s' used %d times", w, got);
        } else { /* start, end */
            const char *x = t->n_words == 0 ? "" : t->words[type[0] == 's' ? 0 : t->n_words - 1];
            reward__check(out, type, !strcasecmp(x, w), 1, 0, "%s word '%s', got '%s'",
                          type[0] == 's' ? "first" : "last", w, x);
        }
    }
    return PRL_OK;
}

/* How often a response may use w before it is padding: 0 for a word no constraint names,
** else what the constraint asks for (n for word_repeat, 1 otherwise) plus one, so that a
** one-word violation of word_repeat is still on topic. */
static int allowance(const json_t *cons, const char *w)
{
    static const char *const word_keys[] = {"word", "first", "second"};
    size_t i;
    const json_t *c;
    json_array_foreach(cons, i, c)
    {
        const char *type = json_string_value(json_object_get(c, "type"));
        int named = 0;
        for (int k = 0; k < 3; k++) {
            const char *v = json_string_value(json_object_get(c, word_keys[k]));
            named |= v && !strcasecmp(v, w);
        }
        if (named) {
            json_t *n = json_object_get(c, "n");
            return (type && !strcmp(type, "word_repeat") && json_is_integer(n)
                        ? (int)json_integer_value(n)
                        : 1) +
                   1;
        }
    }
    return 0;
}

static int in_list(const json_t *words, const char *w)
{
    size_t i;
    const json_t *x;
    json_array_foreach(words, i, x) if (!strcasecmp(json_string_value(x), w)) return 1;
    return 0;
}

/* "on_topic", a gate (required, weight 0): at most a quarter of the words are off topic — a
** word off topic being neither one of the topic's words nor one a constraint names, or a named
** word past its allowance, or a word said for the (MAX_RUN + 1)-th time in a row — and there is
** a word. Without it the cheapest way to meet include/order/start is to pad with the
** constraint vocabulary ("Old small red blue happy ..."), and greedy decoding of a policy
** trained so loops on one filler word ("sing sing sing ..."); rule checks alone never penalise
** either. As a gate it earns nothing by itself (as a check of weight 1 GRPO learned one-word
** answers, which are on topic and worth a point); the quarter leaves room for a stray word of a
** sampled answer. Tasks without "topic_words" (written before this check) get no such check. */
static prl_status check_on_topic(const json_t *task, const json_t *cons, const text *t,
                                 prl_reward_result *out)
{
    const json_t *bank = json_object_get(task, "topic_words");
    if (!bank) return PRL_OK;
    size_t i, n = json_array_size(bank);
    const json_t *x;
    int ok = json_is_array(bank) && n > 0 && n <= PRL_REWARD_MAX_ITEMS;
    json_array_foreach(bank, i, x) ok &= json_string_length(x) > 0;
    if (!ok)
        return prl_error_set(PRL_ERR_FORMAT,
                             "general task: \"topic_words\" must be an array "
                             "of 1..%d non-empty strings",
                             PRL_REWARD_MAX_ITEMS);
    int off = 0, first = -1, run = 0;
    for (int k = 0; k < t->n_words; k++) {
        const char *w = t->words[k];
        run = k > 0 && !strcasecmp(t->words[k - 1], w) ? run + 1 : 1;
        int on =
            run <= MAX_RUN && (in_list(bank, w) || count_in(t, w, k + 1) <= allowance(cons, w));
        if (on) continue;
        off++;
        if (first < 0) first = k;
    }
    int pass = t->n_words > 0 && 4 * off <= t->n_words;
    if (off)
        reward__check(out, "on_topic", pass, 0, 1,
                      "%d of %d words off topic (at most a quarter), "
                      "first '%s' (word %d)",
                      off, t->n_words, t->words[first], first + 1);
    else reward__check(out, "on_topic", pass, 0, 1, "%d words, all on topic", t->n_words);
    return PRL_OK;
}

prl_status prl_reward_general(const char *task_json, const prl_chat_message *turns, size_t n_turns,
                              prl_reward_result *out)
{
    json_t *task, *cons;
    prl_status rc =
        reward__task_list(task_json, PRL_TASK_GENERAL, turns, n_turns, "constraints", &task, &cons);
    if (rc) return rc;
    reward__begin(out);
    const char *response = reward__last_assistant(turns, n_turns);
    text *t = malloc(sizeof *t); /* 16 KiB of words: off the stack */
    if (!t) rc = prl_error_set(PRL_ERR_NOMEM, "general verifier");
    else reward__split_words(t, response ? response : "");
    size_t i;
    json_t *c;
    json_array_foreach(cons, i, c)
    {
        if (rc || (rc = check_one(c, (int)i, t, out))) break;
    }
    if (!rc) rc = check_on_topic(task, cons, t, out);
    if (!rc) reward__monitor_text(t, cons, out);
    free(t);
    json_decref(task);
    if (rc) return rc;
    if (!response) out->flags |= PRL_REWARD_FORMAT_ERROR;
    reward__finish(out);
    return PRL_OK;
}
