/*
** rank_hosts.c — where the trainer ranks run (roles.h, docs/scale-out.md "Trainer ranks on
** several hosts"): trainer.hosts becomes mpirun's `--host LIST`, trainer.hostfile its
** `--hostfile FILE`. The job's own checks (job.c) took the list's syntax and slot count;
** here are the checks that need this host: rank 0 talks to the controller over the run's
** ipc:// socket, so the first host (mpirun puts rank 0 there) must be this one.
*/
#include "roles/roles.h"

#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Does address `a` belong to one of this host's interfaces (in this network namespace)? */
static int address_is_mine(const struct sockaddr *a)
{
    struct ifaddrs *all, *i;
    int mine = 0;
    if (getifaddrs(&all)) return 0;
    for (i = all; i && !mine; i = i->ifa_next) {
        const struct sockaddr *b = i->ifa_addr;
        if (!b || b->sa_family != a->sa_family) continue;
        if (a->sa_family == AF_INET)
            mine = ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
                   ((const struct sockaddr_in *)b)->sin_addr.s_addr;
        else if (a->sa_family == AF_INET6)
            mine = !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                           &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr));
    }
    freeifaddrs(all);
    return mine;
}

/* Is `name` this host, as mpirun decides it: localhost, its host name (with or without the
** domain), or a name or address that resolves to an address of one of its interfaces? */
static int host_is_this_one(const char *name)
{
    char me[256] = "";
    gethostname(me, sizeof me - 1);
    size_t short_len = strcspn(me, ".");
    if (!strcmp(name, "localhost") || !strcmp(name, me) ||
        (strlen(name) == short_len && !strncmp(name, me, short_len)))
        return 1;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *r;
    if (getaddrinfo(name, NULL, &hints, &res)) return 0;
    int mine = 0;
    for (r = res; r && !mine; r = r->ai_next) mine = address_is_mine(r->ai_addr);
    freeaddrinfo(res);
    return mine;
}

/* The first host of a hostfile: the first word of its first line that is not blank or a
** comment (mpirun's format: `NAME [slots=N]`). */
static prl_status hostfile_first(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return prl_error_set(PRL_ERR_CONFIG, "trainer.hostfile %s: %s", path, strerror(errno));
    char line[1024];
    out[0] = 0;
    while (!out[0] && fgets(line, sizeof line, f)) {
        char *w = line + strspn(line, " \t");
        size_t n = strcspn(w, " \t\r\n#");
        if (n && *w != '#') snprintf(out, cap, "%.*s", (int)n, w);
    }
    fclose(f);
    if (!out[0]) return prl_error_set(PRL_ERR_CONFIG, "trainer.hostfile %s names no host", path);
    return PRL_OK;
}

prl_status prl_rank_hosts_check(const prl_job_config *job, const char *launcher)
{
    const char *key = *job->trainer_hosts ? "trainer.hosts" : "trainer.hostfile";
    if (!*job->trainer_hosts && !*job->trainer_hostfile) return PRL_OK;
    if (!strcmp(launcher, "srun"))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s is mpirun's placement; under srun SLURM places the ranks on the "
                             "job's allocation (salloc -N / sbatch --nodelist)",
                             key);
    char first[256];
    if (*job->trainer_hosts) {
        snprintf(first, sizeof first, "%.*s", (int)strcspn(job->trainer_hosts, ",:"),
                 job->trainer_hosts);
    } else {
        prl_status rc = hostfile_first(job->trainer_hostfile, first, sizeof first);
        if (rc) return rc;
    }
    if (!host_is_this_one(first))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: the first host, %s, is not this host: mpirun puts rank 0 there "
                             "and rank 0 talks to the controller on this host (list this host "
                             "first)",
                             key, first);
    return PRL_OK;
}

int prl_rank_hosts_args(const prl_job_config *job, const char **argv)
{
    int k = 0;
    if (*job->trainer_hosts) argv[k++] = "--host", argv[k++] = job->trainer_hosts;
    if (*job->trainer_hostfile) argv[k++] = "--hostfile", argv[k++] = job->trainer_hostfile;
    return k;
}
