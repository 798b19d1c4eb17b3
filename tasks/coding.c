/*
** coding.c — the Coding domain: small Python programs (read stdin, write stdout) from a
** one-line spec, with hidden tests whose expected output is computed here in C.
**
** A problem is a family (difficulty 1: one value in, one out; 2: two values or a letter
** count; 3: a loop over a list or a range) with a parameter K (or a letter). Its hidden tests
** are 5 inputs drawn for the family; the reference program is the demonstration. A deliberate
** mistake is the program of the neighbouring parameter (K + 1, the next letter); the tests
** are redrawn until that program fails at least one of them, so a mistaken demonstration
** never scores 1.
*/
#include "tasks/tasks_int.h"

#include <stdlib.h>
#include <string.h>

enum { N_TESTS = 5, MAX_REDRAWS = 200, MAX_LIST = 6 };

typedef enum cfamily {
    F_ADD,
    F_SUB,
    F_MUL,
    F_REPEAT,
    F_SUFFIX, /* difficulty 1 */
    F_PAIR,
    F_PAIR_MAX,
    F_COUNT_CHAR,
    F_MOD, /* difficulty 2 */
    F_SUM_ABOVE,
    F_COUNT_DIV,
    F_MULTIPLES,
    F_STEPS, /* difficulty 3 */
    N_FAMILIES
} cfamily;

typedef struct cinfo {
    int difficulty, k_lo, k_hi;
    const char *spec;    /* %d = K, %c = the letter */
    const char *program; /* %d = K, %c = the letter */
} cinfo;

static const cinfo families[N_FAMILIES] = {
    [F_ADD] = {1, 2, 99, "Read an integer n. Print n + %d.", "print(int(input()) + %d)"},
    [F_SUB] = {1, 2, 99, "Read an integer n. Print n - %d.", "print(int(input()) - %d)"},
    [F_MUL] = {1, 2, 30, "Read an integer n. Print n * %d.", "print(int(input()) * %d)"},
    [F_REPEAT] = {1, 2, 6, "Read a word. Print it %d times, separated by spaces.",
                  "print(' '.join([input()] * %d))"},
    [F_SUFFIX] = {1, 10, 99, "Read a word. Print the word followed by %d.",
                  "print(input() + '%d')"},
    [F_PAIR] = {2, 2, 20, "Read two integers a and b on one line. Print a * %d + b.",
                "a, b = map(int, input().split())\nprint(a * %d + b)"},
    [F_PAIR_MAX] = {2, 1, 50, "Read two integers on one line. Print the larger one plus %d.",
                    "print(max(map(int, input().split())) + %d)"},
    [F_COUNT_CHAR] = {2, 0, 25, "Read a word. Print how many times the letter %c appears in it.",
                      "print(input().count('%c'))"},
    [F_MOD] = {2, 2, 20, "Read an integer n. Print the remainder of n divided by %d.",
               "print(int(input()) %% %d)"},
    [F_SUM_ABOVE] = {3, 0, 50, "Read integers on one line. Print the sum of those greater than %d.",
                     "print(sum(x for x in map(int, input().split()) if x > %d))"},
    [F_COUNT_DIV] = {3, 2, 9,
                     "Read integers on one line. Print how many of them are divisible by %d.",
                     "print(sum(1 for x in map(int, input().split()) if x %% %d == 0))"},
    [F_MULTIPLES] = {3, 2, 9,
                     "Read an integer n. Print the sum of the multiples of %d from 1 to n.",
                     "n = int(input())\nprint(sum(range(%d, n + 1, %d)))"},
    [F_STEPS] = {3, 2, 5,
                 "Read an integer n. Print n, n - %d, n - %d * 2 and so on while the "
                 "number is positive, one per line.",
                 "n = int(input())\nwhile n > 0:\n    print(n)\n    n -= %d"},
};

/* Format a family string with its parameter (K, or the letter 'a' + K); every %d gets K. */
static void format_param(tasks__buf *b, const char *fmt, int k)
{
    for (const char *p = fmt; *p; p++) {
        if (p[0] == '%' && p[1] == 'd') tasks__buf_printf(b, "%d", k), p++;
        else if (p[0] == '%' && p[1] == 'c') tasks__buf_printf(b, "%c", 'a' + k), p++;
        else if (p[0] == '%' && p[1] == '%') tasks__buf_printf(b, "%%"), p++;
        else tasks__buf_printf(b, "%c", *p);
    }
}

/* A lowercase word of 3..7 letters; `letter` (>= 0) is drawn a third of the time. */
static void draw_word(prl_rng *r, int letter, tasks__buf *b)
{
    int n = (int)tasks__range(r, 3, 7);
    for (int i = 0; i < n; i++) {
        int c = letter >= 0 && tasks__chance(r, 1.0 / 3) ? letter : (int)tasks__range(r, 0, 25);
        tasks__buf_printf(b, "%c", 'a' + c);
    }
}

static void draw_input(prl_rng *r, cfamily f, int k, tasks__buf *b)
{
    switch (f) {
    case F_ADD:
    case F_SUB:
    case F_MUL:
    case F_MOD: tasks__buf_printf(b, "%lld", (long long)tasks__range(r, 10, 999)); break;
    case F_MULTIPLES: tasks__buf_printf(b, "%lld", (long long)tasks__range(r, 10, 200)); break;
    case F_STEPS: tasks__buf_printf(b, "%lld", (long long)tasks__range(r, 10, 30)); break;
    case F_REPEAT:
    case F_SUFFIX: draw_word(r, -1, b); break;
    case F_COUNT_CHAR: draw_word(r, k, b); break;
    case F_PAIR:
    case F_PAIR_MAX:
        tasks__buf_printf(b, "%lld %lld", (long long)tasks__range(r, 10, 99),
                          (long long)tasks__range(r, 10, 99));
        break;
    case F_SUM_ABOVE:
    case F_COUNT_DIV: {
        int n = (int)tasks__range(r, 3, MAX_LIST);
        for (int i = 0; i < n; i++)
            tasks__buf_printf(b, "%s%lld", i ? " " : "", (long long)tasks__range(r, 10, 99));
        break;
    }
    case N_FAMILIES: break;
    }
    tasks__buf_printf(b, "\n");
}

/* The expected stdout of family f with parameter k on input `in` (what the reference
** program prints, computed independently of Python). */
static void solve(cfamily f, int k, const char *in, tasks__buf *out)
{
    long long v[MAX_LIST + 1];
    int n = 0;
    char *end;
    for (const char *p = in; n <= MAX_LIST; p = end) {
        v[n] = strtoll(p, &end, 10);
        if (end == p) break;
        n++;
    }
    size_t wl = strcspn(in, "\n");
    switch (f) {
    case F_ADD: tasks__buf_printf(out, "%lld", v[0] + k); break;
    case F_SUB: tasks__buf_printf(out, "%lld", v[0] - k); break;
    case F_MUL: tasks__buf_printf(out, "%lld", v[0] * k); break;
    case F_MOD: tasks__buf_printf(out, "%lld", v[0] % k); break;
    case F_REPEAT:
        for (int i = 0; i < k; i++) tasks__buf_printf(out, "%s%.*s", i ? " " : "", (int)wl, in);
        break;
    case F_SUFFIX: tasks__buf_printf(out, "%.*s%d", (int)wl, in, k); break;
    case F_PAIR: tasks__buf_printf(out, "%lld", v[0] * k + v[1]); break;
    case F_PAIR_MAX: tasks__buf_printf(out, "%lld", (v[0] > v[1] ? v[0] : v[1]) + k); break;
    case F_COUNT_CHAR: {
        int c = 0;
        for (size_t i = 0; i < wl; i++) c += in[i] == 'a' + k;
        tasks__buf_printf(out, "%d", c);
        break;
    }
    case F_SUM_ABOVE:
    case F_COUNT_DIV: {
        long long s = 0;
        for (int i = 0; i < n; i++) s += f == F_SUM_ABOVE ? (v[i] > k ? v[i] : 0) : v[i] % k == 0;
        tasks__buf_printf(out, "%lld", s);
        break;
    }
    case F_MULTIPLES: {
        long long s = 0;
        for (long long x = k; x <= v[0]; x += k) s += x;
        tasks__buf_printf(out, "%lld", s);
        break;
    }
    case F_STEPS:
        for (long long x = v[0]; x > 0; x -= k) tasks__buf_printf(out, "%lld\n", x);
        break;
    case N_FAMILIES: break;
    }
    if (f != F_STEPS) tasks__buf_printf(out, "\n");
}

static cfamily pick_family(prl_rng *r, int difficulty)
{
    int count = 0;
    for (int f = 0; f < N_FAMILIES; f++) count += families[f].difficulty == difficulty;
    int k = (int)tasks__range(r, 0, count - 1);
    for (int f = 0; f < N_FAMILIES; f++)
        if (families[f].difficulty == difficulty && k-- == 0) return (cfamily)f;
    PRL_ASSERT(0);
    return N_FAMILIES;
}

/* The nearby parameter a mistaken demonstration uses (a wider step where K + 1 would
** rarely change the output). */
static int wrong_param(cfamily f, int k)
{
    return f == F_COUNT_CHAR ? (k + 1) % 26 : f == F_SUM_ABOVE ? k + 10 : k + 1;
}

/* Hidden tests: redrawn until the mistaken program fails one (see the file comment). */
static json_t *make_tests(prl_rng *r, cfamily f, int k)
{
    for (int attempt = 0; attempt < MAX_REDRAWS; attempt++) {
        json_t *tests = json_array();
        int differs = 0;
        for (int t = 0; tests && t < N_TESTS; t++) {
            tasks__buf in = {0}, out = {0}, wrong = {0};
            draw_input(r, f, k, &in);
            if (!in.oom) solve(f, k, in.s, &out);
            if (!in.oom) solve(f, wrong_param(f, k), in.s, &wrong);
            int oom = in.oom || out.oom || wrong.oom;
            differs |= !oom && strcmp(out.s, wrong.s) != 0;
            json_t *test = oom ? NULL : json_pack("{s:s, s:s}", "stdin", in.s, "stdout", out.s);
            if (!test || json_array_append_new(tests, test) != 0) {
                json_decref(tests);
                tests = NULL;
            }
            tasks__buf_free(&in);
            tasks__buf_free(&out);
            tasks__buf_free(&wrong);
        }
        if (!tests || differs) return tests;
        json_decref(tests);
    }
    return NULL;
}

prl_status tasks__coding_make(tasks__gen *g, tasks__draft *d)
{
    cfamily f = pick_family(&g->problem, g->difficulty);
    const cinfo *info = &families[f];
    int k = (int)tasks__range(&g->problem, info->k_lo, info->k_hi);
    tasks__buf q = {0};
    tasks__buf_printf(&q, "Write a Python program. ");
    format_param(&q, info->spec, k);
    d->prompt = q.oom ? NULL : tasks__prompt(NULL, q.s);
    tasks__buf_free(&q);
    json_t *tests = make_tests(&g->problem, f, k);
    if (!tests) {
        json_decref(d->prompt), d->prompt = NULL;
        return prl_error_set(PRL_ERR_RANGE, "no tests that tell K = %d from %d apart", k,
                             wrong_param(f, k));
    }
    d->fields = json_pack("{s:o}", "tests", tests);
    if (!d->prompt || !d->fields) return prl_error_set(PRL_ERR_NOMEM, "coding problem");
    if (!g->demos) return PRL_OK;
    d->turns = json_array();
    if (!d->turns) return prl_error_set(PRL_ERR_NOMEM, "coding demo");
    int slip = tasks__chance(&g->demo, g->error_rate);
    d->demo_error = slip ? "wrong_constant" : "none";
    tasks__buf code = {0};
    tasks__buf_printf(&code, "```python\n");
    format_param(&code, info->program, slip ? wrong_param(f, k) : k);
    tasks__buf_printf(&code, "\n```");
    prl_status rc = code.oom ? prl_error_set(PRL_ERR_NOMEM, "coding demo")
                             : tasks__append(d->turns, "assistant", code.s);
    tasks__buf_free(&code);
    return rc;
}
