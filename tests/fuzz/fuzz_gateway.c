/*
** fuzz_gateway.c — the gateway's request parser (roles/gateway/request.c): a chat completion,
** a completion, a posted reward or a group claim, chosen by the input's first byte; the rest
** is the HTTP body. A refusal must carry an OpenAI-shaped error (a 4xx status, a message).
*/
#include "roles/gateway/internal.h"
#include "tests/fuzz/fuzz.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    gw_error e = {0};
    double x;
    int st = 0;
    switch (data[0] % 4) {
    case 0:
    case 1: {
        gw_request r;
        st = gw_request_parse(body, len, data[0] % 2 ? GW_COMPLETION : GW_CHAT,
                              data[0] & 4 ? "ep-1" : NULL, &r, &e);
        if (!st) gw_request_free(&r);
        break;
    }
    case 2: st = gw_reward_parse(body, len, &x, &e); break;
    default: st = gw_claim_parse(body, len, &x, &e);
    }
    if (st && (st < 400 || st > 499 || !e.message[0])) abort(); /* a refusal is a 4xx, said */
    return 0;
}
