/* src/engine/cpu_simd.h — the SIMD shim of the CPU kernels, shared by
 * cpu_kernels.c and the cpu_k_*.c files (internal to them): the variant
 * checks of DOL_CPU_VARIANT, DOL_CAT / DOL_STR, DOL_VARIANT_ID, the
 * accumulator width DOL_SIMD, the vector type vecf with its v_* helpers
 * (one set per variant; none in portable), and the loads of one weight or
 * of DOL_SIMD weights of dtype F32 / F16 / BF16. Every helper is static
 * inline, so each kernel file compiles it with its own variant's flags, as
 * inlined as when all kernels were one file. */
#ifndef DOLPHIN_ENGINE_CPU_SIMD_H
#define DOLPHIN_ENGINE_CPU_SIMD_H

#include "engine/cpu_kernels.h"

#include <stddef.h>
#include <stdint.h>

#ifndef DOL_CPU_VARIANT
#error "compile the CPU kernels (cpu_kernels.c, cpu_k_*.c) with -DDOL_CPU_VARIANT=portable|avx2|avx512 (see CMakeLists.txt)"
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
/* 16 int8 values widened to f32 (exact) */
static inline vecf v_load_i8(const int8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }
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
static inline vecf v_load_i8(const int8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
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

/* One F16 value as f32 (exact): the F16C instruction where the variant
 * has it, else the portable conversion. */
static inline float h2f(uint16_t h)
{
#ifdef DOL_SIMD
    return _cvtsh_ss(h);
#else
    return dol_f16_to_f32(h);
#endif
}

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

#ifdef DOL_SIMD
/* Pin a vector to a register. Without it GCC folds the load of x into each
 * of the NC FMAs that use it, one load per FMA, and the tile becomes bound
 * by loads (several times slower at 8 rows of x). The empty asm changes no
 * value and no instruction order of the arithmetic. */
static inline vecf v_in_register(vecf v)
{
    __asm__("" : "+v"(v));
    return v;
}
#endif

#endif
