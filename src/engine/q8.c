/* src/engine/q8.c — Q8_0 (8-bit, blocks of 32) quantization at load time and
 * dequantization (the layout and the scheme are described in q8.h). */
#include "engine/q8.h"

#include <math.h>

#include "dolphin/common.h"
#include "engine/cpu_kernels.h"
#include "engine/quant_blocks.h"

size_t dol_q8_quants_bytes(int64_t rows, int64_t cols) { return (size_t)rows * (size_t)cols; }

size_t dol_q8_scales_bytes(int64_t rows, int64_t cols)
{
    return (size_t)rows * (size_t)((cols + DOL_Q8_BLOCK - 1) / DOL_Q8_BLOCK) * sizeof(uint16_t);
}

size_t dol_q8_bytes(int64_t rows, int64_t cols)
{
    return dol_q8_quants_bytes(rows, cols) + dol_q8_scales_bytes(rows, cols);
}

/* Rows r0..r1-1 (quant_blocks.h's callback), into the matrix ctx, by the
 * kernel set in use (cpu_kernels.h: every set writes the same bytes). */
static int quant_rows(void *ctx, const dol_tensor *src, int64_t r0, int64_t r1)
{
    return dol_cpu_kernels_get()->q8_quantize_rows(src->data, src->dtype, ctx, r0, r1);
}

int dol_q8_quantize(dol_pool *pool, const dol_tensor *src, dol_q8_matrix *dst,
                    const char *what, char *err, size_t errlen)
{
    dst->rows = src->rows;
    dst->cols = src->cols;
    dst->blocks_per_row = (src->cols + DOL_Q8_BLOCK - 1) / DOL_Q8_BLOCK;
    if (dol_quant_blocks_run(pool, src, quant_rows, dst) != 0) {
        dol_set_err(err, errlen,
                    "weights int8: %s: a weight is NaN or too large for an F16 scale "
                    "(|w| / 127 > 65504); cannot quantize",
                    what);
        return -1;
    }
    return 0;
}

int dol_q8_dequantize_block(const dol_q8_matrix *m, int64_t r, int64_t b, float *out)
{
    int64_t k0 = b * DOL_Q8_BLOCK;
    int n = m->cols - k0 < DOL_Q8_BLOCK ? (int)(m->cols - k0) : DOL_Q8_BLOCK;
    float d = dol_f16_to_f32(m->scales[r * m->blocks_per_row + b]);
    const int8_t *q = &m->quants[r * m->cols + k0];
    for (int j = 0; j < n; j++) out[j] = (float)q[j] * d;
    return n;
}

void dol_q8_dequantize_row(const dol_q8_matrix *m, int64_t r, float *out)
{
    for (int64_t b = 0; b < m->blocks_per_row; b++)
        dol_q8_dequantize_block(m, r, b, out + b * DOL_Q8_BLOCK);
}
