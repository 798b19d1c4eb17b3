/*
** choice.c — the `choice` verifier of prompt files (docs/rewards.md "Prompt-file verifiers"):
** the letter the last assistant turn picks must be the line's "answer" (A..Z).
**
** The pick, first form found wins: the last \boxed{X}; else the last "answer:" / "answer is"
** (any case) followed by X, "(X)" or "X." / "X)"; else a final turn that is only the letter
** (with optional parentheses or a period). Letters are compared in upper case.
**
** Checks: "format" (required) — a letter was picked, by a turn that is not a tool call;
** "answer" (weight 1); the python tool's checks and penalties (choice lines play as
** Reasoning, reasoning.c).
*/
#include "reward/reward_int.h"

#include <ctype.h>
#include <string.h>

/* A lone letter at p (optionally "(X)", "X.", "X)"), followed by the end or a non-letter. */
static char letter_at(const char *p)
{
    while (*p == ' ' || *p == '*') p++;
    if (*p == '(') p++;
    if (!isalpha((unsigned char)p[0]) || isalpha((unsigned char)p[1])) return 0;
    return (char)toupper((unsigned char)p[0]);
}

char prl_reward_choice_extract(const char *text)
{
    const char *b = NULL;
    for (const char *p = strstr(text, "\\boxed{"); p; p = strstr(p + 1, "\\boxed{")) b = p;
    if (b) {
        char c = letter_at(b + 7);
        return c && strchr(b + 7, '}') ? c : 0;
    }
    const char *a = reward__last_ci(text, "answer:"), *is = reward__last_ci(text, "answer is");
    if (is && (!a || is > a)) return letter_at(is + 9);
    if (a) return letter_at(a + 7);
    char line[64];
    reward__last_line(text, line, sizeof line);
    size_t n = strlen(line);
    while (n > 0 && (line[n - 1] == '.' || line[n - 1] == ')')) line[--n] = 0;
    const char *p = line[0] == '(' ? line + 1 : line;
    return strlen(p) == 1 && isalpha((unsigned char)p[0]) ? (char)toupper((unsigned char)p[0]) : 0;
}

prl_status prl_reward_choice(const char *task_json, const prl_chat_message *turns, size_t n_turns,
                             const prl_reward_exec *exec, prl_reward_result *out)
{
    json_t *task;
    prl_status rc = reward__task(task_json, PRL_TASK_REASONING, turns, n_turns, &task);
    if (rc) return rc;
    const char *key = json_string_value(json_object_get(task, "answer"));
    char want = key && strlen(key) == 1 && key[0] >= 'A' && key[0] <= 'Z' ? key[0] : 0;
    json_decref(task);
    if (!want)
        return prl_error_set(PRL_ERR_FORMAT, "choice task: \"answer\" must be a letter A..Z");
    reward__begin(out);
    const char *last = reward__last_assistant(turns, n_turns);
    reward__tool_stats st = {0};
    if ((rc = reward__tool_stats_of(turns, n_turns, last, exec, &st))) return rc;
    prl_tool_call call;
    char got = 0;
    const char *why = "no assistant turn";
    if (last && prl_tasks_tool_call_parse(last, &call) != PRL_TOOL_NONE)
        why = "the last turn is a tool call, not an answer";
    else if (last && !(got = prl_reward_choice_extract(last)))
        why = "no letter picked ('Answer: X', \\boxed{X} or the letter alone)";
    reward__check(out, "format", got != 0, 0, 1, "%s", got ? "a letter" : why);
    reward__check(out, "answer", got == want, 1, 0, "expected %c%s%c", want, got ? ", got " : "",
                  got ? got : ' ');
    if (!got) out->flags |= PRL_REWARD_FORMAT_ERROR;
    reward__tool_checks(&st, out);
    reward__finish(out);
    return PRL_OK;
}
