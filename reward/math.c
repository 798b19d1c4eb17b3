/*
** math.c — the `math` verifier of prompt files (docs/rewards.md "Prompt-file verifiers"):
** the final answer is extracted from the last assistant turn and compared with the line's
** "answer" as a value (numbers, fractions, simple LaTeX), else as normalised text.
**
** Extraction, first form found wins: the last \boxed{...} (braces balanced); else the text
** after the last "####"; else the text after the last "answer:" (any case; "the answer is"
** too), up to the end of that line. Comparison: both sides normalised (below) and evaluated
** by a small expression grammar; equal when |a − b| ≤ 1e-6·max(1, |b|). When either side is
** not a value, the normalised texts must be equal (case-insensitive).
**
** Checks: "format" (required) — an answer was extracted from a final turn that is not a tool
** call; "answer" (weight 1); and the python tool's "tool_syntax" / "python_parse" checks and
** penalties of the Reasoning verifier, since math lines play as Reasoning (reasoning.c).
*/
#include "reward/reward_int.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- extraction ------- */

/* The content of the last \boxed{...} (balanced braces) into out; 0 when found. */
static int last_boxed(const char *t, char *out, size_t n)
{
    const char *at = NULL;
    for (const char *p = strstr(t, "\\boxed{"); p; p = strstr(p + 1, "\\boxed{")) at = p;
    if (!at) return -1;
    const char *s = at + 7, *e = s;
    for (int depth = 1; *e && depth > 0; e++) depth += *e == '{' ? 1 : *e == '}' ? -1 : 0;
    if (e[-1] != '}' || e == s) return -1;
    snprintf(out, n, "%.*s", (int)(e - 1 - s), s);
    return 0;
}

/* The rest of the line after position p (k bytes of marker) into out; 0 when non-empty. */
static int rest_of_line(const char *p, size_t k, char *out, size_t n)
{
    p += k;
    while (*p == ' ' || *p == '\t' || *p == ':') p++;
    size_t len = strcspn(p, "\n");
    while (len > 0 && isspace((unsigned char)p[len - 1])) len--;
    if (len == 0) return -1;
    snprintf(out, n, "%.*s", (int)len, p);
    return 0;
}

int prl_reward_math_extract(const char *text, char *out, size_t n)
{
    if (last_boxed(text, out, n) == 0) return 0;
    const char *p = strstr(text, "####"), *q;
    while (p && (q = strstr(p + 4, "####")) != NULL) p = q;
    if (p) return rest_of_line(p, 4, out, n);
    const char *a = reward__last_ci(text, "answer:"), *b = reward__last_ci(text, "the answer is");
    if (b && (!a || b > a)) return rest_of_line(b, 13, out, n);
    return a ? rest_of_line(a, 7, out, n) : -1;
}

/* ---------------------------------------------------------------- normalising ------ */

/* Remove every occurrence of `word` from s, in place. */
static void drop(char *s, const char *word)
{
    size_t k = strlen(word);
    for (char *p = strstr(s, word); p; p = strstr(p, word)) memmove(p, p + k, strlen(p + k) + 1);
}

/* Remove \cmd{...} groups (units written as \text{cm}, \mathrm{kg}) whole. */
static void drop_group(char *s, const char *cmd)
{
    size_t k = strlen(cmd);
    for (char *p = strstr(s, cmd); p; p = strstr(p, cmd)) {
        char *e = p + k;
        for (int depth = 1; *e && depth > 0; e++) depth += *e == '{' ? 1 : *e == '}' ? -1 : 0;
        memmove(p, e, strlen(e) + 1);
    }
}

/* "12 apples", "-3.5 cm per hour": a leading number followed by words only keeps the number
** (a word glued to the number, as in 2pi, is not a unit). */
static void drop_unit_words(char *s)
{
    char *p = s;
    while (*p == ' ') p++;
    char *v = p;
    while (*p && (isdigit((unsigned char)*p) || strchr("+-./,", *p))) p++;
    if (p == v || !isdigit((unsigned char)p[-1]) || *p != ' ') return;
    for (const char *q = p; *q; q++)
        if (!isalpha((unsigned char)*q) && *q != ' ' && *q != '.') return;
    *p = 0;
}

/* Normalise an answer text in place: $, spaces, \left \right, \! \, \; spacing, \dfrac and
** \tfrac as \frac, units (\text{...}, \mathrm{...}, ^\circ, %, trailing words), thousands
** separators in numbers ("1,000"), a trailing period. */
void prl_reward_math_normalise(char *s)
{
    static const char *const words[] = {"$",   "\\left",  "\\right",   "\\!", "\\,", "\\;",
                                        "\\ ", "^\\circ", "^{\\circ}", "\\%", "%",   "°"};
    drop_group(s, "\\text{");
    drop_group(s, "\\mathrm{");
    drop_group(s, "\\textbf{");
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) drop(s, words[i]);
    drop_unit_words(s);
    for (char *p = strstr(s, "frac"); p; p = strstr(p + 1, "frac"))
        if (p > s + 1 && p[-2] == '\\' && (p[-1] == 'd' || p[-1] == 't'))
            memmove(p - 1, p, strlen(p) + 1); /* \dfrac → \frac */
    size_t k = 0, n = strlen(s);
    for (size_t i = 0; i < n; i++) { /* spaces and separators: "1,000" but not "1, 2" */
        if (isspace((unsigned char)s[i])) continue;
        if (s[i] == ',' && k > 0 && isdigit((unsigned char)s[k - 1]) && i + 3 < n + 1 &&
            isdigit((unsigned char)s[i + 1]) && isdigit((unsigned char)s[i + 2]) &&
            isdigit((unsigned char)s[i + 3]) && !isdigit((unsigned char)s[i + 4]))
            continue;
        s[k++] = s[i];
    }
    s[k] = 0;
    while (*s && s[strlen(s) - 1] == '.') s[strlen(s) - 1] = 0;
}

/* ---------------------------------------------------------------- evaluating ------- */
/* expr := term (('+'|'-') term)* ; term := unary (('*'|'/'|\cdot|\times|implicit) unary)* ;
** unary := '-' unary | power ; power := primary ('^' primary)? ; primary := number | \pi |
** pi | \frac{expr}{expr} | \sqrt{expr} | \sqrt primary | '(' expr ')' | '{' expr '}'. */

typedef struct parser {
    const char *p;
    int ok;
} parser;

static double expr(parser *q);

static int eat(parser *q, const char *tok)
{
    size_t k = strlen(tok);
    if (strncmp(q->p, tok, k)) return 0;
    q->p += k;
    return 1;
}

static double group(parser *q, char open, char close)
{
    if (*q->p != open) return q->ok = 0, 0;
    q->p++;
    double v = expr(q);
    if (*q->p != close) return q->ok = 0, 0;
    q->p++;
    return v;
}

static double primary(parser *q)
{
    if (isdigit((unsigned char)*q->p) || (*q->p == '.' && isdigit((unsigned char)q->p[1]))) {
        char *end;
        double v = strtod(q->p, &end);
        q->p = end;
        return v;
    }
    if (eat(q, "\\pi") || eat(q, "pi") || eat(q, "π")) return M_PI;
    if (eat(q, "\\frac")) {
        double a = group(q, '{', '}');
        double b = group(q, '{', '}');
        return q->ok && b != 0 ? a / b : (q->ok = 0, 0);
    }
    if (eat(q, "\\sqrt")) {
        double v = *q->p == '{' ? group(q, '{', '}') : primary(q);
        return q->ok && v >= 0 ? sqrt(v) : (q->ok = 0, 0);
    }
    if (*q->p == '(') return group(q, '(', ')');
    if (*q->p == '{') return group(q, '{', '}');
    q->ok = 0;
    return 0;
}

static double power(parser *q)
{
    double b = primary(q);
    if (q->ok && eat(q, "^")) return pow(b, primary(q));
    return b;
}

static double unary(parser *q)
{
    if (eat(q, "-")) return -unary(q);
    if (eat(q, "+")) return unary(q);
    return power(q);
}

static int starts_factor(const parser *q)
{
    const char *p = q->p;
    return *p == '(' || *p == '{' || !strncmp(p, "\\pi", 3) || !strncmp(p, "\\sqrt", 5) ||
           !strncmp(p, "\\frac", 5) || !strncmp(p, "pi", 2) || isdigit((unsigned char)*p);
}

static double term(parser *q)
{
    double v = unary(q);
    while (q->ok) {
        if (eat(q, "*") || eat(q, "\\cdot") || eat(q, "\\times") || eat(q, "×")) v *= unary(q);
        else if (eat(q, "/") || eat(q, "\\div") || eat(q, "÷")) {
            double d = unary(q);
            v = d != 0 ? v / d : (q->ok = 0, 0);
        } else if (starts_factor(q)) v *= power(q); /* 2\pi, 3\sqrt{2} */
        else break;
    }
    return v;
}

static double expr(parser *q)
{
    double v = term(q);
    while (q->ok) {
        if (eat(q, "+")) v += term(q);
        else if (eat(q, "-")) v -= term(q);
        else break;
    }
    return v;
}

int prl_reward_math_value(const char *normalised, double *v)
{
    parser q = {normalised, 1};
    *v = *normalised ? expr(&q) : 0;
    return q.ok && *normalised && *q.p == 0 && isfinite(*v) ? 0 : -1;
}

int prl_reward_math_equal(const char *got, const char *want)
{
    char a[256], b[256];
    snprintf(a, sizeof a, "%s", got);
    snprintf(b, sizeof b, "%s", want);
    prl_reward_math_normalise(a);
    prl_reward_math_normalise(b);
    double x, y;
    if (!prl_reward_math_value(a, &x) && !prl_reward_math_value(b, &y))
        return fabs(x - y) <= 1e-6 * fmax(1.0, fabs(y));
    return *a && !strcasecmp(a, b);
}

/* ---------------------------------------------------------------- verifier --------- */

/* The line's "answer" (a string, or a number written back as text) into out. */
static prl_status answer_key(const json_t *task, char *out, size_t n)
{
    json_t *a = json_object_get(task, "answer");
    if (json_is_string(a)) snprintf(out, n, "%s", json_string_value(a));
    else if (json_is_integer(a)) snprintf(out, n, "%lld", (long long)json_integer_value(a));
    else if (json_is_real(a)) snprintf(out, n, "%.17g", json_real_value(a));
    else return prl_error_set(PRL_ERR_FORMAT, "math task: \"answer\" must be a string or a number");
    char norm[256];
    snprintf(norm, sizeof norm, "%s", out);
    prl_reward_math_normalise(norm);
    if (!*norm) return prl_error_set(PRL_ERR_FORMAT, "math task: \"answer\" is empty");
    return PRL_OK;
}

prl_status prl_reward_math(const char *task_json, const prl_chat_message *turns, size_t n_turns,
                           const prl_reward_exec *exec, prl_reward_result *out)
{
    json_t *task;
    prl_status rc = reward__task(task_json, PRL_TASK_REASONING, turns, n_turns, &task);
    if (rc) return rc;
    char want[256], got[256] = "", why[128] = "";
    rc = answer_key(task, want, sizeof want);
    json_decref(task);
    if (rc) return rc;
    reward__begin(out);
    const char *last = reward__last_assistant(turns, n_turns);
    reward__tool_stats st = {0};
    if ((rc = reward__tool_stats_of(turns, n_turns, last, exec, &st))) return rc;
    prl_tool_call call;
    int ok = last != NULL;
    if (!ok) snprintf(why, sizeof why, "no assistant turn");
    else if (prl_tasks_tool_call_parse(last, &call) != PRL_TOOL_NONE)
        ok = 0, snprintf(why, sizeof why, "the last turn is a tool call, not an answer");
    else if (prl_reward_math_extract(last, got, sizeof got) != 0)
        ok = 0, snprintf(why, sizeof why, "no \\boxed{}, '#### x' or 'answer: x' in the last turn");
    reward__check(out, "format", ok, 0, 1, "%s", ok ? got : why);
    reward__check(out, "answer", ok && prl_reward_math_equal(got, want), 1, 0,
                  "expected %.60s%s%.60s", want, ok ? ", got " : "", ok ? got : "");
    if (!ok) out->flags |= PRL_REWARD_FORMAT_ERROR;
    reward__tool_checks(&st, out);
    reward__finish(out);
    return PRL_OK;
}
