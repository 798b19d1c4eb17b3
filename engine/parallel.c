/*
** parallel.c — prl's single thread pool.
**
** OpenBLAS is kept single-threaded; parallelism comes from this pool, which runs a fixed set
** of independent tasks (row blocks of a GEMM, attention heads, experts, token chunks). The
** decomposition into tasks never depends on the thread count and each task computes the
** same arithmetic whichever thread runs it, so results are bitwise identical for 1, 2 or N
** threads. (OpenBLAS's own threading is not: measured, sgemm results differ between 1 and 2
** OpenBLAS threads on this machine.)
**
** Workers spin briefly after a job and then sleep on a condition variable, so an idle pool
** does not steal the CPU from other processes.
*/
#include "engine/engine.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

enum { SPIN_ROUNDS = 4000 };
#define CLOSED 0xffffffffu /* task index of a job that takes no more claims */

static struct {
    int n_threads; /* including the caller */
    pthread_t *workers;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
    pthread_cond_t done_cond;
    atomic_uint generation;          /* bumped once per job */
    atomic_uint_least64_t next_task; /* (job generation << 32) | next task index */
    atomic_int tasks_done;
    atomic_int sleepers;
    atomic_int n_tasks;
    void (*fn)(void *, int);
    void *ctx;
    int shutting_down;
    pid_t owner; /* process that started the workers: a fork()ed child has none of them */
} pool;

static _Thread_local int inside_pool_task;
static _Thread_local int worker_index; /* 0 = the calling thread */

/* Claim and run tasks of job `job` until none are left. A claim is a compare-and-swap on
** (job, index), so a thread still looking at an older job can never take a task of a newer
** one: every task runs exactly once. (The caller closes the old job before it changes the
** job's fields — see CLOSED — so a thread that read an old (job, index) and then a new
** n_tasks still fails its compare-and-swap.) */
static void run_tasks(unsigned job)
{
    inside_pool_task = 1;
    for (;;) {
        uint64_t v = atomic_load(&pool.next_task);
        if ((unsigned)(v >> 32) != job || (uint32_t)v >= (uint32_t)atomic_load(&pool.n_tasks))
            break;
        if (!atomic_compare_exchange_weak(&pool.next_task, &v, v + 1)) continue;
        pool.fn(pool.ctx, (int)(uint32_t)v);
        if (atomic_fetch_add(&pool.tasks_done, 1) + 1 == pool.n_tasks) {
            pthread_mutex_lock(&pool.mutex);
            pthread_cond_broadcast(&pool.done_cond);
            pthread_mutex_unlock(&pool.mutex);
        }
    }
    inside_pool_task = 0;
}

static void *worker_main(void *arg)
{
    worker_index = (int)(intptr_t)arg;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load(&pool.generation)) == seen && spins < SPIN_ROUNDS) {
            spins++;
            if ((spins & 63) == 0) sched_yield();
        }
        if (g == seen) {
            pthread_mutex_lock(&pool.mutex);
            atomic_fetch_add(&pool.sleepers, 1);
            while ((g = atomic_load(&pool.generation)) == seen && !pool.shutting_down)
                pthread_cond_wait(&pool.wake, &pool.mutex);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.mutex);
        }
        if (pool.shutting_down) return NULL;
        seen = g;
        run_tasks(g);
    }
}

/* After fork() the child inherits the pool's bookkeeping but not its threads: forget them,
** never join threads of another process. Returns the count the pool had. */
static int forget_inherited_workers(void)
{
    int n = pool.n_threads;
    if (n <= 0 || pool.owner == getpid()) return 0;
    free(pool.workers);
    pool.workers = NULL;
    pool.n_threads = 0;
    return n;
}

/* A forked child restarts the pool with the parent's thread count on first use. */
static void adopt_after_fork(void)
{
    int n = forget_inherited_workers();
    if (n > 0) prl_pool_init(n);
}

prl_status prl_pool_init(int n_threads)
{
    if (n_threads < 1) n_threads = 1;
    forget_inherited_workers();
    if (pool.n_threads == n_threads) return PRL_OK;
    prl_pool_free();
    pool.owner = getpid();
    pool.n_threads = n_threads;
    pthread_mutex_init(&pool.mutex, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done_cond, NULL);
    pool.shutting_down = 0;
    pool.workers = calloc((size_t)n_threads, sizeof *pool.workers);
    if (!pool.workers) return prl_error_set(PRL_ERR_NOMEM, "thread pool");
    for (int i = 1; i < n_threads; i++)
        if (pthread_create(&pool.workers[i], NULL, worker_main, (void *)(intptr_t)i) != 0) {
            pool.n_threads = i;
            return prl_error_set(PRL_ERR_NOMEM, "cannot start thread %d of the pool", i);
        }
    return PRL_OK;
}

void prl_pool_free(void)
{
    if (forget_inherited_workers() > 0 || pool.n_threads <= 0) return;
    pthread_mutex_lock(&pool.mutex);
    pool.shutting_down = 1;
    atomic_fetch_add(&pool.generation, 1);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mutex);
    for (int i = 1; i < pool.n_threads; i++) pthread_join(pool.workers[i], NULL);
    free(pool.workers);
    pool.workers = NULL;
    pool.n_threads = 0;
}

int prl_pool_threads(void) { return pool.n_threads > 0 ? pool.n_threads : 1; }

int prl_pool_worker(void) { return worker_index; }

void prl_parallel_for(int n_tasks, void (*fn)(void *ctx, int task), void *ctx)
{
    if (n_tasks <= 0) return;
    adopt_after_fork();
    if (pool.n_threads <= 1 || n_tasks == 1 || inside_pool_task) {
        for (int i = 0; i < n_tasks; i++) fn(ctx, i);
        return;
    }
    unsigned job = atomic_load(&pool.generation) + 1;
    /* Close the previous job first: any pending claim on it now fails (index CLOSED is past
    ** every task count), and only then publish the new job's fields. Without this a slow
    ** worker could pair an old index with the new n_tasks and run a task of the new job
    ** twice — measured: rare, run-to-run different training results. */
    atomic_store(&pool.next_task, ((uint64_t)(job - 1) << 32) | CLOSED);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n_tasks = n_tasks;
    atomic_store(&pool.tasks_done, 0);
    atomic_store(&pool.next_task, (uint64_t)job << 32);
    pthread_mutex_lock(&pool.mutex);
    atomic_store(&pool.generation, job);
    if (atomic_load(&pool.sleepers) > 0) pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mutex);
    run_tasks(job);
    int spins = 0;
    while (atomic_load(&pool.tasks_done) < n_tasks && spins < SPIN_ROUNDS * 4) spins++;
    if (atomic_load(&pool.tasks_done) < n_tasks) {
        pthread_mutex_lock(&pool.mutex);
        while (atomic_load(&pool.tasks_done) < n_tasks)
            pthread_cond_wait(&pool.done_cond, &pool.mutex);
        pthread_mutex_unlock(&pool.mutex);
    }
}
