/*
** file.c — prompt files as the verifiers see them (reward.h): the tasks/ loader, then each
** line with a verifier scored once on an empty answer, so that a field the verifier cannot
** use (an unknown constraint type, an answer that is no value, a bad environment) fails at
** load time, naming FILE:LINE, instead of as a score error in the middle of a run.
*/
#include "reward/reward_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct check_ctx {
    prl_tasks_line_fn fn;
    void *user;
} check_ctx;

static prl_status check_line(void *user, json_t *line)
{
    check_ctx *k = user;
    if (json_object_get(line, "verifier")) {
        char *text = json_dumps(line, JSON_COMPACT);
        if (!text) return prl_error_set(PRL_ERR_NOMEM, "prompt line");
        prl_chat_message empty = {"assistant", ""};
        prl_reward_result r;
        /* no executor: an empty answer fails its format check before any program runs */
        prl_status rc = prl_reward_score(text, &empty, 1, NULL, &r);
        free(text);
        if (rc)
            return prl_error_wrap(PRL_ERR_FORMAT,
                                  "%s: ", json_string_value(json_object_get(line, "source")));
    }
    return k->fn(k->user, line);
}

prl_status prl_reward_file_read(const char *path, const prl_tasks_file_options *opt,
                                prl_tasks_line_fn fn, void *user)
{
    check_ctx k = {fn, user};
    return prl_tasks_file_read(path, opt, check_line, &k);
}
