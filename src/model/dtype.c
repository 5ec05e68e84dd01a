/* src/model/dtype.c — element types of checkpoint tensors: sizes, names,
 * block geometry, the scalar conversions between F16 / BF16 and F32 that the
 * engine uses, and the reference dequantization of the block types
 * (ggml_blocks.h). */
#include "dolphin/model.h"

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

float dol_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;

    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in F32 */
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31) /* inf or nan (payload kept) */
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t dol_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u) return sign | 0x7c00;           /* inf */
        return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff); /* quiet nan */
    }
    if (ax >= 0x477ff000u) /* >= 65520: rounds to inf */
        return sign | 0x7c00;
    if (ax < 0x38800000u) {
        /* below the smallest normal F16 (2^-14): result is subnormal or 0.
         * value = m * 2^(e-150); in units of 2^-24 that is m >> (126 - e). */
        uint32_t e = ax >> 23;
        if (e < 102) return sign;   /* < 2^-25: rounds to zero */
        uint32_t m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e;   /* 14 .. 24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return sign | (uint16_t)r;  /* may carry into the smallest normal */
    }
    /* normal: rebias the exponent, round the mantissa to 10 bits */
    uint32_t r = ax - 0x38000000u;
    uint32_t h = r >> 13;
    uint32_t rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return sign | (uint16_t)h;
}

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
