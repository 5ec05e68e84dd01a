/* src/engine/nf4.h — 4-bit NormalFloat (NF4) weights, as QLoRA defines them
 * (Dettmers, Pagnoni, Holtzman, Zettlemoyer 2023, "QLoRA: Efficient
 * Finetuning of Quantized LLMs", arXiv:2305.14314): 16 levels in [-1, 1]
 * placed at quantiles of N(0, 1) with an exact zero, blockwise absmax
 * scaling with blocks of 64 weights. The scheme bitsandbytes applies for
 * `load_in_4bit` with `bnb_4bit_quant_type=nf4`; this file quantizes at load
 * time (multithreaded) and dequantizes for the references and tests. The CPU
 * matrix product over this layout is dol_cpu_matmul_nf4 (cpu_ops.h).
 *
 * Layout of a weight matrix W [rows = out_features][cols = in_features]:
 *
 *   - Each row is cut into blocks of DOL_NF4_BLOCK (64) consecutive weights
 *     along the input dimension. When cols is not a multiple of 64 (e.g. the
 *     intermediate size 172 of stories260K) the last block of every row is
 *     shorter; cols must be even. Blocks never cross rows.
 *   - scales: one absmax per block, stored as F16 (IEEE half), row-major
 *     [rows][blocks_per_row]. The stored value s = f16(max |w|) is the one
 *     used both to quantize and to dequantize, so dequantization is exactly
 *     dol_nf4_levels[code] * s in float.
 *   - codes: 4 bits per weight, cols/2 bytes per row, row-major. Within a
 *     block of n weights (n = 64, or the short last block), byte j
 *     (0 <= j < n/2) holds weight j of the block in its LOW nibble (bits 0-3)
 *     and weight j + n/2 in its HIGH nibble (bits 4-7). (Not the adjacent-pair
 *     packing of bitsandbytes: this "split halves" order lets a SIMD kernel
 *     widen 16 bytes to 16 lanes once and get 16 consecutive weights from the
 *     low nibbles and the 16 weights 32 further from the high nibbles, with
 *     no shuffle across lanes.)
 *   - code q in 0..15 means the level dol_nf4_levels[q]; code 7 is 0.0.
 *
 * Bytes per weight: 0.5 (code) + 2/64 (F16 scale) = 0.53125, i.e. 0.266 x
 * the F16 size (F32 scales would cost 0.5625 = 0.281 x; F16 scales keep the
 * resident linear weights under 0.30 x F16 without double quantization).
 *
 * Quantization: code = the level nearest to w / s (ties go to the lower
 * level; decided exactly, in double, not on w / s rounded to float),
 * s = f16(absmax of the block); a block of zeros gets s = 0 and
 * codes 7. Weights whose magnitude exceeds the F16 range, and NaN, are
 * refused. The kernel sets compute exactly this (nf4_quantize_rows,
 * cpu_kernels.h) without the double arithmetic. */
#ifndef DOLPHIN_ENGINE_NF4_H
#define DOLPHIN_ENGINE_NF4_H

#include <stddef.h>
#include <stdint.h>

#include "dolphin/model.h"
#include "engine/threadpool.h"

#define DOL_NF4_BLOCK 64

/* QLoRA (Dettmers et al. 2023, arXiv:2305.14314), Appendix E: the NF4 data
 * type. 2^3 positive quantiles of N(0,1) and 2^3 - 1 negative ones (plus an
 * exact zero), normalized to [-1, 1]; the values bitsandbytes ships. */
#define NF4_L0 -1.0f
#define NF4_L1 -0.6961928009986877f
#define NF4_L2 -0.5250730514526367f
#define NF4_L3 -0.39491748809814453f
#define NF4_L4 -0.28444138169288635f
#define NF4_L5 -0.18477343022823334f
#define NF4_L6 -0.09105003625154495f
#define NF4_L7 0.0f
#define NF4_L8 0.07958029955625534f
#define NF4_L9 0.16093020141124725f
#define NF4_L10 0.24611230194568634f
#define NF4_L11 0.33791524171829224f
#define NF4_L12 0.44070982933044434f
#define NF4_L13 0.5626170039176941f
#define NF4_L14 0.7229568362236023f
#define NF4_L15 1.0f

/* The 16 NF4 levels, ascending, NF4_L0..NF4_L15 (defined in nf4_levels.c,
 * on its own so that the GPU kit's shared kernel library can carry it). */
extern const float dol_nf4_levels[16];

/* The 15 midpoints between adjacent levels, exact in double (the sum of
 * two floats halved), ascending; entry 15 is padding (0). The quantizers
 * decide a code by comparing w with mid * scale (cpu_k_quantize.c). */
extern const double dol_nf4_mids[16];

/* An NF4 matrix. codes and scales are owned by whoever allocated them
 * (sizes: dol_nf4_codes_bytes, dol_nf4_scales_bytes). */
typedef struct {
    int64_t rows, cols;     /* out_features, in_features */
    int64_t blocks_per_row; /* ceil(cols / 64) */
    uint8_t *codes;         /* rows * cols/2 bytes */
    uint16_t *scales;       /* rows * blocks_per_row F16 absmax values */
} dol_nf4_matrix;

/* Sizes of the two arrays of a [rows][cols] NF4 matrix, and their sum. */
size_t dol_nf4_codes_bytes(int64_t rows, int64_t cols);
size_t dol_nf4_scales_bytes(int64_t rows, int64_t cols);
size_t dol_nf4_bytes(int64_t rows, int64_t cols);

/* 0 when a matrix with `cols` input features can be held in NF4 (cols even
 * and > 0); else -1 and one line in err naming `what`. */
int dol_nf4_check_cols(int64_t cols, const char *what, char *err, size_t errlen);

/* Code of the level nearest to x (x is w / scale, normally in [-1, 1];
 * values outside clamp to codes 0 / 15). */
uint8_t dol_nf4_nearest(float x);

/* Code of weight (r, k) of m. */
static inline unsigned dol_nf4_code(const dol_nf4_matrix *m, int64_t r, int64_t k)
{
    int64_t b = k / DOL_NF4_BLOCK, j = k % DOL_NF4_BLOCK;
    int64_t n = m->cols - b * DOL_NF4_BLOCK < DOL_NF4_BLOCK ? m->cols - b * DOL_NF4_BLOCK
                                                            : DOL_NF4_BLOCK;
    int64_t half = n / 2;
    uint8_t byte = m->codes[r * (m->cols / 2) + b * (DOL_NF4_BLOCK / 2) + (j < half ? j : j - half)];
    return j < half ? (byte & 0xFu) : (byte >> 4);
}

/* Quantize src ([rows][cols], F32/F16/BF16, cols checked with
 * dol_nf4_check_cols) into dst, whose codes and scales point to buffers of
 * the right sizes; dst->rows/cols/blocks_per_row are set here. Rows are
 * spread over the pool (NULL = the calling thread). -1 with one line in err
 * naming `what` when a weight is NaN or too large for an F16 scale. */
int dol_nf4_quantize(dol_pool *pool, const dol_tensor *src, dol_nf4_matrix *dst,
                     const char *what, char *err, size_t errlen);

/* Block b of row r as floats, in k order: out[j] = dol_nf4_levels[code] *
 * scale for j < n; returns n, the block's length (64, or less for the last
 * block of a row whose length is not a multiple of 64). */
int dol_nf4_dequantize_block(const dol_nf4_matrix *m, int64_t r, int64_t b, float *out);

/* Row r of m as floats (cols values). */
void dol_nf4_dequantize_row(const dol_nf4_matrix *m, int64_t r, float *out);

#endif
