/*
** reasoning.c — the Reasoning domain: multi-step arithmetic and word problems with an
** integer answer, and their worked demonstrations.
**
** A problem is a template (text with $a..$e, $N = a name, $O = an object; the expression in
** infix for Python and in postfix for the worked steps) with its variables drawn in ranges;
** draws whose intermediate results go negative are redrawn. Difficulty d uses templates of
** d operations. A demonstration either works the steps ("3 * 4 = 12" lines) or calls the
** python tool with `print(<expression>)`, and ends with the line "Answer: N". A deliberate
** mistake is an arithmetic slip in one step (carried to the end) or, with the tool, one
** constant off by one in the code.
*/
#include "tasks/tasks_int.h"

#include <string.h>

enum { N_VARS = 5, MAX_DRAWS = 1000 };

typedef struct rtemplate {
    int difficulty;
    const char *text;
    const char *infix;   /* over the variables a..e */
    const char *postfix; /* variables and + - * in evaluation order */
    int lo[N_VARS], hi[N_VARS];
} rtemplate;

static const rtemplate templates[] = {
    {1, "What is $a + $b?", "a + b", "ab+", {1, 1}, {20, 20}},
    {1, "What is $a - $b?", "a - b", "ab-", {2, 1}, {30, 20}},
    {1, "What is $a * $b?", "a * b", "ab*", {2, 2}, {9, 9}},
    {1,
     "$N has $a $O and gets $b more. How many $O does $N have now?",
     "a + b",
     "ab+",
     {1, 1},
     {20, 20}},
    {1, "$N has $a $O and gives away $b. How many $O are left?", "a - b", "ab-", {2, 1}, {30, 20}},
    {1, "$N buys $a bags with $b $O in each. How many $O is that?", "a * b", "ab*", {2, 2}, {9, 9}},
    {2, "What is ($a + $b) * $c?", "(a + b) * c", "ab+c*", {1, 1, 2}, {15, 15, 9}},
    {2, "What is $a * $b - $c?", "a * b - c", "ab*c-", {2, 2, 1}, {12, 12, 30}},
    {2, "What is $a + $b - $c?", "a + b - c", "ab+c-", {1, 1, 1}, {40, 40, 40}},
    {2,
     "$N has $a $O, gets $b more and gives away $c. How many $O are left?",
     "a + b - c",
     "ab+c-",
     {1, 1, 1},
     {30, 30, 30}},
    {2,
     "$N buys $a bags with $b $O in each and loses $c. How many $O are left?",
     "a * b - c",
     "ab*c-",
     {2, 2, 1},
     {9, 9, 20}},
    {2,
     "$N has $a coins and buys $b $O at $c coins each. How many coins are left?",
     "a - b * c",
     "abc*-",
     {20, 2, 2},
     {99, 9, 9}},
    {3, "What is $a * $b + $c * $d?", "a * b + c * d", "ab*cd*+", {2, 2, 2, 2}, {19, 19, 19, 19}},
    {3,
     "What is ($a + $b) * ($c - $d)?",
     "(a + b) * (c - d)",
     "ab+cd-*",
     {2, 2, 10, 1},
     {30, 30, 40, 9}},
    {3, "What is $a * $b - $c + $d?", "a * b - c + d", "ab*c-d+", {5, 5, 1, 1}, {30, 30, 99, 99}},
    {3,
     "$N buys $a bags of $b $O and $c bags of $d $O, then gives away $e. How many $O are left?",
     "a * b + c * d - e",
     "ab*cd*+e-",
     {2, 2, 2, 2, 1},
     {9, 12, 9, 12, 30}},
    {3,
     "$N has $a coins, buys $b $O at $c coins each and earns $d coins. How many coins does "
     "$N have?",
     "a - b * c + d",
     "abc*-d+",
     {50, 2, 2, 5},
     {200, 9, 15, 50}},
};
enum { N_TEMPLATES = sizeof templates / sizeof templates[0] };

static const char *const names[] = {"Ann", "Ben", "Tom", "Eva", "Max", "Zoe"};
static const char *const objects[] = {"apples", "pens", "books", "coins", "cards", "eggs"};

/* One worked step: x op y = z. */
typedef struct rstep {
    int64_t x, y, z;
    char op;
} rstep;

static int64_t apply(char op, int64_t x, int64_t y)
{
    return op == '+' ? x + y : op == '-' ? x - y : x * y;
}

/* Evaluate the postfix expression on vars; fills steps (one per operator), returns the
** number of steps, or -1 if an intermediate result is negative. `slip_step` >= 0 adds
** `slip` to that step's result (a demonstration mistake). */
static int evaluate(const char *postfix, const int64_t *vars, rstep *steps, int slip_step,
                    int64_t slip)
{
    int64_t stack[N_VARS];
    int sp = 0, n = 0;
    for (const char *p = postfix; *p; p++) {
        if (*p >= 'a' && *p <= 'e') {
            stack[sp++] = vars[*p - 'a'];
            continue;
        }
        PRL_ASSERT(sp >= 2);
        int64_t y = stack[--sp], x = stack[--sp], z = apply(*p, x, y);
        if (n == slip_step) z += slip;
        if (z < 0) return -1;
        steps[n++] = (rstep){x, y, z, *p};
        stack[sp++] = z;
    }
    PRL_ASSERT(sp == 1);
    return n;
}

/* The prompt: $a..$e, $N, $O of the template text replaced. */
static void fill_text(tasks__buf *b, const char *tmpl, const int64_t *vars, const char *name,
                      const char *object)
{
    for (const char *p = tmpl; *p; p++) {
        if (*p == '$' && p[1] >= 'a' && p[1] <= 'e')
            tasks__buf_printf(b, "%lld", (long long)vars[*++p - 'a']);
        else if (*p == '$' && p[1] == 'N') tasks__buf_printf(b, "%s", name), p++;
        else if (*p == '$' && p[1] == 'O') tasks__buf_printf(b, "%s", object), p++;
        else tasks__buf_printf(b, "%c", *p);
    }
}

/* The Python expression: the variables a..e of the infix replaced by their values. */
static void fill_expr(tasks__buf *b, const char *infix, const int64_t *vars)
{
    for (const char *p = infix; *p; p++) {
        if (*p >= 'a' && *p <= 'e') tasks__buf_printf(b, "%lld", (long long)vars[*p - 'a']);
        else tasks__buf_printf(b, "%c", *p);
    }
}

static int n_vars(const char *postfix)
{
    int n = 0;
    for (const char *p = postfix; *p; p++) n += *p >= 'a' && *p <= 'e';
    return n;
}

/* Draw the template's variables until every intermediate result is >= 0. */
static prl_status draw_vars(prl_rng *r, const rtemplate *t, int64_t *vars, rstep *steps,
                            int *n_steps)
{
    for (int tries = 0; tries < MAX_DRAWS; tries++) {
        for (int v = 0; v < n_vars(t->postfix); v++) vars[v] = tasks__range(r, t->lo[v], t->hi[v]);
        *n_steps = evaluate(t->postfix, vars, steps, -1, 0);
        if (*n_steps > 0) return PRL_OK;
    }
    return prl_error_set(PRL_ERR_RANGE, "template '%s' found no valid numbers", t->text);
}

static const rtemplate *pick_template(prl_rng *r, int difficulty)
{
    int count = 0;
    for (int i = 0; i < N_TEMPLATES; i++) count += templates[i].difficulty == difficulty;
    int k = (int)tasks__range(r, 0, count - 1);
    for (int i = 0; i < N_TEMPLATES; i++)
        if (templates[i].difficulty == difficulty && k-- == 0) return &templates[i];
    PRL_ASSERT(0);
    return NULL;
}

/* Worked steps; with a slip, one step's result is off and the error propagates. */
static prl_status worked_demo(tasks__gen *g, const rtemplate *t, const int64_t *vars,
                              int64_t answer, int slip, tasks__draft *d)
{
    rstep steps[N_VARS];
    int n = evaluate(t->postfix, vars, steps, -1, 0);
    if (slip) {
        int at = (int)tasks__range(&g->demo, 0, n - 1);
        int64_t delta = tasks__range(&g->demo, 1, 3);
        if (evaluate(t->postfix, vars, steps, at, delta) < 0 || steps[n - 1].z == answer)
            evaluate(t->postfix, vars, steps, n - 1, delta); /* slip the last step instead */
    }
    tasks__buf b = {0};
    for (int i = 0; i < n; i++)
        tasks__buf_printf(&b, "%lld %c %lld = %lld\n", (long long)steps[i].x, steps[i].op,
                          (long long)steps[i].y, (long long)steps[i].z);
    size_t worked = b.len; /* in modes the steps are the reasoning, apart from the answer */
    tasks__buf_printf(&b, "Answer: %lld", (long long)steps[n - 1].z);
    prl_status rc = b.oom ? prl_error_set(PRL_ERR_NOMEM, "reasoning demo") : PRL_OK;
    if (rc == PRL_OK && g->moded) {
        d->think = strndup(b.s, worked - 1); /* without the last step's newline */
        rc = d->think ? tasks__append(d->turns, "assistant", b.s + worked)
                      : prl_error_set(PRL_ERR_NOMEM, "reasoning demo");
    } else if (rc == PRL_OK) {
        rc = tasks__append(d->turns, "assistant", b.s);
    }
    tasks__buf_free(&b);
    d->demo_error = slip ? "arithmetic_slip" : "none";
    return rc;
}

/* A python tool call printing the expression, its output, and the answer. With a mistake
** one constant of the code is one too large, so the printed value (and answer) is wrong. */
static prl_status tool_demo(tasks__gen *g, const rtemplate *t, const int64_t *vars, int slip,
                            tasks__draft *d)
{
    int64_t used[N_VARS];
    memcpy(used, vars, sizeof used);
    rstep steps[N_VARS];
    int n = evaluate(t->postfix, used, steps, -1, 0);
    int64_t answer = steps[n - 1].z;
    if (slip) {
        int v = (int)tasks__range(&g->demo, 0, n_vars(t->postfix) - 1);
        used[v] += 1;
        n = evaluate(t->postfix, used, steps, -1, 0);
        if (n < 0 || steps[n - 1].z == answer) { /* a change that cancels out: bump the first */
            memcpy(used, vars, sizeof used);
            used[0] += 1;
            n = evaluate(t->postfix, used, steps, -1, 0);
        }
        PRL_ASSERT(n > 0);
    }
    tasks__buf call = {0}, obs = {0}, fin = {0};
    tasks__buf_printf(&call, PRL_TOOL_CALL_OPEN "python\nprint(");
    fill_expr(&call, t->infix, used);
    tasks__buf_printf(&call, ")" PRL_TOOL_CALL_CLOSE);
    tasks__buf_printf(&obs, "%lld", (long long)steps[n - 1].z);
    tasks__buf_printf(&fin, "Answer: %lld", (long long)steps[n - 1].z);
    prl_status rc =
        call.oom || obs.oom || fin.oom ? prl_error_set(PRL_ERR_NOMEM, "reasoning demo") : PRL_OK;
    if (rc == PRL_OK && g->moded) { /* the reasoning of a tool answer: what to compute */
        tasks__buf why = {0};
        tasks__buf_printf(&why, "Compute ");
        fill_expr(&why, t->infix, vars);
        tasks__buf_printf(&why, " with python.");
        d->think = why.s; /* owned by the draft now */
        if (why.oom) rc = prl_error_set(PRL_ERR_NOMEM, "reasoning demo");
    }
    if (rc == PRL_OK) rc = tasks__append(d->turns, "assistant", call.s);
    if (rc == PRL_OK) rc = tasks__append(d->turns, "tool", obs.s);
    if (rc == PRL_OK) rc = tasks__append(d->turns, "assistant", fin.s);
    tasks__buf_free(&call);
    tasks__buf_free(&obs);
    tasks__buf_free(&fin);
    d->demo_error = slip ? "tool_wrong_constant" : "none";
    return rc;
}

prl_status tasks__reasoning_make(tasks__gen *g, tasks__draft *d)
{
    const rtemplate *t = pick_template(&g->problem, g->difficulty);
    const char *name = names[tasks__range(&g->problem, 0, 5)];
    const char *object = objects[tasks__range(&g->problem, 0, 5)];
    int64_t vars[N_VARS] = {0};
    rstep steps[N_VARS];
    int n = 0;
    prl_status rc = draw_vars(&g->problem, t, vars, steps, &n);
    if (rc) return rc;
    int64_t answer = steps[n - 1].z;
    tasks__buf q = {0};
    fill_text(&q, t->text, vars, name, object);
    if (q.oom) return prl_error_set(PRL_ERR_NOMEM, "reasoning prompt");
    d->prompt = tasks__prompt(NULL, q.s);
    tasks__buf_free(&q);
    d->fields = json_pack("{s:I}", "answer", (json_int_t)answer);
    if (!d->prompt || !d->fields) return prl_error_set(PRL_ERR_NOMEM, "reasoning problem");
    if (!g->demos) return PRL_OK;
    d->turns = json_array();
    if (!d->turns) return prl_error_set(PRL_ERR_NOMEM, "reasoning demo");
    int slip = tasks__chance(&g->demo, g->error_rate);
    if (tasks__chance(&g->demo, g->tool_rate)) return tool_demo(g, t, vars, slip, d);
    return worked_demo(g, t, vars, answer, slip, d);
}
