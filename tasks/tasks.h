/*
** tasks.h — the one public header of tasks/: procedural, seeded task data.
**
** For now this holds the generator of the SFT demo (short arithmetic chats); the four RL
** domains (Reasoning, General, Agent, Coding) with their eval splits arrive with their issue.
*/
#ifndef PRL_TASKS_H
#define PRL_TASKS_H

#include "engine/engine.h"

/* Write n chat examples as JSONL to `out`: one {"messages": [...], "domain": "demo"} per
** line. Example i depends only on (seed, i). */
prl_status prl_tasks_write_demo(FILE *out, int n, uint64_t seed);

#endif /* PRL_TASKS_H */
