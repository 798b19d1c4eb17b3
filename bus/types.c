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
    {"work", "the controller leases one work item to a worker",
     {U("lease"), U("step"), U("prompt"), U("sample"), U("policy_version"), S_OPT("task")},
     {{0}}},
    {"result", "a worker returns the result of a leased work item",
     {U("lease"), U("step"), U("prompt"), U("sample"), U("policy_version")},
     {{"tokens", PRL_BUS_I32}, {"logprobs", PRL_BUS_F32}}},
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
