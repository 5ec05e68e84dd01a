/* src/engine/quant_blocks.c — the multithreaded walk over the rows of a
 * matrix that the load-time quantizers share (quant_blocks.h). */
#include "engine/quant_blocks.h"

#include <stdatomic.h>

typedef struct {
    const dol_tensor *src;
    int64_t rows_per_task;
    dol_quant_rows_fn fn;
    void *ctx;
    atomic_int failed;
} rows_job;

static void rows_task(void *ctx, int task, int worker)
{
    (void)worker;
    rows_job *j = ctx;
    if (atomic_load_explicit(&j->failed, memory_order_relaxed)) return; /* already refused */
    int64_t r0 = task * j->rows_per_task, r1 = r0 + j->rows_per_task;
    if (r1 > j->src->rows) r1 = j->src->rows;
    if (j->fn(j->ctx, j->src, r0, r1) != 0) atomic_store(&j->failed, 1);
}

int dol_quant_blocks_run(dol_pool *pool, const dol_tensor *src, dol_quant_rows_fn fn, void *ctx)
{
    rows_job j = { .src = src, .fn = fn, .ctx = ctx };
    atomic_init(&j.failed, 0);
    /* tasks of about 64K weights: many per thread for balance */
    int64_t rows = 65536 / (src->cols > 0 ? src->cols : 1);
    if (rows < 1) rows = 1;
    j.rows_per_task = rows;
    int64_t tasks = (src->rows + rows - 1) / rows;
    if (pool && tasks > 1) {
        dol_pool_run(pool, rows_task, &j, (int)tasks);
    } else {
        for (int64_t t = 0; t < tasks; t++) rows_task(&j, (int)t, 0);
    }
    return atomic_load(&j.failed) ? -1 : 0;
}
