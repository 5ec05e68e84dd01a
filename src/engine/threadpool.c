/* src/engine/threadpool.c — parallel-for over a fixed pool of pthreads.
 * Workers sleep on a condition variable between jobs; within a job they claim
 * task indices from an atomic counter, so uneven tasks balance themselves.
 * The calling thread works too (as worker 0). */
#include "engine/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct dol_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;     /* a new job (or shutdown) */
    pthread_cond_t done;     /* the last worker left the job */
    unsigned long generation;/* bumped per job */
    int busy;                /* background workers still in the job */
    int shutdown;
    dol_pool_fn fn;
    void *ctx;
    int n_tasks;
    atomic_int next;
};

typedef struct { dol_pool *p; int worker; } worker_arg;

static void work(dol_pool *p, int worker)
{
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, worker);
    }
}

static void *worker_main(void *arg)
{
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    dol_pool *p = wa.p;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->shutdown && p->generation == seen)
            pthread_cond_wait(&p->wake, &p->mu);
        if (p->shutdown) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        work(p, wa.worker);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

dol_pool *dol_pool_new(int n_threads)
{
    if (n_threads < 1) n_threads = 1;
    dol_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) { free(p); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { p->n_threads = i; dol_pool_free(p); return NULL; }
        wa->p = p;
        wa->worker = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n_threads = i;
            dol_pool_free(p);
            return NULL;
        }
    }
    return p;
}

void dol_pool_free(dol_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->shutdown = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int dol_pool_threads(const dol_pool *p) { return p->n_threads; }

void dol_pool_run(dol_pool *p, dol_pool_fn fn, void *ctx, int n_tasks)
{
    if (n_tasks <= 0) return;
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    p->busy = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    work(p, 0);

    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
