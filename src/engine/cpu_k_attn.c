/* src/engine/cpu_k_attn.c — the CPU kernels' causal attention of one
 * query head over the paged KV cache, F32 (attn_head) or F16 (attn_head_h)
 * elements: scores, softmax with the kernels' own exp (cpu_k_exp.h),
 * weighted sum of the values, the same operations in the same order in
 * every variant (cpu_kernels.h). Compiled once per variant (cpu_k.h);
 * exports DOL_K(attn_head) and DOL_K(attn_head_h). */
#include "engine/cpu_k.h"
#include "engine/cpu_k_exp.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- attention over the paged KV cache --------------------------------- */

/* The KV cache holds F32 or F16 (dtype t, a compile-time constant in each
 * caller below, so the loads fold to one instruction): element off of a
 * run at base, and its value as f32 (F16 -> F32 is exact, so both paths
 * compute the same operations on the same values). */
static inline const void *kv_at(const void *base, dol_dtype t, size_t off)
{
    return (const char *)base + off * w_size(t);
}

/* Scores of the positions of one block: s[r] = sum_i q[i] * kt[i*bs + r] for
 * r < bs, one fused multiply-add per i in ascending i (one chain per
 * position, so every variant produces the same bits). */
static inline __attribute__((always_inline)) void
attn_block_scores(const float *q, int hd, const void *kt, dol_dtype t, int bs, float *s)
{
    int r = 0;
#ifdef DOL_SIMD
    for (; r + DOL_SIMD <= bs; r += DOL_SIMD) {
        vecf acc = v_zero();
        for (int i = 0; i < hd; i++)
            acc = v_fma(v_set1(q[i]), v_load_w(kt, t, (size_t)i * bs + r), acc);
        v_store(s + r, acc);
    }
#endif
    for (; r < bs; r++) {
        float acc = 0.0f;
        for (int i = 0; i < hd; i++) acc = fmaf(q[i], load_w1(kv_at(kt, t, (size_t)i * bs + r), t, 0), acc);
        s[r] = acc;
    }
}

#ifdef DOL_SIMD
/* M (2..4) blocks at once: M independent chains per vector of positions,
 * each with exactly attn_block_scores' order (one chain alone waits out the
 * FMA latency at every i). */
static inline __attribute__((always_inline)) void
attn_block_scores_m(const float *q, int hd, const void *const kt[4], dol_dtype t, int m, int bs,
                    float *s)
{
    for (int r = 0; r + DOL_SIMD <= bs; r += DOL_SIMD) {
        vecf a[4] = { v_zero(), v_zero(), v_zero(), v_zero() };
        for (int i = 0; i < hd; i++) {
            vecf qi = v_set1(q[i]);
            size_t o = (size_t)i * bs + r;
            for (int j = 0; j < m; j++) a[j] = v_fma(qi, v_load_w(kt[j], t, o), a[j]);
        }
        for (int j = 0; j < m; j++) v_store(s + (size_t)j * bs + r, a[j]);
    }
}
#endif

static inline __attribute__((always_inline)) void
attn_head_t(const float *q, int hd, int n, const void *k_base, const void *v_base, dol_dtype t,
            const int32_t *table, int bs, size_t block_floats, int v_stride, float scale,
            float *sc, float *out)
{
    const int nb = (n + bs - 1) / bs;
    int b = 0;
#ifdef DOL_SIMD
    if (bs % DOL_SIMD == 0)
        while (nb - b >= 2) {
            const int m = nb - b >= 4 ? 4 : nb - b;
            const void *kt[4];
            for (int j = 0; j < m; j++) kt[j] = kv_at(k_base, t, (size_t)table[b + j] * block_floats);
            if (m == 4) attn_block_scores_m(q, hd, kt, t, 4, bs, sc + (size_t)b * bs);
            else if (m == 3) attn_block_scores_m(q, hd, kt, t, 3, bs, sc + (size_t)b * bs);
            else attn_block_scores_m(q, hd, kt, t, 2, bs, sc + (size_t)b * bs);
            b += m;
        }
#endif
    for (; b < nb; b++)
        attn_block_scores(q, hd, kv_at(k_base, t, (size_t)table[b] * block_floats), t, bs,
                          sc + (size_t)b * bs);

    /* softmax: scale, max, exp (exp_s / exp_v: the same bits), then the
     * sum in ascending p */
    float maxv = -INFINITY;
    for (int p = 0; p < n; p++) {
        sc[p] *= scale;
        if (sc[p] > maxv) maxv = sc[p];
    }
    int p = 0;
#ifdef DOL_SIMD
    for (; p + DOL_SIMD <= n; p += DOL_SIMD) v_store(sc + p, exp_v(v_sub(v_load(sc + p), v_set1(maxv))));
#endif
    for (; p < n; p++) sc[p] = exp_s(sc[p] - maxv);
    float sum = 0.0f;
    for (p = 0; p < n; p++) sum += sc[p];
    const float inv = 1.0f / sum;

    /* out = sum_p e_p v_p / sum: one fused multiply-add per position in
     * ascending p for every dimension, then the scaling */
    int i = 0;
#ifdef DOL_SIMD
    while (i + DOL_SIMD <= hd) {
        const int nv = (hd - i) / DOL_SIMD < 4 ? (hd - i) / DOL_SIMD : 4;
        vecf o[4] = { v_zero(), v_zero(), v_zero(), v_zero() };
        /* positions in ascending order, block by block (no division per
         * position) */
        for (int b0 = 0, p = 0; p < n; b0++) {
            const void *vb = kv_at(v_base, t, (size_t)table[b0] * block_floats + i);
            const int r1 = n - p < bs ? n - p : bs;
            for (int r = 0; r < r1; r++, p++) {
                const size_t vp = (size_t)r * v_stride;
                vecf e = v_set1(sc[p]);
                for (int j = 0; j < nv; j++) o[j] = v_fma(e, v_load_w(vb, t, vp + (size_t)j * DOL_SIMD), o[j]);
            }
        }
        for (int j = 0; j < nv; j++) v_store(out + i + j * DOL_SIMD, v_mul(o[j], v_set1(inv)));
        i += nv * DOL_SIMD;
    }
#endif
    for (; i < hd; i++) {
        float o = 0.0f;
        for (int p = 0; p < n; p++)
            o = fmaf(sc[p],
                     load_w1(kv_at(v_base, t, (size_t)table[p / bs] * block_floats +
                                                  (size_t)(p % bs) * v_stride + i), t, 0),
                     o);
        out[i] = o * inv;
    }
}

void DOL_K(attn_head)(const float *q, int hd, int n, const float *k_base, const float *v_base,
                      const int32_t *table, int bs, size_t block_floats, int v_stride, float scale,
                      float *sc, float *out)
{
    attn_head_t(q, hd, n, k_base, v_base, DOL_DTYPE_F32, table, bs, block_floats, v_stride, scale,
                sc, out);
}

void DOL_K(attn_head_h)(const float *q, int hd, int n, const uint16_t *k_base,
                        const uint16_t *v_base, const int32_t *table, int bs, size_t block_floats,
                        int v_stride, float scale, float *sc, float *out)
{
    attn_head_t(q, hd, n, k_base, v_base, DOL_DTYPE_F16, table, bs, block_floats, v_stride, scale,
                sc, out);
}
