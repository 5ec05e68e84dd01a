/* src/engine/cpu_k_exp.h — the kernels' own exp, shared by the softmax of
 * attention (cpu_k_attn.c) and the SiLU of the element-wise kernels
 * (cpu_k_elementwise.c): a scalar and a vector form performing the same
 * operations, static inline in both. Internal to the CPU kernels. */
#ifndef DOLPHIN_ENGINE_CPU_K_EXP_H
#define DOLPHIN_ENGINE_CPU_K_EXP_H

#include "engine/cpu_simd.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

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

#endif
