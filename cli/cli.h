/*
** cli.h — the one public header of cli/ (bench.h is private to `prl bench`): the prl command's
** subcommands and their shared helpers.
**
** Error model (tools): a subcommand prints "prl <cmd>: <message>" to stderr and returns a
** non-zero exit code (2 for bad usage, 1 for everything else); nothing is ever left half
** written under a final name.
*/
#ifndef PRL_CLI_H
#define PRL_CLI_H

#include "job/job.h"
#include "reward/reward.h"

#include <jansson.h>

typedef enum { OPT_STR, OPT_INT, OPT_DOUBLE, OPT_U64, OPT_FLAG } cli_opt_type;

/* One --flag. `ptr` points at a const char *, int, double, uint64_t or int (flag). */
typedef struct cli_opt {
    const char *name; /* without the leading "--" */
    cli_opt_type type;
    void *ptr;
    const char *arg; /* placeholder shown in help ("FILE"), NULL for flags */
    const char *help;
    int required;
    int seen; /* set by the parser */
} cli_opt;

enum { CLI_OK = 0, CLI_HELP = 1, CLI_USAGE = 2 };

/* Parse argv[first..argc) against opts (terminated by a zeroed entry). Positional arguments
** are returned in pos (up to max_pos). Prints help for --help/-h (returns CLI_HELP) and a
** message naming the flag on any error (returns CLI_USAGE). */
int cli_parse(int argc, char **argv, int first, cli_opt *opts, const char *usage,
              const char *summary, const char **pos, int max_pos, int *n_pos);
void cli_print_help(FILE *out, const char *usage, const char *summary, const cli_opt *opts);
/* Print "prl <cmd>: <prl_error_message()>" and return 1. */
int cli_fail(const char *cmd);
/* Print "prl <cmd>: " + formatted message and return `code`. */
int cli_failf(const char *cmd, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* 0 when `path` (the value of --flag) does not exist and its folder does and is writable;
** else print what is wrong and return 2. Every command that writes a new file or folder
** checks this before any work. */
int cli_require_new(const char *cmd, const char *flag, const char *path);
/* " (did you mean 'x'?)" for the choice of `choices` ("a|b|c") nearest to a mistyped `word`
** (edit distance at most 2, or a third of the choice's length), else "". A static buffer:
** use it before the next call. */
const char *cli_did_you_mean(const char *word, const char *choices);
/* Set up BLAS and the thread pool (threads <= 0: default) and print the blas line to
** stderr. Returns 0 or prints the error and returns 1. */
int cli_setup_blas(const char *cmd, int threads);
/* The infer path's options from the preset `precision` (NULL: fp32), then the knobs mla and
** matmul (NULL: the preset's). Returns 0 or prints the error and returns 2 (bad usage). */
int cli_infer_options(const char *cmd, prl_infer_options *io, const char *precision,
                      const char *mla, const char *matmul);
/* The "ids" value of a JSONL line as token ids (malloc'd, caller frees); errors name
** FILE:LINE and the bad entry. */
prl_status cli_json_ids(json_t *v, const char *file, int line, int32_t **ids, size_t *n);
/* A "messages" array as chat turns that borrow the JSON strings (free the array only). */
prl_status cli_json_messages(json_t *v, const char *file, int line, prl_chat_message **msgs,
                             size_t *n);

/* Generation prompts as token ids (cli/prompts.c): ids[i] (malloc'd) of len[i] tokens. */
typedef struct cli_prompts {
    int32_t **ids;
    int *len;
    int n, cap;
} cli_prompts;
/* `text` (a user turn through the chat template, or with `raw` plain text after <|bos|>) when
** non-NULL, else every line of the JSONL `file`: {"prompt": "..."} (as `text`), {"messages":
** [...]} (a chat prompt ending with <|assistant|>) or {"ids": [...]}. Appends to *out (zeroed
** first); text needs `tok`. Errors name FILE:LINE; an empty file is an error. A `mode` other
** than PRL_MODE_DEFAULT ends each chat prompt's last user message with its switch (docs/tasks.md
** "Modes"); raw text and "ids" lines cannot take one (an error). */
prl_status cli_prompts_read(const char *text, const char *file, int raw, prl_tasks_mode mode,
                            const prl_tokenizer *tok, cli_prompts *out);
void cli_prompts_free(cli_prompts *p);

/* The start every JSONL input line shares: obj must be an object; its "ids", when present,
** are read into *ids (*done = 1); without them text needs `tok` (the error says "FILE:LINE:
** <text_needs> a tokenizer.json in the checkpoint"). */
prl_status cli_jsonl_ids_line(json_t *obj, const prl_tokenizer *tok, const char *file, int line,
                              const char *text_needs, int32_t **ids, size_t *n, int *done);
/* One JSONL input line as token ids (malloc'd): {"ids": [...]}, {"text": "..."} or
** {"messages": [...]} (chat template; *mask gets its loss mask, 1 on assistant tokens, else
** stays NULL). Text needs `tok`. Errors name FILE:LINE. */
prl_status cli_jsonl_sequence(json_t *obj, const prl_tokenizer *tok, const char *file, int line,
                              int32_t **ids, uint8_t **mask, size_t *n);
/* The prompt length of such a line: the tokens before the first assistant token (chat input),
** else its "prompt_len", else 1. */
int cli_jsonl_prompt_len(json_t *obj, const uint8_t *mask, size_t n);

/* Call fn for every non-blank line of a JSONL file, in order, with the parsed object (owned by
** the caller of fn) and its 1-based line number; fn stops the loop by returning an error or by
** clearing *go. Unreadable files and invalid JSON are errors naming FILE:LINE. */
typedef prl_status (*cli_jsonl_fn)(void *user, json_t *obj, int line, int *go);
prl_status cli_jsonl_for_each(const char *path, cli_jsonl_fn fn, void *user);

/* One row of a subcommand table (main.c's commands, cmd_role.c's roles). */
typedef struct cli_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} cli_command;
/* The names of the n commands as "a|b|c" into out[size] (for cli_did_you_mean). */
void cli_command_names(const cli_command *c, int n, char *out, size_t size);

int cmd_init(int argc, char **argv);
int cmd_average(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_sft(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_score(int argc, char **argv);
int cmd_tokenizer(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tasks(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_diagnose(int argc, char **argv);
int cmd_report(int argc, char **argv);
/* `prl tasks check` (cmd_tasks_check.c). */
int cmd_tasks_check(int argc, char **argv);

int cmd_sandbox(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_role(int argc, char **argv);
int cmd_keys(int argc, char **argv);
/* runs/NAME/job.json into out[n]. */
prl_status cli_run_job_path(const char *run_dir, char *out, size_t n);

#endif /* PRL_CLI_H */
