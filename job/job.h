/*
** job.h — the one public header of job/: a training job's configuration (the JSON files in
** configs/ that `prl run` will take), with defaults, `--set key=value` overrides and
** validation that names the key — all before any process starts.
**
** Keys are dotted paths into sections: run (name, seed), model (init checkpoint), task
** (domain, difficulty, problems), rollout, reward, sandbox, grpo, optim, controller,
** checkpoint, opd and teacher (on-policy distillation, docs/opd.md). docs/job.md lists every key with its type, default and range. An unknown key
** (with the nearest known key suggested), a wrong type, an impossible value (B·G = 0, a
** negative clip) or a bad choice is PRL_ERR_CONFIG naming the key and the source.
**
** Ownership: prl_job_config owns its strings (prl_job_config_free).
*/
#ifndef PRL_JOB_H
#define PRL_JOB_H

#include "engine/engine.h"
#include "tasks/tasks.h"

typedef struct prl_job_config {
    /* run */
    char *name;
    uint64_t seed;
    /* model */
    char *init; /* checkpoint to start from */
    /* task */
    char *domain;   /* reasoning | general | agent | coding | mixed (all four) */
    int difficulty; /* 0 (mixed) .. 3 */
    int train_problems, eval_problems;
    double mix[PRL_TASK_N_DOMAINS]; /* task.mix.<domain>, prl_task_domain order: with domain =
                                    ** mixed, domain d has round(train_problems · mix[d]) train
                                    ** problems, so its prompts are drawn in that proportion */
    char *task_source;              /* generate (the built-in domains) | file (task_path) */
    char *task_path;  /* a JSONL prompt file or a directory of shards (docs/tasks.md) */
    int eval_every;   /* in-run evaluation every N versions (0: off) */
    int eval_samples; /* k of pass@k (1: greedy accuracy only) */
    /* rollout */
    int rollout_workers, batch_prompts, group_size, max_new_tokens, max_turns;
    double temperature, top_p;
    char *precision;      /* fp32 | bf16 | fp16 | aligned | aligned-bf16 | aligned-fp16 */
    int rollout_threads;  /* threads of each rollout worker (0: prl run --threads) */
    char *rollout_mode;   /* default | think | no_think: the switch the rollout ends each task's
                          ** last user message with (docs/tasks.md "Modes") */
    char *rollout_source; /* engine (rollout workers play the tasks) | gateway (outside agents
                          ** play them through the gateway, docs/gateway.md) */
    /* bus (docs/scale-out.md "Several hosts"): the controller also listens at bus_bind
    ** (tcp://HOST:PORT; "" none); off loopback with CURVE: its keypair in directory bus_keys,
    ** the workers' public keys in bus_authorized_keys ("": RUN_DIR/authorized_keys) */
    char *bus_bind;
    int bus_allow_remote;
    char *bus_keys;
    char *bus_authorized_keys;
    /* gateway (docs/gateway.md) */
    char *gateway_bind;             /* HOST:PORT of the HTTP server (port 0: any free one) */
    int gateway_allow_remote;       /* bind a non-loopback host */
    int gateway_max_body;           /* request bodies larger than this are refused (413) */
    int gateway_groups;             /* groups held at once (0: rollout.batch_prompts) */
    double gateway_episode_timeout; /* an episode silent this long is ended (truncated) */
    double gateway_client_timeout;  /* a connection idle this long is closed */
    /* trainer */
    int trainer_threads;     /* threads of the trainer (0: prl run --threads) */
    int trainer_ranks;       /* data-parallel trainer processes (1: no MPI) */
    char *trainer_launcher;  /* auto | mpirun | srun: what starts the ranks */
    char *trainer_hosts;     /* mpirun --host list "a:2,b:2" ("": this host only) */
    char *trainer_hostfile;  /* mpirun --hostfile FILE ("": none) */
    int micro_rows;          /* trainer.micro_rows: sequences per forward/backward */
    char *trainer_precision; /* fp32 | bf16 | fp16: the train path's arithmetic */
    /* trainer.loss_scale: dynamic loss scaling (rl.md §4.3); 0 = the preset's constant */
    char *ls_enabled; /* auto (on for fp16) | on | off */
    char *ls_preset;  /* torch | megatron | verl_fsdp | verl_megatron */
    double ls_init, ls_growth_factor, ls_backoff_factor, ls_min_scale;
    int ls_growth_interval, ls_hysteresis;
    /* reward, sandbox */
    int reward_workers, sandbox_slots;
    int sandbox_warm; /* python3 programs start from a zygote per slot (docs/sandbox.md) */
    double reward_timeout;
    char *reward_program; /* reward.program: JSON array of argv ("[]": the verifiers score) */
    int reward_network;   /* reward.network: the reward program may use the network */
    /* learned rewards (docs/reward-models.md): score = (1 − wm − wj)·rule + wm·rm
    ** + wj·judge */
    char *reward_model;          /* reward.model: a reward model checkpoint ("" none) */
    double reward_model_weight;  /* reward.model_weight wm */
    int reward_model_normalize;  /* reward.model_normalize: σ((r − μ)/s), else σ(r) */
    char *reward_judge;          /* reward.judge: a generative judge checkpoint ("" none) */
    double reward_judge_weight;  /* reward.judge_weight wj */
    char *reward_judge_template; /* reward.judge_template ("" the default rubric) */
    int reward_judge_tokens;     /* reward.judge_max_new_tokens */
    /* grpo */
    char *adv_norm;  /* std | none */
    char *singleton; /* zero | verl | drop */
    double adv_eps, clip_low, clip_high, clip_c, loss_scale_factor, kl_coef;
    char *loss_agg; /* token-mean | ... */
    int ppo_epochs, minibatches;
    char *grpo_algorithm;    /* grpo | gspo: token or sequence importance ratio (docs/grpo.md) */
    char *grpo_advantage;    /* grpo | rloo: group-mean or leave-one-out baseline */
    double grpo_expert_clip; /* per routed expert gradient-norm bound of each update, 0 = off */
    /* grpo.correction: train–infer mismatch correction (docs/grpo.md "Mismatch corrections") */
    char *corr_kind;        /* none | tis | mis | icepop | kpop */
    char *corr_level;       /* token | sequence */
    char *corr_mode;        /* decoupled | bypass */
    char *corr_bypass_loss; /* ppo_clip | reinforce */
    char *corr_denominator; /* original | kept */
    double tis_cap, mis_cap, icepop_low, icepop_high, kpop_phi; /* the loose setting */
    double strict_tis_cap, strict_mis_cap, strict_icepop_low, strict_icepop_high,
        strict_kpop_phi; /* the strict setting */
    int pcc_rule;        /* pick the setting by the batch's train–rollout PCC */
    double pcc_threshold, extreme_ratio;
    /* replay (docs/replay.md) */
    char *replay_mode;           /* none | r2 | r3 | masked_r3 */
    double replay_tau;           /* Masked R3 threshold on |I_train ∩ I_infer| / K */
    double replay_entropy_alarm; /* alarm below this fraction of ln N_experts (0 = off) */
    int replay_cached;           /* rollout: Cached R3 (first-seen routes across turns) */
    /* optim */
    char *optimizer; /* adamw | muon */
    double lr, weight_decay, grad_clip;
    int warmup;
    char *lr_schedule; /* cosine | constant */
    int decay_steps;   /* cosine: optimizer steps from peak to lr · min_lr_ratio */
    double min_lr_ratio;
    /* controller */
    char *mode; /* sync | async */
    int max_lag, steps, dynamic_sampling;
    int retire_solved_epochs; /* retire prompts every sample solved in each of the last n epochs */
    int retire_unsolved_epochs; /* retire prompts no sample scored on in each of the last n epochs */
    double lease_seconds, heartbeat_seconds;
    int max_rejected; /* rejected results of one work item before the run fails */
    /* checkpoint */
    int checkpoint_every;
    /* opd: multi-teacher on-policy distillation (docs/opd.md) */
    int opd_enabled;
    char *opd_teachers[4];      /* opd.teachers.{agent,coding,general,reasoning}: checkpoint
                                 ** dirs ("" = none); the order of opd.h's teacher keys */
    double opd_teacher_coef[4]; /* opd.teacher_coef.<key>: multiplies opd.coef for that
                                 ** teacher's samples (same order) */
    double opd_coef, opd_discount, opd_adv_clip_low, opd_adv_clip_high, opd_adv_mask_eps,
        opd_task_weight;
    int opd_adv_clip;
    int opd_topk;             /* opd.topk: teacher top-k per token for the distillation term
                                 ** (0: off) */
    double opd_topk_coef;     /* opd.topk_coef: that term's weight */
    double opd_revisit;       /* opd.revisit: share of a step's prompts drawn again by their
                                 ** last teacher KL (0: off; docs/opd.md "Revisits") */
    double opd_revisit_power; /* opd.revisit_power: draw weight within a teacher = KL^power */
    int teacher_workers, teacher_threads; /* the pool of teacher processes */
} prl_job_config;

/* Every key at its default (docs/job.md). */
prl_status prl_job_config_default(prl_job_config *c);
void prl_job_config_free(prl_job_config *c);
/* Apply a JSON object text over *c (keys absent from the text keep their values); `source`
** names the text in errors. Then validate the whole config. */
prl_status prl_job_config_parse(prl_job_config *c, const char *json_text, const char *source);
prl_status prl_job_config_load(prl_job_config *c, const char *path);
/* One `--set key=value` override: the value is JSON (a number, true/false, a quoted string)
** or, when it does not parse as JSON, a bare string. Validates the whole config after. */
prl_status prl_job_config_set(prl_job_config *c, const char *assignment);
/* n overrides applied in order, then the whole config validated once, so that keys with a
** rule between them (task.source = file and task.path) can be set together. */
prl_status prl_job_config_set_all(prl_job_config *c, const char *const *assignments, int n);
/* A name that becomes a directory (run.name: runs/NAME/): 1 to PRL_JOB_NAME_MAX characters
** of [A-Za-z0-9._-], not starting with '.', so it is never a path ("../x", "a/b"), hidden,
** empty or multi-line. Else PRL_ERR_CONFIG naming `source`, the key and the rule. */
enum { PRL_JOB_NAME_MAX = 100 };
prl_status prl_job_name_check(const char *source, const char *key, const char *name);
/* The job scores with a reward program (reward.program is not empty). */
int prl_job_has_reward_program(const prl_job_config *c);
/* Train problems of domain d in this job: task.train_problems for its one domain (0 for the
** others), or round(train_problems · task.mix.<d>) with task.domain = mixed. */
int prl_job_mix_problems(const prl_job_config *c, prl_task_domain d);
/* Check ranges and cross-key rules (B·G > 0, clip values, choices). */
prl_status prl_job_config_check(const prl_job_config *c, const char *source);
/* A resumed run may change controller.steps and the thread counts, nothing else: the
** recorded config `then_json` against `now_json` (both prl_job_config_to_json texts; keys a
** newer prl added are ignored at their defaults). Else PRL_ERR_CONFIG naming run `name` and
** `where` the record is (run.db, job.json). */
prl_status prl_job_config_same_run(const char *then_json, const char *now_json, const char *name,
                                   const char *where);
/* The whole config as a JSON object text (malloc'd): what a run records in run.db. */
char *prl_job_config_to_json(const prl_job_config *c);
/* The checkpoint directory of policy version v in a run directory, RUN_DIR/ckpt/vNNNNNN, into
** out[n] (truncated when n is too small). */
void prl_job_ckpt_dir(const char *run_dir, int64_t version, char *out, size_t n);

#endif /* PRL_JOB_H */
