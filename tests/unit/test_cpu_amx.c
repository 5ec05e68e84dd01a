/* tests/unit/test_cpu_amx.c — the BF16x3 AMX products (cpu_amx.h) against a
 * float64 reference, and through the engine's products (cpu_ops.h) with
 * batch_invariant off: every output within the BF16x3 bound of the exact
 * dot product, for F16, BF16, NF4 and Q8_0 weights and awkward T, m and K.
 * Skipped where the CPU or OS has no AMX. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dolphin/common.h"
#include "dolphin/model.h"
#include "engine/cpu_amx.h"
#include "engine/cpu_kernels.h"
#include "engine/cpu_ops.h"
#include "engine/nf4.h"
#include "engine/q8.h"
#include "engine/threadpool.h"

#define TEST_RNG_SEED 0xA3C59AC2F1E5D7B1ull
#include "test_random.h"

/* |got - exact| <= BOUND * sum_k |x_k w_k| (+ a floor for sums near 0):
 * three bf16 roundings of 2^-9 relative each leave 2^-16 per term at worst
 * (cpu_amx.h), and the f32 accumulation its own ~K * 2^-24. */
#define BOUND 3e-5

static void check_close(const float *got, const float *x, const float *w, int T, int N, int K,
                        int n0, int m, const char *what)
{
    for (int t = 0; t < T; t++)
        for (int r = 0; r < m; r++) {
            double s = 0, a = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)x[(size_t)t * K + k] * w[(size_t)(n0 + r) * K + k];
                s += p;
                a += fabs(p);
            }
            double g = got[(size_t)t * N + n0 + r];
            if (!(fabs(g - s) <= BOUND * a + 1e-30)) {
                fprintf(stderr, "%s: T=%d K=%d t=%d n=%d: got %.9g exact %.9g (sum|xw| %.3g)\n",
                        what, T, K, t, n0 + r, g, s, a);
                fail();
            }
        }
}

static float *randn(size_t n, float sigma)
{
    float *v = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) v[i] = gaussian() * sigma;
    return v;
}

static void test_product_f32_rows(void **state)
{
    (void)state;
    if (!dol_amx_available()) skip();
    const int Ts[] = { 1, 15, 16, 17, 33, 64 }, Ks[] = { 32, 96, 2048 }, ms[] = { 1, 7, 16, 17, 32 };
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                const int T = Ts[ti], K = Ks[ki], m = ms[mi], N = 40, n0 = 3;
                float *x = randn((size_t)T * K, 1.0f), *w = randn((size_t)N * K, 0.05f);
                x[0] = 1e-3f; /* a tiny and a large value among them */
                x[K - 1] = 40.0f;
                uint16_t *xp = malloc(sizeof(uint16_t) * dol_amx_x_elems(T, K));
                uint16_t *wp = malloc(sizeof(uint16_t) * 2 * dol_amx_w_elems(K));
                float *out = calloc((size_t)T * N, sizeof(float));
                float *sentinel = malloc(sizeof(float) * (size_t)T * N);
                for (int i = 0; i < T * N; i++) out[i] = sentinel[i] = -7.0f;
                dol_amx_pack_x(xp, x, T, K, 0, (T + 15) / 16);
                dol_amx_w_from_f32(wp, w + (size_t)n0 * K, m < 16 ? m : 16, K);
                if (m > 16) dol_amx_w_from_f32(wp + dol_amx_w_elems(K), w + (size_t)(n0 + 16) * K, m - 16, K);
                dol_amx_product(out, N, n0, m, wp, xp, T, K);
                check_close(out, x, w, T, N, K, n0, m, "f32 rows");
                /* only the group's columns are written */
                for (int t = 0; t < T; t++)
                    for (int n = 0; n < N; n++)
                        if (n < n0 || n >= n0 + m) assert_true(out[(size_t)t * N + n] == -7.0f);
                free(x); free(w); free(xp); free(wp); free(out); free(sentinel);
            }
}

/* The packed F16 / BF16 layouts give the same values as their f32 rows. */
static void test_product_packed(void **state)
{
    (void)state;
    if (!dol_amx_available()) skip();
    const int T = 37, K = 256, N = 24;
    float *x = randn((size_t)T * K, 1.0f), *w = randn((size_t)N * K, 0.05f);
    uint16_t *xp = malloc(sizeof(uint16_t) * dol_amx_x_elems(T, K));
    uint16_t *wp = malloc(sizeof(uint16_t) * dol_amx_w_elems(K));
    dol_amx_pack_x(xp, x, T, K, 0, (T + 15) / 16);
    const dol_dtype types[] = { DOL_DTYPE_F16, DOL_DTYPE_BF16 };
    for (int ti = 0; ti < 2; ti++) {
        const dol_dtype dt = types[ti];
        uint16_t *packed = malloc(sizeof(uint16_t) * dol_cpu_packed_elems(N, K));
        if (dt == DOL_DTYPE_BF16) { /* packing makes BF16 from BF16 only */
            uint16_t *b = malloc(sizeof(uint16_t) * (size_t)N * K);
            for (int i = 0; i < N * K; i++) b[i] = dol_f32_to_bf16(w[i]);
            assert_int_equal(dol_cpu_pack(NULL, packed, dt, b, DOL_DTYPE_BF16, N, K), 0);
            free(b);
        } else {
            assert_int_equal(dol_cpu_pack(NULL, packed, dt, w, DOL_DTYPE_F32, N, K), 0);
        }
        /* the rounded weights are what the product must match */
        float *wr = malloc(sizeof(float) * (size_t)N * K);
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) {
                uint16_t h = packed[dol_cpu_packed_index(n, k, K)];
                wr[(size_t)n * K + k] = dt == DOL_DTYPE_F16 ? dol_f16_to_f32(h) : dol_bf16_to_f32(h);
            }
        float *out = calloc((size_t)T * N, sizeof(float));
        for (int n = 0; n < N; n += 16) {
            int m = N - n < 16 ? N - n : 16;
            dol_amx_w_from_packed(wp, packed, dt, n, m, K);
            dol_amx_product(out, N, n, m, wp, xp, T, K);
        }
        check_close(out, x, wr, T, N, K, 0, N, dt == DOL_DTYPE_F16 ? "packed f16" : "packed bf16");
        free(packed); free(wr); free(out);
    }
    free(x); free(w); free(xp); free(wp);
}

/* Through cpu_ops: products with a fast scratch take the AMX path from 16
 * rows of x (and stay exact below), for every weight format it serves. */
static void test_cpu_ops_fast(void **state)
{
    (void)state;
    /* (the AMX path needs the avx512 F32 set: not where DOLPHIN_CPU_KERNELS forces a narrower one) */
    if (!dol_amx_available() || strcmp(dol_cpu_kernels_get()->name, "avx512") != 0) skip();
    dol_pool *pool = dol_pool_new(2);
    const int K = 128, N = 48;
    float *w = randn((size_t)N * K, 0.05f);
    dol_nf4_matrix q4;
    dol_q8_matrix q8;
    q4.codes = malloc(dol_nf4_bytes(N, K));
    q4.scales = (uint16_t *)(q4.codes + dol_nf4_codes_bytes(N, K));
    q8.quants = malloc(dol_q8_bytes(N, K));
    q8.scales = (uint16_t *)((uint8_t *)q8.quants + dol_q8_quants_bytes(N, K));
    const dol_tensor src = { .data = w, .dtype = DOL_DTYPE_F32, .rows = N, .cols = K };
    char err[256];
    assert_int_equal(dol_nf4_quantize(pool, &src, &q4, "w", err, sizeof err), 0);
    assert_int_equal(dol_q8_quantize(pool, &src, &q8, "w", err, sizeof err), 0);
    uint16_t *f16 = malloc(sizeof(uint16_t) * dol_cpu_packed_elems(N, K));
    assert_int_equal(dol_cpu_pack(pool, f16, DOL_DTYPE_F16, w, DOL_DTYPE_F32, N, K), 0);
    float *wq4 = malloc(sizeof(float) * (size_t)N * K), *wq8 = malloc(sizeof(float) * (size_t)N * K);
    float *wh = malloc(sizeof(float) * (size_t)N * K);
    for (int n = 0; n < N; n++) {
        dol_nf4_dequantize_row(&q4, n, wq4 + (size_t)n * K);
        dol_q8_dequantize_row(&q8, n, wq8 + (size_t)n * K);
        for (int k = 0; k < K; k++) wh[(size_t)n * K + k] = dol_f16_to_f32(f16[dol_cpu_packed_index(n, k, K)]);
    }
    const int Ts[] = { 15, 16, 40 };
    for (int ti = 0; ti < 3; ti++) {
        const int T = Ts[ti];
        float *x = randn((size_t)T * K, 1.0f);
        dol_cpu_fast fast = { 0 };
        assert_int_equal(dol_cpu_fast_reserve(&fast, T, K), 0);
        const dol_cpu_weight ws[3] = {
            { NULL, DOL_DTYPE_F32, &q4, N, K, false, NULL, &fast, 0, NULL, NULL, false },
            { NULL, DOL_DTYPE_F32, NULL, N, K, false, &q8, &fast, 0, NULL, NULL, false },
            { f16, DOL_DTYPE_F16, NULL, N, K, true, NULL, &fast, 0, NULL, NULL, false },
        };
        const float *refw[3] = { wq4, wq8, wh };
        const char *names[3] = { "nf4", "q8", "f16" };
        for (int i = 0; i < 3; i++) {
            float *out = calloc((size_t)T * N, sizeof(float)), *exact = calloc((size_t)T * N, sizeof(float));
            float *o = out;
            dol_cpu_matmul_multi(pool, x, T, K, &ws[i], &o, 1);
            check_close(out, x, refw[i], T, N, K, 0, N, names[i]);
            dol_cpu_weight plain = ws[i];
            plain.fast = NULL;
            o = exact;
            dol_cpu_matmul_multi(pool, x, T, K, &plain, &o, 1);
            int same = memcmp(out, exact, sizeof(float) * (size_t)T * N) == 0;
            /* below 16 rows the exact kernels run; from 16 the AMX path does,
             * whose sums round differently somewhere in 48 x T outputs */
            if (T < 16) assert_true(same);
            else assert_false(same);
            free(out); free(exact);
        }
        dol_cpu_fast_free(&fast);
        free(x);
    }
    free(w); free(q4.codes); free(q8.quants); free(f16); free(wq4); free(wq8); free(wh);
    dol_pool_free(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_product_f32_rows),
        cmocka_unit_test(test_product_packed),
        cmocka_unit_test(test_cpu_ops_fast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
