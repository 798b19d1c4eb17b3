/*
** cli.h — the one header of cli/: the prl command's subcommands and their shared helpers.
**
** Error model (tools): a subcommand prints "prl <cmd>: <message>" to stderr and returns a
** non-zero exit code (2 for bad usage, 1 for everything else); nothing is ever left half
** written under a final name.
*/
#ifndef PRL_CLI_H
#define PRL_CLI_H

#include "bus/bus.h"
#include "job/job.h"
#include "reward/reward.h"

#include <pthread.h>
#include <signal.h>

#include <jansson.h>

typedef enum { OPT_STR, OPT_INT, OPT_DOUBLE, OPT_U64, OPT_FLAG } cli_opt_type;

/* One --flag. `ptr` points at a const char *, int, double, uint64_t or int (flag). */
typedef struct cli_opt {
    const char *name;   /* without the leading "--" */
    cli_opt_type type;
    void *ptr;
    const char *arg;    /* placeholder shown in help ("FILE"), NULL for flags */
    const char *help;
    int required;
    int seen;           /* set by the parser */
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
int cli_failf(const char *cmd, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Set up BLAS and the thread pool (threads <= 0: default) and print the blas line to
** stderr. Returns 0 or prints the error and returns 1. */
int cli_setup_blas(const char *cmd, int threads);
/* Load a checkpoint directory and its tokenizer.json when it has one (*tok NULL otherwise).
** On error nothing is left allocated. */
prl_status cli_load_checkpoint(const char *dir, prl_model *m, prl_tokenizer **tok);
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
** first); text needs `tok`. Errors name FILE:LINE; an empty file is an error. */
prl_status cli_prompts_read(const char *text, const char *file, int raw, const prl_tokenizer *tok,
                            cli_prompts *out);
void cli_prompts_free(cli_prompts *p);

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

int cmd_init(int argc, char **argv);
int cmd_average(int argc, char **argv);
int cmd_sft(int argc, char **argv);
int cmd_score(int argc, char **argv);
int cmd_tokenizer(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tasks(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_diagnose(int argc, char **argv);
/* `prl tasks check` (cmd_tasks_check.c). */
int cmd_tasks_check(int argc, char **argv);

/* The CLI's executor for the verifiers (exec_bridge.c): programs run in the sandbox, which
** starts on the first run (a start-up failure is returned by that run, naming the cause).
** Pass the cli_exec as the prl_reward_exec ctx. new/free pair; free accepts NULL. */
typedef struct cli_exec cli_exec;
cli_exec *cli_exec_new(void);
void cli_exec_free(cli_exec *x);
prl_status cli_exec_sandboxed(void *ctx, const prl_reward_exec_request *req,
                              prl_reward_exec_result *res);
/* The same over the sandbox service: ctx is a prl_sandbox_client (sandbox/sandbox.h), owned
** by the caller; its retry and deadline apply. A run the service could not start
** (sandbox_error) or no answer by the deadline is an error return, as for the local one. */
prl_status cli_exec_service(void *ctx, const prl_reward_exec_request *req,
                            prl_reward_exec_result *res);
int cmd_sandbox(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_role(int argc, char **argv);
int cmd_role_controller(int argc, char **argv);
int cmd_role_rollout(int argc, char **argv);
int cmd_role_reward(int argc, char **argv);
int cmd_role_trainer(int argc, char **argv);
int cmd_role_sandbox(int argc, char **argv);
int cmd_role_teacher(int argc, char **argv);
/* The controller's exit code when the run failed for good (the launcher does not restart it). */
enum { CLI_RUN_FAILED = 4 };
/* runs/NAME/job.json into out[n]. */
prl_status cli_run_job_path(const char *run_dir, char *out, size_t n);

/* ---------------------------------------------------------------- roles (role.c) --- */

/* A worker role's link to the run: the DEALER socket to the controller (identity = the
** worker name), what the welcome said, and the heartbeat thread. join/leave pair. */
typedef struct cli_role {
    const char *role;         /* "rollout", "reward", "trainer" */
    char worker[64];          /* stable name, e.g. "rollout-0" */
    char endpoint[512];
    char run[128];            /* from the welcome */
    char run_dir[1024];
    uint64_t seed;
    prl_job_config job;       /* from the welcome */
    double heartbeat_s;
    prl_bus_socket *ctl;
    uint64_t next_id;         /* ids of the messages this worker sends */
    int stop;                 /* a stop message arrived */
    volatile int hb_quit;
    int hb_running;
    pthread_t hb;
} cli_role;

/* SIGTERM/SIGINT set the stop flag cli_role_stopping reports; SIGPIPE is ignored. */
void cli_role_install_signals(void);
int cli_role_stopping(const cli_role *r);
/* Connect, hello, wait for the welcome (re-sending hello every second, up to 2 minutes),
** start the heartbeat. On error nothing is left open. */
prl_status cli_role_join(cli_role *r, const char *role, const char *worker, const char *endpoint,
                         int allow_remote);
void cli_role_leave(cli_role *r);
prl_status cli_role_send_hello(cli_role *r);
prl_status cli_role_take_welcome(cli_role *r, const prl_bus_msg *welcome);
/* The next work message, up to timeout_ms. stop, welcome and error messages are handled
** here (*got stays 0): stop sets r->stop; a re-welcome updates the run; an error asking to
** say hello is answered. */
prl_status cli_role_next(cli_role *r, int timeout_ms, prl_bus_msg *m, int *got);
/* Tell the controller this worker cannot do work item m (an `error` naming the lease, which
** the controller hands out again, at most a few times) and log it. */
void cli_role_refuse(cli_role *r, const prl_bus_msg *m, const char *why);
/* The flag SIGTERM/SIGINT set (cli_role_install_signals), for loops that poll it. */
const volatile sig_atomic_t *cli_role_stop_flag(void);
/* "[rollout-0] message" on stderr. */
void cli_role_log(const cli_role *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Where a role's programs run (python tool calls, coding tests): the sandbox service at
** `sandbox` (re-sent after a service restart), or with sandbox NULL a sandbox of this
** process; repeats of a finished run are answered from a cache (role.c). open/close pair;
** x->exec is what the verifiers and rollout take. */
enum { CLI_EXEC_CACHE = 4096 };
typedef struct cli_exec_cache_entry {
    uint64_t key;
    int used;
    prl_reward_exec_result result;
} cli_exec_cache_entry;
typedef struct cli_role_exec {
    cli_exec *local;
    struct prl_sandbox_client *svc;
    prl_reward_exec inner;        /* the executor behind the cache */
    prl_reward_exec exec;         /* the cached one: give this to the verifiers */
    cli_exec_cache_entry *cache;  /* [CLI_EXEC_CACHE] */
    uint64_t hits;
} cli_role_exec;
prl_status cli_role_exec_open(cli_role_exec *x, const char *sandbox, const char *worker,
                              double wall_s);
void cli_role_exec_close(cli_role_exec *x);

#endif /* PRL_CLI_H */
