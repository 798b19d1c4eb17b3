/*
** tasks_int.h — private to tasks/: what the generation loop (generate.c) asks of each
** domain's generator, and small helpers they share. Not installed; include tasks/tasks.h.
*/
#ifndef PRL_TASKS_INT_H
#define PRL_TASKS_INT_H

#include "tasks/tasks.h"

/* The inputs of one candidate problem. `problem` draws the problem; `demo` draws every
** choice of its demonstration (so prompts do not depend on whether demos are made). */
typedef struct tasks__gen {
    prl_rng problem, demo;
    int difficulty;    /* 1..3 */
    int demos;         /* make demonstration turns */
    double error_rate; /* probability of a deliberate mistake in the demonstration */
    double tool_rate;  /* reasoning: probability of a python tool demonstration */
    int moded;         /* demos in modes (think_rate >= 0): answers apart from their reasoning */
} tasks__gen;

/* What a domain generator returns. Every pointer is owned by the draft (tasks__draft_free). */
typedef struct tasks__draft {
    json_t *prompt;         /* array of prompt messages */
    json_t *fields;         /* object: the domain's key fields ("answer", "tests", ...) */
    json_t *turns;          /* demos: array of assistant/tool messages, else NULL */
    const char *demo_error; /* demos: "none" or the kind of deliberate mistake (static) */
    char *think;            /* moded demos: the reasoning of the first assistant turn, or NULL
                            ** (generate.c gives the domain's default); malloc'd */
} tasks__draft;

typedef prl_status (*tasks__make_fn)(tasks__gen *g, tasks__draft *d);

prl_status tasks__reasoning_make(tasks__gen *g, tasks__draft *d);
prl_status tasks__general_make(tasks__gen *g, tasks__draft *d);
prl_status tasks__agent_make(tasks__gen *g, tasks__draft *d);
prl_status tasks__coding_make(tasks__gen *g, tasks__draft *d);

/* {"role": role, "content": content} (NULL on allocation failure). */
json_t *tasks__message(const char *role, const char *content);
/* Append a message to an array; returns PRL_ERR_NOMEM if anything failed. */
prl_status tasks__append(json_t *array, const char *role, const char *content);
/* A prompt with one user message (and a system message first when system != NULL). */
json_t *tasks__prompt(const char *system, const char *user);

/* Uniform integer in [lo, hi] and a Bernoulli(p) draw. */
int64_t tasks__range(prl_rng *r, int64_t lo, int64_t hi);
int tasks__chance(prl_rng *r, double p);

/* Growable NUL-terminated string. */
typedef struct tasks__buf {
    char *s;
    size_t len, cap;
    int oom;
} tasks__buf;

void tasks__buf_printf(tasks__buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tasks__buf_free(tasks__buf *b);

/* The user message of an Agent task from its goal, item(s) and amount (agent.c). */
void tasks__agent_prompt(prl_agent_task *t);

#endif /* PRL_TASKS_INT_H */
