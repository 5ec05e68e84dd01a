/* src/engine/quant_blocks.h — what the block quantizers (nf4.c, q8.c) share:
 * reading a checkpoint weight as float whatever its dtype, and the
 * multithreaded walk over every (row, block) of a matrix that calls the
 * scheme's quantization of one block. */
#ifndef DOLPHIN_ENGINE_QUANT_BLOCKS_H
#define DOLPHIN_ENGINE_QUANT_BLOCKS_H

#include <stdint.h>

#include "dolphin/common.h"
#include "dolphin/model.h"
#include "engine/threadpool.h"

/* Element i of the F32, F16 or BF16 array p, as float. */
static inline float dol_quant_load_f32(const void *p, dol_dtype t, int64_t i)
{
    if (t == DOL_DTYPE_F16) return dol_f16_to_f32(((const uint16_t *)p)[i]);
    if (t == DOL_DTYPE_BF16) return dol_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* Quantize block b of row r of src: its n weights start at element
 * r * src->cols + k0 of src->data. 0, or -1 when the block cannot be
 * quantized. ctx: the scheme's destination. */
typedef int (*dol_quant_block_fn)(void *ctx, const dol_tensor *src, int64_t r, int64_t b,
                                  int64_t k0, int n);

/* fn on every block of `block` weights (the last of a row shorter when
 * src->cols % block != 0) of every row of src, in tasks of about 64K weights
 * on pool (NULL: on this thread). 0, or -1 when any fn call failed (the
 * remaining blocks of that task are skipped). */
int dol_quant_blocks_run(dol_pool *pool, const dol_tensor *src, int block, dol_quant_block_fn fn,
                         void *ctx);

#endif
