/*
** reasoning.c — the Reasoning verifier: exact integer answer in the fixed format, plus the
** python tool's penalties.
**
** Checks: "format" (required) — the last assistant turn has no tool call and ends with the
** line "Answer: N", N an integer; "answer" (weight 1) — N equals the key; "tool_syntax" and
** "python_parse" (informational) — every earlier assistant turn's tool call is a well-formed
** `python` call whose code parses. Penalties: 0.2 per malformed call, 0.25 per call whose
** code does not parse. The parse check runs PARSE_CHECK (below) through the executor with
** the code on stdin: Python's own parser, without executing the code.
*/
#include "reward/reward_int.h"

#include <string.h>

static const char PARSE_CHECK[] = "import ast, sys\n"
                                  "try:\n"
                                  "    ast.parse(sys.stdin.read())\n"
                                  "except SyntaxError as e:\n"
                                  "    print('SyntaxError: %s (line %s)' % (e.msg, e.lineno))\n"
                                  "    sys.exit(1)\n";

/* Parse-check one python call's code; counts a failure in st. */
static prl_status parse_check(const prl_reward_exec *exec, const prl_tool_call *call,
                              reward__tool_stats *st)
{
    prl_reward_exec_result res;
    prl_status rc = reward__run(exec, PARSE_CHECK, call->body, call->body_len, &res);
    if (rc) return rc;
    if (strcmp(res.status, "ok") != 0) {
        st->unparsed++;
        char line[140];
        reward__last_line(res.stdout_len ? res.stdout_data : res.stderr_data, line, sizeof line);
        snprintf(st->unparsed_why, sizeof st->unparsed_why, "%s", line[0] ? line : res.status);
    }
    prl_reward_exec_result_free(&res);
    return PRL_OK;
}

/* Tool calls of every assistant turn but the last. */
prl_status reward__tool_stats_of(const prl_chat_message *turns, size_t n_turns, const char *last,
                                 const prl_reward_exec *exec, reward__tool_stats *st)
{
    for (size_t i = 0; i < n_turns; i++) {
        if (strcmp(turns[i].role, "assistant") != 0 || turns[i].content == last) continue;
        prl_tool_call call;
        prl_tool_parse kind = prl_tasks_tool_call_parse(turns[i].content, &call);
        if (kind == PRL_TOOL_NONE) continue;
        st->calls++;
        if (kind == PRL_TOOL_OK && (strcmp(call.name, "python") != 0 || !call.body))
            snprintf(call.error, sizeof call.error, "%s",
                     strcmp(call.name, "python") ? "unknown tool (the reasoning tool is python)"
                                                 : "python needs code after a newline");
        if (call.error[0]) {
            st->malformed++;
            snprintf(st->malformed_why, sizeof st->malformed_why, "%s", call.error);
            continue;
        }
        prl_status rc = parse_check(exec, &call, st);
        if (rc) return rc;
    }
    return PRL_OK;
}

prl_status prl_reward_reasoning(const char *task_json, const prl_chat_message *turns,
                                size_t n_turns, const prl_reward_exec *exec, prl_reward_result *out)
{
    json_t *task;
    prl_status rc = reward__task(task_json, PRL_TASK_REASONING, turns, n_turns, &task);
    if (rc) return rc;
    json_t *key = json_object_get(task, "answer");
    int has_key = json_is_integer(key);
    int64_t answer = json_integer_value(key);
    json_decref(task);
    if (!has_key)
        return prl_error_set(PRL_ERR_FORMAT, "reasoning task: missing integer \"answer\"");
    reward__begin(out);
    const char *last = reward__last_assistant(turns, n_turns);
    reward__tool_stats st = {0};
    if ((rc = reward__tool_stats_of(turns, n_turns, last, exec, &st))) return rc;

    char value[64], why[128] = "";
    int64_t got = 0;
    prl_tool_call call;
    int ok = last != NULL;
    if (!ok) snprintf(why, sizeof why, "no assistant turn");
    else if (prl_tasks_tool_call_parse(last, &call) != PRL_TOOL_NONE) {
        snprintf(why, sizeof why, "the last turn is a tool call, not an answer");
        ok = 0;
    } else if (reward__final_answer(last, value, sizeof value, why, sizeof why) != 0) ok = 0;
    else if (reward__parse_int(value, &got) != 0) {
        snprintf(why, sizeof why, "'%.40s' is not an integer", value);
        ok = 0;
    }
    reward__check(out, "format", ok, 0, 1, "%s", ok ? "Answer: N" : why);
    reward__check(out, "answer", ok && got == answer, 1, 0, "expected %lld%s%s", (long long)answer,
                  ok ? ", got " : "", ok ? value : "");
    out->flags |= ok ? 0 : PRL_REWARD_FORMAT_ERROR;
    reward__tool_checks(&st, out);
    reward__finish(out);
    return PRL_OK;
}

void reward__tool_checks(const reward__tool_stats *st, prl_reward_result *out)
{
    reward__check(out, "tool_syntax", st->malformed == 0, 0, 0, "%d of %d calls malformed%s%s",
                  st->malformed, st->calls, st->malformed ? ": " : "", st->malformed_why);
    reward__check(out, "python_parse", st->unparsed == 0, 0, 0, "%d of %d calls do not parse%s%s",
                  st->unparsed, st->calls - st->malformed, st->unparsed ? ": " : "",
                  st->unparsed_why);
    out->flags |=
        (st->malformed ? PRL_REWARD_TOOL_SYNTAX : 0) | (st->unparsed ? PRL_REWARD_PARSE_ERROR : 0);
    out->penalty +=
        PRL_REWARD_TOOL_SYNTAX_PENALTY * st->malformed + PRL_REWARD_PARSE_PENALTY * st->unparsed;
}
