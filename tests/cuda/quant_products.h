/* tests/cuda/quant_products.h — the harness of the CUDA tests of a weight
 * quantization scheme (tests/cuda/test_cuda_nf4.c, test_cuda_q8.c): each
 * file describes its scheme in a quant_scheme (quantizer, kernels, CPU
 * reference, shapes, bounds) and calls quant_test_main. The tests:
 *   - products: random matrices (blocks of very different scales, all-zero
 *     blocks) at every shape and T of the scheme, through the scheme's matmul
 *     (decode kernel up to gemv_upto rows, dequantized tiles of 3 rows and of
 *     the whole matrix above), element-wise against the exact product in
 *     double of the same FP16 x and the exact dequantized weights, and
 *     against the CPU reference on the FP32 x within NORM_REL of the
 *     output's norm; the decode kernel's rows bit-identical whatever T, the
 *     generic kernel (misaligned x) within the same bound; a workspace under
 *     one row and T > gemv_max_t refused;
 *   - dequantization: bit for bit the FP16 rounding of the host's weights;
 *   - stories260K with the scheme on the CPU and on CUDA: logits after the
 *     prompt within LOGIT_BOUND, greedy ids equal up to the first step where
 *     the CPU's margin is below MARGIN_BOUND, the teacher-forced pass within
 *     ECHO_BOUND.
 * The bounds are derived in test_cuda_nf4.c. Include once, after <cmocka.h>. */
#ifndef DOLPHIN_QUANT_PRODUCTS_H
#define DOLPHIN_QUANT_PRODUCTS_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "../unit/test_fixtures.h"
#include "cuda_test_util.h"
#include "dolphin/engine.h"
#include "dolphin/model.h"
#include "engine/backend.h"
#include "engine/cpu_ops.h"
#include "kernels/kernels.h"

#define GEMV_REL 1e-5
#define NORM_REL 2e-3
#define LOGIT_BOUND 0.03
#define MARGIN_BOUND (2 * LOGIT_BOUND)
#define ECHO_BOUND 0.06
#define ECHO_TOKENS_MAX 96

/* A random matrix of the scheme: host and device copies and its exact weights. */
typedef struct {
    int N, K;
    void *h;  /* the scheme's host matrix (dol_nf4_matrix, dol_q8_matrix) */
    void *d;  /* the scheme's device matrix (dol_cuda_nf4, dol_cuda_q8) */
    float *w; /* [N][K] dequantized on the host: the exact weights */
} quant_mat;

typedef struct {
    int N, K;
} quant_shape;

typedef struct {
    const char *name;  /* in messages and file names: "nf4", "int8" */
    const char *test;  /* the test binary's name */
    int block;         /* weights per block (the scale's span) */
    int gemv_upto;     /* the matmul's decode-kernel row limit */
    int gemv_max_t;    /* the decode kernel's rows per launch */
    /* m->h, m->d and m->w from src [m->N][m->K] (FP32), failing the test on error */
    void (*quantize)(quant_mat *m, const float *src);
    void (*free_mat)(quant_mat *m);
    void (*cpu_matmul)(float *out, const float *x, int T, const void *h);
    int (*matmul)(cublasHandle_t blas, float *out, const dol_f16 *x, int T, const void *d,
                  dol_f16 *ws, size_t ws_elems, cudaStream_t stream, char *err, size_t errlen);
    cudaError_t (*gemv)(float *out, const dol_f16 *x, int T, const void *d, cudaStream_t stream);
    cudaError_t (*dequant)(dol_f16 *w, const void *d, int row0, int rows, cudaStream_t stream);
    const quant_shape *shapes, *dequant_shapes; /* products; dequantization */
    int n_shapes, n_dequant_shapes;
    /* the model test */
    dol_weight_format weights;
    double max_ratio;   /* linear layers' bytes / F16 bytes, lm_head quantized */
    int max_new;        /* greedy steps per case at most */
    int echo_tokens;    /* positions of the teacher-forced pass at most (<= ECHO_TOKENS_MAX) */
    bool f16_lm_head;   /* also the case with lm_head kept */
} quant_scheme;

static const quant_scheme *g_scheme;
static char g_shared[1024];

/* ---- random matrices --------------------------------------------------------- */

/* Blocks of very different magnitudes, some all zero. */
static quant_mat make_mat(int N, int K)
{
    static const float amp[] = { 0.0f, 1e-3f, 0.05f, 1.0f, 30.0f };
    const int B = g_scheme->block;
    quant_mat m = { .N = N, .K = K };
    float *src = malloc(sizeof(float) * (size_t)N * K);
    for (int r = 0; r < N; r++)
        for (int k0 = 0; k0 < K; k0 += B) {
            float a = amp[irand(5)];
            for (int k = k0; k < K && k < k0 + B; k++) src[(size_t)r * K + k] = urand(a);
        }
    g_scheme->quantize(&m, src);
    free(src);
    return m;
}

/* ---- the products ------------------------------------------------------------ */

typedef struct {
    int T, N, K;
    float *x32;       /* [T][K] */
    dol_f16 *x16;     /* the same, rounded to FP16 */
    double *exact;    /* [T][N]: sum x16 * w in double */
    double *mag;      /* [T][N]: sum |x16 * w| */
    double *xabs;     /* [T]: sum |x16| */
    float *cpu;       /* [T][N]: the CPU reference on x32 */
} product_ref;

static product_ref make_ref(const quant_mat *m, int T)
{
    const int N = m->N, K = m->K;
    product_ref p = { .T = T, .N = N, .K = K };
    p.x32 = malloc(sizeof(float) * (size_t)T * K);
    p.x16 = malloc(sizeof(dol_f16) * (size_t)T * K);
    p.exact = malloc(sizeof(double) * (size_t)T * N);
    p.mag = malloc(sizeof(double) * (size_t)T * N);
    p.xabs = malloc(sizeof(double) * (size_t)T);
    p.cpu = malloc(sizeof(float) * (size_t)T * N);
    for (size_t i = 0; i < (size_t)T * K; i++) {
        p.x32[i] = urand(2.0f);
        p.x16[i] = dol_f32_to_f16(p.x32[i]);
    }
    for (int t = 0; t < T; t++) {
        p.xabs[t] = 0;
        for (int k = 0; k < K; k++) p.xabs[t] += fabs(dol_f16_to_f32(p.x16[(size_t)t * K + k]));
        for (int n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int k = 0; k < K; k++) {
                double v = (double)dol_f16_to_f32(p.x16[(size_t)t * K + k]) * m->w[(size_t)n * K + k];
                s += v;
                a += fabs(v);
            }
            p.exact[(size_t)t * N + n] = s;
            p.mag[(size_t)t * N + n] = a;
        }
    }
    g_scheme->cpu_matmul(p.cpu, p.x32, T, m->h);
    return p;
}

static void free_ref(product_ref *p)
{
    free(p->x32); free(p->x16); free(p->exact); free(p->mag); free(p->xabs); free(p->cpu);
}

/* got against the exact product (element-wise) and the CPU reference (norm). */
static void check_got(const char *what, const product_ref *p, const float *got, bool tiled)
{
    const double rel = tiled ? ldexp(1.0, -11) + p->K * ldexp(1.0, -23) : GEMV_REL;
    double diff2 = 0, norm2 = 0;
    for (int t = 0; t < p->T; t++)
        for (int n = 0; n < p->N; n++) {
            const size_t i = (size_t)t * p->N + n;
            const double bound = rel * p->mag[i] + (tiled ? ldexp(p->xabs[t], -25) : 0.0) + 1e-30;
            const double err = fabs((double)got[i] - p->exact[i]);
            if (!(err <= bound))
                fail_msg("%s T=%d N=%d K=%d: out[%d][%d] = %.9g, exact %.9g (|diff| %.3g > bound %.3g)",
                         what, p->T, p->N, p->K, t, n, got[i], p->exact[i], err, bound);
            diff2 += ((double)got[i] - p->cpu[i]) * ((double)got[i] - p->cpu[i]);
            norm2 += (double)p->cpu[i] * p->cpu[i];
        }
    if (p->T * p->N >= 32 && !(sqrt(diff2) <= NORM_REL * sqrt(norm2)))
        fail_msg("%s T=%d N=%d K=%d: |got - cpu| = %.3g of |cpu| (> %.0e)", what, p->T, p->N, p->K,
                 sqrt(diff2 / norm2), NORM_REL);
}

static void test_products(void **state)
{
    (void)state;
    const quant_scheme *S = g_scheme;
    static const int Ts[] = { 1, 2, 3, 8, 16, 17, 33 };
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) fail_msg("cublasCreate failed");
    char err[DOL_ERR_LEN];
    for (int si = 0; si < S->n_shapes; si++) {
        quant_mat m = make_mat(S->shapes[si].N, S->shapes[si].K);
        const int N = m.N, K = m.K;
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int T = Ts[ti];
            product_ref p = make_ref(&m, T);
            dol_f16 *d_x = dup_to_dev(p.x16, sizeof(dol_f16) * (size_t)T * K);
            float *d_out = dmalloc(sizeof(float) * (size_t)T * N);
            float *got = malloc(sizeof(float) * (size_t)T * N);
            const bool tiled = T > S->gemv_upto;
            /* small workspace: tiles of 3 rows, the last one partial */
            const size_t ws_small = 3 * (size_t)K + 5;
            dol_f16 *d_ws = dmalloc(sizeof(dol_f16) * (size_t)N * K);
            CK(cudaMemset(d_out, 0xff, sizeof(float) * (size_t)T * N)); /* NaN: every output written */
            if (S->matmul(blas, d_out, d_x, T, m.d, d_ws, ws_small, NULL, err, sizeof err) != 0)
                fail_msg("%s", err);
            to_host(got, d_out, sizeof(float) * (size_t)T * N);
            check_got(tiled ? "tiles of 3 rows" : "decode kernel", &p, got, tiled);
            if (tiled) {
                /* the whole matrix in one tile */
                CK(cudaMemset(d_out, 0xff, sizeof(float) * (size_t)T * N));
                if (S->matmul(blas, d_out, d_x, T, m.d, d_ws, (size_t)N * K, NULL, err, sizeof err))
                    fail_msg("%s", err);
                to_host(got, d_out, sizeof(float) * (size_t)T * N);
                check_got("one tile", &p, got, true);
                /* a workspace smaller than one row is refused with a message */
                err[0] = 0;
                assert_int_equal(S->matmul(blas, d_out, d_x, T, m.d, d_ws, (size_t)K - 1, NULL, err,
                                           sizeof err), -1);
                assert_true(err[0] != 0);
            } else {
                /* batch invariance: row t alone gives the same bits */
                float *one = malloc(sizeof(float) * (size_t)N);
                for (int t = 0; t < T; t++) {
                    CK(S->gemv(d_out, d_x + (size_t)t * K, 1, m.d, NULL));
                    to_host(one, d_out, sizeof(float) * (size_t)N);
                    if (memcmp(one, got + (size_t)t * N, sizeof(float) * (size_t)N) != 0)
                        fail_msg("decode kernel N=%d K=%d: row %d of T=%d differs from the row alone", N, K, t, T);
                }
                free(one);
                /* the generic kernel: x one FP16 value off 16-byte alignment */
                if (T <= S->gemv_max_t) {
                    dol_f16 *d_xo = dmalloc(sizeof(dol_f16) * ((size_t)T * K + 1));
                    CK(cudaMemcpy(d_xo + 1, p.x16, sizeof(dol_f16) * (size_t)T * K, cudaMemcpyHostToDevice));
                    CK(cudaMemset(d_out, 0xff, sizeof(float) * (size_t)T * N));
                    CK(S->gemv(d_out, d_xo + 1, T, m.d, NULL));
                    to_host(got, d_out, sizeof(float) * (size_t)T * N);
                    check_got("generic decode kernel", &p, got, false);
                    cudaFree(d_xo);
                }
            }
            cudaFree(d_x);
            cudaFree(d_out);
            cudaFree(d_ws);
            free(got);
            free_ref(&p);
        }
        S->free_mat(&m);
    }
    /* launches the decode kernel refuses */
    {
        quant_mat m = make_mat(4, 64);
        dol_f16 *d_x = dmalloc(sizeof(dol_f16) * 9 * 64);
        float *d_out = dmalloc(sizeof(float) * 9 * 4);
        assert_int_equal(S->gemv(d_out, d_x, S->gemv_max_t + 1, m.d, NULL), cudaErrorInvalidValue);
        cudaFree(d_x);
        cudaFree(d_out);
        S->free_mat(&m);
    }
    cublasDestroy(blas);
}

/* The device dequantization: exactly dol_f32_to_f16 of the host's
 * dequantized floats, for all rows and for a range starting inside the
 * matrix; a range past the last row refused. */
static void test_dequant_exact(void **state)
{
    (void)state;
    const quant_scheme *S = g_scheme;
    for (int si = 0; si < S->n_dequant_shapes; si++) {
        quant_mat m = make_mat(S->dequant_shapes[si].N, S->dequant_shapes[si].K);
        const int N = m.N, K = m.K;
        dol_f16 *d_w = dmalloc(sizeof(dol_f16) * (size_t)N * K);
        dol_f16 *got = malloc(sizeof(dol_f16) * (size_t)N * K);
        const int ranges[2][2] = { { 0, N }, { N / 3, N - N / 3 } };
        for (int ri = 0; ri < 2; ri++) {
            const int row0 = ranges[ri][0], rows = ranges[ri][1];
            CK(S->dequant(d_w, m.d, row0, rows, NULL));
            to_host(got, d_w, sizeof(dol_f16) * (size_t)rows * K);
            for (int r = 0; r < rows; r++)
                for (int k = 0; k < K; k++) {
                    const float w = m.w[(size_t)(row0 + r) * K + k];
                    const dol_f16 want = dol_f32_to_f16(w);
                    if (got[(size_t)r * K + k] != want)
                        fail_msg("dequant N=%d K=%d row %d k %d: 0x%04x, want 0x%04x (%.9g)", N, K, row0 + r, k,
                                 got[(size_t)r * K + k], want, w);
                }
        }
        assert_int_equal(S->dequant(d_w, m.d, N - 1, 2, NULL), cudaErrorInvalidValue);
        cudaFree(d_w);
        free(got);
        S->free_mat(&m);
    }
}

/* ---- stories260K: the CUDA backend against the CPU backend, both quantized -- */

static dol_engine *open_engine(const dol_model *m, dol_backend_kind backend, bool quantize_lm_head)
{
    /* the CPU reference keeps an F32 KV cache (CUDA's is F16 whatever is
     * asked), as when the bounds were derived: the F16 cache's own rounding
     * is not what these tests measure */
    dol_engine_params p = { .activations = DOL_ACT_F32, .backend = backend, .gpu_memory_utilization = 0.90, .n_threads = 2,
                            .kv_block_size = 16, .kv_cache_tokens = 4096, .max_seqs = 4,
                            .max_batch_tokens = 1024, .weights = g_scheme->weights,
                            .quantize_lm_head = quantize_lm_head, .kv_dtype = DOL_KV_F32 };
    dol_engine *e = NULL;
    char err[DOL_ERR_LEN];
    if (dol_engine_create(m, &p, &e, err, sizeof err) != 0) fail_msg("%s", err);
    assert_string_equal(dol_engine_backend_name(e), backend == DOL_BACKEND_CUDA ? "cuda" : "cpu");
    return e;
}

static void stories_case(const dol_model *m, const cJSON *golden, bool quantize_lm_head)
{
    const quant_scheme *S = g_scheme;
    dol_engine *cpu = open_engine(m, DOL_BACKEND_CPU, quantize_lm_head);
    dol_engine *gpu = open_engine(m, DOL_BACKEND_CUDA, quantize_lm_head);
    const char *head = quantize_lm_head ? S->name : "f16";

    /* the same matrices quantized, the same sizes (lm_head's held format
     * differs when it is not quantized: F32 on the CPU, FP16 on CUDA) */
    dol_quant_stats qc, qg;
    dol_engine_quant_stats(cpu, &qc);
    dol_engine_quant_stats(gpu, &qg);
    const int want_n = 7 * m->cfg.n_layers + (quantize_lm_head ? 1 : 0);
    assert_int_equal(qc.n_quantized, want_n);
    assert_int_equal(qg.n_quantized, want_n);
    assert_true(qg.quant_bytes_before == qc.quant_bytes_before);
    assert_true(qg.quant_bytes_after == qc.quant_bytes_after);
    assert_true(qg.linear_f16_bytes == qc.linear_f16_bytes);
    if (quantize_lm_head) {
        assert_true(qg.linear_bytes == qc.linear_bytes);
        const double ratio = (double)qg.linear_bytes / (double)qg.linear_f16_bytes;
        printf("stories260K %s on CUDA: linear layers %.3f x F16, %zu -> %zu bytes quantized\n", S->name,
               ratio, qg.quant_bytes_before, qg.quant_bytes_after);
        assert_true(ratio <= S->max_ratio);
    }

    const int V = dol_engine_vocab_size(gpu);
    float *lc = malloc(sizeof(float) * (size_t)V), *lg = malloc(sizeof(float) * (size_t)V);
    int32_t longest[ECHO_TOKENS_MAX];
    const int echo_max = S->echo_tokens < ECHO_TOKENS_MAX ? S->echo_tokens : ECHO_TOKENS_MAX;
    int n_longest = 0;
    const cJSON *c;
    int cases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(golden, "cases")) {
        int32_t prompt[1024], ids_c[1024], ids_g[1024];
        double mc[1024], mg[1024];
        const int np = fixture_ids(cJSON_GetObjectItem(c, "prompt_ids"), prompt, 1024);
        int max_new = cJSON_GetObjectItem(c, "max_tokens")->valueint;
        if (max_new > S->max_new) max_new = S->max_new;
        const int nc = test_greedy(cpu, prompt, np, max_new, ids_c, mc, lc);
        const int ng = test_greedy(gpu, prompt, np, max_new, ids_g, mg, lg);
        const double first = fixture_max_abs_diff(lc, lg, (size_t)V);
        int trusted = 0; /* steps before the CPU's first margin below the bound */
        while (trusted < nc && mc[trusted] >= MARGIN_BOUND) trusted++;
        int same = 0;
        while (same < nc && same < ng && ids_c[same] == ids_g[same]) same++;
        printf("stories260K %s lm_head %s case %d: logits after the prompt within %.4f; %d of %d CPU ids "
               "reproduced (%d trusted at margin >= %.2f)\n",
               S->name, head, cases, first, same, nc, trusted, MARGIN_BOUND);
        if (!(first <= LOGIT_BOUND))
            fail_msg("case %d: logits after the prompt differ by %.5f (> %.2f)", cases, first, LOGIT_BOUND);
        if (same < trusted)
            fail_msg("case %d step %d: CUDA id %d, CPU id %d (CPU margin %.4f)", cases, same,
                     same < ng ? ids_g[same] : -1, ids_c[same], mc[same]);
        if (np + nc > n_longest) { /* the prompt and the CPU's ids, for the pass below */
            n_longest = 0;
            for (int i = 0; i < np && n_longest < echo_max; i++) longest[n_longest++] = prompt[i];
            for (int i = 0; i < nc && n_longest < echo_max; i++) longest[n_longest++] = ids_c[i];
        }
        cases++;
    }
    assert_true(cases > 0);

    /* teacher-forced: every position's logits in one call (more rows than
     * gemv_upto: every product through the dequantized tiles) */
    float *ec = malloc(sizeof(float) * (size_t)n_longest * V), *eg = malloc(sizeof(float) * (size_t)n_longest * V);
    test_forward_all(cpu, longest, n_longest, ec);
    test_forward_all(gpu, longest, n_longest, eg);
    const double ed = fixture_max_abs_diff(ec, eg, (size_t)n_longest * V);
    printf("stories260K %s lm_head %s: %d teacher-forced positions within %.4f\n", S->name, head,
           n_longest, ed);
    if (!(ed <= ECHO_BOUND)) fail_msg("teacher-forced logits differ by %.5f (> %.2f)", ed, ECHO_BOUND);

    free(ec); free(eg); free(lc); free(lg);
    dol_engine_free(gpu);
    dol_engine_free(cpu);
}

static void test_stories260K(void **state)
{
    (void)state;
    if (!g_shared[0]) skip();
    char path[1400];
    snprintf(path, sizeof path, "%s/golden/stories260K.json", g_shared);
    cJSON *golden = fixture_json_at(path);
    if (!golden) skip();
    char dir[1200], err[DOL_ERR_LEN];
    snprintf(dir, sizeof dir, "%s/models/stories260K", g_shared);
    dol_model *m = NULL;
    if (dol_model_load(dir, &m, err, sizeof err) != 0) fail_msg("%s", err);
    stories_case(m, golden, true);
    if (g_scheme->f16_lm_head) stories_case(m, golden, false);
    dol_model_free(m);
    cJSON_Delete(golden);
}

static void find_shared(void)
{
    const char *env = getenv("DOLPHIN_SHARED");
    const char *cands[] = { env, "../shared", "shared", "../../shared" };
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        if (!cands[i] || !cands[i][0]) continue;
        char p[1100];
        snprintf(p, sizeof p, "%s/golden/stories260K.json", cands[i]);
        FILE *f = fopen(p, "rb");
        if (f) {
            fclose(f);
            snprintf(g_shared, sizeof g_shared, "%s", cands[i]);
            return;
        }
    }
}

/* The test program of scheme S: 77 (skipped) without a usable CUDA device
 * (a failure under the emulation, whose device is always there). */
static int quant_test_main(const quant_scheme *S)
{
    char why[256];
    if (!dol_cuda_device_check(why, sizeof why)) {
        printf("%s: no usable CUDA device (%s); skipping\n", S->test, why);
#ifdef DOLPHIN_CUDA_EMU
        return 1;
#else
        return 77;
#endif
    }
    g_scheme = S;
    find_shared();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_exact),
        cmocka_unit_test(test_products),
        cmocka_unit_test(test_stories260K),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
