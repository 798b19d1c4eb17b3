/*
** plain_exec.h — the test-only, unsandboxed python3 executor of tests/plain_exec.c.
*/
#ifndef PRL_TESTS_PLAIN_EXEC_H
#define PRL_TESTS_PLAIN_EXEC_H

#include "reward/reward.h"

/* python3 as a plain child process with a wall-time kill; ctx unused. Ignores SIGPIPE in the
** calling process. */
prl_status test_exec_python(void *ctx, const prl_reward_exec_request *req,
                            prl_reward_exec_result *res);

#endif /* PRL_TESTS_PLAIN_EXEC_H */
