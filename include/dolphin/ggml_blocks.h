/* include/dolphin/ggml_blocks.h — the block-quantized weight types of GGUF
 * files (llama.cpp's ggml types Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K) and their exact dequantization, shared by the CPU
 * backend (host C) and the CUDA kernels (device code: every function here is
 * DOL_HD, __host__ __device__ under nvcc and the emulation).
 *
 * A row of K weights is K / B consecutive blocks of B weights (B = 32 for
 * the first five, 256 for the K-quants), each a fixed number of bytes
 * (dol_dtype_block_bytes); blocks never cross rows, so whole rows can be
 * moved without touching a block. Byte layouts, as ggml writes them
 * (little-endian F16 scales, which may sit at odd addresses: read byte by
 * byte):
 *
 *   Q8_0  34 B: d f16 @0, q int8[32] @2.                 w = q * d
 *   Q4_0  18 B: d @0, qs[16] @2; weight j < 16 is the low nibble of qs[j],
 *               weight j + 16 the high one.               w = (q - 8) * d
 *   Q4_1  20 B: d @0, m @2, qs[16] @4 (as Q4_0).         w = q * d + m
 *   Q5_0  22 B: d @0, qh u32 @2, qs[16] @6; the 5th bit of weight j is bit j
 *               of qh.                                    w = (q - 16) * d
 *   Q5_1  24 B: d @0, m @2, qh @4, qs[16] @8.            w = q * d + m
 *   Q2_K  84 B: scales[16] @0 (low nibble scale, high nibble min, per 16
 *               weights), qs[64] @16 (2 bits), d @80, dmin @82.
 *               w = (d * sc) * q - (dmin * mn)
 *   Q3_K 110 B: hmask[32] @0, qs[64] @32 (2 low bits), scales[12] @96 (16
 *               signed 6-bit scales, biased by 32), d @108.
 *               w = (d * (sc - 32)) * (q - (high bit set ? 0 : 4))
 *   Q4_K 144 B: d @0, dmin @2, scales[12] @4 (8 pairs of 6-bit scale / min,
 *               per 32 weights), qs[128] @16.   w = (d * sc) * q - (dmin * mn)
 *   Q5_K 176 B: d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48.
 *               as Q4_K with a 5th bit from qh
 *   Q6_K 210 B: ql[128] @0, qh[64] @128, scales int8[16] @192 (per 16
 *               weights), d @208.                  w = (d * sc) * (q - 32)
 *
 * Which bits of which byte make weight j is spelled out per type in
 * dol_blk_weight below (the one definition; the block decoders are the
 * same expressions unrolled). Every value is computed in float32 with the
 * operations in the order shown (no fused multiply-add: the callers are
 * built with -ffp-contract=off), which is the order of ggml's reference
 * dequantization (ggml-quants.c, dequantize_row_*) and of gguf-py's
 * (gguf/quants.py): the weights are those numbers exactly.
 * Source of the layouts: ggml's ggml-common.h block definitions. */
#ifndef DOLPHIN_GGML_BLOCKS_H
#define DOLPHIN_GGML_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "dolphin/model.h"

#if defined(__CUDACC__)
#define DOL_HD __host__ __device__ __forceinline__
#elif defined(DOL_CUDA_EMU) /* the kernels as host C++ (emu/cuda_emu.h) */
#define DOL_HD __device__ __forceinline__
#else
#define DOL_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The F16 at p (two bytes, little-endian, any alignment) as f32, exactly
 * (subnormals included; the scales of these files are finite). */
DOL_HD float dol_blk_f16(const uint8_t *p)
{
    const uint32_t h = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31) bits = sign | 0x7f800000u | (mant << 13);
    else bits = sign | ((exp + 112u) << 23) | (mant << 13);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Scale and min of sub-block j (0..7) of a Q4_K / Q5_K block from its 12
 * scale bytes s: j < 4: the low 6 bits of s[j] and s[j + 4]; j >= 4: the
 * nibbles of s[j + 4] with the top two bits of s[j - 4] / s[j] above them. */
DOL_HD void dol_blk_k4_scale_min(int j, const uint8_t *s, int *sc, int *mn)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Scale i (0..15) of a Q3_K block from its 12 scale bytes s, unbiased
 * (-32..31): the low nibble from s[i] (i < 8) or the high nibble of
 * s[i - 8], the two high bits from s[8 + i % 4] at bit 2 * (i / 4). */
DOL_HD int dol_blk_q3k_scale(int i, const uint8_t *s)
{
    const int lo = i < 8 ? (s[i] & 0xF) : (s[i - 8] >> 4);
    const int hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* Weight j (0 <= j < the type's block) of the block at b, of block type t
 * (one of the ten above; any other gives 0). The one element-wise definition:
 * the CUDA decode kernels use it as it is, the CPU block decoders
 * (dol_blk_dequantize) unroll the same expressions. */
DOL_HD float dol_blk_weight(dol_dtype t, const uint8_t *b, int j)
{
    switch (t) {
    case DOL_DTYPE_Q8_0:
        return (float)(int8_t)b[2 + j] * dol_blk_f16(b);
    case DOL_DTYPE_Q4_0: {
        const int q = j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4);
        return (float)(q - 8) * dol_blk_f16(b);
    }
    case DOL_DTYPE_Q4_1: {
        const int q = j < 16 ? (b[4 + j] & 0xF) : (b[4 + j - 16] >> 4);
        return (float)q * dol_blk_f16(b) + dol_blk_f16(b + 2);
    }
    case DOL_DTYPE_Q5_0: {
        const uint32_t qh = (uint32_t)b[2] | ((uint32_t)b[3] << 8) | ((uint32_t)b[4] << 16) |
                            ((uint32_t)b[5] << 24);
        const int lo = j < 16 ? (b[6 + j] & 0xF) : (b[6 + j - 16] >> 4);
        const int q = lo | (int)(((qh >> j) & 1u) << 4);
        return (float)(q - 16) * dol_blk_f16(b);
    }
    case DOL_DTYPE_Q5_1: {
        const uint32_t qh = (uint32_t)b[4] | ((uint32_t)b[5] << 8) | ((uint32_t)b[6] << 16) |
                            ((uint32_t)b[7] << 24);
        const int lo = j < 16 ? (b[8 + j] & 0xF) : (b[8 + j - 16] >> 4);
        const int q = lo | (int)(((qh >> j) & 1u) << 4);
        return (float)q * dol_blk_f16(b) + dol_blk_f16(b + 2);
    }
    case DOL_DTYPE_Q2_K: {
        /* halves of 128; in each, 4 shifts of 2 bits over 32 bytes, each
         * shift two runs of 16 weights with their own scale byte */
        const int n = j >> 7, r = j & 127, g = r >> 5, s16 = (r >> 4) & 1, l = r & 15;
        const uint8_t sc = b[n * 8 + g * 2 + s16];
        const int q = (b[16 + 32 * n + 16 * s16 + l] >> (2 * g)) & 3;
        const float dl = dol_blk_f16(b + 80) * (float)(sc & 0xF);
        const float ml = dol_blk_f16(b + 82) * (float)(sc >> 4);
        return dl * (float)q - ml;
    }
    case DOL_DTYPE_Q3_K: {
        const int n = j >> 7, r = j & 127, g = r >> 5, s16 = (r >> 4) & 1, l = r & 15;
        const int q2 = (b[32 + 32 * n + 16 * s16 + l] >> (2 * g)) & 3;
        const int hbit = (b[16 * s16 + l] >> (4 * n + g)) & 1;
        const float dl = dol_blk_f16(b + 108) * (float)dol_blk_q3k_scale(n * 8 + g * 2 + s16, b + 96);
        return dl * (float)(q2 - (hbit ? 0 : 4));
    }
    case DOL_DTYPE_Q4_K:
    case DOL_DTYPE_Q5_K: {
        /* 4 chunks of 64: the low nibbles of 32 bytes, then their high ones */
        const int c = j >> 6, hi = (j >> 5) & 1, l = j & 31;
        int sc, mn;
        dol_blk_k4_scale_min(2 * c + hi, b + 4, &sc, &mn);
        int q;
        if (t == DOL_DTYPE_Q4_K) {
            const uint8_t v = b[16 + 32 * c + l];
            q = hi ? v >> 4 : v & 0xF;
        } else {
            const uint8_t v = b[48 + 32 * c + l];
            q = (hi ? v >> 4 : v & 0xF) + (((b[16 + l] >> (2 * c + hi)) & 1) ? 16 : 0);
        }
        const float d1 = dol_blk_f16(b) * (float)sc, m1 = dol_blk_f16(b + 2) * (float)mn;
        return d1 * (float)q - m1;
    }
    case DOL_DTYPE_Q6_K: {
        /* halves of 128: 4 quarters of 32 from 64 ql bytes (low nibbles of
         * the first and second 32, then high nibbles) and 32 qh bytes */
        const int n = j >> 7, r = j & 127, qd = r >> 5, l = r & 31;
        const uint8_t lb = b[64 * n + l + ((qd & 1) ? 32 : 0)];
        const int lo = (qd & 2) ? lb >> 4 : lb & 0xF;
        const int hi = (b[128 + 32 * n + l] >> (2 * qd)) & 3;
        const int q = (lo | (hi << 4)) - 32;
        const float d = dol_blk_f16(b + 208) * (float)(int8_t)b[192 + 8 * n + l / 16 + 2 * qd];
        return d * (float)q;
    }
    default:
        return 0.0f;
    }
}

#ifdef __cplusplus
}
#endif

#endif
