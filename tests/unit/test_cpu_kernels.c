/* tests/unit/test_cpu_kernels.c — the instruction-set variants of the CPU
 * kernels (src/engine/cpu_kernels.h): every variant this CPU supports
 * against the portable one and against a double-precision reference, on
 * random inputs of odd sizes (dot, matrix-product rows over F32/F16/BF16
 * and NF4 weights, RMSNorm, RoPE, SiLU-gated product); batch invariance bit
 * for bit within each variant; the row-range contract of matmul_rows and
 * nf4_rows; the find / set API and the DOLPHIN_CPU_KERNELS override (checked
 * in a child process, since the environment is read at first use); and
 * BF16 linear weights through the engine (held as BF16, logits equal to
 * those of their F32 copy). A variant the CPU lacks is skipped with a note;
 * the engine case needs the stories260K fixture ($DOLPHIN_SHARED) and is
 * skipped without it. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dolphin/engine.h"
#include "dolphin/model.h"
#include "engine/cpu_kernels.h"
#include "dolphin/kv_q8.h"
#include "engine/cpu_ops.h"
#include "engine/nf4.h"
#include "test_fixtures.h"

extern char **environ;

static const char *const g_names[] = { "portable", "avx2", "avx512" };
#define N_NAMES 3

/* Relative tolerance, against sum_k |x_k * w_k| (the scale of the rounding
 * errors of a float32 sum; the result itself may cancel to near zero). */
#define REL 1e-5

static const int g_K[] = { 1, 3, 7, 15, 17, 31, 33, 63, 64, 65, 127, 129, 767, 770 };
static const int g_N[] = { 1, 3, 5, 13 };
static const int g_T[] = { 1, 2, 3, 4, 5, 7, 9, 13, 20 };
static const dol_dtype g_dtypes[] = { DOL_DTYPE_F32, DOL_DTYPE_F16, DOL_DTYPE_BF16 };
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- helpers ------------------------------------------------------------- */

#define TEST_RNG_SEED 0x2545F4914F6CDD1Dull
#include "test_random.h"

static float *random_floats(size_t n)
{
    float *p = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = gaussian();
    return p;
}

/* n random weights in dtype t at *raw (allocated), and their exact f32
 * values in the returned array. */
static float *random_weights(size_t n, dol_dtype t, void **raw)
{
    float *f = random_floats(n);
    if (t == DOL_DTYPE_F32) {
        float *r = malloc(sizeof(float) * (n ? n : 1));
        assert_non_null(r);
        memcpy(r, f, sizeof(float) * n);
        *raw = r;
        return f;
    }
    uint16_t *h = malloc(sizeof(uint16_t) * (n ? n : 1));
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) {
        if (t == DOL_DTYPE_F16) {
            h[i] = dol_f32_to_f16(f[i]);
            f[i] = dol_f16_to_f32(h[i]);
        } else {
            h[i] = dol_f32_to_bf16(f[i]);
            f[i] = dol_bf16_to_f32(h[i]);
        }
    }
    *raw = h;
    return f;
}

/* The supported variants, portable first; the others print a note. */
static int supported_variants(const dol_cpu_kernels **out)
{
    int n = 0;
    for (int i = 0; i < N_NAMES; i++) {
        const dol_cpu_kernels *k = dol_cpu_kernels_find(g_names[i]);
        if (k) out[n++] = k;
    }
    return n;
}

static void note_skipped(void)
{
    for (int i = 0; i < N_NAMES; i++)
        if (!dol_cpu_kernels_find(g_names[i]))
            print_message("  note: variant %s not supported here (CPU or build); skipped\n",
                          g_names[i]);
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* |got - want| within REL of the magnitude scale (plus a denormal floor). */
static void check_close(const char *what, const char *variant, double got, double want,
                        double scale, int K, int t, int n)
{
    double tol = REL * scale + 1e-30;
    if (!(fabs(got - want) <= tol))
        fail_msg("%s [%s] K=%d t=%d n=%d: %.9g vs %.9g (tolerance %.3g)", what, variant, K, t, n,
                 got, want, tol);
}

/* sum_k x[k] * w[k] in double precision (the reference), and in *scale the
 * sum of the |products| (the magnitude check_close measures against). */
static double ref_dot(const float *x, const float *w, int K, double *scale)
{
    double ref = 0.0;
    *scale = 0.0;
    for (int k = 0; k < K; k++) {
        double p = (double)x[k] * w[k];
        ref += p;
        *scale += fabs(p);
    }
    return ref;
}

/* ---- table shape ----------------------------------------------------------- */

static void test_tables(void **state)
{
    (void)state;
    const dol_cpu_kernels *v[N_NAMES];
    int nv = supported_variants(v);
    note_skipped();
    assert_true(nv >= 1);
    assert_ptr_equal(v[0], &dol_cpu_kernels_portable);
    assert_string_equal(dol_cpu_kernels_portable.name, "portable");
    assert_int_equal(dol_cpu_kernels_portable.lanes, 1);
    for (int i = 0; i < nv; i++) {
        assert_non_null(v[i]->dot);
        assert_non_null(v[i]->matmul_rows);
        assert_non_null(v[i]->nf4_rows);
        assert_non_null(v[i]->rmsnorm);
        assert_non_null(v[i]->rope);
        assert_non_null(v[i]->silu_mul);
        assert_ptr_equal(dol_cpu_kernels_find(v[i]->name), v[i]);
        int lanes = strcmp(v[i]->name, "avx512") == 0 ? 16 : strcmp(v[i]->name, "avx2") == 0 ? 8 : 1;
        assert_int_equal(v[i]->lanes, lanes);
        print_message("  variant %s: %d lanes\n", v[i]->name, v[i]->lanes);
    }
}

/* ---- dot ------------------------------------------------------------------- */

static void test_dot(void **state)
{
    (void)state;
    const dol_cpu_kernels *v[N_NAMES];
    int nv = supported_variants(v);
    for (int d = 0; d < COUNT(g_dtypes); d++)
        for (int ki = 0; ki < COUNT(g_K); ki++) {
            int K = g_K[ki];
            void *raw;
            float *x = random_floats((size_t)K);
            float *wf = random_weights((size_t)K, g_dtypes[d], &raw);
            double scale;
            const double ref = ref_dot(x, wf, K, &scale);
            float port = v[0]->dot(x, raw, g_dtypes[d], K);
            for (int i = 0; i < nv; i++) {
                float got = v[i]->dot(x, raw, g_dtypes[d], K);
                check_close(dol_dtype_name(g_dtypes[d]), v[i]->name, got, ref, scale, K, 0, 0);
                check_close(dol_dtype_name(g_dtypes[d]), v[i]->name, got, port, scale, K, 0, 0);
            }
            /* n = 0: an empty sum */
            for (int i = 0; i < nv; i++) assert_true(v[i]->dot(x, raw, g_dtypes[d], 0) == 0.0f);
            free(x);
            free(wf);
            free(raw);
        }
}

/* ---- matmul_rows ----------------------------------------------------------- */

/* One shape and dtype, every supported variant: against the double
 * reference and portable; every element equal to the variant's dot; rows
 * computed alone (T = 1) equal to the same rows in the batch; a split row
 * range writes only its columns and gives the same bits. */
static void check_matmul_shape(const dol_cpu_kernels *const *v, int nv, int K, int N, int T,
                               dol_dtype dt)
{
    void *raw;
    float *x = random_floats((size_t)T * K);
    float *wf = random_weights((size_t)N * K, dt, &raw);
    size_t esz = dol_dtype_size(dt);
    float *port = malloc(sizeof(float) * (size_t)T * N);
    float *out = malloc(sizeof(float) * (size_t)T * N);
    float *part = malloc(sizeof(float) * (size_t)T * N);
    float one[16];
    assert_true(port && out && part && N <= 16);
    v[0]->matmul_rows(port, x, T, K, raw, dt, N, 0, N);
    for (int i = 0; i < nv; i++) {
        const dol_cpu_kernels *kv = v[i];
        kv->matmul_rows(out, x, T, K, raw, dt, N, 0, N);
        for (int t = 0; t < T; t++)
            for (int n = 0; n < N; n++) {
                double scale;
                const double ref = ref_dot(x + (size_t)t * K, wf + (size_t)n * K, K, &scale);
                float got = out[(size_t)t * N + n];
                check_close(dol_dtype_name(dt), kv->name, got, ref, scale, K, t, n);
                check_close(dol_dtype_name(dt), kv->name, got, port[(size_t)t * N + n], scale, K,
                            t, n);
                float d = kv->dot(x + (size_t)t * K, (const char *)raw + (size_t)n * K * esz, dt, K);
                if (!same_bits(got, d))
                    fail_msg("%s [%s] K=%d N=%d T=%d t=%d n=%d: matmul %.9g != dot %.9g",
                             dol_dtype_name(dt), kv->name, K, N, T, t, n, got, d);
            }
        /* batch invariance: row t alone */
        for (int t = 0; t < T; t++) {
            kv->matmul_rows(one, x + (size_t)t * K, 1, K, raw, dt, N, 0, N);
            if (memcmp(one, out + (size_t)t * N, sizeof(float) * (size_t)N) != 0)
                fail_msg("%s [%s] K=%d N=%d T=%d: row %d differs from T=1", dol_dtype_name(dt),
                         kv->name, K, N, T, t);
        }
        /* row range: [0, m) then [m, N), m not a multiple of 4 when possible */
        int m = N > 1 ? 1 + (int)(uniform() * (N - 1)) : 0;
        const float sentinel = -12345.678f;
        for (size_t e = 0; e < (size_t)T * N; e++) part[e] = sentinel;
        kv->matmul_rows(part, x, T, K, raw, dt, N, m, N);
        for (int t = 0; t < T; t++)
            for (int n = 0; n < m; n++) assert_true(same_bits(part[(size_t)t * N + n], sentinel));
        kv->matmul_rows(part, x, T, K, raw, dt, N, 0, m);
        if (memcmp(part, out, sizeof(float) * (size_t)T * N) != 0)
            fail_msg("%s [%s] K=%d N=%d T=%d: split rows at %d differ", dol_dtype_name(dt),
                     kv->name, K, N, T, m);
        /* the packed layout: the same bits as row-major, over the whole
         * matrix and over panel-aligned row ranges */
        void *pk = malloc(dol_cpu_packed_elems(N, K) * esz);
        assert_non_null(pk);
        assert_int_equal(dol_cpu_pack(NULL, pk, dt, raw, dt, N, K), 0);
        for (size_t e = 0; e < (size_t)T * N; e++) part[e] = sentinel;
        int m4 = (m / DOL_PACK_ROWS) * DOL_PACK_ROWS;
        kv->matmul_packed_rows(part, x, T, K, pk, dt, N, m4, N);
        for (int t = 0; t < T; t++)
            for (int n = 0; n < m4; n++) assert_true(same_bits(part[(size_t)t * N + n], sentinel));
        kv->matmul_packed_rows(part, x, T, K, pk, dt, N, 0, m4);
        if (memcmp(part, out, sizeof(float) * (size_t)T * N) != 0)
            fail_msg("%s [%s] K=%d N=%d T=%d: packed product differs from row-major",
                     dol_dtype_name(dt), kv->name, K, N, T);
        /* converting while packing: F16 -> F32 packed equals F32 row-major */
        if (dt == DOL_DTYPE_F16 && i == 0) {
            float *pk32 = malloc(dol_cpu_packed_elems(N, K) * sizeof(float));
            assert_non_null(pk32);
            assert_int_equal(dol_cpu_pack(NULL, pk32, DOL_DTYPE_F32, raw, dt, N, K), 0);
            for (int n = 0; n < N; n++)
                for (int k = 0; k < K; k++)
                    assert_true(same_bits(pk32[dol_cpu_packed_index(n, k, K)], wf[(size_t)n * K + k]));
            free(pk32);
        }
        free(pk);
    }
    free(x);
    free(wf);
    free(raw);
    free(port);
    free(out);
    free(part);
}

static void test_matmul_rows(void **state)
{
    (void)state;
    const dol_cpu_kernels *v[N_NAMES];
    int nv = supported_variants(v);
    int shapes = 0;
    for (int d = 0; d < COUNT(g_dtypes); d++)
        for (int ki = 0; ki < COUNT(g_K); ki++)
            for (int ni = 0; ni < COUNT(g_N); ni++)
                for (int ti = 0; ti < COUNT(g_T); ti++) {
                    check_matmul_shape(v, nv, g_K[ki], g_N[ni], g_T[ti], g_dtypes[d]);
                    shapes++;
                }
    print_message("  matmul_rows: %d shapes x %d variants\n", shapes, nv);
}

/* Packed products over matrices big enough for several cache blocks and
 * every visiting order (lockstep streams at 1-2 rows of x, each panel
 * meeting every group of rows with a steady prefetch up to 16 rows,
 * cache-blocked chunks beyond): the same bits as the row-major product, for
 * every variant, dtype and a task split at arbitrary panels. The splits
 * give the lockstep tiles ranges of 30, 7 and 38 whole panels (so 2, 3 and
 * 2 panels left over at four streams, 0, 1, 0 at two) and a short last
 * panel. */
static void test_packed_large(void **state)
{
    (void)state;
    static const int Ts[] = { 1, 2, 3, 8, 13, 16, 17, 31 };
    const dol_cpu_kernels *v[N_NAMES];
    int nv = supported_variants(v);
    /* K % 16 == 0, N % 4 == 1; at K = 2064 a group of 4 or more rows of x
     * is over 32 KB, so decode batches also take the panels' groups in
     * the back-and-forth order (PACK_SNAKE_BYTES, cpu_k_matmul.c) */
    static const int Ks[] = { 1040, 2064 };
    const int N = 301;
    for (int c = 0; c < COUNT(Ks) * COUNT(g_dtypes); c++) {
        const int K = Ks[c / COUNT(g_dtypes)];
        dol_dtype dt = g_dtypes[c % COUNT(g_dtypes)];
        void *raw;
        float *wf = random_weights((size_t)N * K, dt, &raw);
        size_t esz = dol_dtype_size(dt);
        void *pk = malloc(dol_cpu_packed_elems(N, K) * esz);
        assert_non_null(pk);
        assert_int_equal(dol_cpu_pack(NULL, pk, dt, raw, dt, N, K), 0);
        for (int ti = 0; ti < COUNT(Ts); ti++) {
            const int T = Ts[ti];
            float *x = random_floats((size_t)T * K);
            float *a = malloc(sizeof(float) * (size_t)T * N), *b = malloc(sizeof(float) * (size_t)T * N);
            assert_true(a && b);
            for (int i = 0; i < nv; i++) {
                v[i]->matmul_rows(a, x, T, K, raw, dt, N, 0, N);
                v[i]->matmul_packed_rows(b, x, T, K, pk, dt, N, 0, 120);
                v[i]->matmul_packed_rows(b, x, T, K, pk, dt, N, 120, 148);
                v[i]->matmul_packed_rows(b, x, T, K, pk, dt, N, 148, N);
                if (memcmp(a, b, sizeof(float) * (size_t)T * N) != 0)
                    fail_msg("packed %s [%s] K=%d N=%d T=%d differs from row-major", dol_dtype_name(dt),
                             v[i]->name, K, N, T);
            }
            free(x); free(a); free(b);
        }
        free(pk); free(wf); free(raw);
    }
}

/* dol_cpu_matmul (thread pool, task split) gives the bits of the selected
 * variant's matmul_rows, for every variant selected in turn; so does
 * dol_cpu_matmul_scatter, each row in its own buffer. */
static void test_matmul_through_pool(void **state)
{
    (void)state;
    const dol_cpu_kernels *v[N_NAMES];
    int nv = supported_variants(v);
    const dol_cpu_kernels *before = dol_cpu_kernels_get();
    dol_pool *pool = dol_pool_new(2);
    assert_non_null(pool);
    const int T = 5, K = 129, N = 301;
    for (int d = 0; d < COUNT(g_dtypes); d++) {
        void *raw;
        float *x = random_floats((size_t)T * K);
        float *wf = random_weights((size_t)N * K, g_dtypes[d], &raw);
        float *a = malloc(sizeof(float) * T * N), *b = malloc(sizeof(float) * T * N);
        assert_true(a && b);
        for (int i = 0; i < nv; i++) {
            assert_int_equal(dol_cpu_kernels_set(v[i]->name), 0);
            assert_ptr_equal(dol_cpu_kernels_get(), v[i]);
            dol_cpu_matmul(pool, a, x, T, K, raw, g_dtypes[d], N);
            v[i]->matmul_rows(b, x, T, K, raw, g_dtypes[d], N, 0, N);
            assert_memory_equal(a, b, sizeof(float) * T * N);
            /* rows to separate buffers, given in reverse order */
            float *tmp = malloc(sizeof(float) * T * N), *sep[T];
            assert_non_null(tmp);
            for (int t = 0; t < T; t++) assert_non_null(sep[t] = malloc(sizeof(float) * N));
            float *rows[T];
            for (int t = 0; t < T; t++) rows[t] = sep[T - 1 - t];
            const dol_cpu_weight w = { raw, g_dtypes[d], NULL, N, K, false, NULL, NULL, 0, NULL, NULL, false };
            dol_cpu_matmul_scatter(pool, rows, tmp, x, T, K, &w);
            for (int t = 0; t < T; t++) assert_memory_equal(rows[t], b + (size_t)t * N, sizeof(float) * N);
            for (int t = 0; t < T; t++) free(sep[t]);
            free(tmp);
        }
        free(a);
        free(b);
        free(x);
        free(wf);
        free(raw);
    }
    dol_pool_free(pool);
    assert_int_equal(dol_cpu_kernels_set(before->name), 0);
}

/* ---- NF4 ------------------------------------------------------------------- */

static void test_nf4_rows(void **state)
{
    (void)state;
    static const int Ks[] = { 2, 6, 14, 64, 66, 128, 130, 172, 256, 770 };
    const dol_cpu_kernels *v[N_NAMES];
    int nv = supported_variants(v);
    int shapes = 0;
    for (int ki = 0; ki < COUNT(Ks); ki++)
        for (int ni = 0; ni < COUNT(g_N); ni++) {
            int K = Ks[ki], N = g_N[ni];
            float *w = random_floats((size_t)N * K);
            dol_nf4_matrix q = {0};
            q.codes = malloc(dol_nf4_codes_bytes(N, K));
            q.scales = malloc(dol_nf4_scales_bytes(N, K));
            assert_true(q.codes && q.scales);
            dol_tensor src = { DOL_DTYPE_F32, N, K, w };
            char err[256];
            assert_int_equal(dol_nf4_quantize(NULL, &src, &q, "test", err, sizeof err), 0);
            float *wd = malloc(sizeof(float) * (size_t)N * K);
            assert_non_null(wd);
            for (int n = 0; n < N; n++) dol_nf4_dequantize_row(&q, n, wd + (size_t)n * K);
            for (int ti = 0; ti < COUNT(g_T); ti++) {
                int T = g_T[ti];
                float *x = random_floats((size_t)T * K);
                float *port = malloc(sizeof(float) * (size_t)T * N);
                float *out = malloc(sizeof(float) * (size_t)T * N);
                float *part = malloc(sizeof(float) * (size_t)T * N);
                float one[16];
                assert_true(port && out && part);
                v[0]->nf4_rows(port, x, T, &q, 0, N);
                for (int i = 0; i < nv; i++) {
                    const dol_cpu_kernels *kv = v[i];
                    kv->nf4_rows(out, x, T, &q, 0, N);
                    for (int t = 0; t < T; t++)
                        for (int n = 0; n < N; n++) {
                            double scale;
                            const double ref = ref_dot(x + (size_t)t * K, wd + (size_t)n * K, K, &scale);
                            float got = out[(size_t)t * N + n];
                            check_close("NF4", kv->name, got, ref, scale, K, t, n);
                            check_close("NF4", kv->name, got, port[(size_t)t * N + n], scale, K, t, n);
                        }
                    for (int t = 0; t < T; t++) {
                        kv->nf4_rows(one, x + (size_t)t * K, 1, &q, 0, N);
                        if (memcmp(one, out + (size_t)t * N, sizeof(float) * (size_t)N) != 0)
                            fail_msg("NF4 [%s] K=%d N=%d T=%d: row %d differs from T=1", kv->name,
                                     K, N, T, t);
                    }
                    int m = N > 1 ? 1 + (int)(uniform() * (N - 1)) : 0;
                    const float sentinel = 98765.4f;
                    for (size_t e = 0; e < (size_t)T * N; e++) part[e] = sentinel;
                    kv->nf4_rows(part, x, T, &q, m, N);
                    for (int t = 0; t < T; t++)
                        for (int n = 0; n < m; n++)
                            assert_true(same_bits(part[(size_t)t * N + n], sentinel));
                    kv->nf4_rows(part, x, T, &q, 0, m);
                    if (memcmp(part, out, sizeof(float) * (size_t)T * N) != 0)
                        fail_msg("NF4 [%s] K=%d N=%d T=%d: split rows at %d differ", kv->name, K,
                                 N, T, m);
                }
                shapes++;
                free(x);
                free(port);
                free(out);
                free(part);
            }
            free(w);
            free(wd);
            free(q.codes);
            free(q.scales);
        }
    print_message("  nf4_rows: %d shapes x %d variants\n", shapes, nv);
}

/* ---- element-wise kernels -------------------------------------------------- */

static void test_elementwise(void **state)
{
    (void)state;
    static const int ns[] = { 1, 3, 7, 17, 33, 127, 771 };
    const dol_cpu_kernels *v[N_NAMES];
    int nv = supported_variants(v);
    for (int ni = 0; ni < COUNT(ns); ni++) {
        int n = ns[ni];
        float *x = random_floats((size_t)n), *w = random_floats((size_t)n);
        float *up = random_floats((size_t)n);
        float *port = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n);
        float *alias = malloc(sizeof(float) * n);
        assert_true(port && out && alias);

        /* RMSNorm */
        double ss = 0.0;
        for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
        double inv = 1.0 / sqrt(ss / n + 1e-5);
        v[0]->rmsnorm(port, x, w, 1, n, 1e-5f);
        for (int i = 0; i < nv; i++) {
            v[i]->rmsnorm(out, x, w, 1, n, 1e-5f);
            memcpy(alias, x, sizeof(float) * n);
            v[i]->rmsnorm(alias, alias, w, 1, n, 1e-5f); /* out may alias x */
            assert_memory_equal(alias, out, sizeof(float) * n);
            for (int j = 0; j < n; j++) {
                double ref = x[j] * inv * w[j];
                check_close("rmsnorm", v[i]->name, out[j], ref, fabs(ref), n, 0, j);
                check_close("rmsnorm", v[i]->name, out[j], port[j], fabs(ref), n, 0, j);
            }
        }

        /* RMSNorm of several rows at once (four side by side, then the
         * rest): every row bit for bit as the same row alone */
        static const int row_counts[] = { 2, 4, 5, 7, 9 };
        for (int ri = 0; ri < COUNT(row_counts); ri++) {
            const int rows = row_counts[ri];
            float *xs = random_floats((size_t)rows * n);
            float *many = malloc(sizeof(float) * rows * n), *one = malloc(sizeof(float) * n);
            assert_true(many && one);
            for (int i = 0; i < nv; i++) {
                v[i]->rmsnorm(many, xs, w, rows, n, 1e-5f);
                for (int r = 0; r < rows; r++) {
                    v[i]->rmsnorm(one, xs + (size_t)r * n, w, 1, n, 1e-5f);
                    if (memcmp(one, many + (size_t)r * n, sizeof(float) * n) != 0)
                        fail_msg("rmsnorm [%s] rows=%d n=%d: row %d differs from the row alone",
                                 v[i]->name, rows, n, r);
                }
                memcpy(many, xs, sizeof(float) * rows * n);
                v[i]->rmsnorm(many, many, w, rows, n, 1e-5f); /* out may alias x */
                for (int r = 0; r < rows; r++) {
                    v[i]->rmsnorm(one, xs + (size_t)r * n, w, 1, n, 1e-5f);
                    if (memcmp(one, many + (size_t)r * n, sizeof(float) * n) != 0)
                        fail_msg("rmsnorm [%s] rows=%d n=%d in place: row %d differs", v[i]->name,
                                 rows, n, r);
                }
            }
            free(xs);
            free(many);
            free(one);
        }

        /* SiLU-gated product */
        v[0]->silu_mul(port, x, up, n);
        for (int i = 0; i < nv; i++) {
            v[i]->silu_mul(out, x, up, n);
            memcpy(alias, x, sizeof(float) * n);
            v[i]->silu_mul(alias, alias, up, n); /* out may alias gate */
            assert_memory_equal(alias, out, sizeof(float) * n);
            for (int j = 0; j < n; j++) {
                double g = x[j], ref = g / (1.0 + exp(-g)) * up[j];
                check_close("silu_mul", v[i]->name, out[j], ref, fabs(ref), n, 0, j);
                check_close("silu_mul", v[i]->name, out[j], port[j], fabs(ref), n, 0, j);
                if (!same_bits(out[j], port[j])) /* one exp for every kernel set */
                    fail_msg("silu_mul [%s] n=%d j=%d: %.9g, portable %.9g", v[i]->name, n, j,
                             out[j], port[j]);
            }
        }
        free(x);
        free(w);
        free(up);
        free(port);
        free(out);
        free(alias);
    }

    /* RoPE: odd head counts, head_dim even (pairs i, i + head_dim/2) */
    static const int heads[] = { 1, 3, 5 };
    static const int dims[] = { 2, 6, 34, 66, 130 };
    for (int hi = 0; hi < COUNT(heads); hi++)
        for (int di = 0; di < COUNT(dims); di++) {
            int nh = heads[hi], hd = dims[di], half = hd / 2, n = nh * hd;
            float *x = random_floats((size_t)n);
            float *cs = malloc(sizeof(float) * half), *sn = malloc(sizeof(float) * half);
            float *port = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n);
            assert_true(cs && sn && port && out);
            for (int i = 0; i < half; i++) {
                double a = 37.0 * pow(10000.0, -2.0 * i / hd);
                cs[i] = (float)cos(a);
                sn[i] = (float)sin(a);
            }
            memcpy(port, x, sizeof(float) * n);
            v[0]->rope(port, nh, hd, cs, sn);
            for (int i = 0; i < nv; i++) {
                memcpy(out, x, sizeof(float) * n);
                v[i]->rope(out, nh, hd, cs, sn);
                for (int h = 0; h < nh; h++)
                    for (int j = 0; j < half; j++) {
                        const float *xv = x + (size_t)h * hd;
                        double a = xv[j], b = xv[j + half];
                        double r0 = a * cs[j] - b * sn[j], r1 = b * cs[j] + a * sn[j];
                        double scale = fabs(a) + fabs(b);
                        size_t o = (size_t)h * hd + j;
                        check_close("rope", v[i]->name, out[o], r0, scale, hd, h, j);
                        check_close("rope", v[i]->name, out[o + half], r1, scale, hd, h, j);
                        check_close("rope", v[i]->name, out[o], port[o], scale, hd, h, j);
                        check_close("rope", v[i]->name, out[o + half], port[o + half], scale, hd,
                                    h, j);
                    }
            }
            free(x);
            free(cs);
            free(sn);
            free(port);
            free(out);
        }
}

/* ---- attention over paged KV blocks ------------------------------------------ */

/* Bytes of one run of bs rows of a half of type t (the layout of
 * attn_head in cpu_kernels.h), rounded up to 16 as the engine does, so
 * that an F32 or F16 run after a Q8_0 one stays aligned. */
static size_t run_bytes(dol_kv_dtype t, int hd, int bs)
{
    return (dol_kv_head_row_bytes(t, hd) * (size_t)bs + 15) & ~(size_t)15;
}

/* Row r of a run of type t filled from x[hd] (dims_major for K), exactly
 * as the engine stores it; the values attention then reads go back into
 * x (F16-rounded, or q * d). */
static void put_row(char *run, dol_kv_dtype t, float *x, int hd, int bs, int r, bool dims_major)
{
    const size_t st = dims_major ? (size_t)bs : 1, pitch = dims_major ? 1 : (size_t)hd;
    if (t == DOL_KV_Q8_0) {
        const int B = dol_kv_q8_block(hd), nqb = hd / B;
        int8_t *q = (int8_t *)run + (size_t)r * pitch;
        uint16_t *d = (uint16_t *)(run + (size_t)hd * bs);
        for (int j = 0; j < nqb; j++) {
            uint16_t h = dol_kv_q8_quantize(x + (size_t)j * B, 1, B, q + (size_t)j * B * st, (int)st);
            d[dims_major ? (size_t)j * bs + r : (size_t)r * nqb + j] = h;
            for (int i = j * B; i < (j + 1) * B; i++) x[i] = (float)q[(size_t)i * st] * dol_f16_to_f32(h);
        }
    } else if (t == DOL_KV_F16) {
        uint16_t *h = (uint16_t *)run + (size_t)r * pitch;
        for (int i = 0; i < hd; i++) {
            h[(size_t)i * st] = dol_f32_to_f16(x[i]);
            x[i] = dol_f16_to_f32(h[(size_t)i * st]);
        }
    } else {
        float *f = (float *)run + (size_t)r * pitch;
        for (int i = 0; i < hd; i++) f[(size_t)i * st] = x[i];
    }
}

/* attn_head of every variant gives the same bits as the portable one (the
 * contract fixes every operation and its order), for every pair of K / V
 * element types, on odd head sizes, block sizes and lengths, with the
 * blocks of the sequence scattered in the pool and garbage in the unused
 * rows; and it is within 1e-5 of a double-precision softmax attention over
 * the values as stored (F16-rounded, or the Q8_0 q * d). */
static void test_attn_head(void **state)
{
    (void)state;
    static const int hds[] = { 1, 7, 16, 33, 64, 128 };
    static const int bss[] = { 16, 8, 5 };
    static const int ns[] = { 1, 2, 15, 16, 17, 40, 63, 64, 65, 100 };
    static const dol_kv_dtype types[] = { DOL_KV_F32, DOL_KV_F16, DOL_KV_Q8_0 };
    const dol_cpu_kernels *v[N_NAMES];
    int nv = supported_variants(v);
    int cases = 0;
    for (int ki = 0; ki < 3; ki++)
    for (int vti = 0; vti < 3; vti++)
    for (int hi = 0; hi < COUNT(hds); hi++)
        for (int bi = 0; bi < COUNT(bss); bi++)
            for (int ni = 0; ni < COUNT(ns); ni++) {
                const dol_kv_dtype kt = types[ki], vt = types[vti];
                const int hd = hds[hi], bs = bss[bi], n = ns[ni];
                /* Q8_0 needs a head it can hold, and an even one (its scales
                 * follow head_dim x bs int8 values; RoPE heads are even) */
                if ((kt == DOL_KV_Q8_0 || vt == DOL_KV_Q8_0) && (!dol_kv_q8_head_ok(hd) || hd % 2)) continue;
                const int nb = (n + bs - 1) / bs, pool_blocks = nb + 3;
                const size_t rk = run_bytes(kt, hd, bs), rv = run_bytes(vt, hd, bs);
                const size_t block_bytes = (rk + rv + 11 * 4 + 15) & ~(size_t)15;
                /* random bytes everywhere (garbage rows included), then the
                 * sequence's rows written in the engine's layout */
                float *pool = random_floats(block_bytes * pool_blocks / sizeof(float));
                float *q = random_floats((size_t)hd);
                float *kx = random_floats((size_t)n * hd), *vx = random_floats((size_t)n * hd);
                int32_t *table = malloc(sizeof(int32_t) * nb);
                assert_non_null(table);
                for (int b = 0; b < nb; b++) table[b] = (int32_t)(nb + 2 - b); /* distinct, scattered */
                char *k_base = (char *)pool, *v_base = (char *)pool + rk;
                for (int p = 0; p < n; p++) {
                    put_row(k_base + (size_t)table[p / bs] * block_bytes, kt, kx + (size_t)p * hd, hd, bs, p % bs, true);
                    put_row(v_base + (size_t)table[p / bs] * block_bytes, vt, vx + (size_t)p * hd, hd, bs, p % bs, false);
                }
                const float scale = 1.0f / sqrtf((float)hd);

                /* double-precision reference over the stored values */
                double *ref = calloc((size_t)hd, sizeof(double)), *sc = malloc(sizeof(double) * n);
                assert_true(ref && sc);
                double maxv = -INFINITY, sum = 0.0;
                for (int p = 0; p < n; p++) {
                    double d = 0.0;
                    for (int i = 0; i < hd; i++) d += (double)q[i] * kx[(size_t)p * hd + i];
                    sc[p] = d * scale;
                    if (sc[p] > maxv) maxv = sc[p];
                }
                for (int p = 0; p < n; p++) {
                    sc[p] = exp(sc[p] - maxv);
                    sum += sc[p];
                }
                for (int p = 0; p < n; p++)
                    for (int i = 0; i < hd; i++) ref[i] += sc[p] / sum * vx[(size_t)p * hd + i];

                float *port = malloc(sizeof(float) * hd), *out = malloc(sizeof(float) * hd);
                float *scratch = malloc(sizeof(float) * (size_t)nb * bs);
                assert_true(port && out && scratch);
                for (int vi = 0; vi < nv; vi++) {
                    v[vi]->attn_head(q, hd, n, k_base, v_base, kt, vt, table, bs, block_bytes,
                                     scale, scratch, vi == 0 ? port : out);
                    const float *got = vi == 0 ? port : out;
                    for (int i = 0; i < hd; i++) {
                        if (vi > 0 && !same_bits(out[i], port[i]))
                            fail_msg("attn_head k=%s v=%s [%s] hd=%d bs=%d n=%d i=%d: %.9g, portable %.9g",
                                     dol_kv_dtype_str(kt), dol_kv_dtype_str(vt), v[vi]->name, hd, bs,
                                     n, i, out[i], port[i]);
                        if (!(fabs(got[i] - ref[i]) <= REL))
                            fail_msg("attn_head k=%s v=%s [%s] hd=%d bs=%d n=%d i=%d: %.9g vs %.9g",
                                     dol_kv_dtype_str(kt), dol_kv_dtype_str(vt), v[vi]->name, hd, bs,
                                     n, i, got[i], ref[i]);
                    }
                }
                cases++;
                free(pool); free(q); free(kx); free(vx); free(table); free(ref); free(sc);
                free(port); free(out); free(scratch);
            }
    print_message("  attn_head: %d shapes x type pairs x %d variants\n", cases, nv);
}

/* ---- BF16 weights through the engine --------------------------------------- */

/* stories260K with its linear layers turned into BF16: weights auto keeps
 * them BF16 (2 bytes per weight) and its logits equal, bit for bit, those of
 * weights f32 (the exact F32 copy of the same BF16 values), for every
 * variant: the SIMD tiles read BF16 in the same order as F32. Skipped
 * without the fixtures ($DOLPHIN_SHARED). */
static float *logits_of(dol_engine *e, const int32_t *tok, int n)
{
    int V = dol_engine_vocab_size(e);
    float *lg = malloc(sizeof(float) * (size_t)V * n);
    assert_non_null(lg);
    char err[DOL_ERR_LEN];
    int seq = dol_engine_seq_new(e);
    assert_true(seq >= 0);
    assert_int_equal(dol_engine_seq_reserve(e, seq, n), 0);
    dol_batch_item it = { seq, n, tok, 0, n, lg };
    int rc = dol_engine_forward(e, &it, 1, err, sizeof err);
    if (rc != 0) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    dol_engine_seq_free(e, seq);
    return lg;
}

static void test_engine_bf16_weights(void **state)
{
    (void)state;
    char dir[1200], err[DOL_ERR_LEN];
    test_fixture_model(dir, sizeof dir, "stories260K");
    dol_model *m = NULL;
    int rc = dol_model_load(dir, &m, err, sizeof err);
    if (rc != 0) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);

    /* swap every linear tensor for a BF16 copy (restored before the free) */
    int nl = m->cfg.n_layers, nt = 7 * nl + 1;
    dol_tensor **lin = calloc((size_t)nt, sizeof *lin);
    dol_tensor *saved = calloc((size_t)nt, sizeof *saved);
    void **bufs = calloc((size_t)nt, sizeof *bufs);
    assert_true(lin && saved && bufs);
    for (int l = 0, i = 0; l < nl; l++) {
        dol_layer_weights *w = &m->layers[l];
        lin[i++] = &w->q, lin[i++] = &w->k, lin[i++] = &w->v, lin[i++] = &w->o;
        lin[i++] = &w->gate, lin[i++] = &w->up, lin[i++] = &w->down;
    }
    lin[nt - 1] = &m->lm_head;
    size_t weights = 0;
    for (int i = 0; i < nt; i++) {
        dol_tensor *t = lin[i];
        assert_int_equal(t->dtype, DOL_DTYPE_F32);
        size_t n = (size_t)(t->rows * t->cols);
        uint16_t *h = malloc(sizeof(uint16_t) * n);
        assert_non_null(h);
        for (size_t j = 0; j < n; j++) h[j] = dol_f32_to_bf16(((const float *)t->data)[j]);
        saved[i] = *t;
        bufs[i] = h;
        t->dtype = DOL_DTYPE_BF16;
        t->data = h;
        weights += n;
    }

    dol_engine_params p = { .activations = DOL_ACT_F32, .backend = DOL_BACKEND_CPU, .n_threads = 2, .kv_block_size = 16,
                            .kv_cache_tokens = 256, .max_seqs = 4, .max_batch_tokens = 64,
                            .kv_dtype = DOL_KV_F32 };
    dol_engine *ea = NULL, *ef = NULL;
    p.weights = DOL_WEIGHTS_AUTO;
    assert_int_equal(dol_engine_create(m, &p, &ea, err, sizeof err), 0);
    p.weights = DOL_WEIGHTS_F32;
    assert_int_equal(dol_engine_create(m, &p, &ef, err, sizeof err), 0);
    dol_quant_stats qa, qf;
    dol_engine_quant_stats(ea, &qa);
    dol_engine_quant_stats(ef, &qf);
    assert_int_equal(qa.linear_bytes, weights * 2); /* kept as BF16 */
    assert_int_equal(qf.linear_bytes, weights * 4);

    static const int32_t tok[] = { 1, 403, 17, 260, 99, 7, 311, 45, 128, 2, 64 };
    const int n = (int)(sizeof tok / sizeof tok[0]);
    const int V = dol_engine_vocab_size(ea);
    const dol_cpu_kernels *before = dol_cpu_kernels_get();
    const dol_cpu_kernels *v[N_NAMES];
    int nv = supported_variants(v);
    for (int i = 0; i < nv; i++) {
        assert_int_equal(dol_cpu_kernels_set(v[i]->name), 0);
        float *la = logits_of(ea, tok, n), *lf = logits_of(ef, tok, n);
        if (memcmp(la, lf, sizeof(float) * (size_t)V * n) != 0)
            fail_msg("[%s] BF16-held logits differ from the F32 copy's", v[i]->name);
        print_message("  [%s] BF16 weights: %d x %d logits equal to F32's bit for bit\n",
                      v[i]->name, n, V);
        free(la);
        free(lf);
    }
    assert_int_equal(dol_cpu_kernels_set(before->name), 0);
    dol_engine_free(ea);
    dol_engine_free(ef);
    for (int i = 0; i < nt; i++) {
        *lin[i] = saved[i];
        free(bufs[i]);
    }
    free(lin);
    free(saved);
    free(bufs);
    dol_model_free(m);
}

/* ---- selection ------------------------------------------------------------- */

/* The automatic choice: the widest supported variant. */
static const char *auto_choice(void)
{
    for (int i = N_NAMES - 1; i >= 0; i--)
        if (dol_cpu_kernels_find(g_names[i])) return g_names[i];
    return "portable";
}

static void test_find_and_set(void **state)
{
    (void)state;
    const dol_cpu_kernels *before = dol_cpu_kernels_get();
    assert_non_null(before);
    assert_null(dol_cpu_kernels_find("bogus"));
    assert_null(dol_cpu_kernels_find(""));
    assert_null(dol_cpu_kernels_find(NULL));
    assert_null(dol_cpu_kernels_find("AVX2"));
    assert_int_equal(dol_cpu_kernels_set("bogus"), -1);
    assert_int_equal(dol_cpu_kernels_set(NULL), -1);
    assert_ptr_equal(dol_cpu_kernels_get(), before); /* unchanged */
    for (int i = 0; i < N_NAMES; i++) {
        const dol_cpu_kernels *k = dol_cpu_kernels_find(g_names[i]);
        if (!k) {
            assert_int_equal(dol_cpu_kernels_set(g_names[i]), -1);
            assert_ptr_equal(dol_cpu_kernels_get(), before);
            continue;
        }
        assert_int_equal(dol_cpu_kernels_set(g_names[i]), 0);
        assert_ptr_equal(dol_cpu_kernels_get(), k);
        assert_string_equal(dol_engine_cpu_kernels(), g_names[i]);
    }
    assert_int_equal(dol_cpu_kernels_set(before->name), 0);
    const char *env = getenv("DOLPHIN_CPU_KERNELS");
    if (!env || !*env) assert_string_equal(before->name, auto_choice());
}

/* Run this test binary again as `--print-kernels` with DOLPHIN_CPU_KERNELS
 * set to value (NULL = unset); the child prints the set it chose. */
static void expect_env_choice(const char *value, const char *expect)
{
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(len > 0);
    exe[len] = 0;
    char out_path[] = "/tmp/dolphin-test-cpu-kernels-XXXXXX";
    int fd = mkstemp(out_path);
    assert_true(fd >= 0);
    close(fd);
    /* child environment: ours, DOLPHIN_CPU_KERNELS replaced */
    size_t n = 0;
    while (environ[n]) n++;
    char **envp = calloc(n + 2, sizeof *envp);
    assert_non_null(envp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "DOLPHIN_CPU_KERNELS=", 20) != 0) envp[m++] = environ[i];
    char var[128];
    if (value) {
        snprintf(var, sizeof var, "DOLPHIN_CPU_KERNELS=%s", value);
        envp[m++] = var;
    }
    envp[m] = NULL;
    char *argv[] = { exe, "--print-kernels", out_path, NULL };
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, exe, NULL, NULL, argv, envp), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    free(envp);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char got[64] = "";
    FILE *f = fopen(out_path, "r");
    assert_non_null(f);
    if (!fgets(got, sizeof got, f)) got[0] = 0;
    fclose(f);
    unlink(out_path);
    got[strcspn(got, "\n")] = 0;
    print_message("  DOLPHIN_CPU_KERNELS=%s -> %s\n", value ? value : "(unset)", got);
    assert_string_equal(got, expect);
}

static void test_env_override(void **state)
{
    (void)state;
    const char *autov = auto_choice();
    expect_env_choice(NULL, autov);
    expect_env_choice("auto", autov);
    expect_env_choice("", autov);
    expect_env_choice("bogus", autov); /* one warning line, then the automatic choice */
    for (int i = 0; i < N_NAMES; i++)
        expect_env_choice(g_names[i], dol_cpu_kernels_find(g_names[i]) ? g_names[i] : autov);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--print-kernels") == 0) {
        FILE *f = fopen(argv[2], "w");
        if (!f) return 2;
        fprintf(f, "%s\n", dol_engine_cpu_kernels());
        return fclose(f) == 0 ? 0 : 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables),
        cmocka_unit_test(test_dot),
        cmocka_unit_test(test_matmul_rows),
        cmocka_unit_test(test_packed_large),
        cmocka_unit_test(test_matmul_through_pool),
        cmocka_unit_test(test_nf4_rows),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_attn_head),
        cmocka_unit_test(test_engine_bf16_weights),
        cmocka_unit_test(test_find_and_set),
        cmocka_unit_test(test_env_override),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
