/*
** reward.h — the one public header of reward/: the verifiers of the four domains.
**
** A verifier takes a task (one JSONL object of `prl tasks generate`, as JSON text) and the
** model's turns (the assistant and tool messages that follow the prompt) and returns a score
** in [0, 1] with a breakdown: named checks (passed, weight, required, detail), flags, and the
** penalty applied. Scoring, for every domain:
**
**     score = 0                                     if a required check failed
**           = Σ weight·passed / Σ weight − penalty  otherwise, clamped to [0, 1]
**
** (checks of weight 0 are informational; the domains' checks, weights and penalties are in
** docs/rewards.md). Programs — coding answers, python tool calls — are run through an
** execution callback, never directly: the reward worker wires it to the sandbox service, the
** CLI to its local executor. A verifier never runs a program when it has no callback; it
** fails with PRL_ERR_ARG if it needs one.
**
** Errors: a malformed task (missing or ill-typed field) is PRL_ERR_FORMAT naming the field; a
** failing callback is passed on. A bad *answer* is never an error: it is a low score.
** Ownership: results are plain values (no free); exec results are freed with
** prl_reward_exec_result_free.
*/
#ifndef PRL_REWARD_H
#define PRL_REWARD_H

#include "tasks/tasks.h"

/* ---------------------------------------------------------------- execution -------- */

typedef struct prl_reward_exec_request {
    const char *lang;       /* "python3" */
    const char *program;    /* program text (NUL-terminated) */
    const char *stdin_data; /* bytes fed to stdin (may be NULL when stdin_len == 0) */
    size_t stdin_len;
    double wall_s; /* wall-time limit in seconds */
} prl_reward_exec_request;

/* status: "ok" (exit 0), "runtime_error" (exit != 0), "timeout" (wall limit), "killed" (a
** signal), "output_limit" (too much output), "violation" (the sandbox refused an action),
** "error" (could not run). */
typedef struct prl_reward_exec_result {
    char status[24];
    int exit_code;     /* exit status, or 128 + signal */
    char *stdout_data; /* malloc'd, NUL-terminated (owned by the result) */
    size_t stdout_len;
    char *stderr_data; /* malloc'd, NUL-terminated (owned by the result) */
    size_t stderr_len;
    double wall_s; /* time taken */
} prl_reward_exec_result;

/* Run req and fill *res (zeroed by the caller). A program that fails is a result, not an
** error; return non-OK only when the executor itself could not work. */
typedef prl_status (*prl_reward_exec_fn)(void *ctx, const prl_reward_exec_request *req,
                                         prl_reward_exec_result *res);

typedef struct prl_reward_exec {
    prl_reward_exec_fn fn;
    void *ctx;
    double wall_s; /* wall limit per run; <= 0 means 2 s */
} prl_reward_exec;

/* Free the buffers of a result and zero it. Accepts a zeroed result. */
void prl_reward_exec_result_free(prl_reward_exec_result *res);

/* ---------------------------------------------------------------- results ---------- */

enum { PRL_REWARD_MAX_CHECKS = 48 };

typedef enum prl_reward_flag {
    PRL_REWARD_FORMAT_ERROR = 1u,   /* no parseable final answer / code block */
    PRL_REWARD_TOOL_SYNTAX = 2u,    /* a malformed tool call (penalised) */
    PRL_REWARD_PARSE_ERROR = 4u,    /* python tool code that does not parse (penalised) */
    PRL_REWARD_HACKING = 8u,        /* the reward-hacking monitor flagged the program (score 0) */
    PRL_REWARD_EXEC_ERROR = 16u,    /* a run timed out, crashed or could not start */
    PRL_REWARD_DEGENERATE = 32u,    /* the General monitor flagged degenerate text (score 0) */
    PRL_REWARD_JUDGE_UNPARSED = 64u /* reward.judge's reply had no "Score: N" (grade 0) */
} prl_reward_flag;

typedef struct prl_reward_check {
    char name[40]; /* "answer", "word_count", "test_3", "monitor:forbidden_file", ... */
    int passed;
    double weight;    /* share of the score (0: informational) */
    int required;     /* failing it makes the score 0 */
    char detail[200]; /* what was expected / found */
} prl_reward_check;

typedef struct prl_reward_result {
    double score;   /* in [0, 1] */
    double penalty; /* subtracted before clamping (tool syntax, parse errors) */
    unsigned flags; /* prl_reward_flag bits */
    int n_checks;
    prl_reward_check checks[PRL_REWARD_MAX_CHECKS];
} prl_reward_result;

/* Penalties (docs/rewards.md). */
#define PRL_REWARD_TOOL_SYNTAX_PENALTY 0.2 /* per malformed tool call */
#define PRL_REWARD_PARSE_PENALTY 0.25      /* per python tool call that does not parse */

/* An episode cut off mid-turn (by max_new_tokens or the context) has no answer: add the
** required check "finished" (failed) and set the score to 0, whatever the other checks say.
** The rollout applies it when it scores, the reward worker when the controller says the
** sample was cut off: a policy must never be paid for text that does not end. */
void prl_reward_unfinished(prl_reward_result *r);

/* Names of the bits of `flags`, comma-separated, into out ("" for none). */
void prl_reward_flags_format(unsigned flags, char *out, size_t n);

/* The result as a JSON object {score, penalty, flags (bits), flag_names, checks: [{name,
** passed, weight, required, detail}]}: the `detail` of `scored` (the samples' reward_detail in
** run.db) and the records of `prl eval --dump`. A new reference; NULL when out of memory. */
json_t *prl_reward_result_json(const prl_reward_result *r);

/* ---------------------------------------------------------------- verifiers -------- */

/* One entry per domain. task_json: the task object; turns[0..n_turns): the model's messages
** after the prompt (roles "assistant" and "tool"); exec may be NULL where no program runs. */
prl_status prl_reward_reasoning(const char *task_json, const prl_chat_message *turns,
                                size_t n_turns, const prl_reward_exec *exec,
                                prl_reward_result *out);
prl_status prl_reward_general(const char *task_json, const prl_chat_message *turns, size_t n_turns,
                              prl_reward_result *out);
prl_status prl_reward_agent(const char *task_json, const prl_chat_message *turns, size_t n_turns,
                            prl_reward_result *out);
prl_status prl_reward_coding(const char *task_json, const prl_chat_message *turns, size_t n_turns,
                             const prl_reward_exec *exec, prl_reward_result *out);

/* The verifiers prompt-file lines name (docs/rewards.md "Prompt-file verifiers"): math (the
** final answer as a value) and choice (a letter) play as Reasoning; code, constraints and
** agent are prl_reward_coding, _general and _agent on the line's fields. */
prl_status prl_reward_math(const char *task_json, const prl_chat_message *turns, size_t n_turns,
                           const prl_reward_exec *exec, prl_reward_result *out);
prl_status prl_reward_choice(const char *task_json, const prl_chat_message *turns, size_t n_turns,
                             const prl_reward_exec *exec, prl_reward_result *out);
/* math's rules, for tests and tools: the final answer of a turn (last \boxed{}, "#### x",
** "answer: x") into out (0: found); an answer normalised in place; a normalised text's value
** (0: it is one); two answers equal as values, else as normalised text (1: equal). */
int prl_reward_math_extract(const char *text, char *out, size_t n);
void prl_reward_math_normalise(char *s);
int prl_reward_math_value(const char *normalised, double *v);
int prl_reward_math_equal(const char *got, const char *want);
/* choice's rule: the letter a final turn picks (0 when none), docs/rewards.md. */
char prl_reward_choice_extract(const char *text);

/* A prompt file read as prl_tasks_file_read does, each line with a verifier then scored once
** on an empty answer (no program runs) so that fields the verifier refuses fail here, as
** PRL_ERR_FORMAT "PATH:LINE: why" (docs/tasks.md "Prompt files"). */
prl_status prl_reward_file_read(const char *path, const prl_tasks_file_options *opt,
                                prl_tasks_line_fn fn, void *user);

/* Dispatch on the task's "verifier" (prompt-file lines), else on its "domain". */
prl_status prl_reward_score(const char *task_json, const prl_chat_message *turns, size_t n_turns,
                            const prl_reward_exec *exec, prl_reward_result *out);

/* Score one line of `prl tasks check` input: a task object whose "messages" may continue past
** the last user message with the model's turns, and/or whose "response" string is the
** model's final assistant turn (appended after them). PRL_ERR_FORMAT if there is no model
** turn at all. */
prl_status prl_reward_score_line(const char *line_json, const prl_reward_exec *exec,
                                 prl_reward_result *out);

/* ---------------------------------------------------------------- agent check ------ */

/* The check outside the environment: from the episode description alone, the expected end
** world and answer; compares them with the end world and the final answer text ("Answer:
** X"). Adds the checks "answer" and "end_state" (required, weight 1 each) to out. */
void prl_reward_agent_check(const prl_agent_task *task, const prl_agent_world *end,
                            const char *final_turn, prl_reward_result *out);

/* ---------------------------------------------------------------- python tool ------ */

/* Run a python tool call's code (empty stdin) and format the tool turn the rollout worker
** appends: its stdout with trailing whitespace removed (at most 200 bytes), or "error: " and
** the last line of stderr, or "error: timeout". *observation is malloc'd (caller frees). */
prl_status prl_reward_python_observation(const prl_reward_exec *exec, const char *code,
                                         size_t code_len, char **observation);

#endif /* PRL_REWARD_H */
