/* src/engine/cpu_k_matmul.c — the CPU kernels' dot product and matrix
 * products over F32 / F16 / BF16 weights: row-major (matmul_rows) and over
 * the packed layout of cpu_kernels.h (matmul_packed_rows), with their
 * register tiles, lockstep stream tiles and tuning constants. Compiled once
 * per variant (cpu_k.h); exports DOL_K(dot), DOL_K(matmul_rows) and
 * DOL_K(matmul_packed_rows), everything else file-static.
 *
 * DOL_SIMD is the accumulator width: 16 (avx512), 8 (avx2) or undefined
 * (portable: scalar k order). The row-major product (matmul_rows) walks W
 * in tiles of MM_NC rows and runs up to four rows of x against each tile;
 * the engine's weights go through the packed product (matmul_packed_rows).
 * Either way W is streamed from memory once per call whatever the batch
 * size, and every tile follows the order of the dot product exactly, which
 * is what keeps outputs batch-invariant. Why the kernels are built this
 * way, with the measurements: docs/performance.md, "Design reasons". */
#include "engine/cpu_k.h"

#include <stddef.h>
#include <stdint.h>

/* The summation order, the same for every caller and every batch size: one
 * DOL_SIMD-lane accumulator over k in steps of DOL_SIMD, a horizontal sum,
 * then the scalar tail (portable: the scalar loop alone). Independent
 * chains come from computing several outputs at once, never from splitting
 * one output's sum. */
float DOL_K(dot)(const float *x, const void *w, dol_dtype t, int n)
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

/* Register tile: NR rows of x against MM_NC rows of W (n .. n+MM_NC-1), W of
 * dtype DT; each W vector is loaded (and converted from F16 / BF16) once for
 * all NR rows. Every output follows DOL_K(dot)'s order exactly. While it runs it
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

void DOL_K(matmul_rows)(float *out, const float *x, int T, int K, const void *W, dol_dtype wt,
                        int N, int n0, int n1)
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
            out[(size_t)t * N + n] = DOL_K(dot)(x + (size_t)t * K, w, wt, K);
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
 * prefetch of a later panel, see DOL_K(matmul_packed_rows)). Every output
 * follows DOL_K(dot)'s order exactly: the same vector steps over k, the same
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
 *                     ymm of AVX2 take 3 x 4 with x held (PACK_X_FIRST)
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
#define PACK_VREGS 32
#else
#define PACK_XROWS 3
#define PACK_VREGS 16
#endif
/* Whether an NR-row tile holds its NR rows of x in registers and streams W a
 * row at a time (NR x 4 accumulators + NR + 1 registers) rather than the
 * other way round (+ 4 + 1): only where the latter overflows the register
 * file (AVX2's 3 rows: 17 of 16), since with W read from memory, not cache,
 * the 4 loads side by side keep more misses in flight (AVX2 at 2 rows of x
 * and 8 MiB of F16 weights: 79-84 GFLOP/s against 68 the other way) */
#define PACK_X_FIRST(NR) ((NR) * DOL_PACK_ROWS + DOL_PACK_ROWS + 1 > PACK_VREGS)
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
/* The same look-ahead into L2 only (hint T1), for the lockstep tiles: with
 * four streams per thread, T0 prefetches held the L1 miss buffers the
 * streams' own loads need (Zen 4 batch 1 +10 %; docs/performance.md,
 * "Prefetching") */
static inline void prefetch_ahead_l2(const char *chunk, size_t esz)
{
    for (size_t b = 0; b < DOL_PACK_ROWS * DOL_PACK_K * esz; b += 64)
        _mm_prefetch(chunk + PACK_PF_BYTES + b, _MM_HINT_T1);
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
                if (!PACK_X_FIRST(NR)) { /* the 4 rows of W in registers */                 \
                    vecf w[DOL_PACK_ROWS];                                                  \
                    for (int c = 0; c < DOL_PACK_ROWS; c++)                                 \
                        w[c] = v_load_w(wc, t, (size_t)c * DOL_PACK_K + (size_t)kk);        \
                    for (int r = 0; r < NR; r++) {                                          \
                        vecf xv = v_in_register(v_load(x + (size_t)r * K + k + kk));        \
                        for (int c = 0; c < DOL_PACK_ROWS; c++)                             \
                            acc[r][c] = v_fma(xv, w[c], acc[r][c]);                         \
                    }                                                                       \
                    continue;                                                               \
                }                                                                           \
                /* the NR rows of x in registers, W one row at a time; the                  \
                 * empty asm keeps each accumulator in its register */                      \
                vecf xv[NR];                                                                \
                for (int r = 0; r < NR; r++)                                                \
                    xv[r] = v_in_register(v_load(x + (size_t)r * K + k + kk));              \
                for (int c = 0; c < DOL_PACK_ROWS; c++) {                                   \
                    vecf w = v_in_register(v_load_w(wc, t, (size_t)c * DOL_PACK_K + (size_t)kk)); \
                    for (int r = 0; r < NR; r++) acc[r][c] = v_fma(xv[r], w, acc[r][c]);   \
                }                                                                           \
                for (int r = 0; r < NR; r++)                                                \
                    for (int c = 0; c < DOL_PACK_ROWS; c++) acc[r][c] = v_in_register(acc[r][c]); \
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
 * steps, then v_sum4, so the bits are those of DOL_K(dot). Four streams per
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
            for (int s = 0; s < NS; s++) prefetch_ahead_l2(ws[s], esz);                     \
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

void DOL_K(matmul_packed_rows)(float *out, const float *x, int T, int K, const void *Wp,
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

