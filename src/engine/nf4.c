/* src/engine/nf4.c — NF4 quantization at load time and dequantization (the
 * layout and the scheme are described in nf4.h). */
#include "engine/nf4.h"

#include <math.h>

#include "dolphin/common.h"
#include "engine/cpu_kernels.h"
#include "engine/quant_blocks.h"

/* Midpoints between adjacent levels, in float. */
#define MID(a, b) (0.5f * ((a) + (b)))
static const float NF4_MID[15] = {
    MID(NF4_L0, NF4_L1),   MID(NF4_L1, NF4_L2),   MID(NF4_L2, NF4_L3),   MID(NF4_L3, NF4_L4),
    MID(NF4_L4, NF4_L5),   MID(NF4_L5, NF4_L6),   MID(NF4_L6, NF4_L7),   MID(NF4_L7, NF4_L8),
    MID(NF4_L8, NF4_L9),   MID(NF4_L9, NF4_L10),  MID(NF4_L10, NF4_L11), MID(NF4_L11, NF4_L12),
    MID(NF4_L12, NF4_L13), MID(NF4_L13, NF4_L14), MID(NF4_L14, NF4_L15),
};

/* The same midpoints in double, exact: the sum of two floats halved. */
#define MIDD(a, b) (0.5 * ((double)(a) + (double)(b)))
const double dol_nf4_mids[16] = {
    MIDD(NF4_L0, NF4_L1),   MIDD(NF4_L1, NF4_L2),   MIDD(NF4_L2, NF4_L3),   MIDD(NF4_L3, NF4_L4),
    MIDD(NF4_L4, NF4_L5),   MIDD(NF4_L5, NF4_L6),   MIDD(NF4_L6, NF4_L7),   MIDD(NF4_L7, NF4_L8),
    MIDD(NF4_L8, NF4_L9),   MIDD(NF4_L9, NF4_L10),  MIDD(NF4_L10, NF4_L11), MIDD(NF4_L11, NF4_L12),
    MIDD(NF4_L12, NF4_L13), MIDD(NF4_L13, NF4_L14), MIDD(NF4_L14, NF4_L15), 0.0,
};

size_t dol_nf4_codes_bytes(int64_t rows, int64_t cols) { return (size_t)rows * (size_t)(cols / 2); }

size_t dol_nf4_scales_bytes(int64_t rows, int64_t cols)
{
    return (size_t)rows * (size_t)((cols + DOL_NF4_BLOCK - 1) / DOL_NF4_BLOCK) * sizeof(uint16_t);
}

size_t dol_nf4_bytes(int64_t rows, int64_t cols)
{
    return dol_nf4_codes_bytes(rows, cols) + dol_nf4_scales_bytes(rows, cols);
}

int dol_nf4_check_cols(int64_t cols, const char *what, char *err, size_t errlen)
{
    if (cols > 0 && cols % 2 == 0) return 0;
    dol_set_err(err, errlen,
                "weights nf4: %s: in_features %lld is odd; NF4 packs two 4-bit codes per byte "
                "and needs an even number of input features",
                what, (long long)cols);
    return -1;
}

/* The code is the number of midpoints strictly below x (a tie goes to the
 * lower level); counting instead of searching keeps it branch-free, so the
 * block loop below vectorizes. */
uint8_t dol_nf4_nearest(float x)
{
    int code = 0;
    for (int i = 0; i < 15; i++) code += x > NF4_MID[i];
    return (uint8_t)code;
}

/* Rows r0..r1-1 (quant_blocks.h's callback), into the matrix ctx, by the
 * kernel set in use (cpu_kernels.h: every set writes the same bytes). */
static int quant_rows(void *ctx, const dol_tensor *src, int64_t r0, int64_t r1)
{
    return dol_cpu_kernels_get()->nf4_quantize_rows(src->data, src->dtype, ctx, r0, r1);
}

int dol_nf4_quantize(dol_pool *pool, const dol_tensor *src, dol_nf4_matrix *dst,
                     const char *what, char *err, size_t errlen)
{
    if (dol_nf4_check_cols(src->cols, what, err, errlen) != 0) return -1;
    dst->rows = src->rows;
    dst->cols = src->cols;
    dst->blocks_per_row = (src->cols + DOL_NF4_BLOCK - 1) / DOL_NF4_BLOCK;
    if (dol_quant_blocks_run(pool, src, quant_rows, dst) != 0) {
        dol_set_err(err, errlen,
                    "weights nf4: %s: a weight is NaN or beyond the F16 range (|w| > 65504); "
                    "cannot quantize",
                    what);
        return -1;
    }
    return 0;
}

int dol_nf4_dequantize_block(const dol_nf4_matrix *m, int64_t r, int64_t b, float *out)
{
    int64_t k0 = b * DOL_NF4_BLOCK;
    int n = m->cols - k0 < DOL_NF4_BLOCK ? (int)(m->cols - k0) : DOL_NF4_BLOCK;
    float s = dol_f16_to_f32(m->scales[r * m->blocks_per_row + b]);
    const uint8_t *c = &m->codes[r * (m->cols / 2) + k0 / 2];
    for (int j = 0; j < n / 2; j++) {
        out[j] = dol_nf4_levels[c[j] & 0xF] * s;
        out[j + n / 2] = dol_nf4_levels[c[j] >> 4] * s;
    }
    return n;
}

void dol_nf4_dequantize_row(const dol_nf4_matrix *m, int64_t r, float *out)
{
    for (int64_t b = 0; b < m->blocks_per_row; b++)
        dol_nf4_dequantize_block(m, r, b, out + b * DOL_NF4_BLOCK);
}
