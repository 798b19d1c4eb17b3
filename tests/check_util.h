/*
** check_util.h — what every Check suite in tests/ shares: the assertions on a prl_status and
** its error message, the one runner that every test's main() calls, and the PRL_TEST_ONLY
** filter for suites that list their tests in a table.
**
** The runner leaves libcheck's environment alone: CK_RUN_SUITE / CK_RUN_CASE pick a suite or
** a test case, CK_FORK=no|yes overrides the fork mode (also for a suite that asks for one
** process, check_run_mode(s, CK_NOFORK)), CK_VERBOSITY sets the output, CK_DEFAULT_TIMEOUT
** the timeout of the cases that do not set one.
**
** Also two file helpers: a whole file read into memory, a directory tree removed.
*/
#ifndef PRL_CHECK_UTIL_H
#define PRL_CHECK_UTIL_H

#include "engine/engine.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* expr returns PRL_OK; otherwise fail with the status name and the error message. */
#define assert_ok(expr)                                                                            \
    do {                                                                                           \
        prl_status rc_ = (expr);                                                                   \
        ck_assert_msg(rc_ == PRL_OK, "%s failed: %s (%s)", #expr, prl_status_name(rc_),            \
                      prl_error_message());                                                        \
    } while (0)

/* The last error message mentions `needle`. */
#define assert_msg_has(needle)                                                                     \
    ck_assert_msg(strstr(prl_error_message(), (needle)) != NULL,                                   \
                  "error message \"%s\" does not mention \"%s\"", prl_error_message(), (needle))

/* The bytes of the file at `path` (malloc'd, NUL-terminated; *len excludes the NUL). */
static inline char *check_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* rm -rf `dir` (a test's scratch directory); it must succeed. */
static inline void check_remove_tree(const char *dir)
{
    char cmd[1100];
    ck_assert_int_lt(snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir), (int)sizeof cmd);
    ck_assert_int_eq(system(cmd), 0);
}

/* Run one suite; the process exit status is 1 if any test failed. `fork` is the mode the
** suite needs: CK_FORK_GETENV (libcheck's default: a process per test unless CK_FORK=no), or
** CK_NOFORK for suites whose tests share state loaded once (a model), which CK_FORK=yes in
** the environment still overrides. */
static inline int check_run_mode(Suite *s, enum fork_status fork)
{
    SRunner *sr = srunner_create(s);
    if (fork != CK_FORK_GETENV && !getenv("CK_FORK")) srunner_set_fork_status(sr, fork);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

/* Run one suite with libcheck's default fork mode (see check_run_mode). */
static inline int check_run(Suite *s) { return check_run_mode(s, CK_FORK_GETENV); }

/* Add the n tests to tc; with PRL_TEST_ONLY=substring in the environment only the tests whose
** function name contains it (for working on one case of a long table). */
static inline void check_add_tests(TCase *tc, const TTest *const *tests, size_t n)
{
    const char *only = getenv("PRL_TEST_ONLY");
    for (size_t i = 0; i < n; i++)
        if (!only || strstr(tests[i]->name, only)) tcase_add_test(tc, tests[i]);
}

#endif /* PRL_CHECK_UTIL_H */
