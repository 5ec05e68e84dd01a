/* tests/unit/test_ggml_blocks.c — the GGUF block types on the CPU
 * (include/dolphin/ggml_blocks.h, src/engine/cpu_k_blocks.c): for each of
 * the ten types, on random blocks with finite scales,
 *   - every kernel set's blk_panel (row-major and packed) and
 *     dol_dequantize give dol_blk_weight's bits;
 *   - the products over the blocks are batch-invariant: the same bits for
 *     every row at T = 1..9 and with 1 and 2 threads, on odd row counts;
 *   - those bits are the F32 product over the dequantized matrix, and
 *     within float rounding of a double dot product.
 * The semantics of dol_blk_weight itself are held to gguf-py's by the
 * golden tests (test_gguf, the float64 reference on its dequantized
 * weights). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dolphin/ggml_blocks.h"
#include "dolphin/model.h"
#include "engine/cpu_kernels.h"
#include "engine/cpu_ops.h"
#include "engine/threadpool.h"

#define TEST_RNG_SEED 0x6A09E667F3BCC909ull
#include "test_random.h"
#include "test_ggml_random.h"

static const dol_dtype TYPES[] = {DOL_DTYPE_Q8_0, DOL_DTYPE_Q4_0, DOL_DTYPE_Q4_1, DOL_DTYPE_Q5_0,
                                  DOL_DTYPE_Q5_1, DOL_DTYPE_Q2_K, DOL_DTYPE_Q3_K, DOL_DTYPE_Q4_K,
                                  DOL_DTYPE_Q5_K, DOL_DTYPE_Q6_K};
#define N_TYPES ((int)(sizeof TYPES / sizeof TYPES[0]))

/* Row r of the matrix through dol_blk_weight. */
static void reference_row(dol_dtype t, const uint8_t *m, int r, int K, float *out)
{
    const int B = dol_dtype_block(t);
    const uint8_t *row = m + (size_t)r * dol_dtype_row_bytes(t, K);
    for (int k = 0; k < K; k++)
        out[k] = dol_blk_weight(t, row + (size_t)(k / B) * dol_dtype_block_bytes(t), k % B);
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void test_panels_and_dequantize(void **state)
{
    (void)state;
    static const char *const sets[] = {"portable", "avx2", "avx512"};
    for (int ti = 0; ti < N_TYPES; ti++) {
        const dol_dtype t = TYPES[ti];
        const int K = 3 * dol_dtype_block(t), R = 7;
        uint8_t *m = random_matrix(t, R, K);
        float *ref = malloc(sizeof(float) * (size_t)R * K);
        float *got = malloc(sizeof(float) * (size_t)R * K);
        float *tile = malloc(sizeof(float) * (size_t)8 * K);
        for (int r = 0; r < R; r++) reference_row(t, m, r, K, ref + (size_t)r * K);
        for (int r = 0; r < R; r++)
            dol_dequantize(t, m + (size_t)r * dol_dtype_row_bytes(t, K), got + (size_t)r * K, K);
        assert_memory_equal(got, ref, sizeof(float) * (size_t)R * K);
        for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
            const dol_cpu_kernels *k = dol_cpu_kernels_find(sets[si]);
            if (!k) continue;
            /* rows 2..6 (m = 5): row-major, then packed (two panels, 3 padding rows) */
            k->blk_panel(t, m, dol_dtype_row_bytes(t, K), 2, 5, K, false, tile);
            assert_memory_equal(tile, ref + (size_t)2 * K, sizeof(float) * (size_t)5 * K);
            k->blk_panel(t, m, dol_dtype_row_bytes(t, K), 2, 5, K, true, tile);
            for (int r = 0; r < 8; r++)
                for (int c = 0; c < K; c++) {
                    float want = r < 5 ? ref[(size_t)(2 + r) * K + c] : 0.0f;
                    float v = tile[dol_cpu_packed_index(r, c, K)];
                    if (!same_bits(v, want))
                        fail_msg("%s %s packed row %d col %d: %g, want %g", sets[si],
                                 dol_dtype_name(t), r, c, v, want);
                }
        }
        free(m), free(ref), free(got), free(tile);
    }
}

static void test_products_batch_invariant(void **state)
{
    (void)state;
    dol_pool *two = dol_pool_new(2);
    assert_non_null(two);
    for (int ti = 0; ti < N_TYPES; ti++) {
        const dol_dtype t = TYPES[ti];
        const int K = 512, N = 131, T = 9; /* K * N >= 64K: two threads split even T = 1 */
        uint8_t *m = random_matrix(t, N, K);
        float *deq = malloc(sizeof(float) * (size_t)N * K);
        float *x = malloc(sizeof(float) * (size_t)T * K);
        float *one = malloc(sizeof(float) * (size_t)N);
        float *out = malloc(sizeof(float) * (size_t)T * N);
        float *flt = malloc(sizeof(float) * (size_t)T * N);
        for (int r = 0; r < N; r++) reference_row(t, m, r, K, deq + (size_t)r * K);
        for (int i = 0; i < T * K; i++) x[i] = gaussian();
        /* the F32 product over the dequantized matrix: the bits to match */
        dol_cpu_matmul(NULL, flt, x, T, K, deq, DOL_DTYPE_F32, N);
        for (int tt = 1; tt <= T; tt++)
            for (int th = 0; th < 2; th++) {
                dol_cpu_matmul(th ? two : NULL, out, x, tt, K, m, t, N);
                for (int s = 0; s < tt; s++)
                    for (int n = 0; n < N; n++)
                        if (!same_bits(out[(size_t)s * N + n], flt[(size_t)s * N + n]))
                            fail_msg("%s T=%d threads=%d row %d out %d: %.9g, F32 product %.9g",
                                     dol_dtype_name(t), tt, th + 1, s, n, out[(size_t)s * N + n],
                                     flt[(size_t)s * N + n]);
            }
        /* and close to a double dot product */
        for (int n = 0; n < N; n++) {
            double d = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                d += (double)x[k] * deq[(size_t)n * K + k];
                mag += fabs((double)x[k] * deq[(size_t)n * K + k]);
            }
            one[n] = flt[n];
            assert_true(fabs(one[n] - d) <= 1e-5 * mag + 1e-30);
        }
        free(m), free(deq), free(x), free(one), free(out), free(flt);
    }
    dol_pool_free(two);
}

static void test_geometry(void **state)
{
    (void)state;
    static const struct { dol_dtype t; const char *name; int block; size_t bytes; } want[] = {
        {DOL_DTYPE_Q8_0, "Q8_0", 32, 34},  {DOL_DTYPE_Q4_0, "Q4_0", 32, 18},
        {DOL_DTYPE_Q4_1, "Q4_1", 32, 20},  {DOL_DTYPE_Q5_0, "Q5_0", 32, 22},
        {DOL_DTYPE_Q5_1, "Q5_1", 32, 24},  {DOL_DTYPE_Q2_K, "Q2_K", 256, 84},
        {DOL_DTYPE_Q3_K, "Q3_K", 256, 110}, {DOL_DTYPE_Q4_K, "Q4_K", 256, 144},
        {DOL_DTYPE_Q5_K, "Q5_K", 256, 176}, {DOL_DTYPE_Q6_K, "Q6_K", 256, 210},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        assert_string_equal(dol_dtype_name(want[i].t), want[i].name);
        assert_true(dol_dtype_is_block(want[i].t));
        assert_int_equal(dol_dtype_block(want[i].t), want[i].block);
        assert_int_equal(dol_dtype_block_bytes(want[i].t), want[i].bytes);
        assert_int_equal(dol_dtype_size(want[i].t), 0);
        assert_int_equal(dol_dtype_row_bytes(want[i].t, 4 * want[i].block), 4 * want[i].bytes);
    }
    assert_false(dol_dtype_is_block(DOL_DTYPE_F16));
    assert_int_equal(dol_dtype_row_bytes(DOL_DTYPE_BF16, 10), 20);
    /* a known block: Q4_0 with d = 1, qs[j] = j | (15 - j) << 4 gives j - 8, then 7 - j */
    uint8_t q4[18] = {0x00, 0x3c};
    for (int j = 0; j < 16; j++) q4[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    for (int j = 0; j < 32; j++)
        assert_true(dol_blk_weight(DOL_DTYPE_Q4_0, q4, j) == (float)(j < 16 ? j - 8 : 7 - (j - 16)));
    /* Q6_K with d = 0.5 and scale 2 everywhere, ql = 0x21, qh = 0: q = 1 (low nibbles) or 2,
     * minus 32 */
    uint8_t q6[210] = {0};
    memset(q6, 0x21, 128);
    memset(q6 + 192, 2, 16);
    q6[208] = 0x00, q6[209] = 0x38;
    for (int j = 0; j < 256; j++)
        assert_true(dol_blk_weight(DOL_DTYPE_Q6_K, q6, j) == (((j % 128) / 32) & 2 ? 2 - 32 : 1 - 32));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry),
        cmocka_unit_test(test_panels_and_dequantize),
        cmocka_unit_test(test_products_batch_invariant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
