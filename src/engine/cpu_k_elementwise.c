/* src/engine/cpu_k_elementwise.c — the CPU kernels' element-wise
 * operations: RMSNorm over rows, RoPE rotation, SiLU-gated product (with
 * the exp of cpu_k_exp.h), as documented in cpu_ops.h. The same
 * expressions in every variant, compiled with that variant's flags
 * (cpu_k.h); exports DOL_K(rmsnorm), DOL_K(rope) and DOL_K(silu_mul). */
#include "engine/cpu_k.h"
#include "engine/cpu_k_exp.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- element-wise kernels ------------------------------------------------ */

/* RMSNorm of `rows` rows of n floats (row stride n), four rows at a time:
 * each row's sum of squares is still one double accumulated in i order
 * (a float product is exact in double, so a fused multiply-add gives the
 * same sum), but four rows' chains run side by side instead of one
 * 4-cycle addition after another. The same bits as one row at a time. */
static void rmsnorm_scale(float *out, const float *x, const float *w, int n, double ss,
                          float eps)
{
    float scale = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void DOL_K(rmsnorm)(float *out, const float *x, const float *w, int rows, int n, float eps)
{
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *x0 = x + (size_t)r * n, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        for (int i = 0; i < n; i++) {
            s0 += (double)x0[i] * x0[i];
            s1 += (double)x1[i] * x1[i];
            s2 += (double)x2[i] * x2[i];
            s3 += (double)x3[i] * x3[i];
        }
        float *o = out + (size_t)r * n;
        rmsnorm_scale(o, x0, w, n, s0, eps);
        rmsnorm_scale(o + n, x1, w, n, s1, eps);
        rmsnorm_scale(o + 2 * (size_t)n, x2, w, n, s2, eps);
        rmsnorm_scale(o + 3 * (size_t)n, x3, w, n, s3, eps);
    }
    for (; r < rows; r++) {
        const float *xr = x + (size_t)r * n;
        double ss = 0.0;
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        rmsnorm_scale(out + (size_t)r * n, xr, w, n, ss, eps);
    }
}

void DOL_K(rope)(float *x, int n_heads, int head_dim, const float *cos_row, const float *sin_row)
{
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cos_row[i] - b * sin_row[i];
            v[i + half] = b * cos_row[i] + a * sin_row[i];
        }
    }
}

/* out[i] = silu(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up, with the
 * softmax's exp (exp_s / exp_v: the same bits in every kernel set). */
void DOL_K(silu_mul)(float *out, const float *gate, const float *up, int n)
{
    int i = 0;
#ifdef DOL_SIMD
    const vecf one = v_set1(1.0f);
    for (; i + DOL_SIMD <= n; i += DOL_SIMD) {
        vecf g = v_load(gate + i);
        vecf e = exp_v(v_sub(v_zero(), g));
        v_store(out + i, v_mul(v_div(g, v_add(one, e)), v_load(up + i)));
    }
#endif
    for (; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + exp_s(0.0f - g)) * up[i];
    }
}
