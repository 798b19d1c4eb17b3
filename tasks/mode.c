/*
** mode.c — thinking and non-thinking modes (tasks.h, docs/tasks.md "Modes"): the switch a
** conversation ends a system or user message with, and the form of an answer turn (a
** leading <|think|> ... <|/think|> block, or no think token).
**
** Pure string work on JSON "messages" arrays and turn texts, so the generators, the rollout
** and the verifiers agree on one definition.
*/
#include "tasks/tasks.h"

#include <stdlib.h>
#include <string.h>

static const char *const mode_names[] = {"default", "think", "no_think"};

const char *prl_tasks_mode_name(prl_tasks_mode m) { return (unsigned)m < 3 ? mode_names[m] : NULL; }

prl_status prl_tasks_mode_parse(const char *name, prl_tasks_mode *out)
{
    for (int m = 0; m < 3; m++)
        if (name && !strcmp(name, mode_names[m])) {
            *out = (prl_tasks_mode)m;
            return PRL_OK;
        }
    return prl_error_set(PRL_ERR_ARG, "unknown mode '%s' (expected default, think or no_think)",
                         name ? name : "(null)");
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

/* The switch a message text ends with (DEFAULT: none). A bare "/think" message counts too. */
static prl_tasks_mode switch_of(const char *text)
{
    if (ends_with(text, PRL_MODE_NO_THINK_SWITCH) || !strcmp(text, PRL_MODE_NO_THINK_SWITCH + 1))
        return PRL_MODE_NO_THINK;
    if (ends_with(text, PRL_MODE_THINK_SWITCH) || !strcmp(text, PRL_MODE_THINK_SWITCH + 1))
        return PRL_MODE_THINK;
    return PRL_MODE_DEFAULT;
}

prl_tasks_mode prl_tasks_mode_of_messages(const json_t *messages)
{
    prl_tasks_mode m = PRL_MODE_DEFAULT;
    size_t i;
    json_t *msg;
    json_array_foreach(messages, i, msg)
    {
        const char *role = json_string_value(json_object_get(msg, "role"));
        const char *text = json_string_value(json_object_get(msg, "content"));
        if (!role || !text || (strcmp(role, "user") && strcmp(role, "system"))) continue;
        prl_tasks_mode s = switch_of(text);
        if (s != PRL_MODE_DEFAULT) m = s;
    }
    return m;
}

prl_status prl_tasks_mode_apply(json_t *messages, prl_tasks_mode m)
{
    if (m == PRL_MODE_DEFAULT) return PRL_OK;
    if (!prl_tasks_mode_name(m)) return prl_error_set(PRL_ERR_ARG, "mode %d out of range", (int)m);
    json_t *last = NULL;
    size_t i;
    json_t *msg;
    json_array_foreach(messages, i, msg)
    {
        const char *role = json_string_value(json_object_get(msg, "role"));
        if (role && !strcmp(role, "user") && json_is_string(json_object_get(msg, "content")))
            last = msg;
    }
    if (!last) return prl_error_set(PRL_ERR_FORMAT, "mode %s: no user message", mode_names[m]);
    const char *text = json_string_value(json_object_get(last, "content"));
    const char *sw = m == PRL_MODE_THINK ? PRL_MODE_THINK_SWITCH : PRL_MODE_NO_THINK_SWITCH;
    size_t n = strlen(text), k = strlen(sw);
    char *s = malloc(n + k + 1);
    if (!s) return prl_error_set(PRL_ERR_NOMEM, "mode switch");
    memcpy(s, text, n);
    memcpy(s + n, sw, k + 1);
    int bad = json_object_set_new(last, "content", json_string(s)) != 0;
    free(s);
    return bad ? prl_error_set(PRL_ERR_NOMEM, "mode switch") : PRL_OK;
}

size_t prl_tasks_answer_offset(const char *turn)
{
    size_t open = strlen(PRL_THINK_OPEN);
    const char *p = turn;
    while (*p == ' ' || *p == '\n') p++; /* the block may follow a blank */
    if (strncmp(p, PRL_THINK_OPEN, open) != 0) return 0;
    const char *close = strstr(p + open, PRL_THINK_CLOSE);
    if (!close) return strlen(turn); /* all reasoning, no answer */
    return (size_t)(close - turn) + strlen(PRL_THINK_CLOSE);
}

prl_tasks_mode prl_tasks_mode_of_answer(const char *turn)
{
    size_t at = prl_tasks_answer_offset(turn);
    if (at == 0)
        return strstr(turn, PRL_THINK_OPEN) || strstr(turn, PRL_THINK_CLOSE) ? PRL_MODE_DEFAULT
                                                                             : PRL_MODE_NO_THINK;
    const char *rest = turn + at; /* one block only, and closed */
    if (at == strlen(turn) && !ends_with(turn, PRL_THINK_CLOSE)) return PRL_MODE_DEFAULT;
    return strstr(rest, PRL_THINK_OPEN) || strstr(rest, PRL_THINK_CLOSE) ? PRL_MODE_DEFAULT
                                                                         : PRL_MODE_THINK;
}
