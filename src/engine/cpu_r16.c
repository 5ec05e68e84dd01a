/* src/engine/cpu_r16.c — the interleaved layout of cpu_r16.h: the repack
 * from each format's rows, the VNNI product (token tiles of up to 8 rows
 * of x against a group of 16 rows of W) and the AMX-INT8 product (16
 * tokens x 16 rows a tile product). Compiled without extra flags: the
 * kernels carry target attributes and run only where
 * dol_i8_r16_available (and, for the tile unit, dol_amx_i8_available)
 * says so. */
#include "engine/cpu_r16.h"

#include "engine/cpu_amx.h"

#include <stdlib.h>
#include <string.h>

bool dol_i8_r16_takes(dol_dtype t, int K)
{
    if (K <= 0 || K % 32 != 0) return false;
    if (t == DOL_I8_NF4) return K % 64 == 0;
    return t == DOL_DTYPE_Q4_0 || t == DOL_DTYPE_Q8_0 || t == DOL_I8_Q8;
}

bool dol_i8_r16_available(void) { return dol_cpu_i8_find("avx512vnni") != NULL; }

static size_t qs_bytes(const dol_i8_r16 *R) { return (size_t)R->groups * (size_t)R->nb * (size_t)R->bits * 64; }
static size_t sc_bytes(const dol_i8_r16 *R) { return (size_t)R->groups * (size_t)R->nb * 16 * sizeof(uint16_t); }

size_t dol_i8_r16_bytes(const dol_i8_r16 *R) { return R->qs ? qs_bytes(R) + sc_bytes(R) : 0; }

int dol_i8_r16_alloc(dol_i8_r16 *R, const dol_i8_weight *W)
{
    memset(R, 0, sizeof *R);
    R->N = W->N, R->K = W->K, R->nb = W->K / 32, R->groups = (W->N + DOL_R16_ROWS - 1) / DOL_R16_ROWS;
    R->bits = W->t == DOL_DTYPE_Q4_0 || W->t == DOL_I8_NF4 ? 4 : 8;
    R->off = W->t == DOL_DTYPE_Q4_0 ? 8 : 128;
    if (W->t == DOL_I8_NF4) {
        R->lut = true;
        R->smul = 1.0f / 127.0f;
        for (int i = 0; i < 16; i++) R->codes[i] = (uint8_t)(dol_nf4_i8_codes[i] + 128);
    }
    R->qs = aligned_alloc(64, (qs_bytes(R) + 63) / 64 * 64);
    R->sc = aligned_alloc(64, (sc_bytes(R) + 63) / 64 * 64);
    if (!R->qs || !R->sc) {
        dol_i8_r16_free(R);
        return -1;
    }
    return 0;
}

void dol_i8_r16_free(dol_i8_r16 *R)
{
    free(R->qs);
    free(R->sc);
    R->qs = NULL;
    R->sc = NULL;
}

/* Block b of row n as 32 values u (u = w + off; NF4: the codes) and its
 * F16 scale. */
static uint16_t row_block(const dol_i8_weight *W, int n, int b, uint8_t u[32])
{
    uint16_t h;
    if (W->t == DOL_DTYPE_Q8_0 || W->t == DOL_DTYPE_Q4_0) {
        const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)b * (W->t == DOL_DTYPE_Q8_0 ? 34 : 18);
        memcpy(&h, p, 2);
        if (W->t == DOL_DTYPE_Q8_0)
            for (int k = 0; k < 32; k++) u[k] = (uint8_t)(p[2 + k] ^ 0x80);
        else
            for (int k = 0; k < 16; k++) u[k] = p[2 + k] & 0xF, u[k + 16] = p[2 + k] >> 4;
    } else if (W->t == DOL_I8_Q8) {
        const dol_q8_matrix *m = W->q8;
        const int8_t *q = m->quants + (size_t)n * (size_t)m->cols + (size_t)b * 32;
        for (int k = 0; k < 32; k++) u[k] = (uint8_t)q[k] ^ 0x80;
        h = m->scales[(size_t)n * (size_t)m->blocks_per_row + (size_t)b];
    } else { /* NF4: codes of weights i and i + 32 of a block of 64 in the two nibbles of byte i */
        const dol_nf4_matrix *m = W->nf4;
        const uint8_t *c = m->codes + (size_t)n * (size_t)(m->cols / 2) + (size_t)(b >> 1) * 32;
        for (int k = 0; k < 32; k++) u[k] = (c[k] >> (4 * (b & 1))) & 0xF;
        h = m->scales[(size_t)n * (size_t)m->blocks_per_row + (size_t)(b >> 1)];
    }
    return h;
}

void dol_i8_r16_fill(dol_i8_r16 *R, const dol_i8_weight *W, int g0, int g1)
{
    const size_t bq = (size_t)R->bits * 64;
    for (int g = g0; g < g1; g++)
        for (int b = 0; b < R->nb; b++) {
            uint8_t *q = R->qs + ((size_t)g * (size_t)R->nb + (size_t)b) * bq;
            uint16_t *s = R->sc + ((size_t)g * (size_t)R->nb + (size_t)b) * 16;
            memset(q, 0, bq);
            for (int r = 0; r < DOL_R16_ROWS; r++) {
                const int n = g * DOL_R16_ROWS + r;
                uint8_t u[32];
                if (n >= R->N) {
                    s[r] = 0;
                    continue;
                }
                s[r] = row_block(W, n, b, u);
                for (int k = 0; k < 32; k++) {
                    const int pos = (k / 4) * 64 + r * 4 + k % 4;
                    if (R->bits == 8) q[pos] = u[k];
                    else q[(pos / 128) * 64 + pos % 64] |= (uint8_t)(u[k] << (4 * (pos / 64 % 2)));
                }
            }
        }
}

size_t dol_i8_r16_scratch_bytes(int K) { return (size_t)(K / 32) * 512 + 2 * 1024 + 64; }

#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#include <immintrin.h>

#define R16_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma")))
#define R16_AMX_TARGET __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512dq,avx512vl,f16c,fma")))
#define R16_TILE_MAX 8    /* rows of x a VNNI tile holds */
#define R16_PF_BYTES 8192 /* how far ahead the VNNI tiles prefetch the weights */

/* The 16 rows' scales of one block. */
#define R16_SCALE(R, sc)                                                               \
    ((R)->smul != 0.0f ? _mm512_mul_ps(_mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sc))), \
                                       _mm512_set1_ps((R)->smul))                      \
                       : _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sc))))

R16_TARGET static inline int32_t x4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Rows t0 .. t0+TT-1 of x against group g (rows n .. n+15, `mask` of them
 * real): per block, TT int32 vectors (one lane a row of W) started at
 * -off * sum q, then the 8 groups of 4 inputs, then the scaling. */
R16_TARGET static inline __attribute__((always_inline)) void vnni_tile(
    float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int g, int n, __mmask16 mask, int t0,
    const int TT)
{
    const int32_t *sq = a->sq;
    const int nb = R->nb, K = R->K;
    const size_t bq = (size_t)R->bits * 64;
    const uint8_t *qs = R->qs + (size_t)g * (size_t)nb * bq;
    const uint16_t *sc = R->sc + (size_t)g * (size_t)nb * 16;
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i book = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)R->codes));
    __m512 acc[R16_TILE_MAX];
    for (int i = 0; i < TT; i++) acc[i] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const int8_t *xq = a->q + (size_t)t0 * (size_t)K + (size_t)b * 32;
        const uint8_t *w = qs + (size_t)b * bq;
        /* the stream ahead into L2: the hardware prefetcher alone trails */
        for (size_t o = 0; o < bq; o += 64) _mm_prefetch((const char *)w + R16_PF_BYTES + o, _MM_HINT_T1);
        if (!(b & 1)) _mm_prefetch((const char *)(sc + (size_t)b * 16) + R16_PF_BYTES / 8, _MM_HINT_T1);
        __m512i I[R16_TILE_MAX];
        for (int i = 0; i < TT; i++) I[i] = _mm512_set1_epi32(-R->off * sq[(size_t)(t0 + i) * (size_t)nb + (size_t)b]);
        if (R->bits == 4) {
            for (int v = 0; v < 4; v++) {
                const __m512i raw = _mm512_load_si512((const void *)(w + 64 * v));
                __m512i lo = _mm512_and_si512(raw, m4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                if (R->lut) lo = _mm512_shuffle_epi8(book, lo), hi = _mm512_shuffle_epi8(book, hi);
                for (int i = 0; i < TT; i++) {
                    const int8_t *x = xq + (size_t)i * (size_t)K + 8 * v;
                    I[i] = _mm512_dpbusd_epi32(I[i], lo, _mm512_set1_epi32(x4(x)));
                    I[i] = _mm512_dpbusd_epi32(I[i], hi, _mm512_set1_epi32(x4(x + 4)));
                }
            }
        } else {
            for (int j = 0; j < 8; j++) {
                const __m512i u = _mm512_load_si512((const void *)(w + 64 * j));
                for (int i = 0; i < TT; i++)
                    I[i] = _mm512_dpbusd_epi32(I[i], u, _mm512_set1_epi32(x4(xq + (size_t)i * (size_t)K + 4 * j)));
            }
        }
        const __m512 sw = R16_SCALE(R, sc + (size_t)b * 16);
        for (int i = 0; i < TT; i++) {
            const __m512 s = _mm512_mul_ps(sw, _mm512_set1_ps(a->d[(size_t)(t0 + i) * (size_t)nb + (size_t)b]));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[i]), s, acc[i]);
        }
    }
    for (int i = 0; i < TT; i++) _mm512_mask_storeu_ps(out + (size_t)(t0 + i) * (size_t)ldo + n, mask, acc[i]);
}

R16_TARGET static void vnni_rows(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int n0,
                                 int n1)
{
    for (int n = n0; n < n1; n += DOL_R16_ROWS) {
        const int m = n1 - n < DOL_R16_ROWS ? n1 - n : DOL_R16_ROWS, g = n / DOL_R16_ROWS;
        const __mmask16 mask = (__mmask16)((1u << m) - 1);
        for (int t0 = 0; t0 < a->T; t0 += R16_TILE_MAX) {
            switch (a->T - t0 < R16_TILE_MAX ? a->T - t0 : R16_TILE_MAX) {
            case 1: vnni_tile(out, ldo, a, R, g, n, mask, t0, 1); break;
            case 2: vnni_tile(out, ldo, a, R, g, n, mask, t0, 2); break;
            case 3: vnni_tile(out, ldo, a, R, g, n, mask, t0, 3); break;
            case 4: vnni_tile(out, ldo, a, R, g, n, mask, t0, 4); break;
            case 5: vnni_tile(out, ldo, a, R, g, n, mask, t0, 5); break;
            case 6: vnni_tile(out, ldo, a, R, g, n, mask, t0, 6); break;
            case 7: vnni_tile(out, ldo, a, R, g, n, mask, t0, 7); break;
            default: vnni_tile(out, ldo, a, R, g, n, mask, t0, 8); break;
            }
        }
    }
}

/* Group g's weights as signed int8 tiles (w = u - off), 512 bytes a block. */
R16_AMX_TARGET static void group_tiles(const dol_i8_r16 *R, int g, int8_t *wt)
{
    const size_t bq = (size_t)R->bits * 64;
    const uint8_t *qs = R->qs + (size_t)g * (size_t)R->nb * bq;
    const __m512i m4 = _mm512_set1_epi8(0xF), off = _mm512_set1_epi8((char)R->off);
    const __m512i book = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)R->codes));
    for (int b = 0; b < R->nb; b++) {
        const uint8_t *w = qs + (size_t)b * bq;
        int8_t *o = wt + (size_t)b * 512;
        if (R->bits == 8) {
            for (int j = 0; j < 8; j++)
                _mm512_store_si512((void *)(o + 64 * j), _mm512_sub_epi8(_mm512_load_si512((const void *)(w + 64 * j)), off));
            continue;
        }
        for (int v = 0; v < 4; v++) {
            const __m512i raw = _mm512_load_si512((const void *)(w + 64 * v));
            __m512i lo = _mm512_and_si512(raw, m4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
            if (R->lut) lo = _mm512_shuffle_epi8(book, lo), hi = _mm512_shuffle_epi8(book, hi);
            _mm512_store_si512((void *)(o + 128 * v), _mm512_sub_epi8(lo, off));
            _mm512_store_si512((void *)(o + 128 * v + 64), _mm512_sub_epi8(hi, off));
        }
    }
}

/* acc[i] = fma((float)C[i], sw * d[t0 + i][b], acc[i]) for the mt tokens. */
R16_AMX_TARGET static inline __attribute__((always_inline)) void amx_scale(__m512 *acc, const int32_t *c,
                                                                            __m512 sw, const float *d, int nb,
                                                                            int mt)
{
    for (int i = 0; i < mt; i++) {
        const __m512 s = _mm512_mul_ps(sw, _mm512_set1_ps(d[(size_t)i * (size_t)nb]));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(c + 16 * i))), s, acc[i]);
    }
}

/* One token block (mt <= 16 tokens from t0) against group g: per block of
 * inputs, C = x tile x W tile (TDPBSSD, the whole block's integer), two
 * blocks in flight (C in tiles 0 / 1, x in 2 / 4, W in 3 / 5). */
R16_AMX_TARGET static inline __attribute__((always_inline)) void amx_block(
    float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, const int8_t *wt, int g, int n,
    __mmask16 mask, int t0, int mt, int32_t *c0, int32_t *c1)
{
    const int nb = R->nb, K = R->K;
    const uint16_t *sc = R->sc + (size_t)g * (size_t)nb * 16;
    const int8_t *xq = a->q + (size_t)t0 * (size_t)K;
    const float *d = a->d + (size_t)t0 * (size_t)nb;
    __m512 acc[DOL_R16_ROWS];
    for (int i = 0; i < DOL_R16_ROWS; i++) acc[i] = _mm512_setzero_ps();
    int b = 0;
    for (; b + 1 < nb; b += 2) {
        _tile_loadd(2, xq + (size_t)b * 32, K);
        _tile_loadd(3, wt + (size_t)b * 512, 64);
        _tile_zero(0);
        _tile_dpbssd(0, 2, 3);
        _tile_loadd(4, xq + (size_t)(b + 1) * 32, K);
        _tile_loadd(5, wt + (size_t)(b + 1) * 512, 64);
        _tile_zero(1);
        _tile_dpbssd(1, 4, 5);
        _tile_stored(0, c0, 64);
        amx_scale(acc, c0, R16_SCALE(R, sc + (size_t)b * 16), d + b, nb, mt);
        _tile_stored(1, c1, 64);
        amx_scale(acc, c1, R16_SCALE(R, sc + (size_t)(b + 1) * 16), d + b + 1, nb, mt);
    }
    if (b < nb) {
        _tile_loadd(2, xq + (size_t)b * 32, K);
        _tile_loadd(3, wt + (size_t)b * 512, 64);
        _tile_zero(0);
        _tile_dpbssd(0, 2, 3);
        _tile_stored(0, c0, 64);
        amx_scale(acc, c0, R16_SCALE(R, sc + (size_t)b * 16), d + b, nb, mt);
    }
    for (int i = 0; i < mt; i++) _mm512_mask_storeu_ps(out + (size_t)(t0 + i) * (size_t)ldo + n, mask, acc[i]);
}

R16_AMX_TARGET static void amx_config(int mt)
{
    dol_amx_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 2; i++) cfg.rows[i] = (uint8_t)mt, cfg.colsb[i] = 64;    /* C: tokens x 16 rows */
    for (int i = 2; i < 6; i += 2) cfg.rows[i] = (uint8_t)mt, cfg.colsb[i] = 32; /* x: tokens x 32 inputs */
    for (int i = 3; i < 6; i += 2) cfg.rows[i] = 8, cfg.colsb[i] = 64;           /* W: 8 x (16 rows x 4) */
    __asm__ volatile("" : : "r"(&cfg) : "memory"); /* the stores above are LDTILECFG's operand */
    _tile_loadconfig(&cfg);
}

R16_AMX_TARGET static void amx_rows(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int n0,
                                    int n1, uint8_t *scratch)
{
    int8_t *wt = (int8_t *)scratch;
    int32_t *c0 = (int32_t *)(scratch + (size_t)R->nb * 512), *c1 = c0 + 256;
    const int T = a->T, tail = T % DOL_R16_ROWS;
    for (int n = n0; n < n1; n += DOL_R16_ROWS) {
        const int m = n1 - n < DOL_R16_ROWS ? n1 - n : DOL_R16_ROWS, g = n / DOL_R16_ROWS;
        const __mmask16 mask = (__mmask16)((1u << m) - 1);
        group_tiles(R, g, wt);
        amx_config(DOL_R16_ROWS);
        int t0 = 0;
        for (; t0 + DOL_R16_ROWS <= T; t0 += DOL_R16_ROWS)
            amx_block(out, ldo, a, R, wt, g, n, mask, t0, DOL_R16_ROWS, c0, c1);
        if (tail) {
            amx_config(tail);
            amx_block(out, ldo, a, R, wt, g, n, mask, t0, tail, c0, c1);
        }
    }
    _tile_release();
}

void dol_i8_r16_rows(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int n0, int n1,
                     void *amx_scratch)
{
    if (amx_scratch && a->T >= DOL_R16_ROWS)
        amx_rows(out, ldo, a, R, n0, n1, (uint8_t *)(((uintptr_t)amx_scratch + 63) & ~(uintptr_t)63));
    else
        vnni_rows(out, ldo, a, R, n0, n1);
}

#else /* not x86-64 (or a compiler without AMX intrinsics): never available */

void dol_i8_r16_rows(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int n0, int n1,
                     void *amx_scratch)
{
    (void)out; (void)ldo; (void)a; (void)R; (void)n0; (void)n1; (void)amx_scratch;
    abort();
}

#endif
