/* src/engine/cpu_amx.h — matrix products on Intel AMX, the CPU backend's
 * opt-in fast path for products of 16 or more rows of x (prefill), taken
 * only when batch_invariant is false (docs/configuration.md;
 * docs/performance.md, "AMX on the Xeon"): BF16x3 (this part) for F16,
 * BF16 and weights on F32 activations, AMX-INT8 (the end of the file) for
 * weights on 8-bit activations.
 *
 * Every operand v (f32) is split into two bfloat16 parts, v = hi + lo + e:
 * hi = bf16(v), lo = bf16(v - hi), |e| <= 2^-17 |v| (round to nearest even
 * twice). A product x w is then hi_x hi_w + hi_x lo_w + lo_x hi_w (the
 * fourth term, <= 2^-16 |x w|, is left out): three tile products, each
 * multiplying bf16 pairs exactly and accumulating in f32 (TDPBF16PS). This
 * is the "bf16x3" scheme of Henry, Tang and Heinecke, "Leveraging the
 * bfloat16 Artificial Intelligence Datatype For Higher-Precision
 * Computations" (ARITH 2019). F16 and BF16 weights split exactly (lo = 0
 * for BF16), so their only rounding is x's; NF4 / Q8_0 weights are split
 * after exact dequantization to f32. Each output is then within about
 * 2^-16 sum_k |x_k w_k| of the exact one (tests/unit/test_cpu_amx.c holds
 * it to 3e-5), but not the same bits, and the order of the f32 sums is the
 * tile unit's: outputs are not batch-invariant against the other paths,
 * which is why the path is opt-in.
 *
 * Layouts (bf16 as uint16_t):
 *   x, packed by dol_amx_pack_x: per block of 16 tokens (tb) and 32 inputs
 *     (kc), a 512-element hi block then a 512-element lo block, at
 *     ((tb * K/32 + kc) * 2) * 512; inside a block, element (t, k) is at
 *     (k % 32 / 2) * 32 + (t % 16) * 2 + k % 2 (the tile unit's pair-
 *     interleaved "VNNI" layout of its second operand). Tokens past T are 0.
 *   W, a group of 16 rows: per block of 32 inputs (kc), a 512-element hi
 *     block then a 512-element lo block, at kc * 1024; inside a block,
 *     element (r, k) is at r * 32 + k % 32. Rows past the group's m real
 *     rows are 0. (Each tile is one contiguous KiB: rows K * 2 bytes apart
 *     would fall into one L1 set.)
 * K must be a multiple of DOL_AMX_K. Thread: any; each call configures and
 * releases the calling thread's tiles. */
#ifndef DOLPHIN_ENGINE_CPU_AMX_H
#define DOLPHIN_ENGINE_CPU_AMX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dolphin/model.h"
#include "engine/nf4.h"
#include "engine/q8.h"

#define DOL_AMX_K 32    /* inputs per tile step */
#define DOL_AMX_ROWS 16 /* rows of W per group, tokens per block */

/* The 64-byte operand of LDTILECFG (palette 1): each tile's rows and bytes
 * a row (Intel SDM, "Intel AMX", TILECFG). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) dol_amx_tile_config;

/* Whether this build, CPU and OS can run the products: AMX-TILE, AMX-BF16,
 * AVX512-BF16 and AVX-512F/BW/VL in cpuid, the tile state enabled in XCR0,
 * and the kernel's permission for it (arch_prctl ARCH_REQ_XCOMP_PERM,
 * requested once per process, on the first call; thread-safe). */
bool dol_amx_available(void);

/* bf16 elements of x packed for T tokens of K inputs (hi and lo). */
size_t dol_amx_x_elems(int T, int K);

/* Pack token blocks tb0 .. tb1-1 of x ([T][K] f32 row-major) into xp
 * (dol_amx_x_elems(T, K) elements, the layout above). Blocks are
 * independent, so callers may split them over threads. */
void dol_amx_pack_x(uint16_t *xp, const float *x, int T, int K, int tb0, int tb1);

/* bf16 elements of one packed group of W rows (hi and lo): 2 * 16 * K. */
size_t dol_amx_w_elems(int K);

/* A group of m <= 16 rows of W, given as f32 rows ([m][K] row-major),
 * packed into wp (dol_amx_w_elems(K) elements). */
void dol_amx_w_from_f32(uint16_t *wp, const float *rows, int m, int K);

/* Rows n .. n+m-1 (m <= 16, n a multiple of 4) of a matrix of dtype F16 or
 * BF16 stored in the packed layout of cpu_kernels.h (Wp: the whole matrix,
 * K a multiple of 16), packed into wp. */
void dol_amx_w_from_packed(uint16_t *wp, const void *Wp, dol_dtype t, int n, int m, int K);

/* Rows n .. n+m-1 (m <= 16) of an NF4 matrix (K = W->cols a multiple of
 * 64) or a Q8_0 matrix (K a multiple of 32), each weight dequantized
 * exactly as dol_nf4_dequantize_block / dol_q8_dequantize_block give it,
 * packed into wp. */
void dol_amx_w_from_nf4(uint16_t *wp, const dol_nf4_matrix *W, int n, int m);
void dol_amx_w_from_q8(uint16_t *wp, const dol_q8_matrix *W, int n, int m);

/* out[t * N + n0 + r] = sum_k x[t][k] * W[r][k] for t < T, r < m (m <= 32),
 * in BF16x3; wp: one group of W rows (m <= 16) or two groups one after the
 * other (rows 0-15, then 16..m-1; each dol_amx_w_elems(K) elements), xp: x
 * packed (dol_amx_pack_x) for T tokens of K inputs. Two groups share each
 * load of x and two token blocks each load of W (2 x 2 tiles of C). Only
 * those columns of out are written. */
void dol_amx_product(float *out, int N, int n0, int m, const uint16_t *wp, const uint16_t *xp,
                     int T, int K);

/* ---- AMX-INT8: the 8-bit-activation products (cpu_i8.h) on the tile unit --
 *
 * Same operands as cpu_i8.h (x quantized per block of 32, weights as int8
 * with a scale, and a minimum, per half block), but each block's dot
 * product is one exact int32 from TDPBSSD (16 rows of W x 16 tokens x 32
 * inputs a tile product; 16 inputs per half for the formats whose halves
 * have their own scales), then per output and block, in block order:
 *   acc = fma((float)I_b, sw_b * d_b, acc) [acc = acc - mw_b * s_b],
 * with s_b = d_b * sum of the block's (or half's) quantized inputs. The
 * int8 path sums lanes of 4 products instead (cpu_i8.h): the two differ
 * in the float rounding only, by about nb * 2^-24 of sum |terms| per
 * output (tests/unit/test_cpu_amx.c), and are not the same bits, so this
 * path too is taken only when batch_invariant is false. (The formats of
 * the interleaved layout, cpu_r16.h, run their own tile products, with
 * decode's bits, by default.)
 *
 * x, packed by dol_amx_i8_pack_x: per block of 16 tokens (tb) and block of
 * 32 inputs (kc), 768 bytes at (tb * K/32 + kc) * 768: the tile unit's
 * second operand, input k of token t at (k % 32 / 4) * 64 + (t % 16) * 4 +
 * k % 4 (512 bytes), then four rows of 16 floats, one lane a token: d, the
 * scaled sums of inputs 0-15 and 16-31, and of all 32. Tokens past T are
 * zeros. Weights: dol_cpu_i8.decode16's layout (cpu_i8.h). */

struct dol_i8_act;

/* Whether AMX-INT8 runs here: dol_amx_available's checks (tile state
 * granted) plus AMX-INT8 in cpuid. Thread-safe. */
bool dol_amx_i8_available(void);

/* Bytes of x packed for T tokens of K inputs. */
size_t dol_amx_i8_x_bytes(int T, int K);

/* Token blocks tb0 .. tb1-1 of the quantized activations a (a->q, a->d;
 * T = a->T, K = a->K) packed into xp (dol_amx_i8_x_bytes bytes). Blocks
 * are independent, so callers may split them over threads. */
void dol_amx_i8_pack_x(uint8_t *xp, const struct dol_i8_act *a, int tb0, int tb1);

/* out[t * N + n0 + r] for t < T, r < m (m <= 16): one decoded group of W
 * rows (wq, sw, mw from decode16, whose flags are `flags`) against x
 * packed for T tokens of K inputs, by the arithmetic above. */
void dol_amx_i8_product(float *out, int N, int n0, int m, const int8_t *wq, const float *sw,
                        const float *mw, int flags, const uint8_t *xp, int T, int K);

#endif
