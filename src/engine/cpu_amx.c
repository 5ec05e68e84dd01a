/* src/engine/cpu_amx.c — products on Intel AMX (cpu_amx.h): BF16x3 (packing
 * of x and of groups of W rows into hi/lo bf16 tiles, and the tile loop) and
 * AMX-INT8 (x's int8 blocks packed for the tile unit, the block loop with
 * its F32 scaling).
 * The file is compiled without extra flags; the functions that use AMX and
 * AVX-512 carry target attributes, so nothing here runs such instructions
 * before dol_amx_available has said yes. */
#include "engine/cpu_amx.h"

#include "engine/cpu_i8.h"
#include "engine/nf4.h"
#include "engine/q8.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define DOL_AMX_BUILT 1
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

size_t dol_amx_x_elems(int T, int K)
{
    size_t tb = (size_t)(T + DOL_AMX_ROWS - 1) / DOL_AMX_ROWS;
    return tb * (size_t)(K / DOL_AMX_K) * 2 * DOL_AMX_ROWS * DOL_AMX_K;
}

size_t dol_amx_w_elems(int K) { return 2 * (size_t)DOL_AMX_ROWS * (size_t)K; }

#ifdef DOL_AMX_BUILT

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,f16c")))

static bool amx_ok, amx_i8_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    const bool tile = d & (1u << 24), bf16 = d & (1u << 22), int8 = d & (1u << 25);
    const bool avx512 = (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31)); /* F, BW, VL */
    unsigned a1, b1, c1, d1;
    if (!__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) return;
    const bool avx512bf16 = a1 & (1u << 5);
    if (!(tile && avx512 && ((bf16 && avx512bf16) || int8))) return;
    /* OSXSAVE, then XCR0: the ZMM states (5-7) and the tile states (17-18) */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    const unsigned long long xcr0 = ((unsigned long long)hi << 32) | lo;
    if ((xcr0 & 0x600e0ull) != 0x600e0ull) return;
    /* Linux hands out the tile data state only on request */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return;
    amx_ok = bf16 && avx512bf16;
    amx_i8_ok = int8;
}

bool dol_amx_available(void)
{
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}

bool dol_amx_i8_available(void)
{
    pthread_once(&amx_once, amx_probe);
    return amx_i8_ok;
}

/* 16 floats -> their bf16 hi parts and lo parts (round to nearest even;
 * v - hi is exact in f32). */
AMX_TARGET static inline void split16(__m512 v, __m256i *hi, __m256i *lo)
{
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    const __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    *hi = h;
    *lo = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, hf));
}

AMX_TARGET void dol_amx_pack_x(uint16_t *xp, const float *x, int T, int K, int tb0, int tb1)
{
    const int KC = K / DOL_AMX_K;
    for (int tb = tb0; tb < tb1; tb++) {
        for (int kc = 0; kc < KC; kc++) {
            uint32_t *bh = (uint32_t *)(xp + ((size_t)tb * KC + kc) * 2 * 512);
            uint32_t *bl = bh + 256;
            for (int i = 0; i < DOL_AMX_ROWS; i++) {
                const int t = tb * DOL_AMX_ROWS + i;
                if (t >= T) {
                    for (int p = 0; p < 16; p++) bh[p * 16 + i] = bl[p * 16 + i] = 0;
                    continue;
                }
                const float *src = x + (size_t)t * K + (size_t)kc * DOL_AMX_K;
                uint32_t ph[16], pl[16];
                __m256i h0, l0, h1, l1;
                split16(_mm512_loadu_ps(src), &h0, &l0);
                split16(_mm512_loadu_ps(src + 16), &h1, &l1);
                _mm256_storeu_si256((__m256i *)ph, h0);
                _mm256_storeu_si256((__m256i *)(ph + 8), h1);
                _mm256_storeu_si256((__m256i *)pl, l0);
                _mm256_storeu_si256((__m256i *)(pl + 8), l1);
                /* pair p (inputs 2p, 2p+1) of token i goes to row p, column i */
                for (int p = 0; p < 16; p++) {
                    bh[p * 16 + i] = ph[p];
                    bl[p * 16 + i] = pl[p];
                }
            }
        }
    }
}

/* Where input k of row r of a W group goes (its hi part; lo is 512 on). */
static inline size_t w_at(int r, int k)
{
    return (size_t)(k / DOL_AMX_K) * 1024 + (size_t)r * DOL_AMX_K + (size_t)(k % DOL_AMX_K);
}

/* Zero rows m..15 of a W group (hi and lo). */
static void w_zero_rows(uint16_t *wp, int m, int K)
{
    if (m >= DOL_AMX_ROWS) return;
    for (int kc = 0; kc < K / DOL_AMX_K; kc++) {
        memset(wp + w_at(m, kc * DOL_AMX_K), 0, sizeof(uint16_t) * (size_t)(DOL_AMX_ROWS - m) * DOL_AMX_K);
        memset(wp + w_at(m, kc * DOL_AMX_K) + 512, 0,
               sizeof(uint16_t) * (size_t)(DOL_AMX_ROWS - m) * DOL_AMX_K);
    }
}

AMX_TARGET void dol_amx_w_from_f32(uint16_t *wp, const float *rows, int m, int K)
{
    for (int k = 0; k < K; k += 16) { /* block-major, so the tiles fill one after the other */
        for (int r = 0; r < m; r++) {
            __m256i h, l;
            split16(_mm512_loadu_ps(rows + (size_t)r * K + k), &h, &l);
            _mm256_storeu_si256((__m256i *)(wp + w_at(r, k)), h);
            _mm256_storeu_si256((__m256i *)(wp + w_at(r, k) + 512), l);
        }
    }
    w_zero_rows(wp, m, K);
}

/* Packed layout of cpu_kernels.h: panels of 4 rows, chunks of 16 inputs. */
#define PACK_ROWS 4
#define PACK_K 16

AMX_TARGET void dol_amx_w_from_packed(uint16_t *wp, const void *Wp, dol_dtype t, int n, int m, int K)
{
    const uint16_t *W = Wp;
    for (int c = 0; c < K / PACK_K; c++) { /* block-major, so the tiles fill one after the other */
        for (int r = 0; r < m; r++) {
            const int row = n + r;
            const uint16_t *panel = W + (size_t)(row / PACK_ROWS) * PACK_ROWS * (size_t)K +
                                    (size_t)(row % PACK_ROWS) * PACK_K;
            const uint16_t *s = panel + (size_t)c * PACK_ROWS * PACK_K;
            uint16_t *d = wp + w_at(r, c * PACK_K);
            if (t == DOL_DTYPE_BF16) { /* exact: lo is zero */
                memcpy(d, s, sizeof(uint16_t) * PACK_K);
                memset(d + 512, 0, sizeof(uint16_t) * PACK_K);
            } else {
                __m256i h, l;
                split16(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s)), &h, &l);
                _mm256_storeu_si256((__m256i *)d, h);
                _mm256_storeu_si256((__m256i *)(d + 512), l);
            }
        }
    }
    w_zero_rows(wp, m, K);
}

/* NF4: per 64-weight block, the 16 levels times the block's scale (the
 * products dequantization makes, dol_nf4_dequantize_block) looked up by
 * code, then split; byte j of a block holds the codes of inputs j and
 * j + 32. */
AMX_TARGET void dol_amx_w_from_nf4(uint16_t *wp, const dol_nf4_matrix *W, int n, int m)
{
    const int K = (int)W->cols;
    const __m512 levels = _mm512_loadu_ps(dol_nf4_levels);
    const __m512i low = _mm512_set1_epi32(0xF);
    /* block-major, so the tiles fill one after the other */
    for (int b = 0; b < K / DOL_NF4_BLOCK; b++) {
        for (int r = 0; r < m; r++) {
            const uint8_t *codes = W->codes + (size_t)(n + r) * (size_t)(K / 2);
            const uint16_t *scales = W->scales + (size_t)(n + r) * (size_t)W->blocks_per_row;
            const __m512 lut = _mm512_mul_ps(levels, _mm512_set1_ps(_cvtsh_ss(scales[b])));
            const uint8_t *c = codes + (size_t)b * (DOL_NF4_BLOCK / 2);
            for (int h = 0; h < 2; h++) { /* codes of inputs 16h.. (low) and 32 + 16h.. (high) */
                const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c + 16 * h)));
                const int k = b * DOL_NF4_BLOCK + 16 * h;
                __m256i hi, lo;
                split16(_mm512_permutexvar_ps(_mm512_and_si512(v, low), lut), &hi, &lo);
                _mm256_storeu_si256((__m256i *)(wp + w_at(r, k)), hi);
                _mm256_storeu_si256((__m256i *)(wp + w_at(r, k) + 512), lo);
                split16(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut), &hi, &lo);
                _mm256_storeu_si256((__m256i *)(wp + w_at(r, k + 32)), hi);
                _mm256_storeu_si256((__m256i *)(wp + w_at(r, k + 32) + 512), lo);
            }
        }
    }
    w_zero_rows(wp, m, K);
}

/* Q8_0: q * d, exact in f32, then split. */
AMX_TARGET void dol_amx_w_from_q8(uint16_t *wp, const dol_q8_matrix *W, int n, int m)
{
    const int K = (int)W->cols;
    for (int k = 0; k < K; k += 16) { /* block-major, so the tiles fill one after the other */
        for (int r = 0; r < m; r++) {
            const int8_t *q = W->quants + (size_t)(n + r) * (size_t)K;
            const uint16_t *scales = W->scales + (size_t)(n + r) * (size_t)W->blocks_per_row;
            const __m512 d = _mm512_set1_ps(_cvtsh_ss(scales[k / DOL_Q8_BLOCK]));
            const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + k))));
            __m256i hi, lo;
            split16(_mm512_mul_ps(v, d), &hi, &lo);
            _mm256_storeu_si256((__m256i *)(wp + w_at(r, k)), hi);
            _mm256_storeu_si256((__m256i *)(wp + w_at(r, k) + 512), lo);
        }
    }
    w_zero_rows(wp, m, K);
}

/* Tile configuration (palette 1) of BF16x3: eight tiles of 16 rows x 64
 * bytes. 0, 1: C of two token blocks; 2, 3: W hi / lo; 4-7: x hi / lo of
 * the two token blocks. */
typedef dol_amx_tile_config tile_config;

/* C (16 rows of W x 16 tokens) into out, transposed. */
static void store_c(float *out, int N, int n0, int m, int t0, int T, const float *c)
{
    for (int i = 0; i < DOL_AMX_ROWS && t0 + i < T; i++) {
        float *o = out + (size_t)(t0 + i) * N + n0;
        for (int r = 0; r < m; r++) o[r] = c[r * DOL_AMX_ROWS + i];
    }
}

/* One 32-input step of C[g][t] += W[g] x[t] for two groups of W rows and two
 * token blocks, the three BF16x3 products in turn (hi x hi, hi x lo,
 * lo x hi). Tiles: C[g][t] in tmm 2g + t, W hi or lo of group 0 / 1 in
 * tmm 4 / 5, x hi or lo of token block 0 / 1 in tmm 6 / 7; the second load
 * of x hi finds it in L1. */
#define STEP_22(w0, w1, x0, x1)                                                      \
    do {                                                                             \
        _tile_loadd(4, (w0), 64);                                                    \
        _tile_loadd(5, (w1), 64);                                                    \
        _tile_loadd(6, (x0), 64);                                                    \
        _tile_loadd(7, (x1), 64);                                                    \
        _tile_dpbf16ps(0, 4, 6);                                                     \
        _tile_dpbf16ps(1, 4, 7);                                                     \
        _tile_dpbf16ps(2, 5, 6);                                                     \
        _tile_dpbf16ps(3, 5, 7);                                                     \
        _tile_loadd(6, (x0) + 512, 64);                                              \
        _tile_loadd(7, (x1) + 512, 64);                                              \
        _tile_dpbf16ps(0, 4, 6);                                                     \
        _tile_dpbf16ps(1, 4, 7);                                                     \
        _tile_dpbf16ps(2, 5, 6);                                                     \
        _tile_dpbf16ps(3, 5, 7);                                                     \
        _tile_loadd(4, (w0) + 512, 64);                                              \
        _tile_loadd(5, (w1) + 512, 64);                                              \
        _tile_loadd(6, (x0), 64);                                                    \
        _tile_loadd(7, (x1), 64);                                                    \
        _tile_dpbf16ps(0, 4, 6);                                                     \
        _tile_dpbf16ps(1, 4, 7);                                                     \
        _tile_dpbf16ps(2, 5, 6);                                                     \
        _tile_dpbf16ps(3, 5, 7);                                                     \
    } while (0)

/* The same for one group and one or two token blocks, or two groups and
 * one token block: C tiles 0 and 1 (0 = first group / first block). */
#define STEP_12(w0, x0, x1)                                                          \
    do {                                                                             \
        _tile_loadd(4, (w0), 64);                                                    \
        _tile_loadd(5, (w0) + 512, 64);                                              \
        _tile_loadd(6, (x0), 64);                                                    \
        _tile_loadd(7, (x1), 64);                                                    \
        _tile_dpbf16ps(0, 4, 6);                                                     \
        _tile_dpbf16ps(1, 4, 7);                                                     \
        _tile_dpbf16ps(0, 5, 6);                                                     \
        _tile_dpbf16ps(1, 5, 7);                                                     \
        _tile_loadd(6, (x0) + 512, 64);                                              \
        _tile_loadd(7, (x1) + 512, 64);                                              \
        _tile_dpbf16ps(0, 4, 6);                                                     \
        _tile_dpbf16ps(1, 4, 7);                                                     \
    } while (0)
#define STEP_21(w0, w1, x0)                                                          \
    do {                                                                             \
        _tile_loadd(4, (w0), 64);                                                    \
        _tile_loadd(5, (w1), 64);                                                    \
        _tile_loadd(6, (x0), 64);                                                    \
        _tile_loadd(7, (x0) + 512, 64);                                              \
        _tile_dpbf16ps(0, 4, 6);                                                     \
        _tile_dpbf16ps(1, 5, 6);                                                     \
        _tile_dpbf16ps(0, 4, 7);                                                     \
        _tile_dpbf16ps(1, 5, 7);                                                     \
        _tile_loadd(4, (w0) + 512, 64);                                              \
        _tile_loadd(5, (w1) + 512, 64);                                              \
        _tile_dpbf16ps(0, 4, 6);                                                     \
        _tile_dpbf16ps(1, 5, 6);                                                     \
    } while (0)

AMX_TARGET void dol_amx_product(float *out, int N, int n0, int m, const uint16_t *wp,
                                const uint16_t *xp, int T, int K)
{
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = DOL_AMX_ROWS;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
    const int KC = K / DOL_AMX_K, TB = (T + DOL_AMX_ROWS - 1) / DOL_AMX_ROWS;
    const int m0 = m < DOL_AMX_ROWS ? m : DOL_AMX_ROWS, m1 = m - m0; /* rows of each group */
    const uint16_t *w0 = wp, *w1 = wp + dol_amx_w_elems(K);
    _Alignas(64) float c[DOL_AMX_ROWS * DOL_AMX_ROWS];
    for (int tb = 0; tb < TB; tb += 2) {
        const uint16_t *x0 = xp + (size_t)tb * KC * 1024, *x1 = x0 + (size_t)KC * 1024;
        const bool two_t = tb + 1 < TB;
        const int t0 = tb * DOL_AMX_ROWS, t1 = t0 + DOL_AMX_ROWS;
        _tile_zero(0);
        _tile_zero(1);
        if (m1 > 0 && two_t) {
            _tile_zero(2);
            _tile_zero(3);
            for (size_t o = 0; o < (size_t)KC * 1024; o += 1024) STEP_22(w0 + o, w1 + o, x0 + o, x1 + o);
            _tile_stored(0, c, 64); store_c(out, N, n0, m0, t0, T, c);
            _tile_stored(1, c, 64); store_c(out, N, n0, m0, t1, T, c);
            _tile_stored(2, c, 64); store_c(out, N, n0 + DOL_AMX_ROWS, m1, t0, T, c);
            _tile_stored(3, c, 64); store_c(out, N, n0 + DOL_AMX_ROWS, m1, t1, T, c);
        } else if (m1 > 0) {
            for (size_t o = 0; o < (size_t)KC * 1024; o += 1024) STEP_21(w0 + o, w1 + o, x0 + o);
            _tile_stored(0, c, 64); store_c(out, N, n0, m0, t0, T, c);
            _tile_stored(1, c, 64); store_c(out, N, n0 + DOL_AMX_ROWS, m1, t0, T, c);
        } else {
            /* one group; a lone last token block pairs with itself and its
             * second result is dropped */
            const uint16_t *xb = two_t ? x1 : x0;
            for (size_t o = 0; o < (size_t)KC * 1024; o += 1024) STEP_12(w0 + o, x0 + o, xb + o);
            _tile_stored(0, c, 64); store_c(out, N, n0, m0, t0, T, c);
            if (two_t) { _tile_stored(1, c, 64); store_c(out, N, n0, m0, t1, T, c); }
        }
    }
    _tile_release();
}

/* ---- AMX-INT8 ---------------------------------------------------------------- */

#define AMX_I8_TARGET __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl")))
#define I8X_BLOCK 768 /* bytes of one (token block, input block) of packed x */

size_t dol_amx_i8_x_bytes(int T, int K)
{
    return (size_t)((T + DOL_AMX_ROWS - 1) / DOL_AMX_ROWS) * (size_t)(K / 32) * I8X_BLOCK;
}

AMX_I8_TARGET void dol_amx_i8_pack_x(uint8_t *xp, const dol_i8_act *a, int tb0, int tb1)
{
    const int nb = a->nb;
    for (int tb = tb0; tb < tb1; tb++)
        for (int kc = 0; kc < nb; kc++) {
            uint8_t *blk = xp + ((size_t)tb * (size_t)nb + (size_t)kc) * I8X_BLOCK;
            uint32_t *q4 = (uint32_t *)blk;
            float *f = (float *)(blk + 512);
            for (int i = 0; i < DOL_AMX_ROWS; i++) {
                const int t = tb * DOL_AMX_ROWS + i;
                if (t >= a->T) {
                    for (int p = 0; p < 8; p++) q4[p * 16 + i] = 0;
                    f[i] = f[16 + i] = f[32 + i] = f[48 + i] = 0.0f;
                    continue;
                }
                const size_t o = (size_t)t * (size_t)nb + (size_t)kc;
                const int8_t *q = a->q + o * 32;
                for (int p = 0; p < 8; p++) memcpy(&q4[p * 16 + i], q + 4 * p, 4);
                int lo = 0, hi = 0;
                for (int k = 0; k < 16; k++) lo += q[k], hi += q[16 + k];
                const float d = a->d[o];
                f[i] = d;
                f[16 + i] = (float)lo * d;
                f[32 + i] = (float)hi * d;
                f[48 + i] = (float)(lo + hi) * d;
            }
        }
}

/* acc[r] (16 tokens) += C[r] * (sw[r] * d) [- mw[r] * s] for the 16 rows,
 * with the scales and minima of half-block j (2b + h) and x's block at xb
 * (d, and the sum in row sel of its floats). */
AMX_I8_TARGET static inline __attribute__((always_inline)) void i8_epilogue(
    __m512 *acc, const int32_t *c, const float *sw, const float *mw, int j, const uint8_t *xb, int sel,
    bool min)
{
    const float *xf = (const float *)(xb + 512);
    const __m512 d = _mm512_load_ps(xf), s = _mm512_load_ps(xf + 16 * sel);
    sw += (size_t)j * 16, mw += (size_t)j * 16;
#pragma GCC unroll 16
    for (int r = 0; r < DOL_AMX_ROWS; r++) {
        const __m512 v = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(c + 16 * r)));
        acc[r] = _mm512_fmadd_ps(v, _mm512_mul_ps(_mm512_set1_ps(sw[r]), d), acc[r]);
        if (min) acc[r] = _mm512_fnmadd_ps(_mm512_set1_ps(mw[r]), s, acc[r]);
    }
}

/* C tile c = W tile a (from w, rows 32 bytes apart) x x tile t (from x). */
#define I8_TILE_PRODUCT(c, a, t, w, x) \
    do {                               \
        _tile_loadd(a, (w), 32);       \
        _tile_loadd(t, (x), 64);       \
        _tile_zero(c);                 \
        _tile_dpbssd(c, a, t);         \
    } while (0)

/* One token block against every input block; C double-buffered in tiles 0
 * and 1. Whole blocks: W in tiles 2 / 4, x in 3 / 5 (even / odd block);
 * halves: W's halves in 2 / 4, x's in 3 / 5. */
AMX_I8_TARGET static inline __attribute__((always_inline)) void i8_token_block(
    __m512 *acc, const int8_t *wq, const float *sw, const float *mw, const uint8_t *xb, int nb,
    bool halves, bool min)
{
    _Alignas(64) int32_t c0[256], c1[256];
    for (int b = 0; b < nb; b++) {
        const uint8_t *x0 = xb + (size_t)b * I8X_BLOCK;
        const int8_t *w0 = wq + (size_t)b * 512;
        if (halves) {
            I8_TILE_PRODUCT(0, 2, 3, w0, x0);
            I8_TILE_PRODUCT(1, 4, 5, w0 + 16, x0 + 256);
            _tile_stored(0, c0, 64);
            i8_epilogue(acc, c0, sw, mw, 2 * b, x0, 1, min);
            _tile_stored(1, c1, 64);
            i8_epilogue(acc, c1, sw, mw, 2 * b + 1, x0, 2, min);
        } else if (b + 1 < nb) { /* two blocks, the second's product beside the first's scaling */
            I8_TILE_PRODUCT(0, 2, 3, w0, x0);
            I8_TILE_PRODUCT(1, 4, 5, w0 + 512, x0 + I8X_BLOCK);
            _tile_stored(0, c0, 64);
            i8_epilogue(acc, c0, sw, mw, 2 * b, x0, 3, min);
            _tile_stored(1, c1, 64);
            i8_epilogue(acc, c1, sw, mw, 2 * b + 2, x0 + I8X_BLOCK, 3, min);
            b++;
        } else {
            I8_TILE_PRODUCT(0, 2, 3, w0, x0);
            _tile_stored(0, c0, 64);
            i8_epilogue(acc, c0, sw, mw, 2 * b, x0, 3, min);
        }
    }
}

AMX_I8_TARGET void dol_amx_i8_product(float *out, int N, int n0, int m, const int8_t *wq,
                                      const float *sw, const float *mw, int flags,
                                      const uint8_t *xp, int T, int K)
{
    const bool halves = flags & DOL_I8_HALVES, min = flags & DOL_I8_MIN;
    const int kb = halves ? 16 : 32; /* inputs per tile product */
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 2; i++) cfg.rows[i] = DOL_AMX_ROWS, cfg.colsb[i] = 64;    /* C */
    for (int i = 2; i < 6; i += 2) cfg.rows[i] = DOL_AMX_ROWS, cfg.colsb[i] = kb; /* W */
    for (int i = 3; i < 6; i += 2) cfg.rows[i] = kb / 4, cfg.colsb[i] = 64;       /* x */
    _tile_loadconfig(&cfg);
    const int nb = K / 32, TB = (T + DOL_AMX_ROWS - 1) / DOL_AMX_ROWS;
    _Alignas(64) float c[DOL_AMX_ROWS * DOL_AMX_ROWS];
    for (int tb = 0; tb < TB; tb++) {
        __m512 acc[DOL_AMX_ROWS];
        for (int r = 0; r < DOL_AMX_ROWS; r++) acc[r] = _mm512_setzero_ps();
        const uint8_t *xb = xp + (size_t)tb * (size_t)nb * I8X_BLOCK;
        if (halves) {
            if (min) i8_token_block(acc, wq, sw, mw, xb, nb, true, true);
            else i8_token_block(acc, wq, sw, mw, xb, nb, true, false);
        } else {
            if (min) i8_token_block(acc, wq, sw, mw, xb, nb, false, true);
            else i8_token_block(acc, wq, sw, mw, xb, nb, false, false);
        }
        for (int r = 0; r < DOL_AMX_ROWS; r++) _mm512_store_ps(c + r * DOL_AMX_ROWS, acc[r]);
        store_c(out, N, n0, m, tb * DOL_AMX_ROWS, T, c);
    }
    _tile_release();
}

#else /* no AMX in this build: dol_amx_available says so and nothing else is called */

bool dol_amx_available(void) { return false; }

void dol_amx_pack_x(uint16_t *xp, const float *x, int T, int K, int tb0, int tb1)
{
    (void)xp; (void)x; (void)T; (void)K; (void)tb0; (void)tb1;
    abort();
}

void dol_amx_w_from_f32(uint16_t *wp, const float *rows, int m, int K)
{
    (void)wp; (void)rows; (void)m; (void)K;
    abort();
}

void dol_amx_w_from_packed(uint16_t *wp, const void *Wp, dol_dtype t, int n, int m, int K)
{
    (void)wp; (void)Wp; (void)t; (void)n; (void)m; (void)K;
    abort();
}

void dol_amx_w_from_nf4(uint16_t *wp, const dol_nf4_matrix *W, int n, int m)
{
    (void)wp; (void)W; (void)n; (void)m;
    abort();
}

void dol_amx_w_from_q8(uint16_t *wp, const dol_q8_matrix *W, int n, int m)
{
    (void)wp; (void)W; (void)n; (void)m;
    abort();
}

void dol_amx_product(float *out, int N, int n0, int m, const uint16_t *wp, const uint16_t *xp,
                     int T, int K)
{
    (void)out; (void)N; (void)n0; (void)m; (void)wp; (void)xp; (void)T; (void)K;
    abort();
}

bool dol_amx_i8_available(void) { return false; }

size_t dol_amx_i8_x_bytes(int T, int K)
{
    (void)T; (void)K;
    return 0;
}

void dol_amx_i8_pack_x(uint8_t *xp, const struct dol_i8_act *a, int tb0, int tb1)
{
    (void)xp; (void)a; (void)tb0; (void)tb1;
    abort();
}

void dol_amx_i8_product(float *out, int N, int n0, int m, const int8_t *wq, const float *sw,
                        const float *mw, int flags, const uint8_t *xp, int T, int K)
{
    (void)out; (void)N; (void)n0; (void)m; (void)wq; (void)sw; (void)mw; (void)flags; (void)xp; (void)T; (void)K;
    abort();
}

#endif
