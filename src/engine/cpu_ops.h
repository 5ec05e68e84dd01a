/* src/engine/cpu_ops.h — the CPU reference kernels of the forward pass:
 * matrix products over F32/F16/BF16/NF4 weights, RMSNorm, RoPE, SiLU-gated
 * product, embedding lookup. float32 arithmetic (RMSNorm's sum of squares
 * in double). The arithmetic comes from the kernel set chosen at run time
 * for this CPU (portable C, AVX2 or AVX-512: cpu_kernels.h;
 * DOLPHIN_CPU_KERNELS overrides the choice).
 * Q8_0 (int8) weights go through the same products (dol_cpu_weight.q8,
 * dol_cpu_matmul_q8).
 * Within one kernel set each output element is computed by the same
 * instruction sequence whatever the batch size or the thread split, so
 * results are batch-invariant bit for bit; two sets differ by rounding only.
 * These are also the references that the CUDA kernels are tested against.
 *
 * The summation order of a dot product, for every caller and batch size:
 * one accumulator of DOL_SIMD lanes (the set's width: 16 for avx512, 8 for
 * avx2, 1 for portable) along k in steps of DOL_SIMD, a horizontal sum,
 * then the scalar tail in k order. */
#ifndef DOLPHIN_ENGINE_CPU_OPS_H
#define DOLPHIN_ENGINE_CPU_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "dolphin/model.h"
#include "engine/nf4.h"
#include "engine/q8.h"
#include "engine/threadpool.h"

/* out[t][n] = sum_k x[t][k] * W[n][k]  for t < T, n < N, k < K.
 * x: [T][K] f32 row-major; W: N rows of K elements (dtype F32, F16 or BF16,
 * or a GGUF block type: dol_cpu_weight_is_blk below);
 * out: [T][N] f32 row-major (must not alias x). Parallel over N on pool. */
void dol_cpu_matmul(dol_pool *pool, float *out, const float *x, int T, int K,
                    const void *W, dol_dtype wtype, int N);

/* The same product over NF4 weights (nf4.h): W is N = W->rows rows of
 * K = W->cols weights. The codes are dequantized in registers inside the dot
 * product (a 16-entry table of levels x block scale, indexed by the 4-bit
 * codes); no dequantized copy of W is made. Each output element's order is
 * fixed: one DOL_SIMD-lane accumulator over the full 64-weight blocks in k
 * order, a horizontal sum, then the short last block (when K % 64 != 0) in
 * scalar k order; so results are batch-invariant bit for bit, like
 * dol_cpu_matmul's. Parallel over N on pool. */
void dol_cpu_matmul_nf4(dol_pool *pool, float *out, const float *x, int T,
                        const dol_nf4_matrix *W);

/* The same product over Q8_0 weights (q8.h), dequantized in registers; the
 * order of cpu_kernels.h's q8_rows (32-weight blocks into one DOL_SIMD-lane
 * accumulator, horizontal sum, then the short last block in k order), so
 * batch-invariant bit for bit. Parallel over N on pool. */
void dol_cpu_matmul_q8(dol_pool *pool, float *out, const float *x, int T,
                       const dol_q8_matrix *W);

/* Scratch of the products on AMX (cpu_amx.h): x converted once per product
 * to bf16 hi/lo tiles (BF16x3) or, quantized, to int8 tiles (AMX-INT8). A
 * weight that points at one lets products of DOL_CPU_FAST_MIN_T rows of x or
 * more take the tile unit when K is a multiple of 32: in AMX-INT8 when every
 * weight of the product runs on 8-bit activations (i8 below) and the CPU
 * has AMX-INT8, else in BF16x3 for F16, BF16, NF4 or Q8_0 weights on a CPU
 * with AMX-BF16 (F32 weights always take the exact kernels). BF16x3 is
 * within about 2^-16 sum |x w| of the exact kernels, AMX-INT8 within about
 * K/32 * 2^-24 sum |terms| of the int8 kernels, but neither gives their
 * bits, so outputs are then no longer batch-invariant: the engine passes
 * it only when batch_invariant is off (docs/configuration.md). Owned by
 * the caller; one product at a time. */
typedef struct {
    uint16_t *x;
    size_t cap;  /* bf16 elements at x */
    uint8_t *x8; /* x quantized and packed for AMX-INT8 (cpu_amx.h) */
    size_t cap8; /* bytes at x8 */
} dol_cpu_fast;

#define DOL_CPU_FAST_MIN_T 16

/* Size f->x for products of up to T rows of K inputs (grows, never
 * shrinks). 0, or -1 when out of memory (f unchanged). */
int dol_cpu_fast_reserve(dol_cpu_fast *f, int T, int K);
void dol_cpu_fast_free(dol_cpu_fast *f);

/* A weight matrix of a linear layer as the matrix products read it: N rows
 * (out_features) of K weights (in_features), either F32/F16/BF16 rows at w
 * (nf4 == NULL) or NF4 (nf4 != NULL; w and wtype are then ignored). */
typedef struct {
    const void *w;
    dol_dtype wtype;
    const dol_nf4_matrix *nf4;
    int N, K;
    bool packed; /* w is in the packed layout of cpu_kernels.h (dol_cpu_pack) */
    const dol_q8_matrix *q8; /* non-NULL: Q8_0 weights (q8.h); w, wtype, nf4 ignored */
    dol_cpu_fast *fast;      /* non-NULL: products on AMX allowed (above) */
    size_t row_bytes;        /* wtype a GGUF block type (ggml_blocks.h; nf4, q8 NULL,
                              * not packed): row n of the blocks is at w + n * row_bytes */
    struct dol_i8_act *i8;   /* non-NULL (NF4, Q8_0 or a block type, K a multiple of 32):
                              * the product runs on 8-bit activations (cpu_i8.h) when the
                              * CPU has an int8 kernel set, x quantized into this scratch
                              * (the caller's, one product at a time); not the exact
                              * product's bits, but still batch-invariant */
    const struct dol_i8_r16 *r16; /* non-NULL (with i8): the rows also in the interleaved
                                   * layout (cpu_r16.h), which every product then reads;
                                   * the other arrays may be gone */
    bool r16_amx;                 /* its products of 16 or more rows of x on AMX-INT8 */
} dol_cpu_weight;

/* Whether w is a matrix of a GGUF block type, read where it is: every
 * product dequantizes groups of its rows into an F32 tile (the kernel set's
 * blk_panel, exactly dol_blk_weight) and runs the F32 kernels on the tile,
 * so each output is dot(x, dequantized row) in the F32 order above, for
 * every T and thread split (batch-invariant bit for bit). */
static inline bool dol_cpu_weight_is_blk(const dol_cpu_weight *w)
{
    return !w->nf4 && !w->q8 && !w->packed && dol_dtype_is_block(w->wtype);
}

/* Rearrange W (N rows of K elements of dtype src_t, row-major) into the
 * packed layout of cpu_kernels.h (panels of 4 rows, chunks of 16 weights) at
 * dst, converting to dst_t on the way: F32 from F32/F16/BF16, F16 from
 * F32/F16/BF16 (round to nearest even), BF16 from BF16 only. dst holds
 * dol_cpu_packed_elems(N, K) elements of dst_t; the padding rows of the last
 * panel are zeroed. Panels are spread over pool (NULL = this thread).
 * Returns 0, or -1 for an unsupported conversion. */
int dol_cpu_pack(dol_pool *pool, void *dst, dol_dtype dst_t, const void *src, dol_dtype src_t,
                 int N, int K);

/* Several products of one input in a single parallel job (one dispatch of
 * the pool, the threads balancing over the rows of all of them):
 * out[i][t][n] = sum_k x[t][k] * W[i].row n [k] for i < n_w (all W[i].K
 * equal to K). Used for the Q, K and V projections. Each element is
 * exactly what dol_cpu_matmul / dol_cpu_matmul_nf4 give. */
void dol_cpu_matmul_multi(dol_pool *pool, const float *x, int T, int K,
                          const dol_cpu_weight *W, float *const *out, int n_w);

/* Residual product: acc[t][n] += (x W^T)[t][n], the product first written
 * to tmp ([T][W->N] scratch) by the same task that then adds it, while it is
 * in cache. Same bits as dol_cpu_matmul into tmp followed by the addition. */
void dol_cpu_matmul_add(dol_pool *pool, float *acc, float *tmp, const float *x, int T, int K,
                        const dol_cpu_weight *W);

/* Product whose rows go to separate buffers: rows[t][n] = (x W^T)[t][n]
 * for t < T, n < W->N, each task copying the columns it computed out of tmp
 * ([T][W->N] scratch) while they are in cache, in parallel, instead of the
 * caller copying T rows afterwards (the logits of a decode batch: T rows of
 * vocab floats, each to its own sequence). Same bits as dol_cpu_matmul. */
void dol_cpu_matmul_scatter(dol_pool *pool, float *const *rows, float *tmp, const float *x, int T,
                            int K, const dol_cpu_weight *W);

/* SwiGLU (Shazeer 2020) fused with its two products: h[t][n] =
 * silu(g) * u, g = (x Wg^T)[t][n], u = (x Wu^T)[t][n], each task doing the
 * columns it computed. h and u_tmp: [T][N] (N = gate->N = up->N). Same bits
 * as the two products followed by dol_cpu_silu_mul. */
void dol_cpu_swiglu(dol_pool *pool, float *h, float *u_tmp, const float *x, int T, int K,
                    const dol_cpu_weight *gate, const dol_cpu_weight *up);

/* Dot product of n floats x with n weights of dtype wtype; the exact
 * summation order used by dol_cpu_matmul. */
float dol_cpu_dot(const float *x, const void *w, dol_dtype wtype, int n);

/* RMSNorm (Zhang & Sennrich 2019): out = x / sqrt(mean(x^2) + eps) * w,
 * over one row of n floats. out may alias x. */
void dol_cpu_rmsnorm(float *out, const float *x, const float *w, int n, float eps);

/* The same over `rows` consecutive rows: x and out are [rows][n]; row r of
 * out is bit for bit what dol_cpu_rmsnorm gives for row r of x (several
 * rows' sums of squares are accumulated side by side). out may alias x. */
void dol_cpu_rmsnorm_rows(float *out, const float *x, const float *w, int rows, int n,
                          float eps);

/* RoPE (Su et al. 2021) in the Hugging Face layout: within each head of
 * head_dim values, element i pairs with i + head_dim/2 ("rotate_half").
 * x: n_heads * head_dim floats of one token, rotated in place by the angles
 * of position `pos`; cos/sin tables are [pos][head_dim/2]. */
void dol_cpu_rope(float *x, int n_heads, int head_dim, const float *cos_row,
                  const float *sin_row);

/* out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x)). out may alias gate. */
void dol_cpu_silu_mul(float *out, const float *gate, const float *up, int n);

/* Copy row `id` of an embedding table [vocab][d] (any dtype) to out[d] as f32. */
void dol_cpu_embed_row(float *out, const dol_tensor *table, int32_t id);

/* Convert n elements of dtype t at src to f32. */
void dol_cpu_to_f32(float *dst, const void *src, dol_dtype t, int64_t n);

#endif
