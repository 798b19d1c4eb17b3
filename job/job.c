/*
** job.c — the job configuration: its table of keys (path, type, field, range, choices) drives
** defaults, parsing, `--set` overrides, validation and serialisation through job/keys.c
** (job.h); the cross-key rules are here.
*/
#include "job/job.h"
#include "bus/bus.h"
#include "job/keys.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define F(field) offsetof(prl_job_config, field)
#define BIG 1e18

static const prl_key_spec keys[] = {
    {"run.name", PRL_KEY_STR, F(name), 0, 0, "\"job\"", NULL},
    {"run.seed", PRL_KEY_U64, F(seed), 0, BIG, "1", NULL},
    {"model.init", PRL_KEY_STR, F(init), 0, 0, "\"runs/sft-base/ckpt\"", NULL},
    {"task.domain", PRL_KEY_STR, F(domain), 0, 0, "\"reasoning\"",
     "reasoning|general|agent|coding|mixed"},
    {"task.difficulty", PRL_KEY_INT, F(difficulty), 0, 3, "0", NULL},
    {"task.train_problems", PRL_KEY_INT, F(train_problems), 1, 1e7, "2000", NULL},
    {"task.mix.reasoning", PRL_KEY_REAL, F(mix[0]), 0, 100, "1.0", NULL},
    {"task.mix.general", PRL_KEY_REAL, F(mix[1]), 0, 100, "1.0", NULL},
    {"task.mix.agent", PRL_KEY_REAL, F(mix[2]), 0, 100, "1.0", NULL},
    {"task.mix.coding", PRL_KEY_REAL, F(mix[3]), 0, 100, "1.0", NULL},
    {"task.eval_problems", PRL_KEY_INT, F(eval_problems), 1, 1e6, "100", NULL},
    {"task.source", PRL_KEY_STR, F(task_source), 0, 0, "\"generate\"", "generate|file"},
    {"task.path", PRL_KEY_STR, F(task_path), 0, 0, "\"\"", NULL},
    {"task.eval_every", PRL_KEY_INT, F(eval_every), 0, 1e9, "0", NULL},
    {"task.eval_samples", PRL_KEY_INT, F(eval_samples), 1, 64, "1", NULL},
    {"rollout.workers", PRL_KEY_INT, F(rollout_workers), 0, 64, "1", NULL},
    {"rollout.batch_prompts", PRL_KEY_INT, F(batch_prompts), 1, 4096, "8", NULL},
    {"rollout.group_size", PRL_KEY_INT, F(group_size), 1, 1024, "8", NULL},
    {"rollout.max_new_tokens", PRL_KEY_INT, F(max_new_tokens), 1, 65536, "96", NULL},
    {"rollout.max_turns", PRL_KEY_INT, F(max_turns), 1, 64, "10", NULL},
    {"rollout.temperature", PRL_KEY_REAL, F(temperature), 0, 100, "1.0", NULL},
    {"rollout.top_p", PRL_KEY_REAL, F(top_p), 1e-9, 1, "1.0", NULL},
    {"rollout.precision", PRL_KEY_STR, F(precision), 0, 0, "\"fp32\"",
     "fp32|bf16|fp16|w8a8|aligned|aligned-bf16|aligned-fp16"},
    {"rollout.threads", PRL_KEY_INT, F(rollout_threads), 0, 256, "0", NULL},
    {"rollout.source", PRL_KEY_STR, F(rollout_source), 0, 0, "\"engine\"", "engine|gateway"},
    {"rollout.mode", PRL_KEY_STR, F(rollout_mode), 0, 0, "\"default\"", "default|think|no_think"},
    {"bus.bind", PRL_KEY_STR, F(bus_bind), 0, 0, "\"\"", NULL},
    {"bus.allow_remote", PRL_KEY_BOOL, F(bus_allow_remote), 0, 1, "false", NULL},
    {"bus.keys", PRL_KEY_STR, F(bus_keys), 0, 0, "\"\"", NULL},
    {"bus.authorized_keys", PRL_KEY_STR, F(bus_authorized_keys), 0, 0, "\"\"", NULL},
    {"gateway.bind", PRL_KEY_STR, F(gateway_bind), 0, 0, "\"127.0.0.1:8000\"", NULL},
    {"gateway.allow_remote", PRL_KEY_BOOL, F(gateway_allow_remote), 0, 1, "false", NULL},
    {"gateway.max_body", PRL_KEY_INT, F(gateway_max_body), 1024, 268435456, "1048576", NULL},
    {"gateway.groups", PRL_KEY_INT, F(gateway_groups), 0, 4096, "0", NULL},
    {"gateway.episode_timeout", PRL_KEY_REAL, F(gateway_episode_timeout), 1, 86400, "300", NULL},
    {"gateway.client_timeout", PRL_KEY_REAL, F(gateway_client_timeout), 1, 3600, "30", NULL},
    {"reward.workers", PRL_KEY_INT, F(reward_workers), 0, 64, "1", NULL},
    {"reward.timeout", PRL_KEY_REAL, F(reward_timeout), 0.01, 3600, "2.0", NULL},
    {"reward.program", PRL_KEY_ARGV, F(reward_program), 0, 64, "[]", NULL},
    {"reward.network", PRL_KEY_BOOL, F(reward_network), 0, 1, "false", NULL},
    {"reward.model", PRL_KEY_STR, F(reward_model), 0, 0, "\"\"", NULL},
    {"reward.model_weight", PRL_KEY_REAL, F(reward_model_weight), 0, 1, "0.5", NULL},
    {"reward.model_normalize", PRL_KEY_BOOL, F(reward_model_normalize), 0, 1, "false", NULL},
    {"reward.judge", PRL_KEY_STR, F(reward_judge), 0, 0, "\"\"", NULL},
    {"reward.judge_weight", PRL_KEY_REAL, F(reward_judge_weight), 0, 1, "0.5", NULL},
    {"reward.judge_template", PRL_KEY_STR, F(reward_judge_template), 0, 0, "\"\"", NULL},
    {"reward.judge_max_new_tokens", PRL_KEY_INT, F(reward_judge_tokens), 1, 256, "16", NULL},
    {"sandbox.slots", PRL_KEY_INT, F(sandbox_slots), 1, 256, "2", NULL},
    {"sandbox.warm", PRL_KEY_BOOL, F(sandbox_warm), 0, 1, "false", NULL},
    {"trainer.threads", PRL_KEY_INT, F(trainer_threads), 0, 256, "0", NULL},
    {"trainer.ranks", PRL_KEY_INT, F(trainer_ranks), 1, 64, "1", NULL},
    {"trainer.launcher", PRL_KEY_STR, F(trainer_launcher), 0, 0, "\"auto\"", "auto|mpirun|srun"},
    {"trainer.hosts", PRL_KEY_STR, F(trainer_hosts), 0, 0, "\"\"", NULL},
    {"trainer.hostfile", PRL_KEY_STR, F(trainer_hostfile), 0, 0, "\"\"", NULL},
    {"trainer.micro_rows", PRL_KEY_INT, F(micro_rows), 1, 4096, "8", NULL},
    {"trainer.precision", PRL_KEY_STR, F(trainer_precision), 0, 0, "\"fp32\"", "fp32|bf16|fp16"},
    {"trainer.loss_scale.enabled", PRL_KEY_STR, F(ls_enabled), 0, 0, "\"auto\"", "auto|on|off"},
    {"trainer.loss_scale.preset", PRL_KEY_STR, F(ls_preset), 0, 0, "\"torch\"",
     "torch|megatron|verl_fsdp|verl_megatron"},
    {"trainer.loss_scale.init", PRL_KEY_REAL, F(ls_init), 0, 1e38, "0", NULL},
    {"trainer.loss_scale.growth_factor", PRL_KEY_REAL, F(ls_growth_factor), 0, 1e6, "0", NULL},
    {"trainer.loss_scale.backoff_factor", PRL_KEY_REAL, F(ls_backoff_factor), 0, 0.999999, "0",
     NULL},
    {"trainer.loss_scale.growth_interval", PRL_KEY_INT, F(ls_growth_interval), 0, 1e9, "0", NULL},
    {"trainer.loss_scale.hysteresis", PRL_KEY_INT, F(ls_hysteresis), 0, 1e6, "0", NULL},
    {"trainer.loss_scale.min_scale", PRL_KEY_REAL, F(ls_min_scale), 0, 1e38, "0", NULL},
    {"grpo.adv_norm", PRL_KEY_STR, F(adv_norm), 0, 0, "\"std\"", "std|none"},
    {"grpo.adv_eps", PRL_KEY_REAL, F(adv_eps), 1e-12, 1, "1e-6", NULL},
    {"grpo.singleton", PRL_KEY_STR, F(singleton), 0, 0, "\"zero\"", "zero|verl|drop"},
    {"grpo.clip_low", PRL_KEY_REAL, F(clip_low), 0, 0.999999, "0.2", NULL},
    {"grpo.clip_high", PRL_KEY_REAL, F(clip_high), 0, 100, "0.28", NULL},
    {"grpo.clip_c", PRL_KEY_REAL, F(clip_c), 0, 1e6, "3.0", NULL},
    {"grpo.loss_agg", PRL_KEY_STR, F(loss_agg), 0, 0, "\"token-mean\"",
     "token-mean|token-sum|seq-mean-token-mean|seq-mean-token-sum|seq-mean-token-sum-norm"},
    {"grpo.loss_scale_factor", PRL_KEY_REAL, F(loss_scale_factor), 0, 1e9, "0", NULL},
    {"grpo.kl_coef", PRL_KEY_REAL, F(kl_coef), 0, 1e3, "0", NULL},
    {"grpo.ppo_epochs", PRL_KEY_INT, F(ppo_epochs), 1, 100, "1", NULL},
    {"grpo.minibatches", PRL_KEY_INT, F(minibatches), 1, 4096, "1", NULL},
    {"grpo.algorithm", PRL_KEY_STR, F(grpo_algorithm), 0, 0, "\"grpo\"", "grpo|gspo"},
    {"grpo.advantage", PRL_KEY_STR, F(grpo_advantage), 0, 0, "\"grpo\"", "grpo|rloo"},
    {"grpo.expert_clip", PRL_KEY_REAL, F(grpo_expert_clip), 0, 1e9, "0", NULL},
    {"grpo.correction.kind", PRL_KEY_STR, F(corr_kind), 0, 0, "\"none\"",
     "none|tis|mis|icepop|kpop"},
    {"grpo.correction.level", PRL_KEY_STR, F(corr_level), 0, 0, "\"token\"", "token|sequence"},
    {"grpo.correction.mode", PRL_KEY_STR, F(corr_mode), 0, 0, "\"decoupled\"", "decoupled|bypass"},
    {"grpo.correction.bypass_loss", PRL_KEY_STR, F(corr_bypass_loss), 0, 0, "\"ppo_clip\"",
     "ppo_clip|reinforce"},
    {"grpo.correction.denominator", PRL_KEY_STR, F(corr_denominator), 0, 0, "\"original\"",
     "original|kept"},
    {"grpo.correction.tis_cap", PRL_KEY_REAL, F(tis_cap), 1e-6, 1e6, "2.0", NULL},
    {"grpo.correction.mis_cap", PRL_KEY_REAL, F(mis_cap), 1e-6, 1e6, "2.0", NULL},
    {"grpo.correction.icepop_low", PRL_KEY_REAL, F(icepop_low), 1e-6, 1e6, "0.5", NULL},
    {"grpo.correction.icepop_high", PRL_KEY_REAL, F(icepop_high), 1e-6, 1e6, "5.0", NULL},
    {"grpo.correction.kpop_phi", PRL_KEY_REAL, F(kpop_phi), 1e-9, 1e3, "0.75", NULL},
    {"grpo.correction.strict.tis_cap", PRL_KEY_REAL, F(strict_tis_cap), 1e-6, 1e6, "1.5", NULL},
    {"grpo.correction.strict.mis_cap", PRL_KEY_REAL, F(strict_mis_cap), 1e-6, 1e6, "1.5", NULL},
    {"grpo.correction.strict.icepop_low", PRL_KEY_REAL, F(strict_icepop_low), 1e-6, 1e6, "0.8",
     NULL},
    {"grpo.correction.strict.icepop_high", PRL_KEY_REAL, F(strict_icepop_high), 1e-6, 1e6, "1.25",
     NULL},
    {"grpo.correction.strict.kpop_phi", PRL_KEY_REAL, F(strict_kpop_phi), 1e-9, 1e3, "0.1", NULL},
    {"grpo.correction.pcc_rule", PRL_KEY_BOOL, F(pcc_rule), 0, 1, "false", NULL},
    {"grpo.correction.pcc_threshold", PRL_KEY_REAL, F(pcc_threshold), -1, 1, "0.99", NULL},
    {"grpo.correction.extreme_ratio", PRL_KEY_REAL, F(extreme_ratio), 1.000001, 1e6, "2.0", NULL},
    {"replay.mode", PRL_KEY_STR, F(replay_mode), 0, 0, "\"none\"", "none|r2|r3|masked_r3"},
    {"replay.tau", PRL_KEY_REAL, F(replay_tau), 0, 2, "0.5", NULL},
    {"replay.entropy_alarm", PRL_KEY_REAL, F(replay_entropy_alarm), 0, 1, "0.5", NULL},
    {"replay.cached", PRL_KEY_BOOL, F(replay_cached), 0, 1, "false", NULL},
    {"optim.kind", PRL_KEY_STR, F(optimizer), 0, 0, "\"adamw\"", "adamw|muon"},
    {"optim.lr", PRL_KEY_REAL, F(lr), 1e-12, 10, "1e-5", NULL},
    {"optim.weight_decay", PRL_KEY_REAL, F(weight_decay), 0, 10, "0", NULL},
    {"optim.grad_clip", PRL_KEY_REAL, F(grad_clip), 0, 1e9, "1.0", NULL},
    {"optim.warmup", PRL_KEY_INT, F(warmup), 0, 1e9, "0", NULL},
    {"optim.schedule", PRL_KEY_STR, F(lr_schedule), 0, 0, "\"cosine\"", "cosine|constant"},
    {"optim.decay_steps", PRL_KEY_INT, F(decay_steps), 1, 1e9, "1000", NULL},
    {"optim.min_lr_ratio", PRL_KEY_REAL, F(min_lr_ratio), 0, 1, "0.1", NULL},
    {"controller.mode", PRL_KEY_STR, F(mode), 0, 0, "\"sync\"", "sync|async"},
    {"controller.max_lag", PRL_KEY_INT, F(max_lag), 0, 1000, "1", NULL},
    {"controller.steps", PRL_KEY_INT, F(steps), 1, 1e9, "50", NULL},
    {"controller.dynamic_sampling", PRL_KEY_BOOL, F(dynamic_sampling), 0, 1, "false", NULL},
    {"controller.retire_solved_epochs", PRL_KEY_INT, F(retire_solved_epochs), 0, 63, "0", NULL},
    {"controller.retire_unsolved_epochs", PRL_KEY_INT, F(retire_unsolved_epochs), 0, 63, "0", NULL},
    {"controller.lease_seconds", PRL_KEY_REAL, F(lease_seconds), 0.1, 86400, "60", NULL},
    {"controller.heartbeat_seconds", PRL_KEY_REAL, F(heartbeat_seconds), 0.01, 3600, "2", NULL},
    {"controller.max_rejected", PRL_KEY_INT, F(max_rejected), 1, 1e9, "10", NULL},
    {"checkpoint.every", PRL_KEY_INT, F(checkpoint_every), 0, 1e9, "10", NULL},
    {"opd.enabled", PRL_KEY_BOOL, F(opd_enabled), 0, 1, "false", NULL},
    {"opd.teachers.agent", PRL_KEY_STR, F(opd_teachers[0]), 0, 0, "\"\"", NULL},
    {"opd.teachers.coding", PRL_KEY_STR, F(opd_teachers[1]), 0, 0, "\"\"", NULL},
    {"opd.teachers.general", PRL_KEY_STR, F(opd_teachers[2]), 0, 0, "\"\"", NULL},
    {"opd.teachers.reasoning", PRL_KEY_STR, F(opd_teachers[3]), 0, 0, "\"\"", NULL},
    {"opd.coef", PRL_KEY_REAL, F(opd_coef), 0, 1e3, "1.0", NULL},
    {"opd.teacher_coef.agent", PRL_KEY_REAL, F(opd_teacher_coef[0]), 0, 1e3, "1.0", NULL},
    {"opd.teacher_coef.coding", PRL_KEY_REAL, F(opd_teacher_coef[1]), 0, 1e3, "1.0", NULL},
    {"opd.teacher_coef.general", PRL_KEY_REAL, F(opd_teacher_coef[2]), 0, 1e3, "1.0", NULL},
    {"opd.teacher_coef.reasoning", PRL_KEY_REAL, F(opd_teacher_coef[3]), 0, 1e3, "1.0", NULL},
    {"opd.discount", PRL_KEY_REAL, F(opd_discount), 0, 0.999999, "0", NULL},
    {"opd.adv_clip", PRL_KEY_BOOL, F(opd_adv_clip), 0, 1, "false", NULL},
    {"opd.adv_clip_low", PRL_KEY_REAL, F(opd_adv_clip_low), -1e6, 0, "-5.0", NULL},
    {"opd.adv_clip_high", PRL_KEY_REAL, F(opd_adv_clip_high), 0, 1e6, "5.0", NULL},
    {"opd.adv_mask_eps", PRL_KEY_REAL, F(opd_adv_mask_eps), 0, 1e6, "0", NULL},
    {"opd.task_weight", PRL_KEY_REAL, F(opd_task_weight), 0, 1e3, "0", NULL},
    {"opd.topk", PRL_KEY_INT, F(opd_topk), 0, 64, "0", NULL},
    {"opd.topk_coef", PRL_KEY_REAL, F(opd_topk_coef), 0, 1e3, "1.0", NULL},
    {"opd.revisit", PRL_KEY_REAL, F(opd_revisit), 0, 0.9, "0", NULL},
    {"opd.revisit_power", PRL_KEY_REAL, F(opd_revisit_power), 0, 8, "1.0", NULL},
    {"teacher.workers", PRL_KEY_INT, F(teacher_workers), 1, 16, "1", NULL},
    {"teacher.threads", PRL_KEY_INT, F(teacher_threads), 0, 256, "0", NULL},
};
static prl_status check(const void *c, const char *source)
{
    return prl_job_config_check(c, source);
}
static const prl_key_table table = {keys, sizeof keys / sizeof keys[0], sizeof(prl_job_config),
                                    check};

prl_status prl_job_config_default(prl_job_config *c) { return prl_keys_default(&table, c); }
void prl_job_config_free(prl_job_config *c) { prl_keys_free(&table, c); }
prl_status prl_job_config_parse(prl_job_config *c, const char *json_text, const char *source)
{
    return prl_keys_parse(&table, c, json_text, source);
}
prl_status prl_job_config_load(prl_job_config *c, const char *path)
{
    return prl_keys_load(&table, c, path);
}
prl_status prl_job_config_set(prl_job_config *c, const char *assignment)
{
    return prl_keys_set(&table, c, assignment);
}
prl_status prl_job_config_set_all(prl_job_config *c, const char *const *assignments, int n)
{
    prl_status rc = PRL_OK;
    for (int i = 0; i < n && !rc; i++) rc = prl_keys_assign(&table, c, assignments[i]);
    return rc ? rc : prl_job_config_check(c, "--set");
}

/* grpo.correction's cross-key rules, on the strings, so that `prl run` refuses a bad job
** before any process starts (the trainer's prl_grpo_corr_config_check applies the same rules
** to the parsed struct, for callers that build it by hand). */
static prl_status check_correction(const prl_job_config *c, const char *source)
{
    int bypass = !strcmp(c->corr_mode, "bypass"),
        token_only = !strcmp(c->corr_kind, "icepop") || !strcmp(c->corr_kind, "kpop");
    if (token_only && !strcmp(c->corr_level, "sequence"))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'grpo.correction.level' = sequence: only "
                             "tis and mis have a sequence level, not %s",
                             source, c->corr_kind);
    if (!bypass && strcmp(c->corr_bypass_loss, "ppo_clip"))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'grpo.correction.bypass_loss' = %s needs "
                             "grpo.correction.mode = bypass",
                             source, c->corr_bypass_loss);
    if (bypass && !strcmp(c->corr_kind, "kpop"))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'grpo.correction.kind' = kpop needs "
                             "grpo.correction.mode = decoupled",
                             source);
    if (bypass && !strcmp(c->corr_bypass_loss, "ppo_clip") && strcmp(c->corr_kind, "none"))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'grpo.correction.kind' = %s with mode = "
                             "bypass needs grpo.correction.bypass_loss = reinforce (the PPO ratio "
                             "already corrects the mismatch)",
                             source, c->corr_kind);
    if (bypass && !strcmp(c->corr_bypass_loss, "reinforce") && !strcmp(c->grpo_algorithm, "gspo"))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'grpo.algorithm' = gspo needs the clipped surrogate: "
                             "grpo.correction.bypass_loss = reinforce has no ratio to take "
                             "at sequence level",
                             source);
    if (bypass && !strcmp(c->corr_denominator, "kept"))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'grpo.correction.denominator' = kept needs "
                             "grpo.correction.mode = decoupled",
                             source);
    if (c->icepop_low > c->icepop_high || c->strict_icepop_low > c->strict_icepop_high)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'grpo.correction.icepop_low' must be <= "
                             "icepop_high (also under strict.)",
                             source);
    if (c->pcc_rule && (c->strict_tis_cap > c->tis_cap || c->strict_mis_cap > c->mis_cap ||
                        c->strict_kpop_phi > c->kpop_phi || c->strict_icepop_low < c->icepop_low ||
                        c->strict_icepop_high > c->icepop_high))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'grpo.correction.strict.*': with "
                             "grpo.correction.pcc_rule the strict setting must be at least as "
                             "strict as the loose one (caps and kpop_phi not larger, "
                             "[icepop_low, icepop_high] inside)",
                             source);
    return PRL_OK;
}

/* trainer.loss_scale: a set constant must be one the scaler accepts (0 = the preset's); the
** rules that need the preset's values (min_scale <= the initial scale) are the scaler's own
** (prl_grpo_precision_from_job, which `prl run` calls before starting any process). */
static prl_status check_loss_scale(const prl_job_config *c, const char *source)
{
    if (c->ls_growth_factor != 0 && c->ls_growth_factor < 1)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'trainer.loss_scale.growth_factor' = %g "
                             "must be >= 1 (or 0: the preset's)",
                             source, c->ls_growth_factor);
    return PRL_OK;
}

/* task.mix: a share per domain of a mixed prompt set; a single-domain job keeps the defaults
** (a share there would be silently ignored), and a mixed set needs at least one prompt. */
static prl_status check_mix(const prl_job_config *c, const char *source)
{
    int mixed = !strcmp(c->domain, "mixed");
    long total = 0;
    for (int k = 0; k < PRL_TASK_N_DOMAINS; k++) {
        if (!mixed && c->mix[k] != 1.0)
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: key 'task.mix.%s' = %g applies only to "
                                 "task.domain = mixed (this job's is %s)",
                                 source, prl_tasks_domain_name((prl_task_domain)k), c->mix[k],
                                 c->domain);
        total += prl_job_mix_problems(c, (prl_task_domain)k);
    }
    if (mixed && total == 0)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'task.mix.*': task.train_problems = %d times "
                             "every domain's share rounds to 0 problems",
                             source, c->train_problems);
    return PRL_OK;
}

int prl_job_mix_problems(const prl_job_config *c, prl_task_domain d)
{
    if (strcmp(c->domain, "mixed"))
        return strcmp(c->domain, prl_tasks_domain_name(d)) ? 0 : c->train_problems;
    return (int)lround(c->train_problems * c->mix[d]);
}

/* opd.enabled: every domain the prompts cover has its teacher (the files are checked by
** prl_opd_check_teachers before any process starts); a domain whose task.mix share is 0
** has no prompts and needs none. */
static prl_status check_opd(const prl_job_config *c, const char *source)
{
    static const char *const domains[4] = {"agent", "coding", "general", "reasoning"};
    if (c->opd_revisit > 0 && !c->opd_enabled)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'opd.revisit' = %g needs opd.enabled (it "
                             "draws prompts by their teacher KL)",
                             source, c->opd_revisit);
    if (c->opd_revisit > 0 && strcmp(c->mode, "sync"))
        return prl_error_set(
            PRL_ERR_CONFIG,
            "%s: key 'opd.revisit' = %g needs controller.mode = "
            "sync (in async mode which teacher KLs a step's draw sees would depend "
            "on timing)",
            source, c->opd_revisit);
    if (!c->opd_enabled) return PRL_OK;
    for (int i = 0; i < 4; i++) {
        prl_task_domain d;
        prl_status rc = prl_tasks_domain_parse(domains[i], &d);
        if (rc) return rc;
        if (prl_job_mix_problems(c, d) > 0 && !*c->opd_teachers[i])
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: key 'opd.teachers.%s' is empty: opd.enabled "
                                 "needs a teacher checkpoint for every domain of task.domain = %s",
                                 source, domains[i], c->domain);
    }
    return PRL_OK;
}

/* reward.model / reward.judge mix into the verifiers' score: a reward program replaces the
** verifiers (mix there), and the weights must leave the rule its share. */
static prl_status check_learned(const prl_job_config *c, const char *source)
{
    int rm = *c->reward_model, judge = *c->reward_judge;
    if ((rm || judge) && prl_job_has_reward_program(c))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key '%s' mixes into the verifiers' score, which reward.program "
                             "replaces (score with the model inside the program instead)",
                             source, rm ? "reward.model" : "reward.judge");
    double w = (rm ? c->reward_model_weight : 0) + (judge ? c->reward_judge_weight : 0);
    if (w > 1 + 1e-12)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: keys 'reward.model_weight' + 'reward.judge_weight' = %g must be "
                             "<= 1 (the rest is the rule score's)",
                             source, w);
    if (*c->reward_judge_template && !judge)
        return prl_error_set(PRL_ERR_CONFIG, "%s: key 'reward.judge_template' needs reward.judge",
                             source);
    return PRL_OK;
}

/* task.source = file reads task.path; the generator's keys would be silently ignored. */
static prl_status check_source(const prl_job_config *c, const char *source)
{
    int file = !strcmp(c->task_source, "file");
    if (file && !*c->task_path)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'task.path' is empty: task.source = file needs a JSONL "
                             "prompt file or a directory of shards",
                             source);
    if (!file && *c->task_path)
        return prl_error_set(PRL_ERR_CONFIG, "%s: key 'task.path' = %s needs task.source = file",
                             source, c->task_path);
    if (file && c->opd_enabled)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'opd.enabled' needs task.source = generate (a teacher per "
                             "built-in domain)",
                             source);
    if (c->reward_network && !prl_job_has_reward_program(c))
        return prl_error_set(PRL_ERR_CONFIG, "%s: key 'reward.network' needs reward.program",
                             source);
    return check_learned(c, source);
}

/* The value as it can be shown in one error line: printable ASCII kept, the rest as \xNN,
** cut after 40 characters. */
static void printable(const char *s, char *out, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; s[i] && k + 8 < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (i == 40) {
            k += (size_t)snprintf(out + k, n - k, "...");
            break;
        }
        k += (size_t)snprintf(out + k, n - k, ch >= 0x20 && ch < 0x7f ? "%c" : "\\x%02x", ch);
    }
    out[k < n ? k : n - 1] = 0;
}

prl_status prl_job_name_check(const char *source, const char *key, const char *name)
{
    static const char rule[] = "a name is 1 to 100 of A-Z a-z 0-9 . _ - and does not start with "
                               "'.' (it names a directory)";
    char shown[200];
    printable(name, shown, sizeof shown);
    size_t n = strlen(name);
    if (n == 0 || n > PRL_JOB_NAME_MAX)
        return prl_error_set(PRL_ERR_CONFIG, "%s: key '%s' = \"%s\" has %zu characters: %s", source,
                             key, shown, n, rule);
    if (name[0] == '.')
        return prl_error_set(PRL_ERR_CONFIG, "%s: key '%s' = \"%s\" starts with '.': %s", source,
                             key, shown, rule);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
            ch == '.' || ch == '_' || ch == '-')
            continue;
        char what[16];
        snprintf(what, sizeof what, ch >= 0x20 && ch < 0x7f ? "'%c'" : "byte 0x%02x", ch);
        return prl_error_set(PRL_ERR_CONFIG, "%s: key '%s' = \"%s\": character %zu is %s: %s",
                             source, key, shown, i + 1, what, rule);
    }
    return PRL_OK;
}

/* gateway.bind is HOST:PORT on loopback (127.0.0.1, localhost, [::1]) unless
** gateway.allow_remote; port 0 lets the system choose one. */
static prl_status check_gateway(const prl_job_config *c, const char *source)
{
    const char *b = c->gateway_bind, *colon = strrchr(b, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon == b || !colon[1] || *end || port < 0 || port > 65535)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'gateway.bind' = %s must be HOST:PORT (port 0..65535)",
                             source, b);
    size_t hl = (size_t)(colon - b);
    int loop = (hl == 9 && !strncmp(b, "127.0.0.1", hl)) ||
               (hl == 9 && !strncmp(b, "localhost", hl)) || (hl == 5 && !strncmp(b, "[::1]", hl));
    if (!loop && !c->gateway_allow_remote)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'gateway.bind' = %s is not a loopback address: set "
                             "gateway.allow_remote = true to serve other hosts",
                             source, b);
    return PRL_OK;
}

/* bus.bind: a tcp:// endpoint the controller listens on besides its ipc:// socket; off
** loopback only with bus.allow_remote, and then with CURVE keys (bus.keys). Without it every
** worker is a child of `prl run`, so none of the pools may be empty. */
static prl_status check_bus(const prl_job_config *c, const char *source)
{
    const char *b = c->bus_bind;
    if (!*b) {
        if (c->rollout_workers == 0 && !strcmp(c->rollout_source, "engine"))
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: key 'rollout.workers' = 0 needs bus.bind (workers that join "
                                 "from other hosts)",
                                 source);
        if (c->reward_workers == 0)
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: key 'reward.workers' = 0 needs bus.bind (workers that join "
                                 "from other hosts)",
                                 source);
        return PRL_OK;
    }
    if (strncmp(b, "tcp://", 6))
        return prl_error_set(PRL_ERR_CONFIG, "%s: key 'bus.bind' = %s must be tcp://HOST:PORT",
                             source, b);
    if (prl_bus_endpoint_check(b, c->bus_allow_remote)) {
        char why[600]; /* the message is rewritten below: copy it first */
        snprintf(why, sizeof why, "%s", prl_error_message());
        return prl_error_set(PRL_ERR_CONFIG, "%s: key 'bus.bind' = %s: %s", source, b,
                             c->bus_allow_remote ? why
                                                 : "not loopback: set bus.allow_remote = true");
    }
    if (!prl_bus_endpoint_local(b) && !*c->bus_keys)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'bus.bind' = %s is off loopback: set bus.keys to the "
                             "controller's CURVE keypair directory (prl keys generate --out DIR)",
                             source, b);
    return PRL_OK;
}

int prl_job_has_reward_program(const prl_job_config *c)
{
    return c->reward_program && strcmp(c->reward_program, "[]") != 0;
}

/* trainer.hosts is mpirun's --host list: NAME[:SLOTS] entries joined by commas (a NAME
** without SLOTS is one slot, as for mpirun). It needs ranks to place, and slots for all of
** them, so that the ranks land where the list says rather than where --oversubscribe puts
** the extra ones. The local checks (rank 0's host is this one) are the launcher's. */
static prl_status check_trainer_hosts(const prl_job_config *c, const char *source)
{
    const char *h = c->trainer_hosts;
    if (*h && *c->trainer_hostfile)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: keys 'trainer.hosts' and 'trainer.hostfile' both place the "
                             "trainer ranks: give one",
                             source);
    if ((*h || *c->trainer_hostfile) && c->trainer_ranks < 2)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'trainer.%s' places trainer ranks: it needs trainer.ranks "
                             "> 1 (it is %d)",
                             source, *h ? "hosts" : "hostfile", c->trainer_ranks);
    long slots = 0;
    for (const char *e = h; *h && *e;) {
        size_t n = strcspn(e, ",:");
        size_t ok = strspn(e, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-_");
        if (n == 0 || ok < n)
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: key 'trainer.hosts' = %s: '%.*s' is not a host name "
                                 "(want NAME[:SLOTS],NAME[:SLOTS],... as for mpirun --host)",
                                 source, h, (int)(n ? n : 1), e);
        long k = 1;
        e += n;
        if (*e == ':') {
            char *end;
            k = strtol(e + 1, &end, 10);
            if (end == e + 1 || (*end && *end != ',') || k < 1 || k > 4096)
                return prl_error_set(PRL_ERR_CONFIG,
                                     "%s: key 'trainer.hosts' = %s: the slots after '%.*s' must "
                                     "be a count 1 ... 4096",
                                     source, h, (int)(e - h), h);
            e = end;
        }
        slots += k;
        if (*e == ',' && !*++e)
            return prl_error_set(PRL_ERR_CONFIG, "%s: key 'trainer.hosts' = %s ends with ','",
                                 source, h);
    }
    if (*h && slots < c->trainer_ranks)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'trainer.hosts' = %s gives %ld slots for trainer.ranks = %d",
                             source, h, slots, c->trainer_ranks);
    return PRL_OK;
}

prl_status prl_job_config_check(const prl_job_config *c, const char *source)
{
    prl_status rc = prl_job_name_check(source, "run.name", c->name);
    if (!rc) rc = check_source(c, source);
    if (!rc) rc = check_correction(c, source);
    if (!rc) rc = check_loss_scale(c, source);
    if (!rc) rc = check_mix(c, source);
    if (!rc) rc = check_opd(c, source);
    if (!rc) rc = check_gateway(c, source);
    if (!rc) rc = check_bus(c, source);
    if (!rc) rc = check_trainer_hosts(c, source);
    if (rc) return rc;
    if ((long)c->batch_prompts * c->group_size <= 0)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: rollout.batch_prompts x rollout.group_size = %d x %d "
                             "must be > 0",
                             source, c->batch_prompts, c->group_size);
    if (c->clip_c != 0 && c->clip_c <= 1)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'grpo.clip_c' = %g must be > 1 (or 0 to "
                             "disable the dual clip)",
                             source, c->clip_c);
    if (!strcmp(c->loss_agg, "seq-mean-token-sum-norm") && !(c->loss_scale_factor > 0))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'grpo.loss_scale_factor' must be > 0 with "
                             "grpo.loss_agg = seq-mean-token-sum-norm",
                             source);
    if (c->minibatches > c->batch_prompts * c->group_size)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'grpo.minibatches' = %d exceeds the %d "
                             "samples of a step",
                             source, c->minibatches, c->batch_prompts * c->group_size);
    if (!strcmp(c->lr_schedule, "cosine") && c->decay_steps <= c->warmup)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'optim.decay_steps' = %d must exceed "
                             "optim.warmup = %d with the cosine schedule",
                             source, c->decay_steps, c->warmup);
    if (c->heartbeat_seconds >= c->lease_seconds)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: key 'controller.heartbeat_seconds' = %g must be "
                             "below controller.lease_seconds = %g",
                             source, c->heartbeat_seconds, c->lease_seconds);
    return PRL_OK;
}

char *prl_job_config_to_json(const prl_job_config *c) { return prl_keys_to_json(&table, c); }

void prl_job_ckpt_dir(const char *run_dir, int64_t version, char *out, size_t n)
{
    snprintf(out, n, "%s/ckpt/v%06lld", run_dir, (long long)version);
}

/* ---------------------------------------------------------------- resuming -------- */

/* Keys a newer prl added since the run was recorded are absent from its config; at their
** defaults they do what the older prl did (every new key's default keeps the old behaviour),
** so they are dropped from `now` before the two configs are compared. A new key set to
** anything else still makes the configs differ. */
static void drop_added_defaults_in(json_t *then, json_t *now, json_t *def)
{
    const char *k;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(now, tmp, k, v)
    {
        json_t *t = json_object_get(then, k), *d = json_object_get(def, k);
        if (!t && d && json_equal(v, d)) json_object_del(now, k);
        else if (json_is_object(t) && json_is_object(v) && json_is_object(d))
            drop_added_defaults_in(t, v, d);
    }
}

static void drop_added_defaults(json_t *then, json_t *now)
{
    prl_job_config d;
    char *text = prl_job_config_default(&d) ? NULL : prl_job_config_to_json(&d);
    json_error_t je;
    json_t *def = text ? json_loads(text, 0, &je) : NULL;
    if (def) drop_added_defaults_in(then, now, def);
    json_decref(def), free(text);
    prl_job_config_free(&d);
}

prl_status prl_job_config_same_run(const char *then_json, const char *now_json, const char *name,
                                   const char *where)
{
    /* a resumed run continues the recorded config; only the step count may grow, and the
    ** thread and rank counts, where the ranks run and the bound on rejected results may change
    ** (results do not depend on them: a run that failed at the bound can be resumed with a higher one) */
    json_error_t je;
    json_t *a = json_loads(then_json, 0, &je), *b = json_loads(now_json, 0, &je);
    static const char *free_keys[][2] = {
        {"controller", "steps"}, {"controller", "max_rejected"}, {"rollout", "threads"},
        {"trainer", "threads"},  {"trainer", "ranks"},           {"trainer", "launcher"},
        {"trainer", "hosts"},    {"trainer", "hostfile"},        {"teacher", "threads"}};
    for (size_t i = 0; i < sizeof free_keys / sizeof free_keys[0]; i++) {
        json_t *ca = json_object_get(a, free_keys[i][0]), *cb = json_object_get(b, free_keys[i][0]);
        json_object_del(ca, free_keys[i][1]), json_object_del(cb, free_keys[i][1]);
        if (ca && !json_object_size(ca)) json_object_del(a, free_keys[i][0]);
        if (cb && !json_object_size(cb)) json_object_del(b, free_keys[i][0]);
    }
    if (a && b) drop_added_defaults(a, b);
    int same = a && b && json_equal(a, b);
    json_decref(a), json_decref(b);
    if (!same)
        return prl_error_set(
            PRL_ERR_CONFIG,
            "run '%s' in %s was started with another config "
            "(only controller.steps, controller.max_rejected, the thread counts and "
            "trainer.ranks / trainer.launcher / trainer.hosts / trainer.hostfile may change "
            "on --resume)",
            name, where);
    return PRL_OK;
}
