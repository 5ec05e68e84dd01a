/* src/engine/cpu_k_qmatmul.c — the CPU kernels' matrix products over
 * block-quantized weights: NF4 (nf4.h) and Q8_0 (q8.h), each weight
 * dequantized in registers, and the panels of dequantized rows
 * (nf4_panel, q8_panel) that the products of several rows of x run on
 * (cpu_ops.c). Compiled once per variant (cpu_k.h); exports
 * DOL_K(nf4_rows), DOL_K(q8_rows), DOL_K(nf4_panel) and DOL_K(q8_panel),
 * everything else file-static. The order of each output:
 * cpu_kernels.h; the design: docs/performance.md. */
#include "engine/cpu_k.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- matrix product over NF4 weights ------------------------------------ */

/* The dequantization of block b of row `row` of a block-quantized matrix W
 * into out; returns the block's length (dol_nf4_dequantize_block, ...). */
typedef int (*dequant_block_fn)(const void *W, int64_t row, int64_t b, float *out);
_Static_assert(DOL_NF4_BLOCK <= 64 && DOL_Q8_BLOCK <= 64, "dot_blocks holds a block of <= 64");

/* Sum x[k] * w[k] over blocks b0 .. bpr - 1 (of `block` <= 64 weights) of row
 * `row` of W in k order, each block dequantized to floats first by deq: the
 * whole product in the portable variant, the short last block of a row in
 * the SIMD ones. */
static inline float dot_blocks(const float *x, const void *W, dequant_block_fn deq, int block,
                               int64_t bpr, int64_t row, int64_t b0, float sum)
{
    float w[64];
    for (int64_t b = b0; b < bpr; b++) {
        int n = deq(W, row, b, w);
        const float *xb = x + b * block;
        for (int j = 0; j < n; j++) sum += xb[j] * w[j];
    }
    return sum;
}

static int nf4_dequant_block(const void *W, int64_t row, int64_t b, float *out)
{
    return dol_nf4_dequantize_block(W, row, b, out);
}

/* dot_blocks over NF4 weights. */
static float nf4_dot_blocks(const float *x, const dol_nf4_matrix *W, int64_t row, int64_t b0,
                            float sum)
{
    return dot_blocks(x, W, nf4_dequant_block, DOL_NF4_BLOCK, W->blocks_per_row, row, b0, sum);
}

#ifdef DOL_SIMD
/* In-register dequantization. A block's 64 codes are 32 bytes: byte j holds
 * weight j (low nibble) and weight j + 32 (high nibble), see nf4.h. Vector
 * s of a block (s = 0 .. 64/DOL_SIMD - 1) covers weights s*DOL_SIMD ..
 * s*DOL_SIMD + DOL_SIMD-1: the low nibbles of bytes (s*DOL_SIMD) % 32 .. for
 * the first half of the block, the high nibbles of the same bytes for the
 * second. Widening those bytes to 32-bit lanes gives table indices; the
 * table holds the 16 levels times the block's scale, so each lane becomes
 * exactly dol_nf4_levels[code] * scale, as dol_nf4_dequantize_block says. */
#if DOL_SIMD == 16
typedef __m512 nf4_lut; /* levels * scale, one lane per code */
static inline nf4_lut nf4_lut_make(uint16_t scale)
{
    vecf s = _mm512_set1_ps(_cvtsh_ss(scale));
    return _mm512_mul_ps(_mm512_loadu_ps(dol_nf4_levels), s);
}
static inline vecf nf4_decode(const uint8_t *codes, int s, nf4_lut lut)
{
    __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + (s & 1) * 16)));
    if (s >= 2) idx = _mm512_srli_epi32(idx, 4);
    return _mm512_permutexvar_ps(idx, lut); /* uses the low 4 bits of each lane */
}
#define NF4_NC 4 /* W rows per register tile */
#else
typedef struct {
    __m256 lo, hi; /* levels 0..7 and 8..15, times the scale */
} nf4_lut;
static inline nf4_lut nf4_lut_make(uint16_t scale)
{
    __m256 s = _mm256_set1_ps(_cvtsh_ss(scale));
    return (nf4_lut){ _mm256_mul_ps(_mm256_loadu_ps(dol_nf4_levels), s),
                      _mm256_mul_ps(_mm256_loadu_ps(dol_nf4_levels + 8), s) };
}
static inline vecf nf4_decode(const uint8_t *codes, int s, nf4_lut lut)
{
    __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + (s & 3) * 8)));
    if (s >= 4) idx = _mm256_srli_epi32(idx, 4);
    __m256 lo = _mm256_permutevar8x32_ps(lut.lo, idx); /* uses the low 3 bits */
    __m256 hi = _mm256_permutevar8x32_ps(lut.hi, idx);
    __m256 bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)); /* code bit 3 -> sign */
    return _mm256_blendv_ps(lo, hi, bit3);
}
#define NF4_NC 2 /* fewer registers: 16 ymm */
#endif

/* Register tile: NR rows of x against NC rows of W (rows n .. n+NC-1); the
 * codes of each block are decoded once for all NR rows of x. Every output
 * follows the order documented in cpu_ops.h, whatever NR and NC are. */
static inline __attribute__((always_inline)) void
nf4_tile(const int NR, const int NC, const float *x, int K, const dol_nf4_matrix *W, int n,
         float *out, int N)
{
    const int64_t row_bytes = K / 2, bpr = W->blocks_per_row;
    const int64_t full = K / DOL_NF4_BLOCK; /* blocks of 64 */
    vecf acc[4][NF4_NC];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) acc[r][c] = v_zero();
    for (int64_t b = 0; b < full; b++) {
        nf4_lut lut[NF4_NC];
        const uint8_t *codes[NF4_NC];
        for (int c = 0; c < NC; c++) {
            lut[c] = nf4_lut_make(W->scales[(n + c) * bpr + b]);
            codes[c] = W->codes + (n + c) * row_bytes + b * (DOL_NF4_BLOCK / 2);
            if (b % 2 == 0) /* rows two tiles ahead: one cache line per two blocks */
                _mm_prefetch((const char *)codes[c] + 2 * NC * row_bytes, _MM_HINT_T0);
        }
        for (int s = 0; s < DOL_NF4_BLOCK / DOL_SIMD; s++) {
            const int64_t k = b * DOL_NF4_BLOCK + s * DOL_SIMD;
            vecf w[NF4_NC];
            for (int c = 0; c < NC; c++) w[c] = nf4_decode(codes[c], s, lut[c]);
            for (int r = 0; r < NR; r++) {
                vecf xv = v_in_register(v_load(x + (size_t)r * K + k));
                for (int c = 0; c < NC; c++) acc[r][c] = v_fma(xv, w[c], acc[r][c]);
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++)
            out[(size_t)r * N + n + c] =
                nf4_dot_blocks(x + (size_t)r * K, W, n + c, full, v_sum(acc[r][c]));
}

/* The tiles used: NR = 1..4 rows of x against NF4_NC rows of W ("wide"), or
 * against one row of W for the last rows ("narrow"). */
#define DEFINE_NF4_TILE(NAME, NR, NC)                                                          \
    static void NAME(const float *x, int K, const dol_nf4_matrix *W, int n, float *out, int N) \
    {                                                                                          \
        nf4_tile(NR, NC, x, K, W, n, out, N);                                                  \
    }
DEFINE_NF4_TILE(nf4_wide_1, 1, NF4_NC)
DEFINE_NF4_TILE(nf4_wide_2, 2, NF4_NC)
DEFINE_NF4_TILE(nf4_wide_3, 3, NF4_NC)
DEFINE_NF4_TILE(nf4_wide_4, 4, NF4_NC)
DEFINE_NF4_TILE(nf4_narrow_1, 1, 1)
DEFINE_NF4_TILE(nf4_narrow_2, 2, 1)
DEFINE_NF4_TILE(nf4_narrow_3, 3, 1)
DEFINE_NF4_TILE(nf4_narrow_4, 4, 1)

typedef void (*nf4_tile_fn)(const float *, int, const dol_nf4_matrix *, int, float *, int);
static const nf4_tile_fn nf4_wide[5] = { NULL, nf4_wide_1, nf4_wide_2, nf4_wide_3, nf4_wide_4 };
static const nf4_tile_fn nf4_narrow[5] = { NULL, nf4_narrow_1, nf4_narrow_2, nf4_narrow_3,
                                           nf4_narrow_4 };
#endif

void DOL_K(nf4_rows)(float *out, const float *x, int T, const dol_nf4_matrix *W, int n0, int n1)
{
    const int K = (int)W->cols, N = (int)W->rows;
#ifdef DOL_SIMD
    for (int n = n0; n < n1;) {
        int nc = n + NF4_NC <= n1 ? NF4_NC : 1;
        const nf4_tile_fn *tile = nc == NF4_NC ? nf4_wide : nf4_narrow;
        for (int t = 0; t < T; t += 4) {
            int nr = T - t < 4 ? T - t : 4;
            tile[nr](x + (size_t)t * K, K, W, n, out + (size_t)t * N, N);
        }
        n += nc;
    }
#else
    for (int n = n0; n < n1; n++)
        for (int t = 0; t < T; t++)
            out[(size_t)t * N + n] = nf4_dot_blocks(x + (size_t)t * K, W, n, 0, 0.0f);
#endif
}

/* The tiles of nf4_panel / q8_panel (cpu_kernels.h): rows to fill (packed:
 * up to a whole panel), where row r starts, and a dequantized block b of
 * `block` weights stored into row `row` as DOL_PACK_K-weight chunks. */
static inline int tile_rows(int m, bool packed)
{
    return packed ? (m + DOL_PACK_ROWS - 1) / DOL_PACK_ROWS * DOL_PACK_ROWS : m;
}

static inline float *tile_row(float *tile, int64_t K, int r, bool packed)
{
    if (!packed) return tile + (size_t)r * (size_t)K;
    return tile + (size_t)(r / DOL_PACK_ROWS) * DOL_PACK_ROWS * (size_t)K +
           (size_t)(r % DOL_PACK_ROWS) * DOL_PACK_K;
}

static inline void tile_put_block(float *row, int64_t b, int block, bool packed, const float *w)
{
    const size_t chunk = packed ? DOL_PACK_ROWS * DOL_PACK_K : DOL_PACK_K;
    float *dst = row + (size_t)b * (size_t)(block / DOL_PACK_K) * chunk;
    for (int q = 0; q < block / DOL_PACK_K; q++)
        memcpy(dst + (size_t)q * chunk, w + q * DOL_PACK_K, sizeof(float) * DOL_PACK_K);
}

/* Rows n .. n+m-1 of W (K a whole number of NF4 blocks) dequantized into
 * tile: in the packed layout (cpu_kernels.h), rows past m up to the next
 * multiple of DOL_PACK_ROWS zero, or row-major [m][K]. Each weight exactly
 * level x scale, as dol_nf4_dequantize_block gives it (nf4_decode in the
 * SIMD variants). */
void DOL_K(nf4_panel)(const dol_nf4_matrix *W, int n, int m, bool packed, float *tile)
{
    const int64_t K = W->cols, bpr = W->blocks_per_row;
    for (int r = 0; r < tile_rows(m, packed); r++) {
        float *row = tile_row(tile, K, r, packed);
        for (int64_t b = 0; b < bpr; b++) {
            float w[DOL_NF4_BLOCK];
            if (r >= m) {
                memset(w, 0, sizeof w);
            } else {
#ifdef DOL_SIMD
                const nf4_lut lut = nf4_lut_make(W->scales[(n + r) * bpr + b]);
                const uint8_t *codes = W->codes + (n + r) * (K / 2) + b * (DOL_NF4_BLOCK / 2);
                for (int s = 0; s < DOL_NF4_BLOCK / DOL_SIMD; s++)
                    v_store(w + s * DOL_SIMD, nf4_decode(codes, s, lut));
#else
                dol_nf4_dequantize_block(W, n + r, b, w);
#endif
            }
            tile_put_block(row, b, DOL_NF4_BLOCK, packed, w);
        }
    }
}

/* ---- matrix product over Q8_0 (int8) weights ----------------------------- */

static int q8_dequant_block(const void *W, int64_t row, int64_t b, float *out)
{
    return dol_q8_dequantize_block(W, row, b, out);
}

/* dot_blocks over Q8_0 weights (q * d, exact). */
static float q8_dot_blocks(const float *x, const dol_q8_matrix *W, int64_t row, int64_t b0,
                           float sum)
{
    return dot_blocks(x, W, q8_dequant_block, DOL_Q8_BLOCK, W->blocks_per_row, row, b0, sum);
}

#ifdef DOL_SIMD
/* In-register dequantization: DOL_SIMD int8 values widened to 32-bit lanes,
 * converted to float and multiplied by the block's scale, so each lane is
 * exactly q * d, as dol_q8_dequantize_block says. */
#if DOL_SIMD == 16
static inline vecf q8_decode(const int8_t *q, vecf d)
{
    __m512i i = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(i), d);
}
#define Q8_NC 4 /* W rows per register tile */
#else
static inline vecf q8_decode(const int8_t *q, vecf d)
{
    __m256i i = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(i), d);
}
#define Q8_NC 2 /* fewer registers: 16 ymm */
#endif

/* Register tile: NR rows of x against NC rows of W (rows n .. n+NC-1), each
 * block's quants decoded once for all NR rows of x (FB = 0), or read already
 * decoded from wf ([NC][K] floats, q8_unpack; FB = 1): the same values, so
 * the same bits. Every output follows the order of cpu_kernels.h whatever
 * NR, NC and FB are. */
static inline __attribute__((always_inline)) void
q8_tile(const int NR, const int NC, const int FB, const float *x, int K, const dol_q8_matrix *W,
        const float *wf, int n, float *out, int N)
{
    const int64_t bpr = W->blocks_per_row;
    const int64_t full = K / DOL_Q8_BLOCK;
    vecf acc[4][Q8_NC];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) acc[r][c] = v_zero();
    for (int64_t b = 0; b < full; b++) {
        vecf d[Q8_NC];
        const int8_t *q[Q8_NC];
        if (!FB)
            for (int c = 0; c < NC; c++) {
                d[c] = v_set1(_cvtsh_ss(W->scales[(n + c) * bpr + b]));
                q[c] = W->quants + (int64_t)(n + c) * K + b * DOL_Q8_BLOCK;
                if (b % 2 == 0) /* rows two tiles ahead: one cache line per two blocks */
                    _mm_prefetch((const char *)q[c] + (int64_t)2 * NC * K, _MM_HINT_T0);
            }
        for (int s = 0; s < DOL_Q8_BLOCK / DOL_SIMD; s++) {
            const int64_t k = b * DOL_Q8_BLOCK + s * DOL_SIMD;
            vecf w[Q8_NC];
            for (int c = 0; c < NC; c++)
                w[c] = FB ? v_load(wf + (size_t)c * K + k) : q8_decode(q[c] + s * DOL_SIMD, d[c]);
            for (int r = 0; r < NR; r++) {
                vecf xv = v_in_register(v_load(x + (size_t)r * K + k));
                for (int c = 0; c < NC; c++) acc[r][c] = v_fma(xv, w[c], acc[r][c]);
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++)
            out[(size_t)r * N + n + c] =
                q8_dot_blocks(x + (size_t)r * K, W, n + c, full, v_sum(acc[r][c]));
}

#define DEFINE_Q8_TILE(NAME, NR, NC, FB)                                                   \
    static void NAME(const float *x, int K, const dol_q8_matrix *W, const float *wf, int n, \
                     float *out, int N)                                                     \
    {                                                                                       \
        q8_tile(NR, NC, FB, x, K, W, wf, n, out, N);                                        \
    }
DEFINE_Q8_TILE(q8_wide_1, 1, Q8_NC, 0)
DEFINE_Q8_TILE(q8_wide_2, 2, Q8_NC, 0)
DEFINE_Q8_TILE(q8_wide_3, 3, Q8_NC, 0)
DEFINE_Q8_TILE(q8_wide_4, 4, Q8_NC, 0)
DEFINE_Q8_TILE(q8_narrow_1, 1, 1, 0)
DEFINE_Q8_TILE(q8_narrow_2, 2, 1, 0)
DEFINE_Q8_TILE(q8_narrow_3, 3, 1, 0)
DEFINE_Q8_TILE(q8_narrow_4, 4, 1, 0)
DEFINE_Q8_TILE(q8b_wide_1, 1, Q8_NC, 1)
DEFINE_Q8_TILE(q8b_wide_2, 2, Q8_NC, 1)
DEFINE_Q8_TILE(q8b_wide_3, 3, Q8_NC, 1)
DEFINE_Q8_TILE(q8b_wide_4, 4, Q8_NC, 1)
DEFINE_Q8_TILE(q8b_narrow_1, 1, 1, 1)
DEFINE_Q8_TILE(q8b_narrow_2, 2, 1, 1)
DEFINE_Q8_TILE(q8b_narrow_3, 3, 1, 1)
DEFINE_Q8_TILE(q8b_narrow_4, 4, 1, 1)

typedef void (*q8_tile_fn)(const float *, int, const dol_q8_matrix *, const float *, int,
                           float *, int);
static const q8_tile_fn q8_wide[5] = { NULL, q8_wide_1, q8_wide_2, q8_wide_3, q8_wide_4 };
static const q8_tile_fn q8_narrow[5] = { NULL, q8_narrow_1, q8_narrow_2, q8_narrow_3,
                                         q8_narrow_4 };
static const q8_tile_fn q8b_wide[5] = { NULL, q8b_wide_1, q8b_wide_2, q8b_wide_3, q8b_wide_4 };
static const q8_tile_fn q8b_narrow[5] = { NULL, q8b_narrow_1, q8b_narrow_2, q8b_narrow_3,
                                          q8b_narrow_4 };

/* Rows n .. n+nc-1 of W, their full blocks decoded to floats (q8_decode:
 * exactly q * d) into wf[c][k]. */
static void q8_unpack(const dol_q8_matrix *W, int n, int nc, float *wf)
{
    const int K = (int)W->cols;
    const int64_t full = K / DOL_Q8_BLOCK, bpr = W->blocks_per_row;
    for (int c = 0; c < nc; c++)
        for (int64_t b = 0; b < full; b++) {
            const vecf d = v_set1(_cvtsh_ss(W->scales[(n + c) * bpr + b]));
            const int8_t *q = W->quants + (int64_t)(n + c) * K + b * DOL_Q8_BLOCK;
            for (int s = 0; s < DOL_Q8_BLOCK / DOL_SIMD; s++)
                v_store(wf + (size_t)c * K + b * DOL_Q8_BLOCK + s * DOL_SIMD,
                        q8_decode(q + s * DOL_SIMD, d));
        }
}

/* Largest K whose decoded tile rows fit the stack buffer of DOL_K(q8_rows). */
#define Q8_UNPACK_K 16384
#endif

void DOL_K(q8_rows)(float *out, const float *x, int T, const dol_q8_matrix *W, int n0, int n1)
{
    const int K = (int)W->cols, N = (int)W->rows;
#ifdef DOL_SIMD
    /* More than one group of 4 rows of x: each tile of W decoded once into
     * floats on the stack and read by every group (prefill, batches), else
     * decoded in registers (decode at batch <= 4). The same bits either way. */
    if (T > 4 && K <= Q8_UNPACK_K) {
        float wf[Q8_NC * Q8_UNPACK_K] __attribute__((aligned(64)));
        for (int n = n0; n < n1;) {
            int nc = n + Q8_NC <= n1 ? Q8_NC : 1;
            const q8_tile_fn *tile = nc == Q8_NC ? q8b_wide : q8b_narrow;
            q8_unpack(W, n, nc, wf);
            for (int t = 0; t < T; t += 4) {
                int nr = T - t < 4 ? T - t : 4;
                tile[nr](x + (size_t)t * K, K, W, wf, n, out + (size_t)t * N, N);
            }
            n += nc;
        }
        return;
    }
    for (int n = n0; n < n1;) {
        int nc = n + Q8_NC <= n1 ? Q8_NC : 1;
        const q8_tile_fn *tile = nc == Q8_NC ? q8_wide : q8_narrow;
        for (int t = 0; t < T; t += 4) {
            int nr = T - t < 4 ? T - t : 4;
            tile[nr](x + (size_t)t * K, K, W, NULL, n, out + (size_t)t * N, N);
        }
        n += nc;
    }
#else
    for (int n = n0; n < n1; n++)
        for (int t = 0; t < T; t++)
            out[(size_t)t * N + n] = q8_dot_blocks(x + (size_t)t * K, W, n, 0, 0.0f);
#endif
}

/* The same for Q8_0 weights (K a whole number of Q8_0 blocks): each weight
 * exactly q x d, as dol_q8_dequantize_block gives it (q8_decode). */
void DOL_K(q8_panel)(const dol_q8_matrix *W, int n, int m, bool packed, float *tile)
{
    const int64_t K = W->cols, bpr = W->blocks_per_row;
    for (int r = 0; r < tile_rows(m, packed); r++) {
        float *row = tile_row(tile, K, r, packed);
        for (int64_t b = 0; b < bpr; b++) {
            float w[DOL_Q8_BLOCK];
            if (r >= m) {
                memset(w, 0, sizeof w);
            } else {
#ifdef DOL_SIMD
                const vecf d = v_set1(_cvtsh_ss(W->scales[(n + r) * bpr + b]));
                const int8_t *q = W->quants + (n + r) * K + b * DOL_Q8_BLOCK;
                for (int s = 0; s < DOL_Q8_BLOCK / DOL_SIMD; s++)
                    v_store(w + s * DOL_SIMD, q8_decode(q + s * DOL_SIMD, d));
#else
                dol_q8_dequantize_block(W, n + r, b, w);
#endif
            }
            tile_put_block(row, b, DOL_Q8_BLOCK, packed, w);
        }
    }
}
