/* include/dolphin/kv_q8.h — the 8-bit KV cache format (kv_cache_dtype q8_0,
 * docs/configuration.md "The KV pool"): one definition of how a K or V row
 * of one KV head is quantized, shared by the CPU backend (host C) and the
 * CUDA kernels (device code: every function here is DOL_KVQ_HD,
 * __host__ __device__ under nvcc and the emulation).
 *
 * A head's row of head_dim values is cut into blocks of
 * B = dol_kv_q8_block(head_dim) values: 32, or the whole head when it has
 * fewer than 32 (head_dim must then be below 32 or a multiple of 32). Per
 * block of values x[0..B):
 *
 *   amax = max |x[i]|                      (float; NaN values are skipped)
 *   d    = fp16(amax / 127)                (round to nearest even; stored)
 *   q[i] = d == 0 ? 0 : clamp(round(x[i] / d), -127, 127)
 *                                          (IEEE float division, rounding
 *                                          half away from zero; NaN -> 0)
 *   x^[i] = q[i] * d                       (what attention reads)
 *
 * the layout of llama.cpp's q8_0 (ggml-common.h block_q8_0: absmax / 127,
 * F16 scale), with q computed from the stored (rounded) scale, so the
 * error of each value is at most d / 2 (d / 2 + a clamp of under 0.05 d
 * where fp16 rounded the scale down). Every function below is the same
 * expression on the host and on the device, so the two backends store the
 * same bytes for the same rows. */
#ifndef DOLPHIN_KV_Q8_H
#define DOLPHIN_KV_Q8_H

#include <stdint.h>

#include "dolphin/f16.h"

#if defined(__CUDACC__)
#define DOL_KVQ_HD __host__ __device__ __forceinline__
#elif defined(DOL_CUDA_EMU) /* the kernels as host C++ (emu/cuda_emu.h) */
#define DOL_KVQ_HD __device__ __forceinline__
#else
#define DOL_KVQ_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Values per quantization block for a head of head_dim values. */
#define DOL_KV_Q8_BLOCK 32
DOL_KVQ_HD int dol_kv_q8_block(int head_dim)
{
    return head_dim < DOL_KV_Q8_BLOCK ? head_dim : DOL_KV_Q8_BLOCK;
}

/* True when a head of head_dim values can be held as Q8_0. */
DOL_KVQ_HD int dol_kv_q8_head_ok(int head_dim)
{
    return head_dim >= 1 && (head_dim < DOL_KV_Q8_BLOCK || head_dim % DOL_KV_Q8_BLOCK == 0);
}

/* Quantize one block of n values x[0], x[xs], ..., x[(n-1)*xs] (n <= 32)
 * into q[0], q[qs], ...: returns the F16 bits of its scale. The
 * definition at the top of this file. */
DOL_KVQ_HD uint16_t dol_kv_q8_quantize(const float *x, int xs, int n, int8_t *q, int qs)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        const float a = x[i * xs] < 0.0f ? -x[i * xs] : x[i * xs];
        if (a > amax) amax = a;
    }
    const uint16_t dh = dol_f16_bits(amax / 127.0f);
    const float d = dol_f16_value(dh);
    for (int i = 0; i < n; i++) {
        float r = 0.0f;
        if (d > 0.0f) {
            const float y = x[i * xs] / d;
            /* round half away from zero, without the libm call (the same
             * bits as roundf for every float) */
            const float t = y < 0.0f ? -y : y;
            float f = t < 8388608.0f ? (float)(int32_t)t : t;   /* trunc; 2^23 */
            if (t - f >= 0.5f) f += 1.0f;
            r = y < 0.0f ? -f : f;
        }
        q[i * qs] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : r == r ? (int)r : 0);
    }
    return dh;
}

#ifdef __cplusplus
}
#endif

#endif
