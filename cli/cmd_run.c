/*
** cmd_run.c — `prl run CONFIG`, `prl run --resume DIR`: validate the job config (every error
** names the key, before any process starts), create runs/NAME/ (job.json, logs/, ckpt/) and
** hand the run to the launcher (roles/launcher.c), which starts and supervises every role
** (docs/pipeline.md).
*/
#include "cli/cli.h"
#include "roles/controller/controller.h"
#include "roles/roles.h"
#include "grpo/grpo.h"
#include "opd/opd.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_SETS = 64 };

static int mkdir_p(const char *path)
{
    char buf[1100];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

/* job.json, written atomically (it is the run's config of record for every restart). */
static prl_status write_job(const char *run_dir, const prl_job_config *job)
{
    char path[1100], tmp[1200];
    prl_status rc = cli_run_job_path(run_dir, path, sizeof path);
    if (rc) return rc;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    char *text = prl_job_config_to_json(job);
    if (!text) return prl_error_set(PRL_ERR_NOMEM, "job config");
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    free(text);
    int bad = !o || json_dump_file(o, tmp, JSON_INDENT(2) | JSON_SORT_KEYS) || rename(tmp, path);
    json_decref(o);
    return bad ? prl_error_set(PRL_ERR_IO, "cannot write %s: %s", path, strerror(errno)) : PRL_OK;
}

/* --resume with --set: the job must still be the recorded run's, checked before job.json is
** written, so a refused override changes nothing on disk (the controller checks run.db too). */
static prl_status same_run(const char *job_path, const prl_job_config *job)
{
    char *then = NULL, *now = prl_job_config_to_json(job);
    prl_status rc =
        now ? prl_file_read(job_path, &then, NULL) : prl_error_set(PRL_ERR_NOMEM, "job");
    if (!rc) rc = prl_job_config_same_run(then, now, job->name, job_path);
    free(then);
    free(now);
    return rc;
}

static prl_status count_line(void *user, json_t *line)
{
    const char *split = json_string_value(json_object_get(line, "split"));
    ((int *)user)[split && !strcmp(split, "eval")]++;
    return PRL_OK;
}

/* task.source = file: every line of the prompt file is read and checked (a bad one names
** FILE:LINE and the field), and a split must not come out empty. */
static prl_status check_prompt_file(const prl_job_config *job)
{
    if (strcmp(job->task_source, "file")) return PRL_OK;
    int n[2] = {0, 0};
    prl_tasks_file_options fo = {.require_verifier = !prl_job_has_reward_program(job)};
    prl_status rc = prl_reward_file_read(job->task_path, &fo, count_line, n);
    if (rc) return prl_error_wrap(rc, "task.path: ");
    if (n[0] == 0)
        return prl_error_set(PRL_ERR_CONFIG, "task.path: %s has no line in the train split",
                             job->task_path);
    fprintf(stderr, "prl run: %s: %d train and %d eval prompts\n", job->task_path, n[0], n[1]);
    return PRL_OK;
}

/* model.init loads as the rollout and the trainer will load it: every file complete, every
** checksum right, every value finite, the tokenizer readable. Found here, a bad checkpoint
** stops the run before any process starts instead of failing its first work items. */
static prl_status check_init_loads(const prl_job_config *job)
{
    prl_model m;
    prl_tokenizer *tok = NULL;
    prl_status rc = prl_checkpoint_load_tokenizer(&m, job->init, &tok);
    if (rc) return prl_error_wrap(PRL_ERR_CONFIG, "model.init: ");
    prl_tokenizer_free(tok);
    prl_model_free(&m);
    return PRL_OK;
}

/* Every check that needs the file system or another module's rules, before any process
** starts (the trainer's precision and loss scaler: grpo/scaling.c; the prompt file; the
** reward program). */
static prl_status check_inputs(const prl_job_config *job)
{
    prl_grpo_precision prec;
    prl_status rc = prl_grpo_precision_from_job(&prec, job);
    if (!rc) rc = check_prompt_file(job);
    if (!rc) rc = prl_reward_program_check(job);
    if (!rc) rc = prl_reward_learned_check(job);
    if (rc) return rc;
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", job->init);
    struct stat sb;
    if (stat(p, &sb))
        return prl_error_set(
            PRL_ERR_CONFIG,
            "model.init: %s is not a checkpoint directory (no "
            "config.json)%s",
            job->init,
            !strcmp(job->init, "runs/sft-base/ckpt")
                ? "; make the SFT base first: prl sft --config configs/sft-base.json"
                : "");
    snprintf(p, sizeof p, "%s/tokenizer.json", job->init);
    if (stat(p, &sb))
        return prl_error_set(PRL_ERR_CONFIG, "model.init: %s has no tokenizer.json", job->init);
    if ((rc = check_init_loads(job))) return rc;
    if ((rc = prl_launcher_check(job))) return rc;
    return prl_opd_check_teachers(job); /* OPD: every teacher exists and fits the student */
}

/* Pull every `--set key=value` out of argv (they may repeat), leaving the rest. */
static int take_sets(int *argc, char **argv, const char **sets)
{
    int n = 0, k = 2;
    for (int i = 2; i < *argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < *argc && n < MAX_SETS) {
            sets[n++] = argv[++i];
        } else if (!strncmp(argv[i], "--set=", 6) && n < MAX_SETS) {
            sets[n++] = argv[i] + 6;
        } else {
            argv[k++] = argv[i];
        }
    }
    *argc = k;
    return n;
}

int cmd_run(int argc, char **argv)
{
    const char *sets[MAX_SETS];
    int n_sets = take_sets(&argc, argv, sets);
    const char *resume = NULL, *runs = "runs";
    int threads = 0, check_only = 0;
    cli_opt opts[] = {
        {"resume", OPT_STR, &resume, "DIR", "continue the stopped or crashed run in DIR", 0, 0},
        {"runs", OPT_STR, &runs, "DIR", "where run directories go (default runs)", 0, 0},
        {"threads", OPT_INT, &threads, "N",
         "threads per role unless the job sets trainer.threads or rollout.threads (default: "
         "PRL_THREADS or all CPUs)",
         0, 0},
        {"check", OPT_FLAG, &check_only, NULL, "validate the config and exit", 0, 0},
        {"set", OPT_STR, NULL, "KEY=VALUE", "override a config key (repeatable; docs/job.md)", 0,
         0},
        {0}};
    const char *pos[1];
    int n_pos = 0;
    int pr = cli_parse(
        argc, argv, 2, opts, "prl run CONFIG [--set KEY=VALUE ...] | prl run --resume DIR",
        "Train a GRPO expert (or distil the experts into one policy with opd.enabled, "
        "docs/opd.md): the controller, trainer, rollout, reward (and teacher) workers as "
        "separate processes over ZeroMQ, every sample in DIR/run.db "
        "(docs/pipeline.md, docs/job.md).",
        pos, 1, &n_pos);
    if (pr) return pr == CLI_HELP ? 0 : 2;
    if (!!n_pos == !!resume)
        return cli_failf("run", 2,
                         "give either a CONFIG file or --resume DIR (see prl run --help)");
    prl_job_config job;
    prl_job_config_default(&job);
    char job_path[1100], run_dir[1100];
    prl_status rc = PRL_OK;
    if (resume) {
        snprintf(run_dir, sizeof run_dir, "%s", resume);
        size_t k = strlen(run_dir);
        while (k > 1 && run_dir[k - 1] == '/') run_dir[--k] = 0;
        rc = cli_run_job_path(run_dir, job_path, sizeof job_path);
        if (!rc) rc = prl_job_config_load(&job, job_path);
    } else {
        rc = prl_job_config_load(&job, pos[0]);
    }
    if (!rc && n_sets) rc = prl_job_config_set_all(&job, (const char *const *)sets, n_sets);
    if (!rc && !resume) {
        snprintf(run_dir, sizeof run_dir, "%s/%s", runs, job.name);
        rc = cli_run_job_path(run_dir, job_path, sizeof job_path);
        struct stat sb;
        if (!rc && !stat(job_path, &sb))
            rc = prl_error_set(PRL_ERR_ARG,
                               "%s already exists: continue it with `prl run --resume %s` "
                               "or choose another run.name",
                               run_dir, run_dir);
    }
    if (!rc && resume) rc = same_run(job_path, &job);
    if (!rc) rc = check_inputs(&job);
    char ep[1100]; /* the sockets' paths must fit an ipc:// endpoint */
    if (!rc) rc = prl_controller_endpoint(run_dir, "control.sock", ep, sizeof ep);
    if (!rc) rc = prl_controller_endpoint(run_dir, "sandbox.sock", ep, sizeof ep);
    if (rc || check_only) {
        prl_job_config_free(&job);
        if (rc) return cli_failf("run", 2, "%s", prl_error_message());
        printf("%s: config ok\n", n_pos ? pos[0] : job_path);
        return 0;
    }
    char sub[1200];
    int lock = -1; /* held until this process ends: a second prl run of the run is refused */
    if (mkdir_p(run_dir))
        rc = prl_error_set(PRL_ERR_IO, "cannot create %s: %s", run_dir, strerror(errno));
    if (!rc) rc = prl_launcher_lock(run_dir, &lock);
    struct stat sb; /* a new run: another prl run may have made it while this one waited */
    if (!rc && !resume && !stat(job_path, &sb))
        rc = prl_error_set(PRL_ERR_ARG, "%s already exists: continue it with `prl run --resume %s`",
                           run_dir, run_dir);
    /* the run's folder, its sockets and its key are its owner's alone (docs/protocol.md) */
    if (!rc && chmod(run_dir, 0700) != 0)
        rc = prl_error_set(PRL_ERR_IO, "cannot chmod 0700 %s: %s", run_dir, strerror(errno));
    if (!rc) {
        int bad = 0;
        snprintf(sub, sizeof sub, "%s/logs", run_dir), bad |= mkdir_p(sub);
        snprintf(sub, sizeof sub, "%s/ckpt", run_dir), bad |= mkdir_p(sub);
        if (bad) rc = prl_error_set(PRL_ERR_IO, "cannot create %s: %s", sub, strerror(errno));
    }
    if (!rc) rc = write_job(run_dir, &job);
    prl_bus_secret secret; /* before any role starts: each one presents it on joining */
    snprintf(sub, sizeof sub, "%s/bus.key", run_dir);
    if (!rc) rc = prl_bus_key_ensure(sub, &secret);
    if (rc) {
        prl_job_config_free(&job);
        return cli_fail("run");
    }
    int code = prl_launcher_run(run_dir, &job, threads);
    prl_job_config_free(&job);
    close(lock);
    if (code == 0) printf("run finished: the final policy is %s/final\n", run_dir);
    return code;
}
