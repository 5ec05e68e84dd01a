/* src/engine/quant_blocks.c — the multithreaded walk over the blocks of a
 * matrix that the load-time quantizers share (quant_blocks.h). */
#include "engine/quant_blocks.h"

#include <stdatomic.h>

typedef struct {
    const dol_tensor *src;
    int block;
    int64_t blocks_per_row, rows_per_task;
    dol_quant_block_fn fn;
    void *ctx;
    atomic_int failed;
} blocks_job;

static void blocks_task(void *ctx, int task, int worker)
{
    (void)worker;
    blocks_job *j = ctx;
    const int64_t cols = j->src->cols;
    int64_t r0 = task * j->rows_per_task, r1 = r0 + j->rows_per_task;
    if (r1 > j->src->rows) r1 = j->src->rows;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t b = 0; b < j->blocks_per_row; b++) {
            int64_t k0 = b * j->block;
            int n = cols - k0 < j->block ? (int)(cols - k0) : j->block;
            if (j->fn(j->ctx, j->src, r, b, k0, n) != 0) {
                atomic_store(&j->failed, 1);
                return;
            }
        }
}

int dol_quant_blocks_run(dol_pool *pool, const dol_tensor *src, int block, dol_quant_block_fn fn,
                         void *ctx)
{
    blocks_job j = { .src = src, .block = block, .fn = fn, .ctx = ctx };
    j.blocks_per_row = (src->cols + block - 1) / block;
    atomic_init(&j.failed, 0);
    /* tasks of about 64K weights: many per thread for balance */
    int64_t rows = 65536 / (src->cols > 0 ? src->cols : 1);
    if (rows < 1) rows = 1;
    j.rows_per_task = rows;
    int64_t tasks = (src->rows + rows - 1) / rows;
    if (pool) {
        dol_pool_run(pool, blocks_task, &j, (int)tasks);
    } else {
        for (int64_t t = 0; t < tasks; t++) blocks_task(&j, (int)t, 0);
    }
    return atomic_load(&j.failed) ? -1 : 0;
}
