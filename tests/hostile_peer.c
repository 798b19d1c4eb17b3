/*
** hostile_peer.c — the fault matrix's hostile peer (tests/test_fault_matrix.sh): a process
** that reaches a run's sockets without being one of its roles. It says hello to the
** controller as `trainer-9`, answers the first `train` it is given (if any) with a `trained`
** naming a checkpoint in another folder — or, given none, sends that `trained` for the lease
** and step it names on the command line — and sends `stop` to the sandbox service. Every
** message it gets back is printed, one line each ("controller -> TYPE ..."), for the test to
** judge; it never decides itself whether the run refused it.
**
** usage: hostile_peer CONTROL_EP SANDBOX_EP RUN FOREIGN_CKPT SECONDS
*/
#include "bus/bus.h"
#include "roles/msg/msg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static prl_bus_socket *dealer(const char *endpoint, const char *identity)
{
    prl_bus_socket_options o;
    prl_bus_socket_options_default(&o);
    o.identity = identity, o.name = "hostile", o.registry = prl_msg_registry();
    o.send_timeout_ms = 1000;
    prl_bus_socket *s = NULL;
    if (prl_bus_socket_open(&s, PRL_BUS_DEALER, endpoint, &o)) {
        printf("%s: cannot connect: %s\n", endpoint, prl_error_message());
        return NULL;
    }
    return s;
}

/* Send m (freed) and say so. */
static void send_msg(prl_bus_socket *s, const char *to, prl_bus_msg *m)
{
    prl_status rc = prl_bus_send(s, NULL, m);
    printf("%s <- %s%s%s\n", to, m->type, rc ? ": not sent: " : "", rc ? prl_error_message() : "");
    prl_bus_msg_free(m);
}

/* The fake `trained`: the version after `version`, a checkpoint outside the run. */
static void send_trained(prl_bus_socket *s, const char *run, uint64_t lease, uint64_t step,
                         uint64_t version, const char *foreign)
{
    prl_msg_trained t = {.lease = lease,
                         .step = step,
                         .version = version + 1,
                         .train_us = 1000,
                         .ckpt_checksum = 0x0123456789abcdefULL,
                         .path = foreign,
                         .metrics = "{}"};
    prl_bus_msg m;
    if (prl_msg_trained_encode(&t, run, 2, &m)) {
        printf("cannot encode trained: %s\n", prl_error_message());
        return;
    }
    send_msg(s, "controller", &m);
}

/* Hello as trainer-9, then up to `seconds` of what the controller sends back. */
static void attack_controller(const char *ep, const char *run, const char *foreign, double seconds)
{
    prl_bus_socket *s = dealer(ep, "trainer-9");
    if (!s) return;
    prl_msg_hello h = {.role = "trainer", .worker = "trainer-9", .pid = (uint64_t)getpid()};
    prl_bus_msg m;
    if (prl_msg_hello_encode(&h, run, 1, &m)) {
        printf("cannot encode hello: %s\n", prl_error_message());
        prl_bus_socket_free(s);
        return;
    }
    send_msg(s, "controller", &m);
    int sent_trained = 0;
    for (int waited = 0; waited < (int)(seconds * 10); waited++) {
        int got = 0;
        if (prl_bus_recv(s, 100, &m, NULL, &got) || !got) continue;
        uint64_t lease = 0, step = 0, version = 0;
        if (!strcmp(m.type, "error")) {
            prl_msg_error e;
            printf("controller -> error: %s\n", prl_msg_error_decode(&m, &e) ? "?" : e.reason);
        } else if (!strcmp(m.type, "train")) {
            prl_bus_msg_get_uint(&m, "lease", &lease);
            prl_bus_msg_get_uint(&m, "step", &step);
            prl_bus_msg_get_uint(&m, "policy_version", &version);
            printf("controller -> train: lease %llu, step %llu\n", (unsigned long long)lease,
                   (unsigned long long)step);
        } else {
            printf("controller -> %s\n", m.type);
        }
        int is_train = !strcmp(m.type, "train");
        prl_bus_msg_free(&m);
        if (is_train && !sent_trained) {
            send_trained(s, run, lease, step, version, foreign);
            sent_trained = 1;
        }
    }
    if (!sent_trained) send_trained(s, run, 1, 0, 0, foreign); /* given no lease: a guess */
    int got = 0;                                               /* the answer to it, if any */
    for (int i = 0; i < 10 && !got; i++)
        if (!prl_bus_recv(s, 100, &m, NULL, &got) && got) {
            prl_msg_error e;
            if (!strcmp(m.type, "error"))
                printf("controller -> error: %s\n", prl_msg_error_decode(&m, &e) ? "?" : e.reason);
            else printf("controller -> %s\n", m.type);
            prl_bus_msg_free(&m);
        }
    prl_bus_socket_free(s);
}

/* `stop` to the sandbox service over several fresh connections (each one handshake the
** service must refuse), `seconds` in all. */
static void attack_sandbox(const char *ep, const char *run, double seconds)
{
    enum { TRIES = 5 };
    for (int t = 0; t < TRIES; t++) {
        prl_bus_socket *s = dealer(ep, NULL);
        if (!s) return;
        prl_bus_msg m;
        if (prl_bus_msg_init(&m, prl_msg_spec("stop"), run, 3 + (uint64_t)t) ||
            prl_bus_msg_set_str(&m, "reason", "hostile peer")) {
            printf("cannot build stop: %s\n", prl_error_message());
            prl_bus_socket_free(s);
            return;
        }
        send_msg(s, "sandbox", &m);
        int got = 0; /* anything back */
        if (!prl_bus_recv(s, (int)(seconds * 1000 / TRIES), &m, NULL, &got) && got) {
            printf("sandbox -> %s\n", m.type);
            prl_bus_msg_free(&m);
        }
        prl_bus_socket_free(s);
    }
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: hostile_peer CONTROL_EP SANDBOX_EP RUN FOREIGN_CKPT SECONDS\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    attack_sandbox(argv[2], argv[3], atof(argv[5])); /* first: a short run may end meanwhile */
    attack_controller(argv[1], argv[3], argv[4], atof(argv[5]));
    prl_bus_shutdown();
    return 0;
}
