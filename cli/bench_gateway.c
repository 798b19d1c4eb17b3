/*
** bench_gateway.c — `prl bench gateway`: the gateway under load (docs/bench-parts.md "Gateway").
**
** It starts a gateway alone on --ckpt as a child process (`prl role gateway --model CKPT
** --bind 127.0.0.1:0`), then --clients threads each keep one HTTP/1.1 connection and send
** chat completions back to back for --seconds (max_tokens --max-tokens, temperature 1, a
** seed per request so the answers differ). Printed: requests answered, errors, the p50 and
** p99 latency of a request, completion tokens per second and requests per second over the
** window (a request counts when its answer arrived within it), then the gateway's own
** counters from /health. Nothing is recorded (a gateway alone serves no run).
*/
#include "cli/bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct client {
    int port, index, max_tokens;
    double t_end;
    double *lat; /* latencies of its answered requests */
    int n_lat, cap;
    long tokens, errors;
    pthread_t th;
} client;

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a)) close(fd), fd = -1;
    return fd;
}

/* One request on fd: its status and body (owned) or -1 when the connection failed. */
static int exchange(int fd, const char *method, const char *path, const char *body, char **reply)
{
    char head[256];
    size_t bl = body ? strlen(body) : 0;
    int hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      method, path, bl);
    if (send(fd, head, (size_t)hl, MSG_NOSIGNAL) != hl ||
        (bl && send(fd, body, bl, MSG_NOSIGNAL) != (ssize_t)bl))
        return -1;
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    char *end = NULL;
    long want = -1;
    while (buf) {
        if (n + 1 >= cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) break;
            buf = b;
        }
        ssize_t got = recv(fd, buf + n, cap - n - 1, 0);
        if (got <= 0) break;
        n += (size_t)got;
        buf[n] = 0;
        if (!end && (end = strstr(buf, "\r\n\r\n"))) {
            const char *cl = strcasestr(buf, "Content-Length:");
            want = cl && cl < end ? strtol(cl + 15, NULL, 10) : -1;
        }
        if (end && want >= 0 && n >= (size_t)(end + 4 - buf) + (size_t)want) {
            int status = atoi(buf + 9);
            *reply = strdup(end + 4);
            free(buf);
            return *reply ? status : -1;
        }
    }
    free(buf);
    return -1;
}

static void *client_main(void *arg)
{
    client *c = arg;
    int fd = -1;
    for (long k = 0; now_s() < c->t_end; k++) {
        if (fd < 0 && (fd = connect_to(c->port)) < 0) {
            c->errors++;
            usleep(10000);
            continue;
        }
        char body[512];
        snprintf(body, sizeof body,
                 "{\"model\": \"prl\", \"messages\": [{\"role\": \"user\", \"content\": \"What is "
                 "%d + %ld?\"}], \"max_tokens\": %d, \"temperature\": 1, \"seed\": %ld}",
                 c->index, k, c->max_tokens, (long)c->index * 1000003L + k);
        double t0 = now_s();
        char *reply = NULL;
        int status = exchange(fd, "POST", "/v1/chat/completions", body, &reply);
        double t1 = now_s();
        const char *u = reply ? strstr(reply, "\"completion_tokens\":") : NULL;
        if (status != 200 || !u) {
            c->errors += t1 < c->t_end;
            close(fd), fd = -1;
        } else if (t1 <= c->t_end) {
            if (c->n_lat == c->cap) {
                int cap = c->cap ? 2 * c->cap : 256;
                double *l = realloc(c->lat, (size_t)cap * sizeof *l);
                if (l) c->lat = l, c->cap = cap;
            }
            if (c->n_lat < c->cap) c->lat[c->n_lat++] = t1 - t0;
            c->tokens += strtol(u + 20, NULL, 10);
        }
        free(reply);
    }
    if (fd >= 0) close(fd);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The gateway alone on ckpt as a child; its port from the address file. */
static pid_t start_gateway(const char *ckpt, const char *addr_file, int threads, int max_batch,
                           int *port)
{
    char th[16], mb[16];
    snprintf(th, sizeof th, "%d", threads);
    snprintf(mb, sizeof mb, "%d", max_batch);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", "prl", "role", "gateway", "--model", ckpt, "--bind", "127.0.0.1:0",
              "--addr-file", addr_file, "--threads", th, "--max-batch", mb, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; pid > 0 && i < 600; i++) {
        FILE *f = fopen(addr_file, "r");
        unsigned p = 0;
        int ok = f && fscanf(f, "http://127.0.0.1:%u", &p) == 1;
        if (f) fclose(f);
        if (ok) {
            *port = (int)p;
            return pid;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid) return -1;
        usleep(100000);
    }
    if (pid > 0) kill(pid, SIGKILL), waitpid(pid, NULL, 0);
    return -1;
}

int cmd_bench_gateway(int argc, char **argv)
{
    const char *ckpt = NULL;
    int clients = 64, max_tokens = 32, threads = 0, max_batch = 64, json = 0;
    double seconds = 60;
    cli_opt opts[] = {
        {"ckpt", OPT_STR, &ckpt, "DIR", "the checkpoint to serve (with tokenizer.json)", 1, 0},
        {"clients", OPT_INT, &clients, "N", "concurrent clients, one connection each (64)", 0, 0},
        {"seconds", OPT_DOUBLE, &seconds, "S", "how long the clients send (60)", 0, 0},
        {"max-tokens", OPT_INT, &max_tokens, "N", "max_tokens of each request (32)", 0, 0},
        {"max-batch", OPT_INT, &max_batch, "N", "the gateway's sequences decoded at once (64)", 0,
         0},
        {"threads", OPT_INT, &threads, "N", "the gateway's threads (default all CPUs)", 0, 0},
        {"json", OPT_FLAG, &json, NULL, "one JSON object", 0, 0},
        {0}};
    int rc = cli_parse(argc, argv, 3, opts,
                       "prl bench gateway --ckpt DIR [--clients 64] [--seconds 60] "
                       "[--max-tokens 32] [--max-batch 64] [--threads N] [--json]",
                       "The gateway under load: concurrent clients sending chat completions; "
                       "p50/p99 latency and tokens/s (docs/bench.md).",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (clients < 1 || clients > 500 || !(seconds > 0) || max_tokens < 1 || max_batch < 1)
        return cli_failf("bench gateway", 2,
                         "--clients must be in 1..500, --seconds, --max-tokens, --max-batch > 0");
    const char *dir = bench_tmpdir("gw");
    if (!dir) return cli_fail("bench gateway");
    char addr[600];
    snprintf(addr, sizeof addr, "%s/addr", dir);
    int port = 0;
    pid_t gw = start_gateway(ckpt, addr, threads, max_batch, &port);
    if (gw < 0) return cli_failf("bench gateway", 1, "the gateway on %s did not start", ckpt);
    client *cs = calloc((size_t)clients, sizeof *cs);
    double t0 = now_s();
    for (int i = 0; cs && i < clients; i++) {
        cs[i] = (client){.port = port, .index = i, .max_tokens = max_tokens, .t_end = t0 + seconds};
        pthread_create(&cs[i].th, NULL, client_main, &cs[i]);
    }
    long tokens = 0, errors = 0, n = 0;
    for (int i = 0; cs && i < clients; i++) {
        pthread_join(cs[i].th, NULL);
        tokens += cs[i].tokens, errors += cs[i].errors, n += cs[i].n_lat;
    }
    double wall = seconds;
    double *lat = malloc((size_t)(n ? n : 1) * sizeof *lat);
    long k = 0;
    for (int i = 0; cs && lat && i < clients; i++)
        for (int j = 0; j < cs[i].n_lat; j++) lat[k++] = cs[i].lat[j];
    if (lat) qsort(lat, (size_t)n, sizeof *lat, cmp_double);
    double p50 = n && lat ? lat[n / 2] : 0, p99 = n && lat ? lat[(n * 99) / 100] : 0;
    int hfd = connect_to(port);
    char *health = NULL;
    if (hfd >= 0) exchange(hfd, "GET", "/health", NULL, &health), close(hfd);
    kill(gw, SIGTERM);
    waitpid(gw, NULL, 0);
    if (json)
        printf("{\"clients\": %d, \"seconds\": %.1f, \"max_tokens\": %d, \"requests\": %ld, "
               "\"errors\": %ld, \"p50_ms\": %.1f, \"p99_ms\": %.1f, \"tokens_per_s\": %.1f, "
               "\"requests_per_s\": %.2f, \"health\": %s}\n",
               clients, wall, max_tokens, n, errors, 1e3 * p50, 1e3 * p99, tokens / wall, n / wall,
               health ? health : "null");
    else
        printf("gateway %s: %d clients x %.1f s, max_tokens %d: %ld requests, %ld errors\n"
               "latency p50 %.1f ms  p99 %.1f ms | %.1f tokens/s  %.2f requests/s\n"
               "gateway: %s\n",
               ckpt, clients, wall, max_tokens, n, errors, 1e3 * p50, 1e3 * p99, tokens / wall,
               n / wall, health ? health : "(no /health answer)");
    for (int i = 0; cs && i < clients; i++) free(cs[i].lat);
    free(cs), free(lat), free(health);
    return n > 0 && errors == 0 ? 0 : 1;
}
