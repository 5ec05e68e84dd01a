/* src/engine/cpu_ops.c — CPU reference kernels (see cpu_ops.h). The matrix
 * product is the hot path: it walks W in tiles of four rows, and for each
 * tile runs every row of x against it, so W is streamed from memory once per
 * call whatever the batch size (a decode step over 8 sequences costs little
 * more memory traffic than over 1). */
#include "engine/cpu_ops.h"

#include <math.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__F16C__)
#include <immintrin.h>
#define DOL_SIMD 16
typedef __m512 vecf;
static inline vecf v_zero(void) { return _mm512_setzero_ps(); }
static inline vecf v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline vecf v_load_h(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vecf v_fma(vecf a, vecf b, vecf c) { return _mm512_fmadd_ps(a, b, c); }
static inline float v_sum(vecf v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define DOL_SIMD 8
typedef __m256 vecf;
static inline vecf v_zero(void) { return _mm256_setzero_ps(); }
static inline vecf v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline vecf v_load_h(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline vecf v_fma(vecf a, vecf b, vecf c) { return _mm256_fmadd_ps(a, b, c); }
static inline float v_sum(vecf v)
{
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 sh = _mm_movehdup_ps(lo);
    __m128 s = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, s);
    return _mm_cvtss_f32(_mm_add_ss(s, sh));
}
#endif

static inline float load_w1(const void *w, dol_dtype t, int k)
{
    if (t == DOL_DTYPE_F16) return dol_f16_to_f32(((const uint16_t *)w)[k]);
    if (t == DOL_DTYPE_BF16) return dol_bf16_to_f32(((const uint16_t *)w)[k]);
    return ((const float *)w)[k];
}

/* The summation order, the same for every caller and every batch size: one
 * DOL_SIMD-lane accumulator over k in steps of DOL_SIMD, a horizontal sum,
 * then the scalar tail. (Independent chains come from computing several
 * outputs at once, never from splitting one output's sum.) */
float dol_cpu_dot(const float *x, const void *w, dol_dtype t, int n)
{
    int k = 0;
    float sum = 0.0f;
#ifdef DOL_SIMD
    if (t != DOL_DTYPE_BF16) {
        vecf acc = v_zero();
        for (; k + DOL_SIMD <= n; k += DOL_SIMD)
            acc = v_fma(v_load(x + k), t == DOL_DTYPE_F16 ? v_load_h((const uint16_t *)w + k)
                                                          : v_load((const float *)w + k), acc);
        sum = v_sum(acc);
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

#ifdef DOL_SIMD
/* Pin a vector to a register. Without it GCC folds the load of x into each
 * of the NC FMAs that use it, one load per FMA, and the tile becomes bound
 * by loads (2.3 x slower at 8 rows of x on this machine's Zen 5). The empty
 * asm changes no value and no instruction order of the arithmetic. */
static inline vecf v_in_register(vecf v)
{
    __asm__("" : "+v"(v));
    return v;
}

/* Register tile: NR rows of x against 4 rows of W; each W vector is loaded
 * (and converted from F16) once for all NR rows. Every output follows
 * dol_cpu_dot's order exactly. */
#define DEFINE_TILE(NR, NC)                                                                \
    static void tile_##NR##x##NC(const float *x, int K, const void *W, dol_dtype t, int n, \
                                 float *out, int N)                                        \
    {                                                                                      \
        vecf acc[NR][NC];                                                                  \
        for (int r = 0; r < NR; r++)                                                       \
            for (int c = 0; c < NC; c++) acc[r][c] = v_zero();                             \
        const char *pf = (const char *)W + (size_t)(n + NC) * K * dol_dtype_size(t);        \
        const size_t pf_step = NC * dol_dtype_size(t) * DOL_SIMD;                          \
        int k = 0;                                                                         \
        for (; k + DOL_SIMD <= K; k += DOL_SIMD) {                                         \
            vecf w[NC];                                                                    \
            for (size_t o = 0; o < pf_step; o += 64)                                       \
                _mm_prefetch(pf + (size_t)k / DOL_SIMD * pf_step + o, _MM_HINT_T0);        \
            for (int c = 0; c < NC; c++)                                                   \
                w[c] = t == DOL_DTYPE_F16                                                  \
                           ? v_load_h((const uint16_t *)W + (size_t)(n + c) * K + k)       \
                           : v_load((const float *)W + (size_t)(n + c) * K + k);           \
            for (int r = 0; r < NR; r++) {                                                 \
                vecf xv = v_in_register(v_load(x + (size_t)r * K + k));                    \
                for (int c = 0; c < NC; c++) acc[r][c] = v_fma(xv, w[c], acc[r][c]);       \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < NR; r++)                                                       \
            for (int c = 0; c < NC; c++) {                                                 \
                float s = v_sum(acc[r][c]);                                                \
                const float *xr = x + (size_t)r * K;                                       \
                const char *wr = (const char *)W + (size_t)(n + c) * K * dol_dtype_size(t); \
                for (int kk = k; kk < K; kk++) s += xr[kk] * load_w1(wr, t, kk);           \
                out[(size_t)r * N + n + c] = s;                                            \
            }                                                                              \
    }
DEFINE_TILE(1, 4)
DEFINE_TILE(2, 4)
DEFINE_TILE(3, 4)
DEFINE_TILE(4, 4)
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
#ifdef DOL_SIMD
    if (j->wt != DOL_DTYPE_BF16) {
        for (; n + 4 <= n1; n += 4) {
            int t = 0;
            for (; t + 4 <= j->T; t += 4)
                tile_4x4(j->x + (size_t)t * j->K, j->K, W, j->wt, n, j->out + (size_t)t * j->N, j->N);
            const float *xr = j->x + (size_t)t * j->K;
            float *orow = j->out + (size_t)t * j->N;
            switch (j->T - t) {
            case 3: tile_3x4(xr, j->K, W, j->wt, n, orow, j->N); break;
            case 2: tile_2x4(xr, j->K, W, j->wt, n, orow, j->N); break;
            case 1: tile_1x4(xr, j->K, W, j->wt, n, orow, j->N); break;
            default: break;
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

/* Rows of W per task: whole 4-row tiles; enough tasks to balance the
 * workers, few enough that scheduling stays cheap; tiny products run
 * inline (one task). */
static int plan_rows_per_task(const dol_pool *pool, int T, int K, int N)
{
    int threads = pool ? dol_pool_threads(pool) : 1;
    double work = (double)T * K * N;
    int tasks = (work < 65536.0 || threads == 1) ? 1 : threads * 8;
    int rows = (N + tasks - 1) / tasks;
    rows = (rows + 3) & ~3;
    return rows < 4 ? 4 : rows;
}

static void run_tasks(dol_pool *pool, dol_pool_fn fn, void *job, int N, int rows)
{
    int tasks = (N + rows - 1) / rows;
    if (tasks <= 1 || !pool) {
        for (int t = 0; t < tasks; t++) fn(job, t, 0);
        return;
    }
    dol_pool_run(pool, fn, job, tasks);
}

void dol_cpu_matmul(dol_pool *pool, float *out, const float *x, int T, int K,
                    const void *W, dol_dtype wtype, int N)
{
    matmul_job j = { out, x, T, K, N, W, wtype, plan_rows_per_task(pool, T, K, N) };
    run_tasks(pool, matmul_task, &j, N, j.rows_per_task);
}

/* ---- matrix product over NF4 weights ------------------------------------ */

/* Sum x[k] * w[k] over blocks b0.. of row `row` in k order, each block
 * dequantized to floats first: the whole product in builds without SIMD,
 * the short last block of a row in SIMD builds. */
static float nf4_dot_blocks(const float *x, const dol_nf4_matrix *W, int64_t row, int64_t b0,
                            float sum)
{
    float w[DOL_NF4_BLOCK];
    for (int64_t b = b0; b < W->blocks_per_row; b++) {
        int n = dol_nf4_dequantize_block(W, row, b, w);
        const float *xb = x + b * DOL_NF4_BLOCK;
        for (int j = 0; j < n; j++) sum += xb[j] * w[j];
    }
    return sum;
}

#ifdef DOL_SIMD
/* In-register dequantization. A block's 64 codes are 32 bytes: byte j holds
 * weight j (low nibble) and weight j + 32 (high nibble), see nf4.h. Vector
 * s of a block (s = 0 .. 64/DOL_SIMD - 1) covers weights s*DOL_SIMD ..
 * s*DOL_SIMD + DOL_SIMD-1: the low nibbles of bytes (s*DOL_SIMD) % 32 .. for
 * the first half of the block, the high nibbles of the same bytes for the
 * second. Widening those bytes to 32-bit lanes gives table indices; the
 * table holds the 16 levels times the block's scale, so each lane becomes
 * exactly dol_nf4_levels[code] * scale, as dol_nf4_dequantize_block says. */
#if DOL_SIMD == 16
typedef __m512 nf4_lut; /* levels * scale, one lane per code */
static inline nf4_lut nf4_lut_make(uint16_t scale)
{
    vecf s = _mm512_set1_ps(_cvtsh_ss(scale));
    return _mm512_mul_ps(_mm512_loadu_ps(dol_nf4_levels), s);
}
static inline vecf nf4_decode(const uint8_t *codes, int s, nf4_lut lut)
{
    __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + (s & 1) * 16)));
    if (s >= 2) idx = _mm512_srli_epi32(idx, 4);
    return _mm512_permutexvar_ps(idx, lut); /* uses the low 4 bits of each lane */
}
#define NF4_NC 4 /* W rows per register tile */
#else
typedef struct {
    __m256 lo, hi; /* levels 0..7 and 8..15, times the scale */
} nf4_lut;
static inline nf4_lut nf4_lut_make(uint16_t scale)
{
    __m256 s = _mm256_set1_ps(_cvtsh_ss(scale));
    return (nf4_lut){ _mm256_mul_ps(_mm256_loadu_ps(dol_nf4_levels), s),
                      _mm256_mul_ps(_mm256_loadu_ps(dol_nf4_levels + 8), s) };
}
static inline vecf nf4_decode(const uint8_t *codes, int s, nf4_lut lut)
{
    __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + (s & 3) * 8)));
    if (s >= 4) idx = _mm256_srli_epi32(idx, 4);
    __m256 lo = _mm256_permutevar8x32_ps(lut.lo, idx); /* uses the low 3 bits */
    __m256 hi = _mm256_permutevar8x32_ps(lut.hi, idx);
    __m256 bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)); /* code bit 3 -> sign */
    return _mm256_blendv_ps(lo, hi, bit3);
}
#define NF4_NC 2 /* fewer registers: 16 ymm */
#endif


/* Register tile: NR rows of x against NC rows of W (rows n .. n+NC-1); the
 * codes of each block are decoded once for all NR rows of x. Every output
 * follows the order documented in cpu_ops.h, whatever NR and NC are. */
static inline __attribute__((always_inline)) void
nf4_tile(const int NR, const int NC, const float *x, int K, const dol_nf4_matrix *W, int n,
         float *out, int N)
{
    const int64_t row_bytes = K / 2, bpr = W->blocks_per_row;
    const int64_t full = K / DOL_NF4_BLOCK; /* blocks of 64 */
    vecf acc[4][NF4_NC];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) acc[r][c] = v_zero();
    for (int64_t b = 0; b < full; b++) {
        nf4_lut lut[NF4_NC];
        const uint8_t *codes[NF4_NC];
        for (int c = 0; c < NC; c++) {
            lut[c] = nf4_lut_make(W->scales[(n + c) * bpr + b]);
            codes[c] = W->codes + (n + c) * row_bytes + b * (DOL_NF4_BLOCK / 2);
            if (b % 2 == 0) /* rows two tiles ahead: one cache line per two blocks */
                _mm_prefetch((const char *)codes[c] + 2 * NC * row_bytes, _MM_HINT_T0);
        }
        for (int s = 0; s < DOL_NF4_BLOCK / DOL_SIMD; s++) {
            const int64_t k = b * DOL_NF4_BLOCK + s * DOL_SIMD;
            vecf w[NF4_NC];
            for (int c = 0; c < NC; c++) w[c] = nf4_decode(codes[c], s, lut[c]);
            for (int r = 0; r < NR; r++) {
                vecf xv = v_in_register(v_load(x + (size_t)r * K + k));
                for (int c = 0; c < NC; c++) acc[r][c] = v_fma(xv, w[c], acc[r][c]);
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++)
            out[(size_t)r * N + n + c] =
                nf4_dot_blocks(x + (size_t)r * K, W, n + c, full, v_sum(acc[r][c]));
}

/* The tiles used: NR = 1..4 rows of x against NF4_NC rows of W ("wide"), or
 * against one row of W for the last N % NF4_NC rows ("narrow"). */
#define DEFINE_NF4_TILE(NAME, NR, NC)                                                          \
    static void NAME(const float *x, int K, const dol_nf4_matrix *W, int n, float *out, int N) \
    {                                                                                          \
        nf4_tile(NR, NC, x, K, W, n, out, N);                                                  \
    }
DEFINE_NF4_TILE(nf4_wide_1, 1, NF4_NC)
DEFINE_NF4_TILE(nf4_wide_2, 2, NF4_NC)
DEFINE_NF4_TILE(nf4_wide_3, 3, NF4_NC)
DEFINE_NF4_TILE(nf4_wide_4, 4, NF4_NC)
DEFINE_NF4_TILE(nf4_narrow_1, 1, 1)
DEFINE_NF4_TILE(nf4_narrow_2, 2, 1)
DEFINE_NF4_TILE(nf4_narrow_3, 3, 1)
DEFINE_NF4_TILE(nf4_narrow_4, 4, 1)

typedef void (*nf4_tile_fn)(const float *, int, const dol_nf4_matrix *, int, float *, int);
static const nf4_tile_fn nf4_wide[5] = { NULL, nf4_wide_1, nf4_wide_2, nf4_wide_3, nf4_wide_4 };
static const nf4_tile_fn nf4_narrow[5] = { NULL, nf4_narrow_1, nf4_narrow_2, nf4_narrow_3,
                                           nf4_narrow_4 };
#endif

typedef struct {
    float *out;
    const float *x;
    int T, K, N;
    const dol_nf4_matrix *W;
    int rows_per_task;
} nf4_job;

static void nf4_task(void *ctx, int task, int worker)
{
    (void)worker;
    const nf4_job *j = ctx;
    int n0 = task * j->rows_per_task;
    int n1 = n0 + j->rows_per_task;
    if (n1 > j->N) n1 = j->N;
#ifdef DOL_SIMD
    for (int n = n0; n < n1;) {
        int nc = n + NF4_NC <= n1 ? NF4_NC : 1;
        const nf4_tile_fn *tile = nc == NF4_NC ? nf4_wide : nf4_narrow;
        for (int t = 0; t < j->T; t += 4) {
            int nr = j->T - t < 4 ? j->T - t : 4;
            tile[nr](j->x + (size_t)t * j->K, j->K, j->W, n, j->out + (size_t)t * j->N, j->N);
        }
        n += nc;
    }
#else
    for (int n = n0; n < n1; n++)
        for (int t = 0; t < j->T; t++)
            j->out[(size_t)t * j->N + n] = nf4_dot_blocks(j->x + (size_t)t * j->K, j->W, n, 0, 0.0f);
#endif
}

void dol_cpu_matmul_nf4(dol_pool *pool, float *out, const float *x, int T,
                        const dol_nf4_matrix *W)
{
    int K = (int)W->cols, N = (int)W->rows;
    nf4_job j = { out, x, T, K, N, W, plan_rows_per_task(pool, T, K, N) };
    run_tasks(pool, nf4_task, &j, N, j.rows_per_task);
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
