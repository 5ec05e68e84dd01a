/* tests/cuda/test_cuda_blocks.c — the GGUF block-type kernels
 * (kernels/ggml_blocks.cu) against the CPU's exact dequantization
 * (dol_dequantize, src/model/dtype.c), for each of the ten types on random
 * matrices (random bytes, finite random scales: every quant pattern) with
 * odd row counts and K of one and several blocks:
 *   - dequantization to FP16: bit for bit dol_f32_to_f16 of the CPU's floats;
 *   - embedding rows: bit for bit the CPU's floats;
 *   - the decode kernel at T = 1, 2, 3, 8 into a wider output (ldo > N):
 *     element-wise within GEMV_REL of sum |x * w| against the exact product
 *     in double of the same FP16 x and the exact weights, the columns past N
 *     untouched, and each output row bit-identical whatever T is;
 *   - the matmul at T = 17 and 33 (dequantized FP16 tiles of 3 rows and of
 *     the whole matrix, then cuBLAS) within TILE_REL (FP16 weights: 2^-11
 *     relative, plus FP32 accumulation);
 *   - malformed calls refused: T past the kernel's most, ldo < N, another
 *     type, a workspace under one row.
 * Exits 77 (skipped) without a usable CUDA device (1 under the emulation,
 * whose device is always there). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#define CUDA_TEST_SEED 0x3C6EF372FE94F82Bull
#include "cuda_test_util.h"
#include "dolphin/model.h"
#include "engine/backend.h"
#include "kernels/kernels.h"

static double uniform(void) { return (double)(next_u64() >> 11) / 9007199254740992.0; }
static float gaussian(void)
{
    const double u = uniform(), v = uniform();
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(2.0 * M_PI * v));
}
#include "../unit/test_ggml_random.h"

#define GEMV_REL 1e-5
#define TILE_REL 1.5e-3

static const dol_dtype TYPES[] = {DOL_DTYPE_Q8_0, DOL_DTYPE_Q4_0, DOL_DTYPE_Q4_1, DOL_DTYPE_Q5_0,
                                  DOL_DTYPE_Q5_1, DOL_DTYPE_Q2_K, DOL_DTYPE_Q3_K, DOL_DTYPE_Q4_K,
                                  DOL_DTYPE_Q5_K, DOL_DTYPE_Q6_K};
#define N_TYPES ((int)(sizeof TYPES / sizeof TYPES[0]))

typedef struct {
    dol_dtype t;
    int N, K;
    uint8_t *h;     /* the blocks, host */
    float *w;       /* [N][K] the exact weights */
    dol_cuda_blk d; /* the blocks, device */
} blk_mat;

static blk_mat make(dol_dtype t, int N, int K)
{
    blk_mat m = {.t = t, .N = N, .K = K};
    m.h = random_matrix(t, N, K);
    const size_t rb = dol_dtype_row_bytes(t, K);
    m.w = malloc(sizeof(float) * (size_t)N * K);
    assert_non_null(m.w);
    dol_dequantize(t, m.h, m.w, (int64_t)N * K);
    m.d = (dol_cuda_blk){.data = dup_to_dev(m.h, rb * (size_t)N), .type = (int)t, .rows = N,
                         .cols = K, .block = dol_dtype_block(t),
                         .block_bytes = (int)dol_dtype_block_bytes(t), .row_bytes = rb};
    return m;
}

static void drop(blk_mat *m)
{
    cudaFree((void *)m->d.data);
    free(m->h);
    free(m->w);
}

/* The shapes of type t: K of one block and of several, N not a multiple of
 * the kernel's 4 rows. */
static int shapes(dol_dtype t, int out[3][2])
{
    const int B = dol_dtype_block(t);
    const int s[3][2] = {{5, B}, {37, 3 * B}, {130, B == 32 ? 256 : 512}};
    memcpy(out, s, sizeof s);
    return 3;
}

static void test_dequant_and_embedding(void **state)
{
    (void)state;
    for (int ti = 0; ti < N_TYPES; ti++) {
        int sh[3][2];
        const int ns = shapes(TYPES[ti], sh);
        for (int si = 0; si < ns; si++) {
            blk_mat m = make(TYPES[ti], sh[si][0], sh[si][1]);
            const int N = m.N, K = m.K, row0 = N > 3 ? 2 : 0, rows = N - row0;
            dol_f16 *dw = dmalloc(sizeof(dol_f16) * (size_t)rows * K);
            CK(dol_cuda_blk_dequant(dw, &m.d, row0, rows, NULL));
            dol_f16 *hw = malloc(sizeof(dol_f16) * (size_t)rows * K);
            to_host(hw, dw, sizeof(dol_f16) * (size_t)rows * K);
            for (int i = 0; i < rows * K; i++)
                if (hw[i] != dol_f32_to_f16(m.w[(size_t)row0 * K + i]))
                    fail_msg("%s %dx%d: dequantized weight %d of row %d: %04x, want %04x",
                             dol_dtype_name(m.t), N, K, i % K, row0 + i / K, hw[i],
                             dol_f32_to_f16(m.w[(size_t)row0 * K + i]));
            const int32_t ids[3] = {N - 1, 0, 3 % N};
            int32_t *did = dup_to_dev(ids, sizeof ids);
            float *dx = dmalloc(sizeof(float) * 3 * (size_t)K), *hx = malloc(sizeof(float) * 3 * (size_t)K);
            CK(dol_cuda_blk_embedding(dx, &m.d, did, 3, NULL));
            to_host(hx, dx, sizeof(float) * 3 * (size_t)K);
            for (int t = 0; t < 3; t++)
                if (memcmp(hx + (size_t)t * K, m.w + (size_t)ids[t] * K, sizeof(float) * (size_t)K) != 0)
                    fail_msg("%s %dx%d: embedding row %d differs from the CPU's", dol_dtype_name(m.t),
                             N, K, ids[t]);
            cudaFree(dw);
            cudaFree(did);
            cudaFree(dx);
            free(hw);
            free(hx);
            drop(&m);
        }
    }
}

/* The exact product of the FP16 x [T][K] and the weights, and sum |x * w|. */
static void reference(const blk_mat *m, const dol_f16 *x, int T, double *ref, double *mag)
{
    for (int t = 0; t < T; t++)
        for (int n = 0; n < m->N; n++) {
            double s = 0, a = 0;
            for (int k = 0; k < m->K; k++) {
                const double p = (double)dol_f16_to_f32(x[(size_t)t * m->K + k]) *
                                 (double)m->w[(size_t)n * m->K + k];
                s += p;
                a += fabs(p);
            }
            ref[(size_t)t * m->N + n] = s;
            mag[(size_t)t * m->N + n] = a;
        }
}

static void test_products(void **state)
{
    (void)state;
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) fail_msg("cublasCreate failed");
    enum { TMAX = 33, PAD = 5 };
    for (int ti = 0; ti < N_TYPES; ti++) {
        int sh[3][2];
        const int ns = shapes(TYPES[ti], sh);
        for (int si = 0; si < ns; si++) {
            blk_mat m = make(TYPES[ti], sh[si][0], sh[si][1]);
            const int N = m.N, K = m.K, ldo = N + PAD;
            const char *name = dol_dtype_name(m.t);
            dol_f16 *hx = malloc(sizeof(dol_f16) * (size_t)TMAX * K);
            for (int i = 0; i < TMAX * K; i++) hx[i] = dol_f32_to_f16(urand(1.0f));
            double *ref = malloc(sizeof(double) * (size_t)TMAX * N);
            double *mag = malloc(sizeof(double) * (size_t)TMAX * N);
            reference(&m, hx, TMAX, ref, mag);
            dol_f16 *dx = dup_to_dev(hx, sizeof(dol_f16) * (size_t)TMAX * K);
            const size_t out_n = (size_t)TMAX * ldo;
            float *dout = dmalloc(sizeof(float) * out_n), *got = malloc(sizeof(float) * out_n);
            float *one = malloc(sizeof(float) * (size_t)TMAX * N); /* row t alone, T = 1 */

            /* the decode kernel one row at a time: the bits every T must give */
            for (int t = 0; t < 8; t++) {
                CK(dol_cuda_blk_gemv(dout, ldo, dx + (size_t)t * K, 1, &m.d, NULL));
                to_host(got, dout, sizeof(float) * (size_t)N);
                memcpy(one + (size_t)t * N, got, sizeof(float) * (size_t)N);
            }
            const int Ts[] = {1, 2, 3, 8};
            for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
                const int T = Ts[k];
                for (size_t i = 0; i < out_n; i++) got[i] = NAN;
                CK(cudaMemcpy(dout, got, sizeof(float) * out_n, cudaMemcpyHostToDevice));
                CK(dol_cuda_blk_gemv(dout, ldo, dx, T, &m.d, NULL));
                to_host(got, dout, sizeof(float) * out_n);
                for (int t = 0; t < T; t++) {
                    for (int n = 0; n < N; n++) {
                        const float g = got[(size_t)t * ldo + n];
                        const size_t r = (size_t)t * N + n;
                        if (!(fabs(g - ref[r]) <= GEMV_REL * mag[r] + 1e-30))
                            fail_msg("%s %dx%d T=%d: out[%d][%d] = %.9g, exact %.9g (bound %.3g)",
                                     name, N, K, T, t, n, g, ref[r], GEMV_REL * mag[r]);
                        if (memcmp(&g, &one[r], sizeof g) != 0)
                            fail_msg("%s %dx%d: out[%d][%d] at T=%d differs from T=1 (%.9g vs %.9g)",
                                     name, N, K, t, n, T, g, one[r]);
                    }
                    for (int n = N; n < ldo; n++)
                        if (!isnan(got[(size_t)t * ldo + n]))
                            fail_msg("%s %dx%d T=%d: column %d past N written", name, N, K, T, n);
                }
            }

            /* more rows: dequantized tiles of 3 rows and of the whole matrix */
            const size_t ws_rows[2] = {3, (size_t)N};
            for (int wi = 0; wi < 2; wi++) {
                const size_t ws_elems = ws_rows[wi] * (size_t)K;
                dol_f16 *ws = dmalloc(sizeof(dol_f16) * ws_elems);
                const int Tt[] = {17, TMAX};
                for (size_t k = 0; k < 2; k++) {
                    const int T = Tt[k];
                    char err[DOL_ERR_LEN] = "";
                    if (dol_cuda_blk_matmul(blas, dout, ldo, dx, T, &m.d, ws, ws_elems, NULL, err,
                                            sizeof err) != 0)
                        fail_msg("%s %dx%d T=%d: %s", name, N, K, T, err);
                    to_host(got, dout, sizeof(float) * out_n);
                    for (int t = 0; t < T; t++)
                        for (int n = 0; n < N; n++) {
                            const size_t r = (size_t)t * N + n;
                            const float g = got[(size_t)t * ldo + n];
                            if (!(fabs(g - ref[r]) <= TILE_REL * mag[r] + 1e-30))
                                fail_msg("%s %dx%d T=%d tiles of %zu rows: out[%d][%d] = %.9g, "
                                         "exact %.9g (bound %.3g)", name, N, K, T, ws_rows[wi], t,
                                         n, g, ref[r], TILE_REL * mag[r]);
                        }
                }
                cudaFree(ws);
            }

            /* refused */
            assert_int_equal(dol_cuda_blk_gemv(dout, ldo, dx, DOL_CUDA_BLK_GEMV_MAX_T + 1, &m.d, NULL),
                             cudaErrorInvalidValue);
            assert_int_equal(dol_cuda_blk_gemv(dout, N - 1, dx, 1, &m.d, NULL), cudaErrorInvalidValue);
            dol_cuda_blk bad = m.d;
            bad.type = DOL_DTYPE_F16;
            assert_int_equal(dol_cuda_blk_gemv(dout, ldo, dx, 1, &bad, NULL), cudaErrorInvalidValue);
            bad = m.d;
            bad.row_bytes += 1;
            assert_int_equal(dol_cuda_blk_dequant((dol_f16 *)dout, &bad, 0, 1, NULL), cudaErrorInvalidValue);
            char err[DOL_ERR_LEN] = "";
            assert_int_equal(dol_cuda_blk_matmul(blas, dout, ldo, dx, 17, &m.d, NULL, 0, NULL, err,
                                                 sizeof err), -1);
            assert_non_null(strstr(err, "workspace"));
            (void)cudaGetLastError();

            cudaFree(dx);
            cudaFree(dout);
            free(hx);
            free(ref);
            free(mag);
            free(got);
            free(one);
            drop(&m);
        }
    }
    cublasDestroy(blas);
}

int main(void)
{
    char why[256];
    if (!dol_cuda_device_check(why, sizeof why)) {
        printf("test_cuda_blocks: no usable CUDA device (%s); skipping\n", why);
#ifdef DOLPHIN_CUDA_EMU
        return 1;
#else
        return 77;
#endif
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_and_embedding),
        cmocka_unit_test(test_products),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
