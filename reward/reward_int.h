/*
** reward_int.h — private to reward/: result building, task parsing, answer parsing, running
** programs, and the reward-hacking monitor. Include reward/reward.h from outside.
*/
#ifndef PRL_REWARD_INT_H
#define PRL_REWARD_INT_H

#include "reward/reward.h"

/* At most this many constraints / tests per task, so every check fits in a result: coding
** has 1 format + 5 monitor + 40 tests + 1 sandbox check. */
enum { PRL_REWARD_MAX_ITEMS = 40 };

/* Zero a result. */
void reward__begin(prl_reward_result *out);
/* Append a check (the detail is printf-formatted). */
void reward__check(prl_reward_result *out, const char *name, int passed, double weight,
                   int required, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Compute out->score from the checks and out->penalty (formula in reward.h). */
void reward__finish(prl_reward_result *out);

/* Parse task_json, check that its "domain" (if present) is `domain` and that every turn has
** a role ("assistant" or "tool") and a content. *task owned by the caller (json_decref). */
prl_status reward__task(const char *task_json, prl_task_domain domain,
                        const prl_chat_message *turns, size_t n_turns, json_t **task);
/* reward__task, then the task's array field `key` (borrowed from *task) into *list;
** PRL_ERR_FORMAT naming the field unless it has 1..PRL_REWARD_MAX_ITEMS entries (then *task
** is NULL). */
prl_status reward__task_list(const char *task_json, prl_task_domain domain,
                             const prl_chat_message *turns, size_t n_turns, const char *key,
                             json_t **task, json_t **list);
/* The content of the last turn with role "assistant", or NULL. */
const char *reward__last_assistant(const prl_chat_message *turns, size_t n_turns);
/* The content of the task's last user message, or "". */
const char *reward__prompt(const json_t *task);

/* The final answer of a turn: its last non-empty line must be "Answer: X" with X non-empty
** and without leading/trailing spaces. Copies X into value and returns 0, or returns -1 and
** explains in why. */
int reward__final_answer(const char *turn, char *value, size_t n, char *why, size_t why_n);
/* The last occurrence of needle in text ignoring ASCII case (final-answer markers), or NULL. */
const char *reward__last_ci(const char *text, const char *needle);
/* Parse a whole decimal integer ("-12"); 0 on success. */
int reward__parse_int(const char *s, int64_t *v);

/* Run a program through exec (wall limit from exec, default 2 s). */
prl_status reward__run(const prl_reward_exec *exec, const char *program, const char *stdin_data,
                       size_t stdin_len, prl_reward_exec_result *res);
/* The last non-empty line of text, trimmed, into out. */
void reward__last_line(const char *text, char *out, size_t n);

/* The General verifier's text model: a word is a maximal run of [A-Za-z0-9'], lowercased; at
** most REWARD_MAX_WORDS words (the last slot holds the last word past them), each cut to
** REWARD_WORD_LEN − 1 bytes (a cut word never matches). */
enum { REWARD_MAX_WORDS = 512, REWARD_WORD_LEN = 32 };
typedef struct reward__text {
    const char *s;
    int n_words;
    char words[REWARD_MAX_WORDS][REWARD_WORD_LEN];
} reward__text;
void reward__split_words(reward__text *t, const char *s);

/* The static reward-hacking monitor on a coding answer: adds a required check
** "monitor:<rule>" per finding and sets PRL_REWARD_HACKING. Returns the number of findings.
** prompt: the task's user message (its numbers and words are never test secrets). */
int reward__monitor(const char *program, const char *prompt, const json_t *tests,
                    prl_reward_result *out);
/* The degenerate-text monitor on a General answer (monitor.c, docs/rewards.md): adds a
** required check "monitor:word_run", "monitor:ngram_repeat" or "monitor:stuffing" per rule
** that fires and sets PRL_REWARD_DEGENERATE. constraints: the task's list (the words they
** name). Returns the number of rules that fired. */
int reward__monitor_text(const reward__text *t, const json_t *constraints, prl_reward_result *out);

/* The python tool calls of an episode (Reasoning and the math / choice lines that play as
** Reasoning): every assistant turn but `last` is parsed, each python call's code
** parse-checked through exec (reasoning.c). */
typedef struct reward__tool_stats {
    int calls, malformed, unparsed;
    char malformed_why[160], unparsed_why[160];
} reward__tool_stats;
prl_status reward__tool_stats_of(const prl_chat_message *turns, size_t n_turns, const char *last,
                                 const prl_reward_exec *exec, reward__tool_stats *st);
/* The checks "tool_syntax" and "python_parse" (informational), their flags and penalties. */
void reward__tool_checks(const reward__tool_stats *st, prl_reward_result *out);

#endif /* PRL_REWARD_INT_H */
