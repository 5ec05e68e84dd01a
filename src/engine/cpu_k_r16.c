/* src/engine/cpu_k_r16.c — the interleaved layout's products (cpu_r16.h)
 * on 256-bit vectors: each group of 16 rows of W taken as two halves of 8
 * rows (the low and high 32 bytes of every 64-byte vector of the layout),
 * token tiles of up to 4 rows of x against one half. The same integers and
 * the same float operations in the same order as the 512-bit kernels, so
 * the same bits. Compiled once per set with -DDOL_I8_VARIANT=avx2|avxvnni
 * (CMakeLists.txt); exports dol_i8_r16_rows_<variant>. */
#include "engine/cpu_r16.h"

#include <immintrin.h>
#include <string.h>

#define K256_CAT_(a, b) a##b
#define K256_CAT(a, b) K256_CAT_(a, b)
#define K256_ID_avx2 1
#define K256_ID_avxvnni 2
#define K256_ID K256_CAT(K256_ID_, DOL_I8_VARIANT)

#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "the 256-bit layout kernels need -mavx2 -mfma -mf16c"
#endif
#if K256_ID == 2 && !defined(__AVXVNNI__)
#error "the avxvnni variant needs -mavxvnni"
#endif
#define K256_VNNI (K256_ID == 2)

#define K256_TILE_MAX 4    /* rows of x a tile holds */
#define K256_PF_BYTES 8192 /* how far ahead the first half's pass prefetches the weights */
#define INLINE static inline __attribute__((always_inline))

/* The 8 rows' factors of block b (half h of group g): as cpu_r16.c's. */
typedef struct {
    __m256 s0, s1, m, m1;
} k256_scales;

INLINE __m256 f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
INLINE __m256 sub8(const int8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

INLINE k256_scales block_scales(const dol_i8_r16 *R, int g, int b, int h, const dol_r16_kind k)
{
    k256_scales f;
    const size_t gb = (size_t)g * (size_t)R->nb + (size_t)b;
    const int o = 8 * h;
    if (!k.kq) { /* Q4_1, Q5_1: the factor of sum q is -m (negated exactly) */
        const uint16_t *sc = R->sc + gb * (k.min ? 32 : 16);
        f.s0 = f16x8(sc + o);
        if (k.lut) f.s0 = _mm256_mul_ps(f.s0, _mm256_set1_ps(R->smul));
        f.s1 = f.m = f.m1 = f.s0;
        if (k.min) f.m = _mm256_xor_ps(f16x8(sc + 16 + o), _mm256_set1_ps(-0.0f));
        return f;
    }
    const uint16_t *sc = R->sc + (gb / 8) * 32;
    const int8_t *sub = R->sub + gb * (k.halves && k.min ? 64 : 32);
    const __m256 d = f16x8(sc + o);
    f.s0 = _mm256_mul_ps(d, sub8(sub + o));
    f.s1 = k.halves ? _mm256_mul_ps(d, sub8(sub + 16 + o)) : f.s0;
    f.m = f.m1 = f.s0;
    if (k.min) {
        const __m256 dmin = f16x8(sc + 16 + o);
        f.m = _mm256_mul_ps(dmin, sub8(sub + (k.halves ? 32 : 16) + o));
        if (k.halves) f.m1 = _mm256_mul_ps(dmin, sub8(sub + 48 + o));
    }
    return f;
}

/* Bit `from` of every byte moved to bit `to`, the other bits cleared. */
INLINE __m256i bit_to(__m256i v, int from, int to)
{
    const __m256i s = from > to ? _mm256_srli_epi16(v, from - to) : _mm256_slli_epi16(v, to - from);
    return _mm256_and_si256(s, _mm256_set1_epi8((char)(1 << to)));
}

/* Whether the products take w signed (8-bit weights and NF4 on AVX2, whose
 * unsigned u would overflow vpmaddubsw's int16 pairs): w = u - off, I
 * started at 0; else u, I started at -off * sum q. */
#define K256_SIGNED(k) (!K256_VNNI && ((k).bits == 8 || (k).lut))

/* u (or signed w, K256_SIGNED) of 4-input groups 2v (lo) and 2v + 1 (hi)
 * of a 2- to 6-bit block whose half is at w (w: the block + 32 h). */
INLINE void unpack_pair(const dol_i8_r16 *R, const uint8_t *w, int v, __m256i *lo, __m256i *hi,
                        const dol_r16_kind k)
{
    const __m256i m4 = _mm256_set1_epi8(0xF);
    if (k.bits <= 3) { /* bits 2 (j % 4) of plane j / 4, plus 4 where bit j of the third plane is set */
        const __m256i pl = _mm256_load_si256((const __m256i *)(w + 64 * (v / 2))), m3 = _mm256_set1_epi8(3);
        *lo = _mm256_and_si256(v % 2 ? _mm256_srli_epi16(pl, 4) : pl, m3);
        *hi = _mm256_and_si256(_mm256_srli_epi16(pl, v % 2 ? 6 : 2), m3);
        if (k.bits == 2) return;
        const __m256i hp = _mm256_load_si256((const __m256i *)(w + 128));
        *lo = _mm256_or_si256(*lo, bit_to(hp, 2 * v, 2));
        *hi = _mm256_or_si256(*hi, bit_to(hp, 2 * v + 1, 2));
        return;
    }
    const __m256i raw = _mm256_load_si256((const __m256i *)(w + 64 * v));
    *lo = _mm256_and_si256(raw, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    if (k.lut) {
        __m128i c = _mm_loadu_si128((const __m128i *)R->codes);
        if (K256_SIGNED(k)) c = _mm_xor_si128(c, _mm_set1_epi8((char)0x80)); /* the codes themselves */
        const __m256i book = _mm256_broadcastsi128_si256(c);
        *lo = _mm256_shuffle_epi8(book, *lo), *hi = _mm256_shuffle_epi8(book, *hi);
    }
    if (k.bits == 6) { /* the high 2 bits of group j: bits 2 (j % 4) of plane j / 4, moved to bits 4-5 */
        const __m256i hp = _mm256_load_si256((const __m256i *)(w + 256 + 64 * (v / 2))), m2 = _mm256_set1_epi8(0x30);
        const __m256i a = v % 2 ? hp : _mm256_slli_epi16(hp, 4);
        const __m256i b = v % 2 ? _mm256_srli_epi16(hp, 2) : _mm256_slli_epi16(hp, 2);
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(a, m2));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(b, m2));
    }
    if (k.bits == 5) { /* the high bit of group j: bit j of the plane, to bit 4 */
        const __m256i hp = _mm256_load_si256((const __m256i *)(w + 256));
        *lo = _mm256_or_si256(*lo, bit_to(hp, 2 * v, 4));
        *hi = _mm256_or_si256(*hi, bit_to(hp, 2 * v + 1, 4));
    }
}

INLINE __m256i x4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

#if !K256_VNNI
/* AVX2: the 4-input groups whose vpmaddubsw pairs add up in int16 before
 * one vpmaddwd, 2 * G * max|w| * 127 <= 32767 (max|w| 15 for 4 bits, 31,
 * 63, and 128 signed); the halves' formats flush at each half's end too. */
INLINE int flush_groups(const dol_r16_kind k)
{
    return K256_SIGNED(k) ? 1 : k.bits <= 4 ? 8 : k.bits == 5 ? 4 : 2;
}
#endif

/* One 4-input group j of the block into token i's integer: VNNI, I +=
 * u x; AVX2, the pair sums into s16 (signed: sign(x, w) against |w|,
 * wa), flushed into I every flush_groups groups. */
INLINE void group_dot(__m256i *I, __m256i *s16, __m256i wv, __m256i wa, __m256i x, int j, const dol_r16_kind k)
{
#if K256_VNNI
    (void)s16, (void)wa, (void)j, (void)k;
    *I = _mm256_dpbusd_avx_epi32(*I, wv, x);
#else
    const __m256i p = K256_SIGNED(k) ? _mm256_maddubs_epi16(wa, _mm256_sign_epi8(x, wv)) : _mm256_maddubs_epi16(wv, x);
    const int F = k.halves && flush_groups(k) > 4 ? 4 : flush_groups(k);
    const bool first = j % F == 0, last = (j + 1) % F == 0;
    const __m256i s = first ? p : _mm256_add_epi16(*s16, p);
    if (last) *I = _mm256_add_epi32(*I, _mm256_madd_epi16(s, _mm256_set1_epi16(1)));
    else *s16 = s;
#endif
}

/* acc = fma((float)I, s * d, acc), and the minimum the part ends with
 * (part 0: the block or its first half; 1: the second half). */
INLINE __m256 scale_part(__m256 acc, __m256i I, k256_scales f, const dol_i8_act *a, size_t o, int part,
                         const dol_r16_kind k)
{
    const float d = a->d[o];
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(part ? f.s1 : f.s0, _mm256_set1_ps(d)), acc);
    if (k.halves && k.min) /* Q2_K: the half's minimum after the half */
        acc = _mm256_fnmadd_ps(part ? f.m1 : f.m, _mm256_set1_ps((float)a->sq[2 * o + (size_t)part] * d), acc);
    else if (k.min && !k.halves) acc = _mm256_fnmadd_ps(f.m, _mm256_set1_ps(a->sd[o]), acc);
    return acc;
}

/* The integer's start for token i's part of block b: -off * sum q (signed
 * w: 0). */
INLINE __m256i start(const dol_i8_r16 *R, const int32_t *sq, int part, const dol_r16_kind k)
{
    if (K256_SIGNED(k)) return _mm256_setzero_si256();
    return _mm256_set1_epi32(-R->off * (k.halves ? sq[part] : sq[0] + sq[1]));
}

/* Rows t0 .. t0+TT-1 of x against H halves of group g from half h0 (rows
 * n + 8 h0 ..; m: the real rows from n), H * TT <= K256_TILE_MAX:
 * accumulator j = hh * TT + i. */
INLINE void tile(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int g, int h0, const int H, int n,
                 int m, int t0, const int TT, const dol_r16_kind k)
{
    const int nb = R->nb, K = R->K;
    const size_t bq = (size_t)k.bits * 64;
    const uint8_t *qs = R->qs + (size_t)g * (size_t)nb * bq + 32 * (size_t)h0;
    __m256 acc[K256_TILE_MAX];
    for (int j = 0; j < H * TT; j++) acc[j] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const int8_t *xq = a->q + (size_t)t0 * (size_t)K + (size_t)b * 32;
        const size_t o0 = (size_t)t0 * (size_t)nb + (size_t)b;
        const uint8_t *w = qs + (size_t)b * bq;
        if (h0 == 0 && t0 == 0) /* the stream ahead into L2 (a second half's pass reads the lines again) */
            for (size_t p = 0; p < bq; p += 64) _mm_prefetch((const char *)w + K256_PF_BYTES + p, _MM_HINT_T1);
        __m256i I[K256_TILE_MAX], s16[K256_TILE_MAX];
        for (int j = 0; j < H * TT; j++) {
            I[j] = start(R, a->sq + 2 * (o0 + (size_t)(j % TT) * (size_t)nb), 0, k);
            s16[j] = _mm256_setzero_si256();
        }
        k256_scales f[2];
        for (int hh = 0; hh < H; hh++) f[hh] = block_scales(R, g, b, h0 + hh, k);
        for (int v = 0; v < 4; v++) {
            for (int hh = 0; hh < H; hh++) {
                const uint8_t *wh = w + 32 * hh;
                __m256i lo, hi;
                if (k.bits == 8) {
                    lo = _mm256_load_si256((const __m256i *)(wh + 128 * v));
                    hi = _mm256_load_si256((const __m256i *)(wh + 128 * v + 64));
                    if (K256_SIGNED(k)) {
                        lo = _mm256_xor_si256(lo, _mm256_set1_epi8((char)0x80));
                        hi = _mm256_xor_si256(hi, _mm256_set1_epi8((char)0x80));
                    }
                } else {
                    unpack_pair(R, wh, v, &lo, &hi, k);
                }
                const __m256i la = K256_SIGNED(k) ? _mm256_abs_epi8(lo) : lo;
                const __m256i ha = K256_SIGNED(k) ? _mm256_abs_epi8(hi) : hi;
                for (int i = 0; i < TT; i++) {
                    const int8_t *x = xq + (size_t)i * (size_t)K + 8 * v;
                    group_dot(&I[hh * TT + i], &s16[hh * TT + i], lo, la, x4(x), 2 * v, k);
                    group_dot(&I[hh * TT + i], &s16[hh * TT + i], hi, ha, x4(x + 4), 2 * v + 1, k);
                }
            }
            if (k.halves && v == 1) /* the first half's scaling, then the second half from its own start */
                for (int j = 0; j < H * TT; j++) {
                    const size_t o = o0 + (size_t)(j % TT) * (size_t)nb;
                    acc[j] = scale_part(acc[j], I[j], f[j / TT], a, o, 0, k);
                    I[j] = start(R, a->sq + 2 * o, 1, k);
                }
        }
        for (int j = 0; j < H * TT; j++)
            acc[j] = scale_part(acc[j], I[j], f[j / TT], a, o0 + (size_t)(j % TT) * (size_t)nb, k.halves, k);
    }
    for (int hh = 0; hh < H; hh++) {
        const int mh = m - 8 * (h0 + hh);
        if (mh <= 0) break;
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(mh), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int i = 0; i < TT; i++) {
            float *y = out + (size_t)(t0 + i) * (size_t)ldo + n + 8 * (h0 + hh);
            if (mh >= 8) _mm256_storeu_ps(y, acc[hh * TT + i]);
            else _mm256_maskstore_ps(y, keep, acc[hh * TT + i]);
        }
    }
}

/* Up to 2 rows of x: both halves of a group in one pass (one read of its
 * lines); more: each half on its own, tiles of up to 4 rows of x. */
INLINE void rows_k(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R, int n0, int n1,
                   const dol_r16_kind k)
{
    for (int n = n0; n < n1; n += DOL_R16_ROWS) {
        const int g = n / DOL_R16_ROWS, m = n1 - n;
        if (a->T == 1) {
            tile(out, ldo, a, R, g, 0, 2, n, m, 0, 1, k);
            continue;
        }
        if (a->T == 2) {
            tile(out, ldo, a, R, g, 0, 2, n, m, 0, 2, k);
            continue;
        }
        for (int h = 0; h < 2 && m > 8 * h; h++)
            for (int t0 = 0; t0 < a->T; t0 += K256_TILE_MAX) {
                switch (a->T - t0 < K256_TILE_MAX ? a->T - t0 : K256_TILE_MAX) {
                case 1: tile(out, ldo, a, R, g, h, 1, n, m, t0, 1, k); break;
                case 2: tile(out, ldo, a, R, g, h, 1, n, m, t0, 2, k); break;
                case 3: tile(out, ldo, a, R, g, h, 1, n, m, t0, 3, k); break;
                default: tile(out, ldo, a, R, g, h, 1, n, m, t0, 4, k); break;
                }
            }
    }
}

void K256_CAT(dol_i8_r16_rows_, DOL_I8_VARIANT)(float *out, int ldo, const dol_i8_act *a, const dol_i8_r16 *R,
                                                int n0, int n1)
{
    DOL_R16_DISPATCH(R, rows_k, out, ldo, a, R, n0, n1);
}
