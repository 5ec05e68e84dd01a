/* src/engine/cpu_r16.h — the interleaved weight layout of the 8-bit-
 * activation products (internal to the engine, its tests and tools):
 * weight rows repacked at load in groups of 16, interleaved by 4 inputs,
 * so that one 512-bit VNNI product (vpdpbusd) multiplies 4 inputs of one
 * token by 16 rows at once, one lane a row, and the same bytes are the
 * tile unit's second operand for AMX-INT8. The 256-bit int8 sets (AVX-VNNI,
 * AVX2) take each group as two halves of 8 rows (the low and high 32 bytes
 * of each 64-byte vector). The engine repacks wherever an int8 set runs
 * (DOLPHIN_CPU_R16=0: never). The design and measurements:
 * docs/performance.md, "The interleaved layout".
 *
 * Formats: every GGUF block type Dolphin reads (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0, Q2_K .. Q6_K) and its load-time NF4 and Q8_0 (int8).
 *
 * Layout of a matrix of N rows, K inputs (K a multiple of 32; NF4: of 64;
 * K-quants: of 256), G = ceil(N / 16) groups, nb = K / 32 blocks; gb =
 * g * nb + b:
 *   qs: per group and block, at gb * 64 * bits bytes, the 16 rows' 32
 *     weights as unsigned u = w + off, interleaved: weight k of row r at
 *     position p = (k / 4) * 64 + r * 4 + k % 4 of 512;
 *     bits 8: byte p; 2 (Q2_K): 128 bytes laid out as Q6_K's high plane
 *     below; 3 (Q3_K): the low 2 bits so, then 64 bytes of the third bit as
 *     the 5-bit formats' high plane; 4: 256 bytes, byte i of vector v (64 bytes) holding
 *     position 2v * 64 + i in its low nibble, (2v + 1) * 64 + i in its high
 *     one (NF4: the code, read through `codes` to u); 5 (Q5_0, Q5_1, Q5_K):
 *     the low 4 bits so, then 64 bytes of high bits, position p at bit p /
 *     64 of byte p % 64; 6 (Q6_K): the low 4 bits so, then 128 bytes of the
 *     high 2 bits, byte i of vector p / 256 holding position p at bits 2 (p
 *     / 64 % 4) of byte p % 64;
 *   sc: F16, per group and block at gb * 16 the rows' block scales (NF4:
 *     the absmax, sw = absmax * (1 / 127)); Q4_1 and Q5_1 at gb * 32: 16 d,
 *     then 16 m (w = d q + m: mw = -m); K-quants, per group and
 *     super-block at (gb / 8) * 32: 16 d, then 16 dmin;
 *   sub (K-quants): int8, per group and block at gb * 32: Q4_K and Q5_K the
 *     16 rows' 6-bit scales then minima (sw = d * sc, mw = dmin * m), Q3_K
 *     and Q6_K the scales of the first half then the second (sw_h = d *
 *     sc_h); Q2_K at gb * 64: those, then the halves' minima (mw_h = dmin *
 *     m_h);
 *   rows past N: u = 0, scales 0.
 *
 * Arithmetic of one output y[t][n] (t a row of x quantized as cpu_i8.h
 * says: q, d per block of 32), defined on whole-block integers:
 *   I_b = sum_{k < 32} w_k q_k (int32, exact; on VNNI sum u_k q_k - off *
 *   sum q_k, the sums from a->sq; on the tile unit TDPBSSD); Q2_K, Q3_K
 *   and Q6_K one per half (I_b0, I_b1);
 *   acc = 0; for b = 0 .. nb-1:
 *     acc = fma((float)I_b, sw_b * d_b, acc)
 *     [Q3_K, Q6_K: acc = fma((float)I_b0, sw_b0 * d_b, acc), then I_b1, sw_b1]
 *     [with a minimum (Q4_1, Q5_1, Q4_K, Q5_K): then acc = acc - mw_b *
 *      ((float)(sum q) * d_b), one fnmadd];
 *     [Q2_K: per half h, acc = fma((float)I_bh, sw_bh * d_b, acc), then
 *      acc = acc - mw_bh * ((float)(sum of the half's q) * d_b)];
 *   y = acc.
 * Every T, tile, thread split, kernel set and unit (VNNI below 16 rows of
 * x, the tile unit from 16 when the CPU has AMX-INT8; AVX2's integers from
 * vpmaddubsw pairs summed in int16 below overflow, then vpmaddwd) runs
 * these operations, so the results are batch-invariant bit for bit, the
 * same in every set, and the tile unit's prefill gives decode's bits. They are not the lane-wise bits of cpu_i8.h's
 * kernels (the float sums run in another order). */
#ifndef DOLPHIN_ENGINE_CPU_R16_H
#define DOLPHIN_ENGINE_CPU_R16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/cpu_i8.h"

#define DOL_R16_ROWS 16

/* The kernels a matrix's products run on (chosen at alloc from the int8 set
 * in use, cpu_i8.h). */
typedef enum { DOL_R16_AVX512VNNI, DOL_R16_AVXVNNI, DOL_R16_AVX2 } dol_r16_set;

typedef struct dol_i8_r16 {
    int N, K, nb, groups;
    dol_r16_set set;
    int bits;        /* 2, 3, 4, 5, 6 or 8 */
    int off;         /* u = w + off: Q3_K 4, Q4_0 8, Q5_0 16, Q6_K 32, Q8_0 / NF4 / int8 128, the others 0 */
    float smul;      /* sw = F16 scale * smul when nonzero (NF4: 1 / 127) */
    bool lut;        /* 4 bits read through codes (NF4) */
    bool kq;         /* K-quant scales (sub below) */
    bool halves;     /* a scale per 16 inputs (Q2_K, Q3_K, Q6_K) */
    bool min;        /* a minimum per block (Q4_1, Q5_1, Q4_K, Q5_K; Q2_K: per half) */
    uint8_t codes[16];
    uint8_t *qs;     /* owned (aligned_alloc), layout above */
    uint16_t *sc;    /* owned */
    int8_t *sub;     /* owned; kq only */
} dol_i8_r16;

/* Whether the layout takes a matrix of this format (cpu_i8.h's dtype: the
 * formats above) and width K. */
bool dol_i8_r16_takes(dol_dtype t, int K);

/* Whether its kernels run here: an int8 set is in use (dol_cpu_i8_get;
 * x86-64 with AVX2, FMA and F16C at least). */
bool dol_i8_r16_available(void);

/* Allocate R for W (dol_i8_r16_takes(W->t, W->K)), its products on the
 * int8 set in use (dol_i8_r16_available); 0 or -1 out of memory (R then
 * holds nothing). Fill it with dol_i8_r16_fill over every group
 * (groups are independent: callers may split them over threads). */
int dol_i8_r16_alloc(dol_i8_r16 *R, const dol_i8_weight *W);
void dol_i8_r16_fill(dol_i8_r16 *R, const dol_i8_weight *W, int g0, int g1);
void dol_i8_r16_free(dol_i8_r16 *R);
size_t dol_i8_r16_bytes(const dol_i8_r16 *R);

/* Bytes of the tile unit's scratch for width K: a group's weights as
 * int8 tiles and two C tiles. */
size_t dol_i8_r16_scratch_bytes(int K);

/* out[t * ldo + n] for t < a->T, n0 <= n < n1 (n0 a multiple of 16, n1 <=
 * R->N), by the arithmetic above; a->K == R->K, a->sq and a->sd set. With
 * amx_scratch (dol_i8_r16_scratch_bytes(K), the caller's, one call at a
 * time; only where dol_amx_i8_available and R->set is avx512vnni) and
 * a->T >= 16 on the tile unit, else on R->set's vectors: the same bits.
 * Any thread; only dol_i8_r16_available hosts may call it. */
void dol_i8_r16_rows(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int n0, int n1,
                     void *amx_scratch);

/* ---- for the kernel sources (cpu_r16.c, cpu_k_r16.c) ------------------- */

/* The 256-bit sets' products (cpu_k_r16.c, compiled once per set):
 * dol_i8_r16_rows' contract without the tile unit. */
void dol_i8_r16_rows_avx2(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int n0, int n1);
void dol_i8_r16_rows_avxvnni(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int n0, int n1);

/* The kernels are compiled once per kind of format (the layout's flags as
 * constants): R's own flags must match the kind they run under. */
typedef struct {
    int bits;
    bool lut, kq, halves, min;
} dol_r16_kind;
#define DOL_R16_Q4 ((dol_r16_kind){ 4, false, false, false, false })  /* Q4_0 */
#define DOL_R16_NF4 ((dol_r16_kind){ 4, true, false, false, false })  /* NF4 */
#define DOL_R16_B8 ((dol_r16_kind){ 8, false, false, false, false })  /* Q8_0, int8 */
#define DOL_R16_Q41 ((dol_r16_kind){ 4, false, false, false, true })  /* Q4_1 */
#define DOL_R16_Q5 ((dol_r16_kind){ 5, false, false, false, false })  /* Q5_0 */
#define DOL_R16_Q51 ((dol_r16_kind){ 5, false, false, false, true })  /* Q5_1 */
#define DOL_R16_Q4K ((dol_r16_kind){ 4, false, true, false, true })   /* Q4_K */
#define DOL_R16_Q5K ((dol_r16_kind){ 5, false, true, false, true })   /* Q5_K */
#define DOL_R16_Q2K ((dol_r16_kind){ 2, false, true, true, true })    /* Q2_K */
#define DOL_R16_Q3K ((dol_r16_kind){ 3, false, true, true, false })   /* Q3_K */
#define DOL_R16_Q6K ((dol_r16_kind){ 6, false, true, true, false })   /* Q6_K */

/* Calls F(..., kind) with the kind of R as a constant. */
#define DOL_R16_DISPATCH(R, F, ...)                                              \
    do {                                                                         \
        if ((R)->kq) {                                                           \
            if ((R)->halves && (R)->bits == 2) F(__VA_ARGS__, DOL_R16_Q2K);      \
            else if ((R)->halves && (R)->bits == 3) F(__VA_ARGS__, DOL_R16_Q3K); \
            else if ((R)->halves) F(__VA_ARGS__, DOL_R16_Q6K);                   \
            else if ((R)->bits == 5) F(__VA_ARGS__, DOL_R16_Q5K);                \
            else F(__VA_ARGS__, DOL_R16_Q4K);                                    \
        } else if ((R)->bits == 8) F(__VA_ARGS__, DOL_R16_B8);                   \
        else if ((R)->bits == 5 && (R)->min) F(__VA_ARGS__, DOL_R16_Q51);        \
        else if ((R)->bits == 5) F(__VA_ARGS__, DOL_R16_Q5);                     \
        else if ((R)->lut) F(__VA_ARGS__, DOL_R16_NF4);                          \
        else if ((R)->min) F(__VA_ARGS__, DOL_R16_Q41);                          \
        else F(__VA_ARGS__, DOL_R16_Q4);                                         \
    } while (0)

#endif
