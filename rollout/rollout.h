/*
** rollout.h — the one public header of rollout/: play tasks with the infer path, turn by turn,
** token-in/token-out, and score the episodes with the verifiers.
**
** An episode's sequence is the chat prompt, then alternately a model turn (sampled tokens, kept
** exactly as sampled, mask 1, with their infer log-probs) and — for the Agent environment and
** the Reasoning python tool — an observation turn `<|tool|> text <|end|> <|assistant|>` (mask 0:
** never trained on). Episodes run in rounds: every active episode generates its next turn in
** one continuous-batched call, so single-turn domains finish in one round. Each round re-prefills
** the episode's whole sequence (with cached_routes, the routes of positions already fed are
** kept from the first pass: Cached R3). The episode is then scored with reward/ (programs through the
** caller's executor, e.g. the sandbox).
**
** Ownership: tasks are borrowed; an episode owns its arrays and texts (prl_episode_free).
*/
#ifndef PRL_ROLLOUT_H
#define PRL_ROLLOUT_H

#include "reward/reward.h"

typedef struct prl_rollout_config {
    prl_sample_params sampling; /* per turn: temperature, top-k/p, seed, max_new_tokens */
    int max_turns;              /* model turns per episode (default 10) */
    int score;                  /* 1 (default): score with the verifiers; 0: leave it to a
                                ** reward worker (result and reward stay zero) */
    int cached_routes;          /* Cached R3 (replay.cached, docs/replay.md): an episode keeps
                                ** the routes of each position from the first pass that fed it;
                                ** 0 (default): the last round's re-prefill routes */
    prl_tasks_mode mode;        /* THINK / NO_THINK: the switch ends each task's last user
                                ** message (docs/tasks.md "Modes"); DEFAULT: the task as it is */
} prl_rollout_config;

/* Greedy, 96 new tokens per turn, 10 turns, scored, the tasks' own mode. */
void prl_rollout_config_default(prl_rollout_config *c);

typedef struct prl_episode {
    int32_t *ids;    /* [n] the whole sequence */
    uint8_t *mask;   /* [n] 1 on sampled tokens */
    float *logprobs; /* [n] infer log-prob of each sampled token, 0 elsewhere */
    int n, cap, prompt_len;
    prl_chat_message *msgs; /* the model's turns and the observations, for the verifier */
    int n_msgs, turns;      /* messages; model turns */
    int truncated;          /* ended by a turn without <|end|> or by the context */
    int stop;               /* prl_stop_reason of the last model turn */
    uint8_t *routes;        /* compact MoE routes (prl_routes_pack): [n_route_tokens][n_moe][K]
                           ** of the last round's pass over the sequence, or with
                           ** cached_routes the first-seen routes of every position */
    size_t routes_bytes;
    int n_route_tokens; /* n - 1 when the last turn ended the episode */
    double gen_seconds; /* wall time of the rounds this episode took part in */
    prl_reward_result result;
    double reward; /* result.score */
} prl_episode;

void prl_episode_free(prl_episode *ep);

/* Play and score tasks[i] (JSONL task objects as prl_tasks_generate makes them) as sequence
** seq_ids[i]; out[i] answers tasks[i]. exec may be NULL when no program runs (General, Agent).
** A task whose prompt does not fit the engine's context is PRL_ERR_RANGE naming it. */
prl_status prl_rollout_run(prl_infer *e, const prl_tokenizer *tok, json_t *const *tasks,
                           const uint64_t *seq_ids, int n, const prl_rollout_config *c,
                           const prl_reward_exec *exec, prl_episode *out);

#endif /* PRL_ROLLOUT_H */
