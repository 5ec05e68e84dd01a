/* src/engine/cpu_k_attn.c — the CPU kernels' causal attention of one
 * query head over the paged KV cache, each half (K, V) held as F32, F16 or
 * Q8_0 (include/dolphin/kv_q8.h): scores, softmax with the kernels' own exp
 * (cpu_k_exp.h), weighted sum of the values, the same operations in the
 * same order in every variant (cpu_kernels.h). Compiled once per variant
 * (cpu_k.h); exports DOL_K(attn_head). */
#include "engine/cpu_k.h"
#include "engine/cpu_k_exp.h"

#include "dolphin/kv_q8.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

/* The element dtype of an F32 / F16 half (kt / vt are compile-time
 * constants in every instantiation below, so the loads fold to one
 * instruction). F16 -> F32 is exact, so both compute the same operations
 * on the same values. */
AI dol_dtype el_of(dol_kv_dtype k) { return k == DOL_KV_F16 ? DOL_DTYPE_F16 : DOL_DTYPE_F32; }

/* Block b's run of this head's K or V (base + table[b] * block_bytes). */
AI const char *run_of(const void *base, size_t block_bytes, int32_t b)
{
    return (const char *)base + (size_t)b * block_bytes;
}

/* ---- scores -------------------------------------------------------------- */

/* Scores of the positions of one block: s[r] = sum_i q[i] * k[i*bs + r] for
 * r < bs, one fused multiply-add per i in ascending i (one chain per
 * position, so every variant produces the same bits). Q8_0: per block j of
 * B dims, a_j = the same chain over its dims on the int8 values, and
 * s[r] = fma(a_j, d_j[r], s[r]) over j ascending. */
AI void scores_1(const float *q, int hd, const char *kt, dol_kv_dtype kk, int bs, float *s)
{
    int r = 0;
    if (kk == DOL_KV_Q8_0) {
        const int B = dol_kv_q8_block(hd);
        const int8_t *k8 = (const int8_t *)kt;
        const uint16_t *kd = (const uint16_t *)(kt + (size_t)hd * bs);
#ifdef DOL_SIMD
        for (; r + DOL_SIMD <= bs; r += DOL_SIMD) {
            vecf acc = v_zero();
            for (int j0 = 0; j0 < hd; j0 += B) {
                vecf a = v_zero();
                for (int i = j0; i < j0 + B; i++)
                    a = v_fma(v_set1(q[i]), v_load_i8(k8 + (size_t)i * bs + r), a);
                acc = v_fma(a, v_load_h(kd + (size_t)(j0 / B) * bs + r), acc);
            }
            v_store(s + r, acc);
        }
#endif
        for (; r < bs; r++) {
            float acc = 0.0f;
            for (int j0 = 0; j0 < hd; j0 += B) {
                float a = 0.0f;
                for (int i = j0; i < j0 + B; i++) a = fmaf(q[i], (float)k8[(size_t)i * bs + r], a);
                acc = fmaf(a, h2f(kd[(size_t)(j0 / B) * bs + r]), acc);
            }
            s[r] = acc;
        }
        return;
    }
    const dol_dtype t = el_of(kk);
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
        for (int i = 0; i < hd; i++) acc = fmaf(q[i], load_w1(kt, t, (int)((size_t)i * bs + r)), acc);
        s[r] = acc;
    }
}

#ifdef DOL_SIMD
/* M (2..4) blocks at once: M independent chains per vector of positions,
 * each with exactly scores_1's order (one chain alone waits out the FMA
 * latency at every i). Needs bs % DOL_SIMD == 0. */
AI void scores_m(const float *q, int hd, const char *const kt[4], dol_kv_dtype kk, int m, int bs,
                 float *s)
{
    if (kk == DOL_KV_Q8_0) {
        const int B = dol_kv_q8_block(hd);
        for (int r = 0; r + DOL_SIMD <= bs; r += DOL_SIMD) {
            vecf acc[4] = { v_zero(), v_zero(), v_zero(), v_zero() };
            for (int j0 = 0; j0 < hd; j0 += B) {
                vecf a[4] = { v_zero(), v_zero(), v_zero(), v_zero() };
                for (int i = j0; i < j0 + B; i++) {
                    const vecf qi = v_set1(q[i]);
                    const size_t o = (size_t)i * bs + r;
                    for (int j = 0; j < m; j++) a[j] = v_fma(qi, v_load_i8((const int8_t *)kt[j] + o), a[j]);
                }
                const size_t od = (size_t)hd * bs * sizeof(int8_t);
                for (int j = 0; j < m; j++)
                    acc[j] = v_fma(a[j], v_load_h((const uint16_t *)(kt[j] + od) + (size_t)(j0 / B) * bs + r),
                                   acc[j]);
            }
            for (int j = 0; j < m; j++) v_store(s + (size_t)j * bs + r, acc[j]);
        }
        return;
    }
    const dol_dtype t = el_of(kk);
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

/* ---- values -------------------------------------------------------------- */

#ifdef DOL_SIMD
/* Dimensions i .. i + nv*DOL_SIMD of out (values below). */
AI void values_vecs(const float *sc, int n, int hd, int i, int nv, const void *v_base, dol_kv_dtype vk,
                    const int32_t *table, int bs, size_t block_bytes, float inv, float *out)
{
    const int B = dol_kv_q8_block(hd), nqb = hd / B;
    const size_t vd = (size_t)bs * hd; /* Q8_0: the scales follow the values */
    vecf o[4] = { v_zero(), v_zero(), v_zero(), v_zero() };
    /* Q8_0: the scale block of each vector, and whether it starts one (a
     * vector never straddles two) */
    int blk[4] = { 0, 0, 0, 0 };
    bool starts[4] = { true, false, false, false };
    for (int j = 0; j < nv; j++) {
        blk[j] = (i + j * DOL_SIMD) / B;
        starts[j] = j == 0 || (i + j * DOL_SIMD) % B == 0;
    }
    /* positions in ascending order, block by block (no division per
     * position) */
    for (int b0 = 0, p = 0; p < n; b0++) {
        const char *vb = run_of(v_base, block_bytes, table[b0]);
        const int r1 = n - p < bs ? n - p : bs;
        for (int r = 0; r < r1; r++, p++) {
            const size_t vp = (size_t)r * hd + (size_t)i;
            if (vk == DOL_KV_Q8_0) {
                /* w changes only where a vector starts a new block */
                const uint16_t *d = (const uint16_t *)(vb + vd) + (size_t)r * nqb;
                vecf w = v_zero();
                for (int j = 0; j < nv; j++) {
                    if (starts[j]) w = v_set1(sc[p] * h2f(d[blk[j]]));
                    o[j] = v_fma(w, v_load_i8((const int8_t *)vb + vp + (size_t)j * DOL_SIMD), o[j]);
                }
            } else {
                vecf e = v_set1(sc[p]);
                for (int j = 0; j < nv; j++)
                    o[j] = v_fma(e, v_load_w(vb, el_of(vk), vp + (size_t)j * DOL_SIMD), o[j]);
            }
        }
    }
    for (int j = 0; j < nv; j++) v_store(out + i + j * DOL_SIMD, v_mul(o[j], v_set1(inv)));
}
#endif

/* out[i0 .. i0 + nv*DOL_SIMD) (vectors) or out[i0] (scalar, nv = 0) = sum
 * over p ascending of w_p * v_p[i] (one fused multiply-add per p), where
 * w_p = e_p for F32 / F16 values and e_p * d_p (the scale of the block
 * holding i, a vector never straddling two) for Q8_0, times inv. */
AI void values(const float *sc, int n, int hd, const void *v_base, dol_kv_dtype vk, const int32_t *table,
               int bs, size_t block_bytes, float inv, float *out)
{
    int i = 0;
    const int B = dol_kv_q8_block(hd), nqb = hd / B;
    const size_t vd = (size_t)bs * hd; /* Q8_0: the scales follow the values */
#ifdef DOL_SIMD
    while (i + DOL_SIMD <= hd) {
        const int nv = (hd - i) / DOL_SIMD < 4 ? (hd - i) / DOL_SIMD : 4;
        /* four vectors, the common case, with nv a constant: unrolled */
        if (nv == 4) values_vecs(sc, n, hd, i, 4, v_base, vk, table, bs, block_bytes, inv, out);
        else values_vecs(sc, n, hd, i, nv, v_base, vk, table, bs, block_bytes, inv, out);
        i += nv * DOL_SIMD;
    }
#endif
    for (; i < hd; i++) {
        float o = 0.0f;
        for (int p = 0; p < n; p++) {
            const char *vb = run_of(v_base, block_bytes, table[p / bs]);
            const size_t vp = (size_t)(p % bs) * hd + (size_t)i;
            if (vk == DOL_KV_Q8_0) {
                const uint16_t *d = (const uint16_t *)(vb + vd) + (size_t)(p % bs) * nqb;
                o = fmaf(sc[p] * h2f(d[i / B]), (float)((const int8_t *)vb)[vp], o);
            } else {
                o = fmaf(sc[p], load_w1(vb, el_of(vk), (int)vp), o);
            }
        }
        out[i] = o * inv;
    }
}

AI void attn_head_t(const float *q, int hd, int n, const void *k_base, const void *v_base,
                    dol_kv_dtype kk, dol_kv_dtype vk, const int32_t *table, int bs,
                    size_t block_bytes, float scale, float *sc, float *out)
{
    const int nb = (n + bs - 1) / bs;
    int b = 0;
#ifdef DOL_SIMD
    if (bs % DOL_SIMD == 0)
        while (nb - b >= 2) {
            const int m = nb - b >= 4 ? 4 : nb - b;
            const char *kt[4];
            for (int j = 0; j < m; j++) kt[j] = run_of(k_base, block_bytes, table[b + j]);
            if (m == 4) scores_m(q, hd, kt, kk, 4, bs, sc + (size_t)b * bs);
            else if (m == 3) scores_m(q, hd, kt, kk, 3, bs, sc + (size_t)b * bs);
            else scores_m(q, hd, kt, kk, 2, bs, sc + (size_t)b * bs);
            b += m;
        }
#endif
    for (; b < nb; b++) scores_1(q, hd, run_of(k_base, block_bytes, table[b]), kk, bs, sc + (size_t)b * bs);

    /* softmax: scale, max, exp (exp_s / exp_v: the same bits), then the
     * sum in ascending p */
    float maxv = -INFINITY;
    int p = 0;
#ifdef DOL_SIMD
    /* the same products and the same maximum as the scalar loop (a maximum
     * does not depend on the order it is taken in) */
    vecf mv = v_set1(-INFINITY);
    for (; p + DOL_SIMD <= n; p += DOL_SIMD) {
        const vecf x = v_mul(v_load(sc + p), v_set1(scale));
        v_store(sc + p, x);
        mv = v_max(mv, x);
    }
    float lanes[DOL_SIMD];
    v_store(lanes, mv);
    for (int l = 0; l < DOL_SIMD; l++)
        if (lanes[l] > maxv) maxv = lanes[l];
#endif
    for (; p < n; p++) {
        sc[p] *= scale;
        if (sc[p] > maxv) maxv = sc[p];
    }
    p = 0;
#ifdef DOL_SIMD
    for (; p + DOL_SIMD <= n; p += DOL_SIMD) v_store(sc + p, exp_v(v_sub(v_load(sc + p), v_set1(maxv))));
#endif
    for (; p < n; p++) sc[p] = exp_s(sc[p] - maxv);
    float sum = 0.0f;
    for (p = 0; p < n; p++) sum += sc[p];
    values(sc, n, hd, v_base, vk, table, bs, block_bytes, 1.0f / sum, out);
}

/* One instantiation per pair of element types. */
#define ATTN_CASE(K, V)                                                                            \
    if (kt == K && vt == V) {                                                                      \
        attn_head_t(q, hd, n, k_base, v_base, K, V, table, bs, block_bytes, scale, sc, out);      \
        return;                                                                                    \
    }

void DOL_K(attn_head)(const float *q, int hd, int n, const void *k_base, const void *v_base,
                      dol_kv_dtype kt, dol_kv_dtype vt, const int32_t *table, int bs,
                      size_t block_bytes, float scale, float *sc, float *out)
{
    ATTN_CASE(DOL_KV_F32, DOL_KV_F32)
    ATTN_CASE(DOL_KV_F16, DOL_KV_F16)
    ATTN_CASE(DOL_KV_Q8_0, DOL_KV_Q8_0)
    ATTN_CASE(DOL_KV_Q8_0, DOL_KV_F16)
    ATTN_CASE(DOL_KV_F16, DOL_KV_Q8_0)
    ATTN_CASE(DOL_KV_F32, DOL_KV_F16)
    ATTN_CASE(DOL_KV_F16, DOL_KV_F32)
    ATTN_CASE(DOL_KV_Q8_0, DOL_KV_F32)
    ATTN_CASE(DOL_KV_F32, DOL_KV_Q8_0)
    /* the engine resolves both halves first: never reached */
    memset(out, 0, sizeof(float) * (size_t)hd);
}
