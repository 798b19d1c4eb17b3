/*
** tasks.h — the one public header of tasks/: procedural, seeded task data for the four RL
** domains (Reasoning, General, Agent, Coding), their SFT demonstrations, the tool-call
** syntax, and the Agent domain's multi-turn tool environment. (Plus the SFT demo set.)
**
** Everything here is a pure function of its seed: a problem is drawn from
** prl_rng(seed, index, domain*16 + difficulty, 0, PRL_RNG_TASK) and its demonstration from
** the same coordinates with c = 1, so `generate` and `demos` with the same seed give the same
** prompts. Splits: a problem is in the eval split iff a hash of its canonical text is 0 mod
** 10; the generator skips candidates of the other split, so no problem can be in both.
** Formats and rules: docs/tasks.md. Verifiers live in reward/ (reward/reward.h).
**
** Ownership: the caller owns what it allocates; every *_free accepts NULL. json_t values
** handed to callbacks are borrowed for the duration of the call.
*/
#ifndef PRL_TASKS_H
#define PRL_TASKS_H

#include "engine/engine.h"

#include <jansson.h>

/* ---------------------------------------------------------------- demo set --------- */

/* Write n chat examples as JSONL to `out`: one {"messages": [...], "domain": "demo"} per
** line. Example i depends only on (seed, i). */
prl_status prl_tasks_write_demo(FILE *out, int n, uint64_t seed);

/* ---------------------------------------------------------------- domains ---------- */

typedef enum prl_task_domain {
    PRL_TASK_REASONING = 0,
    PRL_TASK_GENERAL = 1,
    PRL_TASK_AGENT = 2,
    PRL_TASK_CODING = 3,
    PRL_TASK_N_DOMAINS = 4
} prl_task_domain;

typedef enum prl_task_split { PRL_SPLIT_TRAIN = 0, PRL_SPLIT_EVAL = 1 } prl_task_split;

enum {
    PRL_TASKS_MAX_DIFFICULTY = 3, /* difficulties are 1..3; 0 in a config means "mixed" */
    PRL_TASKS_EVAL_MODULUS = 10   /* eval iff hash(canonical text) % 10 == 0 */
};

/* "reasoning", "general", "agent", "coding" (NULL for an out-of-range value). */
const char *prl_tasks_domain_name(prl_task_domain d);
/* Parse a domain or split name; errors (PRL_ERR_ARG) list the valid names. */
prl_status prl_tasks_domain_parse(const char *name, prl_task_domain *out);
prl_status prl_tasks_split_parse(const char *name, prl_task_split *out);
const char *prl_tasks_split_name(prl_task_split s);

/* The split of a problem: a pure function of its canonical text (docs/tasks.md). */
prl_task_split prl_tasks_split_of(const char *canonical, size_t len);

/* ---------------------------------------------------------------- modes ------------ */

/* Thinking and non-thinking answers (docs/tasks.md "Modes"). A conversation asks for a mode
** with a switch ending a system or user message, " /think" or " /no_think" (the last switch
** wins), as the common chat templates do. A think answer opens with the tokenizer's
** <|think|> special, reasons, closes with <|/think|> and then answers; a no-think answer has
** no think token. The verifiers see only the text after a leading think block. */
typedef enum prl_tasks_mode {
    PRL_MODE_DEFAULT = 0, /* no switch: the conversation as it is (today's prompts) */
    PRL_MODE_THINK = 1,
    PRL_MODE_NO_THINK = 2
} prl_tasks_mode;

#define PRL_MODE_THINK_SWITCH " /think"
#define PRL_MODE_NO_THINK_SWITCH " /no_think"
#define PRL_THINK_OPEN "<|think|>"
#define PRL_THINK_CLOSE "<|/think|>"

/* "default", "think", "no_think" (NULL out of range); the parse takes the same names and
** errors (PRL_ERR_ARG) list them. */
const char *prl_tasks_mode_name(prl_tasks_mode m);
prl_status prl_tasks_mode_parse(const char *name, prl_tasks_mode *out);
/* The mode a "messages" array asks for: the last system or user message ending in a switch. */
prl_tasks_mode prl_tasks_mode_of_messages(const json_t *messages);
/* Append mode m's switch to the last user message of `messages` (in place; DEFAULT changes
** nothing). PRL_ERR_FORMAT when there is no user message with string content. */
prl_status prl_tasks_mode_apply(json_t *messages, prl_tasks_mode m);
/* The form of one answer turn: THINK (a leading, closed think block), NO_THINK (no think
** token anywhere), else DEFAULT (neither: an unclosed or misplaced block). */
prl_tasks_mode prl_tasks_mode_of_answer(const char *turn);
/* Where the answer of a turn starts: past a leading think block (the end of the text when
** the block is never closed), else 0. */
size_t prl_tasks_answer_offset(const char *turn);

typedef struct prl_tasks_config {
    prl_task_domain domain;
    prl_task_split split;
    int difficulty; /* 1..3, or 0: each problem draws its own difficulty in 1..3 */
    int n;          /* problems to produce (>= 0) */
    uint64_t seed;
    int demos;         /* nonzero: append the demonstration turns (assistant, tool) */
    double error_rate; /* demos: probability in [0, 1] that a demonstration has a mistake */
    double tool_rate;  /* reasoning demos: probability of using the python tool; < 0 means
                           the default for the difficulty (0.1, 0.25, 0.5) */
    double think_rate; /* demos: < 0 (default) no modes, the lines of old; in [0, 1] each
                       ** demonstration is a think one with this probability, else a no-think
                       ** one, its user message ending in the switch (docs/tasks.md "Modes") */
} prl_tasks_config;

/* A config with defaults: difficulty 1, n 100, seed 1, no demos, error 0, tool_rate -1,
** think_rate -1. */
void prl_tasks_config_default(prl_tasks_config *c, prl_task_domain domain);

/* Called once per produced problem, in order, with the JSONL object (borrowed). */
typedef prl_status (*prl_tasks_line_fn)(void *user, json_t *line);

/* Produce c->n problems of one domain and split (docs/tasks.md lists every field). Fails
** with PRL_ERR_ARG on a bad config and PRL_ERR_RANGE if the split has too few distinct
** problems at this difficulty; a non-OK status from fn stops the run and is returned. */
prl_status prl_tasks_generate(const prl_tasks_config *c, prl_tasks_line_fn fn, void *user);
/* prl_tasks_generate written as compact JSONL, one object per line. */
prl_status prl_tasks_write_jsonl(const prl_tasks_config *c, FILE *out);

/* ---------------------------------------------------------------- prompt files ----- */

/* Users' prompt files (docs/tasks.md "Prompt files"): `path` is a JSONL file or a directory
** of *.jsonl shards (sorted by name). Each line holds "prompt" (text) or "messages" (chat), an
** optional "verifier" (math | code | constraints | choice | agent) with its fields, optional
** "id" and "split", and any other keys as metadata. fn gets each line as a task object
** (borrowed): the line with "messages", "id" (default FILE_NAME:LINE), "split" (default: the
** stable hash of the problem statement, as for generated tasks), "domain" (the rollout
** domain of the verifier: math, choice -> reasoning; code -> coding; constraints and none ->
** general; agent -> agent), "source" ("PATH:LINE") and "difficulty" 0. A bad line is
** PRL_ERR_FORMAT "PATH:LINE: field 'F': why"; fn's error stops the read and is returned. */
enum { PRL_TASKS_MAX_TESTS = 40 }; /* tests + asserts of one code line */
typedef struct prl_tasks_file_options {
    int require_verifier; /* 1: a line without "verifier" is an error (no reward program) */
} prl_tasks_file_options;
prl_status prl_tasks_file_read(const char *path, const prl_tasks_file_options *opt,
                               prl_tasks_line_fn fn, void *user);
/* The rollout domain a verifier name plays as; 0 when the name is not a verifier. */
int prl_tasks_verifier_domain(const char *name, prl_task_domain *domain);

/* The canonical text of a generated line (what the split hashes): the domain's problem
** statement — the user prompt, plus the initial world for Agent. Caller frees. */
prl_status prl_tasks_canonical_text(const json_t *line, char **text);

/* ---------------------------------------------------------------- tool calls ------- */

/* The tool-call syntax shared by the Reasoning python tool and the Agent tools, written
** between the tokenizer's <|tool_call|> and <|/tool_call|> specials inside one assistant turn:
**
**   turn  := prefix "<|tool_call|>" call "<|/tool_call|>" [whitespace]
**   call  := name                         a call without arguments     (list)
**          | name (" " key "=" value)+    keyword arguments            (lookup item=pear)
**          | name "\n" body               a program, up to the close   (python\nprint(1+2))
**   name, key := [a-z_]{1,15}     value := [A-Za-z0-9_+*()-]{1,63}
**
** A turn holds at most one call; text before it is free, text after it is an error. A turn
** without "<|tool_call|>" has no call (it is a final answer). */
#define PRL_TOOL_CALL_OPEN "<|tool_call|>"
#define PRL_TOOL_CALL_CLOSE "<|/tool_call|>"

enum { PRL_TOOL_MAX_ARGS = 4 };

typedef struct prl_tool_arg {
    char key[16];
    char value[64];
} prl_tool_arg;

typedef struct prl_tool_call {
    char name[16];
    int n_args;
    prl_tool_arg args[PRL_TOOL_MAX_ARGS];
    const char *body; /* program text (points into the parsed turn), NULL if none */
    size_t body_len;
    char error[160]; /* why the call is malformed ("" if well-formed) */
} prl_tool_call;

typedef enum prl_tool_parse {
    PRL_TOOL_NONE = 0,     /* no call in the turn */
    PRL_TOOL_OK = 1,       /* one well-formed call in *call */
    PRL_TOOL_MALFORMED = 2 /* a call that breaks the syntax; call->error says how */
} prl_tool_parse;

/* Parse the tool call of one assistant turn (NUL-terminated). Pure; never fails. */
prl_tool_parse prl_tasks_tool_call_parse(const char *turn, prl_tool_call *call);
/* The value of argument `key`, or NULL. */
const char *prl_tasks_tool_arg(const prl_tool_call *call, const char *key);

/* ---------------------------------------------------------------- agent world ------ */

/* The Agent domain: a small shop inventory. Each episode is a world (3–4 items, each with a
** stock and a price) and a goal stated in the user prompt; tools: list, lookup, update,
** calc (docs/tasks.md). prl_agent_task_make is the pure description of an episode; the
** environment below plays it; the verifier in reward/ checks the end state and answer from
** the task alone, without the environment's code. */
enum { PRL_AGENT_MAX_ITEMS = 4, PRL_AGENT_MAX_CALLS = 8 };

typedef struct prl_agent_item {
    char name[12];
    int64_t stock, price;
} prl_agent_item;

typedef struct prl_agent_world {
    int n_items;
    prl_agent_item items[PRL_AGENT_MAX_ITEMS];
} prl_agent_world;

typedef enum prl_agent_goal {
    PRL_AGENT_PRICE,     /* d1: what is the price of X?            answer price         */
    PRL_AGENT_STOCK,     /* d1: how many X are in stock?           answer stock         */
    PRL_AGENT_SET_PRICE, /* d1: set the price of X to V.           answer V             */
    PRL_AGENT_COST,      /* d2: what do A X cost?                  answer A * price     */
    PRL_AGENT_SELL,      /* d2: sell A X (stock -= A).             answer new stock     */
    PRL_AGENT_RESTOCK,   /* d2: add A X to stock (stock += A).     answer new stock     */
    PRL_AGENT_VALUE,     /* d3: total value of X and Y stock.      answer sX*pX + sY*pY */
    PRL_AGENT_CHEAPEST,  /* d3: which item is cheapest?            answer its name      */
    PRL_AGENT_SELL_COST, /* d3: sell A X; what do they cost?       answer A * price     */
    PRL_AGENT_N_GOALS
} prl_agent_goal;

typedef struct prl_agent_task {
    uint64_t seed;
    int difficulty;
    prl_agent_world world; /* the initial state */
    prl_agent_goal goal;
    int item, item2;  /* indices into world.items (item2: VALUE only, else -1) */
    int64_t amount;   /* A or V of the goal (0 if unused) */
    char prompt[160]; /* the user message stating the goal */
} prl_agent_task;

/* The episode of (seed, difficulty 1..3). Pure. */
prl_status prl_agent_task_make(uint64_t seed, int difficulty, prl_agent_task *t);
/* The episode of a JSON spec (a task's "env"): {"seed", "difficulty"} as prl_agent_task_make,
** or a world and goal of one's own {"items": [{"name", "stock", "price"}] (1..4), "goal":
** price | stock | set_price | cost | sell | restock | value | cheapest | sell_cost, "item",
** "item2" (value), "amount" (set_price, cost, sell, restock, sell_cost)} (docs/tasks.md
** "Prompt files"). PRL_ERR_FORMAT naming the field that the environment could not play. */
prl_status prl_agent_task_from_spec(const json_t *env, prl_agent_task *t);
/* The system message listing the tools (the same for every episode). */
const char *prl_agent_system_prompt(void);
/* "pear: stock 9, price 4, plum: ..." — canonical text of a world (for splits, logs). */
void prl_agent_world_format(const prl_agent_world *w, char *out, size_t n);

typedef struct prl_agent_env prl_agent_env; /* opaque */

typedef struct prl_agent_step {
    const char *observation; /* the tool turn's content (owned by the env, valid until the
                                next step, reset or free); NULL when the turn ended the episode */
    int done;                /* the episode is over (final answer or call limit) */
    int malformed;           /* this turn's tool call broke the syntax (penalised) */
    const char *answer;      /* done by a final answer: the turn's text (borrowed), else NULL */
} prl_agent_step;

/* Allocate an environment (*env owned by the caller; release with prl_agent_env_free). */
prl_status prl_agent_env_init(prl_agent_env **env);
/* Start the episode of (seed, difficulty); *task (may be NULL) gets the episode
** description, owned by the env and valid until the next reset. */
/* Start the episode of task t (copied: from a spec, prl_agent_task_from_spec). */
prl_status prl_agent_env_reset_task(prl_agent_env *env, const prl_agent_task *t,
                                    const prl_agent_task **task);
prl_status prl_agent_env_reset(prl_agent_env *env, uint64_t seed, int difficulty,
                               const prl_agent_task **task);
/* Play one assistant turn. A turn with a tool call runs it and returns its observation
** (errors are observations starting with "error: "); a turn without one is the final answer
** and ends the episode; the (PRL_AGENT_MAX_CALLS + 1)-th call ends it with an error
** observation. Stepping a finished episode is PRL_ERR_ARG. */
prl_status prl_agent_env_step(prl_agent_env *env, const char *turn, prl_agent_step *out);
/* The current world (borrowed), and counters of the episode so far. */
const prl_agent_world *prl_agent_env_world(const prl_agent_env *env);
int prl_agent_env_calls(const prl_agent_env *env);
int prl_agent_env_malformed(const prl_agent_env *env);
void prl_agent_env_free(prl_agent_env *env);

/* Evaluate a calc expression (integers, + - *, parentheses; no spaces). Returns 0 and sets
** *value, or -1 on a syntax error / int64 overflow. Shared by the env and the demos. */
int prl_agent_calc(const char *expr, int64_t *value);

#endif /* PRL_TASKS_H */
