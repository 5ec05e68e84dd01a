/* src/engine/cpu_k_i8.c — the 8-bit-activation kernels (cpu_i8.h): the
 * activation quantizer and one product per weight format, each format a
 * decoder of one 32-weight block into int8 lanes and scales (and, in the
 * avx512vnni set, of a pair of blocks into one 512-bit vector), shared by
 * the tiles of one product: in-register tiles that decode as they go, and
 * panel tiles that read rows of W decoded once per thread. Compiled once
 * per instruction set with -DDOL_I8_VARIANT=avx2|avxvnni|avx512vnni
 * (CMakeLists.txt); exports the table dol_cpu_i8_<variant>. */
#include "engine/cpu_i8.h"

#include <immintrin.h>
#include <string.h>

#include "dolphin/ggml_blocks.h"

#define I8_CAT_(a, b) a##b
#define I8_CAT(a, b) I8_CAT_(a, b)
#define I8_STR_(a) #a
#define I8_STR(a) I8_STR_(a)

#define I8_ID_avx2 1
#define I8_ID_avxvnni 2
#define I8_ID_avx512vnni 3
#define I8_ID I8_CAT(I8_ID_, DOL_I8_VARIANT)

#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "the int8 kernels need -mavx2 -mfma -mf16c"
#endif
#if I8_ID == 2 && !defined(__AVXVNNI__)
#error "the avxvnni variant needs -mavxvnni"
#endif
#if I8_ID == 3 && !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
#error "the avx512vnni variant needs -mavx512vnni -mavx512vl"
#endif

/* ---- the int8 dot product of one block ------------------------------------ */

/* Lane j of a block's product: I_j = sum of w_i q_i over i = 4j .. 4j+3,
 * exact in every variant. A weight block is prepared once (prep) into aux,
 * then multiplied by any number of activation blocks (dot):
 *   VNNI: vpdpbusd takes unsigned x signed bytes without saturation, so the
 *     activations go in as q + 128 (xu, a flip of the sign bit) and aux
 *     starts the sum at -128 sum w_i: one instruction per product;
 *   AVX2: aux = |w| (unsigned, <= 128) against q with w's sign (|.| <= 127):
 *     vpmaddubsw's pair sums are at most 2 * 128 * 127 < 2^15 (it never
 *     saturates), vpmaddwd adds the pairs. */
#if I8_ID >= 2
static inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s)
{
#if I8_ID == 3
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}
static inline __m256i prep(__m256i w)
{
    return _mm256_sub_epi32(_mm256_setzero_si256(), dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), w));
}
static inline __m256i xform(__m256i q) { return _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)); }
static inline __m256i dot(__m256i w, __m256i aux, __m256i x) { return dpbusd(aux, x, w); }
#else
static inline __m256i prep(__m256i w) { return _mm256_sign_epi8(w, w); }
static inline __m256i xform(__m256i q) { return q; }
static inline __m256i dot(__m256i w, __m256i aux, __m256i x)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aux, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}
#endif

/* AVX2 with weights that fit 7 bits unsigned (u = w + c, c = 0 or a power
 * of two, u < 128; the format's OFF below): lane j of u . q less c times
 * lane j of 1 . q (xc, per block of x). The pair sums stay within 16 bits
 * (|.| < 2^15 before and after the subtraction), so the lanes are the
 * exact sums of w_i q_i of dot, without its two sign operations. */
#define I8_UNS(OFF) (I8_ID == 1 && (OFF) <= 6)
#define I8_U(w, OFF) ((OFF) ? _mm256_add_epi8((w), _mm256_set1_epi8((char)(1 << (OFF)))) : (w))
static inline __m256i xcorr(__m256i q, int off) { return _mm256_maddubs_epi16(_mm256_set1_epi8((char)(1 << off)), q); }
static inline __m256i udot(__m256i u, __m256i q, __m256i xc, int off)
{
    __m256i p = _mm256_maddubs_epi16(u, q);
    if (off) p = _mm256_sub_epi16(p, xc);
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

/* The scale vector of a block whose halves have scales a (lanes 0-3) and b. */
static inline __m256 halves(float a, float b)
{
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(a)), _mm_set1_ps(b), 1);
}

/* 32 nibbles from 16 bytes: the low nibbles first, then the high ones. */
static inline __m256i nibbles_lo_hi(const uint8_t *p)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(0xF);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

/* Bit i of the 32 bits at p, for byte i, as 0 or `val`. */
static inline __m256i bits32(const uint8_t *p, char val)
{
    uint32_t u;
    memcpy(&u, p, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)u),
        _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i on = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(on, _mm256_set1_epi8(val));
}

/* ---- one decoder per weight format: block b of row n ---------------------- */

/* A decoded block: 32 int8 weights, their scale per lane (sw) and, for the
 * formats with minima, their minimum per lane (mw): W = sw * w - mw. */
typedef struct {
    __m256i w;
    __m256 sw, mw;
} blk;

static inline blk dec_q8_0(const dol_i8_weight *W, int n, int b)
{
    const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)b * 34;
    return (blk){ _mm256_loadu_si256((const __m256i *)(p + 2)), _mm256_set1_ps(f16_at(p)), _mm256_setzero_ps() };
}

static inline blk dec_q4_0(const dol_i8_weight *W, int n, int b)
{
    const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)b * 18;
    return (blk){ _mm256_sub_epi8(nibbles_lo_hi(p + 2), _mm256_set1_epi8(8)), _mm256_set1_ps(f16_at(p)),
                  _mm256_setzero_ps() };
}

static inline blk dec_q4_1(const dol_i8_weight *W, int n, int b)
{
    const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)b * 20;
    return (blk){ nibbles_lo_hi(p + 4), _mm256_set1_ps(f16_at(p)), _mm256_set1_ps(-f16_at(p + 2)) };
}

/* decu_*: the block as w + c (unsigned, c a power of two), for the 512-bit
 * in-register tiles; dec_*: w. */
static inline blk decu_q5_0(const dol_i8_weight *W, int n, int b)
{
    const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)b * 22;
    return (blk){ _mm256_or_si256(nibbles_lo_hi(p + 6), bits32(p + 2, 0x10)), _mm256_set1_ps(f16_at(p)),
                  _mm256_setzero_ps() };
}

static inline blk dec_q5_0(const dol_i8_weight *W, int n, int b)
{
    const blk d = decu_q5_0(W, n, b);
    return (blk){ _mm256_sub_epi8(d.w, _mm256_set1_epi8(16)), d.sw, d.mw };
}

static inline blk dec_q5_1(const dol_i8_weight *W, int n, int b)
{
    const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)b * 24;
    const __m256i q = _mm256_or_si256(nibbles_lo_hi(p + 8), bits32(p + 4, 0x10));
    return (blk){ q, _mm256_set1_ps(f16_at(p)), _mm256_set1_ps(-f16_at(p + 2)) };
}

/* The K-quants: super-blocks of 256, block b is sub-block j = b % 8 of
 * super-block b / 8 (ggml_blocks.h has the layouts). */
static inline blk dec_q2_k(const dol_i8_weight *W, int n, int b)
{
    const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)(b >> 3) * 84;
    const int j = b & 7, h = j >> 2, g = j & 3;
    const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * h));
    const __m256i q = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
    const uint8_t s0 = p[8 * h + 2 * g], s1 = p[8 * h + 2 * g + 1];
    const float d = f16_at(p + 80), dm = f16_at(p + 82);
    return (blk){ q, halves(d * (float)(s0 & 0xF), d * (float)(s1 & 0xF)),
                  halves(dm * (float)(s0 >> 4), dm * (float)(s1 >> 4)) };
}

static inline blk decu_q3_k(const dol_i8_weight *W, int n, int b)
{
    const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)(b >> 3) * 110;
    const int j = b & 7, h = j >> 2, g = j & 3;
    const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 32 + 32 * h));
    const __m256i q2 = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
    const __m256i hm = _mm256_loadu_si256((const __m256i *)p);
    const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + g)));
    /* w + 4 = q2 + 4 where the high bit is set */
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
    const __m256i q = _mm256_or_si256(q2, _mm256_and_si256(set, _mm256_set1_epi8(4)));
    const float d = f16_at(p + 108);
    const int i = 8 * h + 2 * g;
    return (blk){ q, halves(d * (float)dol_blk_q3k_scale(i, p + 96), d * (float)dol_blk_q3k_scale(i + 1, p + 96)),
                  _mm256_setzero_ps() };
}

static inline blk dec_q3_k(const dol_i8_weight *W, int n, int b)
{
    const blk d = decu_q3_k(W, n, b);
    return (blk){ _mm256_sub_epi8(d.w, _mm256_set1_epi8(4)), d.sw, d.mw };
}

/* The quants of block j of a Q4_K / Q5_K / Q6_K super-block at p. */
static inline __m256i q4_k_qs(const uint8_t *p, int j)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * (j >> 1)));
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (j & 1))), _mm256_set1_epi8(0xF));
}
static inline __m256i q5_k_qs(const uint8_t *p, int j)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 48 + 32 * (j >> 1)));
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (j & 1))), _mm256_set1_epi8(0xF));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 16));
    const __m256i bit = _mm256_set1_epi8((char)(1 << j));
    return _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), _mm256_set1_epi8(16)));
}
static inline __m256i q6_k_qs(const uint8_t *p, int j) /* w, -32..31 */
{
    const int h = j >> 2, qd = j & 3;
    const __m256i lb = _mm256_loadu_si256((const __m256i *)(p + 64 * h + ((qd & 1) ? 32 : 0)));
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(lb, _mm_cvtsi32_si128((qd & 2) ? 4 : 0)), _mm256_set1_epi8(0xF));
    const __m256i hb = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
    const __m256i hi = _mm256_and_si256(_mm256_sll_epi16(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * qd)), _mm_cvtsi32_si128(4)),
                                        _mm256_set1_epi8(0x30));
    return _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
}

static inline blk dec_q4_k(const dol_i8_weight *W, int n, int b)
{
    const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)(b >> 3) * 144;
    int sc, mn;
    dol_blk_k4_scale_min(b & 7, p + 4, &sc, &mn);
    return (blk){ q4_k_qs(p, b & 7), _mm256_set1_ps(f16_at(p) * (float)sc), _mm256_set1_ps(f16_at(p + 2) * (float)mn) };
}

static inline blk dec_q5_k(const dol_i8_weight *W, int n, int b)
{
    const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)(b >> 3) * 176;
    int sc, mn;
    dol_blk_k4_scale_min(b & 7, p + 4, &sc, &mn);
    return (blk){ q5_k_qs(p, b & 7), _mm256_set1_ps(f16_at(p) * (float)sc), _mm256_set1_ps(f16_at(p + 2) * (float)mn) };
}

/* The 256-bit tiles read Q4_K, Q5_K and Q6_K through their super-blocks:
 * the scales (and minima) of super-block sb of row n once (sb8: sw[8] and
 * mw[8], Q6_K's sw[16]; the products of dec_*), then each block's quants
 * (decs), the same values as DEC's. */
#define K4_IDX(i) ((int)(0x80808000u | (i))) /* byte i into a 32-bit lane (-1: zero) */
static inline void k4_sb8(const uint8_t *p, float *sw, float *mw)
{
    /* dol_blk_k4_scale_min for j = 0..7 in the 32-bit lanes: sc_j from
     * byte A_j (and C_j's top 2 bits), mn_j from byte B_j (and D_j's) */
    const __m256i s = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + 4))); /* + 4 qs bytes */
    const __m256i A = _mm256_shuffle_epi8(s, _mm256_set_epi32(K4_IDX(11), K4_IDX(10), K4_IDX(9), K4_IDX(8), K4_IDX(3), K4_IDX(2), K4_IDX(1), K4_IDX(0)));
    const __m256i B = _mm256_shuffle_epi8(s, _mm256_set_epi32(K4_IDX(11), K4_IDX(10), K4_IDX(9), K4_IDX(8), K4_IDX(7), K4_IDX(6), K4_IDX(5), K4_IDX(4)));
    const __m256i C = _mm256_shuffle_epi8(s, _mm256_set_epi32(K4_IDX(3), K4_IDX(2), K4_IDX(1), K4_IDX(0), -1, -1, -1, -1));
    const __m256i D = _mm256_shuffle_epi8(s, _mm256_set_epi32(K4_IDX(7), K4_IDX(6), K4_IDX(5), K4_IDX(4), -1, -1, -1, -1));
    const __m256i lo = _mm256_set_epi32(15, 15, 15, 15, 63, 63, 63, 63);
    const __m256i sc = _mm256_or_si256(_mm256_and_si256(A, lo), _mm256_slli_epi32(_mm256_srli_epi32(C, 6), 4));
    const __m256i mn = _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(B, _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0)), lo),
                                       _mm256_slli_epi32(_mm256_srli_epi32(D, 6), 4));
    _mm256_storeu_ps(sw, _mm256_mul_ps(_mm256_set1_ps(f16_at(p)), _mm256_cvtepi32_ps(sc)));
    _mm256_storeu_ps(mw, _mm256_mul_ps(_mm256_set1_ps(f16_at(p + 2)), _mm256_cvtepi32_ps(mn)));
}
static inline void q4_k_sb8(const dol_i8_weight *W, int n, int sb, float *sw, float *mw)
{
    k4_sb8(W->base + (size_t)n * W->row_bytes + (size_t)sb * 144, sw, mw);
}
static inline void q5_k_sb8(const dol_i8_weight *W, int n, int sb, float *sw, float *mw)
{
    k4_sb8(W->base + (size_t)n * W->row_bytes + (size_t)sb * 176, sw, mw);
}
static inline blk q4_k_decs(const dol_i8_weight *W, int n, int b, const float *sw, const float *mw)
{
    const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)(b >> 3) * 144;
    return (blk){ q4_k_qs(p, b & 7), _mm256_broadcast_ss(sw + (b & 7)), _mm256_broadcast_ss(mw + (b & 7)) };
}
static inline blk q5_k_decs(const dol_i8_weight *W, int n, int b, const float *sw, const float *mw)
{
    const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)(b >> 3) * 176;
    return (blk){ q5_k_qs(p, b & 7), _mm256_broadcast_ss(sw + (b & 7)), _mm256_broadcast_ss(mw + (b & 7)) };
}
/* The other formats decode each block whole (SB 0 in I8_PRODUCT). */
#define I8_NO_SB(NAME)                                                                            \
    static inline void NAME##_sb8(const dol_i8_weight *W, int n, int sb, float *sw, float *mw)     \
    {                                                                                              \
        (void)W, (void)n, (void)sb, (void)sw, (void)mw;                                            \
    }                                                                                              \
    static inline blk NAME##_decs(const dol_i8_weight *W, int n, int b, const float *sw,          \
                                  const float *mw)                                                 \
    {                                                                                              \
        (void)W, (void)n, (void)b, (void)sw, (void)mw;                                             \
        return (blk){ _mm256_setzero_si256(), _mm256_setzero_ps(), _mm256_setzero_ps() };          \
    }
I8_NO_SB(q8_0)
I8_NO_SB(q4_0)
I8_NO_SB(q4_1)
I8_NO_SB(q5_0)
I8_NO_SB(q5_1)
I8_NO_SB(q2_k)
I8_NO_SB(q3_k)
I8_NO_SB(nf4)
I8_NO_SB(q8)

static inline blk dec_q6_k(const dol_i8_weight *W, int n, int b)
{
    const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)(b >> 3) * 210;
    const int j = b & 7;
    const float d = f16_at(p + 208);
    const int8_t *sc = (const int8_t *)(p + 192 + 2 * j);
    return (blk){ q6_k_qs(p, j), halves(d * (float)sc[0], d * (float)sc[1]), _mm256_setzero_ps() };
}

/* Q6_K through its super-blocks (as Q4_K above): the 16 scales of its
 * half-blocks times d, then each block's quants. */
static inline void q6_k_sb8(const dol_i8_weight *W, int n, int sb, float *sw, float *mw)
{
    (void)mw;
    const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)sb * 210;
    const __m256 d = _mm256_set1_ps(f16_at(p + 208));
    const __m128i sc = _mm_loadu_si128((const __m128i *)(p + 192));
    _mm256_storeu_ps(sw, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_storeu_ps(sw + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
}
static inline blk q6_k_decs(const dol_i8_weight *W, int n, int b, const float *sw, const float *mw)
{
    (void)mw;
    const uint8_t *p = W->base + (size_t)n * W->row_bytes + (size_t)(b >> 3) * 210;
    const int j = b & 7;
    const __m256 s = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_broadcast_ss(sw + 2 * j)), _mm_broadcast_ss(sw + 2 * j + 1), 1);
    return (blk){ q6_k_qs(p, j), s, _mm256_setzero_ps() };
}

/* Dolphin's NF4 (nf4.h): blocks of 64, codes of weight i and i + 32 in
 * the low and high nibbles of byte i, one F16 absmax per block. */
static inline blk dec_nf4(const dol_i8_weight *W, int n, int b)
{
    const dol_nf4_matrix *m = W->nf4;
    const uint8_t *p = m->codes + (size_t)n * (size_t)(m->cols / 2) + (size_t)(b >> 1) * 32;
    const __m256i v = _mm256_loadu_si256((const __m256i *)p);
    const __m256i c = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (b & 1))), _mm256_set1_epi8(0xF));
    const __m256i book = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)dol_nf4_i8_codes));
    const uint16_t a = m->scales[(size_t)n * (size_t)m->blocks_per_row + (size_t)(b >> 1)];
    const float absmax = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(a)));
    return (blk){ _mm256_shuffle_epi8(book, c), _mm256_set1_ps(absmax * (1.0f / 127.0f)), _mm256_setzero_ps() };
}

static inline blk dec_q8(const dol_i8_weight *W, int n, int b)
{
    const dol_q8_matrix *m = W->q8;
    const int8_t *p = m->quants + (size_t)n * (size_t)m->cols + (size_t)b * 32;
    const uint16_t s = m->scales[(size_t)n * (size_t)m->blocks_per_row + (size_t)b];
    return (blk){ _mm256_loadu_si256((const __m256i *)p), _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(s)))),
                  _mm256_setzero_ps() };
}

/* ---- where each format's rows lie (for the prefetches of the product) ------ */

/* Row n's main stream (the weights, and for GGUF their scales): its start,
 * and its length in bytes (*len). Rows follow each other in memory. */
static inline const uint8_t *row_gguf(const dol_i8_weight *W, int n, size_t *len)
{
    *len = W->row_bytes;
    return W->base + (size_t)n * W->row_bytes;
}

static inline const uint8_t *row_nf4(const dol_i8_weight *W, int n, size_t *len)
{
    *len = (size_t)(W->nf4->cols / 2);
    return W->nf4->codes + (size_t)n * *len;
}

static inline const uint8_t *row_q8(const dol_i8_weight *W, int n, size_t *len)
{
    *len = (size_t)W->q8->cols;
    return (const uint8_t *)W->q8->quants + (size_t)n * *len;
}

/* ---- the product ------------------------------------------------------------ */

/* A decoded weight block: the weights, their prep, scales and minima per lane. */
typedef struct {
    __m256i w, aux;
    __m256 sw, mw;
} pblk;

/* Blocks 2p and 2p + 1 of a row as the panel keeps them (a missing second
 * block, nb odd, is zeros): each field of both blocks in 64 bytes, so the
 * 512-bit product reads a pair in one load per field. */
typedef struct {
    __m256i w[2], aux[2];
    __m256 sw[2], mw[2];
} ppair;

/* Rows of W decoded once into a panel from this many rows of x on (below,
 * each tile decodes its blocks itself: every block is used once or twice;
 * the 512-bit set's in-register tiles take up to 8 rows of x a decode). */
#if I8_ID == 3
#define I8_PANEL_MIN_T 16
#else
#define I8_PANEL_MIN_T 3
#endif
#define I8_ROWS 4 /* rows of W per tile, and per panel */

/* Accumulation: every output keeps two accumulators of 8 lanes, one for the
 * even blocks and one for the odd ones (a 512-bit vector holds both), and
 * is their lane-wise sum, summed across lanes (cpu_i8.h). */

/* Block b of the tile into accumulator half H: rows r < R of W (KROW, an
 * expression of r giving the row's pblk, taken one row at a time so that
 * few rows' blocks are live at once) against columns c < C of x; the
 * operations of cpu_i8.h, in its order. */
#define I8_STEP(MIN, H, OFF, KROW)                                                                \
    do {                                                                                          \
        __m256i xq[2], xc[2];                                                                     \
        __m256 dx[2], xs[2];                                                                      \
        for (int c = 0; c < C; c++) {                                                             \
            const size_t o = (size_t)(t + c) * (size_t)nb + (size_t)b;                            \
            xq[c] = xform(_mm256_loadu_si256((const __m256i *)(a->q + o * 32)));                  \
            if (I8_UNS(OFF) && OFF) xc[c] = xcorr(xq[c], OFF);                                    \
            dx[c] = _mm256_broadcast_ss(a->d + o);                                                \
            if (MIN) xs[c] = _mm256_loadu_ps(a->s + o * 8);                                       \
        }                                                                                         \
        for (int r = 0; r < R; r++) {                                                             \
            const pblk kr = KROW;                                                                 \
            for (int c = 0; c < C; c++) {                                                         \
                const __m256i I = I8_UNS(OFF) ? udot(kr.w, xq[c], xc[c], OFF)                     \
                                              : dot(kr.w, kr.aux, xq[c]);                         \
                acc[r][c][H] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(kr.sw, dx[c]), \
                                               acc[r][c][H]);                                     \
                if (MIN) acc[r][c][H] = _mm256_fnmadd_ps(kr.mw, xs[c], acc[r][c][H]);            \
            }                                                                                     \
        }                                                                                         \
    } while (0)

/* Row r's block b from a panel (I8_STEP's KROW). */
#define I8_KPAN(r)                                                                                \
    ((pblk){ pan[(size_t)(r) * (size_t)np + (size_t)(b >> 1)].w[b & 1],                           \
             pan[(size_t)(r) * (size_t)np + (size_t)(b >> 1)].aux[b & 1],                         \
             pan[(size_t)(r) * (size_t)np + (size_t)(b >> 1)].sw[b & 1],                          \
             pan[(size_t)(r) * (size_t)np + (size_t)(b >> 1)].mw[b & 1] })

#define I8_STORE()                                                                                \
    for (int r = 0; r < R; r++)                                                                   \
        for (int c = 0; c < C; c++)                                                               \
    out[(size_t)(t + c) * (size_t)ldo + n + r] = hsum8(_mm256_add_ps(acc[r][c][0], acc[r][c][1]))

#define I8_ZERO()                                                                                 \
    __m256 acc[I8_ROWS][2][2];                                                                    \
    for (int r = 0; r < R; r++)                                                                   \
        for (int c = 0; c < C; c++) acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps()

/* FN over every column of x in tiles of 2 (and 1), rows n .. n+R-1 of W
 * (R = I8_ROWS or 1), SRC the weights or the panel. */
#define I8_RUN_2COL(FN, SRC)                                                                      \
    do {                                                                                          \
        int t_ = 0;                                                                               \
        if (R == I8_ROWS) {                                                                       \
            for (; t_ + 2 <= T; t_ += 2) FN(out, ldo, a, SRC, n, t_, I8_ROWS, 2);                 \
            if (t_ < T) FN(out, ldo, a, SRC, n, t_, I8_ROWS, 1);                                  \
        } else {                                                                                  \
            for (; t_ + 2 <= T; t_ += 2) FN(out, ldo, a, SRC, n, t_, 1, 2);                       \
            if (t_ < T) FN(out, ldo, a, SRC, n, t_, 1, 1);                                        \
        }                                                                                         \
    } while (0)

#if I8_ID == 3
/* The 512-bit panel product: a pair of blocks per vector, lanes 0-7 the
 * even block's (accumulator half 0), 8-15 the odd one's, each lane the
 * operations of I8_STEP on that block, so the bits are the 256-bit ones. */
#define I8_ZMAXC 8 /* columns of x per 512-bit tile (at most) */
/* The panel tiles read q and d (a prefill's u and dv would not stay in L2). */
static inline __m512i xform512(__m512i q) { return _mm512_xor_si512(q, _mm512_set1_epi8((char)0x80)); }

/* d of blocks o and o + 1 in lanes 0-7 and 8-15 */
static inline __m512 pair_scale(const float *d)
{
    const __m128 two = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)d));
    return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                 _mm512_castps128_ps512(two));
}

static inline float hsum16_pair(__m512 v)
{
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

/* The R x C outputs of a 512-bit tile: both halves' sum, then the lanes'. */
#define I8_ZSTORE()                                                                               \
    for (int r = 0; r < R; r++)                                                                   \
        for (int c = 0; c < C; c++) out[(size_t)(t + c) * (size_t)ldo + n + r] = hsum16_pair(acc[r][c])

/* An odd last block b (nb odd) of rows r < R (w .. mw: the block in the low
 * half, zeros above) against columns t .. t+C-1 of x, into the
 * accumulators' low half only. */
static inline __attribute__((always_inline)) void ztail(__m512 acc[][I8_ZMAXC], const dol_i8_act *a, int t, int b,
                                                        const __m512i *w, const __m512i *aux, const __m512 *sw,
                                                        const __m512 *mw, const int R, const int C, const bool min)
{
    const __mmask16 lo = 0x00FF;
    for (int c = 0; c < C; c++) {
        const size_t o = (size_t)(t + c) * (size_t)a->nb + (size_t)b;
        const __m512i xq = _mm512_zextsi256_si512(xform(_mm256_loadu_si256((const __m256i *)(a->q + o * 32))));
        const __m512 dx = _mm512_set1_ps(a->d[o]);
        const __m512 xs = _mm512_zextps256_ps512(_mm256_loadu_ps(a->s + o * 8));
        for (int r = 0; r < R; r++) {
            const __m512i I = _mm512_dpbusd_epi32(aux[r], xq, w[r]);
            acc[r][c] = _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(sw[r], dx), acc[r][c], lo);
            if (min) acc[r][c] = _mm512_mask3_fnmadd_ps(mw[r], xs, acc[r][c], lo);
        }
    }
}

#define I8_ZPTILE(NAME, MIN)                                                                      \
    static inline __attribute__((always_inline)) void NAME##_zptile(                              \
        float *out, int ldo, const dol_i8_act *a, const ppair *pan, int n, int t, const int R,     \
        const int C)                                                                               \
    {                                                                                              \
        const int nb = a->nb, np = (nb + 1) / 2;                                                   \
        __m512 acc[I8_ROWS][I8_ZMAXC];                                                             \
        for (int r = 0; r < R; r++)                                                                \
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();                           \
        int p = 0;                                                                                 \
        for (; 2 * p + 1 < nb; p++) {                                                              \
            __m512i xq[I8_ZMAXC];                                                                     \
            __m512 dx[I8_ZMAXC], xs[I8_ZMAXC];                                                           \
            for (int c = 0; c < C; c++) {                                                          \
                const size_t o = (size_t)(t + c) * (size_t)nb + (size_t)(2 * p);                   \
                xq[c] = xform512(_mm512_loadu_si512((const void *)(a->q + o * 32)));               \
                dx[c] = pair_scale(a->d + o);                                                      \
                if (MIN) xs[c] = _mm512_loadu_ps(a->s + o * 8);                                    \
            }                                                                                      \
            for (int r = 0; r < R; r++) {                                                          \
                const ppair *e = pan + (size_t)r * (size_t)np + (size_t)p;                         \
                const __m512i w = _mm512_load_si512((const void *)e->w);                           \
                const __m512i aux = _mm512_load_si512((const void *)e->aux);                       \
                const __m512 sw = _mm512_load_ps((const float *)e->sw);                            \
                for (int c = 0; c < C; c++) {                                                      \
                    const __m512i I = _mm512_dpbusd_epi32(aux, xq[c], w);                          \
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(sw, dx[c]),   \
                                                acc[r][c]);                                        \
                    if (MIN)                                                                       \
                        acc[r][c] = _mm512_fnmadd_ps(_mm512_load_ps((const float *)e->mw), xs[c], \
                                                     acc[r][c]);                                   \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        if (p < np) { /* nb odd: the last block, into half 0 only */                               \
            __m512i w[I8_ROWS], aux[I8_ROWS];                                                      \
            __m512 sw[I8_ROWS], mw[I8_ROWS];                                                       \
            for (int r = 0; r < R; r++) {                                                          \
                const ppair *e = pan + (size_t)r * (size_t)np + (size_t)p;                         \
                w[r] = _mm512_load_si512((const void *)e->w);                                      \
                aux[r] = _mm512_load_si512((const void *)e->aux);                                  \
                sw[r] = _mm512_load_ps((const float *)e->sw);                                      \
                mw[r] = _mm512_load_ps((const float *)e->mw);                                      \
            }                                                                                      \
            ztail(acc, a, t, 2 * p, w, aux, sw, mw, R, C, MIN);                                    \
        }                                                                                          \
        I8_ZSTORE();                                                                               \
    }
#define I8_PANEL_RUN(NAME)                                                                        \
    do {                                                                                          \
        int t = 0;                                                                                \
        if (R == I8_ROWS) {                                                                       \
            for (; t + 4 <= T; t += 4) NAME##_zptile(out, ldo, a, pan, n, t, I8_ROWS, 4);         \
            if (t + 2 <= T) NAME##_zptile(out, ldo, a, pan, n, t, I8_ROWS, 2), t += 2;            \
            if (t < T) NAME##_zptile(out, ldo, a, pan, n, t, I8_ROWS, 1);                         \
        } else {                                                                                  \
            for (; t + 4 <= T; t += 4) NAME##_zptile(out, ldo, a, pan, n, t, 1, 4);               \
            if (t + 2 <= T) NAME##_zptile(out, ldo, a, pan, n, t, 1, 2), t += 2;                  \
            if (t < T) NAME##_zptile(out, ldo, a, pan, n, t, 1, 1);                               \
        }                                                                                         \
    } while (0)
#else
#define I8_ZPTILE(NAME, MIN)
#define I8_PANEL_RUN(NAME) I8_RUN_2COL(NAME##_ptile, pan)
#endif

#if I8_ID == 3
/* ---- 512-bit in-register tiles (avx512vnni): a pair of blocks per vector ---- */

/* Blocks 2p and 2p + 1 of row n in one vector: lanes 0-7 (bytes 0-31) the
 * even block's, 8-15 the odd one's, each as DEC gives it, or as w + c for
 * the formats the tiles take unsigned (I8_PRODUCT's OFF). */
typedef struct {
    __m512i w;
    __m512 sw, mw;
} zblk;

static inline uint32_t le32(const uint8_t *p)
{
    uint32_t u;
    memcpy(&u, p, 4); /* x86: little-endian, as GGUF */
    return u;
}

static inline __m512i join_i(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
static inline __m512 join_f(__m256 lo, __m256 hi) { return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1); }

/* A pair decoder's side: per-row values of a wider unit (the K-quants'
 * super-block, NAME_side_pairs pairs), computed by NAME_side(W, n, p) at
 * the unit's first pair and passed to each of its pairs; none
 * (NAME_side_pairs 0) for the other formats. */
#define I8_NO_SIDE(NAME)                                                                          \
    enum { NAME##_side_pairs = 0 };                                                                \
    static inline __m512 NAME##_side(const dol_i8_weight *W, int n, int p)                         \
    {                                                                                              \
        (void)W, (void)n, (void)p;                                                                 \
        return _mm512_setzero_ps();                                                                \
    }

/* Any format: its two blocks decoded apart, then joined. */
#define I8_DEC2_JOIN(NAME, DEC)                                                                   \
    I8_NO_SIDE(NAME)                                                                               \
    static inline zblk NAME##_dec2(const dol_i8_weight *W, int n, int p, __m512 side)             \
    {                                                                                              \
        (void)side;                                                                                \
        const blk a = DEC(W, n, 2 * p), b = DEC(W, n, 2 * p + 1);                                  \
        return (zblk){ join_i(a.w, b.w), join_f(a.sw, b.sw), join_f(a.mw, b.mw) };                 \
    }

/* The formats read most, decoded a pair at a time; the signed ones (NF4,
 * Q8_0, int8) as w + 128 (the sign bit flipped). */
I8_NO_SIDE(nf4)
static inline zblk nf4_dec2(const dol_i8_weight *W, int n, int p, __m512 side)
{
    (void)side;
    const dol_nf4_matrix *m = W->nf4;
    const __m256i v = _mm256_loadu_si256((const __m256i *)(m->codes + (size_t)n * (size_t)(m->cols / 2) + (size_t)p * 32));
    const __m512i c = _mm512_and_si512(join_i(v, _mm256_srli_epi16(v, 4)), _mm512_set1_epi8(0xF));
    const __m512i book = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)dol_nf4_i8_codes)),
                                          _mm512_set1_epi8((char)0x80));
    const uint16_t a = m->scales[(size_t)n * (size_t)m->blocks_per_row + (size_t)p];
    const float absmax = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(a)));
    return (zblk){ _mm512_shuffle_epi8(book, c), _mm512_set1_ps(absmax * (1.0f / 127.0f)), _mm512_setzero_ps() };
}

/* The F16 scales at b0 and b1 over lanes 0-7 and 8-15 (one conversion). */
static inline __m512 halves512_f16(const uint8_t *b0, const uint8_t *b1)
{
    uint16_t h0, h1;
    memcpy(&h0, b0, 2);
    memcpy(&h1, b1, 2);
    const __m128 two = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)h0 | (uint32_t)h1 << 16)));
    return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                 _mm512_castps128_ps512(two));
}

/* as w + 8 */
I8_NO_SIDE(q4_0)
static inline zblk q4_0_dec2(const dol_i8_weight *W, int n, int p, __m512 side)
{
    (void)side;
    const uint8_t *b0 = W->base + (size_t)n * W->row_bytes + (size_t)(2 * p) * 18, *b1 = b0 + 18;
    const __m256i ab = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(b1 + 2)), _mm_loadu_si128((const __m128i *)(b0 + 2)));
    /* 128-bit lanes [a, b, a >> 4, b >> 4] -> [a lo, a hi, b lo, b hi] */
    const __m512i z = _mm512_and_si512(join_i(ab, _mm256_srli_epi16(ab, 4)), _mm512_set1_epi8(0xF));
    return (zblk){ _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), halves512_f16(b0, b1), _mm512_setzero_ps() };
}

I8_NO_SIDE(q8_0)
static inline zblk q8_0_dec2(const dol_i8_weight *W, int n, int p, __m512 side)
{
    (void)side;
    const uint8_t *b0 = W->base + (size_t)n * W->row_bytes + (size_t)(2 * p) * 34, *b1 = b0 + 34;
    const __m512i w = join_i(_mm256_loadu_si256((const __m256i *)(b0 + 2)), _mm256_loadu_si256((const __m256i *)(b1 + 2)));
    return (zblk){ _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80)), halves512_f16(b0, b1), _mm512_setzero_ps() };
}

I8_NO_SIDE(q8)
static inline zblk q8_dec2(const dol_i8_weight *W, int n, int p, __m512 side)
{
    (void)side;
    const dol_q8_matrix *m = W->q8;
    const int8_t *q = m->quants + (size_t)n * (size_t)m->cols + (size_t)p * 64;
    const uint8_t *s = (const uint8_t *)(m->scales + (size_t)n * (size_t)m->blocks_per_row + (size_t)(2 * p));
    return (zblk){ _mm512_xor_si512(_mm512_loadu_si512((const void *)q), _mm512_set1_epi8((char)0x80)),
                   halves512_f16(s, s + 2), _mm512_setzero_ps() };
}

I8_DEC2_JOIN(q4_1, dec_q4_1)
I8_DEC2_JOIN(q5_0, decu_q5_0)
I8_DEC2_JOIN(q5_1, dec_q5_1)
I8_DEC2_JOIN(q2_k, dec_q2_k)
I8_DEC2_JOIN(q3_k, decu_q3_k)

/* Q4_K and Q5_K: the side is the super-block's 8 scales times d (lanes
 * 0-7) and 8 minima times dmin (8-15), as dol_blk_k4_scale_min decodes
 * them (four 6-bit values a word). */
enum { q4_k_side_pairs = 4, q5_k_side_pairs = 4 };
static inline __m512 k4_side(const uint8_t *sb)
{
    const uint32_t a0 = le32(sb + 4), a1 = le32(sb + 8), a2 = le32(sb + 12);
    const __m128i b = _mm_set_epi32((int)(((a2 >> 4) & 0x0f0f0f0fu) | ((a1 >> 2) & 0x30303030u)), (int)(a1 & 0x3f3f3f3fu),
                                    (int)((a2 & 0x0f0f0f0fu) | ((a0 >> 2) & 0x30303030u)), (int)(a0 & 0x3f3f3f3fu));
    const __m512 dd = _mm512_insertf32x8(_mm512_set1_ps(f16_at(sb)), _mm256_set1_ps(f16_at(sb + 2)), 1);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)), dd);
}
static inline __m512 q4_k_side(const dol_i8_weight *W, int n, int p)
{
    return k4_side(W->base + (size_t)n * W->row_bytes + (size_t)(p >> 2) * 144);
}
static inline __m512 q5_k_side(const dol_i8_weight *W, int n, int p)
{
    return k4_side(W->base + (size_t)n * W->row_bytes + (size_t)(p >> 2) * 176);
}

/* Sub-blocks 2 (p % 4) and 2 (p % 4) + 1: their scales and minima from the side. */
static inline void k4_pair_scales(__m512 side, int p, __m512 *sw, __m512 *mw)
{
    const __m512i idx = _mm512_add_epi32(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                         _mm512_set1_epi32(2 * (p & 3)));
    *sw = _mm512_permutexvar_ps(idx, side);
    *mw = _mm512_permutexvar_ps(_mm512_add_epi32(idx, _mm512_set1_epi32(8)), side);
}

/* Q4_K: the pair is chunk p % 4 of the super-block, its low nibbles then
 * its high ones (as NF4's block of 64). */
static inline zblk q4_k_dec2(const dol_i8_weight *W, int n, int p, __m512 side)
{
    const uint8_t *sb = W->base + (size_t)n * W->row_bytes + (size_t)(p >> 2) * 144;
    const __m256i v = _mm256_loadu_si256((const __m256i *)(sb + 16 + 32 * (p & 3)));
    zblk z = { _mm512_and_si512(join_i(v, _mm256_srli_epi16(v, 4)), _mm512_set1_epi8(0xF)), _mm512_setzero_ps(),
               _mm512_setzero_ps() };
    k4_pair_scales(side, p, &z.sw, &z.mw);
    return z;
}

/* Q5_K: Q4_K's nibbles, and bit j of qh's 32 bytes the fifth bit of
 * sub-block j. */
static inline zblk q5_k_dec2(const dol_i8_weight *W, int n, int p, __m512 side)
{
    const int j = 2 * (p & 3);
    const uint8_t *sb = W->base + (size_t)n * W->row_bytes + (size_t)(p >> 2) * 176;
    const __m256i v = _mm256_loadu_si256((const __m256i *)(sb + 48 + 32 * (p & 3)));
    const __m512i lo = _mm512_and_si512(join_i(v, _mm256_srli_epi16(v, 4)), _mm512_set1_epi8(0xF));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(sb + 16));
    const __m512i hz = join_i(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), _mm256_srl_epi16(qh, _mm_cvtsi32_si128(j + 1)));
    const __m512i hi = _mm512_and_si512(_mm512_slli_epi16(hz, 4), _mm512_set1_epi8(0x10));
    zblk z = { _mm512_or_si512(lo, hi), _mm512_setzero_ps(), _mm512_setzero_ps() };
    k4_pair_scales(side, p, &z.sw, &z.mw);
    return z;
}

/* Q6_K, as w + 32: sub-blocks j, j + 1 (j = 2 (p % 4)) are 64 consecutive
 * bytes of ql (the same nibble), their high bits 2 qd and 2 qd + 2 of the
 * same 32 bytes of qh; the side is the super-block's 16 scales (one per 16
 * weights) times d. */
enum { q6_k_side_pairs = 4 };
static inline __m512 q6_k_side(const dol_i8_weight *W, int n, int p)
{
    const uint8_t *sb = W->base + (size_t)n * W->row_bytes + (size_t)(p >> 2) * 210;
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sb + 192)))),
                         _mm512_set1_ps(f16_at(sb + 208)));
}

static inline zblk q6_k_dec2(const dol_i8_weight *W, int n, int p, __m512 side)
{
    const int b = 2 * p, j = b & 7, h = j >> 2, qd = j & 3;
    const uint8_t *sb = W->base + (size_t)n * W->row_bytes + (size_t)(b >> 3) * 210;
    const __m512i lb = _mm512_loadu_si512((const void *)(sb + 64 * h));
    const __m512i lo = _mm512_and_si512(_mm512_srl_epi16(lb, _mm_cvtsi32_si128((qd & 2) ? 4 : 0)), _mm512_set1_epi8(0xF));
    const __m256i hb = _mm256_loadu_si256((const __m256i *)(sb + 128 + 32 * h));
    const __m512i hz = join_i(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * qd)), _mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * qd + 2)));
    const __m512i hi = _mm512_and_si512(_mm512_slli_epi16(hz, 4), _mm512_set1_epi8(0x30));
    /* scales 4 (p % 4) .. + 3, each over 4 lanes */
    const __m512i idx = _mm512_add_epi32(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                         _mm512_set1_epi32(4 * (p & 3)));
    return (zblk){ _mm512_or_si512(lo, hi), _mm512_permutexvar_ps(idx, side), _mm512_setzero_ps() };
}

/* An R x C tile decoding its pairs as it goes (R * C <= 16; the operations
 * of NAME_zptile; an odd last block is decoded alone into half 0): the R
 * rows' pair is decoded into registers, then each column of x is loaded
 * once and multiplied by all of them. The pair decoder gives u = w + 2^OFF
 * (unsigned; OFF 0: w itself) and lane j is vpdpbusd(u, q) started at
 * -2^OFF sum q (a->ns, shared by the rows; none for OFF 0): the exact I_j
 * with no per-row start (the 256-bit tiles' prep). L2: decode (C <= 2)
 * prefetches into L2, not L1 (8-bit rows: little arithmetic per byte, and
 * T0 prefetches held the L1 miss buffers the four streams' loads need). */
#define I8_ZTILE(NAME, DEC, MIN, ROWP, OFF, L2)                                                   \
    static inline __attribute__((always_inline)) void NAME##_ztile(                               \
        float *out, int ldo, const dol_i8_act *a, const dol_i8_weight *W, int n, int t,            \
        const int R, const int C)                                                                  \
    {                                                                                              \
        const int nb = a->nb;                                                                      \
        size_t len;                                                                                \
        const uint8_t *pf = n + 2 * R <= W->N ? ROWP(W, n + R, &len) : NULL;                       \
        /* the next tile's rows, a share per pair (no division in the loop) */                     \
        const size_t pf_len = pf ? (size_t)R * len : 0, pf_step = 2 * (pf_len / (size_t)nb);       \
        size_t pf_o = 0, pf_e = 0;                                                                 \
        __m512 acc[I8_ROWS][I8_ZMAXC], side[I8_ROWS];                                              \
        for (int r = 0; r < R; r++) {                                                              \
            side[r] = _mm512_setzero_ps();                                                         \
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();                           \
        }                                                                                          \
        int p = 0;                                                                                 \
        for (; 2 * p + 1 < nb; p++) {                                                              \
            pf_e = 2 * p + 3 < nb ? pf_e + pf_step : pf_len;                                       \
            for (; pf_o < pf_e; pf_o += 64)                                                        \
                if (L2 && C <= 2) _mm_prefetch((const char *)pf + pf_o, _MM_HINT_T1);             \
                else _mm_prefetch((const char *)pf + pf_o, _MM_HINT_T0);                           \
            zblk k[I8_ROWS];                                                                       \
            if (NAME##_side_pairs > 0 && p % (NAME##_side_pairs > 0 ? NAME##_side_pairs : 1) == 0) \
                for (int r = 0; r < R; r++) side[r] = NAME##_side(W, n + r, p);                    \
            for (int r = 0; r < R; r++) k[r] = NAME##_dec2(W, n + r, p, side[r]);                  \
            for (int c = 0; c < C; c++) {                                                          \
                const size_t o = (size_t)(t + c) * (size_t)nb + (size_t)(2 * p);                   \
                const __m512i xq = _mm512_loadu_si512((const void *)(a->q + o * 32));              \
                const __m512 dx = _mm512_loadu_ps(a->dv + o * 8);                                  \
                const __m512i start = OFF ? _mm512_slli_epi32(_mm512_loadu_si512((const void *)(a->ns + o * 8)), OFF) \
                                          : _mm512_setzero_si512();                                \
                for (int r = 0; r < R; r++) {                                                      \
                    const __m512i I = _mm512_dpbusd_epi32(start, k[r].w, xq);                      \
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(k[r].sw, dx), \
                                                acc[r][c]);                                        \
                    if (MIN) acc[r][c] = _mm512_fnmadd_ps(k[r].mw, _mm512_loadu_ps(a->s + o * 8), acc[r][c]); \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        if (2 * p < nb) { /* nb odd */                                                             \
            __m512i w[I8_ROWS], aux[I8_ROWS];                                                      \
            __m512 sw[I8_ROWS], mw[I8_ROWS];                                                       \
            for (int r = 0; r < R; r++) {                                                          \
                const blk d = DEC(W, n + r, 2 * p);                                                \
                w[r] = _mm512_zextsi256_si512(d.w), aux[r] = _mm512_zextsi256_si512(prep(d.w));    \
                sw[r] = _mm512_zextps256_ps512(d.sw), mw[r] = _mm512_zextps256_ps512(d.mw);        \
            }                                                                                      \
            ztail(acc, a, t, 2 * p, w, aux, sw, mw, R, C, MIN);                                    \
        }                                                                                          \
        I8_ZSTORE();                                                                               \
    }
/* In-register tiles: 4 rows of W x 1-2 of x (decode, memory-bound), 2 x 8
 * (a batch: each decoded pair serves 8 rows of x); u and dv are filled
 * below I8_PANEL_MIN_T rows only, so from there without a panel (no
 * scratch) the 256-bit tiles run (the same bits). */
#define I8_TILE_RUN(NAME)                                                                         \
    do {                                                                                          \
        int t = 0;                                                                                \
        if (T >= I8_PANEL_MIN_T) {                                                                \
            I8_RUN_2COL(NAME##_tile, W);                                                          \
        } else if (T <= 2) {                                                                      \
            if (R == I8_ROWS) {                                                                   \
                if (T == 2) NAME##_ztile(out, ldo, a, W, n, 0, I8_ROWS, 2);                       \
                else NAME##_ztile(out, ldo, a, W, n, 0, I8_ROWS, 1);                              \
            } else {                                                                              \
                if (T == 2) NAME##_ztile(out, ldo, a, W, n, 0, 1, 2);                             \
                else NAME##_ztile(out, ldo, a, W, n, 0, 1, 1);                                    \
            }                                                                                     \
        } else {                                                                                  \
            for (int r = 0; r < R; r += 2) {                                                      \
                const int rr = R - r >= 2 ? 2 : 1;                                                \
                for (t = 0; t + 8 <= T; t += 8)                                                   \
                    if (rr == 2) NAME##_ztile(out, ldo, a, W, n + r, t, 2, 8);                    \
                    else NAME##_ztile(out, ldo, a, W, n + r, t, 1, 8);                            \
                if (t + 4 <= T) {                                                                 \
                    if (rr == 2) NAME##_ztile(out, ldo, a, W, n + r, t, 2, 4);                    \
                    else NAME##_ztile(out, ldo, a, W, n + r, t, 1, 4);                            \
                    t += 4;                                                                       \
                }                                                                                 \
                if (t + 2 <= T) {                                                                 \
                    if (rr == 2) NAME##_ztile(out, ldo, a, W, n + r, t, 2, 2);                    \
                    else NAME##_ztile(out, ldo, a, W, n + r, t, 1, 2);                            \
                    t += 2;                                                                       \
                }                                                                                 \
                if (t < T) {                                                                      \
                    if (rr == 2) NAME##_ztile(out, ldo, a, W, n + r, t, 2, 1);                    \
                    else NAME##_ztile(out, ldo, a, W, n + r, t, 1, 1);                            \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    } while (0)
#else
#define I8_ZTILE(NAME, DEC, MIN, ROWP, OFF, L2)
#define I8_TILE_RUN(NAME) I8_RUN_2COL(NAME##_tile, W)
#endif

/* NAME_tile: an R x C tile (rows n .. n+R-1 of W, columns t .. t+C-1 of x)
 * decoding its blocks as it goes; NAME_ptile (NAME_zptile in 512 bits):
 * the same from a panel of R decoded rows; NAME_rows: rows n0 .. n1-1 for
 * every column, through panels from I8_PANEL_MIN_T columns on. The same
 * operations for every output whatever R, C or the path (cpu_i8.h). */
#define I8_PRODUCT(NAME, DEC, MIN, ROWP, OFF, L2, SB)                                             \
    /* block b of row n, decoded for I8_STEP (sw, mw: the super-block's, SB) */                \
    static inline __attribute__((always_inline, unused)) pblk NAME##_kdec(                        \
        const dol_i8_weight *W, int n, int b, const float *sw, const float *mw)                    \
    {                                                                                              \
        const blk d = SB ? NAME##_decs(W, n, b, sw, mw) : DEC(W, n, b);                            \
        return I8_UNS(OFF) ? (pblk){ I8_U(d.w, OFF), d.w, d.sw, d.mw }                             \
                           : (pblk){ d.w, prep(d.w), d.sw, d.mw };                                 \
    }                                                                                              \
    static inline __attribute__((always_inline, unused)) void NAME##_tile(                        \
        float *out, int ldo, const dol_i8_act *a, const dol_i8_weight *W, int n, int t,            \
        const int R, const int C)                                                                  \
    {                                                                                              \
        const int nb = a->nb;                                                                      \
        /* the next tile's rows, prefetched a share per block (short rows of                       \
         * several streams are too short for the hardware prefetcher to train) */                  \
        size_t len;                                                                                \
        const uint8_t *pf = n + 2 * R <= W->N ? ROWP(W, n + R, &len) : NULL;                       \
        const size_t pf_len = pf ? (size_t)R * len : 0, pf_step = pf_len / (size_t)nb;             \
        size_t pf_o = 0, pf_e = 0;                                                                 \
        float sbw[SB ? I8_ROWS : 1][16], sbm[SB ? I8_ROWS : 1][8];                                 \
        I8_ZERO();                                                                                 \
        for (int b = 0; b < nb; b++) {                                                             \
            pf_e = b + 1 < nb ? pf_e + pf_step : pf_len;                                           \
            for (; pf_o < pf_e; pf_o += 64) _mm_prefetch((const char *)pf + pf_o, _MM_HINT_T0);    \
            if (SB && (b & 7) == 0)                                                                \
                for (int r = 0; r < R; r++) NAME##_sb8(W, n + r, b >> 3, sbw[SB ? r : 0], sbm[SB ? r : 0]); \
            if (b & 1) I8_STEP(MIN, 1, OFF, NAME##_kdec(W, n + r, b, sbw[SB ? r : 0], sbm[SB ? r : 0])); \
            else I8_STEP(MIN, 0, OFF, NAME##_kdec(W, n + r, b, sbw[SB ? r : 0], sbm[SB ? r : 0]));  \
        }                                                                                          \
        I8_STORE();                                                                                \
    }                                                                                              \
    static inline __attribute__((always_inline, unused)) void NAME##_ptile(                       \
        float *out, int ldo, const dol_i8_act *a, const ppair *pan, int n, int t, const int R,     \
        const int C)                                                                               \
    {                                                                                              \
        const int nb = a->nb, np = (nb + 1) / 2;                                                   \
        I8_ZERO();                                                                                 \
        for (int b = 0; b < nb; b++) {                                                             \
            if (b & 1) I8_STEP(MIN, 1, OFF, I8_KPAN(r));                                           \
            else I8_STEP(MIN, 0, OFF, I8_KPAN(r));                                                 \
        }                                                                                          \
        I8_STORE();                                                                                \
    }                                                                                              \
    I8_ZPTILE(NAME, MIN)                                                                           \
    I8_ZTILE(NAME, DEC, MIN, ROWP, OFF, L2)                                                        \
    static void NAME##_rows(float *out, int ldo, const dol_i8_act *a, const dol_i8_weight *W,      \
                            int n0, int n1, void *scratch)                                         \
    {                                                                                              \
        const int T = a->T, nb = a->nb, np = (nb + 1) / 2;                                         \
        ppair *pan = scratch;                                                                      \
        for (int n = n0; n < n1;) {                                                                \
            const int R = n1 - n >= I8_ROWS ? I8_ROWS : 1;                                         \
            if (T >= I8_PANEL_MIN_T && pan) {                                                      \
                for (int r = 0; r < R; r++) {                                                      \
                    ppair *row = pan + (size_t)r * (size_t)np;                                     \
                    for (int b = 0; b < nb; b++) {                                                 \
                        const blk d = DEC(W, n + r, b);                                            \
                        ppair *e = row + (b >> 1);                                                 \
                        const int h = b & 1;                                                       \
                        e->w[h] = I8_UNS(OFF) ? I8_U(d.w, OFF) : d.w;                              \
                        e->aux[h] = I8_UNS(OFF) ? d.w : prep(d.w), e->sw[h] = d.sw, e->mw[h] = d.mw; \
                    }                                                                              \
                    if (nb & 1) {                                                                  \
                        ppair *e = row + np - 1;                                                   \
                        e->w[1] = e->aux[1] = _mm256_setzero_si256();                              \
                        e->sw[1] = e->mw[1] = _mm256_setzero_ps();                                 \
                    }                                                                              \
                }                                                                                  \
                I8_PANEL_RUN(NAME);                                                                \
            } else {                                                                               \
                I8_TILE_RUN(NAME);                                                                 \
            }                                                                                      \
            n += R;                                                                                \
        }                                                                                          \
    }

/* OFF: the 512-bit in-register tiles take the format's pairs as w + 2^OFF;
 * L2: their decode prefetches into L2 (I8_ZTILE); SB: the 256-bit tiles
 * decode the scales of a super-block at once (NAME_sb8, NAME_decs). */
I8_PRODUCT(q8_0, dec_q8_0, 0, row_gguf, 7, 1, 0)
I8_PRODUCT(q4_0, dec_q4_0, 0, row_gguf, 3, 0, 0)
I8_PRODUCT(q4_1, dec_q4_1, 1, row_gguf, 0, 0, 0)
I8_PRODUCT(q5_0, dec_q5_0, 0, row_gguf, 4, 0, 0)
I8_PRODUCT(q5_1, dec_q5_1, 1, row_gguf, 0, 0, 0)
I8_PRODUCT(q2_k, dec_q2_k, 1, row_gguf, 0, 0, 0)
I8_PRODUCT(q3_k, dec_q3_k, 0, row_gguf, 2, 0, 0)
I8_PRODUCT(q4_k, dec_q4_k, 1, row_gguf, 0, 0, 1)
I8_PRODUCT(q5_k, dec_q5_k, 1, row_gguf, 0, 0, 1)
I8_PRODUCT(q6_k, dec_q6_k, 0, row_gguf, 5, 0, 1)
I8_PRODUCT(nf4, dec_nf4, 0, row_nf4, 7, 0, 0)
I8_PRODUCT(q8, dec_q8, 0, row_q8, 7, 1, 0)

static void i8_rows(float *out, int ldo, const dol_i8_act *a, const dol_i8_weight *W, int n0, int n1,
                    void *scratch)
{
    switch ((int)W->t) {
#define I8_CASE(T, NAME) case T: NAME##_rows(out, ldo, a, W, n0, n1, scratch); break;
        I8_CASE(DOL_DTYPE_Q8_0, q8_0)
        I8_CASE(DOL_DTYPE_Q4_0, q4_0)
        I8_CASE(DOL_DTYPE_Q4_1, q4_1)
        I8_CASE(DOL_DTYPE_Q5_0, q5_0)
        I8_CASE(DOL_DTYPE_Q5_1, q5_1)
        I8_CASE(DOL_DTYPE_Q2_K, q2_k)
        I8_CASE(DOL_DTYPE_Q3_K, q3_k)
        I8_CASE(DOL_DTYPE_Q4_K, q4_k)
        I8_CASE(DOL_DTYPE_Q5_K, q5_k)
        I8_CASE(DOL_DTYPE_Q6_K, q6_k)
        I8_CASE((int)DOL_I8_NF4, nf4)
        I8_CASE((int)DOL_I8_Q8, q8)
#undef I8_CASE
    default: break;
    }
}

/* ---- the activations --------------------------------------------------------- */

static void i8_quantize(dol_i8_act *a, const float *x, int t0, int t1)
{
    const int nb = a->nb, K = a->K;
    const bool uv = I8_ID == 3 && a->T < I8_PANEL_MIN_T;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int t = t0; t < t1; t++)
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)t * (size_t)K + (size_t)b * 32;
            const size_t o = (size_t)t * (size_t)nb + (size_t)b;
            __m256 v[4], m = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(xb + 8 * i);
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
            }
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
            const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
            a->d[o] = amax / 127.0f;
            const __m256 vid = _mm256_set1_ps(id);
            __m256i qi[4];
            for (int i = 0; i < 4; i++) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));
            /* int32 -> int8 in order: packs work within 128-bit lanes, the
             * permute puts the four quarters back in place */
            const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
            const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
            const __m256i q = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(a->q + o * 32), q);
            if (uv) _mm256_storeu_ps(a->dv + o * 8, _mm256_set1_ps(a->d[o])); /* for the 512-bit in-register tiles */
            float *s = a->s + o * 8;
            const int8_t *qb = a->q + o * 32;
            int half[2] = { 0, 0 };
            for (int j = 0; j < 8; j++) {
                const int sum = qb[4 * j] + qb[4 * j + 1] + qb[4 * j + 2] + qb[4 * j + 3];
                s[j] = (float)sum * a->d[o];
                if (uv) a->ns[o * 8 + (size_t)j] = -sum;
                half[j / 4] += sum;
            }
            a->sq[2 * o] = half[0], a->sq[2 * o + 1] = half[1]; /* for the interleaved layout (cpu_r16.h) */
            a->sd[o] = (float)(half[0] + half[1]) * a->d[o];
        }
}

/* ---- rows decoded for the AMX-INT8 product (cpu_amx.h) ----------------------- */

#define I8_DECODE16(DEC, FLAGS)                                                                   \
    do {                                                                                          \
        for (int b = 0; b < nb; b++)                                                              \
            for (int r = 0; r < 16; r++) {                                                        \
                float s[8], mn[8];                                                                \
                if (r < m) {                                                                      \
                    const blk d = DEC(W, n + r, b);                                               \
                    _mm256_storeu_si256((__m256i *)(wq + (size_t)b * 512 + (size_t)r * 32), d.w); \
                    _mm256_storeu_ps(s, d.sw);                                                    \
                    _mm256_storeu_ps(mn, d.mw);                                                   \
                } else {                                                                          \
                    _mm256_storeu_si256((__m256i *)(wq + (size_t)b * 512 + (size_t)r * 32),       \
                                        _mm256_setzero_si256());                                  \
                    _mm256_storeu_ps(s, _mm256_setzero_ps());                                     \
                    _mm256_storeu_ps(mn, _mm256_setzero_ps());                                    \
                }                                                                                 \
                sw[(size_t)(2 * b) * 16 + r] = s[0], sw[(size_t)(2 * b + 1) * 16 + r] = s[4];     \
                mw[(size_t)(2 * b) * 16 + r] = mn[0], mw[(size_t)(2 * b + 1) * 16 + r] = mn[4];   \
            }                                                                                     \
        return FLAGS;                                                                             \
    } while (0)

static int i8_decode16(const dol_i8_weight *W, int n, int m, int8_t *wq, float *sw, float *mw)
{
    const int nb = W->K / 32;
    switch ((int)W->t) {
    case DOL_DTYPE_Q8_0: I8_DECODE16(dec_q8_0, 0);
    case DOL_DTYPE_Q4_0: I8_DECODE16(dec_q4_0, 0);
    case DOL_DTYPE_Q4_1: I8_DECODE16(dec_q4_1, DOL_I8_MIN);
    case DOL_DTYPE_Q5_0: I8_DECODE16(dec_q5_0, 0);
    case DOL_DTYPE_Q5_1: I8_DECODE16(dec_q5_1, DOL_I8_MIN);
    case DOL_DTYPE_Q2_K: I8_DECODE16(dec_q2_k, DOL_I8_HALVES | DOL_I8_MIN);
    case DOL_DTYPE_Q3_K: I8_DECODE16(dec_q3_k, DOL_I8_HALVES);
    case DOL_DTYPE_Q4_K: I8_DECODE16(dec_q4_k, DOL_I8_MIN);
    case DOL_DTYPE_Q5_K: I8_DECODE16(dec_q5_k, DOL_I8_MIN);
    case DOL_DTYPE_Q6_K: I8_DECODE16(dec_q6_k, DOL_I8_HALVES);
    case (int)DOL_I8_NF4: I8_DECODE16(dec_nf4, 0);
    case (int)DOL_I8_Q8: I8_DECODE16(dec_q8, 0);
    default: return -1;
    }
}

static size_t i8_scratch_bytes(int K) { return sizeof(ppair) * I8_ROWS * (size_t)((K / 32 + 1) / 2); }

const dol_cpu_i8 I8_CAT(dol_cpu_i8_, DOL_I8_VARIANT) = {
    .name = I8_STR(DOL_I8_VARIANT),
    .quantize = i8_quantize,
    .rows = i8_rows,
    .scratch_bytes = i8_scratch_bytes,
    .decode16 = i8_decode16,
};
