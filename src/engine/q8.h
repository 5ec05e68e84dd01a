/* src/engine/q8.h — 8-bit weights in llama.cpp's Q8_0 scheme, quantized at
 * load time (multithreaded) and dequantized for the references and tests.
 * The CPU matrix product over this layout is the kernel sets' q8_rows
 * (cpu_kernels.h); the CUDA one is kernels/q8.cu.
 *
 * Layout of a weight matrix W [rows = out_features][cols = in_features]:
 *
 *   - Each row is cut into blocks of DOL_Q8_BLOCK (32) consecutive weights
 *     along the input dimension; when cols is not a multiple of 32 the last
 *     block of every row is shorter (any cols >= 1). Blocks never cross rows.
 *   - scales: one F16 scale d per block, row-major [rows][blocks_per_row].
 *   - quants: one int8 q per weight, row-major [rows][cols] (so block b of
 *     row r starts at quants + r * cols + 32 * b).
 *   Per block that is Q8_0's content (32 int8 values and one F16 scale,
 *   34 bytes per 32 weights = 1.0625 bytes per weight, 0.531 x F16), held
 *   as two arrays instead of interleaved 34-byte records, so that SIMD and
 *   CUDA loads of the quants stay aligned.
 *
 * Quantization of a block with absmax a: d = f16(a / 127) (a / 127 in
 * float, rounded to nearest even), then, against that stored scale,
 * q = round-half-away-from-zero(w / d) clamped to [-127, 127] (w / d in
 * double); a block of zeros gets d = 0 and q = 0. Dequantization:
 * value = q * d in float, which is exact (8 + 11 significant bits).
 * NaN or weights beyond the F16 range are refused. The kernel sets compute
 * exactly this (q8_quantize_rows, cpu_kernels.h) without a division. */
#ifndef DOLPHIN_ENGINE_Q8_H
#define DOLPHIN_ENGINE_Q8_H

#include <stddef.h>
#include <stdint.h>

#include "dolphin/model.h"
#include "engine/threadpool.h"

#define DOL_Q8_BLOCK 32

/* A Q8_0 matrix; quants and scales are owned by whoever allocated them
 * (sizes: dol_q8_quants_bytes, dol_q8_scales_bytes). */
typedef struct {
    int64_t rows, cols;     /* out_features, in_features */
    int64_t blocks_per_row; /* ceil(cols / 32) */
    int8_t *quants;         /* rows * cols bytes */
    uint16_t *scales;       /* rows * blocks_per_row F16 scales */
} dol_q8_matrix;

/* Sizes of the two arrays of a [rows][cols] Q8_0 matrix, and their sum. */
size_t dol_q8_quants_bytes(int64_t rows, int64_t cols);
size_t dol_q8_scales_bytes(int64_t rows, int64_t cols);
size_t dol_q8_bytes(int64_t rows, int64_t cols);

/* Quantize src ([rows][cols], F32/F16/BF16) into dst, whose quants and
 * scales point to buffers of the right sizes; dst->rows/cols/blocks_per_row
 * are set here. Rows are spread over the pool (NULL = the calling thread).
 * -1 with one line in err naming `what` when a weight is NaN or too large
 * for an F16 scale. */
int dol_q8_quantize(dol_pool *pool, const dol_tensor *src, dol_q8_matrix *dst,
                    const char *what, char *err, size_t errlen);

/* Block b of row r as floats: out[j] = q * d for j < n; returns n (32, or
 * less for the short last block of a row). */
int dol_q8_dequantize_block(const dol_q8_matrix *m, int64_t r, int64_t b, float *out);

/* Row r of m as floats (cols values). */
void dol_q8_dequantize_row(const dol_q8_matrix *m, int64_t r, float *out);

#endif
