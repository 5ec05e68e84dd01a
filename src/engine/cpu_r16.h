/* src/engine/cpu_r16.h — the interleaved weight layout of the 8-bit-
 * activation products (internal to the engine, its tests and tools):
 * weight rows repacked at load in groups of 16, interleaved by 4 inputs,
 * so that one 512-bit VNNI product (vpdpbusd) multiplies 4 inputs of one
 * token by 16 rows at once, one lane a row, and the same bytes are the
 * tile unit's second operand for AMX-INT8. The design and measurements:
 * docs/performance.md, "The interleaved layout".
 *
 * Formats: GGUF Q4_0 and Q8_0, Dolphin's load-time NF4 and Q8_0 (int8);
 * every format whose block of 32 is 32 integers w with one scale sw
 * (W = sw * w), no minimum.
 *
 * Layout of a matrix of N rows, K inputs (K a multiple of 32; NF4: of 64),
 * G = ceil(N / 16) groups, nb = K / 32 blocks:
 *   qs: per group g and block b, at (g * nb + b) * 64 * bits bytes, the
 *     16 rows' weights as unsigned u = w + off, interleaved: weight k of
 *     row r at byte (k / 4) * 64 + r * 4 + k % 4 of the 512 u values;
 *     8 bits: those bytes; 4 bits: 256 bytes, byte i of vector v (64 bytes)
 *     holding u at 2v * 64 + i in its low nibble and (2v + 1) * 64 + i in
 *     its high nibble (NF4: the code, read through lut to u);
 *   sc: per group and block, at (g * nb + b) * 16, the 16 rows' scales as
 *     F16 (NF4: the block's absmax; sw = absmax * (1 / 127));
 *   rows past N: u = 0, scale 0.
 *
 * Arithmetic of one output y[t][n] (t a row of x quantized as cpu_i8.h
 * says: q, d per block of 32), defined on whole-block integers:
 *   I_b = sum_{k < 32} w_k q_k (int32, exact; computed as sum u_k q_k -
 *   off * sum q_k on VNNI, the sums from a->sq, as TDPBSSD on the tile
 *   unit), and
 *   acc = 0; for b = 0 .. nb-1: acc = fma((float)I_b, sw_b * d_b, acc);
 *   y = acc.
 * Every T, tile, thread split and unit (VNNI below 16 rows of x, the tile
 * unit from 16 when the CPU has AMX-INT8) runs these operations, so the
 * results are batch-invariant bit for bit, and the tile unit's prefill
 * gives decode's bits. They are not the lane-wise bits of cpu_i8.h's
 * kernels (the float sums are in another order). */
#ifndef DOLPHIN_ENGINE_CPU_R16_H
#define DOLPHIN_ENGINE_CPU_R16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/cpu_i8.h"

#define DOL_R16_ROWS 16

typedef struct dol_i8_r16 {
    int N, K, nb, groups;
    int bits;        /* 4 or 8 */
    int off;         /* u = w + off: Q4_0 8, the others 128 */
    float smul;      /* sw = F16 scale * smul when nonzero (NF4: 1 / 127) */
    bool lut;        /* 4 bits read through codes (NF4) */
    uint8_t codes[16];
    uint8_t *qs;     /* owned (aligned_alloc), layout above */
    uint16_t *sc;    /* owned */
} dol_i8_r16;

/* Whether the layout takes a matrix of this format (cpu_i8.h's dtype: Q4_0,
 * Q8_0, DOL_I8_NF4, DOL_I8_Q8) and width K. */
bool dol_i8_r16_takes(dol_dtype t, int K);

/* Whether its kernels run here: AVX-512F/BW/VL, AVX512-VNNI and F16C in
 * cpuid with the ZMM state enabled (the int8 set avx512vnni's test). */
bool dol_i8_r16_available(void);

/* Allocate R for W (dol_i8_r16_takes(W->t, W->K)); 0 or -1 out of memory
 * (R then holds nothing). Fill it with dol_i8_r16_fill over every group
 * (groups are independent: callers may split them over threads). */
int dol_i8_r16_alloc(dol_i8_r16 *R, const dol_i8_weight *W);
void dol_i8_r16_fill(dol_i8_r16 *R, const dol_i8_weight *W, int g0, int g1);
void dol_i8_r16_free(dol_i8_r16 *R);
size_t dol_i8_r16_bytes(const dol_i8_r16 *R);

/* Bytes of the tile unit's scratch for width K: a group's weights as
 * int8 tiles and two C tiles. */
size_t dol_i8_r16_scratch_bytes(int K);

/* out[t * ldo + n] for t < a->T, n0 <= n < n1 (n0 a multiple of 16, n1 <=
 * R->N), by the arithmetic above; a->K == R->K, a->sq set. With
 * amx_scratch (dol_i8_r16_scratch_bytes(K), the caller's, one call at a
 * time; only where dol_amx_i8_available) and a->T >= 16 on the tile unit,
 * else on VNNI: the same bits. Only dol_i8_r16_available hosts may call
 * it. */
void dol_i8_r16_rows(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int n0, int n1,
                     void *amx_scratch);

#endif
