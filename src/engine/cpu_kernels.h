/* src/engine/cpu_kernels.h — the per-ISA kernel sets of the CPU backend and
 * their run-time selection (internal to the engine, its tests and tools).
 *
 * The kernels are written once and compiled several times, each time with
 * other instruction-set flags: src/engine/cpu_kernels.c assembles the table
 * from the files that own the arithmetic (cpu_k_matmul.c the F32/F16/BF16
 * and packed products, cpu_k_qmatmul.c the NF4 / Q8_0 products and panels,
 * cpu_k_elementwise.c, cpu_k_attn.c, cpu_k_quantize.c, cpu_k_hash.c; the
 * SIMD shim cpu_simd.h, the internal interface cpu_k.h), and every
 * compilation exports one dol_cpu_kernels table:
 *
 *   portable  no extra flags; plain C, the reference (one accumulator,
 *             k order)
 *   avx2      -mavx2 -mfma -mf16c; 8-lane FMA accumulators     (x86-64 only)
 *   avx512    -mavx512f -mavx512bw -mavx512dq -mavx512vl + the avx2 flags;
 *             16-lane FMA accumulators                          (x86-64 only)
 *
 * cpu_ops.c (task planning, the thread pool, embedding and conversions)
 * calls through the table selected at first use: the widest set this CPU
 * and OS support, unless the environment variable DOLPHIN_CPU_KERNELS
 * (portable | avx2 | avx512 | auto) names another supported one.
 *
 * Contract of every table entry, for every variant:
 *   - float32 arithmetic, no fused multiply-add outside the documented
 *     vector accumulators (the sources are compiled with -ffp-contract=off);
 *   - the summation order of one output element of dot / matmul_rows /
 *     nf4_rows / q8_rows is fixed by the variant alone (cpu_ops.h: one lane-wide
 *     accumulator along k, a horizontal sum, the scalar tail), never by T,
 *     by n0 / n1 or by the position of the element in a register tile; so
 *     within one variant results are batch-invariant bit for bit. Two
 *     variants differ only by rounding (different lane counts);
 *   - pointers are not required to be aligned; outputs must not alias
 *     inputs unless an entry says so. */
#ifndef DOLPHIN_ENGINE_CPU_KERNELS_H
#define DOLPHIN_ENGINE_CPU_KERNELS_H

#include "dolphin/engine.h"
#include "dolphin/model.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/nf4.h"
#include "engine/q8.h"

typedef struct dol_cpu_kernels {
    /* "portable", "avx2" or "avx512". */
    const char *name;
    /* Lanes of the vector accumulator of one dot product (1 = scalar). */
    int lanes;

    /* sum_k x[k] * w[k] for k < n; w holds n weights of dtype wtype
     * (F32, F16 or BF16). The exact order used for every element of
     * matmul_rows. n >= 0 (0 gives 0). */
    float (*dot)(const float *x, const void *w, dol_dtype wtype, int n);

    /* out[t][n] = dot(x[t], W[n], K) for t < T and n0 <= n < n1.
     * x: [T][K] f32; W: N rows of K elements of dtype wtype (F32/F16/BF16);
     * out: [T][N] f32 (row stride N), only the columns n0..n1-1 are written.
     * Requires 0 <= n0 <= n1 <= N, T >= 1, K >= 1. */
    void (*matmul_rows)(float *out, const float *x, int T, int K, const void *W,
                        dol_dtype wtype, int N, int n0, int n1);

    /* The same product over W in the packed layout (below, dol_cpu_pack):
     * out[t][n] = dot(x[t], row n of W, K) for t < T and n0 <= n < n1, with
     * exactly the bits of matmul_rows over the row-major W. n0 must be a
     * multiple of DOL_PACK_ROWS; N is the number of real rows. */
    void (*matmul_packed_rows)(float *out, const float *x, int T, int K, const void *Wp,
                               dol_dtype wtype, int N, int n0, int n1);

    /* The same over NF4 weights: out[t][n] for t < T and n0 <= n < n1, with
     * K = W->cols (even), N = W->rows the row stride of out. Order of each
     * element: the full 64-weight blocks in k order into the accumulator,
     * the horizontal sum, then the short last block (K % 64 weights) in
     * scalar k order (nf4.h, cpu_ops.h). */
    void (*nf4_rows)(float *out, const float *x, int T, const dol_nf4_matrix *W, int n0,
                     int n1);

    /* The same over Q8_0 weights (q8.h), K = W->cols (any), N = W->rows:
     * each weight dequantized in registers to q * d (exact), the full
     * 32-weight blocks in k order into the accumulator, the horizontal sum,
     * then the short last block (K % 32 weights) in scalar k order. */
    void (*q8_rows)(float *out, const float *x, int T, const dol_q8_matrix *W, int n0, int n1);

    /* Rows n .. n+m-1 of W dequantized into tile, each weight exactly as
     * dol_nf4_dequantize_block / dol_q8_dequantize_block give it: packed,
     * [ceil(m / DOL_PACK_ROWS) * DOL_PACK_ROWS][K] f32 in the packed layout
     * below (the rows past m zero); else row-major [m][K] f32. K = W->cols
     * must be a whole number of blocks (and a block a whole number of
     * DOL_PACK_K chunks): then matmul_packed_rows / matmul_rows over the
     * tile give nf4_rows' / q8_rows' bits, which is how products of several
     * rows of x run (cpu_ops.c). */
    void (*nf4_panel)(const dol_nf4_matrix *W, int n, int m, bool packed, float *tile);
    void (*q8_panel)(const dol_q8_matrix *W, int n, int m, bool packed, float *tile);
    /* The same for a matrix of a GGUF block type t (ggml_blocks.h): rows
     * n .. n+m-1 of W, whose row r starts at W + r * row_bytes, each
     * weight exactly dol_blk_weight's (the same bits in every variant);
     * K a multiple of the type's block. matmul_rows / matmul_packed_rows
     * over the tile are then the whole product (cpu_ops.c). */
    void (*blk_panel)(dol_dtype t, const void *W, size_t row_bytes, int n, int m, int K,
                      bool packed, float *tile);

    /* Element-wise kernels, as documented in cpu_ops.h
     * (dol_cpu_rmsnorm_rows, dol_cpu_rope, dol_cpu_silu_mul); the same
     * expressions in every variant, compiled with that variant's flags. */
    void (*rmsnorm)(float *out, const float *x, const float *w, int rows, int n, float eps);
    void (*rope)(float *x, int n_heads, int head_dim, const float *cos_row,
                 const float *sin_row);
    void (*silu_mul)(float *out, const float *gate, const float *up, int n);

    /* Causal attention of one query head over positions 0..n-1 (n >= 1) of
     * one sequence in the paged KV cache of the CPU backend (cpu_engine.c).
     * Position p is row p % bs of block table[p / bs]; this head's K run of
     * block b starts at k_base + b * block_bytes, its V run at v_base +
     * b * block_bytes (bytes). The K half is kt, the V half vt: F32, F16 or
     * Q8_0 (include/dolphin/kv_q8.h: B = dol_kv_q8_block(head_dim) values
     * a block, never AUTO; head_dim even, so the F16 scales are aligned).
     * Within a run, keys are dims-major, values
     * rows-major:
     *   F32 / F16 K: element [i * bs + r] is dimension i of row r
     *   Q8_0 K:      int8 [i * bs + r], then F16 scales [j * bs + r] for
     *                block j of row r, from byte head_dim * bs
     *   F32 / F16 V: element [r * head_dim + i]
     *   Q8_0 V:      int8 [r * head_dim + i], then F16 scales
     *                [r * (head_dim / B) + j], from byte bs * head_dim
     * Scores, softmax, values:
     *   s_p   = scale * (sum over i ascending of q[i] * k_p[i], one fused
     *           multiply-add per i); Q8_0: a_j = that sum over block j on
     *           the int8 values, s_p = scale * (sum over j ascending of
     *           a_j * d_j, one fused multiply-add per j)
     *   e_p   = exp(s_p - max_p s_p), by the kernels' own exp (Cody-Waite
     *           reduction and a degree-7 polynomial, within 2 ulp of expf;
     *           scalar and vector forms perform the same operations)
     *   out[i] = (sum over p ascending of w_p * v_p[i], one fused
     *            multiply-add per p) * (1 / sum over p ascending of e_p),
     *            w_p = e_p (F32 / F16) or e_p * d_p (Q8_0: the scale of the
     *            block of row p holding i) and v_p[i] the int8 value
     * (scaled dot-product attention, Vaswani et al. 2017, with the usual
     * max subtraction). F16 and the scales are widened to f32 exactly.
     * Every variant computes exactly these operations in this order, so
     * the result is the same bits in every variant; the SIMD ones vectorize
     * across positions (scores) and dimensions (values), never within one
     * sum. The keys dims-major is what lets the scores of DOL_SIMD
     * positions come from head_dim broadcast FMAs with no horizontal sums.
     * scratch: at least n rounded up to bs floats; out: head_dim floats.
     * Rows >= n of the last block may hold anything (they are read and
     * ignored). */
    void (*attn_head)(const float *q, int head_dim, int n, const void *k_base, const void *v_base,
                      dol_kv_dtype kt, dol_kv_dtype vt, const int32_t *table, int bs,
                      size_t block_bytes, float scale, float *scratch, float *out);

    /* Load-time quantization of rows r0 .. r1-1 of src (a row-major
     * [m->rows][m->cols] matrix of dtype t: F32, F16 or BF16) into m's
     * codes and scales, every block exactly as nf4.h / q8.h define it:
     * the same bytes in every variant, and the same as the float64
     * reference of those headers (tests/unit/test_quant_fast.c checks
     * both). 0, or -1 when a block cannot be quantized (NaN, or a scale
     * beyond F16); the rows after that block are then left unwritten. */
    int (*nf4_quantize_rows)(const void *src, dol_dtype t, const dol_nf4_matrix *m, int64_t r0,
                             int64_t r1);
    int (*q8_quantize_rows)(const void *src, dol_dtype t, const dol_q8_matrix *m, int64_t r0,
                            int64_t r1);

    /* XXH3-64 (seed 0) of the n bytes at p: the value libxxhash's
     * XXH3_64bits gives, computed with this variant's vectors (xxHash's
     * header, inlined); the prepared-weights cache checks its arrays
     * with it (weights_cache.h). */
    uint64_t (*xxh3)(const void *p, size_t n);
} dol_cpu_kernels;

/* Packed weights. A decode step streams every weight once, so the product
 * must read W as one sequential stream: W (N rows of K, row-major) is
 * rearranged at load time into panels of DOL_PACK_ROWS rows (the register
 * tile's height), panel p holding rows 4p .. 4p+3 in DOL_PACK_ROWS * K
 * elements: first, for each chunk of DOL_PACK_K weights (k < Kc =
 * K - K % DOL_PACK_K), the chunk of row 0, of row 1, of row 2, of row 3
 * (4 * 16 consecutive elements); then the last K - Kc weights of rows 0..3,
 * one row after the other. The rows after N in the last panel are zero. The
 * same layout serves every variant (an 8-lane set reads a chunk as two
 * vectors); element (n, k) is at dol_cpu_packed_index. */
#define DOL_PACK_ROWS 4
#define DOL_PACK_K 16

static inline size_t dol_cpu_packed_index(int n, int k, int K)
{
    const int kc = K - K % DOL_PACK_K;
    size_t base = (size_t)(n / DOL_PACK_ROWS) * DOL_PACK_ROWS * (size_t)K;
    int r = n % DOL_PACK_ROWS;
    if (k < kc)
        return base + (size_t)(k / DOL_PACK_K) * DOL_PACK_ROWS * DOL_PACK_K +
               (size_t)r * DOL_PACK_K + (size_t)(k % DOL_PACK_K);
    return base + (size_t)kc * DOL_PACK_ROWS + (size_t)r * (K - kc) + (size_t)(k - kc);
}

/* Elements of the packed form of an N x K matrix (N rounded up to whole
 * panels). */
static inline size_t dol_cpu_packed_elems(int N, int K)
{
    return (size_t)((N + DOL_PACK_ROWS - 1) / DOL_PACK_ROWS) * DOL_PACK_ROWS * (size_t)K;
}

/* The tables (cpu_kernels.c). The avx2 / avx512 ones exist only where
 * CMake built those variants (x86-64); use dol_cpu_kernels_find. */
extern const dol_cpu_kernels dol_cpu_kernels_portable;
extern const dol_cpu_kernels dol_cpu_kernels_avx2;
extern const dol_cpu_kernels dol_cpu_kernels_avx512;

/* The set in use; the first call (thread-safe) chooses it: DOLPHIN_CPU_KERNELS
 * when it names a set this CPU supports (else one line on stderr), otherwise
 * the widest supported (avx512, then avx2, then portable). Never NULL. */
const dol_cpu_kernels *dol_cpu_kernels_get(void);

/* Use the set called `name` from now on (for tests and benchmarks; calls
 * already running finish with the set they started with). 0, or -1 when the
 * name is unknown or this CPU / build lacks it (the selection is unchanged). */
int dol_cpu_kernels_set(const char *name);

/* The set called `name`, or NULL when the name is unknown or the set is not
 * usable here (not built for this architecture, or the CPU / OS lacks it). */
const dol_cpu_kernels *dol_cpu_kernels_find(const char *name);

#endif
