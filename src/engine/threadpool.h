/* src/engine/threadpool.h — the compute thread pool of the CPU backend: a
 * fixed set of worker threads created once at engine start-up, used to run
 * parallel-for loops (matrix products, attention heads). Private to the
 * engine. */
#ifndef DOLPHIN_ENGINE_THREADPOOL_H
#define DOLPHIN_ENGINE_THREADPOOL_H

#include <stddef.h>

typedef struct dol_pool dol_pool;

/* Task body: handles task index `task` on worker `worker` (0..n_threads-1,
 * the calling thread is worker 0). */
typedef void (*dol_pool_fn)(void *ctx, int task, int worker);

/* n_threads >= 1 (1 = everything runs on the caller). NULL on failure. */
dol_pool *dol_pool_new(int n_threads);
void dol_pool_free(dol_pool *p);
int dol_pool_threads(const dol_pool *p);

/* Run fn for task = 0..n_tasks-1 spread over the workers (dynamic: each
 * worker claims the next index); returns when all are done. Only one thread
 * may call this at a time. */
void dol_pool_run(dol_pool *p, dol_pool_fn fn, void *ctx, int n_tasks);

#endif
