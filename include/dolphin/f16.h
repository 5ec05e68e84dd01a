/* include/dolphin/f16.h — IEEE half precision <-> float32, the one
 * definition shared by the host (dol_f32_to_f16 / dol_f16_to_f32,
 * src/model/dtype.c) and device code (the Q8_0 KV format's scales,
 * include/dolphin/kv_q8.h): every function here is DOL_F16_HD, __host__
 * __device__ under nvcc and __device__ under the CUDA emulation. */
#ifndef DOLPHIN_F16_H
#define DOLPHIN_F16_H

#include <stdint.h>

#if defined(__CUDACC__)
#define DOL_F16_HD __host__ __device__ __forceinline__
#elif defined(DOL_CUDA_EMU) /* the kernels as host C++ (emu/cuda_emu.h) */
#define DOL_F16_HD __device__ __forceinline__
#else
#define DOL_F16_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The F16 bits of f, rounded to nearest even: subnormals kept, overflow to
 * infinity, NaN kept quiet with its payload's top bits. */
DOL_F16_HD uint16_t dol_f16_bits(float f)
{
    union { float f; uint32_t u; } v;
    v.f = f;
    const uint16_t sign = (uint16_t)((v.u >> 16) & 0x8000);
    const uint32_t ax = v.u & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u) return sign | 0x7c00;           /* inf */
        return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff); /* quiet nan */
    }
    if (ax >= 0x477ff000u) return sign | 0x7c00; /* >= 65520: rounds to inf */
    if (ax < 0x38800000u) {
        /* below the smallest normal F16 (2^-14): subnormal or 0; value =
         * m * 2^(e-150), in units of 2^-24 that is m >> (126 - e) */
        const uint32_t e = ax >> 23;
        if (e < 102) return sign; /* < 2^-25: rounds to zero */
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e; /* 14 .. 24 */
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return sign | (uint16_t)r; /* may carry into the smallest normal */
    }
    /* normal: rebias the exponent, round the mantissa to 10 bits */
    const uint32_t r = ax - 0x38000000u;
    uint32_t h = r >> 13;
    const uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return sign | (uint16_t)h;
}

/* The float value of F16 bits h (exact; NaN payload kept). */
DOL_F16_HD float dol_f16_value(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    union { float f; uint32_t u; } v;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in F32 */
        v.f = (float)m * (1.0f / 16777216.0f);
        return sign ? -v.f : v.f;
    }
    v.u = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112) << 23) | (m << 13));
    return v.f;
}

#ifdef __cplusplus
}
#endif

#endif
