/*
** fuzz_bus.c — the bus decoder (prl_bus_decode with every registered message type). Input:
** frames, each a 2-byte little-endian length then its bytes (a short tail is the last
** frame). A decoded message is encoded again and must decode to the same type.
*/
#include "bus/bus.h"
#include "roles/msg/msg.h"
#include "tests/fuzz/fuzz.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    prl_bus_part parts[PRL_BUS_MAX_PARTS + 4];
    int n = 0;
    while (size > 0 && n < (int)(sizeof parts / sizeof *parts)) {
        size_t len = size >= 2 ? (size_t)(data[0] | data[1] << 8) : 0;
        size_t skip = size >= 2 ? 2 : size;
        data += skip, size -= skip;
        if (len > size) len = size;
        parts[n].data = data, parts[n].len = len, n++;
        data += len, size -= len;
    }
    prl_bus_msg m;
    char reason[256];
    if (prl_bus_decode(prl_msg_registry(), parts, n, &m, reason, sizeof reason) != PRL_OK) return 0;
    prl_bus_wire w;
    if (prl_bus_encode(&m, &w) == PRL_OK) {
        prl_bus_msg again;
        if (prl_bus_decode(prl_msg_registry(), w.parts, w.n, &again, reason, sizeof reason) !=
                PRL_OK ||
            strcmp(again.type, m.type) != 0)
            abort(); /* what the encoder writes the decoder must take back */
        prl_bus_msg_free(&again);
        prl_bus_wire_free(&w);
    }
    prl_bus_msg_free(&m);
    return 0;
}
