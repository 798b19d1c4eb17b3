/*
** check_util.h — assertions shared by the Check suites of tasks/ and reward/.
*/
#ifndef PRL_CHECK_UTIL_H
#define PRL_CHECK_UTIL_H

#include "engine/engine.h"

#include <check.h>
#include <string.h>

/* expr returns PRL_OK; otherwise fail with the status name and the error message. */
#define assert_ok(expr)                                                                   \
    do {                                                                                  \
        prl_status rc_ = (expr);                                                          \
        ck_assert_msg(rc_ == PRL_OK, "%s failed: %s (%s)", #expr, prl_status_name(rc_),   \
                      prl_error_message());                                               \
    } while (0)

/* The last error message mentions `needle`. */
#define assert_msg_has(needle)                                                            \
    ck_assert_msg(strstr(prl_error_message(), (needle)) != NULL,                          \
                  "error message \"%s\" does not mention \"%s\"", prl_error_message(),    \
                  (needle))

/* Run one suite; the process exit status is 1 if any test failed. */
static inline int check_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

#endif /* PRL_CHECK_UTIL_H */
