/* src/engine/cpu_r16.c — the interleaved layout of cpu_r16.h: the repack
 * from each format's rows, the 512-bit VNNI product (token tiles of up to
 * 8 rows of x against a group of 16 rows of W), the AMX-INT8 product (16
 * tokens x 16 rows a tile product) and the choice between them and the
 * 256-bit sets' products (cpu_k_r16.c). Compiled without extra flags:
 * the kernels carry target attributes and run only where R->set (and, for
 * the tile unit, dol_amx_i8_available) says so. */
#include "engine/cpu_r16.h"

#include "engine/cpu_amx.h"
#include "dolphin/ggml_blocks.h"

#include <stdlib.h>
#include <string.h>

bool dol_i8_r16_takes(dol_dtype t, int K)
{
    if (K <= 0 || K % 32 != 0) return false;
    if (t == DOL_I8_NF4) return K % 64 == 0;
    if (t == DOL_DTYPE_Q2_K || t == DOL_DTYPE_Q3_K || t == DOL_DTYPE_Q4_K || t == DOL_DTYPE_Q5_K || t == DOL_DTYPE_Q6_K)
        return K % 256 == 0;
    return t == DOL_DTYPE_Q4_0 || t == DOL_DTYPE_Q4_1 || t == DOL_DTYPE_Q5_0 || t == DOL_DTYPE_Q5_1 ||
           t == DOL_DTYPE_Q8_0 || t == DOL_I8_Q8;
}

static size_t per_group(const dol_i8_r16 *R, size_t per_block) { return (size_t)R->groups * (size_t)R->nb * per_block; }
static size_t qs_bytes(const dol_i8_r16 *R) { return per_group(R, (size_t)R->bits * 64); }
static size_t sc_per_block(const dol_i8_r16 *R) { return R->min ? 32 : 16; } /* F16 a group and block (not kq) */
static size_t sc_bytes(const dol_i8_r16 *R)
{
    return per_group(R, R->kq ? 2 * sizeof(uint16_t) * 16 / 8 : sizeof(uint16_t) * sc_per_block(R));
}
static size_t sub_per_block(const dol_i8_r16 *R) { return R->halves && R->min ? 64 : 32; } /* kq */
static size_t sub_bytes(const dol_i8_r16 *R) { return R->kq ? per_group(R, sub_per_block(R)) : 0; }

size_t dol_i8_r16_bytes(const dol_i8_r16 *R) { return R->qs ? qs_bytes(R) + sc_bytes(R) + sub_bytes(R) : 0; }

static void *alloc64(size_t n) { return aligned_alloc(64, (n + 63) / 64 * 64); }

int dol_i8_r16_alloc(dol_i8_r16 *R, const dol_i8_weight *W)
{
    memset(R, 0, sizeof *R);
    R->N = W->N, R->K = W->K, R->nb = W->K / 32, R->groups = (W->N + DOL_R16_ROWS - 1) / DOL_R16_ROWS;
    const dol_cpu_i8 *s = dol_cpu_i8_get();
    R->set = !s || strcmp(s->name, "avx512vnni") == 0 ? DOL_R16_AVX512VNNI
             : strcmp(s->name, "avxvnni") == 0        ? DOL_R16_AVXVNNI
                                                      : DOL_R16_AVX2;
    switch ((int)W->t) {
    case DOL_DTYPE_Q4_0: R->bits = 4, R->off = 8; break;
    case DOL_I8_NF4:
        R->bits = 4, R->off = 128, R->lut = true, R->smul = 1.0f / 127.0f;
        for (int i = 0; i < 16; i++) R->codes[i] = (uint8_t)(dol_nf4_i8_codes[i] + 128);
        break;
    case DOL_DTYPE_Q4_1: R->bits = 4, R->off = 0, R->min = true; break;
    case DOL_DTYPE_Q5_0: R->bits = 5, R->off = 16; break;
    case DOL_DTYPE_Q5_1: R->bits = 5, R->off = 0, R->min = true; break;
    case DOL_DTYPE_Q2_K: R->bits = 2, R->off = 0, R->kq = R->halves = R->min = true; break;
    case DOL_DTYPE_Q3_K: R->bits = 3, R->off = 4, R->kq = R->halves = true; break;
    case DOL_DTYPE_Q4_K: R->bits = 4, R->off = 0, R->kq = R->min = true; break;
    case DOL_DTYPE_Q5_K: R->bits = 5, R->off = 0, R->kq = R->min = true; break;
    case DOL_DTYPE_Q6_K: R->bits = 6, R->off = 32, R->kq = R->halves = true; break;
    default: R->bits = 8, R->off = 128; break; /* Q8_0, int8 */
    }
    R->qs = alloc64(qs_bytes(R));
    R->sc = alloc64(sc_bytes(R));
    R->sub = R->kq ? alloc64(sub_bytes(R)) : NULL;
    if (!R->qs || !R->sc || (R->kq && !R->sub)) {
        dol_i8_r16_free(R);
        return -1;
    }
    return 0;
}

void dol_i8_r16_free(dol_i8_r16 *R)
{
    free(R->qs);
    free(R->sc);
    free(R->sub);
    R->qs = NULL;
    R->sc = NULL;
    R->sub = NULL;
}

/* Block b of row n: 32 values u (u = w + off; NF4: the codes), the F16
 * scale (K-quants: the super-block's d, and dmin in h2; Q4_1, Q5_1: the
 * minimum m in h2) and the K-quants' integers of the block (Q4_K, Q5_K:
 * its scale and minimum; Q3_K, Q6_K: its halves' scales; Q2_K: those and
 * its halves' minima m0, m1). */
typedef struct {
    uint8_t u[32];
    uint16_t h, h2;
    int8_t s0, s1, m0, m1;
} row_block;

static void read_block(const dol_i8_weight *W, int n, int b, row_block *o)
{
    const uint8_t *row = W->base + (size_t)n * W->row_bytes;
    switch ((int)W->t) {
    case DOL_DTYPE_Q8_0: {
        const uint8_t *p = row + (size_t)b * 34;
        memcpy(&o->h, p, 2);
        for (int k = 0; k < 32; k++) o->u[k] = (uint8_t)(p[2 + k] ^ 0x80);
        break;
    }
    case DOL_DTYPE_Q4_0: {
        const uint8_t *p = row + (size_t)b * 18;
        memcpy(&o->h, p, 2);
        for (int k = 0; k < 16; k++) o->u[k] = p[2 + k] & 0xF, o->u[k + 16] = p[2 + k] >> 4;
        break;
    }
    case DOL_DTYPE_Q4_1: { /* d, m, 16 bytes of nibbles as Q4_0 */
        const uint8_t *p = row + (size_t)b * 20;
        memcpy(&o->h, p, 2);
        memcpy(&o->h2, p + 2, 2);
        for (int k = 0; k < 16; k++) o->u[k] = p[4 + k] & 0xF, o->u[k + 16] = p[4 + k] >> 4;
        break;
    }
    case DOL_DTYPE_Q5_0:   /* d, 32 high bits, 16 bytes of low nibbles (weights k and k + 16) */
    case DOL_DTYPE_Q5_1: { /* d, m, then the same */
        const int m = W->t == DOL_DTYPE_Q5_1 ? 2 : 0;
        const uint8_t *p = row + (size_t)b * (size_t)(22 + m);
        uint32_t qh;
        memcpy(&o->h, p, 2);
        if (m) memcpy(&o->h2, p + 2, 2);
        memcpy(&qh, p + 2 + m, 4);
        for (int k = 0; k < 16; k++) {
            o->u[k] = (uint8_t)((p[6 + m + k] & 0xF) | ((qh >> k) & 1) << 4);
            o->u[k + 16] = (uint8_t)((p[6 + m + k] >> 4) | ((qh >> (k + 16)) & 1) << 4);
        }
        break;
    }
    case DOL_DTYPE_Q2_K: { /* 16 bytes of scale (low nibble) and minimum per 16, 64 of 2-bit quants, d, dmin */
        const uint8_t *p = row + (size_t)(b / 8) * 84;
        const int j = b % 8;
        memcpy(&o->h, p + 80, 2);
        memcpy(&o->h2, p + 82, 2);
        o->s0 = (int8_t)(p[2 * j] & 0xF), o->s1 = (int8_t)(p[2 * j + 1] & 0xF);
        o->m0 = (int8_t)(p[2 * j] >> 4), o->m1 = (int8_t)(p[2 * j + 1] >> 4);
        for (int k = 0; k < 32; k++) o->u[k] = (p[16 + 32 * (j / 4) + k] >> (2 * (j % 4))) & 3;
        break;
    }
    case DOL_DTYPE_Q3_K: { /* 32 bytes of high bits (bit j: block j), 64 of low 2 bits, 12 of scales, d */
        const uint8_t *p = row + (size_t)(b / 8) * 110;
        const int j = b % 8;
        memcpy(&o->h, p + 108, 2);
        o->s0 = (int8_t)dol_blk_q3k_scale(2 * j, p + 96), o->s1 = (int8_t)dol_blk_q3k_scale(2 * j + 1, p + 96);
        for (int k = 0; k < 32; k++)
            o->u[k] = (uint8_t)(((p[32 + 32 * (j / 4) + k] >> (2 * (j % 4))) & 3) | ((p[k] >> j) & 1) << 2);
        break;
    }
    case DOL_DTYPE_Q4_K:   /* d, dmin, 12 bytes of 6-bit scales and minima, 128 of quants */
    case DOL_DTYPE_Q5_K: { /* the same, with 32 bytes of high bits (bit j: block j) before the quants */
        const bool q5 = W->t == DOL_DTYPE_Q5_K;
        const uint8_t *p = row + (size_t)(b / 8) * (q5 ? 176 : 144);
        const int j = b % 8;
        int sc, mn;
        memcpy(&o->h, p, 2);
        memcpy(&o->h2, p + 2, 2);
        dol_blk_k4_scale_min(j, p + 4, &sc, &mn);
        o->s0 = (int8_t)sc, o->s1 = (int8_t)mn;
        for (int k = 0; k < 32; k++) {
            o->u[k] = (p[(q5 ? 48 : 16) + 32 * (j / 2) + k] >> (4 * (j % 2))) & 0xF;
            if (q5) o->u[k] |= (uint8_t)(((p[16 + k] >> j) & 1) << 4);
        }
        break;
    }
    case DOL_DTYPE_Q6_K: { /* 128 bytes of low 4 bits, 64 of high 2 bits, 16 scales, d */
        const uint8_t *p = row + (size_t)(b / 8) * 210;
        const int j = b % 8, h = j / 4, qd = j % 4;
        memcpy(&o->h, p + 208, 2);
        o->s0 = (int8_t)p[192 + 2 * j], o->s1 = (int8_t)p[193 + 2 * j];
        for (int k = 0; k < 32; k++) {
            const int lo = (p[64 * h + 32 * (qd % 2) + k] >> (4 * (qd / 2))) & 0xF;
            o->u[k] = (uint8_t)(lo | ((p[128 + 32 * h + k] >> (2 * qd)) & 3) << 4);
        }
        break;
    }
    case DOL_I8_Q8: {
        const dol_q8_matrix *m = W->q8;
        const int8_t *q = m->quants + (size_t)n * (size_t)m->cols + (size_t)b * 32;
        for (int k = 0; k < 32; k++) o->u[k] = (uint8_t)q[k] ^ 0x80;
        o->h = m->scales[(size_t)n * (size_t)m->blocks_per_row + (size_t)b];
        break;
    }
    default: { /* NF4: codes of weights i and i + 32 of a block of 64 in the two nibbles of byte i */
        const dol_nf4_matrix *m = W->nf4;
        const uint8_t *c = m->codes + (size_t)n * (size_t)(m->cols / 2) + (size_t)(b / 2) * 32;
        for (int k = 0; k < 32; k++) o->u[k] = (c[k] >> (4 * (b % 2))) & 0xF;
        o->h = m->scales[(size_t)n * (size_t)m->blocks_per_row + (size_t)(b / 2)];
        break;
    }
    }
}

void dol_i8_r16_fill(dol_i8_r16 *R, const dol_i8_weight *W, int g0, int g1)
{
    const size_t bq = (size_t)R->bits * 64;
    for (int g = g0; g < g1; g++)
        for (int b = 0; b < R->nb; b++) {
            const size_t gb = (size_t)g * (size_t)R->nb + (size_t)b;
            uint8_t *q = R->qs + gb * bq;
            int8_t *sub = R->kq ? R->sub + gb * sub_per_block(R) : NULL;
            uint16_t *sc = R->kq ? R->sc + (gb / 8) * 32 : R->sc + gb * sc_per_block(R);
            memset(q, 0, bq);
            if (sub) memset(sub, 0, sub_per_block(R));
            for (int r = 0; r < DOL_R16_ROWS; r++) {
                const int n = g * DOL_R16_ROWS + r;
                row_block o = { .h = 0 };
                if (n < R->N) read_block(W, n, b, &o);
                if (!R->kq) {
                    sc[r] = o.h;
                    if (R->min) sc[16 + r] = o.h2;
                } else {
                    if (b % 8 == 0) sc[r] = o.h, sc[16 + r] = o.h2;
                    sub[r] = o.s0, sub[16 + r] = o.s1;
                    if (R->halves && R->min) sub[32 + r] = o.m0, sub[48 + r] = o.m1;
                }
                if (n >= R->N) continue;
                for (int j = 0; j < 8; j++) { /* group j: 4 bytes at position j * 64 + r * 4 */
                    uint32_t u, lo, hi;
                    memcpy(&u, o.u + 4 * j, 4);
                    if (R->bits == 8) {
                        memcpy(q + 64 * j + 4 * r, &u, 4);
                        continue;
                    }
                    if (R->bits <= 3) { /* the low 2 bits as Q6_K's high plane, then the third bit */
                        uint8_t *pl = q + 64 * (j / 4) + 4 * r, *ph = q + 128 + 4 * r;
                        memcpy(&lo, pl, 4);
                        lo |= (u & 0x03030303u) << (2 * (j % 4));
                        memcpy(pl, &lo, 4);
                        if (R->bits == 2) continue;
                        memcpy(&hi, ph, 4);
                        hi |= ((u >> 2) & 0x01010101u) << j;
                        memcpy(ph, &hi, 4);
                        continue;
                    }
                    uint8_t *pl = q + 64 * (j / 2) + 4 * r;
                    memcpy(&lo, pl, 4);
                    lo |= (u & 0x0F0F0F0Fu) << (4 * (j % 2));
                    memcpy(pl, &lo, 4);
                    if (R->bits == 6) {
                        uint8_t *ph = q + 256 + 64 * (j / 4) + 4 * r;
                        memcpy(&hi, ph, 4);
                        hi |= ((u >> 4) & 0x03030303u) << (2 * (j % 4));
                        memcpy(ph, &hi, 4);
                    } else if (R->bits == 5) {
                        uint8_t *ph = q + 256 + 4 * r;
                        memcpy(&hi, ph, 4);
                        hi |= ((u >> 4) & 0x01010101u) << j;
                        memcpy(ph, &hi, 4);
                    }
                }
            }
        }
}

size_t dol_i8_r16_scratch_bytes(int K) { return (size_t)(K / 32) * 512 + 2 * 1024 + 64; }

#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#include <immintrin.h>

bool dol_i8_r16_available(void) { return dol_cpu_i8_get() != NULL; }

#define R16_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma")))
#define R16_AMX_TARGET \
    __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma")))
#define R16_TILE_MAX 8    /* rows of x a VNNI tile holds */
#define R16_PF_BYTES 8192 /* how far ahead the VNNI tiles prefetch the weights */

/* The 16 rows' factors of block b of group g: the scale of the block (or
 * of its first half), of its second half (halves) and its minimum (min;
 * with halves, Q2_K: the first half's, m1 the second's). */
typedef struct {
    __m512 s0, s1, m, m1;
} r16_scales;

R16_TARGET static inline __attribute__((always_inline)) __m512 sub16(const int8_t *p)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)p)));
}

R16_TARGET static inline __attribute__((always_inline)) r16_scales block_scales(const dol_i8_r16 *R, int g, int b,
                                                                                const dol_r16_kind k)
{
    r16_scales f;
    const size_t gb = (size_t)g * (size_t)R->nb + (size_t)b;
    if (!k.kq) { /* Q4_1, Q5_1: w = d q + m, so the factor of sum q is -m (negated exactly) */
        const uint16_t *sc = R->sc + gb * (k.min ? 32 : 16);
        f.s0 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)sc));
        if (k.lut) f.s0 = _mm512_mul_ps(f.s0, _mm512_set1_ps(R->smul));
        f.s1 = f.m = f.s0;
        if (k.min) f.m = _mm512_xor_ps(_mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sc + 16))), _mm512_set1_ps(-0.0f));
        return f;
    }
    const uint16_t *sc = R->sc + (gb / 8) * 32;
    const int8_t *sub = R->sub + gb * (k.halves && k.min ? 64 : 32);
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)sc));
    f.s0 = _mm512_mul_ps(d, sub16(sub));
    f.s1 = k.halves ? _mm512_mul_ps(d, sub16(sub + 16)) : f.s0;
    f.m = f.m1 = f.s0;
    if (k.min) {
        const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sc + 16)));
        f.m = _mm512_mul_ps(dmin, sub16(sub + (k.halves ? 32 : 16)));
        if (k.halves) f.m1 = _mm512_mul_ps(dmin, sub16(sub + 48));
    }
    return f;
}

/* acc = fma((float)I0, s0 * d, acc) [halves: then fma((float)I1, s1 * d,
 * acc)] [min: then acc - m * (float)(sum q) * d]: one row of x, block b
 * (sq: its half sums, sd: (float)(sum q) * d). Q2_K, a minimum per half:
 * each half's fma, then acc - m_h * ((float)sq_h * d). */
R16_TARGET static inline __attribute__((always_inline)) __m512 scale_block(r16_scales f, __m512 acc, __m512i I0,
                                                                          __m512i I1, float d, float sd,
                                                                          const int32_t *sq, const dol_r16_kind k)
{
    const __m512 vd = _mm512_set1_ps(d);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I0), _mm512_mul_ps(f.s0, vd), acc);
    if (k.halves && k.min) acc = _mm512_fnmadd_ps(f.m, _mm512_set1_ps((float)sq[0] * d), acc);
    if (k.halves) acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I1), _mm512_mul_ps(f.s1, vd), acc);
    if (k.halves && k.min) acc = _mm512_fnmadd_ps(f.m1, _mm512_set1_ps((float)sq[1] * d), acc);
    if (!k.halves && k.min) acc = _mm512_fnmadd_ps(f.m, _mm512_set1_ps(sd), acc);
    return acc;
}

/* u of 4-input group 2v (lo) and 2v + 1 (hi) of a 3-, 4-, 5- or 6-bit block at w. */
R16_TARGET static inline __attribute__((always_inline)) void unpack_pair(const dol_i8_r16 *R, const uint8_t *w,
                                                                        int v, __m512i *lo, __m512i *hi,
                                                                        const dol_r16_kind k)
{
    const __m512i m4 = _mm512_set1_epi8(0xF), m2 = _mm512_set1_epi8(0x30);
    if (k.bits <= 3) { /* bits 2 (j % 4) of plane j / 4 for group j, plus 4 where bit j of the third plane is set */
        const __m512i pl = _mm512_load_si512((const void *)(w + 64 * (v / 2))), m3 = _mm512_set1_epi8(3);
        *lo = _mm512_and_si512(v % 2 ? _mm512_srli_epi16(pl, 4) : pl, m3);
        *hi = _mm512_and_si512(_mm512_srli_epi16(pl, v % 2 ? 6 : 2), m3);
        if (k.bits == 2) return;
        const __m512i hp = _mm512_load_si512((const void *)(w + 128)), b4 = _mm512_set1_epi8(4);
        *lo = _mm512_mask_add_epi8(*lo, _mm512_test_epi8_mask(hp, _mm512_set1_epi8((char)(1 << (2 * v)))), *lo, b4);
        *hi = _mm512_mask_add_epi8(*hi, _mm512_test_epi8_mask(hp, _mm512_set1_epi8((char)(2 << (2 * v)))), *hi, b4);
        return;
    }
    const __m512i raw = _mm512_load_si512((const void *)(w + 64 * v));
    *lo = _mm512_and_si512(raw, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
    if (k.lut) {
        const __m512i book = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)R->codes));
        *lo = _mm512_shuffle_epi8(book, *lo), *hi = _mm512_shuffle_epi8(book, *hi);
    }
    if (k.bits == 6) { /* the high 2 bits of group j: bits 2 (j % 4) of plane j / 4, moved to bits 4-5 */
        const __m512i hp = _mm512_load_si512((const void *)(w + 256 + 64 * (v / 2)));
        const __m512i a = v % 2 ? hp : _mm512_slli_epi16(hp, 4), b = v % 2 ? _mm512_srli_epi16(hp, 2) : _mm512_slli_epi16(hp, 2);
        *lo = _mm512_or_si512(*lo, _mm512_and_si512(a, m2));
        *hi = _mm512_or_si512(*hi, _mm512_and_si512(b, m2));
    }
    if (k.bits == 5) { /* the high bit of group j: bit j of the plane, added as 16 */
        const __m512i hp = _mm512_load_si512((const void *)(w + 256)), b16 = _mm512_set1_epi8(16);
        *lo = _mm512_mask_add_epi8(*lo, _mm512_test_epi8_mask(hp, _mm512_set1_epi8((char)(1 << (2 * v)))), *lo, b16);
        *hi = _mm512_mask_add_epi8(*hi, _mm512_test_epi8_mask(hp, _mm512_set1_epi8((char)(2 << (2 * v)))), *hi, b16);
    }
}

R16_TARGET static inline int32_t x4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Rows t0 .. t0+TT-1 of x against group g (rows n .. n+15, `mask` of them
 * real): per block, TT int32 vectors (one lane a row of W; halves: two)
 * started at -off * sum q, then the 8 groups of 4 inputs, then the
 * scaling. */
R16_TARGET static inline __attribute__((always_inline)) void vnni_tile(
    float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int g, int n, __mmask16 mask, int t0,
    const int TT, const dol_r16_kind k)
{
    const int nb = R->nb, K = R->K;
    const size_t bq = (size_t)k.bits * 64;
    const uint8_t *qs = R->qs + (size_t)g * (size_t)nb * bq;
    __m512 acc[R16_TILE_MAX];
    for (int i = 0; i < TT; i++) acc[i] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const int8_t *xq = a->q + (size_t)t0 * (size_t)K + (size_t)b * 32;
        const int32_t *sq = a->sq + ((size_t)t0 * (size_t)nb + (size_t)b) * 2;
        const uint8_t *w = qs + (size_t)b * bq;
        /* the stream ahead into L2: the hardware prefetcher alone trails */
        for (size_t o = 0; o < bq; o += 64) _mm_prefetch((const char *)w + R16_PF_BYTES + o, _MM_HINT_T1);
        if (k.kq)
            _mm_prefetch((const char *)(R->sub + ((size_t)g * (size_t)nb + (size_t)b) * (k.halves && k.min ? 64 : 32)) +
                             R16_PF_BYTES / 8,
                         _MM_HINT_T1);
        if (!k.kq && (k.min || !(b & 1)))
            _mm_prefetch((const char *)(R->sc + ((size_t)g * (size_t)nb + (size_t)b) * (k.min ? 32 : 16)) + R16_PF_BYTES / 8, _MM_HINT_T1);
        if (k.kq && !(b & 7)) _mm_prefetch((const char *)(R->sc + ((size_t)g * (size_t)nb + (size_t)b) * 4) + R16_PF_BYTES / 8, _MM_HINT_T1);
        __m512i I0[R16_TILE_MAX], I1[R16_TILE_MAX];
        for (int i = 0; i < TT; i++) {
            const int32_t *si = sq + (size_t)i * (size_t)nb * 2;
            I0[i] = _mm512_set1_epi32(-R->off * (k.halves ? si[0] : si[0] + si[1]));
            if (k.halves) I1[i] = _mm512_set1_epi32(-R->off * si[1]);
            else I1[i] = _mm512_setzero_si512(); /* unused */
        }
        if (k.bits != 8) {
            for (int v = 0; v < 4; v++) {
                __m512i lo, hi;
                unpack_pair(R, w, v, &lo, &hi, k);
                for (int i = 0; i < TT; i++) {
                    const int8_t *x = xq + (size_t)i * (size_t)K + 8 * v;
                    __m512i *I = k.halves && v >= 2 ? &I1[i] : &I0[i];
                    *I = _mm512_dpbusd_epi32(*I, lo, _mm512_set1_epi32(x4(x)));
                    *I = _mm512_dpbusd_epi32(*I, hi, _mm512_set1_epi32(x4(x + 4)));
                }
            }
        } else {
            for (int j = 0; j < 8; j++) {
                const __m512i u = _mm512_load_si512((const void *)(w + 64 * j));
                for (int i = 0; i < TT; i++)
                    I0[i] = _mm512_dpbusd_epi32(I0[i], u, _mm512_set1_epi32(x4(xq + (size_t)i * (size_t)K + 4 * j)));
            }
        }
        const r16_scales f = block_scales(R, g, b, k);
        for (int i = 0; i < TT; i++) {
            const size_t o = (size_t)(t0 + i) * (size_t)nb + (size_t)b;
            acc[i] = scale_block(f, acc[i], I0[i], I1[i], a->d[o], a->sd[o], a->sq + 2 * o, k);
        }
    }
    for (int i = 0; i < TT; i++) _mm512_mask_storeu_ps(out + (size_t)(t0 + i) * (size_t)ldo + n, mask, acc[i]);
}

R16_TARGET static inline __attribute__((always_inline)) void vnni_rows_k(float *out, int ldo, const dol_i8_act *a,
                                                                        const dol_i8_r16 *R, int n0, int n1,
                                                                        const dol_r16_kind k)
{
    for (int n = n0; n < n1; n += DOL_R16_ROWS) {
        const int m = n1 - n < DOL_R16_ROWS ? n1 - n : DOL_R16_ROWS, g = n / DOL_R16_ROWS;
        const __mmask16 mask = (__mmask16)((1u << m) - 1);
        for (int t0 = 0; t0 < a->T; t0 += R16_TILE_MAX) {
            switch (a->T - t0 < R16_TILE_MAX ? a->T - t0 : R16_TILE_MAX) {
            case 1: vnni_tile(out, ldo, a, R, g, n, mask, t0, 1, k); break;
            case 2: vnni_tile(out, ldo, a, R, g, n, mask, t0, 2, k); break;
            case 3: vnni_tile(out, ldo, a, R, g, n, mask, t0, 3, k); break;
            case 4: vnni_tile(out, ldo, a, R, g, n, mask, t0, 4, k); break;
            case 5: vnni_tile(out, ldo, a, R, g, n, mask, t0, 5, k); break;
            case 6: vnni_tile(out, ldo, a, R, g, n, mask, t0, 6, k); break;
            case 7: vnni_tile(out, ldo, a, R, g, n, mask, t0, 7, k); break;
            default: vnni_tile(out, ldo, a, R, g, n, mask, t0, 8, k); break;
            }
        }
    }
}

R16_TARGET static void vnni_rows(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int n0,
                                 int n1)
{
    DOL_R16_DISPATCH(R, vnni_rows_k, out, ldo, a, R, n0, n1);
}

/* Group g's weights as signed int8 tiles (w = u - off), 512 bytes a block. */
R16_AMX_TARGET static inline __attribute__((always_inline)) void group_tiles(const dol_i8_r16 *R, int g, int8_t *wt,
                                                                            const dol_r16_kind k)
{
    const size_t bq = (size_t)k.bits * 64;
    const uint8_t *qs = R->qs + (size_t)g * (size_t)R->nb * bq;
    const __m512i off = _mm512_set1_epi8((char)R->off);
    for (int b = 0; b < R->nb; b++) {
        const uint8_t *w = qs + (size_t)b * bq;
        int8_t *o = wt + (size_t)b * 512;
        if (k.bits == 8) {
            for (int j = 0; j < 8; j++)
                _mm512_store_si512((void *)(o + 64 * j), _mm512_sub_epi8(_mm512_load_si512((const void *)(w + 64 * j)), off));
            continue;
        }
        for (int v = 0; v < 4; v++) {
            __m512i lo, hi;
            unpack_pair(R, w, v, &lo, &hi, k);
            _mm512_store_si512((void *)(o + 128 * v), _mm512_sub_epi8(lo, off));
            _mm512_store_si512((void *)(o + 128 * v + 64), _mm512_sub_epi8(hi, off));
        }
    }
}

/* The scaling of one C tile (mt tokens x 16 rows) of block b into acc:
 * part 0 (the block, or its first half) or 1 (the second half). */
R16_AMX_TARGET static inline __attribute__((always_inline)) void amx_scale(
    __m512 *acc, const int32_t *c, r16_scales f, const dol_i8_act *a, int t0, int b, int part, int mt,
    const dol_r16_kind k)
{
    const size_t nb = (size_t)a->nb;
    for (int i = 0; i < mt; i++) {
        const size_t o = (size_t)(t0 + i) * nb + (size_t)b;
        const float d = a->d[o];
        const __m512 I = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(c + 16 * i)));
        acc[i] = _mm512_fmadd_ps(I, _mm512_mul_ps(part ? f.s1 : f.s0, _mm512_set1_ps(d)), acc[i]);
        if (k.min && k.halves) /* Q2_K: the half's minimum after the half */
            acc[i] = _mm512_fnmadd_ps(part ? f.m1 : f.m, _mm512_set1_ps((float)a->sq[2 * o + (size_t)part] * d), acc[i]);
        else if (k.min) acc[i] = _mm512_fnmadd_ps(f.m, _mm512_set1_ps(a->sd[o]), acc[i]);
    }
}

/* C tile c = x tile tx (from xp, rows K bytes apart) x W tile tw (from wp). */
#define R16_TILE_PRODUCT(c, tx, tw, xp, wp, K) \
    do {                                       \
        _tile_loadd(tx, (xp), (K));            \
        _tile_loadd(tw, (wp), 64);             \
        _tile_zero(c);                         \
        _tile_dpbssd(c, tx, tw);               \
    } while (0)

/* One token block (mt <= 16 tokens from t0) against group g: per block of
 * inputs, C = x tile x W tile (TDPBSSD: the whole block's integer; halves:
 * two products of 16 inputs), two in flight (C in tiles 0 / 1). */
R16_AMX_TARGET static inline __attribute__((always_inline)) void amx_block(
    float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, const int8_t *wt, int g, int n,
    __mmask16 mask, int t0, int mt, int32_t *c0, int32_t *c1, const dol_r16_kind k)
{
    const int nb = R->nb, K = R->K;
    const int8_t *xq = a->q + (size_t)t0 * (size_t)K;
    __m512 acc[DOL_R16_ROWS];
    for (int i = 0; i < DOL_R16_ROWS; i++) acc[i] = _mm512_setzero_ps();
    for (int b = 0; b < nb;) {
        const int8_t *x = xq + (size_t)b * 32, *w = wt + (size_t)b * 512;
        if (k.halves) {
            R16_TILE_PRODUCT(0, 2, 3, x, w, K);
            R16_TILE_PRODUCT(1, 4, 5, x + 16, w + 256, K);
            const r16_scales f = block_scales(R, g, b, k);
            _tile_stored(0, c0, 64);
            amx_scale(acc, c0, f, a, t0, b, 0, mt, k);
            _tile_stored(1, c1, 64);
            amx_scale(acc, c1, f, a, t0, b, 1, mt, k);
            b++;
        } else if (b + 1 < nb) {
            R16_TILE_PRODUCT(0, 2, 3, x, w, K);
            R16_TILE_PRODUCT(1, 4, 5, x + 32, w + 512, K);
            _tile_stored(0, c0, 64);
            amx_scale(acc, c0, block_scales(R, g, b, k), a, t0, b, 0, mt, k);
            _tile_stored(1, c1, 64);
            amx_scale(acc, c1, block_scales(R, g, b + 1, k), a, t0, b + 1, 0, mt, k);
            b += 2;
        } else {
            R16_TILE_PRODUCT(0, 2, 3, x, w, K);
            _tile_stored(0, c0, 64);
            amx_scale(acc, c0, block_scales(R, g, b, k), a, t0, b, 0, mt, k);
            b++;
        }
    }
    for (int i = 0; i < mt; i++) _mm512_mask_storeu_ps(out + (size_t)(t0 + i) * (size_t)ldo + n, mask, acc[i]);
}

/* Tiles 0-1: C (tokens x 16 rows); 2 / 4: x (tokens x kb inputs); 3 / 5:
 * W (kb / 4 rows of 16 rows x 4 inputs); kb = 32, or 16 for halves. */
R16_AMX_TARGET static void amx_config(int mt, int kb)
{
    dol_amx_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 2; i++) cfg.rows[i] = (uint8_t)mt, cfg.colsb[i] = 64;
    for (int i = 2; i < 6; i += 2) cfg.rows[i] = (uint8_t)mt, cfg.colsb[i] = (uint16_t)kb;
    for (int i = 3; i < 6; i += 2) cfg.rows[i] = (uint8_t)(kb / 4), cfg.colsb[i] = 64;
    __asm__ volatile("" : : "r"(&cfg) : "memory"); /* the stores above are LDTILECFG's operand */
    _tile_loadconfig(&cfg);
}

R16_AMX_TARGET static inline __attribute__((always_inline)) void amx_rows_k(float *out, int ldo,
                                                                           const dol_i8_act *a,
                                                                           const dol_i8_r16 *R, int n0, int n1,
                                                                           uint8_t *scratch, const dol_r16_kind k)
{
    int8_t *wt = (int8_t *)scratch;
    int32_t *c0 = (int32_t *)(scratch + (size_t)R->nb * 512), *c1 = c0 + 256;
    const int T = a->T, tail = T % DOL_R16_ROWS, kb = k.halves ? 16 : 32;
    for (int n = n0; n < n1; n += DOL_R16_ROWS) {
        const int m = n1 - n < DOL_R16_ROWS ? n1 - n : DOL_R16_ROWS, g = n / DOL_R16_ROWS;
        const __mmask16 mask = (__mmask16)((1u << m) - 1);
        group_tiles(R, g, wt, k);
        amx_config(DOL_R16_ROWS, kb);
        int t0 = 0;
        for (; t0 + DOL_R16_ROWS <= T; t0 += DOL_R16_ROWS)
            amx_block(out, ldo, a, R, wt, g, n, mask, t0, DOL_R16_ROWS, c0, c1, k);
        if (tail) {
            amx_config(tail, kb);
            amx_block(out, ldo, a, R, wt, g, n, mask, t0, tail, c0, c1, k);
        }
    }
    _tile_release();
}

R16_AMX_TARGET static void amx_rows(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int n0,
                                    int n1, uint8_t *scratch)
{
    DOL_R16_DISPATCH(R, amx_rows_k, out, ldo, a, R, n0, n1, scratch);
}

void dol_i8_r16_rows(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int n0, int n1,
                     void *amx_scratch)
{
    if (R->set == DOL_R16_AVX2) dol_i8_r16_rows_avx2(out, ldo, a, R, n0, n1);
    else if (R->set == DOL_R16_AVXVNNI) dol_i8_r16_rows_avxvnni(out, ldo, a, R, n0, n1);
    else if (amx_scratch && a->T >= DOL_R16_ROWS)
        amx_rows(out, ldo, a, R, n0, n1, (uint8_t *)(((uintptr_t)amx_scratch + 63) & ~(uintptr_t)63));
    else
        vnni_rows(out, ldo, a, R, n0, n1);
}

#else /* not x86-64 (or a compiler without AMX intrinsics): never available */

bool dol_i8_r16_available(void) { return false; }

void dol_i8_r16_rows(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int n0, int n1,
                     void *amx_scratch)
{
    (void)out; (void)ldo; (void)a; (void)R; (void)n0; (void)n1; (void)amx_scratch;
    abort();
}

#endif
