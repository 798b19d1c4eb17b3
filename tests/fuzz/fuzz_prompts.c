/*
** fuzz_prompts.c — users' prompt files (prl_tasks_file_read): every line's fields and its
** verifier's (math answers, code tests, constraints, choices, agent specs).
*/
#include "tasks/tasks.h"
#include "tests/fuzz/fuzz.h"

static prl_status take_line(void *user, json_t *line)
{
    (void)user, (void)line;
    return PRL_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    prl_tasks_file_options opt = {.require_verifier = size % 2};
    prl_tasks_file_read(path, &opt, take_line, NULL);
    close(fd);
    return 0;
}
