/* src/engine/cpu_i8.h — the 8-bit-activation products of the CPU backend
 * (internal to the engine, its tests and tools): each row of x quantized
 * once per product to int8 in blocks of 32, then integer dot products
 * against the weights of every quantized format (Dolphin's load-time NF4
 * and Q8_0, GGUF's block types), int32 within a block, the scales applied
 * in float afterwards. The design, the accuracy and the measurements:
 * docs/performance.md, "8-bit activations".
 *
 * The kernels (cpu_k_i8.c) are written once and compiled per instruction
 * set, each compilation exporting one dol_cpu_i8 table:
 *
 *   avx2        -mavx2 -mfma -mf16c: u8 x s8 pairs (vpmaddubsw, vpmaddwd);
 *               weights of at most 7 bits unsigned go in as u = w + 2^k
 *               (or w) against q, less 2^k times the pair sums of q, the
 *               8-bit ones as |w| against q with w's sign
 *   avxvnni     + -mavxvnni: vpdpbusd in VEX form
 *   avx512vnni  + -mavx512f/bw/dq/vl -mavx512vnni: vpdpbusd in EVEX form,
 *               a pair of blocks per 512-bit vector; below 16 rows of x
 *               the weights go in unsigned (w + 2^k) against q, the lane
 *               started at -2^k times the sum of its 4 inputs (ns below)
 *
 * Every set computes the same int32 lanes (lane j of a block: the sum of
 * the products of its inputs 4j .. 4j+3, exact) and then the same float
 * operations in the same order, lane by lane, so the three sets give the
 * same bits.
 * The portable kernel set (cpu_kernels.h) has no int8 products: there the
 * F32 path runs.
 *
 * Arithmetic of one output y[t][n] = sum_k x[t][k] W[n][k]:
 *   activations: per block b of 32 inputs of row t, a = max |x|,
 *     d_b = a / 127 (float division; 0 when a = 0), q_i = round-to-nearest-
 *     even(x_i * (127 / a)) in [-127, 127], and s_b[j] = (float)(q_4j +
 *     q_4j+1 + q_4j+2 + q_4j+3) * d_b (the quantized inputs' sums, for the
 *     weight formats with a minimum: with them the error of a product is
 *     sum W_i (x^_i - x_i), within 0.5 d_b sum |W_i| per block, where the
 *     exact sums would leave sum (W_i + mw)(x^_i - x_i), several times
 *     larger for Q4_1 / Q4_K);
 *   weights: block b of row n as 32 integers w_i (|w_i| <= 128) with a
 *     scale per half of 16 (sw_h) and, for the formats with minima, a
 *     minimum per half (mw_h): W[n][32b + i] = sw_h * w_i - mw_h;
 *   two accumulators of 8 lanes, E for the even blocks b and O for the
 *     odd ones; per block, in its accumulator A, lane j (h = j / 4):
 *     A_j = fma((float)I_j, sw_h * d_b, A_j), with I_j = sum_{i=4j..4j+3}
 *     w_i q_i; then, with minima, A_j = A_j - mw_h * s_b[j] (one fused
 *     negative multiply-add);
 *   a_j = E_j + O_j, and y = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
 * A row's activations depend on that row only and every output runs
 * these operations whatever T, the tile it falls in or the thread split,
 * so results are batch-invariant bit for bit. (Where the engine repacks a
 * matrix into the interleaved layout, cpu_r16.h, that layout's own
 * arithmetic on whole-block integers runs instead, over the same
 * quantized activations.) */
#ifndef DOLPHIN_ENGINE_CPU_I8_H
#define DOLPHIN_ENGINE_CPU_I8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dolphin/model.h"
#include "engine/nf4.h"
#include "engine/q8.h"

#define DOL_I8_BLOCK 32

/* The activations of one product: T rows of K inputs (K a multiple of 32),
 * nb = K / 32 blocks per row. Owned by whoever allocated the arrays
 * (dol_cpu_i8_act_reserve). */
typedef struct dol_i8_act {
    int T, K, nb;
    int8_t *q;  /* [T][K] quantized inputs */
    float *d;   /* [T][nb] block scales */
    float *s;   /* [T][nb][8] sums of each group of 4 quantized inputs, times d */
    int32_t *sq; /* [T][nb][2] sums of the quantized inputs of each half block */
    float *sd;   /* [T][nb] (float)(sq[0] + sq[1]) * d: the factor of a block's minimum (cpu_r16.h) */
    /* for the 512-bit set's in-register tiles (T < 16 only): */
    float *dv;   /* [T][nb][8] d of each block, repeated over the block's 8 lanes */
    int32_t *ns; /* [T][nb][8] minus the sum of each group of 4 quantized inputs: the
                  * start of a product with weights stored as w + c (c = 2^k) */
    size_t cap; /* rows the arrays hold, of K_cap inputs */
    int K_cap;
} dol_i8_act;

/* One weight matrix as the int8 kernels read it: N rows of K weights of
 * dtype t, which is DOL_DTYPE_Q8_0 .. DOL_DTYPE_Q6_K (GGUF blocks at
 * base + r * row_bytes), or DOL_I8_NF4 / DOL_I8_Q8 (Dolphin's load-time
 * formats, nf4 / q8 set). */
#define DOL_I8_NF4 ((dol_dtype)100)
#define DOL_I8_Q8 ((dol_dtype)101)
typedef struct {
    dol_dtype t;
    const uint8_t *base;
    size_t row_bytes;
    const dol_nf4_matrix *nf4;
    const dol_q8_matrix *q8;
    int N, K;
} dol_i8_weight;

typedef struct dol_cpu_i8 {
    const char *name; /* "avx2", "avxvnni" or "avx512vnni" */

    /* Rows t0 .. t1-1 of x ([T][K] f32, row stride K) into a (the
     * arithmetic above); a->T, K, nb are set by the caller. */
    void (*quantize)(dol_i8_act *a, const float *x, int t0, int t1);

    /* out[t][n] (row stride ldo) for t < a->T and n0 <= n < n1, by the
     * arithmetic above; W->K == a->K. Any n0 <= n1 <= W->N. */
    void (*rows)(float *out, int ldo, const dol_i8_act *a, const dol_i8_weight *W, int n0,
                 int n1, void *scratch);

    /* Bytes of the scratch rows takes for width K (64-byte aligned, the
     * caller's, one call at a time): there groups of rows of W are decoded
     * once for all rows of x. With scratch NULL each tile decodes its own
     * blocks (the same bits, slower for T > 2). */
    size_t (*scratch_bytes)(int K);

    /* Rows n .. n+m-1 (m <= 16) of W decoded for the AMX-INT8 product
     * (cpu_amx.h): block b's 16 rows of 32 int8 weights at wq + b * 512
     * (row r at + r * 32), the scale of half h (16 weights) of block b of
     * row r at sw[(2b + h) * 16 + r] and its minimum at mw[...] (W = sw * w
     * - mw); rows m..15 are zeros. wq: 16 K bytes, sw and mw: K floats
     * each. Returns DOL_I8_HALVES when the format's two halves may have
     * different scales (or minima) | DOL_I8_MIN when it has minima. */
    int (*decode16)(const dol_i8_weight *W, int n, int m, int8_t *wq, float *sw, float *mw);
} dol_cpu_i8;

#define DOL_I8_HALVES 1
#define DOL_I8_MIN 2

extern const dol_cpu_i8 dol_cpu_i8_avx2;
extern const dol_cpu_i8 dol_cpu_i8_avxvnni;
extern const dol_cpu_i8 dol_cpu_i8_avx512vnni;

/* The set called name, or NULL when unknown or not usable on this CPU and
 * OS (or not built: non-x86). */
const dol_cpu_i8 *dol_cpu_i8_find(const char *name);

/* The set in use, chosen at first call (thread-safe): DOLPHIN_CPU_I8 when
 * it names a usable set (else one warning line), otherwise the widest
 * usable one (avx512vnni, avxvnni, avx2); NULL when none is, or when the
 * F32 kernel set in use is portable. */
const dol_cpu_i8 *dol_cpu_i8_get(void);

/* Use the set called name from now on (tests, benchmarks): 0, or -1 when
 * it is not usable here (the choice is unchanged). */
int dol_cpu_i8_set(const char *name);

/* Whether the int8 kernels take a matrix of this format and width: every
 * quantized format, K a multiple of 32 (NF4: of 64). */
bool dol_cpu_i8_takes(dol_dtype t, int K);

/* Size a for T rows of K inputs (grows, never shrinks); sets a->T, K, nb.
 * 0, or -1 when out of memory (a keeps its arrays). */
int dol_cpu_i8_act_reserve(dol_i8_act *a, int T, int K);
void dol_cpu_i8_act_free(dol_i8_act *a);

/* The int8 code book of NF4: round(level * 127) for the 16 levels of
 * nf4.h, so that an NF4 weight absmax * level is read as
 * (absmax * (1 / 127)) * code, within 0.5 / 127 of absmax (plus the
 * float rounding of the scale). */
extern const int8_t dol_nf4_i8_codes[16];

#endif
