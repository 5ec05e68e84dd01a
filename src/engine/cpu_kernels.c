/* src/engine/cpu_kernels.c — the instruction-set dependent kernels of the
 * CPU backend: dot product, matrix-product rows over F32/F16/BF16, NF4 and
 * Q8_0 weights, RMSNorm, RoPE, SiLU-gated product. Written once, compiled by
 * CMake once per variant with -DDOL_CPU_VARIANT=<name> and that variant's
 * flags (cpu_kernels.h); each compilation exports the table
 * dol_cpu_kernels_<name>. Everything else here is file-static.
 *
 * DOL_SIMD is the accumulator width: 16 (avx512), 8 (avx2) or undefined
 * (portable: scalar k order). The row-major product (matmul_rows) walks W
 * in tiles of MM_NC rows and runs up to four rows of x against each tile;
 * the engine's weights go through the packed product (matmul_packed_rows).
 * Either way W is streamed from memory once per call whatever the batch
 * size, and every tile follows the order of k_dot exactly, which is what
 * keeps outputs batch-invariant. Why the kernels are built this way, with
 * the measurements: docs/performance.md, "Design reasons". */
#include "engine/cpu_kernels.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef DOL_CPU_VARIANT
#error "compile cpu_kernels.c with -DDOL_CPU_VARIANT=portable|avx2|avx512 (see CMakeLists.txt)"
#endif

#define DOL_CAT_(a, b) a##b
#define DOL_CAT(a, b) DOL_CAT_(a, b)
#define DOL_STR_(a) #a
#define DOL_STR(a) DOL_STR_(a)

#define DOL_VARIANT_ID_portable 1
#define DOL_VARIANT_ID_avx2 2
#define DOL_VARIANT_ID_avx512 3
#define DOL_VARIANT_ID DOL_CAT(DOL_VARIANT_ID_, DOL_CPU_VARIANT)

#if DOL_VARIANT_ID == 3
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
      defined(__AVX512VL__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "the avx512 variant needs -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma -mf16c"
#endif
#include <immintrin.h>
#define DOL_SIMD 16
typedef __m512 vecf;
static inline vecf v_zero(void) { return _mm512_setzero_ps(); }
static inline vecf v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline vecf v_load_h(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
/* BF16 is the high half of an F32: widen to 32 bits, shift left 16 (exact,
 * the same bits as dol_bf16_to_f32). */
static inline vecf v_load_bf16(const uint16_t *p)
{
    __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}
static inline vecf v_fma(vecf a, vecf b, vecf c) { return _mm512_fmadd_ps(a, b, c); }
static inline float v_sum(vecf v) { return _mm512_reduce_add_ps(v); }
static inline vecf v_set1(float f) { return _mm512_set1_ps(f); }
static inline vecf v_mul(vecf a, vecf b) { return _mm512_mul_ps(a, b); }
static inline void v_store(float *p, vecf v) { _mm512_storeu_ps(p, v); }
static inline vecf v_min(vecf a, vecf b) { return _mm512_min_ps(a, b); }
static inline vecf v_max(vecf a, vecf b) { return _mm512_max_ps(a, b); }
static inline vecf v_sub(vecf a, vecf b) { return _mm512_sub_ps(a, b); }
static inline vecf v_add(vecf a, vecf b) { return _mm512_add_ps(a, b); }
static inline vecf v_div(vecf a, vecf b) { return _mm512_div_ps(a, b); }
static inline vecf v_round(vecf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* p * 2^n for integral n, by adding n to the exponent field (result normal) */
static inline vecf v_scale2(vecf p, vecf n)
{
    __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e));
}
#elif DOL_VARIANT_ID == 2
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "the avx2 variant needs -mavx2 -mfma -mf16c"
#endif
#include <immintrin.h>
#define DOL_SIMD 8
typedef __m256 vecf;
static inline vecf v_zero(void) { return _mm256_setzero_ps(); }
static inline vecf v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline vecf v_load_h(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline vecf v_load_bf16(const uint16_t *p)
{
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
static inline vecf v_fma(vecf a, vecf b, vecf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vecf v_set1(float f) { return _mm256_set1_ps(f); }
static inline vecf v_mul(vecf a, vecf b) { return _mm256_mul_ps(a, b); }
static inline void v_store(float *p, vecf v) { _mm256_storeu_ps(p, v); }
static inline vecf v_min(vecf a, vecf b) { return _mm256_min_ps(a, b); }
static inline vecf v_max(vecf a, vecf b) { return _mm256_max_ps(a, b); }
static inline vecf v_sub(vecf a, vecf b) { return _mm256_sub_ps(a, b); }
static inline vecf v_add(vecf a, vecf b) { return _mm256_add_ps(a, b); }
static inline vecf v_div(vecf a, vecf b) { return _mm256_div_ps(a, b); }
static inline vecf v_round(vecf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vecf v_scale2(vecf p, vecf n)
{
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}
static inline float v_sum(vecf v)
{
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 sh = _mm_movehdup_ps(lo);
    __m128 s = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, s);
    return _mm_cvtss_f32(_mm_add_ss(s, sh));
}
#elif DOL_VARIANT_ID != 1
#error "DOL_CPU_VARIANT must be portable, avx2 or avx512"
#endif

/* Weight k of a row of dtype t, as f32 (exact for every dtype). */
static inline float load_w1(const void *w, dol_dtype t, int k)
{
    if (t == DOL_DTYPE_F16) return dol_f16_to_f32(((const uint16_t *)w)[k]);
    if (t == DOL_DTYPE_BF16) return dol_bf16_to_f32(((const uint16_t *)w)[k]);
    return ((const float *)w)[k];
}

static inline size_t w_size(dol_dtype t) { return t == DOL_DTYPE_F32 ? 4 : 2; }

#ifdef DOL_SIMD
/* DOL_SIMD weights from element i of W, whatever the dtype (t is a
 * compile-time constant in every tile, so the switch folds away). */
static inline vecf v_load_w(const void *W, dol_dtype t, size_t i)
{
    switch (t) {
    case DOL_DTYPE_F16: return v_load_h((const uint16_t *)W + i);
    case DOL_DTYPE_BF16: return v_load_bf16((const uint16_t *)W + i);
    default: return v_load((const float *)W + i);
    }
}
#endif

/* The summation order, the same for every caller and every batch size: one
 * DOL_SIMD-lane accumulator over k in steps of DOL_SIMD, a horizontal sum,
 * then the scalar tail (portable: the scalar loop alone). Independent
 * chains come from computing several outputs at once, never from splitting
 * one output's sum. */
static float k_dot(const float *x, const void *w, dol_dtype t, int n)
{
    int k = 0;
    float sum = 0.0f;
#ifdef DOL_SIMD
    vecf acc = v_zero();
    switch (t) {
    case DOL_DTYPE_F16:
        for (; k + DOL_SIMD <= n; k += DOL_SIMD)
            acc = v_fma(v_load(x + k), v_load_w(w, DOL_DTYPE_F16, (size_t)k), acc);
        break;
    case DOL_DTYPE_BF16:
        for (; k + DOL_SIMD <= n; k += DOL_SIMD)
            acc = v_fma(v_load(x + k), v_load_w(w, DOL_DTYPE_BF16, (size_t)k), acc);
        break;
    default:
        for (; k + DOL_SIMD <= n; k += DOL_SIMD)
            acc = v_fma(v_load(x + k), v_load_w(w, DOL_DTYPE_F32, (size_t)k), acc);
        break;
    }
    sum = v_sum(acc);
#endif
    for (; k < n; k++) sum += x[k] * load_w1(w, t, k);
    return sum;
}

/* ---- matrix product ------------------------------------------------------ */

#ifdef DOL_SIMD
#define MM_NC 4 /* W rows per register tile */

/* Pin a vector to a register. Without it GCC folds the load of x into each
 * of the NC FMAs that use it, one load per FMA, and the tile becomes bound
 * by loads (several times slower at 8 rows of x). The empty asm changes no
 * value and no instruction order of the arithmetic. */
static inline vecf v_in_register(vecf v)
{
    __asm__("" : "+v"(v));
    return v;
}

/* Register tile: NR rows of x against MM_NC rows of W (n .. n+MM_NC-1), W of
 * dtype DT; each W vector is loaded (and converted from F16 / BF16) once for
 * all NR rows. Every output follows k_dot's order exactly. While it runs it
 * prefetches the next tile's rows, spread evenly over the k loop. */
#define DEFINE_TILE(NR, DT, SUF)                                                            \
    static void tile_##SUF##_##NR(const float *x, int K, const void *W, int n, float *out, \
                                  int N)                                                    \
    {                                                                                       \
        const dol_dtype t = DT;                                                             \
        const size_t esz = w_size(t);                                                       \
        vecf acc[NR][MM_NC];                                                                \
        for (int r = 0; r < NR; r++)                                                        \
            for (int c = 0; c < MM_NC; c++) acc[r][c] = v_zero();                           \
        const char *pf = (const char *)W + (size_t)(n + MM_NC) * K * esz;                   \
        const size_t pf_step = MM_NC * esz * DOL_SIMD;                                      \
        int k = 0;                                                                          \
        for (; k + DOL_SIMD <= K; k += DOL_SIMD) {                                          \
            vecf w[MM_NC];                                                                  \
            for (size_t o = 0; o < pf_step; o += 64)                                        \
                _mm_prefetch(pf + (size_t)k / DOL_SIMD * pf_step + o, _MM_HINT_T0);         \
            for (int c = 0; c < MM_NC; c++)                                                 \
                w[c] = v_load_w(W, t, (size_t)(n + c) * K + k);                             \
            for (int r = 0; r < NR; r++) {                                                  \
                vecf xv = v_in_register(v_load(x + (size_t)r * K + k));                     \
                for (int c = 0; c < MM_NC; c++) acc[r][c] = v_fma(xv, w[c], acc[r][c]);     \
            }                                                                               \
        }                                                                                   \
        for (int r = 0; r < NR; r++)                                                        \
            for (int c = 0; c < MM_NC; c++) {                                               \
                float s = v_sum(acc[r][c]);                                                 \
                const float *xr = x + (size_t)r * K;                                        \
                const char *wr = (const char *)W + (size_t)(n + c) * K * esz;               \
                for (int kk = k; kk < K; kk++) s += xr[kk] * load_w1(wr, t, kk);            \
                out[(size_t)r * N + n + c] = s;                                             \
            }                                                                               \
    }

typedef void (*mm_tile_fn)(const float *x, int K, const void *W, int n, float *out, int N);

/* Tiles of 1..4 rows of x for one weight dtype; index = rows of x. */
#define DEFINE_TILES(DT, SUF)                                                               \
    DEFINE_TILE(1, DT, SUF)                                                                 \
    DEFINE_TILE(2, DT, SUF)                                                                 \
    DEFINE_TILE(3, DT, SUF)                                                                 \
    DEFINE_TILE(4, DT, SUF)                                                                 \
    static const mm_tile_fn mm_tiles_##SUF[5] = { NULL, tile_##SUF##_1, tile_##SUF##_2,     \
                                                  tile_##SUF##_3, tile_##SUF##_4 };
DEFINE_TILES(DOL_DTYPE_F32, f32)
DEFINE_TILES(DOL_DTYPE_F16, f16)
DEFINE_TILES(DOL_DTYPE_BF16, bf16)
#endif

static void k_matmul_rows(float *out, const float *x, int T, int K, const void *W,
                          dol_dtype wt, int N, int n0, int n1)
{
    const size_t esz = w_size(wt);
    int n = n0;
#ifdef DOL_SIMD
    const mm_tile_fn *tile = wt == DOL_DTYPE_F16    ? mm_tiles_f16
                             : wt == DOL_DTYPE_BF16 ? mm_tiles_bf16
                                                    : mm_tiles_f32;
    for (; n + MM_NC <= n1; n += MM_NC)
        for (int t = 0; t < T; t += 4) {
            int nr = T - t < 4 ? T - t : 4;
            tile[nr](x + (size_t)t * K, K, W, n, out + (size_t)t * N, N);
        }
#endif
    for (; n < n1; n++) {
        const void *w = (const char *)W + (size_t)n * K * esz;
        for (int t = 0; t < T; t++)
            out[(size_t)t * N + n] = k_dot(x + (size_t)t * K, w, wt, K);
    }
}


/* The horizontal sums of four accumulators at once, stored to out[0..3]:
 * each is bit for bit v_sum of that accumulator. _mm512_reduce_add_ps (GCC)
 * adds lanes i and i+8, then i and i+4 of that, then i and i+2, then the
 * two left; the same pairs are added here with the four accumulators side
 * by side (addition is commutative in IEEE arithmetic, so only the pairing
 * matters), in 4 adds and 7 shuffles instead of 16 and 16. */
#if DOL_SIMD == 16
#define V_SUM4 1
static inline void v_sum4(const vecf a[4], float *out)
{
    /* [a.lo256 | b.lo256] + [a.hi256 | b.hi256]: blocks (128-bit) of lanes i + (i+8) */
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a[0], a[1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(a[0], a[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(a[2], a[3], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(a[2], a[3], _MM_SHUFFLE(3, 2, 3, 2)));
    /* one 128-bit block per accumulator: lanes i + (i+4) of the above */
    __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    /* within each block: lanes 0 + 2 and 1 + 3, then those two */
    v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));
    /* lane 0 of each block */
    __m128 r = _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v));
    _mm_storeu_ps(out, r);
}
#elif defined(DOL_SIMD)
#define V_SUM4 0
static inline void v_sum4(const vecf a[4], float *out)
{
    for (int c = 0; c < 4; c++) out[c] = v_sum(a[c]);
}
#endif

/* ---- matrix product over packed weights ---------------------------------- */

#ifdef DOL_SIMD
/* Packed register tile: NR rows of x against the panel of rows n .. n+3,
 * read as one sequential stream (DOL_SIMD elements of 4 rows per k step),
 * prefetching PACK_PF_BYTES ahead of the stream (which runs on into the
 * next panel), and, when pf is not NULL, ppu lines of pf per 16 k (a steady
 * prefetch of a later panel, see k_matmul_packed_rows). Every output
 * follows k_dot's order exactly: the same vector steps over k, the same
 * tail. */
/* Tuning constants, each chosen against its neighbours in alternating runs
 * of the 110m shape (the measurements: docs/performance.md, "Design
 * reasons"):
 *   PACK_PF_BYTES     look-ahead of every stream: shorter and longer
 *                     distances were slower or no better
 *   PACK_STREAMS      interleaved streams for what the lockstep tiles leave
 *   PACK_STREAM_ROWS  rows of x up to which the lockstep tiles run (batch
 *                     1-2 decode, memory-bound)
 *   PACK_OUTER_ROWS   rows of x up to which each panel meets every group
 *                     of rows in turn, with the steady prefetch of the next
 *                     panel, one panel ahead, into L2 (hint T1: into L1 it
 *                     overfilled a 32 KiB L1D; the look-ahead brings each
 *                     chunk on into L1)
 *   PACK_XROWS        rows of x per register tile: 6 x 4 accumulators + 4
 *                     weights + 1 input fit the 32 zmm registers; the 16
 *                     ymm of AVX2 take 3 x 4
 *   PACK_CHUNK_BYTES  panels per prefill cache block (fits L2; the size
 *                     matters little)
 *   PACK_SNAKE_BYTES  a group's rows of x from which the decode-batch order
 *                     turns back every other panel (it helps when a group
 *                     fills most of L1, not below) */
#define PACK_PF_BYTES 1024
#define PACK_STREAMS 2
#define PACK_STREAM_ROWS 2
#define PACK_OUTER_ROWS 16
#if DOL_SIMD == 16
#define PACK_XROWS 6
#else
#define PACK_XROWS 3
#endif
#define PACK_CHUNK_BYTES (192u * 1024u)
#define PACK_SNAKE_BYTES (32u * 1024u)

/* Prefetch the 16-element chunk of a panel (all 4 rows: DOL_PACK_ROWS *
 * DOL_PACK_K elements of esz bytes) that lies PACK_PF_BYTES beyond the one
 * starting at `chunk`, the stream's own look-ahead in every packed tile. */
static inline void prefetch_ahead(const char *chunk, size_t esz)
{
    for (size_t b = 0; b < DOL_PACK_ROWS * DOL_PACK_K * esz; b += 64)
        _mm_prefetch(chunk + PACK_PF_BYTES + b, _MM_HINT_T0);
}
#define DEFINE_PTILE(NR, DT, SUF, PF, PSUF)                                                 \
    static void ptile##PSUF##_##SUF##_##NR(const float *x, int K, const void *Wp, int n,     \
                                           float *out, int N, const char *pf, int ppu)      \
    {                                                                                       \
        (void)pf;                                                                           \
        (void)ppu;                                                                          \
        const dol_dtype t = DT;                                                             \
        const size_t esz = w_size(t);                                                       \
        const int kc = K - K % DOL_PACK_K;                                                  \
        const size_t base = (size_t)n * K; /* n is a multiple of DOL_PACK_ROWS */           \
        const char *wb = (const char *)Wp + base * esz;                                     \
        vecf acc[NR][DOL_PACK_ROWS];                                                        \
        for (int r = 0; r < NR; r++)                                                        \
            for (int c = 0; c < DOL_PACK_ROWS; c++) acc[r][c] = v_zero();                   \
        /* one chunk (DOL_PACK_K elements of the 4 rows) per iteration,                     \
         * walked by pointer: the prefetches and the loop's bookkeeping                     \
         * once per chunk, not per vector step */                                           \
        int k = 0;                                                                          \
        const char *wc = wb;                                                                \
        const char *pq = pf;                                                                \
        for (; k < kc; k += DOL_PACK_K, wc += DOL_PACK_ROWS * DOL_PACK_K * esz) {           \
            prefetch_ahead(wc, esz); /* the chunk PACK_PF_BYTES ahead */                    \
            if (PF && pq) { /* steady prefetch of a later panel, into L2 */                 \
                for (int q = 0; q < ppu; q++) _mm_prefetch(pq + (size_t)q * 64, _MM_HINT_T1); \
                pq += (size_t)ppu * 64;                                                     \
            }                                                                               \
            for (int kk = 0; kk < DOL_PACK_K; kk += DOL_SIMD) {                             \
                vecf w[DOL_PACK_ROWS];                                                      \
                for (int c = 0; c < DOL_PACK_ROWS; c++)                                     \
                    w[c] = v_load_w(wc, t, (size_t)c * DOL_PACK_K + (size_t)kk);            \
                for (int r = 0; r < NR; r++) {                                              \
                    vecf xv = v_in_register(v_load(x + (size_t)r * K + k + kk));            \
                    for (int c = 0; c < DOL_PACK_ROWS; c++) acc[r][c] = v_fma(xv, w[c], acc[r][c]); \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        /* vector steps inside the tail rows (an 8-lane set when K % 16 >= 8) */            \
        const int kt = K - kc;                                                              \
        for (; k + DOL_SIMD <= K; k += DOL_SIMD)                                            \
            for (int c = 0; c < DOL_PACK_ROWS; c++) {                                       \
                vecf w = v_load_w(Wp, t, base + (size_t)kc * DOL_PACK_ROWS + (size_t)c * kt + (size_t)(k - kc)); \
                for (int r = 0; r < NR; r++)                                                \
                    acc[r][c] = v_fma(v_load(x + (size_t)r * K + k), w, acc[r][c]);         \
            }                                                                               \
        if (V_SUM4 && k == K && n + DOL_PACK_ROWS <= N) { /* no scalar tail, full panel */   \
            for (int r = 0; r < NR; r++)                                                    \
                v_sum4(acc[r], out + (size_t)r * N + n);                                    \
            return;                                                                         \
        }                                                                                   \
        for (int r = 0; r < NR; r++)                                                        \
            for (int c = 0; c < DOL_PACK_ROWS && n + c < N; c++) {                          \
                float s = v_sum(acc[r][c]);                                                 \
                const float *xr = x + (size_t)r * K;                                        \
                const char *wr = wb + ((size_t)kc * DOL_PACK_ROWS + (size_t)c * kt) * esz;  \
                for (int kk = k; kk < K; kk++) s += xr[kk] * load_w1(wr, t, kk - kc);       \
                out[(size_t)r * N + n + c] = s;                                             \
            }                                                                               \
    }

typedef void (*pk_tile_fn)(const float *x, int K, const void *Wp, int n, float *out, int N,
                           const char *pf, int ppu);
/* Two sets: without the steady prefetch (prefill, compute-bound, where the
 * test in the k loop alone cost time) and with it (decode batches). */
#define DEFINE_PTILES_(DT, SUF, PF, PSUF)                                                   \
    DEFINE_PTILE(1, DT, SUF, PF, PSUF)                                                      \
    DEFINE_PTILE(2, DT, SUF, PF, PSUF)                                                      \
    DEFINE_PTILE(3, DT, SUF, PF, PSUF)                                                      \
    DEFINE_PTILE(4, DT, SUF, PF, PSUF)                                                      \
    DEFINE_PTILE(5, DT, SUF, PF, PSUF)                                                      \
    DEFINE_PTILE(6, DT, SUF, PF, PSUF)                                                      \
    static const pk_tile_fn pk_tiles##PSUF##_##SUF[7] = {                                   \
        NULL, ptile##PSUF##_##SUF##_1, ptile##PSUF##_##SUF##_2, ptile##PSUF##_##SUF##_3,    \
        ptile##PSUF##_##SUF##_4, ptile##PSUF##_##SUF##_5, ptile##PSUF##_##SUF##_6 };
#define DEFINE_PTILES(DT, SUF) DEFINE_PTILES_(DT, SUF, 0, ) DEFINE_PTILES_(DT, SUF, 1, _pf)
DEFINE_PTILES(DOL_DTYPE_F32, f32)
DEFINE_PTILES(DOL_DTYPE_F16, f16)
DEFINE_PTILES(DOL_DTYPE_BF16, bf16)
#endif

#ifdef DOL_SIMD
/* Lockstep tile: NR rows of x against NS whole panels at once (rows
 * n[s] .. n[s]+3 for s < NS), each k step reading the next DOL_SIMD
 * elements of all NS panels, so one task keeps NS sequential streams of W
 * in flight at cache-line granularity, as the bandwidth probe of
 * tools/bench_engine.c does. Only for K % DOL_PACK_K == 0 and full panels
 * (no tail); each output is ptile's: one accumulator over k in vector
 * steps, then v_sum4, so the bits are those of k_dot. Four streams per
 * thread read memory fastest, as in the probe (fewer or more were slower;
 * docs/performance.md). */
#define DEFINE_STILE(NR, NS, DT, SUF)                                                       \
    static void stile_##SUF##_##NR##_##NS(const float *x, int K, const void *Wp,           \
                                          const int *n, float *out, int N)                  \
    {                                                                                       \
        const dol_dtype t = DT;                                                             \
        const size_t esz = w_size(t);                                                       \
        vecf acc[NS][NR][DOL_PACK_ROWS];                                                    \
        for (int s = 0; s < NS; s++)                                                        \
            for (int r = 0; r < NR; r++)                                                    \
                for (int c = 0; c < DOL_PACK_ROWS; c++) acc[s][r][c] = v_zero();            \
        /* one chunk of every stream per iteration, each stream walked by pointer */       \
        const char *ws[NS];                                                                 \
        for (int s = 0; s < NS; s++) ws[s] = (const char *)Wp + (size_t)n[s] * K * esz;    \
        for (int k = 0; k < K; k += DOL_PACK_K) {                                           \
            for (int s = 0; s < NS; s++) prefetch_ahead(ws[s], esz);                        \
            for (int kk = 0; kk < DOL_PACK_K; kk += DOL_SIMD) {                             \
                vecf xv[NR];                                                                \
                for (int r = 0; r < NR; r++)                                                \
                    xv[r] = v_in_register(v_load(x + (size_t)r * K + k + kk));              \
                for (int s = 0; s < NS; s++)                                                \
                    for (int c = 0; c < DOL_PACK_ROWS; c++) {                               \
                        vecf w = v_load_w(ws[s], t, (size_t)c * DOL_PACK_K + (size_t)kk);   \
                        for (int r = 0; r < NR; r++) acc[s][r][c] = v_fma(xv[r], w, acc[s][r][c]); \
                    }                                                                       \
            }                                                                               \
            for (int s = 0; s < NS; s++) ws[s] += DOL_PACK_ROWS * DOL_PACK_K * esz;         \
        }                                                                                   \
        for (int s = 0; s < NS; s++)                                                        \
            for (int r = 0; r < NR; r++) v_sum4(acc[s][r], out + (size_t)r * N + n[s]);     \
    }

/* The lockstep tiles of each kernel set, by rows of x (1..STILE_ROWS) and
 * streams (1..STILE_STREAMS at one row; accumulators 1 x 4 x 4 and
 * 2 x 2 x 4 fit AVX-512's 32 registers with x and w, 1 x 2 x 4 AVX2's 16). */
typedef void (*mm_stile_fn)(const float *x, int K, const void *Wp, const int *n, float *out, int N);
#if DOL_SIMD == 16
#define STILE_ROWS 2
#define STILE_STREAMS(T) ((T) == 1 ? 4 : 2)
#define DEFINE_STILES(DT, SUF)                                                              \
    DEFINE_STILE(1, 1, DT, SUF) DEFINE_STILE(1, 2, DT, SUF) DEFINE_STILE(1, 3, DT, SUF)     \
    DEFINE_STILE(1, 4, DT, SUF) DEFINE_STILE(2, 1, DT, SUF) DEFINE_STILE(2, 2, DT, SUF)     \
    static const mm_stile_fn st_tiles_##SUF[STILE_ROWS][4] = {                               \
        { stile_##SUF##_1_1, stile_##SUF##_1_2, stile_##SUF##_1_3, stile_##SUF##_1_4 },     \
        { stile_##SUF##_2_1, stile_##SUF##_2_2, NULL, NULL } };
#else
#define STILE_ROWS 1
#define STILE_STREAMS(T) 2
#define DEFINE_STILES(DT, SUF)                                                              \
    DEFINE_STILE(1, 1, DT, SUF) DEFINE_STILE(1, 2, DT, SUF)                                 \
    static const mm_stile_fn st_tiles_##SUF[STILE_ROWS][4] = {                               \
        { stile_##SUF##_1_1, stile_##SUF##_1_2, NULL, NULL } };
#endif
DEFINE_STILES(DOL_DTYPE_F32, f32)
DEFINE_STILES(DOL_DTYPE_F16, f16)
DEFINE_STILES(DOL_DTYPE_BF16, bf16)

/* The whole panels of [n0, n1) for T <= STILE_ROWS rows of x: cut into
 * STILE_STREAMS(T) streams of `per` panels read in lockstep, then the
 * panels left over (fewer than the streams) in one lockstep call. Returns
 * the first row not done (a short last panel, or n0 when K is not a whole
 * number of 16-element steps). */
static int lockstep_rows(float *out, const float *x, int T, int K, const void *Wp, dol_dtype wt,
                         int N, int n0, int n1)
{
    if (T > STILE_ROWS || K % DOL_PACK_K != 0) return n0;
    const mm_stile_fn *f = (wt == DOL_DTYPE_F16    ? st_tiles_f16
                            : wt == DOL_DTYPE_BF16 ? st_tiles_bf16
                                                   : st_tiles_f32)[T - 1];
    const int ns = STILE_STREAMS(T);
    const int full = ((n1 < N ? n1 : N) - n0) / DOL_PACK_ROWS; /* whole panels */
    const int per = full / ns, left = full % ns;
    int n[4];
    for (int i = 0; i < per; i++) {
        for (int s = 0; s < ns; s++) n[s] = n0 + (s * per + i) * DOL_PACK_ROWS;
        f[ns - 1](x, K, Wp, n, out, N);
    }
    for (int s = 0; s < left; s++) n[s] = n0 + (ns * per + s) * DOL_PACK_ROWS;
    if (left) f[left - 1](x, K, Wp, n, out, N);
    return n0 + full * DOL_PACK_ROWS;
}
#endif

static void k_matmul_packed_rows(float *out, const float *x, int T, int K, const void *Wp,
                                 dol_dtype wt, int N, int n0, int n1)
{
#ifdef DOL_SIMD
    const pk_tile_fn *tile = wt == DOL_DTYPE_F16    ? pk_tiles_f16
                             : wt == DOL_DTYPE_BF16 ? pk_tiles_bf16
                                                    : pk_tiles_f32;
    const pk_tile_fn *tile_pf = wt == DOL_DTYPE_F16    ? pk_tiles_pf_f16
                                : wt == DOL_DTYPE_BF16 ? pk_tiles_pf_bf16
                                                       : pk_tiles_pf_f32;
    const size_t panel_bytes = (size_t)DOL_PACK_ROWS * K * w_size(wt);
    /* T rows in groups of at most PACK_XROWS, as even as possible (8 rows
     * go as 4 + 4, not 6 + 2) */
    const int groups = (T + PACK_XROWS - 1) / PACK_XROWS;
    if (T <= PACK_STREAM_ROWS) {
        /* batch-1/2 decode, memory-bound: the whole panels go through the
         * lockstep tiles (four streams in flight per thread); the rest (a
         * short last panel, K % 16 != 0) are visited as PACK_STREAMS
         * streams interleaved panel by panel */
        n0 = lockstep_rows(out, x, T, K, Wp, wt, N, n0, n1);
        const int panels = (n1 - n0 + DOL_PACK_ROWS - 1) / DOL_PACK_ROWS;
        const int per = (panels + PACK_STREAMS - 1) / PACK_STREAMS;
        for (int i = 0; i < per; i++)
            for (int st = 0; st < PACK_STREAMS; st++) {
                const int pi = st * per + i;
                if (pi >= panels) continue;
                const int n = n0 + pi * DOL_PACK_ROWS;
                for (int g = 0, t = 0; g < groups; g++) {
                    const int nr = T / groups + (g < T % groups);
                    tile[nr](x + (size_t)t * K, K, Wp, n, out + (size_t)t * N, N, NULL, 0);
                    t += nr;
                }
            }
        return;
    }
    if (T <= PACK_OUTER_ROWS) {
        /* decode batches: each panel meets every group of rows of x in
         * turn while it is in L1, and group g prefetches the g-th share of
         * the next panel, `ppu` lines per 16 k, so the reads of W from
         * memory run at a steady rate under the arithmetic instead of in a
         * burst per panel */
        const size_t unit = (size_t)DOL_PACK_ROWS * DOL_PACK_K * w_size(wt); /* bytes per 16 k */
        const int ppu = (int)((unit / 64 + (size_t)groups - 1) / (size_t)groups);
        const size_t share = (size_t)ppu * (size_t)(K / DOL_PACK_K) * 64;
        /* When one group's rows of x fill most of L1 (PACK_SNAKE_BYTES),
         * every other panel meets the groups in reverse order, so a panel
         * starts with the group the previous one ended with, whose rows are
         * still in L1; the order of the groups changes no output's bits */
        const bool snake = groups > 1 && (size_t)((T + groups - 1) / groups) * (size_t)K *
                                             sizeof(float) >= PACK_SNAKE_BYTES;
        for (int n = n0, p = 0; n < n1; n += DOL_PACK_ROWS, p++) {
            const char *next = (const char *)Wp + (size_t)(n + DOL_PACK_ROWS) * K * w_size(wt);
            for (int i = 0; i < groups; i++) {
                const int g = snake && (p & 1) ? groups - 1 - i : i;
                const int nr = T / groups + (g < T % groups);
                const int t = g * (T / groups) + (g < T % groups ? g : T % groups); /* first row */
                tile_pf[nr](x + (size_t)t * K, K, Wp, n, out + (size_t)t * N, N,
                            n + DOL_PACK_ROWS < n1 ? next + (size_t)i * share : NULL, ppu);
            }
        }
        return;
    }
    /* prefill: the range is cut into chunks of panels of about
     * PACK_CHUNK_BYTES; for each chunk, every group of rows of x (in L1)
     * meets every panel of the chunk (streamed from memory for the first
     * group, from L2 for the others), so W is read from memory once */
    int chunk = (int)(PACK_CHUNK_BYTES / panel_bytes) * DOL_PACK_ROWS;
    if (chunk < DOL_PACK_ROWS) chunk = DOL_PACK_ROWS;
    for (int c0 = n0; c0 < n1; c0 += chunk) {
        const int c1 = c0 + chunk < n1 ? c0 + chunk : n1;
        for (int g = 0, t = 0; g < groups; g++) {
            const int nr = T / groups + (g < T % groups);
            for (int n = c0; n < c1; n += DOL_PACK_ROWS)
                tile[nr](x + (size_t)t * K, K, Wp, n, out + (size_t)t * N, N, NULL, 0);
            t += nr;
        }
    }
#else
    for (int n = n0; n < n1; n++)
        for (int t = 0; t < T; t++) {
            const float *xr = x + (size_t)t * K;
            float s = 0.0f;
            for (int k = 0; k < K; k++)
                s += xr[k] * load_w1((const char *)Wp + dol_cpu_packed_index(n, k, K) * w_size(wt), wt, 0);
            out[(size_t)t * N + n] = s;
        }
#endif
}

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

static void k_nf4_rows(float *out, const float *x, int T, const dol_nf4_matrix *W, int n0,
                       int n1)
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
static void k_nf4_panel(const dol_nf4_matrix *W, int n, int m, bool packed, float *tile)
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

/* Largest K whose decoded tile rows fit the stack buffer of k_q8_rows. */
#define Q8_UNPACK_K 16384
#endif

static void k_q8_rows(float *out, const float *x, int T, const dol_q8_matrix *W, int n0, int n1)
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

/* ---- element-wise kernels ------------------------------------------------ */

/* RMSNorm of `rows` rows of n floats (row stride n), four rows at a time:
 * each row's sum of squares is still one double accumulated in i order
 * (a float product is exact in double, so a fused multiply-add gives the
 * same sum), but four rows' chains run side by side instead of one
 * 4-cycle addition after another. The same bits as one row at a time. */
static void rmsnorm_scale(float *out, const float *x, const float *w, int n, double ss,
                          float eps)
{
    float scale = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

static void k_rmsnorm(float *out, const float *x, const float *w, int rows, int n, float eps)
{
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *x0 = x + (size_t)r * n, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        for (int i = 0; i < n; i++) {
            s0 += (double)x0[i] * x0[i];
            s1 += (double)x1[i] * x1[i];
            s2 += (double)x2[i] * x2[i];
            s3 += (double)x3[i] * x3[i];
        }
        float *o = out + (size_t)r * n;
        rmsnorm_scale(o, x0, w, n, s0, eps);
        rmsnorm_scale(o + n, x1, w, n, s1, eps);
        rmsnorm_scale(o + 2 * (size_t)n, x2, w, n, s2, eps);
        rmsnorm_scale(o + 3 * (size_t)n, x3, w, n, s3, eps);
    }
    for (; r < rows; r++) {
        const float *xr = x + (size_t)r * n;
        double ss = 0.0;
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        rmsnorm_scale(out + (size_t)r * n, xr, w, n, ss, eps);
    }
}

static void k_rope(float *x, int n_heads, int head_dim, const float *cos_row,
                   const float *sin_row)
{
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cos_row[i] - b * sin_row[i];
            v[i + half] = b * cos_row[i] + a * sin_row[i];
        }
    }
}



/* ---- exp for the softmax ---------------------------------------------------- */

/* exp(x) for the softmax, x clamped to [-87, 88] (so the result is a normal
 * float; exp(-87) = 1.6e-38 stands for anything smaller). Cody and Waite's
 * range reduction x = n ln2 + r, |r| <= ln2/2 (ln2 split in a high part
 * exact in float and a low part), e^r by its Taylor polynomial of degree 7
 * in Horner form (truncation error < 7e-9 relative), then 2^n added to the
 * exponent field. Within 2 ulp of expf. The scalar and vector forms perform
 * the same operations (fused multiply-adds included), so every kernel set
 * produces the same bits. */
#define EXP_LO (-87.0f)
#define EXP_HI 88.0f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO (-2.12194440e-4f)
static const float exp_c[8] = { 1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                1.0f / 6.0f,    0.5f,           1.0f,           1.0f };

static inline float exp_s(float x)
{
    x = fminf(fmaxf(x, EXP_LO), EXP_HI);
    float n = nearbyintf(x * EXP_LOG2E);
    float r = fmaf(n, -EXP_LN2_HI, x);
    r = fmaf(n, -EXP_LN2_LO, r);
    float p = exp_c[0];
    for (int i = 1; i < 8; i++) p = fmaf(p, r, exp_c[i]);
    uint32_t bits;
    memcpy(&bits, &p, sizeof bits);
    bits += (uint32_t)((int32_t)n * (1 << 23));
    memcpy(&p, &bits, sizeof p);
    return p;
}

#ifdef DOL_SIMD
static inline vecf exp_v(vecf x)
{
    x = v_min(v_max(x, v_set1(EXP_LO)), v_set1(EXP_HI));
    vecf n = v_round(v_mul(x, v_set1(EXP_LOG2E)));
    vecf r = v_fma(n, v_set1(-EXP_LN2_HI), x);
    r = v_fma(n, v_set1(-EXP_LN2_LO), r);
    vecf p = v_set1(exp_c[0]);
    for (int i = 1; i < 8; i++) p = v_fma(p, r, v_set1(exp_c[i]));
    return v_scale2(p, n);
}
#endif

/* out[i] = silu(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up, with the
 * softmax's exp (exp_s / exp_v: the same bits in every kernel set). */
static void k_silu_mul(float *out, const float *gate, const float *up, int n)
{
    int i = 0;
#ifdef DOL_SIMD
    const vecf one = v_set1(1.0f);
    for (; i + DOL_SIMD <= n; i += DOL_SIMD) {
        vecf g = v_load(gate + i);
        vecf e = exp_v(v_sub(v_zero(), g));
        v_store(out + i, v_mul(v_div(g, v_add(one, e)), v_load(up + i)));
    }
#endif
    for (; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + exp_s(0.0f - g)) * up[i];
    }
}

/* ---- attention over the paged KV cache --------------------------------- */

/* The KV cache holds F32 or F16 (dtype t, a compile-time constant in each
 * caller below, so the loads fold to one instruction): element off of a
 * run at base, and its value as f32 (F16 -> F32 is exact, so both paths
 * compute the same operations on the same values). */
static inline const void *kv_at(const void *base, dol_dtype t, size_t off)
{
    return (const char *)base + off * w_size(t);
}

/* Scores of the positions of one block: s[r] = sum_i q[i] * kt[i*bs + r] for
 * r < bs, one fused multiply-add per i in ascending i (one chain per
 * position, so every variant produces the same bits). */
static inline __attribute__((always_inline)) void
attn_block_scores(const float *q, int hd, const void *kt, dol_dtype t, int bs, float *s)
{
    int r = 0;
#ifdef DOL_SIMD
    for (; r + DOL_SIMD <= bs; r += DOL_SIMD) {
        vecf acc = v_zero();
        for (int i = 0; i < hd; i++)
            acc = v_fma(v_set1(q[i]), v_load_w(kt, t, (size_t)i * bs + r), acc);
        v_store(s + r, acc);
    }
#endif
    for (; r < bs; r++) {
        float acc = 0.0f;
        for (int i = 0; i < hd; i++) acc = fmaf(q[i], load_w1(kv_at(kt, t, (size_t)i * bs + r), t, 0), acc);
        s[r] = acc;
    }
}

#ifdef DOL_SIMD
/* M (2..4) blocks at once: M independent chains per vector of positions,
 * each with exactly attn_block_scores' order (one chain alone waits out the
 * FMA latency at every i). */
static inline __attribute__((always_inline)) void
attn_block_scores_m(const float *q, int hd, const void *const kt[4], dol_dtype t, int m, int bs,
                    float *s)
{
    for (int r = 0; r + DOL_SIMD <= bs; r += DOL_SIMD) {
        vecf a[4] = { v_zero(), v_zero(), v_zero(), v_zero() };
        for (int i = 0; i < hd; i++) {
            vecf qi = v_set1(q[i]);
            size_t o = (size_t)i * bs + r;
            for (int j = 0; j < m; j++) a[j] = v_fma(qi, v_load_w(kt[j], t, o), a[j]);
        }
        for (int j = 0; j < m; j++) v_store(s + (size_t)j * bs + r, a[j]);
    }
}
#endif

static inline __attribute__((always_inline)) void
attn_head_t(const float *q, int hd, int n, const void *k_base, const void *v_base, dol_dtype t,
            const int32_t *table, int bs, size_t block_floats, int v_stride, float scale,
            float *sc, float *out)
{
    const int nb = (n + bs - 1) / bs;
    int b = 0;
#ifdef DOL_SIMD
    if (bs % DOL_SIMD == 0)
        while (nb - b >= 2) {
            const int m = nb - b >= 4 ? 4 : nb - b;
            const void *kt[4];
            for (int j = 0; j < m; j++) kt[j] = kv_at(k_base, t, (size_t)table[b + j] * block_floats);
            if (m == 4) attn_block_scores_m(q, hd, kt, t, 4, bs, sc + (size_t)b * bs);
            else if (m == 3) attn_block_scores_m(q, hd, kt, t, 3, bs, sc + (size_t)b * bs);
            else attn_block_scores_m(q, hd, kt, t, 2, bs, sc + (size_t)b * bs);
            b += m;
        }
#endif
    for (; b < nb; b++)
        attn_block_scores(q, hd, kv_at(k_base, t, (size_t)table[b] * block_floats), t, bs,
                          sc + (size_t)b * bs);

    /* softmax: scale, max, exp (exp_s / exp_v: the same bits), then the
     * sum in ascending p */
    float maxv = -INFINITY;
    for (int p = 0; p < n; p++) {
        sc[p] *= scale;
        if (sc[p] > maxv) maxv = sc[p];
    }
    int p = 0;
#ifdef DOL_SIMD
    for (; p + DOL_SIMD <= n; p += DOL_SIMD) v_store(sc + p, exp_v(v_sub(v_load(sc + p), v_set1(maxv))));
#endif
    for (; p < n; p++) sc[p] = exp_s(sc[p] - maxv);
    float sum = 0.0f;
    for (p = 0; p < n; p++) sum += sc[p];
    const float inv = 1.0f / sum;

    /* out = sum_p e_p v_p / sum: one fused multiply-add per position in
     * ascending p for every dimension, then the scaling */
    int i = 0;
#ifdef DOL_SIMD
    while (i + DOL_SIMD <= hd) {
        const int nv = (hd - i) / DOL_SIMD < 4 ? (hd - i) / DOL_SIMD : 4;
        vecf o[4] = { v_zero(), v_zero(), v_zero(), v_zero() };
        /* positions in ascending order, block by block (no division per
         * position) */
        for (int b0 = 0, p = 0; p < n; b0++) {
            const void *vb = kv_at(v_base, t, (size_t)table[b0] * block_floats + i);
            const int r1 = n - p < bs ? n - p : bs;
            for (int r = 0; r < r1; r++, p++) {
                const size_t vp = (size_t)r * v_stride;
                vecf e = v_set1(sc[p]);
                for (int j = 0; j < nv; j++) o[j] = v_fma(e, v_load_w(vb, t, vp + (size_t)j * DOL_SIMD), o[j]);
            }
        }
        for (int j = 0; j < nv; j++) v_store(out + i + j * DOL_SIMD, v_mul(o[j], v_set1(inv)));
        i += nv * DOL_SIMD;
    }
#endif
    for (; i < hd; i++) {
        float o = 0.0f;
        for (int p = 0; p < n; p++)
            o = fmaf(sc[p],
                     load_w1(kv_at(v_base, t, (size_t)table[p / bs] * block_floats +
                                                  (size_t)(p % bs) * v_stride + i), t, 0),
                     o);
        out[i] = o * inv;
    }
}

static void k_attn_head(const float *q, int hd, int n, const float *k_base, const float *v_base,
                        const int32_t *table, int bs, size_t block_floats, int v_stride,
                        float scale, float *sc, float *out)
{
    attn_head_t(q, hd, n, k_base, v_base, DOL_DTYPE_F32, table, bs, block_floats, v_stride, scale,
                sc, out);
}

static void k_attn_head_h(const float *q, int hd, int n, const uint16_t *k_base,
                          const uint16_t *v_base, const int32_t *table, int bs,
                          size_t block_floats, int v_stride, float scale, float *sc, float *out)
{
    attn_head_t(q, hd, n, k_base, v_base, DOL_DTYPE_F16, table, bs, block_floats, v_stride, scale,
                sc, out);
}

/* The same for Q8_0 weights (K a whole number of Q8_0 blocks): each weight
 * exactly q x d, as dol_q8_dequantize_block gives it (q8_decode). */
static void k_q8_panel(const dol_q8_matrix *W, int n, int m, bool packed, float *tile)
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

/* ---- load-time quantization (nf4.h, q8.h) --------------------------------- */

#ifdef DOL_SIMD
/* One block scale through F16C: round to nearest even, as dol_f32_to_f16
 * for every finite value (NaN never gets here); and back, exactly. */
static inline uint16_t scale_to_f16(float x)
{
    return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_NEAREST_INT), 0);
}
static inline float scale_from_f16(uint16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }
#else
static inline uint16_t scale_to_f16(float x) { return dol_f32_to_f16(x); }
static inline float scale_from_f16(uint16_t h) { return dol_f16_to_f32(h); }
#endif

/* The largest float <= x (x finite, |x| < FLT_MAX): round to nearest, then
 * one step down when that went up. Exact: the comparison is in double. */
static inline float round_down_f32(double x)
{
    float f = (float)x;
    if ((double)f > x) {
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        u = f > 0.0f ? u - 1 : f < 0.0f ? u + 1 : 0x80000001u; /* toward -inf */
        memcpy(&f, &u, sizeof f);
    }
    return f;
}

/* The NF4 decision thresholds of a block with scale s > 0: t[m] = the
 * largest float <= mid_m * s (mid_m = dol_nf4_mids[m], the product exact
 * in double: 25 + 11 significant bits). For a float w,
 *     (double)w > mid_m * s   <=>   w > t[m]:
 * if w > mid_m * s then w > t[m] since t[m] <= mid_m * s; if w > t[m], w is
 * a float above the largest float <= mid_m * s, so w > mid_m * s. Hence
 * counting the t[m] below w, in float, gives the exact (float64) code of
 * nf4.h. The t[m] ascend with m (s > 0, rounding down is monotone), so
 * the count is also what a binary search over t finds. */
static inline void nf4_thresholds(float s, float t[16])
{
    for (int m = 0; m < 15; m++) t[m] = round_down_f32(dol_nf4_mids[m] * (double)s);
    t[15] = 0.0f; /* never read: the searches below index at most t[14] */
}

/* Code of w: the number of t[m] (m < 15) below w, by a 4-step binary search. */
static inline unsigned nf4_code_of(float w, const float t[16])
{
    unsigned c = w > t[7] ? 8u : 0u;
    c += w > t[c + 3] ? 4u : 0u;
    c += w > t[c + 1] ? 2u : 0u;
    c += w > t[c] ? 1u : 0u;
    return c;
}

/* One NF4 block of n weights (n even, <= 64) from p (dtype t), scalar. */
static int nf4_block_scalar(const void *p, dol_dtype t, int n, uint16_t *scale, uint8_t *codes)
{
    float w[DOL_NF4_BLOCK], absmax = 0.0f;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        w[i] = load_w1(p, t, i);
        float a = fabsf(w[i]);
        bad |= !(a <= 65504.0f); /* NaN, inf or beyond F16 */
        absmax = a > absmax ? a : absmax;
    }
    if (bad) return -1;
    const uint16_t h = scale_to_f16(absmax);
    const float s = scale_from_f16(h);
    if (isinf(s)) return -1;
    *scale = h;
    uint8_t q[DOL_NF4_BLOCK];
    if (s > 0.0f) {
        float th[16];
        nf4_thresholds(s, th);
        for (int i = 0; i < n; i++) q[i] = (uint8_t)nf4_code_of(w[i], th);
    } else {
        for (int i = 0; i < n; i++) q[i] = 7; /* a block of zeros */
    }
    const int half = n / 2;
    for (int j = 0; j < half; j++) codes[j] = (uint8_t)(q[j] | (q[j + half] << 4));
    return 0;
}

#if DOL_VARIANT_ID == 3
/* A full block of 64 in four 16-lane vectors: the absmax by vector max, the
 * 15 thresholds by one double product rounded toward -inf (the same
 * t[m] as nf4_thresholds), the codes by the binary search with a lane-wise
 * table lookup (vpermps), the two halves packed by vpmovdb. */
static int nf4_block64(const void *p, dol_dtype t, uint16_t *scale, uint8_t *codes)
{
    __m512 w[4], mx = _mm512_setzero_ps();
    __mmask16 ok = 0xFFFF;
    const __m512 lim = _mm512_set1_ps(65504.0f);
    for (int i = 0; i < 4; i++) {
        w[i] = v_load_w(p, t, (size_t)(16 * i));
        __m512 a = _mm512_abs_ps(w[i]);
        ok &= _mm512_cmp_ps_mask(a, lim, _CMP_LE_OQ); /* false for NaN */
        mx = _mm512_max_ps(mx, a);
    }
    if (ok != 0xFFFF) return -1;
    const uint16_t h = scale_to_f16(_mm512_reduce_max_ps(mx));
    const float s = scale_from_f16(h);
    if (isinf(s)) return -1;
    *scale = h;
    __m512i c[4];
    if (s > 0.0f) {
        const __m512d sd = _mm512_set1_pd((double)s);
#define RD (_MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC) /* an immediate, also at -O0 */
        __m256 lo = _mm512_cvt_roundpd_ps(_mm512_mul_pd(_mm512_loadu_pd(dol_nf4_mids), sd), RD);
        __m256 hi = _mm512_cvt_roundpd_ps(_mm512_mul_pd(_mm512_loadu_pd(dol_nf4_mids + 8), sd), RD);
#undef RD
        const __m512 th = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
        static const int off[4] = { 7, 3, 1, 0 }, step[4] = { 8, 4, 2, 1 };
        for (int i = 0; i < 4; i++) c[i] = _mm512_setzero_si512();
        for (int k = 0; k < 4; k++) {
            const __m512i o = _mm512_set1_epi32(off[k]), st = _mm512_set1_epi32(step[k]);
            for (int i = 0; i < 4; i++) {
                __m512 tv = _mm512_permutexvar_ps(_mm512_add_epi32(c[i], o), th);
                __mmask16 gt = _mm512_cmp_ps_mask(w[i], tv, _CMP_GT_OQ);
                c[i] = _mm512_mask_add_epi32(c[i], gt, c[i], st);
            }
        }
    } else {
        for (int i = 0; i < 4; i++) c[i] = _mm512_set1_epi32(7);
    }
    _mm_storeu_si128((__m128i *)codes,
                     _mm512_cvtepi32_epi8(_mm512_or_si512(c[0], _mm512_slli_epi32(c[2], 4))));
    _mm_storeu_si128((__m128i *)(codes + 16),
                     _mm512_cvtepi32_epi8(_mm512_or_si512(c[1], _mm512_slli_epi32(c[3], 4))));
    return 0;
}
#elif DOL_VARIANT_ID == 2
/* A full block of 64 in eight 8-lane vectors: the codes by counting the
 * thresholds below each weight (15 compares, each mask subtracted as -1). */
static int nf4_block64(const void *p, dol_dtype t, uint16_t *scale, uint8_t *codes)
{
    __m256 w[8], mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    const __m256 lim = _mm256_set1_ps(65504.0f), sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < 8; i++) {
        w[i] = v_load_w(p, t, (size_t)(8 * i));
        __m256 a = _mm256_andnot_ps(sign, w[i]);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, lim, _CMP_NLE_UQ)); /* true for NaN */
        mx = _mm256_max_ps(mx, a);
    }
    if (_mm256_movemask_ps(bad)) return -1;
    float m8[8], absmax = 0.0f;
    _mm256_storeu_ps(m8, mx);
    for (int i = 0; i < 8; i++) absmax = m8[i] > absmax ? m8[i] : absmax;
    const uint16_t h = scale_to_f16(absmax);
    const float s = scale_from_f16(h);
    if (isinf(s)) return -1;
    *scale = h;
    __m256i c[8];
    if (s > 0.0f) {
        float th[16];
        nf4_thresholds(s, th);
        for (int i = 0; i < 8; i++) c[i] = _mm256_setzero_si256();
        for (int m = 0; m < 15; m++) {
            const __m256 tm = _mm256_set1_ps(th[m]);
            for (int i = 0; i < 8; i++)
                c[i] = _mm256_sub_epi32(c[i], _mm256_castps_si256(_mm256_cmp_ps(w[i], tm, _CMP_GT_OQ)));
        }
    } else {
        for (int i = 0; i < 8; i++) c[i] = _mm256_set1_epi32(7);
    }
    /* bytes j = c[j] | c[j + 32] << 4, 8 at a time: pack 32 -> 16 -> 8 bits */
    for (int i = 0; i < 4; i += 2) {
        __m256i a = _mm256_or_si256(c[i], _mm256_slli_epi32(c[i + 4], 4));
        __m256i b = _mm256_or_si256(c[i + 1], _mm256_slli_epi32(c[i + 5], 4));
        __m256i p16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
        __m128i p8 = _mm_packus_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
        _mm_storeu_si128((__m128i *)(codes + 8 * i), p8);
    }
    return 0;
}
#else
static int nf4_block64(const void *p, dol_dtype t, uint16_t *scale, uint8_t *codes)
{
    return nf4_block_scalar(p, t, DOL_NF4_BLOCK, scale, codes);
}
#endif

static int k_nf4_quantize_rows(const void *src, dol_dtype t, const dol_nf4_matrix *m, int64_t r0,
                               int64_t r1)
{
    const size_t esz = w_size(t);
    const int64_t K = m->cols, full = K / DOL_NF4_BLOCK;
    for (int64_t r = r0; r < r1; r++) {
        const char *row = (const char *)src + (size_t)(r * K) * esz;
        uint16_t *sc = m->scales + r * m->blocks_per_row;
        uint8_t *cd = m->codes + r * (K / 2);
        for (int64_t b = 0; b < full; b++)
            if (nf4_block64(row + (size_t)(b * DOL_NF4_BLOCK) * esz, t, sc + b,
                            cd + b * (DOL_NF4_BLOCK / 2)) != 0)
                return -1;
        if (full < m->blocks_per_row &&
            nf4_block_scalar(row + (size_t)(full * DOL_NF4_BLOCK) * esz, t,
                             (int)(K - full * DOL_NF4_BLOCK), sc + full,
                             cd + full * (DOL_NF4_BLOCK / 2)) != 0)
            return -1;
    }
    return 0;
}

/* Q8_0 without a division: for a = |w| and the stored scale d > 0, the
 * exact q = floor(a / d + 1/2) (half away from zero) is found from the
 * estimate q0 = nearest integer to a * (1 / d) in float, which is within 1
 * of it (a / d <= 191, relative error < 2^-22), then corrected by two
 * exact comparisons: (q0 -+ 1/2) * d has at most 9 + 11 significant bits,
 * so it is exact in float, and q = q0 + [a >= (q0 + 1/2) d]
 * - [a < (q0 - 1/2) d]. q8.h's reference rounds the double quotient, which
 * never lands on a half unless the real quotient is one (a nonzero
 * a - (n + 1/2) d is at least 2^-35 d, far above half a double ulp of
 * a / d), so both give the same q; then clamped to 127 and signed. */
static inline float q8_mag(float a, float d, float inv)
{
    float q0 = (float)(int32_t)(a * inv + 0.5f);
    float q = q0;
    if (a >= (q0 + 0.5f) * d) q = q0 + 1.0f;
    if (a < (q0 - 0.5f) * d) q = q0 - 1.0f;
    return q > 127.0f ? 127.0f : q;
}

/* One Q8_0 block of n <= 32 weights from p (dtype t), scalar. */
static int q8_block_scalar(const void *p, dol_dtype t, int n, uint16_t *scale, int8_t *q)
{
    float w[DOL_Q8_BLOCK], absmax = 0.0f;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        w[i] = load_w1(p, t, i);
        float a = fabsf(w[i]);
        bad |= !(a <= 65504.0f * 127.0f);
        absmax = a > absmax ? a : absmax;
    }
    if (bad) return -1;
    const uint16_t h = scale_to_f16(absmax / 127.0f);
    const float d = scale_from_f16(h);
    if (isinf(d)) return -1;
    *scale = h;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < n; i++) {
        float m = d > 0.0f ? q8_mag(fabsf(w[i]), d, inv) : 0.0f;
        q[i] = (int8_t)(w[i] < 0.0f ? -(int)m : (int)m);
    }
    return 0;
}

#if DOL_VARIANT_ID == 3
/* A full block of 32 in two 16-lane vectors, q8_mag lane-wise. */
static int q8_block32(const void *p, dol_dtype t, uint16_t *scale, int8_t *q)
{
    __m512 w[2], a[2], mx = _mm512_setzero_ps();
    __mmask16 ok = 0xFFFF;
    const __m512 lim = _mm512_set1_ps(65504.0f * 127.0f);
    for (int i = 0; i < 2; i++) {
        w[i] = v_load_w(p, t, (size_t)(16 * i));
        a[i] = _mm512_abs_ps(w[i]);
        ok &= _mm512_cmp_ps_mask(a[i], lim, _CMP_LE_OQ);
        mx = _mm512_max_ps(mx, a[i]);
    }
    if (ok != 0xFFFF) return -1;
    const uint16_t h = scale_to_f16(_mm512_reduce_max_ps(mx) / 127.0f);
    const float d = scale_from_f16(h);
    if (isinf(d)) return -1;
    *scale = h;
    if (!(d > 0.0f)) {
        memset(q, 0, DOL_Q8_BLOCK);
        return 0;
    }
    const __m512 dv = _mm512_set1_ps(d), iv = _mm512_set1_ps(1.0f / d);
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    for (int i = 0; i < 2; i++) {
        __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(a[i], iv), half)));
        __mmask16 up = _mm512_cmp_ps_mask(a[i], _mm512_mul_ps(_mm512_add_ps(q0, half), dv), _CMP_GE_OQ);
        __mmask16 dn = _mm512_cmp_ps_mask(a[i], _mm512_mul_ps(_mm512_sub_ps(q0, half), dv), _CMP_LT_OQ);
        __m512 m = _mm512_mask_add_ps(q0, up, q0, one);
        m = _mm512_mask_sub_ps(m, dn, q0, one);
        m = _mm512_min_ps(m, _mm512_set1_ps(127.0f));
        __m512i qi = _mm512_cvttps_epi32(m);
        __mmask16 neg = _mm512_cmp_ps_mask(w[i], _mm512_setzero_ps(), _CMP_LT_OQ);
        qi = _mm512_mask_sub_epi32(qi, neg, _mm512_setzero_si512(), qi);
        if (((uintptr_t)q & 15) == 0) /* past the caches: nothing reads it during the load */
            _mm_stream_si128((__m128i *)(q + 16 * i), _mm512_cvtepi32_epi8(qi));
        else
            _mm_storeu_si128((__m128i *)(q + 16 * i), _mm512_cvtepi32_epi8(qi));
    }
    return 0;
}
#elif DOL_VARIANT_ID == 2
/* A full block of 32 in four 8-lane vectors, q8_mag lane-wise. */
static int q8_block32(const void *p, dol_dtype t, uint16_t *scale, int8_t *q)
{
    __m256 w[4], a[4], mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    const __m256 lim = _mm256_set1_ps(65504.0f * 127.0f), sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < 4; i++) {
        w[i] = v_load_w(p, t, (size_t)(8 * i));
        a[i] = _mm256_andnot_ps(sign, w[i]);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a[i], lim, _CMP_NLE_UQ));
        mx = _mm256_max_ps(mx, a[i]);
    }
    if (_mm256_movemask_ps(bad)) return -1;
    float m8[8], absmax = 0.0f;
    _mm256_storeu_ps(m8, mx);
    for (int i = 0; i < 8; i++) absmax = m8[i] > absmax ? m8[i] : absmax;
    const uint16_t h = scale_to_f16(absmax / 127.0f);
    const float d = scale_from_f16(h);
    if (isinf(d)) return -1;
    *scale = h;
    if (!(d > 0.0f)) {
        memset(q, 0, DOL_Q8_BLOCK);
        return 0;
    }
    const __m256 dv = _mm256_set1_ps(d), iv = _mm256_set1_ps(1.0f / d);
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    __m256i qi[4];
    for (int i = 0; i < 4; i++) {
        __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(a[i], iv), half)));
        __m256 up = _mm256_cmp_ps(a[i], _mm256_mul_ps(_mm256_add_ps(q0, half), dv), _CMP_GE_OQ);
        __m256 dn = _mm256_cmp_ps(a[i], _mm256_mul_ps(_mm256_sub_ps(q0, half), dv), _CMP_LT_OQ);
        __m256 m = _mm256_add_ps(q0, _mm256_and_ps(up, one));
        m = _mm256_sub_ps(m, _mm256_and_ps(dn, one));
        m = _mm256_min_ps(m, _mm256_set1_ps(127.0f));
        __m256i v = _mm256_cvttps_epi32(m);
        __m256i neg = _mm256_castps_si256(_mm256_cmp_ps(w[i], _mm256_setzero_ps(), _CMP_LT_OQ));
        qi[i] = _mm256_sub_epi32(_mm256_xor_si256(v, neg), neg); /* -v where negative */
    }
    __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
    __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    /* the in-lane packs leave the 4-byte groups as the first four weights of
     * vectors 0..3, then their last four: put each vector's two together */
    p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p8);
    return 0;
}
#else
static int q8_block32(const void *p, dol_dtype t, uint16_t *scale, int8_t *q)
{
    return q8_block_scalar(p, t, DOL_Q8_BLOCK, scale, q);
}
#endif

static int k_q8_quantize_rows(const void *src, dol_dtype t, const dol_q8_matrix *m, int64_t r0,
                              int64_t r1)
{
    const size_t esz = w_size(t);
    const int64_t K = m->cols, full = K / DOL_Q8_BLOCK;
    int rc = 0;
    for (int64_t r = r0; r < r1 && rc == 0; r++) {
        const char *row = (const char *)src + (size_t)(r * K) * esz;
        uint16_t *sc = m->scales + r * m->blocks_per_row;
        int8_t *qr = m->quants + r * K;
        for (int64_t b = 0; b < full && rc == 0; b++)
            rc = q8_block32(row + (size_t)(b * DOL_Q8_BLOCK) * esz, t, sc + b,
                            qr + b * DOL_Q8_BLOCK);
        if (rc == 0 && full < m->blocks_per_row)
            rc = q8_block_scalar(row + (size_t)(full * DOL_Q8_BLOCK) * esz, t,
                                 (int)(K - full * DOL_Q8_BLOCK), sc + full,
                                 qr + full * DOL_Q8_BLOCK);
    }
#if DOL_VARIANT_ID == 3
    _mm_sfence(); /* the streamed stores of q8_block32 before the pool's hand-back */
#endif
    return rc;
}

/* ---- checksums ------------------------------------------------------------- */

/* xxHash inlined, so that its XXH3 picks this variant's vector width
 * (XXH_VECTOR follows __AVX512F__ / __AVX2__ / SSE2); the result is the
 * same 64 bits for every width. */
#define XXH_INLINE_ALL
#include <xxhash.h>

static uint64_t k_xxh3(const void *p, size_t n) { return XXH3_64bits(p, n); }

/* ---- the table ------------------------------------------------------------ */

const dol_cpu_kernels DOL_CAT(dol_cpu_kernels_, DOL_CPU_VARIANT) = {
    .name = DOL_STR(DOL_CPU_VARIANT),
#ifdef DOL_SIMD
    .lanes = DOL_SIMD,
#else
    .lanes = 1,
#endif
    .dot = k_dot,
    .matmul_rows = k_matmul_rows,
    .matmul_packed_rows = k_matmul_packed_rows,
    .nf4_rows = k_nf4_rows,
    .q8_rows = k_q8_rows,
    .nf4_panel = k_nf4_panel,
    .q8_panel = k_q8_panel,
    .rmsnorm = k_rmsnorm,
    .rope = k_rope,
    .silu_mul = k_silu_mul,
    .attn_head = k_attn_head,
    .attn_head_h = k_attn_head_h,
    .nf4_quantize_rows = k_nf4_quantize_rows,
    .q8_quantize_rows = k_q8_quantize_rows,
    .xxh3 = k_xxh3,
};
