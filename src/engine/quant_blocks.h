/* src/engine/quant_blocks.h — what the load-time quantizers (nf4.c, q8.c)
 * share: the multithreaded walk over the rows of a matrix that calls the
 * scheme's quantization of a run of rows (a kernel-set entry,
 * cpu_kernels.h). */
#ifndef DOLPHIN_ENGINE_QUANT_BLOCKS_H
#define DOLPHIN_ENGINE_QUANT_BLOCKS_H

#include <stdint.h>

#include "dolphin/common.h"
#include "dolphin/model.h"
#include "engine/threadpool.h"

/* Quantize rows r0 .. r1-1 of src (every block of each). 0, or -1 when a
 * block cannot be quantized. ctx: the scheme's destination. */
typedef int (*dol_quant_rows_fn)(void *ctx, const dol_tensor *src, int64_t r0, int64_t r1);

/* fn over every row of src, in tasks of about 64K weights (whole rows) on
 * pool (NULL: on this thread). 0, or -1 when any fn call failed. */
int dol_quant_blocks_run(dol_pool *pool, const dol_tensor *src, dol_quant_rows_fn fn, void *ctx);

#endif
