/* src/engine/cpu_k_quantize.c — the CPU kernels' load-time quantizers:
 * rows of an F32 / F16 / BF16 matrix into NF4 (nf4.h) or Q8_0 (q8.h)
 * blocks, vectorized per variant, giving the same bytes as the float64
 * references of those headers (the proofs below; docs/performance.md).
 * Compiled once per variant (cpu_k.h); exports DOL_K(nf4_quantize_rows)
 * and DOL_K(q8_quantize_rows), everything else file-static. */
#include "engine/cpu_k.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

int DOL_K(nf4_quantize_rows)(const void *src, dol_dtype t, const dol_nf4_matrix *m, int64_t r0,
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

int DOL_K(q8_quantize_rows)(const void *src, dol_dtype t, const dol_q8_matrix *m, int64_t r0,
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
