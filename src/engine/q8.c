/* src/engine/q8.c — Q8_0 (8-bit, blocks of 32) quantization at load time and
 * dequantization (the layout and the scheme are described in q8.h). */
#include "engine/q8.h"

#include <math.h>

#include "dolphin/common.h"
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

/* One block of n <= 32 weights -> its F16 scale and n int8 values; -1 when
 * a weight is NaN or the scale overflows F16. */
static int quantize_block(const void *src, dol_dtype t, int64_t base, int n, uint16_t *scale,
                          int8_t *q)
{
    float w[DOL_Q8_BLOCK];
    float absmax = 0.0f;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        w[i] = dol_quant_load_f32(src, t, base + i);
        float a = fabsf(w[i]);
        bad |= !(a <= 65504.0f * 127.0f);
        absmax = a > absmax ? a : absmax;
    }
    if (bad) return -1;
    uint16_t h = dol_f32_to_f16(absmax / 127.0f);
    float d = dol_f16_to_f32(h);
    if (isinf(d)) return -1;
    *scale = h;
    /* w / d in double (an exact reference's quotient up to one rounding of
     * 53 bits, so a half-way case is decided as it decides it) */
    for (int i = 0; i < n; i++) {
        double v = d > 0.0f ? (double)w[i] / (double)d : 0.0;
        double r = round(v); /* half away from zero */
        q[i] = (int8_t)(r > 127.0 ? 127 : r < -127.0 ? -127 : r);
    }
    return 0;
}

/* Block b of row r (quant_blocks.h's callback), into the matrix ctx. */
static int quant_block_at(void *ctx, const dol_tensor *src, int64_t r, int64_t b, int64_t k0, int n)
{
    const dol_q8_matrix *m = ctx;
    return quantize_block(src->data, src->dtype, r * m->cols + k0, n,
                          &m->scales[r * m->blocks_per_row + b], &m->quants[r * m->cols + k0]);
}

int dol_q8_quantize(dol_pool *pool, const dol_tensor *src, dol_q8_matrix *dst,
                    const char *what, char *err, size_t errlen)
{
    dst->rows = src->rows;
    dst->cols = src->cols;
    dst->blocks_per_row = (src->cols + DOL_Q8_BLOCK - 1) / DOL_Q8_BLOCK;
    if (dol_quant_blocks_run(pool, src, DOL_Q8_BLOCK, quant_block_at, dst) != 0) {
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
