/* tests/unit/test_q8.c — Q8_0 (int8) weights: the scheme on chosen values
 * (scale, round half away from zero, clamp, zero blocks, short last block),
 * the error bound, refusals, the q8_rows product of every kernel set this
 * CPU supports against dequantize-then-double on odd shapes (1..9 rows), its
 * batch invariance over rows and threads, and the engine's byte counts with
 * weights int8 (lm_head kept by default, quantize_lm_head opting in). */
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
#include "dolphin/engine.h"
#include "dolphin/model.h"
#include "engine/cpu_kernels.h"
#include "engine/cpu_ops.h"
#include "engine/q8.h"
#include "engine/threadpool.h"
#include "test_fixtures.h"

#define TEST_RNG_SEED 0x51ED2701A3C4E5F7ull
#include "test_random.h"

typedef struct {
    dol_q8_matrix q;
    float *w;
} qmat;

static qmat make_qmat(int rows, int cols, float sigma)
{
    qmat m = {0};
    m.w = random_outlier_weights(rows, cols, sigma);
    m.q.quants = malloc(dol_q8_quants_bytes(rows, cols));
    m.q.scales = malloc(dol_q8_scales_bytes(rows, cols));
    dol_tensor t = { DOL_DTYPE_F32, rows, cols, m.w };
    char err[DOL_ERR_LEN];
    assert_int_equal(dol_q8_quantize(NULL, &t, &m.q, "test", err, sizeof err), 0);
    return m;
}

static void free_qmat(qmat *m)
{
    free(m->w);
    free(m->q.quants);
    free(m->q.scales);
}

/* One row of 70 weights = blocks of 32, 32 and 6: the scale is f16(absmax /
 * 127), halves round away from zero, a zero block stays zero. */
static void test_scheme(void **state)
{
    (void)state;
    const int cols = 70;
    float w[70] = {0};
    /* block 0: absmax 127 * 0.5 -> d = 0.5 exactly; 1.25 / 0.5 = 2.5 -> 3 */
    w[0] = 63.5f;
    w[1] = 1.25f;
    w[2] = -1.25f;
    w[3] = 0.74f;  /* 1.48 -> 1 */
    w[4] = -63.5f; /* -127 */
    /* block 1: zeros (w[32..63]) */
    /* block 2 (short, 6 weights): absmax 3 -> d = f16(3/127) */
    w[64] = 3.0f;
    w[65] = -1.5f;
    w[66] = 0.0f;
    dol_q8_matrix q = { .quants = malloc(dol_q8_quants_bytes(1, cols)),
                        .scales = malloc(dol_q8_scales_bytes(1, cols)) };
    assert_int_equal(dol_q8_scales_bytes(1, cols), 3 * 2);
    dol_tensor t = { DOL_DTYPE_F32, 1, cols, w };
    char err[DOL_ERR_LEN];
    assert_int_equal(dol_q8_quantize(NULL, &t, &q, "t", err, sizeof err), 0);
    assert_int_equal(q.blocks_per_row, 3);
    assert_true(dol_f16_to_f32(q.scales[0]) == 0.5f);
    assert_int_equal(q.quants[0], 127);
    assert_int_equal(q.quants[1], 3);
    assert_int_equal(q.quants[2], -3);
    assert_int_equal(q.quants[3], 1);
    assert_int_equal(q.quants[4], -127);
    assert_int_equal(q.scales[1], 0);
    for (int k = 32; k < 64; k++) assert_int_equal(q.quants[k], 0);
    float d2 = dol_f16_to_f32(dol_f32_to_f16(3.0f / 127.0f));
    assert_true(dol_f16_to_f32(q.scales[2]) == d2);
    assert_int_equal(q.quants[64], (int)fmin(127.0, round(3.0 / d2)));
    assert_int_equal(q.quants[65], (int)round(-1.5 / d2));
    float out[70];
    dol_q8_dequantize_row(&q, 0, out);
    assert_true(out[1] == 1.5f);
    assert_true(out[64] == q.quants[64] * d2);
    assert_int_equal(dol_q8_bytes(4096, 4096), 4096 * 4096 + 4096 * 128 * 2);
    /* 34 bytes per 32 weights: <= 0.54 x F16 */
    assert_true((double)dol_q8_bytes(4096, 4096) / (4096.0 * 4096 * 2) <= 0.54);
    free(q.quants);
    free(q.scales);
}

/* |w - dequant(w)| <= d / 2 (plus the clamp's share at the absmax) for
 * random F32, F16 and BF16 weights. */
static void test_error_bound(void **state)
{
    (void)state;
    qmat m = make_qmat(13, 100, 0.02f);
    float row[100];
    for (int r = 0; r < 13; r++) {
        dol_q8_dequantize_row(&m.q, r, row);
        for (int k = 0; k < 100; k++) {
            float d = dol_f16_to_f32(m.q.scales[r * m.q.blocks_per_row + k / 32]);
            double e = fabs((double)row[k] - m.w[r * 100 + k]);
            if (!(e <= 0.5 * d * (1 + 1e-6) + fabs(m.w[r * 100 + k]) * 2e-3))
                fail_msg("row %d k %d: w %.9g dequantized %.9g (d %.9g)", r, k, m.w[r * 100 + k], row[k], d);
        }
    }
    free_qmat(&m);
}

static void test_refused(void **state)
{
    (void)state;
    float w[40];
    for (int i = 0; i < 40; i++) w[i] = 0.1f;
    w[33] = NAN;
    dol_q8_matrix q = { .quants = malloc(40), .scales = malloc(4) };
    dol_tensor t = { DOL_DTYPE_F32, 1, 40, w };
    char err[DOL_ERR_LEN];
    assert_int_equal(dol_q8_quantize(NULL, &t, &q, "layer.x", err, sizeof err), -1);
    assert_non_null(strstr(err, "layer.x"));
    assert_non_null(strstr(err, "int8"));
    free(q.quants);
    free(q.scales);
}

/* Every supported kernel set: the product against the dequantized weights
 * in double, on odd shapes, 1..9 rows of x, 1 and 2 threads; and each row
 * the same bits whatever T and the thread count. */
static void test_matmul(void **state)
{
    (void)state;
    const int shapes[][2] = { { 32, 4 }, { 1, 3 }, { 31, 5 }, { 33, 7 }, { 172, 64 },
                              { 100, 9 }, { 768, 21 }, { 344, 13 }, { 2048, 6 } };
    static const char *const names[] = { "portable", "avx2", "avx512" };
    const dol_cpu_kernels *before = dol_cpu_kernels_get();
    dol_pool *pools[2] = { dol_pool_new(1), dol_pool_new(2) };
    for (size_t v = 0; v < 3; v++) {
        if (!dol_cpu_kernels_find(names[v])) continue;
        assert_int_equal(dol_cpu_kernels_set(names[v]), 0);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int K = shapes[s][0], N = shapes[s][1];
            qmat m = make_qmat(N, K, 0.05f);
            float *wd = malloc(sizeof(float) * (size_t)N * K);
            for (int r = 0; r < N; r++) dol_q8_dequantize_row(&m.q, r, wd + (size_t)r * K);
            float *x = malloc(sizeof(float) * 9 * K);
            for (int i = 0; i < 9 * K; i++) x[i] = gaussian();
            float *alone = malloc(sizeof(float) * 9 * N), *got = malloc(sizeof(float) * 9 * N);
            for (int t = 0; t < 9; t++)
                dol_cpu_matmul_q8(pools[0], alone + (size_t)t * N, x + (size_t)t * K, 1, &m.q);
            for (int t = 0; t < 9; t++)
                for (int n = 0; n < N; n++) {
                    double ref = 0.0, mag = 0.0;
                    for (int k = 0; k < K; k++) {
                        ref += (double)x[t * K + k] * wd[n * K + k];
                        mag += fabs((double)x[t * K + k] * wd[n * K + k]);
                    }
                    if (!(fabs(alone[t * N + n] - ref) <= 1e-5 * mag + 1e-30))
                        fail_msg("%s K %d N %d: out[%d][%d] = %.9g, reference %.9g", names[v], K,
                                 N, t, n, alone[t * N + n], ref);
                }
            for (int T = 1; T <= 9; T++)
                for (int p = 0; p < 2; p++) {
                    memset(got, 0xff, sizeof(float) * 9 * N);
                    dol_cpu_matmul_q8(pools[p], got, x, T, &m.q);
                    assert_memory_equal(got, alone, sizeof(float) * (size_t)T * N);
                }
            free(x);
            free(alone);
            free(got);
            free(wd);
            free_qmat(&m);
        }
    }
    assert_int_equal(dol_cpu_kernels_set(before->name), 0);
    dol_pool_free(pools[0]);
    dol_pool_free(pools[1]);
}

/* tiny-llama2 with weights int8: the seven linear layers of every block
 * quantized, lm_head kept (default) or quantized (quantize_lm_head); the
 * quantized bytes are 34/64 of F16's. */
static void test_engine_bytes(void **state)
{
    (void)state;
    char dir[1200], err[DOL_ERR_LEN];
    test_fixture_model(dir, sizeof dir, "tiny-llama2");
    dol_model *m = NULL;
    assert_int_equal(dol_model_load(dir, &m, err, sizeof err), 0);
    const dol_model_config *c = &m->cfg;
    for (int head = 0; head < 2; head++) {
        dol_engine_params p = { .activations = DOL_ACT_F32, .n_threads = 1, .kv_block_size = 16, .max_seqs = 1,
                                .max_batch_tokens = 16, .weights = DOL_WEIGHTS_INT8,
                                .quantize_lm_head = head, .kv_cache_tokens = 64 };
        dol_engine *e = NULL;
        assert_int_equal(dol_engine_create(m, &p, &e, err, sizeof err), 0);
        dol_quant_stats qs;
        dol_engine_quant_stats(e, &qs);
        assert_int_equal(qs.n_quantized, 7 * c->n_layers + head);
        double ratio = (double)qs.quant_bytes_after / (double)qs.quant_bytes_before; /* F16 checkpoint */
        print_message("  tiny-llama2 int8 (lm_head %s): quantized %.4f x F16, all linear %.4f x F16\n",
                      head ? "int8" : "kept", ratio, (double)qs.linear_bytes / qs.linear_f16_bytes);
        assert_true(ratio <= 0.54);
        if (head) assert_true((double)qs.linear_bytes / qs.linear_f16_bytes <= 0.54);
        dol_engine_free(e);
    }
    dol_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scheme),      cmocka_unit_test(test_error_bound),
        cmocka_unit_test(test_refused),     cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_engine_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
