/* tests/unit/test_quant_fast.c — the load-time quantizers of every kernel
 * set this CPU supports (cpu_kernels.h: nf4_quantize_rows,
 * q8_quantize_rows) and dol_nf4_quantize / dol_q8_quantize on a pool,
 * byte for byte against a straightforward scalar reference of nf4.h and
 * q8.h written here in float64 (the quantizers' definition: the code of the
 * nearest level decided as w > mid * s in double; q = round-half-away of
 * w / d in double). Inputs chosen to be awkward: weights exactly on and
 * one ulp either side of every NF4 midpoint and every Q8 half step, every
 * finite F16 value and every BF16 value in range under several scales,
 * zeros and negative zeros, F32 subnormals, F16 subnormal scales, short
 * last blocks, and refusals (NaN, beyond F16). */
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
#include "engine/cpu_kernels.h"
#include "engine/nf4.h"
#include "engine/q8.h"
#include "engine/threadpool.h"

#define TEST_RNG_SEED 0x2F6A11C0DE5EED01ull
#include "test_random.h"

static const char *const SETS[] = { "portable", "avx2", "avx512" };

static float elem(const void *src, dol_dtype t, size_t i)
{
    if (t == DOL_DTYPE_F16) return dol_f16_to_f32(((const uint16_t *)src)[i]);
    if (t == DOL_DTYPE_BF16) return dol_bf16_to_f32(((const uint16_t *)src)[i]);
    return ((const float *)src)[i];
}

/* ---- the references ------------------------------------------------------- */

static int nf4_ref_block(const void *src, dol_dtype t, size_t base, int n, uint16_t *scale,
                         uint8_t *codes)
{
    float w[DOL_NF4_BLOCK], absmax = 0.0f;
    for (int i = 0; i < n; i++) {
        w[i] = elem(src, t, base + (size_t)i);
        if (!(fabsf(w[i]) <= 65504.0f)) return -1;
        if (fabsf(w[i]) > absmax) absmax = fabsf(w[i]);
    }
    uint16_t h = dol_f32_to_f16(absmax);
    double s = dol_f16_to_f32(h);
    *scale = h;
    uint8_t q[DOL_NF4_BLOCK];
    for (int i = 0; i < n; i++) {
        int c = 7;
        if (s > 0) {
            c = 0;
            for (int m = 0; m < 15; m++) {
                double mid = 0.5 * ((double)dol_nf4_levels[m] + (double)dol_nf4_levels[m + 1]);
                if ((double)w[i] > mid * s) c++;
            }
        }
        q[i] = (uint8_t)c;
    }
    for (int j = 0; j < n / 2; j++) codes[j] = (uint8_t)(q[j] | (q[j + n / 2] << 4));
    return 0;
}

static int q8_ref_block(const void *src, dol_dtype t, size_t base, int n, uint16_t *scale,
                        int8_t *q)
{
    float w[DOL_Q8_BLOCK], absmax = 0.0f;
    for (int i = 0; i < n; i++) {
        w[i] = elem(src, t, base + (size_t)i);
        if (!(fabsf(w[i]) <= 65504.0f * 127.0f)) return -1;
        if (fabsf(w[i]) > absmax) absmax = fabsf(w[i]);
    }
    uint16_t h = dol_f32_to_f16(absmax / 127.0f);
    double d = dol_f16_to_f32(h);
    if (isinf(d)) return -1;
    *scale = h;
    for (int i = 0; i < n; i++) {
        double r = d > 0 ? round((double)w[i] / d) : 0.0;
        q[i] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
    }
    return 0;
}

/* ---- the comparison --------------------------------------------------------- */

static void first_diff(const char *what, const char *set, const void *a, const void *b, size_t n)
{
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) {
            fprintf(stderr, "%s (%s): byte %zu is %02x, the reference has %02x\n", what, set, i,
                    x[i], y[i]);
            return;
        }
}

/* Every set and the pooled entry point against the reference on src. */
static void check_nf4(const void *src, dol_dtype t, int rows, int cols, dol_pool *pool)
{
    const size_t cb = dol_nf4_codes_bytes(rows, cols), sb = dol_nf4_scales_bytes(rows, cols);
    const int bpr = (cols + DOL_NF4_BLOCK - 1) / DOL_NF4_BLOCK;
    uint8_t *rc = calloc(cb, 1), *c = malloc(cb);
    uint16_t *rs = calloc(sb, 1), *s = malloc(sb);
    int want = 0;
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < bpr; b++) {
            int k0 = b * DOL_NF4_BLOCK, n = cols - k0 < DOL_NF4_BLOCK ? cols - k0 : DOL_NF4_BLOCK;
            if (nf4_ref_block(src, t, (size_t)r * cols + k0, n, &rs[r * bpr + b],
                              &rc[(size_t)r * (cols / 2) + k0 / 2]) != 0)
                want = -1;
        }
    for (int i = 0; i < 4; i++) {
        const dol_cpu_kernels *k = i < 3 ? dol_cpu_kernels_find(SETS[i]) : NULL;
        if (i < 3 && !k) continue;
        memset(c, 0xA5, cb);
        memset(s, 0xA5, sb);
        dol_nf4_matrix m = { rows, cols, bpr, c, s };
        int got;
        if (k) {
            got = k->nf4_quantize_rows(src, t, &m, 0, rows);
        } else {
            dol_tensor tt = { t, rows, cols, src };
            char err[DOL_ERR_LEN];
            got = dol_nf4_quantize(pool, &tt, &m, "test", err, sizeof err);
        }
        const char *name = k ? k->name : "pool";
        assert_int_equal(got, want);
        if (want != 0) continue;
        if (memcmp(s, rs, sb)) first_diff("nf4 scales", name, s, rs, sb);
        if (memcmp(c, rc, cb)) first_diff("nf4 codes", name, c, rc, cb);
        assert_memory_equal(s, rs, sb);
        assert_memory_equal(c, rc, cb);
    }
    free(rc);
    free(c);
    free(rs);
    free(s);
}

static void check_q8(const void *src, dol_dtype t, int rows, int cols, dol_pool *pool)
{
    const size_t qb = dol_q8_quants_bytes(rows, cols), sb = dol_q8_scales_bytes(rows, cols);
    const int bpr = (cols + DOL_Q8_BLOCK - 1) / DOL_Q8_BLOCK;
    int8_t *rq = calloc(qb, 1), *q = malloc(qb);
    uint16_t *rs = calloc(sb, 1), *s = malloc(sb);
    int want = 0;
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < bpr; b++) {
            int k0 = b * DOL_Q8_BLOCK, n = cols - k0 < DOL_Q8_BLOCK ? cols - k0 : DOL_Q8_BLOCK;
            if (q8_ref_block(src, t, (size_t)r * cols + k0, n, &rs[r * bpr + b],
                             &rq[(size_t)r * cols + k0]) != 0)
                want = -1;
        }
    for (int i = 0; i < 4; i++) {
        const dol_cpu_kernels *k = i < 3 ? dol_cpu_kernels_find(SETS[i]) : NULL;
        if (i < 3 && !k) continue;
        memset(q, 0xA5, qb);
        memset(s, 0xA5, sb);
        dol_q8_matrix m = { rows, cols, bpr, q, s };
        int got;
        if (k) {
            got = k->q8_quantize_rows(src, t, &m, 0, rows);
        } else {
            dol_tensor tt = { t, rows, cols, src };
            char err[DOL_ERR_LEN];
            got = dol_q8_quantize(pool, &tt, &m, "test", err, sizeof err);
        }
        const char *name = k ? k->name : "pool";
        assert_int_equal(got, want);
        if (want != 0) continue;
        if (memcmp(s, rs, sb)) first_diff("q8 scales", name, s, rs, sb);
        if (memcmp(q, rq, qb)) first_diff("q8 quants", name, q, rq, qb);
        assert_memory_equal(s, rs, sb);
        assert_memory_equal(q, rq, qb);
    }
    free(rq);
    free(q);
    free(rs);
    free(s);
}

/* f (rows x cols floats) as dtype t, then both schemes. */
static void check_floats(const float *f, int rows, int cols, dol_pool *pool)
{
    const size_t n = (size_t)rows * cols;
    uint16_t *h = malloc(n * sizeof *h), *b = malloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++) {
        h[i] = dol_f32_to_f16(f[i]);
        b[i] = dol_f32_to_bf16(f[i]);
    }
    check_nf4(f, DOL_DTYPE_F32, rows, cols, pool);
    check_nf4(h, DOL_DTYPE_F16, rows, cols, pool);
    check_nf4(b, DOL_DTYPE_BF16, rows, cols, pool);
    check_q8(f, DOL_DTYPE_F32, rows, cols, pool);
    check_q8(h, DOL_DTYPE_F16, rows, cols, pool);
    check_q8(b, DOL_DTYPE_BF16, rows, cols, pool);
    free(h);
    free(b);
}

/* ---- the inputs --------------------------------------------------------------- */

/* Gaussian rows with outliers at several magnitudes, full and short blocks. */
static void test_random_rows(void **state)
{
    dol_pool *pool = *state;
    const int shapes[][2] = { { 37, 256 }, { 9, 214 }, { 5, 103 * 2 }, { 3, 2 }, { 7, 96 } };
    const float sigmas[] = { 0.02f, 1.0f, 300.0f, 1e-6f };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (size_t j = 0; j < sizeof sigmas / sizeof *sigmas; j++) {
            float *w = random_outlier_weights(shapes[i][0], shapes[i][1], sigmas[j]);
            check_floats(w, shapes[i][0], shapes[i][1], pool);
            free(w);
        }
    /* an odd width (int8 only: NF4 needs even in_features) */
    float *w = random_outlier_weights(6, 103, 0.5f);
    check_q8(w, DOL_DTYPE_F32, 6, 103, pool);
    free(w);
}

/* Weights on each NF4 midpoint times the block's scale and one float ulp
 * either side, under scales that make the products exact floats and ones
 * that do not; with a short last block. */
static void test_nf4_midpoints(void **state)
{
    dol_pool *pool = *state;
    const float scales[] = { 1.0f, 0.5f, 3.0f, 0.0999755859375f, 65504.0f, 6.103515625e-05f,
                             5.9604644775390625e-08f, 1.2345f };
    const int cols = 64 * 3 + 46, per_row = cols;
    const int rows = (int)(sizeof scales / sizeof *scales) * 4;
    float *w = malloc(sizeof(float) * (size_t)rows * cols);
    int r = 0;
    for (size_t si = 0; si < sizeof scales / sizeof *scales; si++)
        for (int rep = 0; rep < 4; rep++, r++) {
            float *row = w + (size_t)r * per_row;
            const float s = dol_f16_to_f32(dol_f32_to_f16(scales[si]));
            for (int k = 0; k < cols; k++) {
                int m = (k * 7 + rep) % 15, side = (k + rep) % 3;
                double x = dol_nf4_mids[m] * (double)s;
                float f = (float)x;
                if (side == 1) f = nextafterf(f, INFINITY);
                if (side == 2) f = nextafterf(f, -INFINITY);
                if (rep == 3) f = (float)((float)dol_nf4_mids[m] * s); /* the float product */
                row[k] = f;
            }
            /* the absmax of every block is s itself (sign varies) */
            for (int k = 0; k < cols; k += DOL_NF4_BLOCK) row[k] = rep & 1 ? -s : s;
        }
    check_floats(w, rows, cols, pool);
    free(w);
}

/* Weights on each Q8 half step (n + 1/2) * d and one ulp either side. */
static void test_q8_half_steps(void **state)
{
    dol_pool *pool = *state;
    /* chosen scales (powers of two, F16 subnormals, inexact reciprocals),
     * then random F16 ones over the normal range */
    float ds[6 + 250] = { 1.0f, 0.0078125f, 0.01000213623046875f, 500.0f, 5.9604644775390625e-08f,
                          3.0517578125e-05f };
    for (int i = 6; i < 256; i++)
        ds[i] = dol_f16_to_f32((uint16_t)(0x0400 + (int)(uniform() * (0x7800 - 0x0400))));
    const int cols = 32 * 8 + 17, rows = (int)(sizeof ds / sizeof *ds) * 3;
    float *w = malloc(sizeof(float) * (size_t)rows * cols);
    int r = 0;
    for (size_t di = 0; di < sizeof ds / sizeof *ds; di++)
        for (int side = 0; side < 3; side++, r++) {
            float *row = w + (size_t)r * cols;
            const float d = ds[di];
            for (int k = 0; k < cols; k++) {
                int n = (k * 37) % 254 - 127; /* -127 .. 126 */
                float f = (float)((n + 0.5) * (double)d);
                if (side == 1) f = nextafterf(f, INFINITY);
                if (side == 2) f = nextafterf(f, -INFINITY);
                row[k] = f;
            }
            for (int k = 0; k < cols; k += DOL_Q8_BLOCK) row[k] = 127.0f * d; /* d = absmax/127 */
        }
    check_q8(w, DOL_DTYPE_F32, rows, cols, pool);
    check_floats(w, rows, cols - 1, pool); /* an even width for NF4 */
    free(w);
}

/* Every finite F16 value (and every BF16 value of magnitude <= 65504)
 * as weights of blocks led by one of several absmax values. */
static void test_every_half(void **state)
{
    dol_pool *pool = *state;
    const float leads[] = { 65504.0f, 1.0f, 0.333251953125f, 6.103515625e-05f,
                            5.9604644775390625e-08f };
    for (int bf = 0; bf < 2; bf++)
        for (size_t li = 0; li < sizeof leads / sizeof *leads; li++) {
            const uint16_t lead = bf ? dol_f32_to_bf16(leads[li]) : dol_f32_to_f16(leads[li]);
            const float lim = bf ? dol_bf16_to_f32(lead) : dol_f16_to_f32(lead);
            const int cols = 128;
            uint16_t *h = malloc(sizeof *h * 70000 * 2), *p = h;
            for (uint32_t u = 0; u < 65536; u++) {
                const float v = bf ? dol_bf16_to_f32((uint16_t)u) : dol_f16_to_f32((uint16_t)u);
                if (!(fabsf(v) <= lim)) continue;
                if ((p - h) % DOL_NF4_BLOCK == 0) *p++ = lead;
                if ((p - h) % DOL_Q8_BLOCK == 0) *p++ = lead;
                *p++ = (uint16_t)u;
            }
            while ((p - h) % cols) *p++ = 0x8000; /* -0 */
            const int rows = (int)((p - h) / cols);
            const dol_dtype t = bf ? DOL_DTYPE_BF16 : DOL_DTYPE_F16;
            check_nf4(h, t, rows, cols, pool);
            check_q8(h, t, rows, cols, pool);
            free(h);
        }
}

/* Zero and negative-zero blocks, F32 subnormal weights (alone, so the
 * scale rounds to 0, and under a normal absmax), tiny F16 scales. */
static void test_zeros_and_subnormals(void **state)
{
    dol_pool *pool = *state;
    const int rows = 8, cols = 64 * 2 + 32;
    float *w = calloc((size_t)rows * cols, sizeof *w);
    for (int k = 0; k < cols; k++) {
        w[1 * cols + k] = -0.0f;
        w[2 * cols + k] = (k & 1 ? -1.0f : 1.0f) * 1e-40f * (float)(k + 1);
        w[3 * cols + k] = k % 16 == 0 ? 1e-3f : 1e-41f * (float)(k - 80);
        w[4 * cols + k] = 3.0e-8f * (float)((k % 9) - 4);   /* scale ~ f16 subnormal */
        w[5 * cols + k] = k % 64 == 5 ? 2.9802322387695312e-08f : 0.0f; /* a tie at f16 0 */
        w[6 * cols + k] = k % 64 == 9 ? 65504.0f : 1e-30f * (float)(k - 50);
        w[7 * cols + k] = 7.5e-9f * (float)(k % 5);         /* absmax/127 under the f16 range */
    }
    check_floats(w, rows, cols, pool);
    free(w);
}

/* A NaN, an infinity or a magnitude beyond what F16 can scale makes every
 * set refuse, as the reference does. */
static void test_refusals(void **state)
{
    dol_pool *pool = *state;
    const float bad[] = { NAN, INFINITY, -INFINITY, 65520.0f, 65504.0f * 127.0f * 1.01f };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        for (int at = 0; at < 3; at++) {
            const int rows = 20, cols = 64 * 2 + 30;
            float *w = random_outlier_weights(rows, cols, 0.1f);
            w[(size_t)(at * 9) * cols + (at * 61) % cols] = bad[i];
            check_nf4(w, DOL_DTYPE_F32, rows, cols, pool);
            check_q8(w, DOL_DTYPE_F32, rows, cols, pool);
            free(w);
        }
}

static int setup(void **state)
{
    *state = dol_pool_new(2);
    return *state ? 0 : -1;
}

static int teardown(void **state)
{
    dol_pool_free(*state);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_rows),
        cmocka_unit_test(test_nf4_midpoints),
        cmocka_unit_test(test_q8_half_steps),
        cmocka_unit_test(test_every_half),
        cmocka_unit_test(test_zeros_and_subnormals),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
