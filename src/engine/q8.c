/* src/engine/q8.c — Q8_0 (8-bit, blocks of 32) quantization at load time and
 * dequantization (the layout and the scheme are described in q8.h). */
#include "engine/q8.h"

#include <math.h>
#include <stdatomic.h>

#include "dolphin/common.h"

size_t dol_q8_quants_bytes(int64_t rows, int64_t cols) { return (size_t)rows * (size_t)cols; }

size_t dol_q8_scales_bytes(int64_t rows, int64_t cols)
{
    return (size_t)rows * (size_t)((cols + DOL_Q8_BLOCK - 1) / DOL_Q8_BLOCK) * sizeof(uint16_t);
}

size_t dol_q8_bytes(int64_t rows, int64_t cols)
{
    return dol_q8_quants_bytes(rows, cols) + dol_q8_scales_bytes(rows, cols);
}

static inline float load_f32(const void *p, dol_dtype t, int64_t i)
{
    if (t == DOL_DTYPE_F16) return dol_f16_to_f32(((const uint16_t *)p)[i]);
    if (t == DOL_DTYPE_BF16) return dol_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
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
        w[i] = load_f32(src, t, base + i);
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

typedef struct {
    const dol_tensor *src;
    dol_q8_matrix *dst;
    int64_t rows_per_task;
    atomic_int failed;
} quant_job;

static void quant_task(void *ctx, int task, int worker)
{
    (void)worker;
    quant_job *j = ctx;
    const dol_q8_matrix *m = j->dst;
    int64_t r0 = task * j->rows_per_task, r1 = r0 + j->rows_per_task;
    if (r1 > m->rows) r1 = m->rows;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t b = 0; b < m->blocks_per_row; b++) {
            int64_t k0 = b * DOL_Q8_BLOCK;
            int n = m->cols - k0 < DOL_Q8_BLOCK ? (int)(m->cols - k0) : DOL_Q8_BLOCK;
            if (quantize_block(j->src->data, j->src->dtype, r * m->cols + k0, n,
                               &m->scales[r * m->blocks_per_row + b],
                               &m->quants[r * m->cols + k0]) != 0) {
                atomic_store(&j->failed, 1);
                return;
            }
        }
}

int dol_q8_quantize(dol_pool *pool, const dol_tensor *src, dol_q8_matrix *dst,
                    const char *what, char *err, size_t errlen)
{
    dst->rows = src->rows;
    dst->cols = src->cols;
    dst->blocks_per_row = (src->cols + DOL_Q8_BLOCK - 1) / DOL_Q8_BLOCK;
    quant_job j = { .src = src, .dst = dst };
    atomic_init(&j.failed, 0);
    int64_t rows = 65536 / (src->cols > 0 ? src->cols : 1); /* tasks of ~64K weights */
    if (rows < 1) rows = 1;
    j.rows_per_task = rows;
    int64_t tasks = (src->rows + rows - 1) / rows;
    if (pool) dol_pool_run(pool, quant_task, &j, (int)tasks);
    else
        for (int64_t t = 0; t < tasks; t++) quant_task(&j, (int)t, 0);
    if (atomic_load(&j.failed)) {
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
