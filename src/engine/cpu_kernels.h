/* src/engine/cpu_kernels.h — the per-ISA kernel sets of the CPU backend and
 * their run-time selection (internal to the engine, its tests and tools).
 *
 * src/engine/cpu_kernels.c is written once and compiled several times, each
 * time with other instruction-set flags; every compilation exports one
 * dol_cpu_kernels table:
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
 *     nf4_rows is fixed by the variant alone (cpu_ops.h: one lane-wide
 *     accumulator along k, a horizontal sum, the scalar tail), never by T,
 *     by n0 / n1 or by the position of the element in a register tile; so
 *     within one variant results are batch-invariant bit for bit. Two
 *     variants differ only by rounding (different lane counts);
 *   - pointers are not required to be aligned; outputs must not alias
 *     inputs unless an entry says so. */
#ifndef DOLPHIN_ENGINE_CPU_KERNELS_H
#define DOLPHIN_ENGINE_CPU_KERNELS_H

#include "dolphin/model.h"
#include "engine/nf4.h"

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

    /* The same over NF4 weights: out[t][n] for t < T and n0 <= n < n1, with
     * K = W->cols (even), N = W->rows the row stride of out. Order of each
     * element: the full 64-weight blocks in k order into the accumulator,
     * the horizontal sum, then the short last block (K % 64 weights) in
     * scalar k order (nf4.h, cpu_ops.h). */
    void (*nf4_rows)(float *out, const float *x, int T, const dol_nf4_matrix *W, int n0,
                     int n1);

    /* Element-wise kernels, as documented in cpu_ops.h (dol_cpu_rmsnorm,
     * dol_cpu_rope, dol_cpu_silu_mul); the same expressions in every
     * variant, compiled with that variant's flags. */
    void (*rmsnorm)(float *out, const float *x, const float *w, int n, float eps);
    void (*rope)(float *x, int n_heads, int head_dim, const float *cos_row,
                 const float *sin_row);
    void (*silu_mul)(float *out, const float *gate, const float *up, int n);
} dol_cpu_kernels;

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
