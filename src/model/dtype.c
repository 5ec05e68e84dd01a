/* src/model/dtype.c — element types of checkpoint tensors: sizes, names,
 * block geometry, the scalar conversions between F16 / BF16 and F32 that the
 * engine uses, and the reference dequantization of the block types
 * (ggml_blocks.h). */
#include "dolphin/model.h"
#include "dolphin/f16.h"

#include <string.h>

#include "dolphin/ggml_blocks.h"

/* name, weights per block, bytes per block */
static const struct {
    const char *name;
    int block;
    size_t bytes;
} DTYPES[DOL_DTYPE_COUNT] = {
    [DOL_DTYPE_F32] = {"F32", 1, 4},      [DOL_DTYPE_F16] = {"F16", 1, 2},
    [DOL_DTYPE_BF16] = {"BF16", 1, 2},    [DOL_DTYPE_Q8_0] = {"Q8_0", 32, 34},
    [DOL_DTYPE_Q4_0] = {"Q4_0", 32, 18},  [DOL_DTYPE_Q4_1] = {"Q4_1", 32, 20},
    [DOL_DTYPE_Q5_0] = {"Q5_0", 32, 22},  [DOL_DTYPE_Q5_1] = {"Q5_1", 32, 24},
    [DOL_DTYPE_Q2_K] = {"Q2_K", 256, 84}, [DOL_DTYPE_Q3_K] = {"Q3_K", 256, 110},
    [DOL_DTYPE_Q4_K] = {"Q4_K", 256, 144}, [DOL_DTYPE_Q5_K] = {"Q5_K", 256, 176},
    [DOL_DTYPE_Q6_K] = {"Q6_K", 256, 210},
};

static bool known(dol_dtype t) { return (unsigned)t < DOL_DTYPE_COUNT; }

size_t dol_dtype_size(dol_dtype t)
{
    return known(t) && DTYPES[t].block == 1 ? DTYPES[t].bytes : 0;
}

const char *dol_dtype_name(dol_dtype t)
{
    return known(t) ? DTYPES[t].name : "?";
}

bool dol_dtype_is_block(dol_dtype t) { return known(t) && DTYPES[t].block > 1; }

int dol_dtype_block(dol_dtype t) { return known(t) ? DTYPES[t].block : 1; }

size_t dol_dtype_block_bytes(dol_dtype t) { return known(t) ? DTYPES[t].bytes : 0; }

size_t dol_dtype_row_bytes(dol_dtype t, int64_t cols)
{
    if (!known(t)) return 0;
    return (size_t)(cols / DTYPES[t].block) * DTYPES[t].bytes;
}

size_t dol_tensor_bytes(const dol_tensor *t)
{
    return (size_t)t->rows * dol_dtype_row_bytes(t->dtype, t->cols);
}

void dol_dequantize(dol_dtype t, const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    if (t == DOL_DTYPE_F32) {
        memcpy(dst, src, sizeof(float) * (size_t)n);
        return;
    }
    if (t == DOL_DTYPE_F16 || t == DOL_DTYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | (p[2 * i + 1] << 8));
            dst[i] = t == DOL_DTYPE_F16 ? dol_f16_to_f32(h) : dol_bf16_to_f32(h);
        }
        return;
    }
    if (!dol_dtype_is_block(t)) return;
    const int B = DTYPES[t].block;
    for (int64_t b = 0; b < n / B; b++, p += DTYPES[t].bytes)
        for (int j = 0; j < B; j++) dst[b * B + j] = dol_blk_weight(t, p, j);
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float dol_f16_to_f32(uint16_t h) { return dol_f16_value(h); }

uint16_t dol_f32_to_f16(float f) { return dol_f16_bits(f); }

float dol_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t dol_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)          /* nan: keep it a quiet nan */
        return (uint16_t)((x >> 16) | 0x40);
    uint32_t lsb = (x >> 16) & 1;
    x += 0x7fffu + lsb;                             /* round to nearest even */
    return (uint16_t)(x >> 16);
}
