/* src/engine/cpu_k_blocks.c — the block-quantized types of GGUF files
 * (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K; include/dolphin/ggml_blocks.h)
 * dequantized into F32 tiles, which the F32 products of cpu_k_matmul.c then
 * run (cpu_ops.c). One decoder per type, each the expressions of
 * dol_blk_weight unrolled over a whole block so that the compiler can
 * vectorize it (conversions, products and differences only: no sums, so
 * every variant gives the same bits, the reference's). Compiled once per
 * variant (cpu_k.h); exports DOL_K(blk_panel). */
#include "engine/cpu_k.h"

#include <string.h>

#include "dolphin/ggml_blocks.h"

static void dq_q8_0(const uint8_t *b, float *y)
{
    const float d = dol_blk_f16(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

static void dq_q4_0(const uint8_t *b, float *y)
{
    const float d = dol_blk_f16(b);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((b[2 + j] & 0xF) - 8) * d;
        y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
    }
}

static void dq_q4_1(const uint8_t *b, float *y)
{
    const float d = dol_blk_f16(b), m = dol_blk_f16(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(b[4 + j] & 0xF) * d + m;
        y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
    }
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void dq_q5_0(const uint8_t *b, float *y)
{
    const float d = dol_blk_f16(b);
    const uint32_t qh = le32(b + 2);
    for (int j = 0; j < 16; j++) {
        const int lo = (b[6 + j] & 0xF) | (int)(((qh >> j) & 1u) << 4);
        const int hi = (b[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
        y[j] = (float)(lo - 16) * d;
        y[j + 16] = (float)(hi - 16) * d;
    }
}

static void dq_q5_1(const uint8_t *b, float *y)
{
    const float d = dol_blk_f16(b), m = dol_blk_f16(b + 2);
    const uint32_t qh = le32(b + 4);
    for (int j = 0; j < 16; j++) {
        const int lo = (b[8 + j] & 0xF) | (int)(((qh >> j) & 1u) << 4);
        const int hi = (b[8 + j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
        y[j] = (float)lo * d + m;
        y[j + 16] = (float)hi * d + m;
    }
}

static void dq_q2_k(const uint8_t *b, float *y)
{
    const float d = dol_blk_f16(b + 80), dmin = dol_blk_f16(b + 82);
    for (int n = 0; n < 2; n++)
        for (int g = 0; g < 4; g++)
            for (int s = 0; s < 2; s++) {
                const uint8_t sc = b[n * 8 + g * 2 + s];
                const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
                const uint8_t *q = b + 16 + 32 * n + 16 * s;
                float *o = y + 128 * n + 32 * g + 16 * s;
                for (int l = 0; l < 16; l++) o[l] = dl * (float)((q[l] >> (2 * g)) & 3) - ml;
            }
}

static void dq_q3_k(const uint8_t *b, float *y)
{
    const float dall = dol_blk_f16(b + 108);
    for (int n = 0; n < 2; n++)
        for (int g = 0; g < 4; g++)
            for (int s = 0; s < 2; s++) {
                const float dl = dall * (float)dol_blk_q3k_scale(n * 8 + g * 2 + s, b + 96);
                const uint8_t *q = b + 32 + 32 * n + 16 * s, *hm = b + 16 * s;
                float *o = y + 128 * n + 32 * g + 16 * s;
                for (int l = 0; l < 16; l++) {
                    const int v = ((q[l] >> (2 * g)) & 3) - (((hm[l] >> (4 * n + g)) & 1) ? 0 : 4);
                    o[l] = dl * (float)v;
                }
            }
}

/* The scales and mins of chunk c (sub-blocks 2c, 2c + 1) of a Q4_K / Q5_K
 * block, multiplied by the block's d and dmin. */
static inline void k4_scales(const uint8_t *b, int c, float d, float dmin, float *d1, float *n1,
                             float *d2, float *n2)
{
    int sc1, m1, sc2, m2;
    dol_blk_k4_scale_min(2 * c, b + 4, &sc1, &m1);
    dol_blk_k4_scale_min(2 * c + 1, b + 4, &sc2, &m2);
    *d1 = d * (float)sc1, *n1 = dmin * (float)m1;
    *d2 = d * (float)sc2, *n2 = dmin * (float)m2;
}

static void dq_q4_k(const uint8_t *b, float *y)
{
    const float d = dol_blk_f16(b), dmin = dol_blk_f16(b + 2);
    for (int c = 0; c < 4; c++) {
        float d1, n1, d2, n2;
        k4_scales(b, c, d, dmin, &d1, &n1, &d2, &n2);
        const uint8_t *q = b + 16 + 32 * c;
        for (int l = 0; l < 32; l++) {
            y[64 * c + l] = d1 * (float)(q[l] & 0xF) - n1;
            y[64 * c + 32 + l] = d2 * (float)(q[l] >> 4) - n2;
        }
    }
}

static void dq_q5_k(const uint8_t *b, float *y)
{
    const float d = dol_blk_f16(b), dmin = dol_blk_f16(b + 2);
    const uint8_t *qh = b + 16;
    for (int c = 0; c < 4; c++) {
        float d1, n1, d2, n2;
        k4_scales(b, c, d, dmin, &d1, &n1, &d2, &n2);
        const uint8_t *q = b + 48 + 32 * c;
        for (int l = 0; l < 32; l++) {
            const int lo = (q[l] & 0xF) + (((qh[l] >> (2 * c)) & 1) ? 16 : 0);
            const int hi = (q[l] >> 4) + (((qh[l] >> (2 * c + 1)) & 1) ? 16 : 0);
            y[64 * c + l] = d1 * (float)lo - n1;
            y[64 * c + 32 + l] = d2 * (float)hi - n2;
        }
    }
}

static void dq_q6_k(const uint8_t *b, float *y)
{
    const float d = dol_blk_f16(b + 208);
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * n);
        for (int qd = 0; qd < 4; qd++)
            for (int h = 0; h < 2; h++) {
                const float ds = d * (float)sc[h + 2 * qd];
                float *o = y + 128 * n + 32 * qd + 16 * h;
                for (int l = 16 * h; l < 16 * h + 16; l++) {
                    const uint8_t lb = ql[l + ((qd & 1) ? 32 : 0)];
                    const int lo = (qd & 2) ? lb >> 4 : lb & 0xF;
                    const int q = (lo | (((qh[l] >> (2 * qd)) & 3) << 4)) - 32;
                    o[l - 16 * h] = ds * (float)q;
                }
            }
    }
}

typedef void (*block_fn)(const uint8_t *b, float *y);

static block_fn decoder(dol_dtype t)
{
    switch (t) {
    case DOL_DTYPE_Q8_0: return dq_q8_0;
    case DOL_DTYPE_Q4_0: return dq_q4_0;
    case DOL_DTYPE_Q4_1: return dq_q4_1;
    case DOL_DTYPE_Q5_0: return dq_q5_0;
    case DOL_DTYPE_Q5_1: return dq_q5_1;
    case DOL_DTYPE_Q2_K: return dq_q2_k;
    case DOL_DTYPE_Q3_K: return dq_q3_k;
    case DOL_DTYPE_Q4_K: return dq_q4_k;
    case DOL_DTYPE_Q5_K: return dq_q5_k;
    case DOL_DTYPE_Q6_K: return dq_q6_k;
    default: return NULL;
    }
}

void DOL_K(blk_panel)(dol_dtype t, const void *W, size_t row_bytes, int n, int m, int K,
                      bool packed, float *tile)
{
    const block_fn dq = decoder(t);
    const int B = dol_dtype_block(t);
    const size_t bb = dol_dtype_block_bytes(t);
    const int rows = packed ? (m + DOL_PACK_ROWS - 1) / DOL_PACK_ROWS * DOL_PACK_ROWS : m;
    float y[256];
    for (int r = 0; r < rows; r++) {
        float *row = packed ? tile + (size_t)(r / DOL_PACK_ROWS) * DOL_PACK_ROWS * (size_t)K +
                                  (size_t)(r % DOL_PACK_ROWS) * DOL_PACK_K
                            : tile + (size_t)r * (size_t)K;
        /* the padding rows of a packed panel (r >= m) are zeros, not rows of W */
        const uint8_t *src = r < m ? (const uint8_t *)W + (size_t)(n + r) * row_bytes : NULL;
        for (int b = 0; b < K / B; b++) {
            if (!packed) {   /* straight into the row */
                if (src && dq) dq(src + (size_t)b * bb, row + (size_t)b * B);
                else memset(row + (size_t)b * B, 0, sizeof(float) * (size_t)B);
                continue;
            }
            if (src && dq) dq(src + (size_t)b * bb, y);
            else memset(y, 0, sizeof(float) * (size_t)B);
            /* chunk c of the row sits DOL_PACK_ROWS * DOL_PACK_K floats after chunk c - 1 */
            for (int c = 0; c < B / DOL_PACK_K; c++)
                memcpy(row + ((size_t)b * B / DOL_PACK_K + (size_t)c) * DOL_PACK_ROWS * DOL_PACK_K,
                       y + c * DOL_PACK_K, sizeof(float) * DOL_PACK_K);
        }
    }
}
