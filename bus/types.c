/*
** types.c — the message type registry: every message type, its header fields and the frames
** it must carry. A new message type is one row here (and a section of docs/protocol.md);
** the codec, the encoder's checks and the tests all read this table.
*/
#include "bus/bus.h"

#include <string.h>

#define U(n) {n, PRL_BUS_FIELD_UINT, 1}
#define U_OPT(n) {n, PRL_BUS_FIELD_UINT, 0}
#define S(n) {n, PRL_BUS_FIELD_STR, 1}
#define S_OPT(n) {n, PRL_BUS_FIELD_STR, 0}
#define H(n) {n, PRL_BUS_FIELD_HEX64, 1}

static const prl_bus_type_spec registry[] = {
    {"hello", "a worker announces itself to the controller",
     {S("role"), S("worker"), U_OPT("pid")}, {{0}}},
    {"heartbeat", "a worker is alive (and still holds `lease`, if given)",
     {S("worker"), U_OPT("lease")}, {{0}}},
    {"welcome", "the controller answers a hello: the run directory and the job config",
     {S("run_dir"), U("seed")}, {{"config", PRL_BUS_BYTES}}},
    {"work", "the controller leases one work item to a worker (rollout: `count` samples of "
             "one prompt from index `sample`, at the checkpoint `path`)",
     {U("lease"), U("step"), U("prompt"), U("sample"), U("policy_version"), S_OPT("task"),
      U_OPT("count"), S_OPT("path")},
     {{0}}},
    {"result", "a worker returns the result of a leased work item (rollout: one sample)",
     {U("lease"), U("step"), U("prompt"), U("sample"), U("policy_version"), U_OPT("prompt_len"),
      U_OPT("gen_us"), U_OPT("stop")},
     {{"tokens", PRL_BUS_I32}, {"logprobs", PRL_BUS_F32}}},
    {"score", "the controller leases the scoring of one sample to a reward worker",
     {U("lease"), U("step"), U("prompt"), U("sample"), U_OPT("truncated")},
     {{"task", PRL_BUS_BYTES}, {"turns", PRL_BUS_BYTES}}},
    {"scored", "a reward worker returns a sample's reward and breakdown (JSON)",
     {U("lease"), U("step"), U("prompt"), U("sample"), U("score_us")},
     {{"detail", PRL_BUS_BYTES}}},
    {"train", "the controller hands the trainer one step's samples, packed",
     {U("lease"), U("step"), U("policy_version"), S("path"), U("count"), U_OPT("route_moe"),
      U_OPT("route_k"), U_OPT("route_width")},
     {{"tokens", PRL_BUS_I32}, {"offsets", PRL_BUS_I32}, {"prompt_lens", PRL_BUS_I32},
      {"rewards", PRL_BUS_F32}}},
    {"trained", "the trainer committed version `version` (step `step`'s update) at `path`",
     {U("lease"), U("step"), U("version"), S("path"), H("ckpt_checksum"), U("train_us")},
     {{"metrics", PRL_BUS_BYTES}}},
    {"teach", "the controller leases one teacher's samples of a step to a teacher process "
              "(OPD: log-probs of the student's tokens with the expert at `path`)",
     {U("lease"), U("step"), S("teacher"), S("path"), U("count")},
     {{"tokens", PRL_BUS_I32}, {"offsets", PRL_BUS_I32}, {"prompt_lens", PRL_BUS_I32},
      {"mask", PRL_BUS_U8}}},
    {"taught", "a teacher returns the expert's log-probs of a `teach` item's response tokens",
     {U("lease"), U("step"), S("teacher"), U("load_us"), U("teach_us"), U("peak_rss_kb"),
      U("loaded")},
     {{"logprobs", PRL_BUS_F32}}},
    {"exec", "run one program in the sandbox service (reply: exec_result with ref = id)",
     {S("lang"), U("wall_ms")}, {{"program", PRL_BUS_BYTES}, {"stdin", PRL_BUS_BYTES}}},
    {"exec_result", "the outcome of exec `ref`: status, exit code, outputs",
     {U("ref"), S("status"), U("exit_code"), U("wall_us")},
     {{"stdout", PRL_BUS_BYTES}, {"stderr", PRL_BUS_BYTES}}},
    {"weights", "the trainer announces a committed checkpoint",
     {U("version"), H("ckpt_checksum"), S("path")}, {{0}}},
    {"ack", "the receiver accepted message `ref` (and lease `lease`, if given)",
     {U("ref"), U_OPT("lease")}, {{0}}},
    {"error", "the sender refuses or failed message `ref`, with a reason",
     {S("reason"), U_OPT("ref"), U_OPT("lease")}, {{0}}},
    {"stop", "the receiver should finish its current item and exit",
     {S_OPT("reason")}, {{0}}},
};

const prl_bus_type_spec *prl_bus_type_find(const char *type)
{
    if (!type) return NULL;
    for (size_t i = 0; i < sizeof registry / sizeof registry[0]; i++)
        if (strcmp(registry[i].type, type) == 0) return &registry[i];
    return NULL;
}

int prl_bus_type_count(void) { return (int)(sizeof registry / sizeof registry[0]); }

const prl_bus_type_spec *prl_bus_type_at(int i)
{
    if (i < 0 || i >= prl_bus_type_count()) return NULL;
    return &registry[i];
}
