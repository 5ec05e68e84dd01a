/* src/engine/threadpool.c — parallel-for over a fixed pool of pthreads.
 * A forward step dispatches ~10 jobs per layer, so dispatch must cost
 * microseconds: workers spin briefly on an atomic job counter before
 * sleeping on a condition variable, and the caller (worker 0) spins until
 * the others are done. Within a job, workers claim task indices from an
 * atomic counter, so uneven tasks balance themselves. */
#include "engine/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* How long an idle worker spins before it sleeps. */
#define SPIN_NS 200000ull

struct dol_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    atomic_ulong generation;  /* bumped per job */
    atomic_int busy;          /* background workers still in the job */
    atomic_int sleepers;      /* workers blocked on `wake` */
    atomic_bool shutdown;
    dol_pool_fn fn;
    void *ctx;
    int n_tasks;
    atomic_int next;
};

typedef struct { dol_pool *p; int worker; } worker_arg;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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
    for (;;) {
        /* wait for a new generation: spin first, then sleep */
        uint64_t t0 = now_ns();
        int spins = 0;
        while (atomic_load_explicit(&p->generation, memory_order_acquire) == seen &&
               !atomic_load(&p->shutdown)) {
            cpu_relax();
            if (++spins % 256 == 0 && now_ns() - t0 > (uint64_t)SPIN_NS) {
                pthread_mutex_lock(&p->mu);
                atomic_fetch_add(&p->sleepers, 1);
                while (atomic_load(&p->generation) == seen && !atomic_load(&p->shutdown))
                    pthread_cond_wait(&p->wake, &p->mu);
                atomic_fetch_sub(&p->sleepers, 1);
                pthread_mutex_unlock(&p->mu);
            }
        }
        if (atomic_load(&p->shutdown)) break;
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        work(p, wa.worker);
        atomic_fetch_sub_explicit(&p->busy, 1, memory_order_release);
    }
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
    atomic_store(&p->shutdown, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
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
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->busy, p->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    work(p, 0);
    while (atomic_load_explicit(&p->busy, memory_order_acquire) > 0) cpu_relax();
}
