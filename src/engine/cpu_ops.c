/* src/engine/cpu_ops.c — CPU reference kernels (see cpu_ops.h). The matrix
 * product is the hot path: it walks W in tiles of four rows, and for each
 * tile runs every row of x against it, so W is streamed from memory once per
 * call whatever the batch size (a decode step over 8 sequences costs little
 * more memory traffic than over 1). */
#include "engine/cpu_ops.h"

#include <math.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define DOL_HAVE_AVX2 1
#endif

/* ---- dot products -------------------------------------------------------- */

#ifdef DOL_HAVE_AVX2
static inline float hsum8(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehdup_ps(lo);
    __m128 s = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, s);
    s = _mm_add_ss(s, sh);
    return _mm_cvtss_f32(s);
}

static inline __m256 load_w8(const void *w, dol_dtype t, int k)
{
    if (t == DOL_DTYPE_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + k)));
    return _mm256_loadu_ps((const float *)w + k);
}
#endif

static inline float load_w1(const void *w, dol_dtype t, int k)
{
    if (t == DOL_DTYPE_F16) return dol_f16_to_f32(((const uint16_t *)w)[k]);
    if (t == DOL_DTYPE_BF16) return dol_bf16_to_f32(((const uint16_t *)w)[k]);
    return ((const float *)w)[k];
}

/* The summation order, fixed for all callers: two 8-lane accumulators over
 * 16-element strides, then the 8-element remainder, then a scalar tail. */
float dol_cpu_dot(const float *x, const void *w, dol_dtype t, int n)
{
    int k = 0;
    float sum = 0.0f;
#ifdef DOL_HAVE_AVX2
    if (t != DOL_DTYPE_BF16) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (; k + 16 <= n; k += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load_w8(w, t, k), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), load_w8(w, t, k + 8), a1);
        }
        if (k + 8 <= n) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load_w8(w, t, k), a0);
            k += 8;
        }
        sum = hsum8(_mm256_add_ps(a0, a1));
    }
#endif
    for (; k < n; k++) sum += x[k] * load_w1(w, t, k);
    return sum;
}

/* ---- matrix product ------------------------------------------------------ */

typedef struct {
    float *out;
    const float *x;
    int T, K, N;
    const void *W;
    dol_dtype wt;
    int rows_per_task;
} matmul_job;

#ifdef DOL_HAVE_AVX2
/* Four dot products of x with W rows w0..w3, each in dol_cpu_dot's order. */
static inline void dot4(const float *x, const void *w0, const void *w1,
                        const void *w2, const void *w3, dol_dtype t, int n,
                        float *r)
{
    __m256 a0 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps();
    __m256 a1 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), b2 = _mm256_setzero_ps();
    __m256 a3 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        __m256 xa = _mm256_loadu_ps(x + k), xb = _mm256_loadu_ps(x + k + 8);
        a0 = _mm256_fmadd_ps(xa, load_w8(w0, t, k), a0);
        b0 = _mm256_fmadd_ps(xb, load_w8(w0, t, k + 8), b0);
        a1 = _mm256_fmadd_ps(xa, load_w8(w1, t, k), a1);
        b1 = _mm256_fmadd_ps(xb, load_w8(w1, t, k + 8), b1);
        a2 = _mm256_fmadd_ps(xa, load_w8(w2, t, k), a2);
        b2 = _mm256_fmadd_ps(xb, load_w8(w2, t, k + 8), b2);
        a3 = _mm256_fmadd_ps(xa, load_w8(w3, t, k), a3);
        b3 = _mm256_fmadd_ps(xb, load_w8(w3, t, k + 8), b3);
    }
    if (k + 8 <= n) {
        __m256 xa = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(xa, load_w8(w0, t, k), a0);
        a1 = _mm256_fmadd_ps(xa, load_w8(w1, t, k), a1);
        a2 = _mm256_fmadd_ps(xa, load_w8(w2, t, k), a2);
        a3 = _mm256_fmadd_ps(xa, load_w8(w3, t, k), a3);
        k += 8;
    }
    r[0] = hsum8(_mm256_add_ps(a0, b0));
    r[1] = hsum8(_mm256_add_ps(a1, b1));
    r[2] = hsum8(_mm256_add_ps(a2, b2));
    r[3] = hsum8(_mm256_add_ps(a3, b3));
    for (; k < n; k++) {
        r[0] += x[k] * load_w1(w0, t, k);
        r[1] += x[k] * load_w1(w1, t, k);
        r[2] += x[k] * load_w1(w2, t, k);
        r[3] += x[k] * load_w1(w3, t, k);
    }
}
#endif

static void matmul_task(void *ctx, int task, int worker)
{
    (void)worker;
    matmul_job *j = ctx;
    int n0 = task * j->rows_per_task;
    int n1 = n0 + j->rows_per_task;
    if (n1 > j->N) n1 = j->N;
    size_t esz = dol_dtype_size(j->wt);
    const char *W = j->W;
    int n = n0;
#ifdef DOL_HAVE_AVX2
    if (j->wt != DOL_DTYPE_BF16) {
        for (; n + 4 <= n1; n += 4) {
            const void *w0 = W + (size_t)n * j->K * esz;
            const void *w1 = W + (size_t)(n + 1) * j->K * esz;
            const void *w2 = W + (size_t)(n + 2) * j->K * esz;
            const void *w3 = W + (size_t)(n + 3) * j->K * esz;
            for (int t = 0; t < j->T; t++) {
                float r[4];
                dot4(j->x + (size_t)t * j->K, w0, w1, w2, w3, j->wt, j->K, r);
                float *o = j->out + (size_t)t * j->N + n;
                o[0] = r[0]; o[1] = r[1]; o[2] = r[2]; o[3] = r[3];
            }
        }
    }
#endif
    for (; n < n1; n++) {
        const void *w = W + (size_t)n * j->K * esz;
        for (int t = 0; t < j->T; t++)
            j->out[(size_t)t * j->N + n] = dol_cpu_dot(j->x + (size_t)t * j->K, w, j->wt, j->K);
    }
}

void dol_cpu_matmul(dol_pool *pool, float *out, const float *x, int T, int K,
                    const void *W, dol_dtype wtype, int N)
{
    matmul_job j = { out, x, T, K, N, W, wtype, 0 };
    /* Tasks of whole 4-row tiles; enough tasks to balance the workers, few
     * enough that scheduling stays cheap; tiny products run inline. */
    int threads = pool ? dol_pool_threads(pool) : 1;
    double work = (double)T * K * N;
    int tasks = (work < 65536.0 || threads == 1) ? 1 : threads * 8;
    int rows = (N + tasks - 1) / tasks;
    rows = (rows + 3) & ~3;
    if (rows < 4) rows = 4;
    j.rows_per_task = rows;
    tasks = (N + rows - 1) / rows;
    if (tasks <= 1 || !pool) {
        for (int t = 0; t < tasks; t++) matmul_task(&j, t, 0);
        return;
    }
    dol_pool_run(pool, matmul_task, &j, tasks);
}

/* ---- element-wise kernels ------------------------------------------------ */

void dol_cpu_rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void dol_cpu_rope(float *x, int n_heads, int head_dim, const float *cos_row,
                  const float *sin_row)
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

void dol_cpu_silu_mul(float *out, const float *gate, const float *up, int n)
{
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void dol_cpu_to_f32(float *dst, const void *src, dol_dtype t, int64_t n)
{
    if (t == DOL_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *h = src;
    if (t == DOL_DTYPE_F16)
        for (int64_t i = 0; i < n; i++) dst[i] = dol_f16_to_f32(h[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = dol_bf16_to_f32(h[i]);
}

void dol_cpu_embed_row(float *out, const dol_tensor *table, int32_t id)
{
    size_t esz = dol_dtype_size(table->dtype);
    const char *row = (const char *)table->data + (size_t)id * table->cols * esz;
    dol_cpu_to_f32(out, row, table->dtype, table->cols);
}
