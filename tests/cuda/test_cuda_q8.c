/* tests/cuda/test_cuda_q8.c — Q8_0 (int8) weights on CUDA (kernels/q8.cu and
 * the CUDA backend with weights int8) against the CPU Q8_0 reference
 * (src/engine/q8.c, dol_cpu_matmul_q8, the CPU backend), as
 * test_cuda_nf4.c does for NF4 and with its bounds (derived there; the same
 * FP32 chains and FP16 rounding points apply with 32-weight blocks). Exits
 * 77 (skipped) without a usable CUDA device; the model test skips without
 * the fixtures (../shared, env DOLPHIN_SHARED).
 *
 * The products, on random matrices quantized by dol_q8_quantize (blocks of
 * very different scales, all-zero blocks), on odd shapes (K a multiple of
 * 32 and not: short last blocks, K = 1, 3, 33, 97, 172), T = 1, 2, 3, 8, 16
 * (decode kernel) and 17, 33 (dequantized tiles + cuBLAS), element-wise
 * against the exact product in double of the same FP16 x and the exact
 * dequantized weights, and against dol_cpu_matmul_q8 on the FP32 x within
 * NORM_REL of the output's norm; the decode kernel's rows bit-identical
 * whatever T; the dequantization bit for bit (dol_cuda_q8_dequant ==
 * dol_f32_to_f16 of dol_q8_dequantize_row). The model: stories260K with
 * weights int8 on the CPU and on CUDA (lm_head int8 too: the default, kept,
 * runs in test_cuda_quant_golden; up to 64 greedy ids per case, as the
 * emulation is slow): logits
 * after the prompt within LOGIT_BOUND, greedy ids equal up to the first
 * step where the CPU's margin is below 2 * LOGIT_BOUND, every position of a
 * teacher-forced pass within ECHO_BOUND. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "../fixtures.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "dolphin/engine.h"
#include "dolphin/model.h"
#include "engine/backend.h"
#include "engine/cpu_ops.h"
#include "engine/q8.h"
#include "kernels/kernels.h"

#define GEMV_REL 1e-5
#define NORM_REL 2e-3
#define LOGIT_BOUND 0.03
#define MARGIN_BOUND (2 * LOGIT_BOUND)
#define ECHO_BOUND 0.06
#define ECHO_TOKENS 64

static char g_shared[1024];

/* ---- helpers ------------------------------------------------------------- */

#define CK(call)                                                                            \
    do {                                                                                    \
        cudaError_t rc_ = (call);                                                           \
        if (rc_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(rc_));         \
    } while (0)

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint64_t next_u64(void)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform in [-a, a] */
static float urand(float a) { return (float)((double)(next_u64() >> 11) / 9007199254740992.0 * 2.0 - 1.0) * a; }
static int irand(int n) { return (int)(next_u64() % (uint64_t)n); }

static void *dmalloc(size_t bytes)
{
    void *p = NULL;
    CK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}
static void *dup_to_dev(const void *h, size_t bytes)
{
    void *d = dmalloc(bytes);
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static void to_host(void *h, const void *d, size_t bytes)
{
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* ---- random Q8_0 matrices --------------------------------------------------- */

typedef struct {
    int N, K;
    dol_q8_matrix h; /* host quants and scales (q8.c) */
    float *w;         /* [N][K] dequantized on the host: the exact weights */
    dol_cuda_q8 d;   /* device copy */
} q8_mat;

/* Blocks of very different magnitudes, some all zero (scale 0, quants 0). */
static q8_mat make_mat(int N, int K)
{
    static const float amp[] = { 0.0f, 1e-3f, 0.05f, 1.0f, 30.0f };
    q8_mat m = { .N = N, .K = K };
    float *src = malloc(sizeof(float) * (size_t)N * K);
    for (int r = 0; r < N; r++)
        for (int k0 = 0; k0 < K; k0 += DOL_Q8_BLOCK) {
            float a = amp[irand(5)];
            for (int k = k0; k < K && k < k0 + DOL_Q8_BLOCK; k++) src[(size_t)r * K + k] = urand(a);
        }
    dol_tensor t = { DOL_DTYPE_F32, N, K, src };
    m.h.quants = malloc(dol_q8_quants_bytes(N, K));
    m.h.scales = malloc(dol_q8_scales_bytes(N, K));
    char err[DOL_ERR_LEN];
    if (dol_q8_quantize(NULL, &t, &m.h, "test matrix", err, sizeof err) != 0) fail_msg("%s", err);
    m.w = malloc(sizeof(float) * (size_t)N * K);
    for (int r = 0; r < N; r++) dol_q8_dequantize_row(&m.h, r, m.w + (size_t)r * K);
    m.d.quants = dup_to_dev(m.h.quants, dol_q8_quants_bytes(N, K));
    m.d.scales = dup_to_dev(m.h.scales, dol_q8_scales_bytes(N, K));
    m.d.rows = N;
    m.d.cols = K;
    free(src);
    return m;
}

static void free_mat(q8_mat *m)
{
    cudaFree((void *)m->d.quants);
    cudaFree((void *)m->d.scales);
    free(m->h.quants);
    free(m->h.scales);
    free(m->w);
}

/* ---- the products ------------------------------------------------------------ */

typedef struct {
    int T, N, K;
    float *x32;       /* [T][K] */
    dol_f16 *x16;     /* the same, rounded to FP16 */
    double *exact;    /* [T][N]: sum x16 * w in double */
    double *mag;      /* [T][N]: sum |x16 * w| */
    double *xabs;     /* [T]: sum |x16| */
    float *cpu;       /* [T][N]: dol_cpu_matmul_q8 on x32 */
} product_ref;

static product_ref make_ref(const q8_mat *m, int T)
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
    dol_cpu_matmul_q8(NULL, p.cpu, p.x32, T, &m->h);
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
    static const struct { int N, K; } shapes[] = {
        { 1, 32 },  { 130, 64 }, { 9, 4096 }, { 64, 172 }, { 33, 96 }, { 5, 3 },
        { 9, 4097 }, { 7, 1 },   { 13, 33 }, { 11, 97 },
    };
    static const int Ts[] = { 1, 2, 3, 8, 16, 17, 33 };
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) fail_msg("cublasCreate failed");
    char err[DOL_ERR_LEN];
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        q8_mat m = make_mat(shapes[si].N, shapes[si].K);
        const int N = m.N, K = m.K;
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int T = Ts[ti];
            product_ref p = make_ref(&m, T);
            dol_f16 *d_x = dup_to_dev(p.x16, sizeof(dol_f16) * (size_t)T * K);
            float *d_out = dmalloc(sizeof(float) * (size_t)T * N);
            float *got = malloc(sizeof(float) * (size_t)T * N);
            const bool tiled = T > DOL_CUDA_Q8_GEMV_UPTO;
            /* small workspace: tiles of 3 rows, the last one partial */
            const size_t ws_small = 3 * (size_t)K + 5;
            dol_f16 *d_ws = dmalloc(sizeof(dol_f16) * (size_t)N * K);
            CK(cudaMemset(d_out, 0xff, sizeof(float) * (size_t)T * N)); /* NaN: every output written */
            if (dol_cuda_q8_matmul(blas, d_out, d_x, T, &m.d, d_ws, ws_small, NULL, err, sizeof err) != 0)
                fail_msg("%s", err);
            to_host(got, d_out, sizeof(float) * (size_t)T * N);
            check_got(tiled ? "tiles of 3 rows" : "decode kernel", &p, got, tiled);
            if (tiled) {
                /* the whole matrix in one tile */
                CK(cudaMemset(d_out, 0xff, sizeof(float) * (size_t)T * N));
                if (dol_cuda_q8_matmul(blas, d_out, d_x, T, &m.d, d_ws, (size_t)N * K, NULL, err, sizeof err))
                    fail_msg("%s", err);
                to_host(got, d_out, sizeof(float) * (size_t)T * N);
                check_got("one tile", &p, got, true);
                /* a workspace smaller than one row is refused with a message */
                err[0] = 0;
                assert_int_equal(dol_cuda_q8_matmul(blas, d_out, d_x, T, &m.d, d_ws, (size_t)K - 1, NULL,
                                                     err, sizeof err), -1);
                assert_true(err[0] != 0);
            } else {
                /* batch invariance: row t alone gives the same bits */
                float *one = malloc(sizeof(float) * (size_t)N);
                for (int t = 0; t < T; t++) {
                    CK(dol_cuda_q8_gemv(d_out, d_x + (size_t)t * K, 1, &m.d, NULL));
                    to_host(one, d_out, sizeof(float) * (size_t)N);
                    if (memcmp(one, got + (size_t)t * N, sizeof(float) * (size_t)N) != 0)
                        fail_msg("decode kernel N=%d K=%d: row %d of T=%d differs from the row alone", N, K, t, T);
                }
                free(one);
                /* the generic kernel: x one FP16 value off 16-byte alignment */
                if (T <= DOL_CUDA_Q8_GEMV_MAX_T) {
                    dol_f16 *d_xo = dmalloc(sizeof(dol_f16) * ((size_t)T * K + 1));
                    CK(cudaMemcpy(d_xo + 1, p.x16, sizeof(dol_f16) * (size_t)T * K, cudaMemcpyHostToDevice));
                    CK(cudaMemset(d_out, 0xff, sizeof(float) * (size_t)T * N));
                    CK(dol_cuda_q8_gemv(d_out, d_xo + 1, T, &m.d, NULL));
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
        free_mat(&m);
    }
    /* launches the decode kernel refuses */
    {
        q8_mat m = make_mat(4, 64);
        dol_f16 *d_x = dmalloc(sizeof(dol_f16) * 9 * 64);
        float *d_out = dmalloc(sizeof(float) * 9 * 4);
        assert_int_equal(dol_cuda_q8_gemv(d_out, d_x, DOL_CUDA_Q8_GEMV_MAX_T + 1, &m.d, NULL),
                         cudaErrorInvalidValue);
        cudaFree(d_x);
        cudaFree(d_out);
        free_mat(&m);
    }
    cublasDestroy(blas);
}

/* dol_cuda_q8_dequant: exactly dol_f32_to_f16 of q8.c's dequantized floats,
 * for all rows and for a range starting inside the matrix. */
static void test_dequant_exact(void **state)
{
    (void)state;
    static const struct { int N, K; } shapes[] = { { 37, 64 }, { 16, 4096 }, { 64, 172 }, { 7, 97 }, { 3, 1 } };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        q8_mat m = make_mat(shapes[si].N, shapes[si].K);
        const int N = m.N, K = m.K;
        dol_f16 *d_w = dmalloc(sizeof(dol_f16) * (size_t)N * K);
        dol_f16 *got = malloc(sizeof(dol_f16) * (size_t)N * K);
        const int ranges[2][2] = { { 0, N }, { N / 3, N - N / 3 } };
        for (int ri = 0; ri < 2; ri++) {
            const int row0 = ranges[ri][0], rows = ranges[ri][1];
            CK(dol_cuda_q8_dequant(d_w, &m.d, row0, rows, NULL));
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
        assert_int_equal(dol_cuda_q8_dequant(d_w, &m.d, N - 1, 2, NULL), cudaErrorInvalidValue);
        cudaFree(d_w);
        free(got);
        free_mat(&m);
    }
}

/* ---- stories260K: the CUDA backend with int8 against the CPU backend with int8 */

static cJSON *load_json(const char *rel)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", g_shared, rel);
    return fixture_json_at(path);
}




/* Greedy generation of one sequence, the prompt in one call; stops at
 * BOS/EOS. Margins of each step and the logits after the prompt are kept. */
static int greedy(dol_engine *e, const int32_t *prompt, int n_prompt, int max_new, int32_t *out,
                  double *margins, float *first_logits)
{
    const int V = dol_engine_vocab_size(e);
    float *logits = malloc(sizeof(float) * (size_t)V);
    char err[DOL_ERR_LEN];
    int seq = dol_engine_seq_new(e);
    assert_true(seq >= 0);
    assert_int_equal(dol_engine_seq_reserve(e, seq, n_prompt + max_new), 0);
    dol_batch_item it = { seq, n_prompt, prompt, 0, 1, logits };
    if (dol_engine_forward(e, &it, 1, err, sizeof err) != 0) fail_msg("%s", err);
    memcpy(first_logits, logits, sizeof(float) * (size_t)V);
    int n_out = 0;
    for (int step = 0; step < max_new; step++) {
        int32_t id = fixture_argmax(logits, V);
        margins[step] = fixture_margin(logits, V);
        if (id == 1 || id == 2) break;
        out[n_out++] = id;
        if (step + 1 == max_new) break;
        dol_batch_item next = { seq, 1, &out[n_out - 1], n_prompt + n_out - 1, 1, logits };
        if (dol_engine_forward(e, &next, 1, err, sizeof err) != 0) fail_msg("%s", err);
    }
    dol_engine_seq_free(e, seq);
    free(logits);
    return n_out;
}

/* Logits of every position of ids[0..n) in one call. */
static void echo(dol_engine *e, const int32_t *ids, int n, float *logits)
{
    char err[DOL_ERR_LEN];
    int seq = dol_engine_seq_new(e);
    assert_true(seq >= 0);
    assert_int_equal(dol_engine_seq_reserve(e, seq, n), 0);
    dol_batch_item it = { seq, n, ids, 0, n, logits };
    if (dol_engine_forward(e, &it, 1, err, sizeof err) != 0) fail_msg("%s", err);
    dol_engine_seq_free(e, seq);
}

static dol_engine *open_engine(const dol_model *m, dol_backend_kind backend, bool quantize_lm_head)
{
    dol_engine_params p = { .backend = backend, .gpu_memory_utilization = 0.90, .n_threads = 2,
                            .kv_block_size = 16, .kv_cache_tokens = 4096, .max_seqs = 4,
                            .max_batch_tokens = 1024, .weights = DOL_WEIGHTS_INT8,
                            .quantize_lm_head = quantize_lm_head };
    dol_engine *e = NULL;
    char err[DOL_ERR_LEN];
    if (dol_engine_create(m, &p, &e, err, sizeof err) != 0) fail_msg("%s", err);
    assert_string_equal(dol_engine_backend_name(e), backend == DOL_BACKEND_CUDA ? "cuda" : "cpu");
    return e;
}

static void stories_case(const dol_model *m, const cJSON *golden, bool quantize_lm_head)
{
    dol_engine *cpu = open_engine(m, DOL_BACKEND_CPU, quantize_lm_head);
    dol_engine *gpu = open_engine(m, DOL_BACKEND_CUDA, quantize_lm_head);

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
        printf("stories260K int8 on CUDA: linear layers %.3f x F16, %zu -> %zu bytes quantized\n", ratio,
               qg.quant_bytes_before, qg.quant_bytes_after);
        assert_true(ratio <= 0.54);
    }

    const int V = dol_engine_vocab_size(gpu);
    float *lc = malloc(sizeof(float) * (size_t)V), *lg = malloc(sizeof(float) * (size_t)V);
    int32_t longest[ECHO_TOKENS];
    int n_longest = 0;
    const cJSON *c;
    int cases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(golden, "cases")) {
        int32_t prompt[1024], ids_c[1024], ids_g[1024];
        double mc[1024], mg[1024];
        int np = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(c, "prompt_ids")) if (np < 1024) prompt[np++] = (int32_t)it->valueint;
        int max_new = cJSON_GetObjectItem(c, "max_tokens")->valueint;
        if (max_new > 64) max_new = 64; /* the EMU run's budget; test_cuda_quant_golden goes further */
        const int nc = greedy(cpu, prompt, np, max_new, ids_c, mc, lc);
        const int ng = greedy(gpu, prompt, np, max_new, ids_g, mg, lg);
        const double first = fixture_max_abs_diff(lc, lg, (size_t)V);
        int trusted = 0; /* steps before the CPU's first margin below the bound */
        while (trusted < nc && mc[trusted] >= MARGIN_BOUND) trusted++;
        int same = 0;
        while (same < nc && same < ng && ids_c[same] == ids_g[same]) same++;
        printf("stories260K int8 lm_head %s case %d: logits after the prompt within %.4f; %d of %d CPU ids "
               "reproduced (%d trusted at margin >= %.2f)\n",
               quantize_lm_head ? "int8" : "f16", cases, first, same, nc, trusted, MARGIN_BOUND);
        if (!(first <= LOGIT_BOUND))
            fail_msg("case %d: logits after the prompt differ by %.5f (> %.2f)", cases, first, LOGIT_BOUND);
        if (same < trusted)
            fail_msg("case %d step %d: CUDA id %d, CPU id %d (CPU margin %.4f)", cases, same,
                     same < ng ? ids_g[same] : -1, ids_c[same], mc[same]);
        if (np + nc > n_longest) { /* the prompt and the CPU's ids, for the pass below */
            n_longest = 0;
            for (int i = 0; i < np && n_longest < ECHO_TOKENS; i++) longest[n_longest++] = prompt[i];
            for (int i = 0; i < nc && n_longest < ECHO_TOKENS; i++) longest[n_longest++] = ids_c[i];
        }
        cases++;
    }
    assert_true(cases > 0);

    /* teacher-forced: every position's logits in one call (more rows than
     * DOL_CUDA_Q8_GEMV_UPTO: every product through the dequantized tiles) */
    float *ec = malloc(sizeof(float) * (size_t)n_longest * V), *eg = malloc(sizeof(float) * (size_t)n_longest * V);
    echo(cpu, longest, n_longest, ec);
    echo(gpu, longest, n_longest, eg);
    const double ed = fixture_max_abs_diff(ec, eg, (size_t)n_longest * V);
    printf("stories260K int8 lm_head %s: %d teacher-forced positions within %.4f\n",
           quantize_lm_head ? "int8" : "f16", n_longest, ed);
    if (!(ed <= ECHO_BOUND)) fail_msg("teacher-forced logits differ by %.5f (> %.2f)", ed, ECHO_BOUND);

    free(ec); free(eg); free(lc); free(lg);
    dol_engine_free(gpu);
    dol_engine_free(cpu);
}

static void test_stories260K(void **state)
{
    (void)state;
    if (!g_shared[0]) skip();
    cJSON *golden = load_json("golden/stories260K.json");
    if (!golden) skip();
    char dir[1200], err[DOL_ERR_LEN];
    snprintf(dir, sizeof dir, "%s/models/stories260K", g_shared);
    dol_model *m = NULL;
    if (dol_model_load(dir, &m, err, sizeof err) != 0) fail_msg("%s", err);
    stories_case(m, golden, true); /* lm_head int8 too (kept, the default, in test_cuda_quant_golden) */
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

int main(void)
{
    char why[256];
    if (!dol_cuda_device_check(why, sizeof why)) {
        printf("test_cuda_q8: no usable CUDA device (%s); skipping\n", why);
#ifdef DOLPHIN_CUDA_EMU
        return 1; /* the emulated device is always there: not finding it is a failure */
#else
        return 77;
#endif
    }
    find_shared();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_exact),
        cmocka_unit_test(test_products),
        cmocka_unit_test(test_stories260K),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
